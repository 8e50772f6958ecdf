# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Recurrent sequence replay with RayCollector and RayReplayBuffer on a local Ray cluster.

One 2-CPU Ray session serves the whole module; every actor asks for half a
CPU so that two collectors and a buffer fit on it.
"""
from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

ray = pytest.importorskip("ray")

from _ray_helpers import (  # noqa: E402
    make_failing_cartpole,
    make_tracked_worker_cartpole,
    make_worker_cartpole,
    ray_init_kwargs,
    TEST_DIR,
)
from _recurrent_policies import make_lstm_policy  # noqa: E402
from tensordict import LazyStackedTensorDict, TensorDict  # noqa: E402
from torchrl.collectors import Collector, PolicyTransformsFutureWarning  # noqa: E402
from torchrl.collectors.distributed import RayCollector  # noqa: E402
from torchrl.data import LazyTensorStorage, RayReplayBuffer, SliceSampler  # noqa: E402
from torchrl.data.replay_buffers.ray_buffer import _dense_for_transport  # noqa: E402
from torchrl.envs import SerialEnv  # noqa: E402

FRAMES_PER_BATCH = 32
SLICE_LEN = 8
# Half a CPU and no memory reservation per actor: 2 collectors + 1 buffer on 2 CPUs
REMOTE = {"num_cpus": 0.5, "memory": None}


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(**ray_init_kwargs())
    yield
    ray.shutdown()


def _collector(envs, policy=None, **kwargs) -> RayCollector:
    kwargs.setdefault("frames_per_batch", FRAMES_PER_BATCH)
    kwargs.setdefault("total_frames", 4 * FRAMES_PER_BATCH)
    kwargs.setdefault("remote_configs", REMOTE)
    return RayCollector(envs, policy, **kwargs)


def _worker_envs(n=2, make=make_tracked_worker_cartpole):
    return [functools.partial(make, i) for i in range(n)]


def _buffer(**kwargs) -> RayReplayBuffer:
    return RayReplayBuffer(
        storage=functools.partial(LazyTensorStorage, 10_000),
        sampler=functools.partial(SliceSampler, slice_len=SLICE_LEN),
        batch_size=4 * SLICE_LEN,
        remote_config=REMOTE,
        **kwargs,
    )


def _check_slices(sample, slice_len=SLICE_LEN) -> None:
    """Each slice: one worker, one trajectory, consecutive steps, is_init at its start."""
    slices = sample.reshape(-1, slice_len)
    worker = slices["worker_id"]
    traj = slices["collector", "traj_ids"]
    assert (worker == worker[:, :1]).all(), "a slice holds rows of two workers"
    assert (traj == traj[:, :1]).all(), "a slice holds rows of two trajectories"
    # the steps of a slice follow each other: obs of step t+1 is next obs of step t
    assert (slices["observation"][:, 1:] == slices["next", "observation"][:, :-1]).all()
    is_init = slices["is_init"].squeeze(-1)
    assert is_init[:, 0].all(), "a slice does not start with is_init"


class TestTrajIds:
    def test_unique_across_workers_and_stable_across_batches(self):
        # Async collection yields whichever worker is ready first: on a loaded
        # machine one worker may deliver the first batches alone. Run until
        # each worker has delivered two batches, so that the stable-id check
        # runs for both, and fail if that takes more than 40 batches.
        collector = _collector(
            _worker_envs(),
            make_lstm_policy(),
            total_frames=-1,
            auto_register_policy_transforms=True,
        )
        owner = {}
        last = {}
        batches = {0: 0, 1: 0}
        try:
            for i, data in enumerate(collector):
                assert i < 40, f"a worker delivered too few batches: {batches}"
                worker = data["worker_id"]
                assert (worker == worker[0]).all()
                w = int(worker[0])
                traj = data["collector", "traj_ids"]
                for t in traj.unique().tolist():
                    assert owner.setdefault(t, w) == w, f"id {t} used by two workers"
                if w in last:
                    # the trajectory that was running at the end of the worker's
                    # last batch keeps its id, unless it ended there
                    prev_traj, prev_done = last[w]
                    assert (traj[0] == prev_traj) != prev_done
                last[w] = (traj[-1], bool(data["next", "done"][-1]))
                batches[w] += 1
                if min(batches.values()) >= 2:
                    break
        finally:
            collector.shutdown()
        assert set(owner.values()) == {0, 1}


class TestSequenceReplay:
    @pytest.mark.parametrize("sync", [False, True])
    def test_iterator_slices_never_span_workers(self, sync):
        rb = _buffer()
        collector = _collector(
            _worker_envs(),
            make_lstm_policy(),
            replay_buffer=rb,
            sync=sync,
            total_frames=8 * FRAMES_PER_BATCH,
            auto_register_policy_transforms=True,
        )
        try:
            for data in collector:
                assert data is None
            assert len(rb) >= 8 * FRAMES_PER_BATCH
            for _ in range(20):
                sample = rb.sample()
                assert sample.shape == (4 * SLICE_LEN,)
                _check_slices(sample)
        finally:
            collector.shutdown()
            rb.close()

    def test_background_collection_and_weight_push(self):
        rb = _buffer()
        policy = make_lstm_policy()
        collector = _collector(
            _worker_envs(),
            policy,
            replay_buffer=rb,
            total_frames=-1,
            collector_kwargs={"auto_register_policy_transforms": True},
        )
        try:
            collector.start()
            from _ray_helpers import wait_until

            # more than one batch per worker: the collection thread keeps running
            assert wait_until(lambda: len(rb) >= 6 * FRAMES_PER_BATCH, timeout=120)
            _check_slices(rb.sample())
            with torch.no_grad():
                for p in policy.parameters():
                    p.add_(1.0)
            collector.update_policy_weights_()
            expected = TensorDict.from_module(policy).data
            for actor in collector.remote_collectors:
                state = ray.get(actor.state_dict.remote())["policy_state_dict"]
                for key, value in expected.flatten_keys(".").items():
                    torch.testing.assert_close(state[key], value)
            n = len(rb)
            assert wait_until(lambda: len(rb) > n, timeout=60)
        finally:
            collector.shutdown()
            rb.close()

    def test_list_collector_kwargs_with_replay_buffer(self):
        rb = _buffer()
        collector = _collector(
            _worker_envs(),
            make_lstm_policy(),
            replay_buffer=rb,
            collector_kwargs=[{"auto_register_policy_transforms": True}] * 2,
        )
        try:
            for _ in collector:
                pass
            _check_slices(rb.sample())
        finally:
            collector.shutdown()
            rb.close()

    def test_background_error_is_raised_on_the_driver(self):
        rb = _buffer()
        collector = _collector(
            [functools.partial(make_failing_cartpole, 40)] * 2,
            make_lstm_policy(),
            replay_buffer=rb,
            total_frames=-1,
            auto_register_policy_transforms=True,
        )
        try:
            collector.start()
            from _ray_helpers import wait_until

            assert wait_until(lambda: not collector._collection_thread.is_alive(), 60)
            with pytest.raises(ValueError, match="FailAfter: step 40"):
                collector.update_policy_weights_()
        finally:
            collector.shutdown()
            rb.close()


class TestTransport:
    """A collector hands its buffer a lazy stack of its steps; it travels dense."""

    @staticmethod
    def _steps(batch_size=()):
        make = functools.partial(make_tracked_worker_cartpole, 0)
        env = SerialEnv(batch_size[0], make) if batch_size else make()
        rollout = env.rollout(FRAMES_PER_BATCH, break_when_any_done=False)
        env.close()
        steps = rollout.unbind(rollout.ndim - 1)
        # what a collector with a replay buffer builds from its steps
        return LazyStackedTensorDict.lazy_stack(list(steps), dim=-1), rollout

    @pytest.mark.parametrize("batch_size", [(), (2,)])
    def test_lazy_stack_is_stacked_densely(self, batch_size):
        lazy, rollout = self._steps(batch_size)
        dense = _dense_for_transport(lazy)
        assert not isinstance(dense, LazyStackedTensorDict)
        assert dense.batch_size == rollout.batch_size
        assert (dense == rollout).all()

    def test_heterogeneous_stack_stays_lazy(self):
        tds = [TensorDict({"a": torch.zeros(n)}) for n in (2, 3)]
        lazy = LazyStackedTensorDict.lazy_stack(tds)
        out = _dense_for_transport(lazy)
        assert isinstance(out, LazyStackedTensorDict)
        assert [td["a"].shape for td in out.tensordicts] == [(2,), (3,)]

    def test_extend_with_a_lazy_stack(self):
        lazy, rollout = self._steps()
        rb = _buffer()
        try:
            rb.extend(lazy)
            assert len(rb) == FRAMES_PER_BATCH
            stored = rb[torch.arange(FRAMES_PER_BATCH)]
            assert (stored.select(*rollout.keys(True, True)) == rollout).all()
        finally:
            rb.close()


class TestPolicyTransforms:
    @pytest.mark.parametrize("how", ["argument", "collector_kwargs"])
    def test_auto_register(self, how):
        kwargs = (
            {"auto_register_policy_transforms": True}
            if how == "argument"
            else {"collector_kwargs": {"auto_register_policy_transforms": True}}
        )
        with warnings.catch_warnings():
            warnings.simplefilter("error", PolicyTransformsFutureWarning)
            collector = _collector(
                _worker_envs(make=make_worker_cartpole),
                make_lstm_policy(),
                total_frames=2 * FRAMES_PER_BATCH,
                **kwargs,
            )
        try:
            for data in collector:
                assert "is_init" in data.keys()
                assert ("next", "recurrent_state_h") in data.keys(True)
        finally:
            collector.shutdown()

    def test_conflicting_values(self):
        with pytest.raises(ValueError, match="pass it only once"):
            _collector(
                _worker_envs(),
                make_lstm_policy(),
                auto_register_policy_transforms=True,
                collector_kwargs={"auto_register_policy_transforms": False},
            )

    def test_default_warns_once_on_the_driver(self):
        # an InitTracker but no primer: the LSTM runs, its state is not carried
        with pytest.warns(PolicyTransformsFutureWarning) as record:
            collector = _collector(
                _worker_envs(), make_lstm_policy(), total_frames=FRAMES_PER_BATCH
            )
        collector.shutdown()
        policy_warnings = [
            w for w in record if issubclass(w.category, PolicyTransformsFutureWarning)
        ]
        assert len(policy_warnings) == 1
        assert "TensorDictPrimer" in str(policy_warnings[0].message)
        assert str(policy_warnings[0].message).startswith("RayCollector: ")
        assert policy_warnings[0].filename == __file__

    def test_worker_error_is_raised_as_itself(self):
        with pytest.warns(PolicyTransformsFutureWarning), pytest.raises(
            RuntimeError, match=r"RayCollector worker \d+ cannot run the policy"
        ) as info:
            _collector(_worker_envs(make=make_worker_cartpole), make_lstm_policy())
        assert "Traceback" in str(info.value.__cause__)
        assert "ray" not in type(info.value).__module__


class TestBufferConstruction:
    @pytest.mark.parametrize(
        "kwargs,error,match",
        [
            (
                {"storage": functools.partial(LazyTensorStorage, 100, device="nope")},
                RuntimeError,
                "device string.*nope",
            ),
            (
                {"sampler": functools.partial(SliceSampler, slice_len=4, num_slices=2)},
                TypeError,
                "Either num_slices or slice_len",
            ),
        ],
        ids=["storage", "sampler"],
    )
    def test_constructor_error_is_raised_as_itself(self, kwargs, error, match):
        before = ray.available_resources().get("CPU", 0)
        with pytest.raises(error, match=match) as info:
            RayReplayBuffer(remote_config=REMOTE, **kwargs)
        assert type(info.value) is error
        assert "Traceback" in str(info.value.__cause__)
        from _ray_helpers import wait_until

        # the actor that failed is gone, with the CPU it held
        assert wait_until(
            lambda: ray.available_resources().get("CPU", 0) >= before, timeout=30
        )


class TestResources:
    def test_unplaceable_collectors_raise(self):
        rb = RayReplayBuffer(remote_config={"num_cpus": 1, "memory": None})
        try:
            with pytest.raises(RuntimeError, match="Ray would wait"):
                _collector(
                    _worker_envs(),
                    make_lstm_policy(),
                    replay_buffer=rb,
                    remote_configs={"num_cpus": 1},
                )
        finally:
            rb.close()

    def test_unplaceable_buffer_raises(self):
        with pytest.raises(RuntimeError, match="RayReplayBuffer.*remote_config"):
            RayReplayBuffer(remote_config={"num_cpus": 3})


def test_collector_class_accepts_collector():
    # the worker class keeps the collector's name and is a subclass of it
    from torchrl.collectors.distributed._remote_workers import _ray_worker_class

    cls = _ray_worker_class(Collector)
    assert issubclass(cls, Collector) and cls.__name__ == "Collector"
    assert _ray_worker_class(Collector) is cls


SHUTDOWN_SCRIPT = """
import functools, sys
sys.path.insert(0, {test_dir!r})
import ray
from _ray_helpers import make_tracked_worker_cartpole, ray_init_kwargs, ray_processes
from _recurrent_policies import make_lstm_policy
from torchrl.collectors.distributed import RayCollector
from torchrl.data import LazyTensorStorage, RayReplayBuffer, SliceSampler

init = ray_init_kwargs(_temp_dir={temp_dir!r})
remote = {{"num_cpus": 0.5, "memory": None}}
rb = RayReplayBuffer(
    storage=functools.partial(LazyTensorStorage, 1000),
    sampler=SliceSampler(slice_len=4),
    batch_size=8,
    ray_init_config=init,
    remote_config=remote,
)
collector = RayCollector(
    [functools.partial(make_tracked_worker_cartpole, i) for i in range(2)],
    make_lstm_policy(),
    frames_per_batch=16,
    total_frames=64,
    replay_buffer=rb,
    remote_configs=remote,
)
for _ in collector:
    pass
assert len(rb.sample()) == 8
assert ray_processes({temp_dir!r}), "no Ray process found to begin with"
rb.close()
collector.shutdown(shutdown_ray=True)
print("shut down")
"""


def test_shutdown_leaves_no_ray_process():
    import shutil
    import tempfile

    from _ray_helpers import ray_processes, wait_until

    # short: Ray's socket paths live under it
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    request_cleanup = functools.partial(shutil.rmtree, temp_dir, ignore_errors=True)
    script = SHUTDOWN_SCRIPT.format(test_dir=TEST_DIR, temp_dir=temp_dir)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "shut down" in out.stdout
    try:
        assert wait_until(
            lambda: not ray_processes(temp_dir), timeout=30
        ), ray_processes(temp_dir)
    finally:
        request_cleanup()

# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""The keys a collector stores in its replay buffer.

A multiprocessed collector initialises the storage of the shared buffer in the
main process, before its workers write to it: the stored keys must be those
the workers write, with the env completed from the policy
(``auto_register_policy_transforms``) and the policy's outputs, as a single
:class:`~torchrl.collectors.Collector` on an env built with ``policy=`` stores
them. A write whose keys differ from the rows of the storage is an error,
never a silent drop.

Multiprocess tests are kept small (one or two workers, a few batches): worker
start-up dominates their cost.
"""
from __future__ import annotations

import functools
import warnings

import pytest
import torch

# torchrl.envs.libs.utils keeps the ImportError of the optional gym package,
# whose traceback pins the stack of its first importer (GymEnv's constructor):
# imported from a multiprocessed collector's constructor, it would keep that
# collector alive until the interpreter exits, where its weight-sync scheme's
# __del__ can deadlock. Import it here, at collection.
import torchrl.envs.libs.utils  # noqa: F401
from _recurrent_policies import (
    make_cartpole,
    make_feedforward_policy,
    make_recurrent_policy,
    make_tracked_cartpole,
    state_keys,
)
from torchrl.collectors import (
    Collector,
    MultiAsyncCollector,
    MultiSyncCollector,
    PolicyTransformsFutureWarning,
)
from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ReplayBuffer,
    SliceSampler,
)

FRAMES_PER_BATCH = 20
TOTAL_FRAMES = 40
SLICE_LEN = 4
NUM_SLICES = 2

KINDS = ["lstm", "gru"]


def _keys(rb) -> set:
    return set(rb[:].keys(True, True))


def _buffer(storage_cls=LazyTensorStorage, tmp_path=None) -> ReplayBuffer:
    kwargs = {"scratch_dir": tmp_path} if storage_cls is LazyMemmapStorage else {}
    return ReplayBuffer(
        storage=storage_cls(1000, **kwargs),
        sampler=SliceSampler(slice_len=SLICE_LEN),
        batch_size=SLICE_LEN * NUM_SLICES,
    )


def _fill(collector) -> None:
    try:
        for data in collector:
            assert data is None
    finally:
        collector.shutdown()


def _fill_from_single_collector(rb, kind: str) -> None:
    """Fills ``rb`` with one batch of a single collector on an env built with ``policy=``."""
    policy = make_recurrent_policy(kind)
    _fill(
        Collector(
            make_cartpole(policy=policy),
            policy,
            frames_per_batch=FRAMES_PER_BATCH,
            total_frames=FRAMES_PER_BATCH,
            replay_buffer=rb,
        )
    )


@functools.lru_cache
def _reference_keys(kind: str) -> frozenset:
    """What a single collector on an env built with ``policy=`` stores."""
    rb = ReplayBuffer(storage=LazyTensorStorage(1000))
    _fill_from_single_collector(rb, kind)
    keys = frozenset(_keys(rb))
    # what the test is about: the wiring and the policy's outputs are stored
    assert {"is_init", ("next", "is_init"), "features", "logits"} <= keys
    assert {*state_keys(kind)} <= keys
    return keys


def _assert_slices_carry_init_and_state(rb, kind: str) -> None:
    """A sample starts every slice with ``is_init`` and carries the stored state."""
    sample, info = rb.sample(return_info=True)
    is_init = sample["is_init"].view(NUM_SLICES, SLICE_LEN)
    assert is_init[:, 0].all()
    stored = rb[info["index"]]
    for key in state_keys(kind):
        assert key in sample.keys()
        torch.testing.assert_close(sample[key], stored[key])
    # the state stored is the one the policy carried (non-zero after a step)
    assert any(rb[:][key].abs().sum() > 0 for key in state_keys(kind))


class TestMultiCollectorStoresWhatWorkersWrite:
    @pytest.mark.parametrize(
        "cls,kind,storage_cls,num_workers",
        [
            (MultiSyncCollector, "lstm", LazyTensorStorage, 2),
            (MultiSyncCollector, "gru", LazyMemmapStorage, 1),
            (MultiAsyncCollector, "lstm", LazyMemmapStorage, 1),
            (MultiAsyncCollector, "gru", LazyTensorStorage, 1),
        ],
    )
    def test_bare_env_auto_register(
        self, cls, kind, storage_cls, num_workers, tmp_path
    ):
        rb = _buffer(storage_cls, tmp_path)
        _fill(
            cls(
                [make_cartpole] * num_workers,
                make_recurrent_policy(kind),
                frames_per_batch=FRAMES_PER_BATCH,
                total_frames=TOTAL_FRAMES,
                replay_buffer=rb,
                set_truncated=True,
                auto_register_policy_transforms=True,
            )
        )
        assert _keys(rb) == _reference_keys(kind)
        _assert_slices_carry_init_and_state(rb, kind)

    def test_trajs_per_batch(self):
        rb = _buffer()
        _fill(
            MultiSyncCollector(
                [make_cartpole],
                make_recurrent_policy("lstm"),
                frames_per_batch=50,
                total_frames=100,
                replay_buffer=rb,
                trajs_per_batch=1,
                auto_register_policy_transforms=True,
            )
        )
        assert len(rb) > 0, "no trajectory completed: raise total_frames"
        assert _keys(rb) == _reference_keys("lstm")

    def test_policy_factory(self):
        rb = _buffer()
        _fill(
            MultiAsyncCollector(
                [make_cartpole],
                policy_factory=functools.partial(make_recurrent_policy, "gru"),
                frames_per_batch=FRAMES_PER_BATCH,
                total_frames=TOTAL_FRAMES,
                replay_buffer=rb,
                set_truncated=True,
                auto_register_policy_transforms=True,
            )
        )
        assert _keys(rb) == _reference_keys("gru")
        _assert_slices_carry_init_and_state(rb, "gru")

    def test_default_on_env_built_with_policy(self):
        # nothing missing: no warning, and the policy's outputs are stored too
        rb = _buffer()
        env_fn = functools.partial(make_cartpole, policy=make_recurrent_policy("lstm"))
        with warnings.catch_warnings():
            warnings.simplefilter("error", PolicyTransformsFutureWarning)
            collector = MultiSyncCollector(
                [env_fn],
                make_recurrent_policy("lstm"),
                frames_per_batch=FRAMES_PER_BATCH,
                total_frames=TOTAL_FRAMES,
                replay_buffer=rb,
                set_truncated=True,
            )
        _fill(collector)
        assert _keys(rb) == _reference_keys("lstm")
        _assert_slices_carry_init_and_state(rb, "lstm")

    def test_default_warns_once_and_stores_what_workers_write(self):
        # The env has an InitTracker but no primer: with the default, the
        # workers leave it so (one warning in the main process) and write what
        # the policy outputs, the next recurrent state among them.
        policy = make_recurrent_policy("lstm")
        ref = ReplayBuffer(storage=LazyTensorStorage(1000))
        with pytest.warns(PolicyTransformsFutureWarning):
            single = Collector(
                make_tracked_cartpole(),
                policy,
                frames_per_batch=FRAMES_PER_BATCH,
                total_frames=FRAMES_PER_BATCH,
                replay_buffer=ref,
            )
        _fill(single)
        rb = _buffer()
        with pytest.warns(PolicyTransformsFutureWarning) as record:
            collector = MultiSyncCollector(
                [make_tracked_cartpole],
                policy,
                frames_per_batch=FRAMES_PER_BATCH,
                total_frames=TOTAL_FRAMES,
                replay_buffer=rb,
                set_truncated=True,
            )
        assert (
            len([w for w in record if w.category is PolicyTransformsFutureWarning]) == 1
        )
        _fill(collector)
        assert _keys(rb) == _keys(ref)
        assert {("next", "recurrent_state_h"), "features", "logits"} <= _keys(rb)
        assert "recurrent_state_h" not in _keys(rb)


def _with_doubled_reward(data):
    """A post-processing that adds an entry (module level: workers unpickle it)."""
    data["doubled_reward"] = data["next", "reward"] * 2
    return data


class TestWorkerCompletions:
    def test_step_counter_and_postproc(self):
        # the workers add a StepCounter for max_frames_per_traj and
        # post-process their batches: both show in the stored keys
        kwargs = {
            "frames_per_batch": FRAMES_PER_BATCH,
            "max_frames_per_traj": 5,
            "postproc": _with_doubled_reward,
        }
        ref = ReplayBuffer(storage=LazyTensorStorage(1000))
        _fill(
            Collector(
                make_cartpole,
                total_frames=FRAMES_PER_BATCH,
                replay_buffer=ref,
                **kwargs,
            )
        )
        assert {"step_count", "doubled_reward"} <= _keys(ref)
        rb = ReplayBuffer(storage=LazyTensorStorage(1000))
        _fill(
            MultiSyncCollector(
                [make_cartpole], total_frames=TOTAL_FRAMES, replay_buffer=rb, **kwargs
            )
        )
        assert _keys(rb) == _keys(ref)
        assert (rb[:]["step_count"] <= 5).all()


def _bare_env_rows():
    """One step of the bare CartPole env, with the collector's trajectory ids."""
    td = make_cartpole().fake_tensordict()
    td["collector", "traj_ids"] = torch.zeros((), dtype=torch.long)
    return td.unsqueeze(-1)


class TestMismatchedWritesRaise:
    @pytest.mark.parametrize("storage_cls", [LazyTensorStorage, LazyMemmapStorage])
    def test_extra_keys(self, storage_cls, tmp_path):
        # a storage initialised from the bare env cannot hold what the
        # completed env and the policy write
        rb = _buffer(storage_cls, tmp_path)
        rb.extend(_bare_env_rows())
        collector = Collector(
            make_cartpole,
            make_recurrent_policy("lstm"),
            frames_per_batch=FRAMES_PER_BATCH,
            total_frames=TOTAL_FRAMES,
            replay_buffer=rb,
            auto_register_policy_transforms=True,
        )
        with pytest.raises(RuntimeError, match="that the storage lacks") as err:
            _fill(collector)
        for key in ["'is_init'", "('next', 'is_init')", "'recurrent_state_h'"]:
            assert key in str(err.value)
        assert "lacks the keys" not in str(err.value)

    def test_missing_keys(self):
        rb = _buffer()
        _fill_from_single_collector(rb, "lstm")
        # a feed-forward policy on the bare env would leave the recurrent
        # entries of its rows stale
        collector = Collector(
            make_cartpole(),
            make_feedforward_policy(),
            frames_per_batch=FRAMES_PER_BATCH,
            total_frames=FRAMES_PER_BATCH,
            replay_buffer=rb,
        )
        with pytest.raises(RuntimeError, match="lacks the keys") as err:
            _fill(collector)
        assert "'recurrent_state_c'" in str(err.value)
        assert "that the storage lacks" not in str(err.value)
        # in-place updates of some keys of stored rows remain possible
        rb[0:2] = rb[0:2].select("observation").zero_()
        assert (rb[0:2]["observation"] == 0).all()

    @pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
    def test_multi_collector_reports_in_main(self, cls):
        # the storage was initialised beforehand: construction reports what
        # the workers would fail to write, before any worker starts
        rb = _buffer()
        rb.extend(_bare_env_rows())
        collector = None
        try:
            with pytest.raises(RuntimeError, match="that the storage lacks") as err:
                collector = cls(
                    [make_cartpole],
                    make_recurrent_policy("gru"),
                    frames_per_batch=FRAMES_PER_BATCH,
                    total_frames=TOTAL_FRAMES,
                    replay_buffer=rb,
                    set_truncated=True,
                    auto_register_policy_transforms=True,
                )
        finally:
            if collector is not None:
                collector.shutdown()
        assert "'recurrent_state'" in str(err.value)
        assert "'logits'" in str(err.value)


class TestTrajsPerBatchSetTruncated:
    """``set_truncated=True`` cuts the whole trajectories of ``trajs_per_batch``: it warns."""

    def _episode_pieces(self, set_truncated):
        rb = ReplayBuffer(storage=LazyTensorStorage(1_000))
        collector = Collector(
            make_tracked_cartpole(),
            None,
            frames_per_batch=5,
            total_frames=100,
            replay_buffer=rb,
            trajs_per_batch=1,
            set_truncated=set_truncated,
        )
        for _ in collector:
            pass
        collector.shutdown()
        data = rb[:]
        return int(data["next", "done"].sum()) - int(data["is_init"].sum())

    def test_single_collector_warns(self):
        with pytest.warns(UserWarning, match=r"pass set_truncated=False") as record:
            pieces = self._episode_pieces(set_truncated=True)
        assert [w.filename for w in record if "set_truncated" in str(w.message)] == [
            __file__
        ]
        # what the warning says happens: more written ends than episode starts
        assert pieces > 0

    def test_default_writes_whole_episodes_silently(self):
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "error", message=r".*set_truncated", category=UserWarning
            )
            assert self._episode_pieces(set_truncated=False) == 0

    def test_multi_collector_warns_once(self):
        rb = ReplayBuffer(storage=LazyTensorStorage(1_000))
        with pytest.warns(
            UserWarning, match=r"MultiSyncCollector\(.*set_truncated=True\)"
        ):
            collector = MultiSyncCollector(
                [make_tracked_cartpole],
                None,
                frames_per_batch=5,
                total_frames=10,
                replay_buffer=rb,
                trajs_per_batch=1,
                set_truncated=True,
            )
        collector.shutdown()

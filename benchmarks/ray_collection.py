# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""What Ray costs a recurrent pipeline on one machine: collection and sequence sampling.

Collection: frames per second of 2 workers stepping CartPole with the same
LSTM policy (the env completed by the collector:
``auto_register_policy_transforms=True``), after a warm-up batch, the median
of ``--repeats`` rounds (each round builds every collector once, in turn):

- ``MultiSyncCollector`` / ``MultiAsyncCollector``: 2 worker processes, batches
  through shared memory;
- ``RayCollector sync`` / ``async``: 2 Ray actors, batches returned to the
  driver through Ray's object store;
- ``RayCollector -> RayReplayBuffer``: the actors write into a buffer actor and
  return nothing; ``(lazy stacks, as before)`` sends each batch to the buffer
  actor as the collector builds it, a lazy stack of its steps, which is what
  ``RayReplayBuffer.extend`` did before it stacked them densely (pristine
  upstream cannot run on the current Ray, so the old transport is replayed by a
  subclass in the same run).

Where the time of a worker writing into the buffer goes: one collector (what
each actor runs) writing into a ``RayReplayBuffer``, in the driver, each
``extend`` timed in its parts: stacking the steps, sending (Ray pickles the
batch and submits the call), waiting for the actor (it unpickles and writes);
with the number of tensors and of actor calls per batch, for both transports.

Sampling: the median time of one ``sample()`` of 16 slices of 16 steps
(``SliceSampler``, no key argument) from the same 20k collected frames, in a
local :class:`~torchrl.data.ReplayBuffer` and through a
:class:`~torchrl.data.RayReplayBuffer`, and where the difference goes: an empty
call to the actor (Ray's round trip), and moving one sample through Ray's
object store (``ray.put`` then ``ray.get``: its serialization); and the
``extend()`` of a 200-frame batch, locally and into the buffer actor.

Prints the numbers and the ratios. Run ``python benchmarks/ray_collection.py --help``.
"""
from __future__ import annotations

import argparse
import collections
import functools
import os
import statistics
import time

import ray
import torch
from tensordict import LazyStackedTensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential

from torchrl.collectors import Collector, MultiAsyncCollector, MultiSyncCollector
from torchrl.collectors.distributed import RayCollector
from torchrl.data import LazyTensorStorage, RayReplayBuffer, ReplayBuffer, SliceSampler
from torchrl.data.replay_buffers.ray_buffer import _dense_for_transport
from torchrl.envs import GymEnv
from torchrl.modules import LSTMModule, OneHotCategorical, ProbabilisticActor

REMOTE = {"num_cpus": 0.5, "memory": None}


def make_env():
    return GymEnv("CartPole-v1")


def make_policy() -> ProbabilisticActor:
    lstm = LSTMModule(
        input_size=4, hidden_size=64, in_key="observation", out_key="embed"
    )
    head = TensorDictModule(
        torch.nn.Linear(64, 2), in_keys=["embed"], out_keys=["logits"]
    )
    return ProbabilisticActor(
        TensorDictSequential(lstm, head),
        in_keys=["logits"],
        distribution_class=OneHotCategorical,
    )


class LazyTransportRayReplayBuffer(RayReplayBuffer):
    """``RayReplayBuffer.extend`` as it was: the batch goes to the actor as it comes."""

    def extend(self, data):
        return ray.get(self._rb.extend.remote(data.to("cpu")))


def _count_tensors(data) -> int:
    """The tensors Ray pickles for ``data``: one per key, and per step of a lazy stack."""
    if isinstance(data, LazyStackedTensorDict):
        return sum(_count_tensors(td) for td in data.tensordicts)
    return len(list(data.keys(True, True)))


class _CountingActor:
    """An actor handle that counts the calls made through it."""

    def __init__(self, handle):
        self.handle = handle
        self.calls = collections.Counter()

    def __getattr__(self, name):
        method = getattr(self.handle, name)
        calls = self.calls

        class _Method:
            @staticmethod
            def remote(*args, **kwargs):
                calls[name] += 1
                return method.remote(*args, **kwargs)

        return _Method()


class TimedRayReplayBuffer(RayReplayBuffer):
    """Times the parts of ``extend`` and counts the calls to the buffer actor."""

    def __init__(self, *args, lazy_transport: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy_transport = lazy_transport
        self._rb = _CountingActor(self._rb)
        self.seconds = collections.Counter()
        self.tensors = 0

    def extend(self, data):
        t0 = time.perf_counter()
        if not self.lazy_transport:
            data = _dense_for_transport(data)
        data = data.to("cpu")
        t1 = time.perf_counter()
        ref = self._rb.extend.remote(data)
        t2 = time.perf_counter()
        out = ray.get(ref)
        t3 = time.perf_counter()
        self.seconds["stack"] += t1 - t0
        self.seconds["send"] += t2 - t1
        self.seconds["wait"] += t3 - t2
        self.tensors += _count_tensors(data)
        return out

    def close(self):
        self._rb = self._rb.handle
        super().close()


def _fps(collector, frames_per_batch: int, batches: int, rb=None) -> float:
    """Frames per second over ``batches`` batches, after one warm-up batch.

    Shuts the collector down (and closes ``rb``) afterwards.
    """
    try:
        it = iter(collector)
        next(it)
        start_frames = rb.write_count if rb is not None else 0
        start = time.perf_counter()
        frames = 0
        for _ in range(batches):
            data = next(it)
            frames += frames_per_batch if data is None else data.numel()
        elapsed = time.perf_counter() - start
        if rb is not None:
            frames = rb.write_count - start_frames
        return frames / elapsed
    finally:
        collector.shutdown()
        if rb is not None:
            rb.close()


def _collection_round(args, policy) -> dict[str, float]:
    fpb = args.frames_per_batch
    common = {
        "frames_per_batch": fpb,
        "total_frames": -1,
        "auto_register_policy_transforms": True,
    }
    ray_common = dict(common, remote_configs=REMOTE)
    out = {}
    for name, cls in (
        ("MultiSyncCollector", MultiSyncCollector),
        ("MultiAsyncCollector", MultiAsyncCollector),
    ):
        collector = cls([make_env] * 2, policy, **common)
        out[name] = _fps(collector, fpb, args.batches)
    for name, sync in (("RayCollector sync", True), ("RayCollector async", False)):
        collector = RayCollector([make_env] * 2, policy, sync=sync, **ray_common)
        out[name] = _fps(collector, fpb, args.batches)
    for name, rb_cls in (
        ("RayCollector -> RayReplayBuffer", RayReplayBuffer),
        ("  (lazy stacks, as before)", LazyTransportRayReplayBuffer),
    ):
        rb = rb_cls(
            storage=functools.partial(LazyTensorStorage, 1_000_000),
            sampler=functools.partial(SliceSampler, slice_len=16),
            remote_config=REMOTE,
        )
        collector = RayCollector(
            [make_env] * 2, policy, sync=True, replay_buffer=rb, **ray_common
        )
        out[name] = _fps(collector, fpb, args.batches, rb=rb)
    return out


def measure_collection(args) -> dict[str, list[float]]:
    """Frames per second of each collector, one value per round."""
    policy = make_policy()
    rounds = collections.defaultdict(list)
    for _ in range(args.repeats):
        for name, fps in _collection_round(args, policy).items():
            rounds[name].append(fps)
    return rounds


def measure_breakdown(args) -> dict[str, dict[str, float]]:
    """Per batch of one worker writing into a RayReplayBuffer: where the time goes."""
    policy = make_policy()
    fpb = args.frames_per_batch // 2  # what each of the 2 sync workers collects
    out = {}
    for name, lazy in (("dense stack (now)", False), ("lazy stack (before)", True)):
        rb = TimedRayReplayBuffer(
            storage=functools.partial(LazyTensorStorage, 1_000_000),
            sampler=functools.partial(SliceSampler, slice_len=16),
            remote_config=REMOTE,
            lazy_transport=lazy,
        )
        collector = Collector(
            make_env(),
            policy,
            frames_per_batch=fpb,
            total_frames=-1,
            replay_buffer=rb,
            auto_register_policy_transforms=True,
        )
        try:
            it = iter(collector)
            next(it)
            rb.seconds.clear()
            rb.tensors = 0
            rb._rb.calls.clear()
            start = time.perf_counter()
            for _ in range(args.batches):
                next(it)
            total = (time.perf_counter() - start) / args.batches
            extend = {k: v / args.batches for k, v in rb.seconds.items()}
            out[name] = {
                "batch": total,
                "collect": total - sum(extend.values()),
                **extend,
                "tensors": rb.tensors / args.batches,
                "calls": sum(rb._rb.calls.values()) / args.batches,
            }
        finally:
            collector.shutdown()
            rb.close()
    return out


def _median(fn, repeat: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_sampling(args) -> dict[str, float]:
    policy = make_policy()
    collector = MultiSyncCollector(
        [make_env] * 2,
        policy,
        frames_per_batch=2_000,
        total_frames=20_000,
        auto_register_policy_transforms=True,
    )
    data = torch.cat([batch.reshape(-1) for batch in collector])
    collector.shutdown()
    batch_size = 16 * 16

    local = ReplayBuffer(
        storage=LazyTensorStorage(len(data)),
        sampler=SliceSampler(slice_len=16),
        batch_size=batch_size,
    )
    local.extend(data)
    remote = RayReplayBuffer(
        storage=functools.partial(LazyTensorStorage, len(data)),
        sampler=functools.partial(SliceSampler, slice_len=16),
        batch_size=batch_size,
        remote_config=REMOTE,
    )
    try:
        remote.extend(data)
        sample = local.sample()
        chunk = data[:200].clone()  # a view would pickle all of data's storage
        out = {
            "local sample": _median(local.sample, args.repeat),
            "RayReplayBuffer sample": _median(remote.sample, args.repeat),
            "empty actor call": _median(
                lambda: ray.get(remote._rb._getattr.remote("_batch_size")),
                args.repeat,
            ),
            "ray.put + ray.get of a sample": _median(
                lambda: ray.get(ray.put(sample)), args.repeat
            ),
            # what a worker writing into the buffer actor pays per batch
            "local extend of a 200-frame batch": _median(
                lambda: local.extend(chunk), args.repeat
            ),
            "RayReplayBuffer extend of a 200-frame batch": _median(
                lambda: remote.extend(chunk), args.repeat
            ),
        }
    finally:
        remote.close()
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--frames-per-batch",
        type=int,
        default=400,
        help="frames of one batch (each worker collects half in sync mode)",
    )
    parser.add_argument(
        "--batches", type=int, default=10, help="batches timed per collector"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="rounds of the collection benchmark (the median is printed)",
    )
    parser.add_argument("--repeat", type=int, default=50, help="timed samples")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}},
    )
    try:
        collection = measure_collection(args)
        breakdown = measure_breakdown(args)
        sampling = measure_sampling(args)
    finally:
        ray.shutdown()

    print(f"ray {ray.__version__}, torch {torch.__version__}, 2 workers, LSTM(64)")
    print(
        f"\ncollection (frames/s, median of {args.repeats} rounds; ratio to "
        "MultiSyncCollector; the rounds' ratios)"
    )
    base = collection["MultiSyncCollector"]
    for name, rounds in collection.items():
        ratios = [fps / b for fps, b in zip(rounds, base)]
        print(
            f"  {name:34s} {statistics.median(rounds):9.0f}  "
            f"x{statistics.median(ratios):.2f}  "
            f"({', '.join(f'{r:.2f}' for r in ratios)})"
        )

    sync = collection["RayCollector sync"]
    for name, label in (
        ("RayCollector -> RayReplayBuffer", "now"),
        ("  (lazy stacks, as before)", "before"),
    ):
        ratios = [fps / b for fps, b in zip(collection[name], sync)]
        print(
            f"  writing into the buffer ({label}) against returning batches "
            f"(RayCollector sync): x{statistics.median(ratios):.2f}"
        )

    fpb = args.frames_per_batch // 2
    print(
        f"\nwhere a worker's time goes, per {fpb}-frame batch written into a "
        "RayReplayBuffer (ms)"
    )
    columns = ("batch", "collect", "stack", "send", "wait")
    print(
        f"  {'':22s}"
        + "".join(f"{c:>9s}" for c in columns)
        + f"{'tensors':>9s}{'calls':>7s}"
    )
    for name, row in breakdown.items():
        print(
            f"  {name:22s}"
            + "".join(f"{row[c] * 1e3:9.1f}" for c in columns)
            + f"{row['tensors']:9.0f}{row['calls']:7.1f}"
        )
    print(
        "  collect: stepping the env and the policy; stack: the steps into one "
        "batch; send: Ray pickles the batch and submits the call; wait: the actor "
        "unpickles and writes it; tensors: pickled per batch; calls: to the actor"
    )

    print("\nsampling 16 slices of 16 steps (ms; ratio to the local buffer)")
    base = sampling["local sample"]
    for name, seconds in sampling.items():
        print(f"  {name:34s} {seconds * 1e3:9.2f}  x{seconds / base:.2f}")
    overhead = sampling["RayReplayBuffer sample"] - base
    print(
        f"\nRayReplayBuffer pays {overhead * 1e3:.2f} ms a sample over the local "
        f"buffer: {sampling['empty actor call'] * 1e3:.2f} ms of actor round trip "
        f"and {sampling['ray.put + ray.get of a sample'] * 1e3:.2f} ms of moving "
        "the sample through the object store."
    )
    extend = (
        sampling["RayReplayBuffer extend of a 200-frame batch"]
        - sampling["local extend of a 200-frame batch"]
    )
    print(
        f"A worker writing into the buffer actor waits {extend * 1e3:.2f} ms more "
        "per 200-frame batch than a local extend: it sends the batch and waits for "
        "the actor, instead of collecting."
    )


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()

# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""What Ray costs a recurrent pipeline on one machine: collection and sequence sampling.

Collection: frames per second of 2 workers stepping CartPole with the same
LSTM policy (the env completed by the collector:
``auto_register_policy_transforms=True``), after a warm-up batch:

- ``MultiSyncCollector`` / ``MultiAsyncCollector``: 2 worker processes, batches
  through shared memory;
- ``RayCollector sync`` / ``async``: 2 Ray actors, batches returned to the
  driver through Ray's object store;
- ``RayCollector -> RayReplayBuffer``: the actors write into a buffer actor and
  return nothing.

Sampling: the median time of one ``sample()`` of 16 slices of 16 steps
(``SliceSampler``, no key argument) from the same 20k collected frames, in a
local :class:`~torchrl.data.ReplayBuffer` and through a
:class:`~torchrl.data.RayReplayBuffer`, and where the difference goes: an empty
call to the actor (Ray's round trip), and moving one sample through Ray's
object store (``ray.put`` then ``ray.get``: its serialization); and the
``extend()`` of a 200-frame batch, locally and into the buffer actor (what a
collector writing into a ``RayReplayBuffer`` waits for at every batch).

Prints the numbers and the ratios; Ray's side is slower where it serializes,
see the last column. Run ``python benchmarks/ray_collection.py --help``.
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import time

import ray
import torch
from tensordict.nn import TensorDictModule, TensorDictSequential

from torchrl.collectors import MultiAsyncCollector, MultiSyncCollector
from torchrl.collectors.distributed import RayCollector
from torchrl.data import LazyTensorStorage, RayReplayBuffer, ReplayBuffer, SliceSampler
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


def _fps(collector, frames_per_batch: int, batches: int, rb=None) -> float:
    """Frames per second over ``batches`` batches, after one warm-up batch."""
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


def measure_collection(args) -> dict[str, float]:
    policy = make_policy()
    fpb = args.frames_per_batch
    out = {}
    for name, cls in (
        ("MultiSyncCollector", MultiSyncCollector),
        ("MultiAsyncCollector", MultiAsyncCollector),
    ):
        collector = cls(
            [make_env] * 2,
            policy,
            frames_per_batch=fpb,
            total_frames=-1,
            auto_register_policy_transforms=True,
        )
        try:
            out[name] = _fps(collector, fpb, args.batches)
        finally:
            collector.shutdown()
    for name, sync in (("RayCollector sync", True), ("RayCollector async", False)):
        collector = RayCollector(
            [make_env] * 2,
            policy,
            frames_per_batch=fpb,
            total_frames=-1,
            sync=sync,
            remote_configs=REMOTE,
            auto_register_policy_transforms=True,
        )
        try:
            out[name] = _fps(collector, fpb, args.batches)
        finally:
            collector.shutdown()
    rb = RayReplayBuffer(
        storage=functools.partial(LazyTensorStorage, 1_000_000),
        sampler=functools.partial(SliceSampler, slice_len=16),
        remote_config=REMOTE,
    )
    collector = RayCollector(
        [make_env] * 2,
        policy,
        frames_per_batch=fpb,
        total_frames=-1,
        sync=True,
        replay_buffer=rb,
        remote_configs=REMOTE,
        auto_register_policy_transforms=True,
    )
    try:
        out["RayCollector -> RayReplayBuffer"] = _fps(
            collector, fpb, args.batches, rb=rb
        )
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
        sampling = measure_sampling(args)
    finally:
        ray.shutdown()

    print(f"ray {ray.__version__}, torch {torch.__version__}, 2 workers, LSTM(64)")
    print("\ncollection (frames/s; ratio to MultiSyncCollector)")
    base = collection["MultiSyncCollector"]
    for name, fps in collection.items():
        print(f"  {name:34s} {fps:9.0f}  x{fps / base:.2f}")
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

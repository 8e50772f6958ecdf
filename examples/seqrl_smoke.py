# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Smoke run of the installed fork: a collector on CartPole feeding a replay buffer."""
from __future__ import annotations

import torch
import torchrl
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, ReplayBuffer, SliceSampler
from torchrl.envs import GymEnv


def main():
    torch.manual_seed(0)
    env = GymEnv("CartPole-v1")
    rb = ReplayBuffer(
        storage=LazyTensorStorage(1_000),
        sampler=SliceSampler(
            slice_len=8, traj_key=("collector", "traj_ids"), strict_length=False
        ),
        batch_size=64,
    )
    collector = Collector(env, None, frames_per_batch=200, total_frames=600)
    for i, batch in enumerate(collector):
        rb.extend(batch.reshape(-1))
        sample = rb.sample()
        print(
            f"batch {i}: {batch.numel()} frames, buffer {len(rb)}, "
            f"sample {tuple(sample.shape)}"
        )
    collector.shutdown()
    print(f"torchrl {torchrl.__version__}: collector + replay buffer OK")


if __name__ == "__main__":
    main()

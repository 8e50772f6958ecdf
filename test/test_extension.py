# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""The C++ extension is rebuilt against the pinned torch and works."""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import (
    LazyTensorStorage,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    ReplayBuffer,
)


def test_extension_loads():
    from torchrl._torchrl import SumSegmentTreeFp32

    tree = SumSegmentTreeFp32(8)
    tree[torch.arange(8)] = torch.ones(8)
    assert tree.query(0, 8) == pytest.approx(8.0)


@pytest.mark.parametrize("num_slices", [2, 4])
def test_prioritized_slice_sampler_samples(num_slices):
    torch.manual_seed(0)
    rb = ReplayBuffer(
        storage=LazyTensorStorage(100),
        sampler=PrioritizedSliceSampler(
            max_capacity=100,
            alpha=1.0,
            beta=1.0,
            num_slices=num_slices,
            traj_key="episode",
        ),
        batch_size=16,
    )
    rb.extend(TensorDict({"episode": torch.arange(100) // 20}, [100]))
    sample, info = rb.sample(return_info=True)
    episodes = sample["episode"].view(num_slices, -1)
    # Each slice stays inside one trajectory.
    assert (episodes == episodes[:, :1]).all()
    rb.update_priority(info["index"], torch.full((16,), 5.0))


def test_prioritized_sampler_follows_priorities():
    torch.manual_seed(0)
    rb = ReplayBuffer(
        storage=LazyTensorStorage(10),
        sampler=PrioritizedSampler(max_capacity=10, alpha=1.0, beta=1.0),
        batch_size=256,
    )
    rb.extend(TensorDict({"x": torch.arange(10)}, [10]))
    priority = torch.full((10,), 1e-6)
    priority[3] = 1.0
    rb.update_priority(torch.arange(10), priority)
    assert (rb.sample()["x"] == 3).float().mean() > 0.99

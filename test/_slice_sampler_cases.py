# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Storages and samplers shared by the SliceSampler test modules."""
from __future__ import annotations

import torch

from torchrl.data import (
    LazyMemmapStorage,
    LazyStackStorage,
    LazyTensorStorage,
    PrioritizedSliceSampler,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)

SAMPLERS = [SliceSampler, SliceSamplerWithoutReplacement, PrioritizedSliceSampler]
# "tensor2d" is a LazyTensorStorage with ndim=2 ([num_envs, T] layout).
# "lazystack" is the list-backed storage that returns tensordicts (a plain
# ListStorage returns lists, which the slice samplers reject like upstream).
STORAGES = ["tensor", "memmap", "lazystack", "tensor2d"]


def make_storage(kind: str, tmp_path, capacity: int):
    if kind == "tensor":
        return LazyTensorStorage(capacity)
    if kind == "tensor2d":
        return LazyTensorStorage(capacity, ndim=2)
    if kind == "memmap":
        return LazyMemmapStorage(capacity, scratch_dir=tmp_path)
    if kind == "lazystack":
        return LazyStackStorage(capacity)
    raise ValueError(f"unknown storage kind {kind!r}")


def make_sampler(cls, capacity: int, **kwargs):
    if cls is PrioritizedSliceSampler:
        return cls(max_capacity=capacity, alpha=0.7, beta=0.9, **kwargs)
    return cls(**kwargs)


def trajectory_layout(envs, id_stride: int = 100):
    """Trajectory ids, step counts and ``("next", "done")`` of a ``[num_envs, T]`` layout.

    ``envs[e]`` lists the trajectory lengths of env ``e`` (every env the same
    total length); trajectory ``i`` of env ``e`` gets the id ``id_stride * e + i``.
    """
    trajs, steps = [], []
    for env, lengths in enumerate(envs):
        trajs.append(
            torch.cat(
                [torch.full((n,), id_stride * env + i) for i, n in enumerate(lengths)]
            )
        )
        steps.append(torch.cat([torch.arange(n) for n in lengths]))
    traj, step = torch.stack(trajs), torch.stack(steps)
    done = torch.zeros(*traj.shape, 1, dtype=torch.bool)
    done[:, :-1, 0] = traj[:, 1:] != traj[:, :-1]
    done[:, -1] = True
    return traj, step, done

# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Property-based tests of SliceSampler slicing, markers and padding."""
from __future__ import annotations

import torch
from _slice_sampler_cases import trajectory_layout
from hypothesis import assume, given, HealthCheck, settings, strategies as st
from tensordict import TensorDict

from torchrl.data import (
    LazyTensorStorage,
    PrioritizedSliceSampler,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    TensorDictReplayBuffer,
)

TRAJ_KEY = ("collector", "traj_ids")
MASK = ("collector", "mask")


@st.composite
def layouts(draw):
    """Trajectory lengths (1..60) for 1 to 3 envs, all envs of the same length."""
    num_envs = draw(st.integers(1, 3))
    envs = [
        draw(st.lists(st.integers(1, 60), min_size=1, max_size=4))
        for _ in range(num_envs)
    ]
    # at least 2 steps per env: TorchRL 0.12.0's ReplayBuffer.extend cannot
    # write a single time step into a 2-d storage, nor sample a 1-row buffer
    total = max(2, max(sum(lengths) for lengths in envs))
    # the last trajectory of each env runs until the common length
    for lengths in envs:
        lengths[-1] += total - sum(lengths)
    return envs


def _data(envs, inner_resets, ndim):
    traj, step, done = trajectory_layout(envs)
    generator = torch.Generator().manual_seed(inner_resets)
    is_init = (step == 0) | (torch.rand(traj.shape, generator=generator) < 0.05)
    data = TensorDict(
        {
            "obs": torch.arange(traj.numel()).view(traj.shape),
            "feature": torch.randn(*traj.shape, 2, generator=generator),
            "step": step,
            "is_init": is_init.unsqueeze(-1),
            TRAJ_KEY: traj,
            ("next", "done"): done,
            ("next", "terminated"): done.clone(),
            ("next", "truncated"): torch.zeros_like(done),
        },
        traj.shape,
    )
    return data if ndim == 2 else data.reshape(-1)


def _slices(sample, slice_len, fixed):
    """``(start, stop)`` of each slice in the sample."""
    n = sample.shape[0]
    if fixed:
        return [(a, a + slice_len) for a in range(0, n, slice_len)]
    ends = sample["next", "truncated"].reshape(-1).nonzero().squeeze(-1).tolist()
    starts = [0] + [e + 1 for e in ends[:-1]]
    assert ends[-1] == n - 1
    return list(zip(starts, [e + 1 for e in ends]))


# (left, right) spans. Integer spans only for SliceSampler and with
# strict_length=True: TorchRL 0.12.0 rejects them next to trajectories shorter
# than a slice, and PrioritizedSliceSampler masks every start with a right
# span of slice_len - 1.
BOOL_SPANS = [(False, False), (True, True), (True, False), (False, True)]
INT_SPANS = [(2, 2), (0, 2), (2, 0), (True, 2)]


@st.composite
def samplers(draw, strict_length):
    cls = draw(
        st.sampled_from(
            [SliceSampler, SliceSamplerWithoutReplacement, PrioritizedSliceSampler]
        )
    )
    if cls is SliceSamplerWithoutReplacement:
        # it takes no span
        return cls, (False, False)
    if cls is PrioritizedSliceSampler:
        # it turns a left span off (with a warning): draw right spans only
        spans = [span for span in BOOL_SPANS if not span[0]]
    else:
        spans = BOOL_SPANS + (INT_SPANS if strict_length else [])
    return cls, draw(st.sampled_from(spans))


def _make_sampler(cls, span, capacity, **kwargs):
    if cls is PrioritizedSliceSampler:
        return cls(max_capacity=capacity, alpha=0.7, beta=0.9, span=span, **kwargs)
    if cls is SliceSampler:
        return cls(span=span, **kwargs)
    return cls(**kwargs)


@settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    envs=layouts(),
    inner_resets=st.integers(0, 2**16),
    ndim=st.sampled_from([1, 2]),
    slice_len=st.integers(1, 12),
    num_slices=st.integers(1, 6),
    strict_length=st.booleans(),
    pad_output=st.booleans(),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_slices_markers_padding(
    envs,
    inner_resets,
    ndim,
    slice_len,
    num_slices,
    strict_length,
    pad_output,
    seed,
    data,
):
    cls, span = data.draw(samplers(strict_length))
    if strict_length:
        pad_output = False
        assume(max(max(lengths) for lengths in envs) >= slice_len)
    # an integer span must be shorter than the slice
    assume(all(isinstance(x, bool) or x < slice_len for x in span))
    torch.manual_seed(seed)
    data = _data(envs, inner_resets, ndim)
    flat = data.reshape(-1)
    traj_len = {
        int(t): int(n) for t, n in zip(*flat[TRAJ_KEY].unique(return_counts=True))
    }
    if strict_length and cls is SliceSamplerWithoutReplacement:
        # it may draw only short trajectories, which strict_length rejects
        assume(min(traj_len.values()) >= slice_len)
    if strict_length and cls is PrioritizedSliceSampler:
        # with slice_len=1 it masks every start (TorchRL 0.12.0 too)
        assume(slice_len > 1)
    capacity = 2 * flat.numel()
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(capacity, ndim=ndim),
        sampler=_make_sampler(
            cls,
            span,
            capacity,
            slice_len=slice_len,
            strict_length=strict_length,
            pad_output=pad_output,
        ),
        batch_size=slice_len * num_slices,
    )
    rb.extend(data)
    sample = rb.sample()
    assert sample.ndim == 1
    # without replacement, one slice per trajectory at most: maybe fewer slices
    all_slices = cls is not SliceSamplerWithoutReplacement
    if pad_output:
        assert sample.shape[0] % slice_len == 0
        if all_slices:
            assert sample.shape[0] == slice_len * num_slices
        assert sample[MASK].shape == sample.shape
    else:
        assert MASK not in sample.keys(True)
    stored_is_init = flat["is_init"][sample["obs"]].reshape(-1)
    is_init = sample["is_init"].reshape(-1)
    # stored resets are kept
    assert (is_init | ~stored_is_init).all()
    spans = any(span)
    slices = _slices(
        sample, slice_len, fixed=pad_output or (strict_length and not spans)
    )
    if all_slices:
        # no slice is empty, nor lost
        assert len(slices) == num_slices
    real_rows = 0
    for a, b in slices:
        piece = sample[a:b]
        traj, step = piece[TRAJ_KEY], piece["step"]
        if pad_output:
            mask = piece[MASK]
            n = int(mask.sum())
            # the mask is True on the real rows, which come first
            assert mask[:n].all() and not mask[n:].any()
            # padded rows equal their slice's last real row
            padded = piece[n:].exclude(MASK)
            last = piece[n - 1].exclude(MASK)
            assert (padded == last.expand(padded.shape)).all()
        else:
            n = b - a
        real_rows += n
        assert n >= 1
        # a slice never crosses a trajectory boundary
        assert (traj[:n] == traj[0]).all()
        assert (step[1:n] == step[: n - 1] + 1).all()
        # slices are as long as asked, or as their whole trajectory...
        full = min(slice_len, traj_len[int(traj[0])])
        if not spans:
            assert n == full
        else:
            # ...or cut by the trajectory's start or end, where they may span
            assert n <= full
            if n < full:
                at_start = bool(span[0]) and int(step[0]) == 0
                at_end = (
                    bool(span[1]) and int(step[n - 1]) == traj_len[int(traj[0])] - 1
                )
                assert at_start or at_end
        # every slice starts with is_init
        assert is_init[a]
        # elsewhere is_init is the stored value
        assert (is_init[a + 1 : a + n] == stored_is_init[a + 1 : a + n]).all()
        # the truncation marker sits on the last real step
        truncated = piece["next", "truncated"].reshape(-1)
        assert truncated[n - 1]
        assert not truncated[: n - 1].any()
    if pad_output:
        # the mask counts the real rows
        assert int(sample[MASK].sum()) == real_rows

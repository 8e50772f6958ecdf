# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Burn-in on the slice samplers: ``burn_in=k`` and its markers.

Each sampled slice is the one the sampler picks without burn-in, preceded by
up to ``k`` earlier steps of its trajectory, marked in
``("collector", "burn_in")`` and masked out in ``("collector", "mask")``.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from _slice_sampler_cases import make_sampler, make_storage, STORAGES
from hypothesis import assume, given, HealthCheck, settings, strategies as st
from tensordict import TensorDict
from test_slice_sampler_property import _data, _make_sampler, _slices, layouts, samplers

from torchrl.data import (
    LazyTensorStorage,
    PrioritizedSliceSampler,
    ReplayBuffer,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    TensorDictReplayBuffer,
)

TRAJ_KEY = ("collector", "traj_ids")
MASK = ("collector", "mask")
BURN_IN = ("collector", "burn_in")
SAMPLERS = [SliceSampler, SliceSamplerWithoutReplacement, PrioritizedSliceSampler]


def _check_slice(piece, reference, burn_in, flat):
    """One extended slice of a burn-in sample against the slice without burn-in."""
    burn, mask = piece[BURN_IN], piece[MASK]
    training = piece[mask]
    # the training rows are the rows the sampler picks without burn-in
    assert torch.equal(training["obs"], reference["obs"])
    n = int(burn.sum())
    # burn-in rows come first, then the training rows, then the padding
    assert burn[:n].all() and not burn[n:].any()
    assert mask[n : n + training.shape[0]].all()
    assert not mask[:n].any() and not mask[n + training.shape[0] :].any()
    first = training[0]
    # as many as the trajectory allows, never across its start
    assert n == min(burn_in, int(first["step"]))
    if n:
        prefix = piece[:n]
        assert (prefix[TRAJ_KEY] == first[TRAJ_KEY]).all()
        assert torch.equal(prefix["step"], first["step"] - n + torch.arange(n))
        assert torch.equal(prefix["obs"], first["obs"] - n + torch.arange(n))
    # the init marker is on the first row of the extended slice; the other
    # rows keep the stored one
    is_init = piece["is_init"].reshape(-1)
    assert is_init[0]
    stored = flat["is_init"].reshape(-1)[piece["obs"].reshape(-1)]
    real = n + training.shape[0]
    assert torch.equal(is_init[1:real], stored[1:real])


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    envs=layouts(),
    inner_resets=st.integers(0, 2**16),
    ndim=st.sampled_from([1, 2]),
    slice_len=st.integers(1, 10),
    num_slices=st.integers(1, 5),
    strict_length=st.booleans(),
    pad_output=st.booleans(),
    burn_in=st.integers(1, 8),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_burn_in_property(
    envs,
    inner_resets,
    ndim,
    slice_len,
    num_slices,
    strict_length,
    pad_output,
    burn_in,
    seed,
    data,
):
    cls, span = data.draw(samplers(strict_length))
    if strict_length:
        pad_output = False
        assume(max(max(lengths) for lengths in envs) >= slice_len)
    assume(all(isinstance(x, bool) or x < slice_len for x in span))
    td = _data(envs, inner_resets, ndim)
    flat = td.reshape(-1)
    traj_len = flat[TRAJ_KEY].unique(return_counts=True)[1]
    if strict_length and cls is SliceSamplerWithoutReplacement:
        assume(int(traj_len.min()) >= slice_len)
    if strict_length and cls is PrioritizedSliceSampler:
        assume(slice_len > 1)
    capacity = 2 * flat.numel()

    def draw(k):
        rb = TensorDictReplayBuffer(
            storage=LazyTensorStorage(capacity, ndim=ndim),
            sampler=_make_sampler(
                cls,
                span,
                capacity,
                slice_len=slice_len,
                strict_length=strict_length,
                pad_output=pad_output,
                burn_in=k,
            ),
            batch_size=slice_len * num_slices,
        )
        rb.extend(td)
        # PrioritizedSliceSampler draws from numpy's global generator
        torch.manual_seed(seed)
        np.random.seed(seed)
        return rb.sample()

    reference, sample = draw(0), draw(burn_in)
    assert BURN_IN not in reference.keys(True)
    fixed = pad_output or (strict_length and not any(span))
    ref_slices = _slices(reference, slice_len, fixed=fixed)
    got_slices = _slices(sample, slice_len + burn_in, fixed=pad_output)
    assert len(got_slices) == len(ref_slices)
    if pad_output:
        assert sample.shape[0] == len(ref_slices) * (burn_in + slice_len)
        if cls is not SliceSamplerWithoutReplacement:
            assert sample.shape[0] == num_slices * (burn_in + slice_len)
    for (a, b), (c, d) in zip(got_slices, ref_slices):
        ref = reference[c:d]
        if pad_output:
            ref = ref[ref[MASK]]
        _check_slice(sample[a:b], ref, burn_in, flat)


@pytest.mark.parametrize("cls", SAMPLERS)
@pytest.mark.parametrize("value", [-1, 1.5, True, "2", None])
def test_burn_in_must_be_a_non_negative_int(cls, value):
    with pytest.raises(ValueError, match="burn_in must be a non-negative int"):
        make_sampler(cls, 10, slice_len=4, burn_in=value)


def _episodes(lengths, num_envs=1):
    """``num_envs`` envs running episodes of ``lengths`` steps each, as a ``[num_envs, T]`` batch."""
    from _slice_sampler_cases import trajectory_layout

    traj, step, done = trajectory_layout([list(lengths)] * num_envs)
    return TensorDict(
        {
            "obs": torch.arange(traj.numel()).view(traj.shape),
            "step": step,
            "is_init": (step == 0).unsqueeze(-1),
            TRAJ_KEY: traj,
            ("next", "done"): done,
            ("next", "terminated"): done.clone(),
            ("next", "truncated"): torch.zeros_like(done),
        },
        traj.shape,
    )


@pytest.mark.parametrize("storage_kind", STORAGES)
@pytest.mark.parametrize("cls", SAMPLERS)
@pytest.mark.parametrize("key", ["auto", "end_key"])
def test_burn_in_storages_and_keys(tmp_path, storage_kind, cls, key):
    """Memmap, list-backed and 2-D storages; the auto-detected key or ``end_key``."""
    data = _episodes([30, 5, 25, 20], num_envs=2)
    if storage_kind != "tensor2d":
        data = data.reshape(-1)
    flat = data.reshape(-1)
    kwargs = {} if key == "auto" else {"end_key": ("next", "done")}
    rb = TensorDictReplayBuffer(
        storage=make_storage(storage_kind, tmp_path, 400),
        sampler=make_sampler(
            cls,
            400,
            slice_len=6,
            burn_in=4,
            strict_length=False,
            pad_output=True,
            **kwargs,
        ),
        batch_size=48,
    )
    rb.extend(data)
    torch.manual_seed(0)
    for _ in range(5):
        sample = rb.sample()
        assert sample.shape == (80,) or cls is SliceSamplerWithoutReplacement
        for a in range(0, sample.shape[0], 10):
            piece = sample[a : a + 10]
            mask = piece[MASK]
            _check_slice(piece, piece[mask], 4, flat)
        if cls is SliceSamplerWithoutReplacement:
            rb.sampler._empty()


def test_burn_in_through_a_plain_replay_buffer():
    """The markers reach the sample of a plain ``ReplayBuffer`` too."""
    data = _episodes([12, 12]).reshape(-1)
    rb = ReplayBuffer(
        storage=LazyTensorStorage(100),
        sampler=SliceSampler(slice_len=4, burn_in=3),
        batch_size=8,
    )
    rb.extend(data)
    sample = rb.sample()
    assert sample[BURN_IN].shape == sample.shape
    assert torch.equal(sample[MASK], ~sample[BURN_IN])


def test_custom_burn_in_key_and_state_dict():
    sampler = SliceSampler(slice_len=4, burn_in=2, burn_in_key=("replay", "burn"))
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(100), sampler=sampler, batch_size=8
    )
    rb.extend(_episodes([20, 20]).reshape(-1))
    sample = rb.sample()
    assert ("replay", "burn") in sample.keys(True) and BURN_IN not in sample.keys(True)
    other = SliceSampler(slice_len=4)
    other.load_state_dict(sampler.state_dict())
    assert other.burn_in == 2 and other.burn_in_key == ("replay", "burn")
    assert "burn_in=2" in repr(sampler)


class TestPrioritizedBurnIn:
    @staticmethod
    def _buffer(prefetch=None):
        data = _episodes([40, 40]).reshape(-1)
        rb = TensorDictReplayBuffer(
            storage=LazyTensorStorage(100),
            sampler=PrioritizedSliceSampler(
                max_capacity=100,
                alpha=1.0,
                beta=1.0,
                slice_len=5,
                burn_in=6,
                strict_length=False,
                pad_output=True,
            ),
            batch_size=20,
            priority_key="td_error",
            prefetch=prefetch,
        )
        rb.extend(data)
        return rb

    @staticmethod
    def _priorities(rb):
        return torch.tensor([rb.sampler._sum_tree[i] for i in range(80)])

    @pytest.mark.parametrize("how", ["update_priority", "update_tensordict_priority"])
    def test_update_ignores_burn_in_rows(self, how):
        rb = self._buffer()
        torch.manual_seed(0)
        sample = rb.sample()
        before = self._priorities(rb)
        assert sample[BURN_IN].any()
        if how == "update_priority":
            rb.update_priority(sample["index"], torch.full(sample.shape, 7.0))
        else:
            rb.update_tensordict_priority(
                sample.set("td_error", torch.full((44,), 7.0))
            )
        after = self._priorities(rb)
        train = sample["index"][sample[MASK]]
        burn = sample["index"][sample[BURN_IN]]
        assert (after[train] == 7.0).all()
        # burn-in rows that are not training rows of another slice keep theirs
        only_burn = burn[~torch.isin(burn, train)]
        assert only_burn.numel()
        assert torch.equal(after[only_burn], before[only_burn])

    @pytest.mark.parametrize("which", ["prefetched", "earlier"])
    def test_update_tensordict_priority_of_any_sample(self, which):
        """Not only the last sample: one of a prefetching buffer, or an earlier one."""
        rb = self._buffer(prefetch=3 if which == "prefetched" else None)
        torch.manual_seed(0)
        np.random.seed(0)
        for _ in range(4):
            sample = rb.sample()
            if which == "earlier":
                # the sampler's last sample is another one
                rb.sample()
            assert sample[BURN_IN].any()
            before = self._priorities(rb)
            rb.update_tensordict_priority(
                sample.set("td_error", torch.full((44,), 7.0))
            )
            after = self._priorities(rb)
            train = sample["index"][sample[MASK]]
            burn = sample["index"][sample[BURN_IN]]
            assert (after[train] == 7.0).all()
            only_burn = burn[~torch.isin(burn, train)]
            assert torch.equal(after[only_burn], before[only_burn])

    def test_weights_are_those_of_the_training_steps(self):
        rb = self._buffer()
        # one trajectory with much higher priorities: its training steps are
        # sampled, whatever the priorities of the steps before them
        rb.update_priority(torch.arange(40, 80), torch.full((40,), 1000.0))
        torch.manual_seed(0)
        sample = rb.sample()
        train = sample["index"][sample[MASK]]
        assert (train >= 40).float().mean() > 0.9


@pytest.mark.parametrize("cls", SAMPLERS)
@pytest.mark.parametrize(
    "strict_length,pad_output", [(False, True), (False, False), (True, False)]
)
def test_burn_in_in_a_trajectory_that_wraps_around(cls, strict_length, pad_output):
    """A full circular storage: a trajectory runs past the end and on from row 0."""
    burn_in, slice_len = 8, 3
    first, second = _episodes([10, 15]), _episodes([15])
    second[TRAJ_KEY] += 2
    second["obs"] += 100
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(30),
        sampler=make_sampler(
            cls,
            30,
            slice_len=slice_len,
            burn_in=burn_in,
            strict_length=strict_length,
            pad_output=pad_output,
            traj_key=TRAJ_KEY,
        ),
        batch_size=10 * slice_len,
    )
    rb.extend(first.reshape(-1))
    # rows 25..29 then 0..9: trajectory 2 wraps, trajectory 0 is overwritten
    rb.extend(second.reshape(-1))
    torch.manual_seed(0)
    np.random.seed(0)
    starts_in_wrapped_part = 0
    for _ in range(30):
        sample = rb.sample()
        if pad_output:
            length = burn_in + slice_len
            bounds = [(a, a + length) for a in range(0, sample.shape[0], length)]
        else:
            ends = sample["next", "truncated"].reshape(-1).nonzero().squeeze(-1)
            bounds = list(zip([0] + (ends[:-1] + 1).tolist(), (ends + 1).tolist()))
        for a, b in bounds:
            piece = sample[a:b]
            training = piece[piece[MASK]]
            assert (training[TRAJ_KEY] == training[0][TRAJ_KEY]).all()
            assert torch.equal(
                training["step"],
                training[0]["step"] + torch.arange(training.shape[0]),
            )
            # as many burn-in rows as the trajectory allows, all of it
            burn = piece[BURN_IN]
            n = int(burn.sum())
            assert burn[:n].all() and not burn[n:].any()
            assert n == min(burn_in, int(training[0]["step"]))
            assert (piece[:n][TRAJ_KEY] == training[0][TRAJ_KEY]).all()
            assert torch.equal(
                piece[:n]["step"], training[0]["step"] - n + torch.arange(n)
            )
            starts_in_wrapped_part += int(
                training[0][TRAJ_KEY] == 2 and training[0]["step"] >= 5
            )
        if cls is SliceSamplerWithoutReplacement:
            rb.sampler._empty()
    assert starts_in_wrapped_part


@settings(max_examples=80, deadline=None, database=None)
@given(
    lengths=st.lists(st.integers(0, 9), min_size=1, max_size=8),
    ndim=st.sampled_from([0, 1, 2, 3]),
    storage_length=st.integers(1, 40),
    data=st.data(),
)
def test_slices_of_different_lengths_index(lengths, ndim, storage_length, data):
    """The steps of slices of different lengths (burn-in near a trajectory start), slice by slice."""
    num = len(lengths)
    starts = torch.tensor(
        data.draw(
            st.lists(
                st.lists(
                    st.integers(0, 39), min_size=max(ndim, 1), max_size=max(ndim, 1)
                ),
                min_size=num,
                max_size=num,
            )
        )
    )
    if not ndim:
        starts = starts[:, 0]
    index = SliceSampler(slice_len=4)._tensor_slices_from_startend(
        torch.tensor(lengths), starts, storage_length
    )
    expected = []
    for start, length in zip(starts.reshape(num, -1).tolist(), lengths):
        for step in range(length):
            expected.append([(start[0] + step) % storage_length] + start[1:])
    expected = torch.tensor(expected, dtype=torch.long).reshape(-1, max(ndim, 1))
    assert index.dtype == torch.long
    assert torch.equal(index, expected)

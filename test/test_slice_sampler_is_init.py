# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""SliceSampler marks slice starts in ``"is_init"``."""
from __future__ import annotations

import pytest
import torch
from _slice_sampler_cases import make_sampler, make_storage, SAMPLERS, STORAGES
from tensordict import TensorDict

from torchrl.data import (
    LazyTensorStorage,
    ReplayBuffer,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    TensorDictReplayBuffer,
)
from torchrl.modules import GRUModule, LSTMModule, set_recurrent_mode

TRAJ_KEY = ("collector", "traj_ids")
SLICE_LEN = 6
CAPACITY = 500
NUM_SLICES = 8
# trajectory lengths of each env; some are shorter than SLICE_LEN
LENGTHS = [[3, 12, 7, 20, 2, 16], [25, 4, 31]]
# stored resets inside trajectories (env, step), on top of trajectory starts
INNER_RESETS = [(0, 28), (0, 47), (1, 40)]


def _env_rows(lengths, traj_offset):
    traj = torch.cat([torch.full((n,), traj_offset + i) for i, n in enumerate(lengths)])
    step = torch.cat([torch.arange(n) for n in lengths])
    return traj, step


def _data(ndim, *, is_init=True, hidden=False, next_is_init=False):
    """Two envs of 60 steps each, as ``[2, 60]`` or flattened to ``[120]``.

    With ``next_is_init=True`` a ``("next", "is_init")`` entry is stored too,
    ``True`` before each stored reset inside a trajectory.
    """
    trajs, steps = zip(
        *(_env_rows(lengths, 10 * i) for i, lengths in enumerate(LENGTHS))
    )
    traj, step = torch.stack(trajs), torch.stack(steps)
    num_envs, num_steps = traj.shape
    done = torch.zeros(num_envs, num_steps, 1, dtype=torch.bool)
    done[:, :-1, 0] = traj[:, 1:] != traj[:, :-1]
    done[:, -1] = True
    fields = {
        "obs": torch.arange(traj.numel()).view(traj.shape),
        "step": step,
        TRAJ_KEY: traj,
        ("next", "done"): done,
        ("next", "terminated"): done.clone(),
        ("next", "truncated"): torch.zeros_like(done),
    }
    if is_init:
        init = (step == 0).unsqueeze(-1)
        for env, t in INNER_RESETS:
            init[env, t] = True
        fields["is_init"] = init
    if next_is_init:
        next_init = torch.zeros(num_envs, num_steps, 1, dtype=torch.bool)
        for env, t in INNER_RESETS:
            next_init[env, t - 1] = True
        fields[("next", "is_init")] = next_init
    data = TensorDict(fields, [num_envs, num_steps])
    if hidden:
        data["features_in"] = torch.randn(num_envs, num_steps, 3)
        data["recurrent_state_h"] = torch.randn(num_envs, num_steps, 1, 5)
        data["recurrent_state_c"] = torch.randn(num_envs, num_steps, 1, 5)
        data["recurrent_state"] = torch.randn(num_envs, num_steps, 1, 5)
    if ndim == 1:
        data = data.reshape(-1)
    return data


def _buffer(kind, tmp_path, cls=SliceSampler, data_kwargs=None, **kwargs):
    ndim = 2 if kind == "tensor2d" else 1
    sampler = make_sampler(cls, CAPACITY, slice_len=SLICE_LEN, **kwargs)
    rb = TensorDictReplayBuffer(
        storage=make_storage(kind, tmp_path, CAPACITY),
        sampler=sampler,
        batch_size=SLICE_LEN * NUM_SLICES,
    )
    data = _data(ndim, **(data_kwargs or {}))
    rb.extend(data)
    return rb, data.reshape(-1)


def _stored(flat, sample, key):
    """The stored values of ``key`` at the sampled rows (found by ``obs``)."""
    return flat[key][sample["obs"]]


def _slice_starts(sample, *, truncated_key, strict_length):
    """Start rows of each slice, and whether they are the exact set of starts."""
    n = sample.shape[0]
    if strict_length:
        return torch.arange(0, n, SLICE_LEN), True
    if truncated_key is not None:
        ends = sample[truncated_key].reshape(-1).nonzero().squeeze(-1)
        return torch.cat([torch.zeros(1, dtype=torch.long), ends[:-1] + 1]), True
    # no marker to read: rows where the trajectory or the step sequence breaks
    # are starts (adjacent slices of one trajectory may go unnoticed)
    traj, step = sample[TRAJ_KEY], sample["step"]
    brk = (traj[1:] != traj[:-1]) | (step[1:] != step[:-1] + 1)
    return torch.cat([torch.zeros(1, dtype=torch.long), brk.nonzero()[:, 0] + 1]), False


@pytest.mark.parametrize("kind", STORAGES)
@pytest.mark.parametrize("cls", SAMPLERS)
@pytest.mark.parametrize("truncated_key", [("next", "truncated"), None])
@pytest.mark.parametrize("strict_length", [True, False])
class TestSliceStartMarkers:
    def test_markers(self, kind, cls, truncated_key, strict_length, tmp_path):
        torch.manual_seed(0)
        rb, flat = _buffer(
            kind,
            tmp_path,
            cls,
            truncated_key=truncated_key,
            strict_length=strict_length,
        )
        seen_inner_reset = False
        # without replacement, a later batch may hold only short trajectories,
        # which strict_length=True rejects: one batch is enough there
        for _ in range(1 if cls is SliceSamplerWithoutReplacement else 6):
            sample = rb.sample()
            is_init = sample["is_init"].reshape(-1)
            stored = _stored(flat, sample, "is_init").reshape(-1)
            starts, exact = _slice_starts(
                sample, truncated_key=truncated_key, strict_length=strict_length
            )
            # every slice starts with is_init
            assert is_init[starts].all()
            # stored resets are kept
            assert (is_init | ~stored).all()
            expected = stored.clone()
            expected[starts] = True
            if exact:
                assert (is_init == expected).all()
            else:
                assert (is_init >= expected).all()
            not_starts = torch.ones_like(is_init)
            not_starts[starts] = False
            seen_inner_reset |= bool((stored & not_starts).any())
        if strict_length and cls is SliceSampler:
            # slices of 6 steps hit the stored resets inside trajectories
            assert seen_inner_reset

    def test_no_is_init_invented(
        self, kind, cls, truncated_key, strict_length, tmp_path
    ):
        rb, _ = _buffer(
            kind,
            tmp_path,
            cls,
            data_kwargs={"is_init": False},
            truncated_key=truncated_key,
            strict_length=strict_length,
        )
        sample = rb.sample()
        assert "is_init" not in sample.keys()
        assert ("next", "is_init") not in sample.keys(True)

    def test_next_markers(self, kind, cls, truncated_key, strict_length, tmp_path):
        """``("next", "is_init")`` marks the slice starts too, when it is stored."""
        torch.manual_seed(0)
        rb, flat = _buffer(
            kind,
            tmp_path,
            cls,
            data_kwargs={"next_is_init": True},
            truncated_key=truncated_key,
            strict_length=strict_length,
        )
        for _ in range(1 if cls is SliceSamplerWithoutReplacement else 3):
            sample = rb.sample()
            next_init = sample["next", "is_init"].reshape(-1)
            stored = _stored(flat, sample, ("next", "is_init")).reshape(-1)
            starts, exact = _slice_starts(
                sample, truncated_key=truncated_key, strict_length=strict_length
            )
            expected = stored.clone()
            expected[starts] = True
            if exact:
                assert (next_init == expected).all()
            else:
                assert (next_init >= expected).all()
            # the root marker is unchanged by it
            root_expected = _stored(flat, sample, "is_init").reshape(-1).clone()
            root_expected[starts] = True
            assert (sample["is_init"].reshape(-1) >= root_expected).all()


class TestPlainReplayBuffer:
    def test_markers_in_info(self):
        rb = ReplayBuffer(
            storage=LazyTensorStorage(500),
            sampler=SliceSampler(slice_len=SLICE_LEN),
            batch_size=SLICE_LEN * NUM_SLICES,
        )
        data = _data(1)
        rb.extend(data)
        sample, info = rb.sample(return_info=True)
        is_init = info["is_init"].reshape(-1)
        assert is_init[::SLICE_LEN].all()
        stored = data["is_init"][sample["obs"]].reshape(-1)
        expected = stored.clone()
        expected[::SLICE_LEN] = True
        assert (is_init == expected).all()

    def test_next_markers_in_sample(self):
        rb = ReplayBuffer(
            storage=LazyTensorStorage(500),
            sampler=SliceSampler(slice_len=SLICE_LEN),
            batch_size=SLICE_LEN * NUM_SLICES,
        )
        data = _data(1, next_is_init=True)
        rb.extend(data)
        sample, info = rb.sample(return_info=True)
        expected = data["next", "is_init"][sample["obs"]].reshape(-1).clone()
        expected[::SLICE_LEN] = True
        assert (info["next", "is_init"].reshape(-1) == expected).all()
        assert (sample["next", "is_init"].reshape(-1) == expected).all()


def _reference_lstm(module, sample, is_init):
    """Runs ``module``'s LSTM on each sub-trajectory, from its stored hidden state."""
    lstm = module.lstm
    out = torch.empty(sample.shape[0], lstm.hidden_size)
    starts = is_init.nonzero().squeeze(-1).tolist() + [sample.shape[0]]
    for a, b in zip(starts[:-1], starts[1:]):
        h0 = sample["recurrent_state_h"][a].unsqueeze(1)
        c0 = sample["recurrent_state_c"][a].unsqueeze(1)
        y, _ = lstm(sample["features_in"][a:b].unsqueeze(0), (h0, c0))
        out[a:b] = y[0]
    return out


def _reference_gru(module, sample, is_init):
    gru = module.gru
    out = torch.empty(sample.shape[0], gru.hidden_size)
    starts = is_init.nonzero().squeeze(-1).tolist() + [sample.shape[0]]
    for a, b in zip(starts[:-1], starts[1:]):
        h0 = sample["recurrent_state"][a].unsqueeze(1)
        y, _ = gru(sample["features_in"][a:b].unsqueeze(0), h0)
        out[a:b] = y[0]
    return out


@pytest.mark.parametrize("kind", ["tensor", "tensor2d"])
@pytest.mark.parametrize("strict_length", [True, False])
@pytest.mark.parametrize("rnn", ["lstm", "gru"])
class TestRecurrentModules:
    def test_flat_sample_equals_per_slice(self, kind, strict_length, rnn, tmp_path):
        torch.manual_seed(1)
        rb, _ = _buffer(
            kind,
            tmp_path,
            data_kwargs={"hidden": True},
            strict_length=strict_length,
        )
        if rnn == "lstm":
            module = LSTMModule(
                input_size=3, hidden_size=5, in_key="features_in", out_key="features"
            )
            reference = _reference_lstm
        else:
            module = GRUModule(
                input_size=3, hidden_size=5, in_key="features_in", out_key="features"
            )
            reference = _reference_gru
        sample = rb.sample()
        is_init = sample["is_init"].reshape(-1)
        with torch.no_grad(), set_recurrent_mode(True):
            flat = module(sample.clone())["features"]
            # per-slice processing, one module call per slice
            starts, _ = _slice_starts(
                sample, truncated_key=("next", "truncated"), strict_length=strict_length
            )
            bounds = starts.tolist() + [sample.shape[0]]
            per_slice = torch.cat(
                [
                    module(sample[a:b].clone())["features"]
                    for a, b in zip(bounds[:-1], bounds[1:])
                ]
            )
            expected = reference(module, sample, is_init)
        torch.testing.assert_close(flat, per_slice)
        torch.testing.assert_close(flat, expected)


class TestSpan:
    """Spanning slices keep their markers (and are never empty)."""

    @pytest.mark.parametrize(
        "span", [True, (False, True), (True, False), 2, (0, 2), (True, 2)]
    )
    def test_span_with_is_init(self, span):
        torch.manual_seed(0)
        traj = torch.arange(40) // 10
        step = torch.arange(40) % 10
        data = TensorDict(
            {
                "obs": torch.arange(40),
                "is_init": (step == 0).unsqueeze(-1),
                TRAJ_KEY: traj,
                ("next", "done"): (step == 9).unsqueeze(-1),
            },
            [40],
        )
        num_slices = 20
        rb = TensorDictReplayBuffer(
            storage=LazyTensorStorage(100),
            sampler=SliceSampler(num_slices=num_slices, span=span, strict_length=False),
            batch_size=8 * num_slices,
        )
        rb.extend(data)
        saw_short = False
        for _ in range(50):
            sample = rb.sample()
            truncated = sample["next", "truncated"].reshape(-1)
            ends = truncated.nonzero().squeeze(-1)
            # one truncation marker per slice: no slice is empty
            assert ends.numel() == num_slices
            assert ends[-1] == sample.shape[0] - 1
            starts = torch.cat([torch.zeros(1, dtype=torch.long), ends[:-1] + 1])
            lengths = ends + 1 - starts
            assert (lengths >= 1).all()
            saw_short |= bool((lengths < 8).any())
            assert sample["is_init"].reshape(-1)[starts].all()
            # each slice stays in one trajectory
            for a, b in zip(starts.tolist(), (ends + 1).tolist()):
                assert (sample[TRAJ_KEY][a:b] == sample[TRAJ_KEY][a]).all()
        assert saw_short

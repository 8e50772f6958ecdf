# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""SliceSampler(pad_output=True): fixed-size samples with a mask."""
from __future__ import annotations

import pickle

import numpy as np

import pytest
import torch
from _slice_sampler_cases import make_sampler, make_storage, SAMPLERS, STORAGES
from tensordict import TensorDict

from torchrl.data import (
    LazyTensorStorage,
    PrioritizedSliceSampler,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    TensorDictReplayBuffer,
)

MASK = ("collector", "mask")
TRAJ_KEY = ("collector", "traj_ids")
SLICE_LEN = 8
CAPACITY = 200
NUM_SLICES = 10
# per env: trajectory lengths, many shorter than SLICE_LEN
LENGTHS = [[3, 1, 12, 5, 9, 2], [6, 4, 2, 7, 11, 2]]


def _data(ndim):
    rows = []
    for env, lengths in enumerate(LENGTHS):
        traj = torch.cat(
            [torch.full((n,), 100 * env + i) for i, n in enumerate(lengths)]
        )
        step = torch.cat([torch.arange(n) for n in lengths])
        rows.append((traj, step))
    traj = torch.stack([r[0] for r in rows])
    step = torch.stack([r[1] for r in rows])
    done = torch.zeros(*traj.shape, 1, dtype=torch.bool)
    done[:, :-1, 0] = traj[:, 1:] != traj[:, :-1]
    done[:, -1] = True
    data = TensorDict(
        {
            "obs": torch.arange(traj.numel()).view(traj.shape),
            "pixels": torch.randn(*traj.shape, 2, 3),
            "step": step,
            "is_init": (step == 0).unsqueeze(-1),
            TRAJ_KEY: traj,
            ("next", "done"): done,
            ("next", "terminated"): done.clone(),
            ("next", "truncated"): torch.zeros_like(done),
            ("next", "reward"): torch.randn(*traj.shape, 1),
        },
        traj.shape,
    )
    return data if ndim == 2 else data.reshape(-1)


class TestConstruction:
    @pytest.mark.parametrize("cls", SAMPLERS)
    def test_strict_length_raises(self, cls):
        with pytest.raises(ValueError, match="pad_output=True.*strict_length=False"):
            make_sampler(cls, CAPACITY, slice_len=SLICE_LEN, pad_output=True)
        with pytest.raises(ValueError, match="strict_length"):
            make_sampler(
                cls, CAPACITY, slice_len=SLICE_LEN, pad_output=True, strict_length=True
            )

    @pytest.mark.parametrize("cls", SAMPLERS)
    @pytest.mark.parametrize("pad_output", [True, False])
    def test_repr(self, cls, pad_output):
        sampler = make_sampler(
            cls,
            CAPACITY,
            slice_len=SLICE_LEN,
            strict_length=False,
            pad_output=pad_output,
        )
        assert f"pad_output={pad_output}" in repr(sampler)

    @pytest.mark.parametrize("cls", SAMPLERS)
    def test_repr_of_old_pickle(self, cls):
        # an instance pickled before pad_output (and the key detection) existed
        sampler = make_sampler(cls, CAPACITY, slice_len=SLICE_LEN, traj_key="episode")
        state = sampler.__getstate__()
        for name in (
            "pad_output",
            "init_key",
            "mask_key",
            "_traj_key_auto",
            "_traj_key_resolved",
        ):
            state.pop(name, None)
        old = cls.__new__(cls)
        old.__dict__.update(state)
        restored = pickle.loads(pickle.dumps(old))
        assert "pad_output=False" in repr(restored)
        assert "traj_key=episode" in repr(restored)
        assert "init_key=is_init" in repr(restored)

    def test_default_has_no_mask(self):
        rb = TensorDictReplayBuffer(
            storage=LazyTensorStorage(200),
            sampler=SliceSampler(slice_len=SLICE_LEN, strict_length=False),
            batch_size=SLICE_LEN * NUM_SLICES,
        )
        rb.extend(_data(1))
        sample = rb.sample()
        assert MASK not in sample.keys(True)
        # short slices are not padded by default
        assert sample.shape[0] < SLICE_LEN * NUM_SLICES


@pytest.mark.parametrize("kind", STORAGES)
@pytest.mark.parametrize("cls", SAMPLERS)
@pytest.mark.parametrize("truncated_key", [("next", "truncated"), None])
class TestPaddedSample:
    def test_padded_sample(self, kind, cls, truncated_key, tmp_path):
        torch.manual_seed(0)
        data = _data(2 if kind == "tensor2d" else 1)
        flat = data.reshape(-1)
        rb = TensorDictReplayBuffer(
            storage=make_storage(kind, tmp_path, CAPACITY),
            sampler=make_sampler(
                cls,
                CAPACITY,
                slice_len=SLICE_LEN,
                strict_length=False,
                pad_output=True,
                truncated_key=truncated_key,
            ),
            batch_size=SLICE_LEN * NUM_SLICES,
        )
        rb.extend(data)
        saw_padding = False
        for _ in range(1 if cls is SliceSamplerWithoutReplacement else 4):
            sample = rb.sample()
            # exactly num_slices * slice_len rows, never reshaped
            assert sample.batch_size == torch.Size([SLICE_LEN * NUM_SLICES])
            mask = sample[MASK]
            assert mask.dtype == torch.bool
            assert mask.shape == torch.Size([SLICE_LEN * NUM_SLICES])
            mask = mask.view(NUM_SLICES, SLICE_LEN)
            obs = sample["obs"].view(NUM_SLICES, SLICE_LEN)
            traj = sample[TRAJ_KEY].view(NUM_SLICES, SLICE_LEN)
            step = sample["step"].view(NUM_SLICES, SLICE_LEN)
            # a slice holds the real steps first, then the padding
            real_len = mask.sum(-1)
            assert (real_len >= 1).all()
            assert (mask == (torch.arange(SLICE_LEN) < real_len.unsqueeze(-1))).all()
            saw_padding |= bool((~mask).any())
            last = real_len - 1
            rows = torch.arange(NUM_SLICES)
            for b in range(NUM_SLICES):
                n = int(real_len[b])
                # real steps are consecutive steps of one trajectory
                assert (traj[b, :n] == traj[b, 0]).all()
                assert (step[b, 1:n] == step[b, : n - 1] + 1).all()
                # a slice is only short when its trajectory is
                if n < SLICE_LEN:
                    traj_len = int((flat[TRAJ_KEY] == traj[b, 0]).sum())
                    assert n == traj_len
            # padded rows are copies of their slice's last real row (all
            # entries, markers included), except for the mask
            per_slice = sample.exclude(MASK).view(NUM_SLICES, SLICE_LEN)
            last_rows = per_slice[rows, last]
            for b in range(NUM_SLICES):
                n = int(real_len[b])
                for t in range(n, SLICE_LEN):
                    assert (per_slice[b, t] == last_rows[b]).all()
            # stored content of real rows is the stored data
            assert (sample["pixels"] == flat["pixels"][sample["obs"]]).all()
            # is_init on slice starts
            is_init = sample["is_init"].view(NUM_SLICES, SLICE_LEN)
            assert is_init[:, 0].all()
            if truncated_key is not None:
                truncated = sample[truncated_key].view(NUM_SLICES, SLICE_LEN)
                # the truncation marker sits on the last real step
                assert truncated[rows, last].all()
                assert not (truncated & mask & (obs != obs[rows, last, None])).any()
                done = sample["next", "done"].view(NUM_SLICES, SLICE_LEN)
                assert done[rows, last].all()
            else:
                # no marker written: the stored values come through
                assert not sample["next", "truncated"].any()
        if cls is not SliceSamplerWithoutReplacement:
            assert saw_padding


class TestPrioritizedWeights:
    def test_priority_weight_padded(self):
        sampler = PrioritizedSliceSampler(
            max_capacity=200,
            alpha=0.7,
            beta=0.9,
            slice_len=SLICE_LEN,
            strict_length=False,
            pad_output=True,
        )
        rb = TensorDictReplayBuffer(
            storage=LazyTensorStorage(200),
            sampler=sampler,
            batch_size=SLICE_LEN * NUM_SLICES,
        )
        rb.extend(_data(1))
        rb.update_priority(torch.arange(len(rb)), torch.rand(len(rb)) + 0.1)
        sample = rb.sample()
        weight = sample["priority_weight"].view(NUM_SLICES, SLICE_LEN)
        # one weight per slice, padded rows included
        assert (weight == weight[:, :1]).all()
        index = sample["index"].reshape(NUM_SLICES, SLICE_LEN)
        mask = sample[MASK].view(NUM_SLICES, SLICE_LEN)
        assert (index[~mask] >= 0).all()


class TestPrioritizedPadding:
    @staticmethod
    def _buffer(kind, tmp_path):
        sampler = PrioritizedSliceSampler(
            max_capacity=CAPACITY,
            alpha=1.0,
            beta=0.9,
            slice_len=SLICE_LEN,
            strict_length=False,
            pad_output=True,
        )
        rb = TensorDictReplayBuffer(
            storage=make_storage(kind, tmp_path, CAPACITY),
            sampler=sampler,
            batch_size=SLICE_LEN * NUM_SLICES,
        )
        rb.extend(_data(2 if kind == "tensor2d" else 1))
        return rb

    @pytest.mark.parametrize("kind", ["tensor", "tensor2d"])
    @pytest.mark.parametrize("via", ["update_priority", "update_tensordict_priority"])
    def test_padded_rows_keep_the_real_priority(self, kind, via, tmp_path):
        torch.manual_seed(0)
        rb = self._buffer(kind, tmp_path)
        sample = rb.sample()
        mask = sample[MASK]
        assert not mask.all()
        n = sample.shape[0]
        # distinct priorities on real rows; padded rows get another value
        # (whatever a loss computes for them, it is not the real step's)
        priority = torch.where(mask, torch.arange(1.0, n + 1), torch.tensor(1000.0))
        if via == "update_priority":
            rb.update_priority(sample["index"], priority)
        else:
            sample.set("td_error", priority)
            rb.update_tensordict_priority(sample)
        index = sample["index"]
        if index.ndim > 1:
            index = torch.as_tensor(
                np.ravel_multi_index(index.unbind(-1), rb.storage.shape)
            )
        tree = rb.sampler._sum_tree
        for row in (~mask).nonzero().squeeze(-1).tolist():
            step = int(index[row])
            # the padded row points at its slice's last real step...
            real = priority[mask & (index == step)]
            assert real.numel()
            # ...whose priority is a real row's update, not the padded one
            assert torch.isclose(torch.tensor(tree[step]), real).any(), (
                tree[step],
                real,
            )

    def test_state_dict_round_trip(self, tmp_path):
        torch.manual_seed(0)
        rb = self._buffer("tensor", tmp_path)
        n = len(rb)
        rb.update_priority(torch.arange(n), torch.rand(n) + 0.1)
        torch.save(rb.state_dict(), tmp_path / "rb.pt")
        other = self._buffer("tensor", tmp_path)
        other.empty()
        other.load_state_dict(torch.load(tmp_path / "rb.pt", weights_only=False))
        for name in ("_sum_tree", "_min_tree"):
            expected = [getattr(rb.sampler, name)[i] for i in range(n)]
            restored = [getattr(other.sampler, name)[i] for i in range(n)]
            assert restored == expected, name
        assert other.sampler._max_priority[0] == rb.sampler._max_priority[0]
        # and the restored buffer samples like the original one (the
        # prioritized draw uses numpy's global generator)
        torch.manual_seed(1)
        np.random.seed(1)
        expected = rb.sample()["index"]
        torch.manual_seed(1)
        np.random.seed(1)
        assert (other.sample()["index"] == expected).all()


class TestIntegerSpanShortTrajectories:
    """Integer spans × strict_length=False × padding / burn-in (fix 0012).

    Trajectories shorter than the slice and than the span: each padded slice's
    real rows are consecutive steps of one trajectory, at least one of them.
    """

    @pytest.mark.parametrize("span", [1, (2, 0), (0, 2), (True, 1)])
    @pytest.mark.parametrize("burn_in", [0, 2])
    def test_padded_slices_stay_in_one_trajectory(self, span, burn_in):
        torch.manual_seed(0)
        lengths = [1, 2, 3, 10]
        traj = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
        rb = TensorDictReplayBuffer(
            storage=LazyTensorStorage(16),
            sampler=SliceSampler(
                slice_len=4,
                strict_length=False,
                traj_key="traj",
                span=span,
                pad_output=True,
                burn_in=burn_in,
            ),
            batch_size=16,
        )
        rb.extend(TensorDict({"traj": traj, "x": torch.arange(16)}, [16]))
        for _ in range(30):
            slices = rb.sample().reshape(-1, 4 + burn_in)
            for row in slices.unbind(0):
                real = row[row[MASK]]
                assert real.numel() >= 1
                assert (real["traj"] == real["traj"][0]).all()
                assert (real["x"].diff() == 1).all()

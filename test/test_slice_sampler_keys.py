# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Slice samplers follow a renamed or nested ``init_key`` and ``mask_key``."""
from __future__ import annotations

import pickle
import re

import pytest
import torch
from _slice_sampler_cases import (
    make_sampler,
    make_storage,
    SAMPLERS,
    STORAGES,
    trajectory_layout,
)
from tensordict import TensorDict

from torchrl.data import ReplayBuffer, TensorDictReplayBuffer
from torchrl.envs import GymEnv, InitTracker, TransformedEnv

TRAJ_KEY = ("collector", "traj_ids")
SLICE_LEN = 6
NUM_SLICES = 8
CAPACITY = 200
# per env: trajectory lengths, some shorter than SLICE_LEN
LENGTHS = [[3, 9, 12, 4], [7, 2, 10, 9]]


def _data(ndim, init_key):
    traj, step, done = trajectory_layout(LENGTHS)
    data = TensorDict(
        {
            "obs": torch.arange(traj.numel()).view(traj.shape),
            "step": step,
            init_key: (step == 0).unsqueeze(-1),
            TRAJ_KEY: traj,
            ("next", "done"): done,
        },
        traj.shape,
    )
    return data if ndim == 2 else data.reshape(-1)


def _slice_starts(sample):
    ends = sample["next", "truncated"].reshape(-1).nonzero().squeeze(-1)
    return torch.cat([torch.zeros(1, dtype=torch.long), ends[:-1] + 1])


@pytest.mark.parametrize("kind", STORAGES)
@pytest.mark.parametrize("cls", SAMPLERS)
@pytest.mark.parametrize("init_key", [("agents", "is_init"), "first_step"])
def test_renamed_init_key_marks_slice_starts(kind, cls, init_key, tmp_path):
    torch.manual_seed(0)
    sampler = make_sampler(
        cls, CAPACITY, slice_len=SLICE_LEN, strict_length=False, init_key=init_key
    )
    rb = TensorDictReplayBuffer(
        storage=make_storage(kind, tmp_path, CAPACITY),
        sampler=sampler,
        batch_size=SLICE_LEN * NUM_SLICES,
    )
    data = _data(2 if kind == "tensor2d" else 1, init_key)
    rb.extend(data)
    flat = data.reshape(-1)
    sample = rb.sample()
    starts = _slice_starts(sample)
    is_init = sample[init_key].reshape(-1)
    assert is_init[starts].all()
    # elsewhere, the stored value
    expected = flat[init_key][sample["obs"]].reshape(-1).clone()
    expected[starts] = True
    assert (is_init == expected).all()
    # no "is_init" is invented next to the renamed key
    assert "is_init" not in sample.keys()


@pytest.mark.parametrize("cls", SAMPLERS)
def test_renamed_mask_key(cls):
    torch.manual_seed(0)
    mask_key = ("agents", "mask")
    sampler = make_sampler(
        cls,
        CAPACITY,
        slice_len=SLICE_LEN,
        strict_length=False,
        pad_output=True,
        mask_key=mask_key,
    )
    rb = TensorDictReplayBuffer(
        storage=make_storage("tensor", None, CAPACITY),
        sampler=sampler,
        batch_size=SLICE_LEN * NUM_SLICES,
    )
    rb.extend(_data(1, "is_init"))
    sample = rb.sample()
    assert sample[mask_key].shape == sample.shape
    assert ("collector", "mask") not in sample.keys(True)
    # the mask is True on the real rows of each slice, which come first
    mask = sample[mask_key].view(NUM_SLICES, SLICE_LEN)
    assert mask[:, 0].all()
    assert (mask[:, 1:] <= mask[:, :-1]).all()


def test_init_tracker_key_on_cartpole():
    """A sampler reads the key a real ``InitTracker(init_key=...)`` writes."""
    init_key = "first_step"
    env = TransformedEnv(GymEnv("CartPole-v1"), InitTracker(init_key=init_key))
    env.set_seed(0)
    torch.manual_seed(0)
    rollout = env.rollout(300, break_when_any_done=False)
    assert init_key in rollout.keys(True)
    rb = ReplayBuffer(
        storage=make_storage("tensor", None, 1000),
        sampler=make_sampler(
            SAMPLERS[0],
            1000,
            slice_len=SLICE_LEN,
            strict_length=False,
            end_key=("next", "done"),
            init_key=init_key,
        ),
        batch_size=SLICE_LEN * NUM_SLICES,
    )
    rb.extend(rollout)
    sample = rb.sample()
    assert sample[init_key].reshape(-1)[_slice_starts(sample)].all()


@pytest.mark.parametrize("cls", SAMPLERS)
@pytest.mark.parametrize("arg", ["init_key", "mask_key"])
@pytest.mark.parametrize("value", [3, "", (), ("agents", 1), ("agents", "")])
def test_invalid_key_names_the_argument(cls, arg, value):
    with pytest.raises(
        ValueError, match=f"{arg} must be .*got {re.escape(repr(value))}"
    ):
        make_sampler(cls, CAPACITY, slice_len=SLICE_LEN, **{arg: value})


@pytest.mark.parametrize("cls", SAMPLERS)
def test_keys_persist(cls):
    keys = {"init_key": ("agents", "is_init"), "mask_key": ("agents", "mask")}
    sampler = make_sampler(
        cls, CAPACITY, slice_len=SLICE_LEN, strict_length=False, **keys
    )
    text = repr(sampler)
    assert "init_key=('agents', 'is_init')" in text
    assert "mask_key=('agents', 'mask')" in text
    clone = pickle.loads(pickle.dumps(sampler))
    assert (clone.init_key, clone.mask_key) == tuple(keys.values())
    fresh = make_sampler(cls, CAPACITY, slice_len=SLICE_LEN, strict_length=False)
    assert (fresh.init_key, fresh.mask_key) == ("is_init", ("collector", "mask"))
    fresh.load_state_dict(sampler.state_dict())
    assert (fresh.init_key, fresh.mask_key) == tuple(keys.values())

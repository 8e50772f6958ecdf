# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Slice markers land in the sample whichever replay-buffer class returns it."""
from __future__ import annotations

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

from torchrl.data import (
    LazyStackStorage,
    LazyTensorStorage,
    ListStorage,
    RandomSampler,
    ReplayBuffer,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    TensorDictReplayBuffer,
)

TRAJ_KEY = ("collector", "traj_ids")
MASK = ("collector", "mask")
SLICE_LEN = 5
NUM_SLICES = 6
CAPACITY = 200
BUFFERS = [ReplayBuffer, TensorDictReplayBuffer]


def _data(ndim=1):
    """Two envs, trajectories of 3, 8, 12 and 7 steps (some shorter than a slice)."""
    traj, step, done = trajectory_layout([[3, 8, 12, 7], [7, 12, 3, 8]], id_stride=10)
    data = TensorDict(
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
    return data if ndim == 2 else data.reshape(-1)


def _buffer(buffer_cls, kind, cls, tmp_path, **kwargs):
    rb = buffer_cls(
        storage=make_storage(kind, tmp_path, CAPACITY),
        sampler=make_sampler(
            cls, CAPACITY, slice_len=SLICE_LEN, strict_length=False, **kwargs
        ),
        batch_size=SLICE_LEN * NUM_SLICES,
    )
    data = _data(2 if kind == "tensor2d" else 1)
    rb.extend(data)
    return rb, data.reshape(-1)


@pytest.mark.parametrize("kind", STORAGES)
@pytest.mark.parametrize("cls", SAMPLERS)
@pytest.mark.parametrize("pad_output", [False, True])
@pytest.mark.parametrize("buffer_cls", BUFFERS)
def test_sample_carries_the_markers(buffer_cls, pad_output, cls, kind, tmp_path):
    torch.manual_seed(0)
    rb, flat = _buffer(buffer_cls, kind, cls, tmp_path, pad_output=pad_output)
    sample, info = rb.sample(return_info=True)
    # the markers of the info are the sample's entries
    keys = [
        "is_init",
        ("next", "truncated"),
        ("next", "done"),
        ("next", "terminated"),
    ] + ([MASK] if pad_output else [])
    for key in keys:
        assert (sample[key] == info[key].reshape(sample[key].shape)).all(), key
    if not pad_output:
        assert MASK not in sample.keys(True)
    # every slice starts with is_init and ends with the truncation marker,
    # so a recurrent module sees the slices, not one long sequence
    is_init = sample["is_init"].reshape(-1)
    if pad_output:
        assert is_init.view(NUM_SLICES, SLICE_LEN)[:, 0].all()
        return
    ends = sample["next", "truncated"].reshape(-1).nonzero().squeeze(-1)
    assert ends[-1] == sample.shape[0] - 1
    starts = torch.cat([torch.zeros(1, dtype=torch.long), ends[:-1] + 1])
    stored = flat["is_init"][sample["obs"]].reshape(-1).clone()
    stored[starts] = True
    assert (is_init == stored).all()


@pytest.mark.parametrize("cls", SAMPLERS)
def test_plain_buffer_info_and_sample_keys(cls):
    """A plain buffer adds the markers, not the rest of the info (index, weights)."""
    torch.manual_seed(0)
    rb, _ = _buffer(ReplayBuffer, "tensor", cls, None, pad_output=True)
    sample, info = rb.sample(return_info=True)
    markers = {
        "is_init",
        ("next", "truncated"),
        ("next", "done"),
        ("next", "terminated"),
        MASK,
    }
    expected_info = markers | {"index"}
    if "priority_weight" in info:
        expected_info.add("priority_weight")
    assert set(info.keys()) == expected_info
    assert "index" not in sample.keys()
    assert "priority_weight" not in sample.keys()
    # info holds the sampler's tensors, as without the buffer's write
    assert info[MASK].shape == sample.shape


MARKERS = ["is_init", ("next", "truncated"), ("next", "done"), ("next", "terminated")]


def _stored_rows(storage):
    if isinstance(storage, LazyStackStorage):
        return torch.stack(list(storage._storage))
    return storage[:].clone()


@pytest.mark.parametrize("kind", STORAGES)
@pytest.mark.parametrize(
    "cls", [SliceSampler, SliceSamplerWithoutReplacement], ids=lambda c: c.__name__
)
@pytest.mark.parametrize("pad_output", [False, True])
@pytest.mark.parametrize("burn_in", [0, 2])
@pytest.mark.parametrize("buffer_cls", BUFFERS)
def test_buffer_sample_is_the_sampler_index_gathered(
    buffer_cls, burn_in, pad_output, cls, kind, tmp_path
):
    """The buffer completes the markers out of the rows it gathers.

    What a buffer returns equals the sampler's own ``sample()`` (which reads
    the marker columns out of the storage) with its info written into the rows
    at its index, under the same seed; sampling writes nothing into the storage.
    """
    storage = make_storage(kind, tmp_path, CAPACITY)
    sampler = make_sampler(
        cls,
        CAPACITY,
        slice_len=SLICE_LEN,
        strict_length=False,
        pad_output=pad_output,
        burn_in=burn_in,
    )
    rb = buffer_cls(storage=storage, sampler=sampler, batch_size=SLICE_LEN * NUM_SLICES)
    rb.extend(_data(2 if kind == "tensor2d" else 1))
    stored = _stored_rows(storage)
    for seed in range(4):
        # both draws start from the same sampler state (a new epoch)
        sampler._empty()
        torch.manual_seed(seed)
        index, info = sampler.sample(storage, SLICE_LEN * NUM_SLICES)
        # a TensorDictReplayBuffer writes the sample's index over the stored one
        want = storage[index].exclude("index").clone()
        for key in sampler._row_markers(info):
            want.set(key, info[key].reshape(want.shape + info[key].shape[1:]))
        sampler._empty()
        torch.manual_seed(seed)
        sample, sample_info = rb.sample(return_info=True)
        torch.testing.assert_close(
            sample.select(*want.keys(True, True)).to_dict(),
            want.to_dict(),
            rtol=0,
            atol=0,
        )
        for key in MARKERS:
            torch.testing.assert_close(sample_info[key], info[key], rtol=0, atol=0)
    torch.testing.assert_close(
        _stored_rows(storage).to_dict(), stored.to_dict(), rtol=0, atol=0
    )


@pytest.mark.parametrize("buffer_cls", BUFFERS)
def test_lazy_stack_storage_is_not_written(buffer_cls):
    """Writing markers into a sample must not write them into the stored rows."""
    torch.manual_seed(0)
    storage = LazyStackStorage(CAPACITY)
    rb = buffer_cls(
        storage=storage,
        sampler=SliceSampler(slice_len=SLICE_LEN, strict_length=False),
        batch_size=SLICE_LEN * NUM_SLICES,
    )
    data = _data()
    rb.extend(data)
    for _ in range(5):
        sample = rb.sample()
        assert sample["is_init"].reshape(-1)[0]
    stored = torch.stack(list(storage._storage))
    assert (stored["is_init"] == data["is_init"]).all()
    assert (stored["next", "truncated"] == data["next", "truncated"]).all()


@pytest.mark.parametrize("buffer_cls", BUFFERS)
def test_transform_sees_the_markers(buffer_cls):
    seen = []

    def transform(td):
        seen.append(td["is_init"].clone())
        return td

    torch.manual_seed(0)
    rb = buffer_cls(
        storage=LazyTensorStorage(CAPACITY),
        sampler=SliceSampler(slice_len=SLICE_LEN),
        batch_size=SLICE_LEN * NUM_SLICES,
        transform=transform,
    )
    rb.extend(_data())
    sample = rb.sample()
    assert sample["is_init"].view(NUM_SLICES, SLICE_LEN)[:, 0].all()
    if buffer_cls is ReplayBuffer:
        # written before the transform, like the rest of the sampled rows
        assert seen[-1].view(NUM_SLICES, SLICE_LEN)[:, 0].all()


class TestNonTensorDictSamples:
    def test_list_storage_of_ints(self):
        rb = ReplayBuffer(
            storage=ListStorage(10), batch_size=4, collate_fn=lambda rows: rows
        )
        rb.extend(list(range(10)))
        sample, info = rb.sample(return_info=True)
        assert isinstance(sample, list)
        assert all(isinstance(x, int) for x in sample)
        assert set(info) == {"index"}
        assert sample == info["index"].tolist()

    def test_list_storage_of_tensors(self):
        rb = ReplayBuffer(storage=ListStorage(10), batch_size=4)
        rb.extend([torch.tensor(i) for i in range(10)])
        sample, info = rb.sample(return_info=True)
        assert isinstance(sample, torch.Tensor)
        assert (sample == info["index"]).all()

    def test_tensor_storage_of_tensors(self):
        rb = ReplayBuffer(
            storage=LazyTensorStorage(10), sampler=RandomSampler(), batch_size=4
        )
        rb.extend(torch.arange(10))
        sample = rb.sample()
        assert isinstance(sample, torch.Tensor)
        assert sample.shape == (4,)

    def test_slice_sampler_on_tensor_storage_of_tensors(self):
        """A tensor sample gets no markers and keeps its upstream error."""
        rb = ReplayBuffer(
            storage=LazyTensorStorage(10),
            sampler=SliceSampler(slice_len=2, end_key="done"),
            batch_size=4,
        )
        rb.extend(torch.arange(10))
        with pytest.raises(RuntimeError, match="Could not get a tensordict"):
            rb.sample()

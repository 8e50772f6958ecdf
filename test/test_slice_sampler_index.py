# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""The slice samplers' trajectory index: updated from the written rows, equal to the full scan.

A slice sampler finds the trajectories of its storage from an index that it
updates, at each sample, from the rows written since the previous sample. These
tests check that what it returns equals the full scan of the storage (the
algorithm of TorchRL 0.12.0) for any sequence of writes, that it reads the whole
column once only, and that it sees the writes of collector worker processes.
"""
from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from _slice_sampler_cases import make_sampler, make_storage, SAMPLERS
from hypothesis import given, HealthCheck, settings, strategies as st
from tensordict import TensorDict

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    PrioritizedSliceSampler,
    ReplayBuffer,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    TensorDictMaxValueWriter,
    TensorDictReplayBuffer,
)

# the warning of a write the index did not hear of
UNRECORDED = "without going through the replay"
# every write of these tests goes through the buffer: no such warning
heard_writes_only = pytest.mark.filterwarnings(f"error:.*{UNRECORDED}")

KEY_MODES = {
    # the collector's trajectory ids, found by the sampler itself
    "auto": {},
    "episode": {"traj_key": "episode"},
    "end_key": {"end_key": ("next", "done")},
}


class _Writer:
    """Writes steps of several envs into a buffer, trajectory by trajectory.

    Each env continues its own trajectory across calls; a trajectory ends with
    ``("next", "done")`` and the next one gets a new id. With a 2-d storage,
    one call writes the same number of steps for every env (``[envs, steps]``).
    """

    def __init__(self, ndim: int, num_envs: int, keys: str):
        self.ndim = ndim
        self.num_envs = num_envs
        self.keys = keys
        self.next_id = 0
        self.traj = [self._new_id() for _ in range(num_envs)]
        self.step = [0] * num_envs

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def _env_steps(self, env: int, steps: int, ends: list[int]):
        traj, step, done = [], [], []
        for t in range(steps):
            traj.append(self.traj[env])
            step.append(self.step[env])
            end = t in ends
            done.append(end)
            self.step[env] += 1
            if end:
                self.traj[env] = self._new_id()
                self.step[env] = 0
        return torch.tensor(traj), torch.tensor(step), torch.tensor(done)

    def data(self, env: int, steps: int, ends: list[int]) -> TensorDict:
        envs = range(self.num_envs) if self.ndim == 2 else [env]
        columns = [self._env_steps(e, steps, ends) for e in envs]
        traj, step, done = (torch.stack(c) for c in zip(*columns))
        if self.ndim == 1:
            traj, step, done = traj[0], step[0], done[0]
        batch = list(traj.shape)
        entries = {"steps": step, ("next", "done"): done.unsqueeze(-1)}
        if self.keys == "auto":
            entries[("collector", "traj_ids")] = traj
        elif self.keys == "episode":
            entries["episode"] = traj
        return TensorDict(entries, batch)


def _scan(sampler, storage):
    """What the full scan of TorchRL 0.12.0 finds, from a sampler that never indexes."""
    reference = SliceSampler(
        num_slices=1,
        traj_key=sampler.traj_key if sampler._fetch_traj else None,
        end_key=None if sampler._fetch_traj else sampler.end_key,
    )
    reference._indexed_stop_and_length = lambda storage: None
    return reference._get_stop_and_length(storage)


def _assert_same_trajectories(sampler, storage):
    found = sampler._get_stop_and_length(storage)
    assert sampler._traj_index is not None
    for got, expected in zip(found, _scan(sampler, storage)):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


write_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("extend"),
            st.integers(0, 2),  # env
            st.integers(1, 30),  # steps
            st.lists(st.integers(0, 29), max_size=3),  # trajectory ends
        ),
        st.tuples(st.just("check")),
        st.tuples(st.just("empty")),
        st.tuples(st.just("setitem"), st.integers(0, 2**16)),
    ),
    min_size=1,
    max_size=14,
)


@heard_writes_only
@settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    ops=write_ops,
    kind=st.sampled_from(["tensor", "memmap", "lazystack", "tensor2d"]),
    cls=st.sampled_from(SAMPLERS),
    keys=st.sampled_from(sorted(KEY_MODES)),
    capacity=st.integers(4, 48),
    num_envs=st.integers(1, 3),
    strict_length=st.booleans(),
    burn_in=st.sampled_from([0, 2]),
    span=st.sampled_from([False, True, (True, False), (False, True)]),
    pad_output=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_index_equals_full_scan(
    tmp_path,
    ops,
    kind,
    cls,
    keys,
    capacity,
    num_envs,
    strict_length,
    burn_in,
    span,
    pad_output,
    seed,
):
    """Any sequence of writes: same trajectories, and the same sample, as the full scan."""
    ndim = 2 if kind == "tensor2d" else 1
    if ndim == 2:
        num_envs = max(num_envs, 2)
        capacity *= num_envs
    kwargs = {
        "num_slices": 2,
        "strict_length": strict_length,
        "burn_in": burn_in,
        "pad_output": pad_output and not strict_length,
    }
    if cls is not SliceSamplerWithoutReplacement:
        kwargs["span"] = span
    kwargs.update(KEY_MODES[keys])
    # hypothesis runs many examples in one test: one scratch folder each
    scratch = Path(tempfile.mkdtemp(dir=tmp_path))
    storage = make_storage(kind, scratch / "indexed", capacity)
    sampler = make_sampler(cls, capacity, **kwargs)
    rb = ReplayBuffer(storage=storage, sampler=sampler, batch_size=8)
    # the same writes into a buffer whose sampler always scans the storage,
    # and takes the general slicing path where the indexed one has a fast path
    reference = make_sampler(cls, capacity, **kwargs)
    reference._indexed_stop_and_length = lambda storage: None
    reference._plan_slices = False
    rb_reference = ReplayBuffer(
        storage=make_storage(kind, scratch / "scanned", capacity),
        sampler=reference,
        batch_size=8,
    )
    writer = _Writer(ndim, num_envs, keys)
    for op in ops + [("check",)]:
        if op[0] == "extend":
            _, env, steps, ends = op
            data = writer.data(env % num_envs, steps, ends)
            rb.extend(data)
            rb_reference.extend(data)
        elif op[0] == "empty":
            rb.empty()
            rb_reference.empty()
        elif op[0] == "setitem" and len(rb) and ndim == 1 and kind != "lazystack":
            row = op[1] % len(rb)
            rb[row] = rb_reference[(row + 1) % len(rb)]
            rb_reference[row] = rb_reference[(row + 1) % len(rb)]
        elif op[0] == "check" and len(rb):
            try:
                found = sampler._get_stop_and_length(storage)
            except (RuntimeError, IndexError) as err:
                # a layout the full scan rejects: the index steps aside
                with pytest.raises(type(err)):
                    _scan(sampler, storage)
                continue
            for got, want in zip(found, _scan(sampler, storage)):
                torch.testing.assert_close(got, want, rtol=0, atol=0)
            if cls is PrioritizedSliceSampler:
                # its sum tree draws from a generator of its own
                continue
            torch.manual_seed(seed)
            try:
                got = rb.sample()
            except (RuntimeError, AttributeError) as err:
                # e.g. no trajectory long enough: the reference raises the same
                torch.manual_seed(seed)
                with pytest.raises(type(err)):
                    rb_reference.sample()
                continue
            torch.manual_seed(seed)
            want = rb_reference.sample()
            torch.testing.assert_close(got.to_dict(), want.to_dict(), rtol=0, atol=0)


def _extend_steps(rb, writer, steps, ends=(), env=0):
    rb.extend(writer.data(env, steps, list(ends)))


PLAN_CASES = [
    ("tensor", {}, True),
    ("memmap", {}, True),
    # every trajectory holds a slice
    ("tensor", {"strict_length": False}, True),
    ("tensor", {"burn_in": 2}, True),
    ("tensor", {"strict_length": False, "pad_output": True}, True),
    ("tensor", {"burn_in": 2, "strict_length": False, "pad_output": True}, True),
    ("tensor", {"span": True}, False),
    ("tensor2d", {}, False),
    # the compiled _get_index is taken
    ("tensor", {"compile": {"backend": "eager"}}, False),
]


@pytest.mark.parametrize(
    "cls,kind,kwargs,planned",
    [
        (cls, *case)
        for cls in (SliceSampler, SliceSamplerWithoutReplacement)
        for case in PLAN_CASES
        # SliceSamplerWithoutReplacement takes no span
        if cls is SliceSampler or "span" not in case[1]
    ],
)
def test_planned_path_for_the_common_case(
    tmp_path, monkeypatch, cls, kind, kwargs, planned
):
    """Slices of one length in a 1-d storage skip _get_index; other layouts take it."""
    general = []
    get_index = SliceSampler._get_index
    monkeypatch.setattr(
        SliceSampler,
        "_get_index",
        lambda self, *args, **kw: general.append(1) or get_index(self, *args, **kw),
    )
    ndim = 2 if kind == "tensor2d" else 1
    capacity = 100 * ndim
    sampler = cls(num_slices=2, **kwargs)
    rb = ReplayBuffer(
        storage=make_storage(kind, tmp_path, capacity), sampler=sampler, batch_size=8
    )
    writer = _Writer(ndim, 2, "auto")
    # 16-step trajectories, wrapping around the storage end
    for i in range(12):
        _extend_steps(rb, writer, 16, ends=[15], env=i % 2)
        rb.sample()
    assert bool(general) is not planned


@pytest.mark.parametrize("cls", [SliceSampler, SliceSamplerWithoutReplacement])
def test_compiled_sampler_as_the_buffer_fills(cls):
    """compile=True samples what eager sampling does while the trajectories (and slices) change in number."""
    # a fresh compile cache, so that the sizes below are the first ones seen
    torch._dynamo.reset()
    rbs = [
        ReplayBuffer(
            storage=LazyTensorStorage(100),
            sampler=cls(num_slices=2, traj_key="episode", **kwargs),
            batch_size=8,
        )
        for kwargs in ({}, {"compile": {"backend": "eager"}})
    ]
    writer = _Writer(1, 1, "episode")
    # write i ends a trajectory at its step 3 + i: the trajectories change in
    # number and length; SliceSamplerWithoutReplacement draws as many slices
    # as are left (fewer than 2 at the end of an epoch)
    for i in range(12):
        data = writer.data(0, 16, [3 + i])
        index = []
        for rb in rbs:
            rb.extend(data)
            torch.manual_seed(i)
            index.append(rb.sample(return_info=True)[1]["index"])
        torch.testing.assert_close(index[1], index[0], rtol=0, atol=0)


@heard_writes_only
@pytest.mark.parametrize("cls", SAMPLERS)
@pytest.mark.parametrize("kind", ["tensor", "memmap", "tensor2d"])
@pytest.mark.parametrize("keys", sorted(KEY_MODES))
class TestIncremental:
    def test_reads_the_column_once(self, tmp_path, cls, kind, keys):
        """Samples after writes update the index from the written rows only."""
        ndim = 2 if kind == "tensor2d" else 1
        capacity = 200 * (2 if ndim == 2 else 1)
        storage = make_storage(kind, tmp_path, capacity)
        sampler = make_sampler(
            cls, capacity, num_slices=2, strict_length=False, **KEY_MODES[keys]
        )
        rb = ReplayBuffer(storage=storage, sampler=sampler, batch_size=8)
        writer = _Writer(ndim, 2, keys)
        for i in range(10):
            _extend_steps(rb, writer, 23, ends=[i % 23, (5 * i) % 23], env=i % 2)
        rb.sample()
        builds = sampler._traj_index.builds
        # wraps around the full storage three times, in writes of 23 steps
        for i in range(30):
            _extend_steps(rb, writer, 23, ends=[i % 23, (5 * i) % 23], env=i % 2)
            rb.sample()
            _assert_same_trajectories(sampler, storage)
        assert sampler._traj_index.builds == builds

    def test_empty_and_refill(self, tmp_path, cls, kind, keys):
        ndim = 2 if kind == "tensor2d" else 1
        capacity = 60 * (2 if ndim == 2 else 1)
        storage = make_storage(kind, tmp_path, capacity)
        sampler = make_sampler(cls, capacity, num_slices=2, **KEY_MODES[keys])
        rb = ReplayBuffer(storage=storage, sampler=sampler, batch_size=4)
        writer = _Writer(ndim, 2, keys)
        _extend_steps(rb, writer, 40, ends=[9, 30])
        rb.sample()
        rb.empty()
        _extend_steps(rb, writer, 40, ends=[3, 17])
        rb.sample()
        _assert_same_trajectories(sampler, storage)


@heard_writes_only
@pytest.mark.parametrize("cls", SAMPLERS)
class TestPersistence:
    def _buffer(self, tmp_path, cls, name):
        storage = make_storage("memmap", tmp_path / name, 100)
        sampler = make_sampler(cls, 100, num_slices=2)
        return ReplayBuffer(storage=storage, sampler=sampler, batch_size=4)

    def _saved_and_other(self, tmp_path, cls, writer):
        """A buffer written past its capacity, and another one already sampled."""
        saved = self._buffer(tmp_path, cls, "saved")
        for i in range(6):
            _extend_steps(saved, writer, 30, ends=[7 + i, 21])
        saved.sample()
        other = self._buffer(tmp_path, cls, "other")
        _extend_steps(other, _Writer(1, 1, "auto"), 50, ends=[3])
        other.sample()
        return saved, other

    def test_state_dict(self, tmp_path, cls):
        writer = _Writer(1, 1, "auto")
        saved, restored = self._saved_and_other(tmp_path, cls, writer)
        restored.load_state_dict(saved.state_dict())
        restored.sample()
        _assert_same_trajectories(restored._sampler, restored._storage)
        # writing goes on from the loaded state
        _extend_steps(restored, writer, 30, ends=[11])
        restored.sample()
        _assert_same_trajectories(restored._sampler, restored._storage)

    def test_dumps_loads(self, tmp_path, cls):
        writer = _Writer(1, 1, "auto")
        saved, restored = self._saved_and_other(tmp_path, cls, writer)
        saved.dumps(tmp_path / "dump")
        restored.loads(tmp_path / "dump")
        restored.sample()
        _assert_same_trajectories(restored._sampler, restored._storage)


class TestWritesOutsideTheBuffer:
    def test_direct_storage_writes_rebuild_and_warn_once(self):
        storage = LazyTensorStorage(50)
        sampler = SliceSampler(num_slices=2)
        rb = ReplayBuffer(storage=storage, sampler=sampler, batch_size=4)
        writer = _Writer(1, 1, "auto")
        for _ in range(3):
            _extend_steps(rb, writer, 20, ends=[4, 12])
        rb.sample()
        data = writer.data(0, 10, [2, 5])
        storage.set(torch.arange(10), data)
        with pytest.warns(
            UserWarning, match="without going through the replay"
        ) as record:
            rb.sample()
        assert record[0].filename == __file__
        _assert_same_trajectories(sampler, storage)
        storage.set(torch.arange(10, 20), writer.data(0, 10, [6]))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            rb.sample()
        _assert_same_trajectories(sampler, storage)

    def test_direct_writes_into_inference_tensors(self):
        """Tensors made under inference mode have no version counter: the cursor tells."""
        storage = LazyTensorStorage(50)
        sampler = SliceSampler(num_slices=2)
        rb = ReplayBuffer(storage=storage, sampler=sampler, batch_size=4)
        writer = _Writer(1, 1, "auto")
        with torch.inference_mode():
            _extend_steps(rb, writer, 30, ends=[4, 12])
            rb.sample()
            storage.set(torch.arange(10), writer.data(0, 10, [2, 5]))
            with pytest.warns(UserWarning, match=UNRECORDED):
                rb.sample()
            _assert_same_trajectories(sampler, storage)

    def test_more_writes_than_the_journal_holds(self):
        """More writes between two samples than the journal keeps: a rebuild."""
        from torchrl.data.replay_buffers._traj_index import JOURNAL_SLOTS

        storage = LazyTensorStorage(JOURNAL_SLOTS * 4)
        sampler = SliceSampler(num_slices=2)
        rb = ReplayBuffer(storage=storage, sampler=sampler, batch_size=4)
        writer = _Writer(1, 1, "auto")
        _extend_steps(rb, writer, 50, ends=[10, 30])
        rb.sample()
        for i in range(JOURNAL_SLOTS + 10):
            rb.add(writer.data(0, 1, [0] if i % 7 == 0 else [])[0])
        rb.sample()
        _assert_same_trajectories(sampler, storage)

    def test_sampler_without_buffer(self):
        """A sampler used on its own (no buffer tells it of writes) stays exact."""
        storage = LazyTensorStorage(40)
        sampler = SliceSampler(num_slices=2, end_key=("next", "done"))
        writer = _Writer(1, 1, "end_key")
        storage.set(torch.arange(30), writer.data(0, 30, [9, 19]))
        sampler.sample(storage, 4)
        storage.set(torch.arange(30, 40), writer.data(0, 10, [3]))
        storage.set(torch.arange(0, 10), writer.data(0, 10, [7]))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            sampler.sample(storage, 4)
        _assert_same_trajectories(sampler, storage)


# every path that writes the storage, on these storages ([rows] or [rows, envs])
WRITE_STORAGES = ["tensor", "memmap", "tensor2d", "memmap2d"]
# the column each key mode reads, and a value that changes its trajectories
COLUMNS = {
    "auto": (("collector", "traj_ids"), lambda n: torch.arange(n) + 1000),
    "end_key": (("next", "done"), lambda n: torch.ones(n, 1, dtype=torch.bool)),
}


def _write_storage(kind, tmp_path, capacity):
    if kind == "memmap2d":
        return LazyMemmapStorage(capacity, ndim=2, scratch_dir=tmp_path)
    return make_storage(kind, tmp_path, capacity)


def _sampled_buffer(
    kind, tmp_path, keys="auto", cls=SliceSampler, buffer_cls=ReplayBuffer, **kwargs
):
    """A buffer holding 40 steps of 2 envs, sampled once (the index is built), and its writer."""
    ndim = 2 if kind.endswith("2d") else 1
    capacity = 60 * ndim
    sampler = make_sampler(
        cls, capacity, num_slices=2, strict_length=False, **KEY_MODES[keys]
    )
    rb = buffer_cls(
        storage=_write_storage(kind, tmp_path, capacity),
        sampler=sampler,
        batch_size=8,
        **kwargs,
    )
    writer = _Writer(ndim, 2, keys)
    for env in range(3 - ndim):
        _extend_steps(rb, writer, 20 * ndim, ends=[9, 16], env=env)
    rb.sample()
    return rb, writer


def _new(data):
    """``data`` with trajectory ids that no stored row has."""
    if ("collector", "traj_ids") in data.keys(True):
        data["collector", "traj_ids"] += 10_000
    return data


def _sample_after_a_heard_write(rb, builds=None):
    """The buffer samples what the full scan finds, with no warning; ``builds``: no full read."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=f".*{UNRECORDED}")
        rb.sample()
    _assert_same_trajectories(rb.sampler, rb.storage)
    if builds is not None:
        assert rb.sampler._traj_index.builds == builds


def _setitem_1d(rb, writer, how, keys):
    key, value = COLUMNS[keys]
    rows = [5, 6, 30, 31]
    if how == "int":
        rb[12] = _new(writer.data(0, 1, [0]))[0]
    elif how == "tensor":
        rb[torch.arange(5, 11)] = _new(writer.data(0, 6, [2]))
    elif how == "2d_tensor":
        # every element of the index is a row: rows 5 to 10
        rb[torch.tensor([[5, 6, 7], [8, 9, 10]])] = _new(
            writer.data(0, 6, [2])
        ).reshape(2, 3)
    elif how == "set_at_mask":
        mask = torch.zeros(len(rb), dtype=torch.bool)
        mask[rows] = True
        rb.set_at_(key, value(4), mask)
    elif how == "slice":
        rb[5:11] = _new(writer.data(0, 6, [2]))
    elif how == "list":
        rb[rows] = _new(writer.data(0, 4, [1]))
    elif how == "numpy":
        rb[np.array(rows)] = _new(writer.data(0, 4, [1]))
    elif how == "set_at_":
        rb.set_at_(key, value(4), torch.tensor(rows))
    elif how == "set_":
        column = rb[:][key].clone()
        column[rows] = value(4)
        rb.set_(key, column)
    else:
        raise ValueError(how)


def _setitem_2d(rb, writer, how, keys):
    # rb[:] is [envs, rows]: rb[env, row]
    key, value = COLUMNS[keys]
    if how == "pair":
        rb[1, 12] = _new(writer.data(0, 1, [0]))[1, 0]
    elif how == "tensors":
        rb[torch.tensor([0, 1]), torch.tensor([7, 25])] = _new(writer.data(0, 1, [0]))[
            :, 0
        ]
    elif how == "env_and_slice":
        rb[0, 5:11] = _new(writer.data(0, 6, [2]))[0]
    elif how == "env":
        # every row (of the storage's capacity) of env 1
        rb[[1]] = _new(writer.data(0, 60, [5, 33]))[:1]
    elif how == "set_at_":
        # an index of the storage itself: [rows, envs]
        rb.set_at_(key, value(2), (torch.tensor([7, 8]), torch.tensor([1, 1])))
    else:
        raise ValueError(how)


# (how, whether the written rows are read rather than the whole column)
SETITEM_1D = [
    ("int", True),
    ("tensor", True),
    ("2d_tensor", True),
    ("slice", True),
    ("list", True),
    ("numpy", True),
    ("set_at_", True),
    ("set_at_mask", True),
    # every row
    ("set_", False),
]
SETITEM_2D = [
    ("pair", True),
    ("tensors", True),
    ("env_and_slice", True),
    ("env", False),
    ("set_at_", True),
]


@pytest.mark.parametrize("keys", sorted(COLUMNS))
class TestEveryBufferWrite:
    """Every way a buffer writes its storage reaches the index (no warning, exact)."""

    @pytest.mark.parametrize("kind", ["tensor", "memmap"])
    @pytest.mark.parametrize("how,incremental", SETITEM_1D)
    def test_setitem_1d(self, tmp_path, kind, keys, how, incremental):
        rb, writer = _sampled_buffer(kind, tmp_path, keys)
        builds = rb.sampler._traj_index.builds
        _setitem_1d(rb, writer, how, keys)
        _sample_after_a_heard_write(rb, builds if incremental else None)

    @pytest.mark.parametrize("kind", ["tensor2d", "memmap2d"])
    @pytest.mark.parametrize("how,incremental", SETITEM_2D)
    def test_setitem_2d(self, tmp_path, kind, keys, how, incremental):
        rb, writer = _sampled_buffer(kind, tmp_path, keys)
        builds = rb.sampler._traj_index.builds
        _setitem_2d(rb, writer, how, keys)
        _sample_after_a_heard_write(rb, builds if incremental else None)

    @pytest.mark.parametrize("cls", SAMPLERS)
    @pytest.mark.parametrize("kind", WRITE_STORAGES)
    @pytest.mark.parametrize("buffer_cls", [ReplayBuffer, TensorDictReplayBuffer])
    def test_add_and_extend(self, tmp_path, kind, keys, cls, buffer_cls):
        """RoundRobinWriter and TensorDictRoundRobinWriter, between samples."""
        rb, writer = _sampled_buffer(
            kind, tmp_path, keys, cls=cls, buffer_cls=buffer_cls
        )
        builds = rb.sampler._traj_index.builds
        rb.extend(writer.data(0, 7, [3]))
        _sample_after_a_heard_write(rb, builds)
        if buffer_cls is TensorDictReplayBuffer and kind.endswith("2d"):
            # its add() of one step of every env fails in TorchRL 0.12.0 too
            return
        with warnings.catch_warnings():
            # add() of one step of every env, into a 2-d storage
            warnings.filterwarnings("ignore", message="Using `add\\(\\)`")
            rb.add(writer.data(0, 1, [0])[..., 0])
            _sample_after_a_heard_write(rb, builds)
            rb.extend(writer.data(0, 3, [1]))
            rb.add(writer.data(0, 1, [])[..., 0])
            _sample_after_a_heard_write(rb, builds)


def _ranked(data, ranks):
    data.set("rank", torch.as_tensor(ranks, dtype=torch.float))
    return data


@pytest.mark.parametrize("keys", sorted(COLUMNS))
@pytest.mark.parametrize("kind", ["tensor", "memmap"])
class TestMaxValueWriter:
    """TensorDictMaxValueWriter writes where it ranks an item, or nowhere."""

    def _buffer(self, tmp_path, kind, keys):
        rb = TensorDictReplayBuffer(
            storage=_write_storage(kind, tmp_path, 30),
            sampler=SliceSampler(num_slices=2, strict_length=False, **KEY_MODES[keys]),
            writer=TensorDictMaxValueWriter(rank_key="rank"),
            batch_size=8,
        )
        writer = _Writer(1, 1, keys)
        rb.extend(_ranked(writer.data(0, 30, [9, 16]), torch.arange(30.0)))
        rb.sample()
        return rb, writer

    def test_add(self, tmp_path, kind, keys):
        rb, writer = self._buffer(tmp_path, kind, keys)
        builds = rb.sampler._traj_index.builds
        # ranked below every stored item: not written
        assert rb.add(_ranked(writer.data(0, 1, [0])[0], -1.0)) is None
        _sample_after_a_heard_write(rb, builds)
        # replaces the lowest-ranked item
        rb.add(_ranked(writer.data(0, 1, [0])[0], 100.0))
        _sample_after_a_heard_write(rb, builds)

    def test_extend_writes_some(self, tmp_path, kind, keys):
        rb, writer = self._buffer(tmp_path, kind, keys)
        builds = rb.sampler._traj_index.builds
        rb.extend(_ranked(writer.data(0, 6, [2]), [-5.0, 50.0, -4.0, 51.0, 52.0, -1.0]))
        _sample_after_a_heard_write(rb, builds)
        rb.extend(_ranked(writer.data(0, 3, [1]), [-3.0, -2.0, -1.0]))
        _sample_after_a_heard_write(rb, builds)


@pytest.mark.parametrize("kind", WRITE_STORAGES)
class TestWritesAroundTheBuffer:
    """A write the buffer does not hear of is found from the column's version counter."""

    def _expect_rebuild(self, rb):
        with pytest.warns(UserWarning, match=UNRECORDED):
            rb.sample()
        _assert_same_trajectories(rb.sampler, rb.storage)

    def test_direct_storage_set_then_a_buffer_write(self, tmp_path, kind):
        rb, writer = _sampled_buffer(kind, tmp_path)
        data = writer.data(0, 6, [2])
        # rows 3 to 8 of the storage (of every env, in a 2-d storage)
        rb.storage.set(
            torch.arange(3, 9),
            data.transpose(0, -1) if data.ndim == 2 else data,
            set_cursor=False,
        )
        # the buffer's own write that follows does not hide it
        _extend_steps(rb, writer, 3, ends=[1])
        self._expect_rebuild(rb)
        # and the buffer's writes are incremental again
        builds = rb.sampler._traj_index.builds
        _extend_steps(rb, writer, 3, ends=[1])
        _sample_after_a_heard_write(rb, builds)

    def test_storage_setitem(self, tmp_path, kind):
        rb, writer = _sampled_buffer(kind, tmp_path)
        data = writer.data(0, 6, [2])
        rb.storage[torch.arange(3, 9)] = (
            data.transpose(0, -1) if data.ndim == 2 else data
        )
        self._expect_rebuild(rb)

    def test_in_place_write_into_the_buffer_view(self, tmp_path, kind):
        rb, writer = _sampled_buffer(kind, tmp_path)
        column = rb[:].get(("collector", "traj_ids"))
        column[..., 4] = 777
        self._expect_rebuild(rb)

    def test_another_buffer_sharing_the_storage(self, tmp_path, kind):
        rb, writer = _sampled_buffer(kind, tmp_path)
        other = ReplayBuffer(
            storage=rb.storage, sampler=SliceSampler(num_slices=2), batch_size=8
        )
        # both write, each hears of its own writes only
        other.extend(writer.data(0, 5, [1]))
        _extend_steps(rb, writer, 3, ends=[0])
        self._expect_rebuild(rb)


def _make_env():
    from torchrl.envs import GymEnv

    return GymEnv("CartPole-v1")


@pytest.mark.parametrize("mode", ["sync", "async"])
# (a PrioritizedSliceSampler cannot be shared between processes)
@pytest.mark.parametrize("cls", [SliceSampler, SliceSamplerWithoutReplacement])
def test_multi_collector_workers_write_into_the_index(mode, cls):
    """Two worker processes extend the buffer; the main process's index sees every write."""
    from torchrl.collectors import MultiAsyncCollector, MultiSyncCollector

    capacity = 600
    sampler = make_sampler(cls, capacity, num_slices=4)
    rb = ReplayBuffer(
        storage=LazyTensorStorage(capacity), sampler=sampler, batch_size=16
    )
    collector_cls = MultiSyncCollector if mode == "sync" else MultiAsyncCollector
    collector = collector_cls(
        [_make_env, _make_env],
        policy=None,
        frames_per_batch=100,
        total_frames=1600,
        replay_buffer=rb,
        set_truncated=True,
    )
    try:
        with warnings.catch_warnings():
            # nothing is written behind the index's back
            warnings.filterwarnings("error", message=".*without going through")
            for _ in collector:
                if len(rb) >= 32:
                    rb.sample()
                    # the workers go on writing: compare under the buffer's lock
                    with rb._write_lock:
                        _assert_same_trajectories(sampler, rb._storage)
    finally:
        collector.shutdown()
    assert rb.write_count >= 1600
    rb.sample()
    _assert_same_trajectories(sampler, rb._storage)

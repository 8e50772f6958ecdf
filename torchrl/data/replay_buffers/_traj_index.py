# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""An incremental index of the trajectories in a storage, for the slice samplers.

Without it, every :meth:`~torchrl.data.SliceSampler.sample` reads the whole
trajectory-id (or done) column of the storage and scans it to find where the
trajectories start and stop: the cost grows with the buffer, not the batch.

:class:`WriteJournal` records which rows of the storage were written, as
ranges along its first dimension, in memory that every process holding a copy
of the sampler shares (a worker of a :class:`~torchrl.collectors.MultiCollector`
writing into the buffer records there too). It also tells the writes it hears
of from the others: the version counter of the column tensor (which every
in-place write of it moves, whatever path it takes) must not have moved since
the last write the journal heard of in this process, or the index is rebuilt.
:class:`TrajectoryIndex` keeps the
per-row end-of-trajectory flags and the sorted list of trajectory stops, and
updates them at a sample from the rows written since the previous one: the
column is read at those rows (and their neighbours) only. It returns exactly
what the full scan of :class:`~torchrl.data.SliceSampler` returns, and gives
up (the sampler then scans, as before) whenever it cannot vouch for that.
"""
from __future__ import annotations

import ctypes
import multiprocessing as mp
import warnings
import weakref
from multiprocessing.context import get_spawning_popen
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from tensordict.utils import NestedKey

from torchrl._user_stacklevel import _user_stacklevel
from torchrl.data.replay_buffers import _slice_utils
from torchrl.data.replay_buffers.storages import ListStorage, TensorStorage

# Ranges the journal holds; a reader that falls further behind rebuilds.
JOURNAL_SLOTS = 4096
# A write that touches more separate ranges is recorded as "rebuild".
_MAX_RUNS = 16


def _first_dim_rows(index: Any) -> torch.Tensor | None:
    """The first-dimension rows that ``storage[index] = value`` writes, as a 1-d tensor.

    ``index`` indexes the first dimension of the storage (the first element
    of a tuple index of the storage, see :func:`_written_runs`): every
    element of an integer tensor is a row; a boolean mask writes the rows of
    its set elements. Returns ``None`` for what cannot be read as rows here
    (a negative row, an ellipsis, a new axis): the reader then rebuilds.
    """
    if (
        index is None
        or index is Ellipsis
        or isinstance(index, (bool, np.bool_, tuple, slice))
    ):
        return None
    if isinstance(index, range):
        index = torch.arange(index.start, index.stop, index.step)
    try:
        rows = torch.as_tensor(index)
    except (TypeError, ValueError, RuntimeError):
        return None
    if rows.dtype == torch.bool:
        return rows.nonzero()[:, 0] if rows.ndim else None
    if rows.is_floating_point() or rows.is_complex():
        return None
    rows = rows.reshape(-1)
    if rows.numel() and int(rows.min()) < 0:
        return None
    return rows


def _writer_rows(index: Any, ndim: int | None) -> torch.Tensor | None:
    """The first-dimension rows written, from the index a writer's ``add``/``extend`` returns.

    A writer returns ``None`` for an item it did not write
    (:class:`~torchrl.data.TensorDictMaxValueWriter`), ``-1`` for the
    elements of a batch it did not write, and, for a storage of ``ndim > 1``
    dimensions, one ``[ndim]`` line per written element. ``ndim=None`` (the
    storage is not known) cannot tell such lines from a 2-d index of rows.
    """
    if index is None:
        return torch.zeros(0, dtype=torch.long)
    if isinstance(index, (bool, np.bool_)):
        return None
    try:
        rows = torch.as_tensor(index)
    except (TypeError, ValueError, RuntimeError):
        return None
    if rows.dtype == torch.bool or rows.is_floating_point() or rows.is_complex():
        return None
    if rows.ndim > 1 and ndim != 1:
        if ndim is None or rows.shape[-1] != ndim:
            return None
        rows = rows[..., 0]
    rows = rows.reshape(-1)
    return rows[rows >= 0]


def _written_runs(
    index: Any, *, from_writer: bool = False, ndim: int | None = None
) -> list[tuple[int, int]] | None:
    """The ranges ``[start, stop)`` of first-dimension rows that ``index`` covers.

    ``index`` is an index of the storage itself, not of the buffer's
    transposed view (``from_writer=False``: in a tuple, its first element
    indexes the first dimension, see :func:`_first_dim_rows`), or what a
    writer returned (``from_writer=True``, see :func:`_writer_rows`).
    Returns ``None`` when the index cannot be read as rows, or is too
    scattered to be worth recording range by range: the reader then
    rebuilds. A range may run past the end of the storage.
    """
    if isinstance(index, tuple) and not from_writer:
        if not index:
            return None
        index = index[0]
    if isinstance(index, slice) and not from_writer:
        if index.step is not None and index.step < 1:
            return None
        start = 0 if index.start is None else index.start
        stop = 2**62 if index.stop is None else index.stop
        if start < 0 or stop < 0:
            return None
        return [(int(start), int(stop))]
    if from_writer:
        rows = _writer_rows(index, ndim)
    else:
        rows = _first_dim_rows(index)
    if rows is None:
        return None
    if not rows.numel():
        return []
    lo, hi = (int(v) for v in rows.aminmax())
    if hi - lo < 2 * rows.numel():
        # contiguous or nearly so (the common case: a round-robin write)
        return [(lo, hi + 1)]
    rows = torch.unique(rows)
    breaks = (rows[1:] - rows[:-1] > 1).nonzero().squeeze(-1)
    if breaks.numel() >= _MAX_RUNS:
        return None
    starts = torch.cat([rows[:1], rows[breaks + 1]]).tolist()
    stops = torch.cat([rows[breaks] + 1, rows[-1:] + 1]).tolist()
    return list(zip(starts, stops))


def _one_dim_index(item: Any) -> bool:
    """Whether ``item``, an element of a tuple index, indexes exactly one dimension."""
    if isinstance(item, (bool, np.bool_)) or item is None or item is Ellipsis:
        return False
    if isinstance(item, (int, np.integer, slice, range)):
        return True
    if isinstance(item, (torch.Tensor, np.ndarray, list)):
        try:
            item = torch.as_tensor(item)
        except (TypeError, ValueError, RuntimeError):
            return False
        return item.dtype != torch.bool or item.ndim == 1
    return False


def storage_index(index: tuple, dim_extend: int) -> Any:
    """The storage index of the first dimension that an index of ``rb[:]`` writes.

    A buffer's ``rb[:]`` is its storage with dimension ``dim_extend`` moved
    first (:meth:`~torchrl.data.ReplayBuffer.__getitem__`): the storage's
    first dimension is the ``dim_extend``-th one of the buffer's index.
    Returns ``slice(None)`` (every row) when that cannot be told.
    """
    if not dim_extend:
        return index
    if len(index) <= dim_extend or not all(
        _one_dim_index(item) for item in index[:dim_extend]
    ):
        return slice(None)
    return index[dim_extend]


def column_version(storage, key: NestedKey | None) -> tuple[Any, int] | None:
    """The column tensor that the index reads and its version counter.

    Every in-place write of a tensor (``storage.set``, ``rb[:][i, j] = v``, a
    write into one of its views) moves its ``_version``. Returns ``None``
    where that cannot be relied on: no tensor storage, a column that a
    ``get`` rebuilds (lazy stacks), inference tensors (no version counter).
    """
    if key is None or not isinstance(storage, TensorStorage):
        return None
    if not storage.initialized or not isinstance(storage._storage, TensorDict):
        return None
    column = storage._storage.get(key, None)
    if not isinstance(column, torch.Tensor):
        return None
    try:
        version = column._version
    except RuntimeError:
        # an inference tensor
        return None
    return weakref.ref(column), version


def _same_version(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return a[1] == b[1] and a[0]() is b[0]() is not None


class WriteJournal:
    """The rows written to a storage, as ranges along its first dimension.

    The ranges live in a ring of :data:`JOURNAL_SLOTS` slots of shared memory
    (``multiprocessing.RawArray``), so the copies of a sampler sent to other
    processes (``spawn`` pickles it by handle, ``fork`` inherits it) record
    into the same journal. Writers are serialized by the replay buffer's write
    lock (:meth:`~torchrl.data.ReplayBuffer.share`). Pickled outside of
    process spawning (a copy, a checkpoint), a journal starts anew.

    Each process also keeps, for itself, the version of the column tensor
    (:func:`column_version`) after the last write it recorded or the last
    sample it served: a buffer calls :meth:`begin_write` before each write it
    records, and a version that moved in between means that something else
    wrote the column (a direct ``Storage.set``, an in-place write into
    ``rb[:]`` or into the storage's tensors, another buffer sharing the
    storage). Every reader then rebuilds. A version counter is local to a
    process: the writes of other processes are known from the shared journal
    only.
    """

    # per process, never pickled: the column read and its version expected
    # now (None: unknown), whether an unrecorded write was found, and the
    # write under way
    _expected = None
    _unrecorded = False
    _writing = None

    def __init__(self, slots: int = JOURNAL_SLOTS):
        self.slots = slots
        # [0]: ranges recorded so far, [1]: resets, then (start, stop) pairs
        self._array = mp.RawArray(ctypes.c_int64, 2 + 2 * slots)

    def begin_write(self, storage, key: NestedKey | None) -> None:
        """Called by the buffer before a write that it records.

        Checks that the column was not written since this process last heard
        of it, and remembers ``storage`` to read the rows that its writer
        returns (:func:`_writer_rows`) and the version after the write.
        """
        if self._moved(column_version(storage, key), key):
            self.reset()
            self._unrecorded = True
        self._writing = (weakref.ref(storage), key)

    def record(self, index: Any, *, from_writer: bool = False) -> None:
        """Records the rows that ``index`` wrote (see :func:`_written_runs`)."""
        writing, self._writing = self._writing, None
        storage = writing[0]() if writing is not None else None
        ndim = getattr(storage, "ndim", None) if storage is not None else None
        runs = _written_runs(index, from_writer=from_writer, ndim=ndim)
        array = self._array
        if runs is None:
            array[1] += 1
        else:
            count = array[0]
            for start, stop in runs:
                slot = 2 + 2 * (count % self.slots)
                array[slot] = start
                array[slot + 1] = stop
                count += 1
            array[0] = count
        # a write the buffer did not announce (a sampler used on its own)
        # leaves the version unknown
        self._expected = (
            (writing[1], column_version(storage, writing[1]))
            if storage is not None
            else None
        )

    def _moved(self, version: tuple[Any, int] | None, key: NestedKey | None) -> bool:
        # A column other than the one last seen (the sampler resolved its
        # trajectory key at its first sample, after the first writes) tells
        # nothing: only the same column's version can show a write
        expected = self._expected
        return (
            expected is not None
            and expected[0] == key
            and not _same_version(version, expected[1])
        )

    def written_unrecorded(
        self, version: tuple[Any, int] | None, key: NestedKey | None
    ) -> bool:
        """Whether this process wrote column ``key`` unrecorded since its last record or check.

        ``version`` is the column's version now; it is what the next check
        expects, unless a recorded write moves it.
        """
        found, self._unrecorded = self._unrecorded, False
        moved = self._moved(version, key)
        self._expected = (key, version)
        return found or moved

    def reset(self) -> None:
        """Tells every reader to rebuild (the storage was emptied or replaced)."""
        self._array[1] += 1
        self._expected = None

    def state(self) -> tuple[int, int]:
        array = self._array
        return array[0], array[1]

    def ranges(self, begin: int, end: int) -> torch.Tensor:
        """The ranges recorded from the ``begin``-th to the ``end``-th, as ``[n, 2]``."""
        view = self.__dict__.get("_view")
        if view is None:
            view = self._view = torch.frombuffer(self._array, dtype=torch.int64)
        slots = torch.arange(begin, end) % self.slots
        return view[2:].view(-1, 2)[slots]

    def __getstate__(self):
        if get_spawning_popen() is None:
            return {"slots": self.slots}
        return {"slots": self.slots, "_array": self._array}

    def __setstate__(self, state):
        self.__dict__.update(state)
        if "_array" not in state:
            self._array = mp.RawArray(ctypes.c_int64, 2 + 2 * self.slots)


def _merge_sorted(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Merges two sorted, disjoint 1-d tensors into one sorted tensor."""
    if not b.numel():
        return a
    if not a.numel():
        return b
    pos = torch.searchsorted(a, b) + torch.arange(b.numel(), device=b.device)
    out = torch.empty(a.numel() + b.numel(), dtype=a.dtype, device=a.device)
    from_a = torch.ones(out.numel(), dtype=torch.bool, device=a.device)
    from_a[pos] = False
    out[pos] = b
    out[from_a] = a
    return out


def _insert_missing(keys: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """Adds the (sorted) ``new`` keys that ``keys`` (sorted) does not hold."""
    if keys.numel():
        pos = torch.searchsorted(keys, new).clamp_max(keys.numel() - 1)
        new = new[keys[pos] != new]
    return _merge_sorted(keys, new)


def _cursor_row(cursor: Any) -> int | None:
    """The last written row, read from the storage's cursor like the full scan."""
    if isinstance(cursor, torch.Tensor):
        return int(cursor[-1]) if cursor.numel() else None
    if isinstance(cursor, range):
        return cursor[-1] if len(cursor) else None
    if isinstance(cursor, int):
        return cursor
    return None


class TrajectoryIndex:
    """Trajectory stops of one storage, updated from a :class:`WriteJournal`.

    Keeps, for the rows ``[0, len)`` along the first dimension, whether each
    row ends a trajectory on its own data (its trajectory id differs from the
    next row's, or its done flag is set), and the sorted list of those rows
    (for a storage of more than one dimension, sorted the way the full scan
    lists them: by the other dimensions first, then time). The ends that the
    full scan forces (the last written row, the last row of a column without
    any end) are added when the start/stop tensors are derived.
    """

    def __init__(self):
        self._storage = None
        self._warned = False
        # full reads of the column so far (one, unless the index was reset)
        self.builds = 0
        # the last write cursor seen, and the last row it wrote
        self._row_of = (None, None)

    def stop_and_length(
        self,
        sampler,
        storage,
        journal: WriteJournal,
        *,
        fetch_traj: bool,
        key: NestedKey,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """Start, stop and length of every trajectory, or ``None`` to scan."""
        if isinstance(storage, TensorStorage):
            if not storage.initialized:
                return None
            # one read of the length, which lives in shared memory
            numel = len(storage)
            full = numel == storage.max_size
            length = numel if storage.ndim == 1 else storage._len_along_dim0
            shape = storage._total_shape
        elif isinstance(storage, ListStorage):
            length = len(storage)
            full = storage._is_full
            shape = None
        else:
            return None
        if not length:
            return None
        count, resets = journal.state()
        cursor = getattr(storage, "_last_cursor", None)
        # the column was written in this process without the journal hearing
        # of it (checked first: it also sets what the next check expects)
        version = column_version(storage, key)
        unrecorded = journal.written_unrecorded(version, key)
        current = (
            self._storage is not None
            and self._storage() is storage
            and self._ident == (fetch_traj, key)
            and self._resets == resets
            and length >= self._length
            and count - self._read <= journal.slots
        )
        if (
            version is None
            and current
            and count == self._read
            and cursor is not self._cursor
        ):
            # no version counter to read (e.g. inference tensors): the
            # storage's cursor moved and nothing was recorded
            unrecorded = True
        if unrecorded:
            current = False
            if count and not self._warned:
                self._warned = True
                warnings.warn(
                    f"{type(sampler).__name__}: the storage was written to "
                    "without going through the replay buffer (e.g. a direct "
                    "Storage.set, an in-place write into rb[:] or into the "
                    "storage's tensors, or another buffer that shares the "
                    "storage), so the sampler's trajectory index could not "
                    "be updated from the written rows and was rebuilt from a "
                    "full scan of the storage, whose cost grows with the "
                    "buffer. Write through ReplayBuffer.extend, add or "
                    "__setitem__ to keep sampling in O(batch).",
                    category=UserWarning,
                    stacklevel=_user_stacklevel(),
                )
        if not current:
            if not self._build(storage, length, shape, fetch_traj, key):
                self._storage = None
                return None
            self._read, self._resets = count, resets
        elif count != self._read or length != self._length:
            runs = journal.ranges(self._read, count)
            self._read = count
            if not self._update(storage, runs, length):
                if not self._build(storage, length, shape, fetch_traj, key):
                    self._storage = None
                    return None
        self._cursor = cursor
        return self._derive(sampler, storage, length, full, cursor)

    def derived_key(self):
        """Identifies the state the last start/stop tensors were derived from."""
        return getattr(self, "_derived_key", None)

    def derived_lengths(self) -> torch.Tensor | None:
        """The lengths tensor of the last start/stop/length tensors returned."""
        derived = getattr(self, "_derived", None)
        return None if derived is None else derived[2]

    # building and updating the per-row flags and the stop keys
    def _read_all_ends(self, storage, length: int) -> torch.Tensor | None:
        """End flags of every row, read like the full scan reads the column."""
        column = _slice_utils.read_full_column(storage, self._ident[1])
        if not self._ident[0]:
            column = column.squeeze()
        if column.shape != torch.Size([length, *self._rest]):
            return None
        if self._ident[0]:
            return torch.cat([column[:-1] != column[1:], column[-1:] != column[:1]])
        return column != 0

    def _read_values(self, storage, rows: torch.Tensor) -> torch.Tensor | None:
        """Trajectory ids (or done flags, as booleans) at ``rows``."""
        values = _slice_utils._ColumnReader(storage, rows).get(self._ident[1])
        if values is None:
            return None
        if self._ident[0]:
            return values if values.shape[1:] == self._rest else None
        if values.numel() != rows.numel() * self._rest.numel():
            return None
        return values.reshape(rows.numel(), *self._rest) != 0

    def _keys(self, ends: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        """Sorted keys of the set flags in ``ends`` (one line per row of ``rows``)."""
        if ends.ndim == 1:
            found = ends.nonzero().squeeze(-1)
            return found if rows is None else rows[found]
        found = ends.transpose(0, -1).nonzero()
        time = found[:, -1] if rows is None else rows[found[:, -1]]
        key = torch.zeros_like(time)
        for dim, size in zip(found.unbind(-1)[:-1], self._tshape[:-1]):
            key = key * size + dim
        return key * self._tshape[-1] + time

    def _key_rows(self, keys: torch.Tensor) -> torch.Tensor:
        return keys if len(self._tshape) == 1 else keys % self._tshape[-1]

    def _build(self, storage, length, shape, fetch_traj, key) -> bool:
        self._ident = (fetch_traj, key)
        self._rest = torch.Size(shape[1:]) if shape is not None else torch.Size([])
        capacity = shape[0] if shape is not None else max(2 * length, 16)
        rest = self._rest
        # the order in which the full scan lists stops: transpose(0, -1)
        self._tshape = (rest[-1], *rest[:-1], capacity) if len(rest) else (capacity,)
        try:
            ends = self._read_all_ends(storage, length)
        except (KeyError, TypeError, RuntimeError, IndexError, ValueError):
            # the full scan reports what is wrong
            return False
        if ends is None:
            return False
        self._ends = torch.zeros(
            (capacity, *rest), dtype=torch.bool, device=ends.device
        )
        self._ends[:length] = ends
        self._stops = self._keys(ends, None)
        self._storage = weakref.ref(storage)
        self._length = length
        self.builds += 1
        self._version = getattr(self, "_version", 0) + 1
        self._derived_key = None
        return True

    def _intervals(self, runs: torch.Tensor, length: int) -> list[list[int]]:
        """The sorted, disjoint row intervals whose end flags may have changed."""
        intervals = runs.tolist()
        if length != self._length:
            # rows that became part of the storage, and the one before them
            intervals.append([max(self._length - 1, 0), length])
        spans = []
        for start, stop in intervals:
            start, stop = min(start, length), min(stop, length)
            if start >= stop:
                continue
            if self._ident[0]:
                # a row's end flag depends on the next row's trajectory id
                if start == 0:
                    spans.append([length - 1, length])
                else:
                    start -= 1
            spans.append([start, stop])
        spans.sort()
        merged = []
        for start, stop in spans:
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], stop)
            else:
                merged.append([start, stop])
        return merged

    def _update(self, storage, runs: torch.Tensor, length: int) -> bool:
        device = self._ends.device
        spans = self._intervals(runs, length)
        sizes = [stop - start for start, stop in spans]
        if 2 * sum(sizes) > length:
            return False  # a build costs less
        if length > self._ends.shape[0]:
            if len(self._tshape) > 1:
                return False
            grown = torch.zeros(2 * length, dtype=torch.bool, device=device)
            grown[: self._ends.shape[0]] = self._ends
            self._ends = grown
            self._tshape = (2 * length,)
        if self._ident[0]:
            # each span's rows and the row after the last one (wrapping)
            read = [torch.arange(a, b + 1, device=device) % length for a, b in spans]
        else:
            read = [torch.arange(a, b, device=device) for a, b in spans]
        rows = read[0] if len(read) == 1 else torch.cat(read)
        try:
            values = self._read_values(storage, rows)
        except (KeyError, TypeError, RuntimeError, IndexError, ValueError):
            # the full scan reports what is wrong
            return False
        if values is None:
            return False
        ends = self._read_span_ends(values, sizes)
        if len(self._tshape) == 1:
            # one column: the stops of each span are a contiguous block
            bounds = torch.tensor([x for span in spans for x in span], device=device)
            pos = torch.searchsorted(self._stops, bounds).tolist()
            pieces, offset, prev = [], 0, 0
            for (start, stop), size, i in zip(spans, sizes, range(0, len(pos), 2)):
                pieces.append(self._stops[prev : pos[i]])
                span_ends = ends[offset : offset + size]
                self._ends[start:stop] = span_ends
                pieces.append(span_ends.nonzero().squeeze(-1) + start)
                offset += size
                prev = pos[i + 1]
            pieces.append(self._stops[prev:])
            self._stops = torch.cat(pieces)
        else:
            rows = torch.cat([torch.arange(a, b, device=device) for a, b in spans])
            stops = self._stops
            if stops.numel():
                stop_rows = self._key_rows(stops)
                pos = torch.searchsorted(rows, stop_rows).clamp_max(rows.numel() - 1)
                stops = stops[rows[pos] != stop_rows]
            self._ends[rows] = ends
            self._stops = _merge_sorted(stops, self._keys(ends, rows))
        self._length = length
        self._version += 1
        return True

    def _read_span_ends(self, values: torch.Tensor, sizes: list[int]):
        """End flags from the values read for spans of rows (and their next rows)."""
        if not self._ident[0]:
            return values
        chunks = torch.split(values, [size + 1 for size in sizes])
        ends = [chunk[:-1] != chunk[1:] for chunk in chunks]
        return ends[0] if len(ends) == 1 else torch.cat(ends)

    def _derive(self, sampler, storage, length, full, cursor):
        row = None
        if full and cursor is not None:
            if cursor is not self._row_of[0]:
                self._row_of = (cursor, _cursor_row(cursor))
            row = self._row_of[1]
        if full and cursor is not None and row is None:
            return None
        derived_key = (self._version, length, full, row)
        if derived_key == self._derived_key:
            return self._derived
        forced = length - 1 if not full else row
        if not full and length == 1 and self._ident[0]:
            # like the full scan: a single row of trajectory ids has no end
            forced = None
        if len(self._tshape) == 1:
            self._derived = self._derive_one_column(forced, full, length)
        else:
            self._derived = self._derive_columns(sampler, forced, full, length)
        self._derived_key = derived_key
        return self._derived

    def _derive_one_column(self, forced, full, length):
        # What SliceSampler._stops_to_start_stop computes for a single column:
        # each trajectory starts after the previous stop, the first one after
        # the last stop (across the end of a circular storage).
        stops = self._stops
        if forced is not None:
            pos = int(torch.searchsorted(stops, forced))
            if pos == stops.numel() or int(stops[pos]) != forced:
                stops = torch.cat(
                    [stops[:pos], stops.new_tensor([forced]), stops[pos:]]
                )
        if full and not stops.numel():
            stops = stops.new_tensor([length - 1])
        starts = torch.roll((stops + 1) % length, 1)
        lengths = stops - starts + 1
        lengths = torch.where(lengths <= 0, lengths + length, lengths)
        return starts.unsqueeze(-1), stops.unsqueeze(-1), lengths

    def _derive_columns(self, sampler, forced, full, length):
        keys = self._stops
        ncols = self._rest.numel()
        cols = torch.arange(ncols, device=keys.device)
        step = self._tshape[-1]
        if forced is not None:
            keys = _insert_missing(keys, cols * step + forced)
        if full:
            present = torch.zeros(ncols, dtype=torch.bool, device=keys.device)
            present[keys // step] = True
            if not present.all():
                keys = _insert_missing(keys, cols[~present] * step + length - 1)
        stop_idx = torch.stack(torch.unravel_index(keys, self._tshape), -1)
        stop_idx[:, [0, -1]] = stop_idx[:, [-1, 0]].clone()
        return sampler._stops_to_start_stop(stop_idx, length)

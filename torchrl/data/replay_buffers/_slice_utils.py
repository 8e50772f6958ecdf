# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Helpers of :class:`~torchrl.data.SliceSampler` for sequence training.

Three concerns live here, so that the sampler module only calls them:

- reading the storage's *schema* (its keys) without fetching rows, to pick the
  trajectory key on the first sample;
- reading a few columns (``done``, ``terminated``, ``is_init``) at the sampled
  indices only, instead of gathering whole rows, or, when a replay buffer
  samples, out of the rows it gathers;
- building the per-sample markers (truncation at slice ends, ``is_init`` at
  slice starts) and, with ``pad_output=True``, the padded index and its mask.
"""
from __future__ import annotations

import contextvars
import dataclasses
import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch
from tensordict import (
    is_tensor_collection,
    is_tensorclass,
    LazyStackedTensorDict,
    TensorDict,
)
from tensordict.utils import NestedKey, unravel_key

from torchrl._user_stacklevel import _user_stacklevel
from torchrl._utils import _replace_last, rl_warnings
from torchrl.data.replay_buffers.storages import TensorStorage

#: Key written by the collectors, preferred over ``"episode"``.
COLLECTOR_TRAJ_KEY = ("collector", "traj_ids")
#: Key commonly used by TorchRL's datasets (the default before this fork).
EPISODE_KEY = "episode"
#: Key written by :class:`~torchrl.envs.InitTracker`.
IS_INIT_KEY = "is_init"
#: Key of the padding mask produced with ``pad_output=True``.
MASK_KEY = ("collector", "mask")
#: Key marking the burn-in rows of a sample drawn with ``burn_in > 0``.
BURN_IN_KEY = ("collector", "burn_in")


class TrajectoryKeyFutureWarning(FutureWarning):
    """Emitted when a slice sampler picks its trajectory key between two stored ones.

    Up to v0.12, :class:`~torchrl.data.SliceSampler` and its subclasses
    delimited trajectories with ``"episode"`` by default. Since v0.13 the key is
    detected from the storage and ``("collector", "traj_ids")``, written by the
    collectors, wins when both are stored. This warning is emitted once per
    sampler in that case; pass ``traj_key=`` to the sampler to choose a key and
    silence it, or filter this class with :mod:`warnings`. Like TorchRL's other
    advisory warnings, it is not emitted when the ``RL_WARNINGS`` environment
    variable is ``0`` (read when ``torchrl`` is imported).
    """


def next_init_key(init_key: NestedKey) -> NestedKey:
    """The slice-start marker under ``"next"``: ``("next", init_key)``."""
    return unravel_key(("next", init_key))


def check_nested_key(name: str, value: Any) -> NestedKey:
    """Returns ``value`` if it is a valid entry key, else raises a ValueError."""
    if isinstance(value, str) and value:
        return value
    if (
        isinstance(value, tuple)
        and value
        and all(isinstance(part, str) and part for part in value)
    ):
        return value
    raise ValueError(
        f"{name} must be a non-empty string or a non-empty tuple of non-empty "
        f"strings (a nested key such as ('agents', 'is_init')), got {value!r}."
    )


def check_burn_in(value: Any) -> int:
    """Returns ``value`` if it is a valid ``burn_in`` (a non-negative int), else raises a ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            "burn_in must be a non-negative int (the number of steps that precede "
            f"each slice to warm up a recurrent state), got {value!r}. Pass e.g. "
            "burn_in=8, or burn_in=0 for no burn-in."
        )
    return value


def _first_item(storage) -> Any:
    """First stored item of a list-like storage, or ``None`` when it is empty."""
    items = getattr(storage, "_storage", None)
    if isinstance(items, list):
        return items[0] if items else None
    return None


def storage_has_key(storage, key: NestedKey) -> bool | None:
    """Whether ``key`` is an entry of the storage, read from its schema.

    Returns ``None`` when the storage cannot tell yet (it is empty or holds
    something that is not a tensor collection), so that callers do not lock in
    a choice.
    """
    if isinstance(storage, TensorStorage):
        if not storage.initialized or not len(storage):
            return None
        data = storage._storage
        if not is_tensor_collection(data):
            return None
        return data.get(key, None) is not None
    if not len(storage):
        return None
    item = _first_item(storage)
    if item is None:
        # Generic storage: one row fetch is the only way to read its keys.
        item = storage[0]
    if not is_tensor_collection(item):
        return None
    return item.get(key, None) is not None


def resolve_traj_key(storage) -> tuple[str, NestedKey] | None:
    """Picks the key delimiting trajectories from the storage's schema.

    Returns:
        ``("traj", key)`` to use a trajectory-id key, ``("end", None)`` to
        rebuild the trajectories from the end key, or ``None`` when the storage
        cannot tell yet (empty).
    """
    has_collector = storage_has_key(storage, COLLECTOR_TRAJ_KEY)
    if has_collector is None:
        return None
    has_episode = storage_has_key(storage, EPISODE_KEY)
    if has_collector:
        if has_episode and rl_warnings():
            warnings.warn(
                f"The storage holds both {COLLECTOR_TRAJ_KEY!r} and "
                f"{EPISODE_KEY!r}: SliceSampler delimits trajectories with "
                f"{COLLECTOR_TRAJ_KEY!r}, the default since v0.13 (it was "
                f"{EPISODE_KEY!r} up to v0.12), so slices may differ from older "
                f"runs. Pass traj_key={COLLECTOR_TRAJ_KEY!r} (or "
                f"traj_key={EPISODE_KEY!r}) to choose and silence this warning.",
                TrajectoryKeyFutureWarning,
                stacklevel=_user_stacklevel(),
            )
        return ("traj", COLLECTOR_TRAJ_KEY)
    if has_episode:
        return ("traj", EPISODE_KEY)
    return ("end", None)


def read_full_column(storage, key: NestedKey) -> torch.Tensor:
    """Reads one entry over the whole storage, without gathering other entries.

    Raises:
        KeyError: if the storage has no such entry.
        TypeError: if the stored items are not tensor collections.
    """
    if isinstance(storage, TensorStorage):
        return storage[:][key]
    rows = storage[:]
    if is_tensor_collection(rows):
        return rows[key]
    # Like TorchRL 0.12.0, a storage that returns a list (e.g. ListStorage) is
    # not read: stacking every stored row at each sample would be costly.
    raise TypeError(
        f"Cannot read entry {key!r} out of a {type(storage).__name__}, which "
        f"returns {type(rows).__name__} items instead of a tensordict. Use a "
        "LazyTensorStorage, LazyMemmapStorage or LazyStackStorage."
    )


class _ColumnReader:
    """Reads a few entries of the storage at given indices.

    For a :class:`~torchrl.data.TensorStorage` holding a tensordict, each leaf
    is indexed directly, so only the requested columns are read. Other storages
    (e.g. :class:`~torchrl.data.ListStorage`) fetch the sampled rows once and
    read the entries from them.
    """

    def __init__(self, storage, index: tuple[torch.Tensor, ...]):
        self.storage = storage
        self.index = index
        self._rows = None
        self._rows_fetched = False

    def _fetch_rows(self):
        if not self._rows_fetched:
            self._rows_fetched = True
            rows = self.storage[self.index]
            if isinstance(rows, (list, tuple)):
                if rows and all(is_tensor_collection(row) for row in rows):
                    rows = torch.stack(list(rows))
                else:
                    rows = None
            elif not is_tensor_collection(rows):
                rows = None
            self._rows = rows
        return self._rows

    def get(self, key: NestedKey) -> torch.Tensor | None:
        storage = self.storage
        if isinstance(storage, TensorStorage):
            if not storage.initialized:
                return None
            data = storage._storage
            if is_tensor_collection(data):
                leaf = data.get(key, None)
                if leaf is None:
                    return None
                if isinstance(leaf, torch.Tensor):
                    # Indices are already wrapped in [0, len), so indexing the
                    # full leaf is the same as indexing the filled part of it.
                    return torch.as_tensor(leaf[self.index])
        rows = self._fetch_rows()
        if rows is None:
            return None
        return rows.get(key, None)


def _starts_and_lengths(
    seq_length: int | torch.Tensor, num_slices: int, num_rows: int, device
) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(seq_length, torch.Tensor):
        lengths = seq_length.to(device=device, dtype=torch.long).reshape(-1)
    else:
        lengths = torch.full((num_rows // seq_length,), seq_length, device=device)
    starts = lengths.cumsum(0) - lengths
    return starts, lengths


def finish_slices(
    storage,
    index: torch.Tensor | tuple[torch.Tensor, ...],
    seq_length: int | torch.Tensor,
    num_slices: int,
    *,
    truncated_key: NestedKey | None,
    pad_to: int | None,
    info: dict | None = None,
    init_key: NestedKey = IS_INIT_KEY,
    mask_key: NestedKey = MASK_KEY,
    burn_in: torch.Tensor | None = None,
    burn_in_key: NestedKey = BURN_IN_KEY,
    padded: bool = False,
) -> tuple[tuple[torch.Tensor, ...], dict]:
    """Turns the concatenated slice indices into the sampler's ``(index, info)``.

    Reads only the columns it needs at the sampled indices: ``done`` and
    ``terminated`` next to ``truncated_key`` (when not ``None``) and
    ``init_key`` (when stored). Inside :class:`markers_from_sample` (a replay
    buffer sampling) it reads none: the buffer completes the markers out of the
    rows it gathers, with :func:`complete_markers`. The ``info`` entries are
    written into the sample by the replay buffer after its single gather.

    Args:
        storage (Storage): the sampled storage.
        index (torch.Tensor or tuple of torch.Tensor): ``[N, storage.ndim]``
            indices of the slices laid end to end, or the ``storage.ndim``
            ``[N]`` long tensors of its columns.
        seq_length (int or torch.Tensor): length of every slice, or of each.
        num_slices (int): the number of slices.

    Keyword Args:
        truncated_key (NestedKey or None): where to write the slice-end marker.
        pad_to (int or None): if not ``None``, each slice is padded up to this
            length by repeating its last step, and a ``mask_key`` entry marks
            the real rows.
        info (dict, optional): per-row info already computed (e.g. priority
            weights); padded like the index.
        init_key (NestedKey, optional): the slice-start marker, read from the
            storage and set at every slice start. Defaults to ``"is_init"``.
        mask_key (NestedKey, optional): where the padding mask is written.
            Defaults to ``("collector", "mask")``.
        burn_in (torch.Tensor, optional): the number of burn-in rows that
            start each slice. If given, ``burn_in_key`` marks them and the
            ``mask_key`` entry is ``False`` there (and on padded rows).
        burn_in_key (NestedKey, optional): where the burn-in marker is
            written. Defaults to ``("collector", "burn_in")``.
        padded (bool, optional): with ``pad_to`` and a tensor
            ``seq_length``, whether ``index`` is padded already: ``pad_to``
            rows per slice, the rows after its ``seq_length`` ones repeating
            its last step. Defaults to ``False``.

    Returns:
        the index as a tuple of long tensors, and the info dict.
    """
    info = {} if info is None else info
    if isinstance(index, tuple):
        index_tuple = index
    else:
        index_tuple = index.to(torch.long).unbind(-1)
    num_rows = index_tuple[0].shape[0]
    device = index_tuple[0].device
    if isinstance(seq_length, int) and pad_to is None and burn_in is None:
        # slices of seq_length rows each: strided rows start and end them
        first = slice(None, None, seq_length)
        last = slice(seq_length - 1, None, seq_length)
    elif padded:
        # the slices start every pad_to rows; first and last are set below
        lengths = seq_length.to(device=device, dtype=torch.long).reshape(-1)
    else:
        starts, lengths = _starts_and_lengths(seq_length, num_slices, num_rows, device)
        first, last = starts, starts + lengths - 1
    if burn_in is not None:
        burn_in = burn_in.to(device=device, dtype=torch.long).reshape(-1)
    if pad_to is not None:
        num_slices = lengths.shape[0]
        # [num_slices, pad_to] by broadcasting the offsets against each slice
        offsets = torch.arange(pad_to, device=device)
        last_step = (lengths - 1).unsqueeze(-1)
        mask = offsets <= last_step
        if burn_in is not None:
            burn = offsets < burn_in.unsqueeze(-1)
            info[burn_in_key] = burn.view(-1)
            mask = mask.logical_and_(burn.logical_not())
        if padded or not bool(mask.all()):
            # a padded row repeats the last step of its slice
            step = torch.minimum(offsets, last_step)
            if not padded:
                gather = (starts.unsqueeze(-1) + step).reshape(-1)
                index_tuple = tuple(idx[gather] for idx in index_tuple)
                for key, val in list(info.items()):
                    if isinstance(val, torch.Tensor) and val.shape[:1] == (num_rows,):
                        info[key] = val[gather]
            first = (step == 0).view(-1)
            last = (offsets >= last_step).view(-1)
            num_rows = num_slices * pad_to
        info[mask_key] = mask.reshape(-1)
    elif burn_in is not None:
        # offset of each row in its slice
        offsets = torch.arange(num_rows, device=device) - torch.repeat_interleave(
            starts, lengths
        )
        burn = offsets < torch.repeat_interleave(burn_in, lengths)
        info[burn_in_key] = burn
        info[mask_key] = ~burn

    markers = _StoredMarkers(
        truncated_key=truncated_key,
        init_key=init_key,
        first=first,
        last=last,
        num_rows=num_rows,
        device=device,
        storage=storage,
        index=index_tuple,
        computed=[key for key in (mask_key, burn_in_key) if key in info],
    )
    if _MARKERS_FROM_SAMPLE.get():
        # the buffer reads the stored entries out of the rows it gathers
        info[_PENDING_MARKERS] = markers
    else:
        markers.fill(info, _ColumnReader(storage, index_tuple).get)
    return index_tuple, info


@dataclasses.dataclass(slots=True)
class _StoredMarkers:
    """The markers of a sample, to be completed with stored entries.

    The sample's rows ``first`` and ``last`` (a slice or an index of rows)
    start and end its slices. ``truncated_key`` is set at the ends, ``done`` is
    the stored one also set there, ``terminated`` is the stored one, and
    ``init_key`` is the stored one set at the starts. The stored entries are
    read at the sampled rows: out of the storage by :func:`finish_slices`, or,
    when the replay buffer samples (see :class:`markers_from_sample`), out of
    the rows it gathers anyway, by :func:`complete_markers`.
    """

    truncated_key: NestedKey | None
    init_key: NestedKey
    first: slice | torch.Tensor
    last: slice | torch.Tensor
    num_rows: int
    device: torch.device
    storage: Any
    #: the sampled index, to read the stored entries out of the storage
    index: tuple[torch.Tensor, ...]
    #: the markers computed without stored entries (padding mask, burn-in)
    computed: list[NestedKey]

    def fill(
        self, info: dict, get: Callable[[NestedKey], Any], in_place: bool = False
    ) -> list[NestedKey]:
        """Writes the markers into ``info``, reading stored entries with ``get``.

        With ``in_place=True`` the tensors ``get`` returns belong to the caller
        (the gathered rows): they are updated in place where they can be.

        Returns:
            the keys of the markers that are not tensors ``get`` returned.
        """
        device = self.device
        new = []
        truncated_key = self.truncated_key
        if truncated_key is not None:
            done_key = _replace_last(truncated_key, "done")
            terminated_key = _replace_last(truncated_key, "terminated")
            done = get(done_key)
            shape = (self.num_rows, 1)
            if done is not None and done.shape != shape and done.numel() == shape[0]:
                shape = done.shape
            ends = self._rows_mask(self.last, len(shape))
            truncated = get(truncated_key) if in_place else None
            if (
                truncated is not None
                and truncated.shape == shape
                and truncated.dtype == torch.bool
                and truncated.device == device
            ):
                truncated.copy_(ends)
            else:
                truncated = ends.expand(shape).clone()
                new.append(truncated_key)
            if done is None:
                done = truncated.clone()
                new.append(done_key)
            elif in_place and done.device == device:
                done.logical_or_(ends)
            else:
                done = done.to(device) | ends
                new.append(done_key)
            terminated = get(terminated_key)
            if terminated is None:
                terminated = torch.zeros_like(truncated)
                new.append(terminated_key)
            elif terminated.device != device:
                terminated = terminated.to(device)
                new.append(terminated_key)
            info[truncated_key] = truncated
            info[done_key] = done
            info[terminated_key] = terminated
        # the slice starts, at the root and under "next" (so that a recurrent
        # module called on sample["next"] starts every slice anew as well)
        for init_key in (self.init_key, next_init_key(self.init_key)):
            is_init = get(init_key)
            if is_init is None:
                continue
            starts = self._rows_mask(self.first, is_init.ndim)
            if in_place and is_init.device == device:
                is_init.logical_or_(starts)
            else:
                is_init = is_init.to(device) | starts
                new.append(init_key)
            info[init_key] = is_init
        new.extend(self.computed)
        return new

    def _rows_mask(self, rows: slice | torch.Tensor, ndim: int) -> torch.Tensor:
        # A boolean mask of the sample's ``rows`` (not to be written to),
        # shaped to broadcast against a marker of ``ndim`` dimensions
        if isinstance(rows, slice):
            return _strided_rows_mask(
                self.num_rows, rows.start, rows.step, ndim, self.device
            )
        if rows.dtype == torch.bool:
            # a mask of the rows already (those of padded slices)
            return rows.view((self.num_rows,) + (1,) * (ndim - 1))
        return _new_rows_mask(self.num_rows, rows, ndim, self.device)


def _new_rows_mask(
    num_rows: int, rows: slice | torch.Tensor, ndim: int, device: torch.device
) -> torch.Tensor:
    mask = torch.zeros((num_rows,) + (1,) * (ndim - 1), dtype=torch.bool, device=device)
    mask[rows] = True
    return mask


@functools.lru_cache(maxsize=32)
def _strided_rows_mask(
    num_rows: int, start: int | None, step: int, ndim: int, device: torch.device
) -> torch.Tensor:
    # Slices of one length start and end at strided rows: the same mask for
    # every sample of a sampler, cached (and so never written to).
    return _new_rows_mask(num_rows, slice(start, None, step), ndim, device)


_MARKERS_FROM_SAMPLE = contextvars.ContextVar(
    "torchrl_slice_markers_from_sample", default=False
)
_PENDING_MARKERS = "_slice_markers"


class markers_from_sample:
    """Context in which the slice samplers leave the stored markers unread.

    A replay buffer gathers every entry of the sampled rows, ``done``,
    ``terminated`` and ``is_init`` included: inside this context,
    :func:`finish_slices` does not read them out of the storage a second time,
    and the buffer calls :func:`complete_markers` with the rows it gathered.
    """

    __slots__ = ("_token",)

    def __enter__(self):
        self._token = _MARKERS_FROM_SAMPLE.set(True)
        return self

    def __exit__(self, *exc):
        _MARKERS_FROM_SAMPLE.reset(self._token)


def complete_markers(info: dict, data: Any) -> bool:
    """Fills the markers of ``info`` left unread by a slice sampler, from the gathered ``data``.

    Rows gathered out of a :class:`~torchrl.data.TensorStorage` into a
    :class:`~tensordict.TensorDict` are new tensors that the sample owns: the
    markers are written into them (``done`` and ``is_init`` in place). Other
    tensordict rows (e.g. the lazy stack of a
    :class:`~torchrl.data.LazyStackStorage`, which holds the stored
    tensordicts) are read, not written: :func:`write_row_markers` writes the
    markers. Rows that are not a tensordict (e.g. the list of a
    :class:`~torchrl.data.ListStorage`) are not read: the entries are read out
    of the storage, as outside :class:`markers_from_sample`.

    Returns:
        whether ``data`` holds every marker of ``info``.
    """
    markers = info.pop(_PENDING_MARKERS, None)
    if markers is None:
        return False
    if not (
        is_tensor_collection(data)
        and not is_tensorclass(data)
        and data.batch_size[:1] == (markers.num_rows,)
    ):
        markers.fill(info, _ColumnReader(markers.storage, markers.index).get)
        return False
    if not (type(data) is TensorDict and isinstance(markers.storage, TensorStorage)):
        markers.fill(info, lambda key: data.get(key, None))
        return False

    def get(key):
        try:
            return data.get(key)
        except KeyError:
            return None

    for key in markers.fill(info, get, in_place=True):
        data.set(key, info[key])
    return True


def marker_keys(
    info: dict,
    *,
    truncated_key: NestedKey | None,
    init_key: NestedKey,
    mask_key: NestedKey,
    burn_in_key: NestedKey = BURN_IN_KEY,
) -> list[NestedKey]:
    """The entries of ``info`` that :func:`finish_slices` wrote as per-row markers."""
    keys = [init_key, next_init_key(init_key), mask_key, burn_in_key]
    if truncated_key is not None:
        keys += [
            truncated_key,
            _replace_last(truncated_key, "done"),
            _replace_last(truncated_key, "terminated"),
        ]
    return [key for key in keys if key in info]


def drop_repeated_rows(index: Any, priority: Any) -> tuple[Any, Any]:
    """Drops the rows whose index repeats the one of the row before them.

    With ``pad_output=True`` the padded rows of a slice follow its last real
    step and carry its index, while two consecutive steps of a slice never
    share one: dropping these rows keeps a priority update of the whole sample
    from overwriting the real step's priority with the padded rows' ones.
    Anything else (an int index, a scalar priority, mismatched lengths) is
    returned unchanged, for the sampler to handle or reject as usual.
    """
    if not isinstance(index, torch.Tensor) or index.ndim == 0:
        return index, priority
    priority_t = torch.as_tensor(priority)
    num_rows = index.shape[0]
    if num_rows < 2 or priority_t.numel() != num_rows:
        return index, priority
    rows = index.reshape(num_rows, -1)
    repeated = torch.zeros(num_rows, dtype=torch.bool, device=index.device)
    repeated[1:] = (rows[1:] == rows[:-1]).all(-1)
    if not repeated.any():
        return index, priority
    keep = ~repeated
    return index[keep], priority_t.reshape(num_rows)[keep.to(priority_t.device)]


def without_burn_in_rows(sampler, data: Any) -> Any:
    """The rows of a sample that are not burn-in rows, for a priority update.

    A sample of a slice sampler with ``burn_in > 0`` carries its burn-in
    marker (the sampler's ``burn_in_key``): whatever sample it is (the last
    one, an earlier one, one a prefetching buffer drew ahead), the rows it
    marks are dropped, so that
    :meth:`~torchrl.data.TensorDictReplayBuffer.update_tensordict_priority`
    leaves their priorities alone. Anything else is returned unchanged.
    """
    if not getattr(sampler, "burn_in", 0) or not is_tensor_collection(data):
        return data
    if not data.ndim:
        return data
    burn = data.get(sampler.burn_in_key, None)
    if (
        not isinstance(burn, torch.Tensor)
        or burn.dtype != torch.bool
        or burn.shape != data.batch_size
        or not bool(burn.any())
    ):
        return data
    return data[~burn]


def drop_burn_in_rows(
    index: Any, priority: Any, last: tuple[torch.Tensor, torch.Tensor] | None
) -> tuple[Any, Any]:
    """Drops the burn-in rows of the last sample from a priority update.

    ``last`` is the ``(index, burn-in marker)`` of the sampler's last sample,
    the index as an ``[N, ndim]`` tensor. An update whose index is that
    sample's index (as a tensor or as a tuple of per-dimension tensors) loses
    its burn-in rows; anything else is returned unchanged.
    """
    if last is None:
        return index, priority
    last_index, burn = last
    if isinstance(index, (tuple, list)):
        if not all(isinstance(idx, torch.Tensor) for idx in index):
            return index, priority
        flat = torch.stack([idx.reshape(-1) for idx in index], -1)
    elif isinstance(index, torch.Tensor):
        flat = index.unsqueeze(-1) if index.ndim == 1 else index
    else:
        return index, priority
    if flat.shape != last_index.shape or not torch.equal(
        flat.to(last_index.device), last_index
    ):
        return index, priority
    priority_t = torch.as_tensor(priority)
    if priority_t.numel() != burn.numel():
        return index, priority
    keep = ~burn
    if isinstance(index, (tuple, list)):
        index = type(index)(idx.reshape(-1)[keep.to(idx.device)] for idx in index)
    else:
        index = index[keep.to(index.device)]
    return index, priority_t.reshape(-1)[keep.to(priority_t.device)]


def unshare_lazy_stack(data: Any) -> Any:
    """A shallow copy of a lazily stacked sample, else ``data`` itself.

    A sample of a :class:`~torchrl.data.LazyStackStorage` stacks the stored
    tensordicts themselves: writing entries into it would write them into the
    storage (and into every row sampled twice). The copy holds new tensordicts
    that share the stored tensors, so it costs no data copy.
    """
    if isinstance(data, LazyStackedTensorDict):
        return data.copy()
    return data


def write_row_markers(sampler, data: Any, info: dict) -> Any:
    """Writes the sampler's per-row markers into a tensordict sample.

    The markers (slice starts, truncation, padding mask) are the ``info``
    entries the sampler lists in ``_row_markers``; the sampled rows are
    meaningless to a sequence model without them, so every buffer class writes
    them, not only :class:`~torchrl.data.TensorDictReplayBuffer` (which writes
    the whole ``info``). ``info`` itself is left as is. Samples that are not
    tensordicts (or are tensorclasses), and markers whose leading dimensions do
    not match the sample (e.g. after a custom ``collate_fn``), are left alone.
    """
    row_markers = getattr(sampler, "_row_markers", None)
    if row_markers is None or not is_tensor_collection(data) or is_tensorclass(data):
        return data
    keys = row_markers(info)
    if not keys:
        return data
    data = unshare_lazy_stack(data)
    is_locked = data.is_locked
    if is_locked:
        data.unlock_()
    for key in keys:
        val = torch.as_tensor(info[key], device=data.device)
        if val.shape[: data.ndim] == data.batch_size:
            data.set(key, val)
    if is_locked:
        data.lock_()
    return data

# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Helpers of :class:`~torchrl.data.SliceSampler` for sequence training.

Three concerns live here, so that the sampler module only calls them:

- reading the storage's *schema* (its keys) without fetching rows, to pick the
  trajectory key on the first sample;
- reading a few columns (``done``, ``terminated``, ``is_init``) at the sampled
  indices only, instead of gathering whole rows;
- building the per-sample markers (truncation at slice ends, ``is_init`` at
  slice starts) and, with ``pad_output=True``, the padded index and its mask.
"""
from __future__ import annotations

import warnings
from typing import Any

import torch
from tensordict import is_tensor_collection
from tensordict.utils import NestedKey

from torchrl._user_stacklevel import _user_stacklevel
from torchrl._utils import _replace_last

#: Key written by the collectors, preferred over ``"episode"``.
COLLECTOR_TRAJ_KEY = ("collector", "traj_ids")
#: Key commonly used by TorchRL's datasets (the default before this fork).
EPISODE_KEY = "episode"
#: Key written by :class:`~torchrl.envs.InitTracker`.
IS_INIT_KEY = "is_init"
#: Key of the padding mask produced with ``pad_output=True``.
MASK_KEY = ("collector", "mask")


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
    from torchrl.data.replay_buffers.storages import TensorStorage

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
        if has_episode:
            warnings.warn(
                f"SliceSampler found both {COLLECTOR_TRAJ_KEY!r} (written by the "
                f"collectors) and {EPISODE_KEY!r} in the storage and uses "
                f"{COLLECTOR_TRAJ_KEY!r} to delimit trajectories. Before this "
                f"change (TorchRL 0.12.0) the default was {EPISODE_KEY!r}, so the "
                "sampled slices may differ from what older code got. Pass "
                f"traj_key={COLLECTOR_TRAJ_KEY!r} to keep this choice, or "
                f"traj_key={EPISODE_KEY!r} for the former one, to silence this "
                "warning; it will be removed once the new default has been out "
                "for two releases.",
                FutureWarning,
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
    from torchrl.data.replay_buffers.storages import TensorStorage

    if isinstance(storage, TensorStorage):
        return storage[:][key]
    rows = storage[:]
    if is_tensor_collection(rows):
        return rows[key]
    if isinstance(rows, (list, tuple)):
        if not rows:
            raise KeyError(key)
        if not all(is_tensor_collection(row) for row in rows):
            raise TypeError(
                f"Cannot read entry {key!r} out of a {type(storage).__name__} whose "
                "items are not tensordicts."
            )
        return torch.stack([row[key] for row in rows])
    raise TypeError(
        f"Cannot read entry {key!r} out of a {type(storage).__name__} holding "
        f"{type(rows).__name__} items."
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
        from torchrl.data.replay_buffers.storages import TensorStorage

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
    index: torch.Tensor,
    seq_length: int | torch.Tensor,
    num_slices: int,
    *,
    truncated_key: NestedKey | None,
    pad_to: int | None,
    info: dict | None = None,
) -> tuple[tuple[torch.Tensor, ...], dict]:
    """Turns the concatenated slice indices into the sampler's ``(index, info)``.

    Reads only the columns it needs at the sampled indices: ``done`` and
    ``terminated`` next to ``truncated_key`` (when not ``None``) and
    ``"is_init"`` (when stored). The ``info`` entries are written into the
    sample by :class:`~torchrl.data.TensorDictReplayBuffer` after its single
    gather.

    Args:
        storage (Storage): the sampled storage.
        index (torch.Tensor): ``[N, storage.ndim]`` indices of the slices laid
            end to end.
        seq_length (int or torch.Tensor): length of every slice, or of each.
        num_slices (int): the number of slices.

    Keyword Args:
        truncated_key (NestedKey or None): where to write the slice-end marker.
        pad_to (int or None): if not ``None``, each slice is padded up to this
            length by repeating its last step, and a ``("collector", "mask")``
            entry marks the real rows.
        info (dict, optional): per-row info already computed (e.g. priority
            weights); padded like the index.

    Returns:
        the index as a tuple of long tensors, and the info dict.
    """
    info = {} if info is None else info
    index = index.to(torch.long)
    num_rows = index.shape[0]
    device = index.device
    starts, lengths = _starts_and_lengths(seq_length, num_slices, num_rows, device)
    index_tuple = index.unbind(-1)
    reader = _ColumnReader(storage, index_tuple)

    if truncated_key is not None:
        done_key = _replace_last(truncated_key, "done")
        terminated_key = _replace_last(truncated_key, "terminated")
        truncated = torch.zeros((num_rows, 1), dtype=torch.bool, device=device)
        truncated[starts + lengths - 1] = True
        done = reader.get(done_key)
        if done is None:
            done = truncated.clone()
        else:
            if done.shape != truncated.shape and done.numel() == num_rows:
                truncated = truncated.reshape(done.shape)
            done = done.to(device) | truncated
        terminated = reader.get(terminated_key)
        if terminated is None:
            terminated = torch.zeros_like(truncated)
        else:
            terminated = terminated.to(device)
        info[truncated_key] = truncated
        info[done_key] = done
        info[terminated_key] = terminated

    is_init = reader.get(IS_INIT_KEY)
    if is_init is not None:
        is_init = is_init.to(device=device, copy=True)
        is_init[starts] = True
        info[IS_INIT_KEY] = is_init

    if pad_to is not None:
        num_slices = lengths.shape[0]
        offsets = torch.arange(pad_to, device=device).expand(num_slices, pad_to)
        mask = offsets < lengths.unsqueeze(-1)
        if bool(mask.all()):
            gather = None
        else:
            gather = (
                starts.unsqueeze(-1)
                + torch.minimum(offsets, (lengths - 1).unsqueeze(-1))
            ).reshape(-1)
        if gather is not None:
            index_tuple = tuple(idx[gather] for idx in index_tuple)
            for key, val in list(info.items()):
                if isinstance(val, torch.Tensor) and val.shape[:1] == (num_rows,):
                    info[key] = val[gather]
        info[MASK_KEY] = mask.reshape(-1)
    return index_tuple, info

# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Mask-aware reduction shared by the loss modules and value estimators.

A batch sampled with ``SliceSampler(pad_output=True)`` (or split with
``split_trajs=True``) carries a boolean mask, by default at
``("collector", "mask")``, that is ``True`` on real rows and ``False`` on
padded ones. The helpers below make a loss honour it:

* :func:`_get_mask` reads and validates the mask;
* :func:`_fill_padded` replaces the content of every padded row by a copy of
  the closest preceding real row, so that nothing computed on a padded row can
  overflow, produce ``NaN`` or back-propagate a non-finite gradient, whatever
  the padded rows hold (burn-in rows, also masked out, are real steps and kept);
* :func:`_masked_reduce` and :func:`_masked_mean` reduce over the real rows
  only;
* :func:`_masked_estimate` wraps the value estimators' ``forward`` and
  ``value_estimate`` so that no trace runs from a padded step into a real one.

Padded rows are never dropped before the loss is computed (the batch shape is
kept, which recurrent modules and ``reduction="none"`` rely on): they are made
harmless, then left out of every reduction and batch statistic.
"""
from __future__ import annotations

import functools

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey, unravel_key

from torchrl.data.replay_buffers._slice_utils import BURN_IN_KEY
from torchrl.objectives.utils import _reduce

#: The key where losses and value estimators look for the padding mask by
#: default. Change it per loss with ``loss.set_keys(mask=...)``.
DEFAULT_MASK_KEY: NestedKey = ("collector", "mask")


def _get_mask(tensordict: TensorDictBase, key: NestedKey) -> torch.Tensor | None:
    """Reads and validates the padding mask of a batch.

    Args:
        tensordict (TensorDictBase): the input batch.
        key (NestedKey): the key of the mask.

    A mask of shape ``batch_size + (1,)`` (one boolean per row, with a trailing
    singleton dim like the ``done`` flags) is accepted and read as a mask of
    shape ``batch_size``.

    Returns:
        the boolean mask (of shape ``tensordict.batch_size``), or ``None`` if the
        batch holds no entry at ``key``.

    Raises:
        ValueError: if the entry is not a boolean tensor or if its shape is
            neither the batch size nor the batch size followed by ``1``.
    """
    if key is None:
        return None
    mask = tensordict.get(key, None)
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise ValueError(
            f"The padding mask at key {key!r} must be a boolean tensor that is "
            f"True on real rows, got {type(mask).__name__} with dtype "
            f"{getattr(mask, 'dtype', None)}. Store a torch.bool tensor there, or "
            f"point the loss at another key with loss.set_keys(mask=...)."
        )
    batch_size = tensordict.batch_size
    if mask.shape == batch_size + (1,):
        mask = mask.squeeze(-1)
    if mask.shape != batch_size:
        raise ValueError(
            f"The padding mask at key {key!r} has shape {tuple(mask.shape)}, but "
            f"the batch it masks has shape {tuple(batch_size)}. The mask must "
            f"hold exactly one boolean per batch row (True on real rows): reshape "
            f"it to {tuple(batch_size)}, or point the loss at another key with "
            f"loss.set_keys(mask=...)."
        )
    return mask


def _active_mask(
    mask: torch.Tensor | None, key: NestedKey = None
) -> torch.Tensor | None:
    """Returns ``mask`` if it marks at least one padded row, ``None`` otherwise.

    Losses reduce with the plain, unmasked code path when no row is padded, so
    an all-``True`` mask gives the unmasked result bit for bit.

    Raises:
        ValueError: if the mask has no ``True`` entry.
    """
    if mask is None:
        return None
    flat = mask.reshape(-1)
    if bool(flat.all()):
        return None
    if not bool(flat.any()):
        raise ValueError(
            f"The padding mask at key {key!r} is False on every row of the batch "
            f"(shape {tuple(mask.shape)}): there is no real step to compute a "
            f"loss on. Drop empty batches before calling the loss."
        )
    return mask


def _content_rows(tensordict: TensorDictBase, mask: torch.Tensor) -> torch.Tensor:
    """The rows of a masked batch that hold real steps: not padding.

    These are the rows of the mask and the burn-in rows of a slice sampler with
    ``burn_in > 0`` (marked in ``("collector", "burn_in")``): masked out of the
    loss, burn-in rows are real steps that recurrent modules run to warm up
    their state, so their content is kept and no trace is cut at them.
    """
    burn_in = tensordict.get(BURN_IN_KEY, None)
    if burn_in is None:
        return mask
    return mask | burn_in.reshape(mask.shape).to(mask.device)


def _fill_padded(
    tensordict: TensorDictBase, mask: torch.Tensor | None, key: NestedKey = None
) -> tuple[TensorDictBase, torch.Tensor | None]:
    """Replaces the content of the padded rows by copies of real rows.

    Every padded row takes the content of the closest real row that precedes it
    in the flattened batch (or of the first real row if none precedes it). With
    ``SliceSampler(pad_output=True)`` batches this is the identity, since padded
    rows already repeat the last real step of their slice; with
    ``split_trajs=True`` batches the zeros of the padding become copies of the
    last real step. Either way the padded rows hold values a network has seen,
    so no term computed on them can overflow or produce a ``NaN`` that
    back-propagates into the parameters, and a padded row's original content
    can never reach the loss.

    Args:
        tensordict (TensorDictBase): the input batch.
        mask (torch.Tensor or None): the padding mask, as returned by
            :func:`_get_mask`.
        key (NestedKey, optional): the mask key, used in error messages.

    Returns:
        a ``(tensordict, mask)`` pair. If ``mask`` is ``None`` or has no
        ``False`` entry, the input tensordict is returned as-is with a ``None``
        mask, so the unmasked code path (and its results, bit for bit) is kept.
        Otherwise a new tensordict is returned along with the mask.

    Raises:
        ValueError: if the mask has no ``True`` entry.
    """
    mask = _active_mask(mask, key)
    if mask is None:
        return tensordict, None
    real = _content_rows(tensordict, mask)
    if bool(real.all()):
        # burn-in rows only: nothing to fill
        return tensordict.copy(), mask
    src = _fill_index(real)
    batch_size = tensordict.batch_size
    if len(batch_size) == 1:
        filled = tensordict[src]
    else:
        filled = tensordict.reshape(-1)[src].reshape(batch_size)
    if key is not None:
        # the copied rows carried their own (True) mask entry: restore the entry
        filled.set(key, tensordict.get(key))
    if tensordict.get(BURN_IN_KEY, None) is not None:
        filled.set(BURN_IN_KEY, tensordict.get(BURN_IN_KEY))
    return filled, mask


def _fill_index(mask: torch.Tensor) -> torch.Tensor:
    """For every row of the flattened batch, the real row whose content it takes.

    A real row maps to itself, a padded row to the closest real row that
    precedes it (or to the first real row if none precedes it).
    """
    flat = mask.reshape(-1)
    arange = torch.arange(flat.numel(), device=flat.device)
    src = torch.where(flat, arange, -1).cummax(0).values
    first = flat.to(torch.uint8).argmax()
    return torch.where(src < 0, first, src)


def _spread_real_rows(
    values: torch.Tensor, mask: torch.Tensor, dim: int = 0
) -> torch.Tensor:
    """Puts values computed on the real rows only back into the batch layout.

    ``values`` holds, along ``dim``, one entry per real row (in the order of
    ``tensordict[mask]``); the result holds the batch dims of ``mask`` there,
    every padded row taking the value of the real row :func:`_fill_padded`
    copies into it.
    """
    flat = mask.reshape(-1)
    rank = flat.to(torch.long).cumsum(0) - 1
    index = rank[_fill_index(mask)]
    return values.index_select(dim, index).unflatten(dim, mask.shape)


def _refuse_mask(
    loss, tensordict: TensorDictBase, why: str, key: NestedKey = DEFAULT_MASK_KEY
) -> None:
    """Raises if a loss that cannot honour a padding mask gets a padded batch.

    Args:
        loss (LossModule): the loss, named in the error.
        tensordict (TensorDictBase): its input batch.
        why (str): why the loss cannot take a row mask.
        key (NestedKey, optional): the mask key. Defaults to
            ``("collector", "mask")``.

    Raises:
        ValueError: if the batch holds a mask at ``key`` with a ``False`` entry
            (a mask that is ``True`` everywhere is accepted).
    """
    if not isinstance(tensordict, TensorDictBase):
        return
    mask = tensordict.get(key, None)
    if not isinstance(mask, torch.Tensor) or bool(mask.all()):
        return
    raise ValueError(
        f"{type(loss).__name__} got a padding mask at key {key!r} with padded "
        f"(False) rows, but it cannot honour one: {why}. Drop the padded rows "
        f"before the loss: batch = batch[batch[{key!r}]]."
    )


def _expand_mask(mask: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
    """Adds trailing singleton dims to ``mask`` so it broadcasts against ``tensor``."""
    if tensor.shape[: mask.ndim] != mask.shape:
        raise ValueError(
            f"A per-row loss term of shape {tuple(tensor.shape)} does not start "
            f"with the batch shape {tuple(mask.shape)} of the padding mask, so "
            f"the mask cannot select its rows."
        )
    return mask.reshape(mask.shape + (1,) * (tensor.ndim - mask.ndim))


def _masked_reduce(
    tensor: torch.Tensor,
    reduction: str,
    mask: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduces a per-row loss over the real rows only.

    A thin layer over :func:`~torchrl.objectives.utils._reduce`, whose
    ``mask`` semantics it keeps: the mask selects the rows of ``tensor`` (and
    of ``weights``) before the reduction.

    Args:
        tensor (torch.Tensor): the per-row loss, whose leading dims are the
            batch dims.
        reduction (str): ``"mean"``, ``"sum"`` or ``"none"``.
        mask (torch.Tensor, optional): the padding mask. ``None`` means every row
            is real.
        weights (torch.Tensor, optional): importance weights, one per row.

    Returns:
        with ``"mean"``, the (weighted) average over the real rows; with
        ``"sum"``, their (weighted) sum; with ``"none"``, the (weighted)
        values of the real rows, flattened into one leading dim
        (``tensor[mask]``), as for the batch with its padded rows removed.
    """
    if mask is not None:
        _expand_mask(mask, tensor)
    return _reduce(tensor, reduction=reduction, mask=mask, weights=weights)


def _masked_reduce_stacked(
    tensor: torch.Tensor, reduction: str, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Reduces a per-row loss with one leading stack dim over the real rows only.

    For losses whose terms are stacked over an ensemble (one entry per
    Q-value network, ``[K, *batch]``). With ``"none"``, the result is
    ``tensor[:, mask]``: the real rows of each stacked term.
    """
    if mask is None:
        return _reduce(tensor, reduction=reduction)
    out = _masked_reduce(tensor.movedim(0, -1), reduction, mask=mask)
    if reduction == "none":
        out = out.movedim(-1, 0)
    return out


def _masked_mean_stacked(
    tensor: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """Averages a per-row statistic with one leading stack dim over the real rows."""
    if mask is None:
        return tensor.mean()
    return _masked_mean(tensor.movedim(0, -1), mask)


def _reduced_batch_size(
    batch_size: torch.Size, mask: torch.Tensor | None
) -> torch.Size:
    """The batch size of the per-row terms ``_masked_reduce(..., "none")`` returns."""
    if mask is None:
        return torch.Size(batch_size)
    return torch.Size([int(mask.sum())])


def _masked_mean(tensor: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Averages a per-row statistic over the real rows (plain ``mean()`` without mask)."""
    if mask is None:
        return tensor.mean()
    _expand_mask(mask, tensor)
    return tensor[mask].mean()


def _select_rows(tensor: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Keeps the real rows of a per-row tensor (the tensor itself without mask)."""
    if mask is None:
        return tensor
    _expand_mask(mask, tensor)
    return tensor[mask]


def _select_rows_stacked(
    tensor: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """Keeps the real rows of a per-row tensor with one leading stack dim (``[K, *batch]``)."""
    if mask is None:
        return tensor
    return _select_rows(tensor.movedim(0, -1), mask).movedim(-1, 0)


def _align_rows(
    tensor: torch.Tensor, other: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drops a trailing singleton dim that only one of two per-row tensors has.

    A log-probability stored as ``[N, 1]`` next to a computed one of shape
    ``[N]`` would otherwise broadcast into ``[N, N]`` and let every row's loss
    mix with every other row's.
    """
    if not isinstance(tensor, torch.Tensor) or not isinstance(other, torch.Tensor):
        return tensor, other
    if other.ndim == tensor.ndim + 1 and other.shape[-1] == 1:
        if other.shape[:-1] == tensor.shape:
            other = other.squeeze(-1)
    elif tensor.ndim == other.ndim + 1 and tensor.shape[-1] == 1:
        if tensor.shape[:-1] == other.shape:
            tensor = tensor.squeeze(-1)
    return tensor, other


def _strip_trailing_ones(shape: torch.Size) -> torch.Size:
    shape = list(shape)
    while shape and shape[-1] == 1:
        shape.pop()
    return torch.Size(shape)


def _as_rows(tensor: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Gives a per-row term (log-prob, log-ratio) the advantage's ``shape``.

    A term that holds one value per row but has one more (or one less)
    trailing singleton dim than the advantage, such as the ``[N, 1]``
    log-probability of a one-dimensional :class:`~torch.distributions.Normal`
    turned into ``[N, 1, 1]``, would otherwise broadcast against an ``[N, 1]``
    advantage into ``[N, N, 1]`` and let every row's loss mix with every other
    row's. It is viewed with ``shape`` instead; any other term is returned
    unchanged.
    """
    if not isinstance(tensor, torch.Tensor) or tensor.shape == shape:
        return tensor
    if _strip_trailing_ones(tensor.shape) == _strip_trailing_ones(shape):
        return tensor.reshape(shape)
    return tensor


def _row_aligned(
    tensor: torch.Tensor, batch_shape: torch.Size, name: str = "tensor"
) -> torch.Tensor:
    """Gives a per-row tensor the ``batch_shape + (1,)`` layout losses reduce.

    A stored log-probability or advantage of shape ``[N]`` next to a computed
    one of shape ``[N, 1]`` would otherwise broadcast into ``[N, N]`` and let
    every row's loss mix with every other row's.
    """
    if not isinstance(tensor, torch.Tensor):
        return tensor
    batch_shape = torch.Size(batch_shape)
    if tensor.shape == batch_shape:
        return tensor.unsqueeze(-1)
    return tensor


def _cut_at_padding(
    tensordict: TensorDictBase,
    mask: torch.Tensor,
    done_key: NestedKey,
    time_dim: int,
) -> None:
    """Marks as done every real step followed by padding, and every padded step.

    A value estimator then never carries a trace from a padded step into a real
    one: the last real step of each segment bootstraps from its own next
    observation, as at a truncation.
    """
    length = mask.shape[time_dim]
    next_mask = torch.cat(
        [
            mask.narrow(time_dim, 1, length - 1),
            torch.ones_like(mask.narrow(time_dim, 0, 1)),
        ],
        time_dim,
    )
    cut = ~mask | ~next_mask
    done = tensordict.get(done_key, None)
    if done is None:
        return
    tensordict.set(done_key, done | _expand_mask(cut, done))


def _written_keys(before: dict, after: TensorDictBase) -> list:
    """The leaf keys of ``after`` that are new or were (re)written since ``before``."""
    written = []
    for key, value in after.items(True, True):
        old = before.get(key)
        version = getattr(value, "_version", None)
        if old is None or old[0] is not value or old[1] != version:
            written.append(key)
    return written


def _masked_estimate(fun):
    """Makes a value-estimator method ignore the padded steps of its input.

    Estimators read the mask at their ``mask`` key, ``("collector", "mask")``
    by default (where ``SliceSampler(pad_output=True)`` writes it); a loss sets
    it to its own key (``None``, no mask read, for a loss that reads none),
    and ``set_keys(mask=...)`` changes it. When the input holds a padding mask
    at that key with at least one ``False`` entry, the method runs on a copy
    whose padded rows repeat real rows (so nothing computed on them can
    overflow) and where the trace is cut after the last real step of every
    segment and at every padded step, so that no padded step reaches a real
    step's advantage or target. Every entry ``forward`` writes (advantage, value target, and the
    state values it recomputes, existing ones included) is then written into
    the caller's tensordict.
    """

    @functools.wraps(fun)
    def new_fun(self, tensordict, *args, **kwargs):
        key = getattr(self.tensor_keys, "mask", None)
        if not isinstance(tensordict, TensorDictBase) or key is None:
            return fun(self, tensordict, *args, **kwargs)
        mask = _active_mask(_get_mask(tensordict, key), key)
        if mask is None:
            return fun(self, tensordict, *args, **kwargs)
        work, mask = _fill_padded(tensordict, mask, key)
        time_dim = self._get_time_dim(kwargs.get("time_dim"), work)
        real = _content_rows(work, mask)
        if not bool(real.all()):
            _cut_at_padding(work, real, ("next", self.tensor_keys.done), time_dim)
        before = {
            k: (v, getattr(v, "_version", None)) for k, v in work.items(True, True)
        }
        out = fun(self, work, *args, **kwargs)
        if out is not work:
            return out
        # the done flags were cut above: they are the one entry never copied
        cut_key = unravel_key(("next", self.tensor_keys.done))
        for out_key in _written_keys(before, work):
            if unravel_key(out_key) != cut_key:
                tensordict.set(out_key, work.get(out_key))
        return tensordict

    return new_fun

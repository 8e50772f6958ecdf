# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""The next-step pass of a recurrent network, one slice at a time.

Losses and value estimators evaluate their networks on ``tensordict["next"]``
to bootstrap. For a recurrent network under recurrent mode
(:class:`~torchrl.modules.LSTMModule`, :class:`~torchrl.modules.GRUModule`,
:class:`~torchrl.modules.GTrXLModule`) a
plain call on ``"next"`` is wrong twice on a batch of several slices, such as a
flat :class:`~torchrl.data.SliceSampler` sample, unless the sample marks every
slice start in ``("next", "is_init")`` (the slice samplers do when the storage
holds that entry):

* each slice continues from the recurrent state at the end of the previous one;
* the recurrent states stored under ``"next"`` are overwritten by any earlier
  recurrent-mode pass over the current steps (it writes its final states
  there), so even a marked start would not begin from the stored state.

:func:`_forward_next` gives, for every row ``t`` of a slice that starts at
row ``s``, the network's output after the steps ``s..t`` of the slice (from the
recurrent state stored at ``s``, the one that the current-step pass starts
from) followed by the row's own ``"next"`` entries. It is what running every
slice on its own gives, as R2D2-style learners unroll their target network,
and it holds whatever the next step of a row is: the following row of the
slice (one-step data), a later one (n-step data written by
:class:`~torchrl.data.postprocs.MultiStep`), or none (the last row of a slice).

Slices start at ``"is_init"`` and at the first step of every row of the batch,
as in the module's own current-step pass; ``done`` does not end them (a
collector with ``set_truncated=True`` marks ``done`` at every batch end while
the trajectory goes on). Networks without a recurrent module in recurrent mode
keep the plain call on ``"next"``, unchanged.
"""
from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey, unravel_key

from torchrl.data.replay_buffers._slice_utils import BURN_IN_KEY, MASK_KEY
from torchrl.modules.tensordict_module._gtrxl import GTrXLModule
from torchrl.modules.tensordict_module.rnn import GRUModule, LSTMModule
from torchrl.objectives._mask import _content_rows, _get_mask

_INIT_KEY = "is_init"
# the modules that read a stored recurrent state at their slice starts
_RECURRENT_MODULES = (LSTMModule, GRUModule, GTrXLModule)


def _runs_recurrent(module: torch.nn.Module | None) -> bool:
    """Whether ``module`` holds an LSTM/GRU/GTrXL module that runs in recurrent mode now."""
    if module is None:
        return False
    return any(
        isinstance(m, _RECURRENT_MODULES) and m.recurrent_mode for m in module.modules()
    )


def _stepwise_keys(module: torch.nn.Module, root: TensorDictBase) -> list[NestedKey]:
    """The entries of ``root`` that ``module`` reads at every step of a sequence.

    Every input but the sequence-start marker, the burn-in marker and the
    recurrent states of the LSTM/GRU modules and the memory of the GTrXL
    modules (read at sequence starts only).
    """
    skip = {_INIT_KEY, unravel_key(BURN_IN_KEY)}
    for m in module.modules():
        if isinstance(m, _RECURRENT_MODULES):
            skip.update(unravel_key(key) for key in m.in_keys[1:])
    return [key for key in root.keys(True, True) if key not in skip]


def _shifted_input(
    data: TensorDictBase,
    module: torch.nn.Module,
    mask_key: NestedKey | None = MASK_KEY,
) -> tuple[TensorDictBase, torch.Tensor, torch.Tensor]:
    """One input that gives ``module``'s outputs at the current and at the next steps.

    A sequence of ``data`` (time is its last batch dimension) starts at every
    ``"is_init"`` and at the first step of every row: a row of a collected
    ``[envs, time]`` batch that continues an episode starts from its stored
    recurrent state, not from the end of the row before it. The input holds:

    * the rows of ``data`` in order, with the ``"next"`` step of a row inserted
      after it when the row ends its sequence or is the last real step before
      the padding marked by ``mask_key`` (``"is_init"`` is ``False`` there).
      The output for a row is at its position, the output for its next step
      one position later whenever the row's ``"next"`` inputs are those of the
      row after it (one-step data);
    * after them, for each real row whose next step is not the row after it
      (n-step data, a reset that ``"is_init"`` does not mark), a copy of its
      sequence up to the row followed by the row's ``"next"`` step: the output
      for its next step is at the end of that copy.

    On one-step data the input is the batch plus one step per sequence; on
    n-step data it also holds about ``L / 2`` steps per real row of a sequence
    of ``L`` steps.

    The burn-in marker of a slice sampler with ``burn_in > 0`` is kept, so the
    burn-in rows that start a slice warm up its state without gradient in this
    pass as in the current-step one (the next steps are not burn-in rows). The
    inserted next steps take the entries of ``"next"`` at the keys of the root
    that the module reads, and zeros where ``"next"`` has none.

    Args:
        data (TensorDictBase): the batch, with its ``"next"`` entry.
        module (torch.nn.Module): the network, whose ``in_keys`` are read.
        mask_key (NestedKey, optional): the padding mask of the batch (``True``
            on real rows). Padded rows and burn-in rows get no copy of their
            sequence: their next-step outputs are not meaningful. Without a
            mask every row is real. Defaults to ``("collector", "mask")``.

    Returns:
        the (flat) input, the position of the output for each row of
        ``data.reshape(-1)`` in it, and the position of the output for its next
        step.
    """
    flat = data.reshape(-1)
    n = flat.shape[0]
    device = data.device
    # the burn-in marker of a slice sampler: the next-step pass burns in too
    keys = list(module.in_keys)
    if flat.get(BURN_IN_KEY, None) is not None:
        keys.append(BURN_IN_KEY)
    root = flat.select(*keys, strict=False)
    next_td = flat.get("next")
    # the next step of every row, with the root's keys
    following = TensorDict(batch_size=[n], device=root.device)
    next_keys = set(next_td.keys(True, True))
    for key, value in root.items(True, True):
        following.set(
            key, next_td.get(key) if key in next_keys else torch.zeros_like(value)
        )
    row_start = torch.zeros(data.shape, dtype=torch.bool, device=device)
    row_start[..., 0] = True
    start = row_start.reshape(-1)
    is_init = root.get(_INIT_KEY, None)
    if is_init is not None:
        root.set(_INIT_KEY, is_init | start.view(n, *(1,) * (is_init.ndim - 1)))
        start = start | is_init.reshape(n, -1).any(-1)
        following.set(_INIT_KEY, torch.zeros_like(is_init))
    if flat.get(BURN_IN_KEY, None) is not None:
        following.set(BURN_IN_KEY, torch.zeros_like(root.get(BURN_IN_KEY)))
    mask = _get_mask(data, mask_key)
    if mask is None:
        needed = torch.ones(n, dtype=torch.bool, device=device)
        content = needed
    else:
        needed = mask.reshape(n)
        content = _content_rows(flat, needed)
    # ``end``: the next step is inserted after the row
    end = torch.ones(n, dtype=torch.bool, device=device)
    end[:-1] = start[1:]
    # a real step followed by padding: nothing after it in its sequence is used
    end[:-1] |= content[:-1] & ~content[1:]
    # rows whose next step is the row after them
    same = torch.zeros(n, dtype=torch.bool, device=device)
    if n > 1:
        same[:-1] = True
        for key in _stepwise_keys(module, root):
            now, after = following.get(key), root.get(key)
            if not (isinstance(now, torch.Tensor) and isinstance(after, torch.Tensor)):
                same[:-1] = False
                break
            same[:-1] &= (now[:-1] == after[1:]).reshape(n - 1, -1).all(-1)
    branch = needed & ~end & ~same
    # the rows in order, each sequence end followed by its next step
    arange = torch.arange(n, device=device)
    positions = arange + end.cumsum(0) - end.long()
    num_main = n + int(end.sum())
    index = torch.empty(num_main, dtype=torch.long, device=device)
    index[positions] = arange
    index[positions[end] + 1] = n + arange[end]
    next_positions = positions + 1
    rows = branch.nonzero().squeeze(-1)
    if rows.numel():
        # each such row's sequence up to it, then its next step
        starts = start.nonzero().squeeze(-1)
        first = starts[start.long().cumsum(0)[rows] - 1]
        lengths = rows - first + 2
        offsets = lengths.cumsum(0) - lengths
        copy = torch.repeat_interleave(first - offsets, lengths) + torch.arange(
            int(lengths.sum()), device=device
        )
        ends = offsets + lengths - 1
        copy[ends] = n + rows
        index = torch.cat([index, copy])
        next_positions[rows] = num_main + ends
    return torch.cat([root, following], 0)[index], positions, next_positions


def _forward_next(
    module: TensorDictModuleBase,
    tensordict: TensorDictBase,
    next_td: TensorDictBase | None = None,
    *,
    mask_key: NestedKey | None = MASK_KEY,
) -> TensorDictBase:
    """Runs ``module`` on the next steps of ``tensordict``, each slice from its stored state.

    Args:
        module (TensorDictModuleBase): the network (parameters already in place).
        tensordict (TensorDictBase): the batch, with its ``"next"`` entry.
        next_td (TensorDictBase, optional): where to write the outputs. Defaults
            to ``tensordict["next"]``.

    Keyword Args:
        mask_key (NestedKey, optional): the padding mask of the batch, where
            the loss or the estimator reads it (see :func:`_shifted_input`).
            Defaults to ``("collector", "mask")``.

    Returns:
        ``next_td`` holding the module's outputs. Without a recurrent module in
        recurrent mode this is ``module(next_td)``.
    """
    if next_td is None:
        next_td = tensordict.get("next")
    if not _runs_recurrent(module):
        return module(next_td)
    _, next_out = _forward_shifted(module, tensordict, mask_key=mask_key)
    for key, value in next_out.items(True, True):
        if isinstance(key, tuple) and key[0] == "next":
            # the final recurrent states of the next-step pass
            continue
        next_td.set(key, value)
    return next_td


def _forward_shifted(
    module: TensorDictModuleBase,
    tensordict: TensorDictBase,
    *,
    mask_key: NestedKey | None = MASK_KEY,
) -> tuple[TensorDictBase, TensorDictBase]:
    """The outputs of a recurrent ``module`` at the current and at the next steps.

    One call over the input of :func:`_shifted_input`, with the parameters in
    place. The outputs at the current steps are those of ``module`` called on
    ``tensordict`` (on its real rows).

    Returns:
        the module's outputs at the current steps and at the next steps, both of
        the shape of ``tensordict``.
    """
    data_in, positions, next_positions = _shifted_input(
        tensordict, module, mask_key=mask_key
    )
    out = module(data_in)
    keys = [key for key in module.out_keys if key in out.keys(True, True)]
    out = out.select(*keys)
    current = out[positions].reshape(tensordict.shape)
    following = out[next_positions].reshape(tensordict.shape)
    return current, following


def _next_dist(
    actor: TensorDictModuleBase,
    tensordict: TensorDictBase,
    next_td: TensorDictBase,
    *,
    mask_key: NestedKey | None = MASK_KEY,
) -> torch.distributions.Distribution:
    """``actor.get_dist(next_td)``, each slice from its stored recurrent state.

    The distribution parameters are computed by :func:`_forward_next` (and
    written to ``next_td``), then the distribution is built from them.
    """
    if not _runs_recurrent(actor) or getattr(actor, "return_composite", False):
        return actor.get_dist(next_td)
    _forward_next(actor.det_part, tensordict, next_td, mask_key=mask_key)
    return actor.build_dist_from_params(next_td)

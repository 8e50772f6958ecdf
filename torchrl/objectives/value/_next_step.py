# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""The next-step pass of a recurrent network, one slice at a time.

Losses and value estimators evaluate their networks on ``tensordict["next"]``
to bootstrap. For a recurrent network under recurrent mode
(:class:`~torchrl.modules.LSTMModule`, :class:`~torchrl.modules.GRUModule`) a
plain call on ``"next"`` is wrong twice on a batch of several slices, such as a
flat :class:`~torchrl.data.SliceSampler` sample:

* ``("next", "is_init")`` marks no slice start, so each slice continues from
  the recurrent state at the end of the previous one;
* the recurrent states stored under ``"next"`` are overwritten by any earlier
  recurrent-mode pass over the current steps (it writes its final states
  there), so even a marked start would not begin from the stored state.

:func:`_forward_next` runs the network once over each slice extended by its
last ``"next"`` step, from the recurrent state stored at the slice's first
step (the one that the current-step pass starts from), and reads the next-step
outputs one row later: the output for ``("next", t)`` is the network's output
after the steps ``s..t`` of its slice and the next observation of ``t``. It is
what running every slice on its own gives, as R2D2-style learners unroll their
target network. Networks without a recurrent module in recurrent mode keep the
plain call on ``"next"``, unchanged.
"""
from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey

from torchrl.data.replay_buffers._slice_utils import BURN_IN_KEY, MASK_KEY
from torchrl.modules.tensordict_module.rnn import GRUModule, LSTMModule
from torchrl.objectives._mask import _content_rows

_INIT_KEY = "is_init"
# Entries of "next" that end a sequence in the layout (as in the single-call
# path of the value estimators).
_END_KEYS = ("done", "truncated")


def _runs_recurrent(module: torch.nn.Module | None) -> bool:
    """Whether ``module`` holds an LSTM/GRU module that runs in recurrent mode now."""
    if module is None:
        return False
    return any(
        isinstance(m, (LSTMModule, GRUModule)) and m.recurrent_mode
        for m in module.modules()
    )


def _shifted_input(
    data: TensorDictBase, in_keys: list[NestedKey]
) -> tuple[TensorDictBase, torch.Tensor]:
    """Each sequence of ``data`` followed by the ``"next"`` step of its last row.

    A sequence ends at the last step of every row of ``data`` (time is its last
    batch dimension), before every ``"is_init"`` and at every ``("next", "done")``
    or ``("next", "truncated")``, and before the padding of a
    ``("collector", "mask")``. The first step of every row is marked as a
    sequence start (``"is_init"`` is ``True`` there): a row of a collected
    ``[envs, time]`` batch that continues an episode starts from its stored
    recurrent state, not from the end of the row before it. The inserted rows
    are marked as continuing their sequence (``"is_init"`` is ``False`` there).
    The burn-in marker of a slice sampler with ``burn_in > 0`` is kept, so the
    burn-in rows that start a slice warm up its state without gradient in this
    pass as in the current-step one (the inserted rows are not burn-in rows).

    Returns:
        the interleaved (flat) input and the positions of the rows of
        ``data.reshape(-1)`` in it: the output for a row is at its position, the
        output for its next step one position later.
    """
    flat = data.reshape(-1)
    n = flat.shape[0]
    # the burn-in marker of a slice sampler: the next-step pass burns in too
    keys = list(in_keys)
    if flat.get(BURN_IN_KEY, None) is not None:
        keys.append(BURN_IN_KEY)
    root = flat.select(*keys, strict=False)
    next_td = flat.get("next")
    end = torch.zeros(data.shape, dtype=torch.bool, device=data.device)
    end[..., -1] = True
    end = end.reshape(-1)
    is_init = root.get(_INIT_KEY, None)
    if is_init is not None:
        # ``end`` is True at the last step of every row: the step after it
        # (and the very first one) starts a row.
        row_start = torch.cat([end.new_ones(1), end[:-1]])
        is_init = is_init | row_start.view(n, *(1,) * (is_init.ndim - 1))
        root.set(_INIT_KEY, is_init)
        end[:-1] |= is_init.reshape(n, -1).any(-1)[1:]
    for key in _END_KEYS:
        value = next_td.get(key, None)
        if value is not None:
            end |= value.reshape(n, -1).any(-1)
    mask = flat.get(MASK_KEY, None)
    if mask is not None:
        # a real step followed by padding ends its sequence, with or without
        # a slice-end marker
        real = _content_rows(flat, mask.reshape(n))
        end[:-1] |= real[:-1] & ~real[1:]
    # the next step of every sequence's last row, with the root's keys
    last_next = next_td[end]
    inserted = TensorDict(batch_size=last_next.batch_size, device=root.device)
    for key, value in root.items(True, True):
        inserted.set(
            key,
            last_next.get(key)
            if key in last_next.keys(True, True)
            else torch.zeros_like(value[end]),
        )
    if is_init is not None:
        inserted.set(_INIT_KEY, torch.zeros_like(is_init[end]))
    shift = end.cumsum(0) - end.long()
    positions = torch.arange(n, device=end.device) + shift
    order = torch.empty(n + inserted.shape[0], dtype=torch.long, device=end.device)
    order[positions] = torch.arange(n, device=end.device)
    order[positions[end] + 1] = torch.arange(
        n, n + inserted.shape[0], device=end.device
    )
    return torch.cat([root, inserted], 0)[order], positions


def _forward_next(
    module: TensorDictModuleBase,
    tensordict: TensorDictBase,
    next_td: TensorDictBase | None = None,
) -> TensorDictBase:
    """Runs ``module`` on the next steps of ``tensordict``, each slice from its stored state.

    Args:
        module (TensorDictModuleBase): the network (parameters already in place).
        tensordict (TensorDictBase): the batch, with its ``"next"`` entry.
        next_td (TensorDictBase, optional): where to write the outputs. Defaults
            to ``tensordict["next"]``.

    Returns:
        ``next_td`` holding the module's outputs. Without a recurrent module in
        recurrent mode this is ``module(next_td)``.
    """
    if next_td is None:
        next_td = tensordict.get("next")
    if not _runs_recurrent(module):
        return module(next_td)
    _, next_out = _forward_shifted(module, tensordict)
    for key, value in next_out.items(True, True):
        if isinstance(key, tuple) and key[0] == "next":
            # the final recurrent states of the next-step pass
            continue
        next_td.set(key, value)
    return next_td


def _forward_shifted(
    module: TensorDictModuleBase, tensordict: TensorDictBase
) -> tuple[TensorDictBase, TensorDictBase]:
    """The outputs of a recurrent ``module`` at the current and at the next steps.

    One call over every slice extended by its last next step (see
    :func:`_shifted_input`), with the parameters in place.

    Returns:
        the module's outputs at the current steps and at the next steps, both of
        the shape of ``tensordict``.
    """
    data_in, positions = _shifted_input(tensordict, module.in_keys)
    out = module(data_in)
    keys = [key for key in module.out_keys if key in out.keys(True, True)]
    out = out.select(*keys)
    current = out[positions].reshape(tensordict.shape)
    following = out[positions + 1].reshape(tensordict.shape)
    return current, following


def _next_dist(
    actor: TensorDictModuleBase,
    tensordict: TensorDictBase,
    next_td: TensorDictBase,
) -> torch.distributions.Distribution:
    """``actor.get_dist(next_td)``, each slice from its stored recurrent state.

    The distribution parameters are computed by :func:`_forward_next` (and
    written to ``next_td``), then the distribution is built from them.
    """
    if not _runs_recurrent(actor) or getattr(actor, "return_composite", False):
        return actor.get_dist(next_td)
    _forward_next(actor.det_part, tensordict, next_td)
    return actor.build_dist_from_params(next_td)

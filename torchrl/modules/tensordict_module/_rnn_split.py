# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Recurrent mode of :class:`~torchrl.modules.LSTMModule` and :class:`~torchrl.modules.GRUModule`.

A recurrent-mode batch is ``[*B, T]`` steps in which ``"is_init"`` marks where a
new slice (trajectory) starts; the first step of every row of ``T`` steps starts
a slice as well. :class:`_SliceSplit` computes the layout of the slices once
and every tensor the RNN sees or returns goes through the same indices:

- the RNN input is laid out as ``[S, L]`` by a zero-copy reshape when every
  slice has the same length ``L`` (the common
  :class:`~torchrl.data.SliceSampler` output), and zero-padded to
  ``[S, T_max]`` otherwise (packed instead, see :func:`_prefer_packed`, for
  a forward pass without gradients on CPU);
- the initial recurrent state is read only at the ``S`` slice starts;
- the outputs are put back in place with a single gather, and the final
  recurrent state of each slice as long as the longest one is written at its
  last step, zeros elsewhere.

Only the RNN input is padded: pristine 0.12.0 padded every entry, including
every stored recurrent state, and unpadded with boolean masks. With a
backward pass, the padded layout is faster than a
:class:`~torch.nn.utils.rnn.PackedSequence` for the torch RNN kernels, on CPU
(mkldnn) and on CUDA (cuDNN) alike, although it computes the padding; the
final state of the slices shorter than the longest one is not known after a
padded run and, as in 0.12.0, it is left at zero whatever the layout, so
that the result does not depend on the layout.
"""
from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torch import nn, Tensor
from torch.nn.utils.rnn import PackedSequence

from torchrl.data.replay_buffers._slice_utils import BURN_IN_KEY


class _SliceSplit:
    """The slices of a ``[B, T]`` recurrent-mode batch, computed once from ``is_init``.

    A slice starts at every ``True`` of ``is_init`` and at the first step of
    every row; slices tile the ``B * T`` flattened steps in order.

    Args:
        is_init (torch.Tensor): a boolean tensor of shape ``[B, T]``.
    """

    def __init__(self, is_init: Tensor) -> None:
        batch, steps = is_init.shape
        self.numel = numel = batch * steps
        device = is_init.device
        start_mask = is_init.to(torch.bool, copy=True)
        start_mask[:, 0] = True
        start_mask = start_mask.view(-1)
        starts = start_mask.nonzero().squeeze(-1)
        self.num_slices = num_slices = starts.numel()
        self.max_len = max_len = numel // num_slices
        self.dense = numel % num_slices == 0 and bool(
            start_mask.view(num_slices, max_len)[:, 0].all()
        )
        if self.dense:
            return
        self.starts = starts
        self.starts_cpu = starts = starts.cpu()
        self.lengths = lengths = torch.diff(starts, append=starts.new_full((1,), numel))
        self.max_len = max_len = int(lengths.max())
        # position of each step in the [S, max_len] zero-padded layout
        shift = torch.repeat_interleave(
            starts - torch.arange(num_slices) * max_len, lengths
        )
        self.padded_index = (torch.arange(numel) - shift).to(device)
        # the slices whose final state a padded run gives
        full = (lengths == max_len).nonzero().squeeze(-1)
        self.full = full.to(device)
        self.full_ends = (starts[full] + max_len - 1).to(device)

    def gather_starts(self, state: Tensor) -> Tensor:
        """Reads a ``[B * T, num_layers, H]`` state at the slice starts.

        Returns the ``[num_layers, S, H]`` initial state of the RNN.
        """
        if self.dense:
            state = state.unflatten(0, (self.num_slices, self.max_len))[:, 0]
        else:
            state = state.index_select(0, self.starts)
        return state.transpose(0, 1).contiguous()

    def pad(self, value: Tensor) -> Tensor:
        """Lays out a ``[B * T, F]`` input as ``[S, T_max, F]`` (a view if the slices have equal lengths)."""
        if self.dense:
            return value.unflatten(0, (self.num_slices, self.max_len))
        padded = value.new_zeros(self.num_slices * self.max_len, *value.shape[1:])
        padded.index_copy_(0, self.padded_index, value)
        return padded.unflatten(0, (self.num_slices, self.max_len))

    def pack(self, value: Tensor) -> PackedSequence:
        """Lays out a ``[B * T, F]`` input of variable-length slices as a :class:`~torch.nn.utils.rnn.PackedSequence`."""
        device = value.device
        order = torch.sort(self.lengths, descending=True, stable=True).indices
        steps = torch.arange(self.max_len).unsqueeze(1)
        # time-major: at step t, the slices longer than t, longest first
        valid = steps < self.lengths[order]
        index = (steps + self.starts_cpu[order])[valid]
        inverse = torch.empty_like(index)
        inverse[index] = torch.arange(self.numel)
        self.packed_inverse = inverse.to(device)
        unsorted = torch.empty_like(order)
        unsorted[order] = torch.arange(self.num_slices)
        return PackedSequence(
            value.index_select(0, index.to(device)),
            valid.sum(1),
            order.to(device),
            unsorted.to(device),
        )

    def unpad(self, output: Tensor | PackedSequence) -> Tensor:
        """Inverse of :meth:`pad` and :meth:`pack`: returns the ``[B * T, H]`` output."""
        if isinstance(output, PackedSequence):
            return output.data.index_select(0, self.packed_inverse)
        output = output.flatten(0, 1)
        if self.dense:
            return output
        return output.index_select(0, self.padded_index)

    def scatter_final(self, state: Tensor) -> Tensor:
        """Writes a ``[num_layers, S, H]`` final state at the last step of the slices.

        Only the slices as long as the longest one are written (all of them if
        the lengths are equal). Returns a ``[B * T, num_layers, H]`` tensor,
        zero elsewhere.
        """
        state = state.transpose(0, 1)
        if self.dense:
            out = state.new_zeros(self.num_slices, self.max_len, *state.shape[1:])
            out[:, -1] = state
            return out.flatten(0, 1)
        out = state.new_zeros(self.numel, *state.shape[1:])
        return out.index_copy_(0, self.full_ends, state.index_select(0, self.full))


def _prefer_packed(rnn: nn.Module, value: Tensor) -> bool:
    """Whether to run variable-length slices as a packed sequence rather than padded.

    Measured with ``benchmarks/recurrent_mode.py`` (torch 2.13): without
    gradients on CPU, the packed kernels of :class:`torch.nn.GRU` run about
    1.6x faster than the padded ones (the padding is computed) and those of
    :class:`torch.nn.LSTM` about as fast; with a backward pass, or on CUDA,
    the padded kernels are faster. The python-based RNNs take no packed input.
    """
    return (
        not torch.is_grad_enabled()
        and value.device.type == "cpu"
        and isinstance(rnn, (nn.LSTM, nn.GRU))
    )


def _recurrent_forward(
    module: nn.Module, rnn: nn.Module, tensordict: TensorDictBase
) -> TensorDictBase:
    """Recurrent-mode forward of an :class:`~torchrl.modules.LSTMModule` or :class:`~torchrl.modules.GRUModule`.

    Args:
        module: the LSTMModule or GRUModule (provides ``in_keys``/``out_keys``).
        rnn: its RNN (``module.lstm`` or ``module.gru``).
        tensordict: the input, of batch size ``[*B, T]``.

    Returns:
        the tensordict, with the output and the final recurrent states written.
    """
    num_states = len(module.out_keys) - 1
    value = tensordict.get(module.in_keys[0])
    states = [tensordict.get(key, None) for key in module.in_keys[1 : 1 + num_states]]
    if any(state is None for state in states) and not all(
        state is None for state in states
    ):
        raise RuntimeError(
            f"Got recurrent states {module.in_keys[1:1 + num_states]} with types "
            f"{[type(state) for state in states]}: either all or none of them must be "
            "present in the input tensordict."
        )
    batch_shape = value.shape[:-1]
    steps = batch_shape[-1] if batch_shape else 1
    numel = batch_shape.numel()
    if numel == 0:
        raise ValueError(
            f"{type(module).__name__} got an empty batch of size {tuple(batch_shape)} "
            "in recurrent mode: pass at least one step."
        )
    is_init = tensordict.get("is_init").reshape(numel // steps, steps)
    value = value.reshape(numel, value.shape[-1])
    if states[0] is not None:
        states = [state.reshape(numel, *state.shape[-2:]) for state in states]
    burn_in = tensordict.get(BURN_IN_KEY, None)
    if burn_in is not None and burn_in.any():
        output, final = _burn_in_run(rnn, value, is_init, states, burn_in)
    else:
        output, final = _run(rnn, value, is_init, states)
    tensordict.set(module.out_keys[0], output.reshape(*batch_shape, -1))
    for key, state in zip(module.out_keys[1:], final):
        tensordict.set(key, state.reshape(*batch_shape, *state.shape[1:]))
    return tensordict


def _run(
    rnn: nn.Module,
    value: Tensor,
    is_init: Tensor,
    states: list[Tensor | None],
    hx: tuple[Tensor, ...] | None = None,
) -> tuple[Tensor, list[Tensor]]:
    """Runs ``rnn`` over the slices of ``[N, F]`` steps that ``is_init`` (``[B, T]``) delimits.

    Each slice starts from the ``[N, num_layers, H]`` states stored at its
    first step, or from ``hx`` (``[num_layers, S, H]`` each) if given.

    Returns:
        the ``[N, H]`` output and the final states (``[N, num_layers, H]`` each,
        written at the last step of the slices).
    """
    split = _SliceSplit(is_init)
    if hx is None and states[0] is not None:
        hx = tuple(split.gather_starts(state) for state in states)
    if hx is not None and len(hx) == 1:
        hx = hx[0]
    if not split.dense and _prefer_packed(rnn, value):
        rnn_input = split.pack(value)
    else:
        rnn_input = split.pad(value)
    output, final = rnn(rnn_input, hx)
    if not isinstance(final, tuple):
        final = (final,)
    return split.unpad(output), [split.scatter_final(state) for state in final]


def _dense_burn_in_run(
    rnn: nn.Module,
    value: Tensor,
    split: _SliceSplit,
    states: list[Tensor | None],
    num_burn: int,
) -> tuple[Tensor, list[Tensor]]:
    """:func:`_burn_in_run` for ``[S, L]`` slices that all start with ``num_burn`` burn-in rows."""
    steps = value.unflatten(0, (split.num_slices, split.max_len))
    hx = None
    if states[0] is not None:
        hx = tuple(split.gather_starts(state) for state in states)
        hx = hx[0] if len(hx) == 1 else hx
    with torch.no_grad():
        warm_out, hx = rnn(steps[:, :num_burn], hx)
    output, final = rnn(steps[:, num_burn:], hx)
    if not isinstance(final, tuple):
        final = (final,)
    output = torch.cat([warm_out, output], 1).flatten(0, 1)
    return output, [split.scatter_final(state) for state in final]


def _burn_in_run(
    rnn: nn.Module,
    value: Tensor,
    is_init: Tensor,
    states: list[Tensor | None],
    burn_in: Tensor,
) -> tuple[Tensor, list[Tensor]]:
    """:func:`_run` when ``burn_in`` (``[N]``) marks a burn-in prefix of some slices.

    The burn-in rows of each slice run without gradient from the state stored
    at the slice start; the other rows run from the final (detached) state of
    the burn-in prefix, or from the stored state when the slice has none. It
    gives the result of running each prefix under :func:`torch.no_grad` and
    feeding its final state as the initial state of the rest of the slice.
    """
    numel = value.shape[0]
    device = value.device
    burn_in = burn_in.reshape(numel).to(device=device, dtype=torch.bool)
    start = is_init.to(torch.bool, copy=True)
    start[:, 0] = True
    start = start.reshape(numel).to(device)
    after_burn_in = torch.zeros_like(burn_in)
    after_burn_in[1:] = burn_in[:-1] & ~start[1:]
    if (burn_in & ~start & ~after_burn_in).any():
        raise ValueError(
            f"The burn-in rows ({BURN_IN_KEY!r}) must be the first rows of their "
            "slice: a slice starts at every 'is_init' and its burn-in rows run "
            "without gradient to warm up the state of the rows after them. Pass "
            "the sample of a slice sampler with burn_in=k as it is, or drop "
            f"{BURN_IN_KEY!r}."
        )
    split = _SliceSplit(is_init)
    if split.dense:
        # equal-length slices with equal burn-in: views, as the bare RNN takes them
        burn_2d = burn_in.view(split.num_slices, split.max_len)
        num_burn = int(burn_2d[0].sum())
        if bool((burn_2d == burn_2d[0]).all()) and num_burn < split.max_len:
            return _dense_burn_in_run(rnn, value, split, states, num_burn)
    train_start = ~burn_in & (start | after_burn_in)
    burn_rows = burn_in.nonzero().squeeze(-1)
    train_rows = (~burn_in).nonzero().squeeze(-1)
    # the burn-in prefixes, as slices of their own
    prefix_start = start[burn_rows]
    prefix_id = prefix_start.long().cumsum(0) - 1
    lengths = torch.bincount(prefix_id)
    begin = burn_rows[prefix_start]
    # allocated from the first run: the output size is not always hidden_size
    # (an LSTM's proj_size)
    output = None
    with torch.no_grad():
        prefix_final = None
        for length in lengths.unique().tolist():
            which = (lengths == length).nonzero().squeeze(-1)
            rows = begin[which].unsqueeze(-1) + torch.arange(length, device=device)
            hx = None
            if states[0] is not None:
                hx = tuple(
                    state[begin[which]].transpose(0, 1).contiguous() for state in states
                )
                hx = hx[0] if len(hx) == 1 else hx
            out, final = rnn(value[rows], hx)
            final = final if isinstance(final, tuple) else (final,)
            if output is None:
                output = out.new_empty(numel, out.shape[-1])
            output[rows.reshape(-1)] = out.reshape(-1, out.shape[-1])
            if prefix_final is None:
                prefix_final = [
                    f.new_empty(f.shape[0], lengths.numel(), *f.shape[2:])
                    for f in final
                ]
            for dest, f in zip(prefix_final, final):
                dest[:, which] = f
    # the training part: each slice from its burn-in's final state, if any
    train_starts = train_start[train_rows]
    first = train_rows[train_starts]
    hx = None
    if states[0] is not None:
        hx = [state[first].transpose(0, 1) for state in states]
    warmed = after_burn_in[first]
    if warmed.any():
        # the prefix that ends right before each warmed-up slice
        prefix_of_row = torch.full((numel,), -1, dtype=torch.long, device=device)
        prefix_of_row[burn_rows] = prefix_id
        which = prefix_of_row[first[warmed] - 1]
        if hx is None:
            hx = [
                f.new_zeros(f.shape[0], first.numel(), *f.shape[2:])
                for f in prefix_final
            ]
        hx = [h.clone() for h in hx]
        for h, f in zip(hx, prefix_final):
            h[:, warmed] = f[:, which]
    hx = None if hx is None else tuple(h.contiguous() for h in hx)
    train_out, train_final = _run(
        rnn,
        value[train_rows],
        train_starts.unsqueeze(0),
        [None],
        hx=hx,
    )
    output = output.index_copy(0, train_rows, train_out)
    final = [
        f.new_zeros(numel, *f.shape[1:]).index_copy_(0, train_rows, f)
        for f in train_final
    ]
    return output, final

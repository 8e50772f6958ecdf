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
    split = _SliceSplit(tensordict.get("is_init").reshape(numel // steps, steps))

    if states[0] is None:
        hx = None
    else:
        hx = tuple(
            split.gather_starts(state.reshape(numel, *state.shape[-2:]))
            for state in states
        )
        if num_states == 1:
            hx = hx[0]
    value = value.reshape(numel, value.shape[-1])
    if not split.dense and _prefer_packed(rnn, value):
        rnn_input = split.pack(value)
    else:
        rnn_input = split.pad(value)
    output, final = rnn(rnn_input, hx)
    if num_states == 1:
        final = (final,)
    tensordict.set(module.out_keys[0], split.unpad(output).reshape(*batch_shape, -1))
    for key, state in zip(module.out_keys[1:], final):
        state = split.scatter_final(state)
        tensordict.set(key, state.reshape(*batch_shape, *state.shape[1:]))
    return tensordict

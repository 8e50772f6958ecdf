# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Recurrent mode of :class:`~torchrl.modules.LSTMModule` and :class:`~torchrl.modules.GRUModule`.

A recurrent-mode batch is ``[*B, T]`` steps in which ``"is_init"`` marks where a
new slice (trajectory) starts; the start of every row of ``T`` steps is a slice
start as well. :class:`_SliceSplit` computes the layout of the slices once and
every tensor the RNN sees or returns goes through the same indices:

- the RNN input is laid out as ``[S, L]`` by a zero-copy reshape when every
  slice has the same length ``L`` (the common
  :class:`~torchrl.data.SliceSampler` output), as a
  :class:`~torch.nn.utils.rnn.PackedSequence` built with a single gather when
  the lengths differ and the RNN is a :class:`torch.nn.LSTM` or
  :class:`torch.nn.GRU` or a python-based :class:`~torchrl.modules.LSTM` or
  :class:`~torchrl.modules.GRU` (see :func:`_python_packed_forward`), or
  zero-padded to ``[S, T_max]`` for any other RNN;
- the initial recurrent state is read only at the ``S`` slice starts;
- the outputs are put back in place with a single gather, and the final
  recurrent state of each slice is written at its last step (zeros elsewhere).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
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
        self.numel = batch * steps
        self.device = is_init.device
        start_mask = is_init.to(torch.bool, copy=True)
        start_mask[:, 0] = True
        starts = start_mask.reshape(-1).nonzero().squeeze(-1)
        self.num_slices = num_slices = starts.numel()
        starts_cpu = starts.cpu()
        self.lengths = lengths = torch.diff(
            starts_cpu, append=starts_cpu.new_full((1,), self.numel)
        )
        self.max_len = max_len = int(lengths.max())
        self.dense = max_len * num_slices == self.numel
        self.starts = starts
        self.ends = starts + lengths.to(self.device) - 1
        self._packed = None
        self._padded = None

    def gather_starts(self, state: Tensor) -> Tensor:
        """Reads a ``[B * T, *S]`` recurrent state at the slice starts, returns ``[num_layers, S, H]``."""
        if self.dense:
            state = state.unflatten(0, (self.num_slices, self.max_len))[:, 0]
        else:
            state = state.index_select(0, self.starts)
        return state.transpose(0, 1).contiguous()

    def scatter_final(self, state: Tensor, full_length_only: bool = False) -> Tensor:
        """Writes a ``[num_layers, S, H]`` final state at the last step of each slice, zeros elsewhere.

        If ``full_length_only`` is ``True``, only the slices as long as the
        longest one are written. Returns a ``[B * T, num_layers, H]`` tensor.
        """
        state = state.transpose(0, 1)
        out = state.new_zeros(self.numel, *state.shape[1:])
        ends = self.ends
        if full_length_only:
            full = (self.lengths == self.max_len).nonzero().squeeze(-1)
            full = full.to(self.device, non_blocking=True)
            ends = ends.index_select(0, full)
            state = state.index_select(0, full)
        return out.index_copy_(0, ends, state)

    def _packed_indices(self):
        if self._packed is None:
            lengths = self.lengths
            order = torch.sort(lengths, descending=True, stable=True).indices
            sorted_lengths = lengths[order]
            # time-major layout of a PackedSequence: at step t, the slices
            # longer than t, longest first
            valid = torch.arange(self.max_len).unsqueeze(1) < sorted_lengths
            batch_sizes = valid.sum(1)
            starts = self.starts.cpu()[order]
            index = (torch.arange(self.max_len).unsqueeze(1) + starts)[valid]
            inverse = torch.empty_like(index)
            inverse[index] = torch.arange(self.numel)
            unsorted = torch.empty_like(order)
            unsorted[order] = torch.arange(self.num_slices)
            self._packed = (
                index.to(self.device, non_blocking=True),
                inverse.to(self.device, non_blocking=True),
                batch_sizes,
                order.to(self.device, non_blocking=True),
                unsorted.to(self.device, non_blocking=True),
            )
        return self._packed

    def _padded_index(self) -> Tensor:
        if self._padded is None:
            # position of each step in a [S, max_len] zero-padded layout
            shift = self.starts.cpu() - torch.arange(self.num_slices) * self.max_len
            shift = torch.repeat_interleave(shift, self.lengths)
            self._padded = (torch.arange(self.numel) - shift).to(
                self.device, non_blocking=True
            )
        return self._padded

    def pack(self, value: Tensor, packed: bool) -> Tensor | PackedSequence:
        """Lays out a ``[B * T, F]`` input for the RNN.

        Returns ``[S, L, F]`` (a view) for equal-length slices, a
        :class:`~torch.nn.utils.rnn.PackedSequence` if ``packed`` is ``True``
        and a zero-padded ``[S, T_max, F]`` tensor otherwise.
        """
        if self.dense:
            return value.unflatten(0, (self.num_slices, self.max_len))
        if packed:
            index, _, batch_sizes, order, unsorted = self._packed_indices()
            return PackedSequence(
                value.index_select(0, index), batch_sizes, order, unsorted
            )
        padded = value.new_zeros(self.num_slices * self.max_len, *value.shape[1:])
        padded.index_copy_(0, self._padded_index(), value)
        return padded.unflatten(0, (self.num_slices, self.max_len))

    def unpack(self, output: Tensor | PackedSequence) -> Tensor:
        """Inverse of :meth:`pack`: returns the ``[B * T, H]`` output."""
        if self.dense:
            return output.flatten(0, 1)
        if isinstance(output, PackedSequence):
            return output.data.index_select(0, self._packed_indices()[1])
        return output.flatten(0, 1).index_select(0, self._padded_index())


def _python_packed_forward(
    rnn: nn.Module, input: PackedSequence, hx: Tensor | tuple[Tensor, Tensor] | None
) -> tuple[PackedSequence, Tensor | tuple[Tensor, Tensor]]:
    """Runs a python-based :class:`~torchrl.modules.LSTM` or :class:`~torchrl.modules.GRU` on a packed sequence.

    Same semantics as :class:`torch.nn.LSTM` and :class:`torch.nn.GRU` on a
    :class:`~torch.nn.utils.rnn.PackedSequence`: at step ``t`` only the
    ``batch_sizes[t]`` sequences still running are computed, and the final
    state of each sequence is the state after its own last step.

    Args:
        rnn: the python-based LSTM or GRU.
        input: the packed input.
        hx: the initial state(s), ``[num_layers, S, H]`` in the order of the
            sequences (not sorted), or ``None`` for zeros.

    Returns:
        the packed output and the final state(s), ``[num_layers, S, H]`` in
        the order of the sequences.
    """
    lstm = hasattr(rnn, "_lstm_cell")
    data, batch_sizes, sorted_indices, unsorted_indices = input
    sizes = batch_sizes.tolist()
    num_layers = rnn.num_layers
    if hx is None:
        zeros = data.new_zeros(num_layers, sizes[0], rnn.hidden_size)
        hx = (zeros, zeros) if lstm else zeros
    states = tuple(hx) if lstm else (hx,)
    if sorted_indices is not None:
        states = tuple(state.index_select(1, sorted_indices) for state in states)
    weights = []
    for names in rnn._all_weights:
        weight_ih, weight_hh = getattr(rnn, names[0]), getattr(rnn, names[1])
        if rnn.bias:
            bias_ih, bias_hh = getattr(rnn, names[2]), getattr(rnn, names[3])
        else:
            bias_ih = bias_hh = None
        weights.append((weight_ih, bias_ih, weight_hh, bias_hh))
    cell = rnn._lstm_cell if lstm else rnn._gru_cell
    # running[layer] = the states of the sequences still running
    running = [[state[layer] for state in states] for layer in range(num_layers)]
    # done[layer] = the final states of the sequences that ended, last first
    done = [[] for _ in range(num_layers)]
    outputs = []
    offset = 0
    for size in sizes:
        x = data[offset : offset + size]
        offset += size
        for layer in range(num_layers):
            current = running[layer]
            if size < current[0].shape[0]:
                done[layer].append([state[size:] for state in current])
                current = [state[:size] for state in current]
            current = cell(x, *current, *weights[layer])
            current = list(current) if lstm else [current]
            running[layer] = current
            x = current[0]
            if layer < num_layers - 1 and rnn.dropout:
                x = F.dropout(x, p=rnn.dropout, training=rnn.training)
        outputs.append(x)
    finals = []
    for i in range(len(states)):
        final = torch.stack(
            [
                torch.cat(
                    [running[layer][i]] + [ended[i] for ended in reversed(done[layer])]
                )
                for layer in range(num_layers)
            ]
        )
        if unsorted_indices is not None:
            final = final.index_select(1, unsorted_indices)
        finals.append(final)
    output = PackedSequence(
        torch.cat(outputs), batch_sizes, sorted_indices, unsorted_indices
    )
    return output, tuple(finals) if lstm else finals[0]


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
    is_init = tensordict.get("is_init").reshape(numel // steps, steps)
    split = _SliceSplit(is_init)

    from torchrl.modules.tensordict_module.rnn import GRU, LSTM

    packed = isinstance(rnn, (nn.LSTM, nn.GRU, LSTM, GRU))
    rnn_input = split.pack(value.reshape(numel, value.shape[-1]), packed)
    if states[0] is None:
        hx = None
    else:
        hx = tuple(
            split.gather_starts(state.reshape(numel, *state.shape[-2:]))
            for state in states
        )
        if num_states == 1:
            hx = hx[0]
    output, final = rnn(rnn_input, hx)
    if num_states == 1:
        final = (final,)
    output = split.unpack(output)
    # a zero-padded run goes on past the end of the shorter slices: their final
    # state is not known and is left at zero, as in torchrl 0.12.0
    full_length_only = not split.dense and not isinstance(rnn_input, PackedSequence)
    tensordict.set(module.out_keys[0], output.reshape(*batch_shape, -1))
    for key, state in zip(module.out_keys[1:], final):
        state = split.scatter_final(state, full_length_only)
        tensordict.set(key, state.reshape(*batch_shape, *state.shape[1:]))
    return tensordict

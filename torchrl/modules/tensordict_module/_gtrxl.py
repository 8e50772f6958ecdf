# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""A gated Transformer-XL memory for recurrent RL on TorchRL's flat slice layout.

:class:`GTrXLModule` follows Parisotto et al. (2019), "Stabilizing Transformers
for Reinforcement Learning": Transformer-XL recurrence over a memory of the
past inputs of every layer, layer norm before the attention and the MLP
("identity map reordering"), and GRU-type gates in place of the residual
connections. Its recurrent state, stored by the collector like an LSTM's, is
that memory: for each layer the last ``memory_len`` inputs of the layer and
how many of them belong to the current episode.

The same function computes both modes. A collection step is a slice of one
step; a recurrent-mode sample holds slices of many steps (they start at every
``"is_init"`` and at the first step of every row), each of which attends to
the memory stored at its first row and to its own earlier steps, with the
window of ``memory_len`` earlier steps and the position bias of each step
exactly as in step-by-step collection. A ``[envs, T]`` batch whose episodes
end inside its rows (a collected batch) runs each row as one slice instead,
its inner slices kept apart by the attention mask, unless an inner slice
starts from stored memory (the collector stores none at an episode start):
the same result, without padding the slices and with less attention.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from tensordict import TensorDictBase
from tensordict.nn import dispatch, TensorDictModuleBase as ModuleBase
from tensordict.utils import NestedKey, unravel_key, unravel_key_list
from torch import nn, Tensor

from torchrl.data.replay_buffers._slice_utils import BURN_IN_KEY, MASK_KEY
from torchrl.modules.tensordict_module._rnn_split import _SliceSplit
from torchrl.modules.tensordict_module.rnn import recurrent_mode

__all__ = ["GTrXLModule"]


class _GRUGate(nn.Module):
    """The GRU-type gate of GTrXL, in place of a residual connection ``x + y``.

    ``r = σ(W_r y + U_r x)``, ``z = σ(W_z y + U_z x - b_g)``,
    ``ĥ = tanh(W_g y + U_g (r ⊙ x))`` and the output is
    ``(1 - z) ⊙ x + z ⊙ ĥ``. A positive ``b_g`` makes the gate start close to
    the identity on ``x`` (the paper's initialisation).
    """

    def __init__(self, dim: int, bias: float, device=None) -> None:
        super().__init__()
        self.w = nn.Linear(dim, 3 * dim, bias=False, device=device)
        self.u = nn.Linear(dim, 2 * dim, bias=False, device=device)
        self.u_g = nn.Linear(dim, dim, bias=False, device=device)
        self.bias = nn.Parameter(torch.full((dim,), float(bias), device=device))

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        w_r, w_z, w_g = self.w(y).chunk(3, -1)
        u_r, u_z = self.u(x).chunk(2, -1)
        r = torch.sigmoid(w_r + u_r)
        z = torch.sigmoid(w_z + u_z - self.bias)
        h = torch.tanh(w_g + self.u_g(r * x))
        return torch.lerp(x, h, z)


class _GTrXLLayer(nn.Module):
    """One GTrXL layer: gated, pre-norm relative multi-head attention, then a gated, pre-norm MLP."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        mlp_dim: int,
        memory_len: int,
        dropout: float,
        gate_bias: float,
        device=None,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.dropout = dropout
        self.norm_attn = nn.LayerNorm(embed_dim, device=device)
        self.query = nn.Linear(embed_dim, embed_dim, device=device)
        self.key_value = nn.Linear(embed_dim, 2 * embed_dim, device=device)
        self.proj = nn.Linear(embed_dim, embed_dim, device=device)
        # a learned bias per head and distance 0..memory_len (relative positions)
        self.position_bias = nn.Parameter(
            torch.zeros(num_heads, memory_len + 1, device=device)
        )
        self.gate_attn = _GRUGate(embed_dim, gate_bias, device=device)
        self.norm_mlp = nn.LayerNorm(embed_dim, device=device)
        self.mlp = nn.Sequential(
            nn.Linear(embed_dim, mlp_dim, device=device),
            nn.ReLU(),
            nn.Linear(mlp_dim, embed_dim, device=device),
        )
        self.gate_mlp = _GRUGate(embed_dim, gate_bias, device=device)

    def forward(
        self, x: Tensor, memory: Tensor, distance: Tensor, mask: Tensor
    ) -> Tensor:
        """Runs the layer on ``S`` slices of ``T`` steps.

        Args:
            x: the ``[S, T, D]`` layer input.
            memory: the ``[S, M, D]`` memory of the layer.
            distance: ``[M + T, T]``, from each key (the memory entries, then
                the steps) to each step, clamped to ``0..M``.
            mask: ``[S, 1, M + T, T]``, 0 where a step attends to a key and
                ``-inf`` elsewhere.
        """
        batch, steps, dim = x.shape
        heads, head_dim = self.num_heads, dim // self.num_heads
        normed = self.norm_attn(torch.cat([memory, x], 1))
        query = self.query(normed[:, -steps:])
        key, value = self.key_value(normed).chunk(2, -1)

        def split(t: Tensor) -> Tensor:
            # [S, K, D] -> [S * heads, K, D // heads]
            return t.unflatten(-1, (heads, head_dim)).transpose(1, 2).flatten(0, 1)

        # softmax(q k^T / sqrt(d) + position bias + mask) v, written out with
        # the logits transposed, [S * heads, M + T, T]: the bias is added inside
        # the batched product, and no product (forward or gradient) but one has
        # the few channels of a head as its columns, which MKL's batched gemm
        # runs several times slower than the transpose. Fewer passes over the
        # logits than scaled_dot_product_attention with the same float mask
        # (benchmarks/transformer_memory.py times both).
        bias = (self.position_bias[:, distance] + mask).flatten(0, 1)
        logits = torch.baddbmm(
            bias, split(key), split(query).transpose(1, 2), alpha=head_dim**-0.5
        )
        weights = F.dropout(torch.softmax(logits, 1), self.dropout, self.training)
        attended = torch.bmm(split(value).transpose(1, 2), weights)
        attended = attended.unflatten(0, (batch, heads)).flatten(1, 2)
        attended = self.proj(attended.transpose(1, 2))
        x = self.gate_attn(x, F.relu(attended))
        return self.gate_mlp(x, F.relu(self.mlp(self.norm_mlp(x))))


class GTrXLModule(ModuleBase):
    """A gated Transformer-XL (GTrXL) memory for recurrent policies and critics.

    Parisotto et al. (2019), `Stabilizing Transformers for Reinforcement
    Learning <https://arxiv.org/abs/1910.06764>`_: each layer attends over a
    memory of its own past inputs (Transformer-XL recurrence, without
    gradient into the stored memory), normalises before the attention and the
    MLP, and combines each with its input through a GRU-type gate whose bias
    makes it start as the identity. Positions are relative: each layer learns
    one bias per head and distance ``0..memory_len`` (a simplification of
    Transformer-XL's sinusoidal relative encoding), so a step sees the same
    logits whether it runs alone or inside a slice.

    The module's recurrent state is the memory, stored by the collector like
    an :class:`~torchrl.modules.LSTMModule`'s hidden state:

    * ``in_keys[1]`` (default ``"recurrent_state_memory"``), of shape
      ``[*batch, num_layers, memory_len, embed_dim]``: for each layer its last
      ``memory_len`` inputs, the most recent last;
    * ``in_keys[2]`` (default ``"recurrent_state_memory_count"``), an
      ``int64`` tensor of shape ``[*batch, 1]``: how many of them (the most
      recent ones) belong to the current episode.

    Like the RNN modules it reads ``"is_init"`` and runs in one of two modes:

    * **step by step** (recurrent mode off, collection): a step
      ``[*batch, input_size]`` attends over the valid memory and itself; the
      output goes to ``out_keys[0]`` and the memory rolled by one step to
      ``out_keys[1:]`` (default ``("next", <memory keys>)``), which the
      collector carries to the next step. At ``"is_init"`` the memory is
      emptied first: nothing is attended across an episode start.
    * **recurrent mode** (:class:`~torchrl.modules.set_recurrent_mode`,
      training) on a ``[*B, T]`` batch, or a flat ``[N]``
      :class:`~torchrl.data.SliceSampler` sample: a slice starts at every
      ``"is_init"`` and at the first step of every row, and all its steps run
      at once: each attends to the memory stored at the slice's first row
      (its count is 0 at an episode start; no memory is attended when none is
      stored) and to the slice's own earlier steps, at most ``memory_len``
      steps back. Padding rows (``False`` in ``mask_key``, the slice
      samplers' ``("collector", "mask")``, and not burn-in rows) are never
      attended.
      Whenever the sample carries the stored memory, the outputs equal those
      of step-by-step collection at the same steps. The rows that a slice
      sampler with ``burn_in=k`` marks in ``("collector", "burn_in")`` start
      their slice; they run without gradient and are attended as memory by
      the rows after them. Only the output is written in this mode (the
      memory of every step is what collection stores).

    See :ref:`data-layout` ("Transformer memory") for storing the memory in a
    replay buffer or rebuilding it from burn-in.

    Args:
        input_size (int): the size of the input's last dimension.
        embed_dim (int): the width of the transformer, and of its output.

    Keyword Args:
        num_layers (int, optional): the number of layers. Defaults to ``2``.
        num_heads (int, optional): attention heads per layer; must divide
            ``embed_dim``. Defaults to ``4``.
        memory_len (int, optional): how many earlier steps each step attends to
            at most (and the memory stored per layer). Defaults to ``32``.
        mlp_dim (int, optional): hidden width of each layer's MLP. Defaults to
            ``4 * embed_dim``.
        dropout (float, optional): attention dropout in training. Defaults to
            ``0.0``.
        gate_bias (float, optional): the initial bias ``b_g`` of the gates.
            Defaults to ``2.0``, the paper's choice.
        in_key (NestedKey, optional): the input key, with the default memory
            keys. Exclusive with ``in_keys``.
        in_keys (list of NestedKey, optional): the input, the memory and the
            memory count keys (``"is_init"`` is appended).
        out_key (NestedKey, optional): the output key, with the default memory
            keys under ``"next"``. Exclusive with ``out_keys``.
        out_keys (list of NestedKey, optional): the output, the next memory and
            the next memory count keys.
        mask_key (NestedKey, optional): the padding mask read in recurrent mode
            when it is present. Defaults to ``("collector", "mask")``.
        device (torch.device, optional): the device of the parameters.
        default_recurrent_mode (bool, optional): the mode when no
            :class:`~torchrl.modules.set_recurrent_mode` is active. Defaults
            to ``False``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.modules import GTrXLModule, set_recurrent_mode
        >>> gtrxl = GTrXLModule(3, 16, num_layers=1, num_heads=2, memory_len=4,
        ...     in_key="observation", out_key="embed")
        >>> step = TensorDict({"observation": torch.randn(5, 3),
        ...     "is_init": torch.ones(5, 1, dtype=torch.bool)}, [5])
        >>> gtrxl(step)["next", "recurrent_state_memory"].shape
        torch.Size([5, 1, 4, 16])
        >>> sample = TensorDict({"observation": torch.randn(10, 3),
        ...     "is_init": torch.arange(10).unsqueeze(-1) % 5 == 0}, [10])
        >>> with set_recurrent_mode(True):
        ...     gtrxl(sample)["embed"].shape
        torch.Size([10, 16])
    """

    DEFAULT_IN_KEYS = ["recurrent_state_memory", "recurrent_state_memory_count"]
    DEFAULT_OUT_KEYS = [
        ("next", "recurrent_state_memory"),
        ("next", "recurrent_state_memory_count"),
    ]
    init_key = "is_init"

    def __init__(
        self,
        input_size: int,
        embed_dim: int,
        *,
        num_layers: int = 2,
        num_heads: int = 4,
        memory_len: int = 32,
        mlp_dim: int | None = None,
        dropout: float = 0.0,
        gate_bias: float = 2.0,
        in_key: NestedKey | None = None,
        in_keys: list[NestedKey] | None = None,
        out_key: NestedKey | None = None,
        out_keys: list[NestedKey] | None = None,
        mask_key: NestedKey = MASK_KEY,
        device: torch.device | None = None,
        default_recurrent_mode: bool | None = None,
    ) -> None:
        super().__init__()
        for name, value in (
            ("input_size", input_size),
            ("embed_dim", embed_dim),
            ("num_layers", num_layers),
            ("num_heads", num_heads),
        ):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if not isinstance(memory_len, int) or memory_len < 1:
            raise ValueError(
                f"memory_len must be an integer >= 1 (how many earlier steps each "
                f"step attends to), got {memory_len!r}. A transformer without "
                "memory sees the current step only: use an MLP for that."
            )
        if embed_dim % num_heads:
            raise ValueError(
                f"embed_dim ({embed_dim}) must be divisible by num_heads "
                f"({num_heads}): each head gets embed_dim // num_heads channels. "
                "Change one of them, e.g. num_heads="
                f"{math.gcd(embed_dim, num_heads)}."
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}.")
        if (in_key is None) == (in_keys is None):
            raise ValueError(
                f"Pass exactly one of in_key and in_keys, got in_key={in_key!r} "
                f"and in_keys={in_keys!r}."
            )
        if (out_key is None) == (out_keys is None):
            raise ValueError(
                f"Pass exactly one of out_key and out_keys, got out_key={out_key!r} "
                f"and out_keys={out_keys!r}."
            )
        if in_key is not None:
            in_keys = [in_key, *self.DEFAULT_IN_KEYS]
        if out_key is not None:
            out_keys = [out_key, *self.DEFAULT_OUT_KEYS]
        in_keys = unravel_key_list(list(in_keys))
        out_keys = unravel_key_list(list(out_keys))
        if in_keys[-1] == "is_init":
            in_keys = in_keys[:-1]
        if len(in_keys) != 3 or len(out_keys) != 3:
            raise ValueError(
                "GTrXLModule expects 3 in_keys (the input, the memory and the "
                "memory count; 'is_init' is added) and 3 out_keys (the output, "
                f"the next memory and the next memory count), got in_keys={in_keys} "
                f"and out_keys={out_keys}."
            )
        self.in_keys = in_keys + ["is_init"]
        self.out_keys = out_keys
        self.input_size = input_size
        self.embed_dim = embed_dim
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.memory_len = memory_len
        self.mask_key = unravel_key(mask_key)
        self._recurrent_mode = default_recurrent_mode
        self._position_cache = None
        self.embed = nn.Linear(input_size, embed_dim, device=device)
        self.layers = nn.ModuleList(
            _GTrXLLayer(
                embed_dim,
                num_heads,
                mlp_dim or 4 * embed_dim,
                memory_len,
                dropout,
                gate_bias,
                device=device,
            )
            for _ in range(num_layers)
        )
        self.norm_out = nn.LayerNorm(embed_dim, device=device)

    @property
    def recurrent_mode(self) -> bool:
        mode = recurrent_mode()
        if mode is None:
            return bool(self._recurrent_mode)
        return mode

    @recurrent_mode.setter
    def recurrent_mode(self, value):
        raise RuntimeError(
            "recurrent_mode cannot be changed in-place. Please use the "
            "set_recurrent_mode context manager."
        )

    @property
    def memory_keys(self) -> list[NestedKey]:
        """The stored memory entries: ``in_keys[1:3]`` and their ``"next"`` copies ``out_keys[1:]``.

        Excluding them from a replay buffer (e.g. with
        :class:`~torchrl.envs.ExcludeTransform` on writing) stores no memory;
        the module then starts each sampled slice with an empty memory.
        """
        return [*self.in_keys[1:3], *self.out_keys[1:]]

    def make_tensordict_primer(self):
        """Makes the :class:`~torchrl.envs.TensorDictPrimer` of the memory entries.

        The memory (``[num_layers, memory_len, embed_dim]`` floats) and its
        count (``[1]``, ``int64``) are registered in the env's specs and reset
        to zeros with the env, so that the collector carries them from
        ``("next", ...)`` to the next step. :func:`~torchrl.modules.get_env_transforms_from_module`
        and ``auto_register_policy_transforms=True`` add it with an
        :class:`~torchrl.envs.InitTracker`.
        """
        from torchrl.data import Unbounded
        from torchrl.envs.transforms.transforms import TensorDictPrimer

        def as_tuple(key):
            return key if isinstance(key, tuple) else (key,)

        for in_key, out_key in zip(self.in_keys[1:3], self.out_keys[1:]):
            if as_tuple(out_key) != ("next", *as_tuple(in_key)):
                raise RuntimeError(
                    "make_tensordict_primer needs out_keys named after the in_keys "
                    f"under 'next', got in_keys={self.in_keys} and "
                    f"out_keys={self.out_keys}."
                )
        return TensorDictPrimer(
            {
                self.in_keys[1]: Unbounded(
                    shape=(self.num_layers, self.memory_len, self.embed_dim)
                ),
                self.in_keys[2]: Unbounded(shape=(1,), dtype=torch.int64),
            },
            expand_specs=True,
        )

    def _stored_memory(
        self, tensordict: TensorDictBase, batch: int, device
    ) -> tuple[Tensor | None, Tensor | None]:
        """The stored memory and count, as ``[batch, L, M, D]`` and ``[batch]``; ``None`` when absent."""
        shape = (self.num_layers, self.memory_len, self.embed_dim)
        memory = tensordict.get(self.in_keys[1], None)
        count = tensordict.get(self.in_keys[2], None)
        if (memory is None) != (count is None):
            raise ValueError(
                f"Got only one of the memory entries {self.in_keys[1]!r} and "
                f"{self.in_keys[2]!r}: store both (the collector does with the "
                "module's primer) or neither (each slice then starts empty)."
            )
        if memory is None:
            return None, None
        if tuple(memory.shape[-3:]) != shape or count.shape[-1:] != (1,):
            raise ValueError(
                f"The stored memory {self.in_keys[1]!r} has shape "
                f"{tuple(memory.shape)} and its count {self.in_keys[2]!r} "
                f"{tuple(count.shape)}, expected [*batch, {', '.join(map(str, shape))}] "
                "and [*batch, 1] (num_layers, memory_len, embed_dim of this "
                "module): the buffer holds the memory of another configuration. "
                "Drop the memory entries or collect with this module."
            )
        return (
            memory.reshape(batch, *shape),
            count.reshape(batch).to(device=device, dtype=torch.long),
        )

    def _input(self, tensordict: TensorDictBase) -> Tensor:
        value = tensordict.get(self.in_keys[0])
        if value.shape[-1] != self.input_size:
            raise ValueError(
                f"The input {self.in_keys[0]!r} has {value.shape[-1]} features "
                f"(shape {tuple(value.shape)}), but the module was built with "
                f"input_size={self.input_size}."
            )
        return value

    @dispatch
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        is_init = tensordict.get("is_init", None)
        if self.recurrent_mode:
            return self._recurrent_forward(tensordict, is_init)
        value = self._input(tensordict)
        batch_shape = value.shape[:-1]
        num = batch_shape.numel()
        memory, count = self._stored_memory(tensordict, num, value.device)
        if is_init is not None and count is not None:
            # an empty memory: its entries are then never attended, and zeroed
            reset = is_init.reshape(num).to(value.device, torch.bool)
            count = count.masked_fill(reset, 0)
        output, new_memory, new_count = self._attend(
            value.reshape(num, 1, -1), memory, count
        )
        tensordict.set(self.out_keys[0], output.reshape(*batch_shape, -1))
        tensordict.set(
            self.out_keys[1], new_memory.reshape(*batch_shape, *new_memory.shape[1:])
        )
        tensordict.set(self.out_keys[2], new_count.reshape(*batch_shape, 1))
        return tensordict

    def _recurrent_forward(
        self, tensordict: TensorDictBase, is_init: Tensor | None
    ) -> TensorDictBase:
        if is_init is None:
            raise KeyError(
                "GTrXLModule runs in recurrent mode on slices that start at "
                "'is_init', which the input lacks. Collect with an InitTracker "
                "(auto_register_policy_transforms=True adds it) and sample with "
                "a slice sampler, which marks every slice start."
            )
        value = self._input(tensordict)
        batch_shape = value.shape[:-1]
        if not batch_shape or batch_shape.numel() == 0:
            raise ValueError(
                f"GTrXLModule got a batch of size {tuple(batch_shape)} in recurrent "
                "mode: pass at least one step, with time as the last batch dimension."
            )
        numel, steps = batch_shape.numel(), batch_shape[-1]
        device = value.device
        is_init = is_init.reshape(numel // steps, steps).to(device, torch.bool)
        stored_memory, stored_count = self._stored_memory(tensordict, numel, device)
        burn_in = tensordict.get(BURN_IN_KEY, None)
        split = _SliceSplit(is_init)
        segment = None
        if burn_in is None and self._rows_as_slices(split, is_init, stored_count):
            split = _SliceSplit(torch.zeros_like(is_init))
            # the slice of each step within its row
            segment = is_init.long().cumsum(1) - is_init[:, :1].long()
        num_slices = split.num_slices
        if split.dense:
            starts = torch.arange(num_slices, device=device) * split.max_len
            lengths = None
        else:
            starts, lengths = split.starts, split.lengths.to(device)
        memory = count = None
        if stored_memory is not None:
            memory = stored_memory.index_select(0, starts)
            count = stored_count.index_select(0, starts)
        if burn_in is not None:
            burn_in = split.pad(burn_in.reshape(numel).to(device, torch.bool))
        attendable = None
        mask = tensordict.get(self.mask_key, None)
        if mask is not None:
            # the mask is False on the padding and on the burn-in rows
            attendable = split.pad(mask.reshape(numel).to(device, torch.bool))
            if burn_in is not None:
                attendable = attendable | burn_in
        if burn_in is not None:
            if (burn_in[:, 1:] & ~burn_in[:, :-1]).any():
                raise ValueError(
                    f"The burn-in rows ({BURN_IN_KEY!r}) must be the first rows "
                    "of their slice: a slice starts at every 'is_init' and its "
                    "burn-in rows run without gradient as memory of the rows "
                    "after them. Pass the sample of a slice sampler with "
                    f"burn_in=k as it is, or drop {BURN_IN_KEY!r}."
                )
            if not burn_in.any():
                burn_in = None
        output, _, _ = self._attend(
            split.pad(value.reshape(numel, -1)),
            memory,
            count,
            lengths=lengths,
            attendable=attendable,
            burn_in=burn_in,
            final_memory=False,
            segment=segment,
        )
        tensordict.set(self.out_keys[0], split.unpad(output).reshape(*batch_shape, -1))
        return tensordict

    def _rows_as_slices(
        self, split: _SliceSplit, is_init: Tensor, stored_count: Tensor | None
    ) -> bool:
        """Whether to run each row of ``is_init`` as one slice, its own slices told apart by the mask.

        The same result as running the slices apart, when no slice that starts
        inside a row has stored memory (the collector stores none at an
        episode start), for less attention and no padding where the rows are
        short and hold few slices: a collected ``[envs, steps]`` batch in which
        episodes end. A flat sample of many slices runs them apart.
        """
        rows, steps = is_init.shape
        mem_len, slices, length = self.memory_len, split.num_slices, split.max_len
        if split.dense or rows * steps * (mem_len + steps) >= (
            slices * length * (mem_len + length)
        ):
            return False
        if stored_count is None:
            return True
        return not stored_count.view(rows, steps)[:, 1:][is_init[:, 1:]].any()

    def _positions(self, steps: int, device) -> tuple[Tensor, Tensor, Tensor]:
        """The time of each step, the clamped distance from each key to each step and which keys are in its window.

        The keys are the ``memory_len`` memory entries then the ``steps`` steps
        of a slice; their position relative to the slice's first step is
        ``-memory_len..steps-1``. The last call's tensors are kept: a
        collection step asks for the same ones every time.
        """
        key = (steps, device)
        if self._position_cache is None or self._position_cache[0] != key:
            mem_len = self.memory_len
            # not inference tensors, even when the first call runs in inference
            # mode: a training call saves the distance for the backward pass
            with torch.inference_mode(False):
                time = torch.arange(steps, device=device)
                positions = torch.arange(mem_len + steps, device=device) - mem_len
                distance = time - positions.unsqueeze(1)
                window = (distance >= 0) & (distance <= mem_len)
                distance = distance.clamp(0, mem_len)
            self._position_cache = (key, (time, distance, window))
        return self._position_cache[1]

    def _attend(
        self,
        value: Tensor,
        memory: Tensor | None,
        count: Tensor | None,
        *,
        lengths: Tensor | None = None,
        attendable: Tensor | None = None,
        burn_in: Tensor | None = None,
        final_memory: bool = True,
        segment: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Runs ``S`` slices of ``T`` (padded) steps from their memory, all steps at once.

        Args:
            value: the ``[S, T, input_size]`` input, real steps first.
            memory: the ``[S, L, M, D]`` memory at the slice starts, or ``None``
                (with ``count``): an empty one.
            count: the ``[S]`` number of valid (most recent) memory entries.
            lengths: the ``[S]`` number of real steps of each slice; ``None``:
                all ``T`` are real.
            attendable: ``[S, T]``, ``False`` on rows never to attend (padding).
            burn_in: ``[S, T]``, ``True`` on the burn-in rows, run without gradient.
            final_memory: whether to return the memory after each slice.
            segment: ``[S, T]``, for slices that hold several: the index of the
                inner slice of each step, counted from 0. A step attends to the
                steps of its inner slice, and to the memory only in the first.

        Returns:
            the ``[S, T, D]`` output, and the ``[S, L, M, D]`` memory and ``[S]``
            count after the last real step of each slice (``None`` unless
            ``final_memory``).
        """
        num_slices, steps = value.shape[:2]
        mem_len = self.memory_len
        device = value.device
        dtype = self.embed.weight.dtype
        time, distance, window = self._positions(steps, device)
        if memory is None:
            memory = torch.zeros(
                num_slices,
                self.num_layers,
                mem_len,
                self.embed_dim,
                device=device,
                dtype=dtype,
            )
            count = torch.zeros(num_slices, dtype=torch.long, device=device)
            valid = torch.zeros(num_slices, mem_len, dtype=torch.bool, device=device)
        else:
            oldest = (mem_len - count).unsqueeze(1)
            valid = torch.arange(mem_len, device=device) >= oldest
            # entries older than the episode are never attended: zeros, whatever is stored
            memory = memory.masked_fill(~valid.view(num_slices, 1, mem_len, 1), 0.0)
        real = None if lengths is None else time < lengths.unsqueeze(1)
        if attendable is not None:
            real = attendable if real is None else real & attendable
            # whatever padded rows hold (a weight of 0 times a NaN is NaN), they
            # enter as zeros, and a slice that starts on padding has no memory
            value = value.masked_fill(~attendable.unsqueeze(-1), 0.0)
            count = count.masked_fill(~attendable[:, 0], 0)
        if real is None:
            real = valid.new_ones(num_slices, steps)
        # [S, M + T, T]: whether each step attends to each key
        allowed = window & torch.cat([valid, real], 1).unsqueeze(-1)
        if segment is not None:
            first = (segment == 0).unsqueeze(1).expand(-1, mem_len, -1)
            same = segment.unsqueeze(-1) == segment.unsqueeze(1)
            allowed = allowed & torch.cat([first, same], 1)
        # every step attends to itself (a padding row too, so that no column
        # of the softmax is empty)
        allowed[:, mem_len:].diagonal(dim1=1, dim2=2).fill_(True)
        mask = torch.zeros(allowed.shape, device=device, dtype=dtype)
        mask = mask.masked_fill_(~allowed, -math.inf).unsqueeze(1)
        hidden = self.embed(value)
        layer_inputs = []
        for i, layer in enumerate(self.layers):
            if burn_in is not None:
                hidden = torch.where(burn_in.unsqueeze(-1), hidden.detach(), hidden)
            if attendable is not None:
                hidden = hidden.masked_fill(~attendable.unsqueeze(-1), 0.0)
            layer_inputs.append(hidden)
            hidden = layer(hidden, memory[:, i], distance, mask)
        output = self.norm_out(hidden)
        if burn_in is not None:
            output = torch.where(burn_in.unsqueeze(-1), output.detach(), output)
        if not final_memory:
            return output, None, None
        # the last memory_len inputs of each layer up to the slice's last real step
        new_memory = torch.cat([memory, torch.stack(layer_inputs, 1)], 2)
        if lengths is None:
            new_memory = new_memory[:, :, steps:]
            lengths = steps
        else:
            index = lengths.view(-1, 1, 1, 1) + torch.arange(
                mem_len, device=device
            ).view(1, 1, -1, 1)
            new_memory = new_memory.gather(2, index.expand_as(memory))
        new_count = (count + lengths).clamp_max(mem_len)
        return output, new_memory, new_count

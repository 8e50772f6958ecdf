# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""LSTMModule/GRUModule recurrent mode on flat sequence samples.

Every result is compared with a reference computed by running the module's own
RNN slice by slice, from the stored recurrent state at each slice start.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st
from tensordict import TensorDict
from torch import nn
from torch.nn.utils.rnn import PackedSequence

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    SliceSampler,
    TensorDictReplayBuffer,
)
from torchrl.envs import GymEnv, InitTracker, TransformedEnv
from torchrl.modules import GRUModule, LSTMModule, set_recurrent_mode

INPUT, HIDDEN = 3, 5


def _module(kind, num_layers=1, python_based=False, input_size=INPUT):
    torch.manual_seed(0)
    if kind == "lstm":
        return LSTMModule(
            input_size,
            HIDDEN,
            num_layers=num_layers,
            python_based=python_based,
            in_keys=["obs", "h", "c"],
            out_keys=["out", ("next", "h"), ("next", "c")],
        )
    return GRUModule(
        input_size,
        HIDDEN,
        num_layers=num_layers,
        python_based=python_based,
        in_keys=["obs", "h"],
        out_keys=["out", ("next", "h")],
    )


def _rnn(module):
    return module.lstm if isinstance(module, LSTMModule) else module.gru


def _state_keys(module):
    return ["h", "c"] if isinstance(module, LSTMModule) else ["h"]


def _sample(module, is_init, seed=0):
    """A tensordict of batch shape ``is_init.shape`` with inputs that require grad."""
    generator = torch.Generator().manual_seed(seed)
    shape = is_init.shape
    layers = _rnn(module).num_layers
    fields = {
        "obs": torch.randn(*shape, INPUT, generator=generator),
        "is_init": is_init.unsqueeze(-1),
    }
    for key in _state_keys(module):
        fields[key] = torch.randn(*shape, layers, HIDDEN, generator=generator)
    for key in ["obs", *_state_keys(module)]:
        fields[key].requires_grad_(True)
    return TensorDict(fields, shape)


def _slices(is_init):
    """Starts and lengths of the slices of a ``[*B, T]`` is_init, in flat indices."""
    steps = is_init.shape[-1] if is_init.ndim else 1
    flat = is_init.reshape(-1, steps).clone()
    flat[:, 0] = True
    starts = flat.reshape(-1).nonzero().squeeze(-1).tolist()
    ends = starts[1:] + [flat.numel()]
    return [(start, end - start) for start, end in zip(starts, ends)]


def _reference(module, sample):
    """Runs the module's RNN slice by slice; returns the output and the final states.

    The final states are zero except at the last step of each slice as long as
    the longest one (the final state of a shorter one is not known after the
    module's padded run, as in torchrl 0.12.0).
    """
    rnn = _rnn(module)
    keys = _state_keys(module)
    obs = sample["obs"].reshape(-1, sample["obs"].shape[-1])
    states = [sample[key].reshape(-1, *sample[key].shape[-2:]) for key in keys]
    slices = _slices(sample["is_init"].squeeze(-1))
    longest = max(length for _, length in slices)
    outputs = []
    finals = [[torch.zeros_like(state[0])] * state.shape[0] for state in states]
    for start, length in slices:
        hx = tuple(state[start].unsqueeze(1) for state in states)
        y, final = rnn(
            obs[start : start + length].unsqueeze(0), hx if len(hx) > 1 else hx[0]
        )
        outputs.append(y.squeeze(0))
        final = final if isinstance(final, tuple) else (final,)
        if length == longest:
            for i, value in enumerate(final):
                finals[i][start + length - 1] = value.squeeze(1)
    shape = sample.shape
    return (
        torch.cat(outputs).reshape(*shape, -1),
        [torch.stack(final).reshape(*shape, *final[0].shape) for final in finals],
    )


def _loss(output, finals, seed=1):
    """A weighted sum of everything the module returns, so that every gradient shows."""
    generator = torch.Generator().manual_seed(seed)
    loss = (output * torch.randn(output.shape, generator=generator)).sum()
    for final in finals:
        loss = loss + (final * torch.randn(final.shape, generator=generator)).sum()
    return loss


def _check(module, is_init, seed=0):
    """Module in recurrent mode == slice-by-slice reference: outputs and gradients."""
    keys = _state_keys(module)
    sample = _sample(module, is_init, seed)
    with set_recurrent_mode(True):
        result = module(sample.copy())
    output = result["out"]
    finals = [result["next", key] for key in keys]
    inputs = [sample["obs"], *[sample[key] for key in keys]]
    params = list(module.parameters())
    grads = torch.autograd.grad(_loss(output, finals), inputs + params)

    ref_output, ref_finals = _reference(module, sample)
    ref_grads = torch.autograd.grad(_loss(ref_output, ref_finals), inputs + params)

    torch.testing.assert_close(output, ref_output, rtol=1e-5, atol=1e-5)
    for final, ref_final in zip(finals, ref_finals):
        torch.testing.assert_close(final, ref_final, rtol=1e-5, atol=1e-5)
    for grad, ref_grad in zip(grads, ref_grads):
        torch.testing.assert_close(grad, ref_grad, rtol=1e-4, atol=1e-5)


def _flat_is_init(lengths, resets=()):
    """A flat is_init: a slice start at each length, plus episode resets at ``resets``."""
    is_init = torch.zeros(sum(lengths), dtype=torch.bool)
    is_init[torch.cumsum(torch.tensor(lengths), 0) - torch.tensor(lengths)] = True
    is_init[list(resets)] = True
    return is_init


def _assert_matches_reference_no_grad(module, sample):
    """Recurrent mode under no_grad equals the slice-by-slice reference."""
    with torch.no_grad():
        ref_output, ref_finals = _reference(module, sample)
        with set_recurrent_mode(True):
            result = module(sample.copy())
    torch.testing.assert_close(result["out"], ref_output, rtol=1e-5, atol=1e-5)
    for key, ref_final in zip(_state_keys(module), ref_finals):
        torch.testing.assert_close(result["next", key], ref_final, rtol=1e-5, atol=1e-5)


class _Capture:
    """Records what the RNN receives, through a forward pre-hook."""

    def __init__(self, rnn):
        self.inputs = []
        self.handle = rnn.register_forward_pre_hook(self)

    def __call__(self, rnn, args):
        self.inputs.append(args[0])


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("python_based", [False, True])
class TestMatchesReference:
    def test_equal_lengths(self, kind, num_layers, python_based):
        module = _module(kind, num_layers, python_based)
        _check(module, _flat_is_init([6] * 4))

    def test_variable_lengths(self, kind, num_layers, python_based):
        module = _module(kind, num_layers, python_based)
        _check(module, _flat_is_init([3, 7, 1, 5, 7]))

    def test_episode_resets_inside_slices(self, kind, num_layers, python_based):
        module = _module(kind, num_layers, python_based)
        is_init = _flat_is_init([8, 8, 8], resets=[3, 12, 13, 23])
        _check(module, is_init)

    @pytest.mark.parametrize("shape", [(3, 6), (2, 2, 5)])
    def test_batch_dims(self, kind, num_layers, python_based, shape):
        module = _module(kind, num_layers, python_based)
        is_init = torch.zeros(shape, dtype=torch.bool)
        is_init[..., 0] = True
        is_init.view(-1, shape[-1])[0, 2] = True
        is_init.view(-1, shape[-1])[-1, 3] = True
        _check(module, is_init)

    @pytest.mark.parametrize(
        "lengths", [[3, 7, 1, 5, 7], [4, 4, 4], [2, 6, 6, 1]], ids=str
    )
    def test_no_grad(self, kind, num_layers, python_based, lengths):
        # without gradients, variable-length slices may take another layout
        module = _module(kind, num_layers, python_based)
        sample = _sample(module, _flat_is_init(lengths))
        _assert_matches_reference_no_grad(module, sample)

    @pytest.mark.parametrize("shape", [(3, 6), (2, 2, 5)])
    def test_batch_dims_no_reset(self, kind, num_layers, python_based, shape):
        # rows start a slice even where is_init is False
        module = _module(kind, num_layers, python_based)
        _check(module, torch.zeros(shape, dtype=torch.bool))


@pytest.mark.parametrize("kind", ["lstm", "gru"])
class TestLayout:
    def test_equal_lengths_zero_copy(self, kind):
        module = _module(kind)
        sample = _sample(module, _flat_is_init([4] * 5))
        capture = _Capture(_rnn(module))
        with set_recurrent_mode(True):
            module(sample.copy())
        (rnn_input,) = capture.inputs
        assert rnn_input.shape == (5, 4, INPUT)
        assert rnn_input.data_ptr() == sample["obs"].data_ptr()

    def test_variable_lengths_pad_only_the_input(self, kind):
        module = _module(kind)
        sample = _sample(module, _flat_is_init([2, 5, 3]))
        capture = _Capture(_rnn(module))
        with set_recurrent_mode(True):
            module(sample.copy())
        (rnn_input,) = capture.inputs
        assert rnn_input.shape == (3, 5, INPUT)
        obs = sample["obs"].detach()
        torch.testing.assert_close(rnn_input[1], obs[2:7])
        torch.testing.assert_close(rnn_input[2, :3], obs[7:])
        assert (rnn_input[0, 2:] == 0).all() and (rnn_input[2, 3:] == 0).all()

    def test_no_grad_variable_lengths_packed(self, kind):
        module = _module(kind)
        sample = _sample(module, _flat_is_init([2, 5, 3]))
        capture = _Capture(_rnn(module))
        with torch.no_grad(), set_recurrent_mode(True):
            module(sample.copy())
        (rnn_input,) = capture.inputs
        assert isinstance(rnn_input, PackedSequence)
        assert rnn_input.batch_sizes.tolist() == [3, 3, 2, 1, 1]

    def test_state_read_only_at_slice_starts(self, kind):
        # stored states between slice starts are never read
        module = _module(kind)
        is_init = _flat_is_init([3, 5, 2])
        sample = _sample(module, is_init)
        with torch.no_grad():
            for key in _state_keys(module):
                sample[key][~is_init] = math.nan
        with set_recurrent_mode(True):
            result = module(sample.copy())
        assert torch.isfinite(result["out"]).all()
        for key in _state_keys(module):
            assert torch.isfinite(result["next", key]).all()

    @pytest.mark.parametrize("python_based", [False, True])
    def test_missing_states_start_from_zero(self, kind, python_based):
        module = _module(kind, python_based=python_based)
        is_init = _flat_is_init([3, 5, 2])
        sample = _sample(module, is_init)
        with torch.no_grad():
            for key in _state_keys(module):
                sample[key].zero_()
        expected, _ = _reference(module, sample)
        with set_recurrent_mode(True):
            result = module(sample.exclude(*_state_keys(module)))
        torch.testing.assert_close(result["out"], expected)

    def test_dense_batch(self, kind):
        # a [B, T] tensordict without resets keeps its layout, outputs in place
        module = _module(kind)
        sample = _sample(module, torch.zeros(4, 6, dtype=torch.bool))
        with set_recurrent_mode(True):
            result = module(sample)
        assert result is sample
        assert result["out"].shape == (4, 6, HIDDEN)
        for key in _state_keys(module):
            assert result["next", key].shape == (4, 6, 1, HIDDEN)
            assert (result["next", key][:, :-1] == 0).all()


def test_missing_one_lstm_state():
    module = _module("lstm")
    sample = _sample(module, _flat_is_init([3, 5]))
    with set_recurrent_mode(True), pytest.raises(
        RuntimeError, match="either all or none"
    ):
        module(sample.exclude("c"))


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_empty_batch(kind):
    module = _module(kind)
    sample = _sample(module, torch.zeros(0, dtype=torch.bool))
    with set_recurrent_mode(True), pytest.raises(ValueError, match="empty batch"):
        module(sample)


@st.composite
def _layouts(draw):
    """A batch shape ``[*B, T]`` and an is_init over it, with resets anywhere."""
    rows = draw(st.integers(1, 4))
    steps = draw(st.integers(1, 9))
    outer = draw(st.sampled_from([(), (2,)]))
    numel = math.prod(outer) * rows * steps
    bits = draw(st.lists(st.booleans(), min_size=numel, max_size=numel))
    return torch.tensor(bits, dtype=torch.bool).reshape(*outer, rows, steps)


class TestRandomLayouts:
    @settings(max_examples=30, deadline=None)
    @given(
        is_init=_layouts(),
        kind=st.sampled_from(["lstm", "gru"]),
        num_layers=st.integers(1, 2),
        python_based=st.booleans(),
        seed=st.integers(0, 2**16),
    )
    def test_matches_reference(self, is_init, kind, num_layers, python_based, seed):
        module = _module(kind, num_layers, python_based)
        _check(module, is_init, seed)

    @settings(max_examples=20, deadline=None)
    @given(
        is_init=_layouts(),
        kind=st.sampled_from(["lstm", "gru"]),
        num_layers=st.integers(1, 2),
        seed=st.integers(0, 2**16),
    )
    def test_matches_reference_no_grad(self, is_init, kind, num_layers, seed):
        module = _module(kind, num_layers)
        sample = _sample(module, is_init, seed)
        _assert_matches_reference_no_grad(module, sample)


def _storage(kind, tmp_path, size=1000):
    if kind == "tensor":
        return LazyTensorStorage(size)
    return LazyMemmapStorage(size, scratch_dir=tmp_path)


class TestCartPoleSlices:
    """Recurrent mode on slices of CartPole rollouts sampled from real storages."""

    @pytest.mark.parametrize("storage", ["tensor", "memmap"])
    @pytest.mark.parametrize("kind", ["lstm", "gru"])
    def test_slice_sample(self, storage, kind, tmp_path):
        env = TransformedEnv(GymEnv("CartPole-v1"), InitTracker())
        env.set_seed(0)
        torch.manual_seed(0)
        rollout = env.rollout(120, break_when_any_done=False)
        module = _module(kind, input_size=rollout["observation"].shape[-1])
        # recurrent states stored by some earlier policy
        for key in _state_keys(module):
            rollout[key] = torch.randn(*rollout.shape, 1, HIDDEN)
        slice_len = 8
        buffer = TensorDictReplayBuffer(
            storage=_storage(storage, tmp_path),
            sampler=SliceSampler(slice_len=slice_len, end_key=("next", "done")),
            batch_size=6 * slice_len,
        )
        buffer.extend(rollout)
        sample = buffer.sample()
        # each slice starts a sequence (whether or not the sampler marks it)
        sample["is_init"].view(-1, slice_len)[:, 0] = True
        sample = sample.select("observation", "is_init", *_state_keys(module))
        sample.rename_key_("observation", "obs")
        for key in ["obs", *_state_keys(module)]:
            sample[key].requires_grad_(True)
        keys = _state_keys(module)
        with set_recurrent_mode(True):
            result = module(sample.copy())
        ref_output, ref_finals = _reference(module, sample)
        torch.testing.assert_close(result["out"], ref_output, rtol=1e-5, atol=1e-5)
        for key, ref_final in zip(keys, ref_finals):
            torch.testing.assert_close(result["next", key], ref_final)
        inputs = [sample["obs"], *[sample[key] for key in keys]]
        grads = torch.autograd.grad(
            _loss(result["out"], [result["next", key] for key in keys]), inputs
        )
        ref_grads = torch.autograd.grad(_loss(ref_output, ref_finals), inputs)
        for grad, ref_grad in zip(grads, ref_grads):
            torch.testing.assert_close(grad, ref_grad, rtol=1e-4, atol=1e-5)


class _PaddedOnlyLSTM(nn.Module):
    """A user RNN that only takes padded ``[B, T, F]`` tensors."""

    def __init__(self):
        super().__init__()
        self.inner = nn.LSTM(INPUT, HIDDEN, batch_first=True)
        self.batch_first, self.bidirectional = True, False
        self.num_layers, self.hidden_size = 1, HIDDEN

    def forward(self, input, hx):
        if not isinstance(input, torch.Tensor):
            raise TypeError(f"expected a padded tensor, got {type(input)}")
        return self.inner(input, hx)


class TestUserRNN:
    def test_nn_lstm(self):
        module = LSTMModule(
            lstm=nn.LSTM(INPUT, HIDDEN, batch_first=True),
            in_keys=["obs", "h", "c"],
            out_keys=["out", ("next", "h"), ("next", "c")],
        )
        _check(module, _flat_is_init([2, 4, 1]))

    def test_rnn_taking_padded_tensors_only(self):
        torch.manual_seed(0)
        module = LSTMModule(
            lstm=_PaddedOnlyLSTM(),
            in_keys=["obs", "h", "c"],
            out_keys=["out", ("next", "h"), ("next", "c")],
        )
        _check(module, _flat_is_init([2, 4, 1, 4]))
        _check(module, _flat_is_init([3, 3, 3]))

# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Burn-in rows under recurrent mode: no gradient, the state warmed up for the rest.

The reference runs each slice on its own: its burn-in prefix under
:func:`torch.no_grad` from the state stored at its first row, then the rest
of the slice from the prefix's final state.
"""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from torchrl.data import LazyTensorStorage, SliceSampler, TensorDictReplayBuffer
from torchrl.modules import GRUModule, LSTMModule, set_recurrent_mode

BURN_IN = ("collector", "burn_in")
MASK = ("collector", "mask")


def _module(kind, num_layers):
    torch.manual_seed(0)
    cls = LSTMModule if kind == "lstm" else GRUModule
    return cls(
        input_size=3,
        hidden_size=5,
        num_layers=num_layers,
        in_key="obs",
        out_key="features",
    )


def _batch(module, layout, stored_state=True, seed=1):
    """Slices laid end to end: ``layout`` lists ``(burn_in, training)`` row counts."""
    generator = torch.Generator().manual_seed(seed)
    burn, init = [], []
    for num_burn, num_train in layout:
        burn += [True] * num_burn + [False] * num_train
        init += [True] + [False] * (num_burn + num_train - 1)
    n = len(burn)
    data = TensorDict(
        {
            "obs": torch.randn(n, 3, generator=generator),
            "is_init": torch.tensor(init).unsqueeze(-1),
            BURN_IN: torch.tensor(burn),
        },
        [n],
    )
    if stored_state:
        layers = (
            module.lstm.num_layers if hasattr(module, "lstm") else module.gru.num_layers
        )
        for key in module.in_keys[1:-1]:
            data.set(key, torch.randn(n, layers, 5, generator=generator))
    return data


def _reference(module, data, layout):
    """The training rows' output, each slice run on its own."""
    rnn = module.lstm if hasattr(module, "lstm") else module.gru
    state_keys = module.in_keys[1:-1]
    outputs, start = [], 0
    for num_burn, num_train in layout:
        hx = None
        if state_keys[0] in data.keys():
            hx = tuple(data[key][start].unsqueeze(1).contiguous() for key in state_keys)
            hx = hx if len(hx) == 2 else hx[0]
        obs = data["obs"][start : start + num_burn + num_train].unsqueeze(0)
        if num_burn:
            with torch.no_grad():
                _, hx = rnn(obs[:, :num_burn], hx)
        out, _ = rnn(obs[:, num_burn:], hx)
        outputs.append(out[0])
        start += num_burn + num_train
    return torch.cat(outputs)


LAYOUTS = {
    "equal": [(3, 4), (3, 4), (3, 4)],
    "ragged": [(2, 4), (0, 4), (3, 4), (1, 2)],
}


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("stored_state", [True, False])
def test_loss_and_gradients_equal_no_grad_prefix(
    kind, num_layers, layout, stored_state
):
    module = _module(kind, num_layers)
    data = _batch(module, LAYOUTS[layout], stored_state)
    with set_recurrent_mode(True):
        out = module(data.clone())["features"]
    train = ~data[BURN_IN]
    ref = _reference(module, data, LAYOUTS[layout])
    torch.testing.assert_close(out[train], ref)
    params = list(module.parameters())
    # the burn-in rows' outputs are those of the warm-up, and take no gradient
    assert not out[~train].requires_grad or not any(
        g is not None and g.any()
        for g in torch.autograd.grad(
            out[~train].sum(), params, retain_graph=True, allow_unused=True
        )
    )
    grads = torch.autograd.grad(out[train].pow(2).sum(), params)
    ref_grads = torch.autograd.grad(ref.pow(2).sum(), params)
    for grad, ref_grad in zip(grads, ref_grads):
        torch.testing.assert_close(grad, ref_grad)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_without_burn_in_rows_nothing_changes(kind):
    """A burn-in marker that is ``False`` everywhere gives the plain recurrent mode."""
    module = _module(kind, 1)
    data = _batch(module, [(0, 4), (0, 3)])
    with set_recurrent_mode(True):
        plain = module(data.exclude(BURN_IN))
        marked = module(data.clone())
    torch.testing.assert_close(marked["features"], plain["features"])


def test_burn_in_rows_must_start_their_slice():
    module = _module("lstm", 1)
    data = _batch(module, [(2, 4), (0, 4)])
    # a burn-in row after a training row of the same slice
    data[BURN_IN][5] = True
    with set_recurrent_mode(True), pytest.raises(
        ValueError, match="first rows of their slice"
    ):
        module(data)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_sampled_slices(kind):
    """On a slice sampler's sample: the training rows match the reference."""
    module = _module(kind, 1)
    n = 200
    step = torch.arange(n) % 50
    data = TensorDict(
        {
            "obs": torch.randn(n, 3),
            "is_init": (step == 0).unsqueeze(-1),
            ("collector", "traj_ids"): torch.arange(n) // 50,
        },
        [n],
    )
    for key in module.in_keys[1:-1]:
        data.set(key, torch.randn(n, 1, 5))
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(n),
        sampler=SliceSampler(
            slice_len=6, burn_in=5, strict_length=False, pad_output=True
        ),
        batch_size=48,
    )
    rb.extend(data)
    torch.manual_seed(3)
    sample = rb.sample()
    burn = sample[BURN_IN].view(8, 11)
    layout = [(int(b.sum()), 11 - int(b.sum())) for b in burn]
    assert len({b for b, _ in layout}) > 1 or layout[0][0] == 5
    with set_recurrent_mode(True):
        out = module(sample.clone())["features"]
    ref = _reference(module, sample, layout)
    torch.testing.assert_close(out[~sample[BURN_IN]], ref)


@pytest.mark.filterwarnings("ignore:LSTM with projections")
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("stored_state", [True, False])
def test_lstm_with_projections(layout, stored_state):
    """``proj_size``: the output and the hidden state are smaller than the cell state."""
    torch.manual_seed(0)
    module = LSTMModule(
        input_size=3, hidden_size=6, proj_size=4, in_key="obs", out_key="features"
    )
    data = _batch(module, LAYOUTS[layout], stored_state=False)
    if stored_state:
        n = data.shape[0]
        data.set("recurrent_state_h", torch.randn(n, 1, 4))
        data.set("recurrent_state_c", torch.randn(n, 1, 6))
    with set_recurrent_mode(True):
        out = module(data.clone())
    train = ~data[BURN_IN]
    assert out["features"].shape == (data.shape[0], 4)
    assert out["next", "recurrent_state_h"].shape == (data.shape[0], 1, 4)
    assert out["next", "recurrent_state_c"].shape == (data.shape[0], 1, 6)
    ref = _reference(module, data, LAYOUTS[layout])
    torch.testing.assert_close(out["features"][train], ref)

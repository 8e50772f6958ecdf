# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Cost of LSTMModule/GRUModule recurrent mode relative to the bare torch RNN.

The module runs under ``set_recurrent_mode(True)`` on a flat sample of 256
concatenated slices (the layout a :class:`~torchrl.data.SliceSampler` returns:
``is_init`` marks each slice start, recurrent states stored at every step).
The bare RNN runs on the same data in the layout it needs: dense ``[B, T]``
for equal-length slices; for variable lengths a zero-padded ``[B, T_max]``
batch that goes through ``pack_padded_sequence`` and ``pad_packed_sequence``
around the RNN. Both start from the stored state at each slice start.

Each ratio is the median time of the module divided by the median time of the
bare RNN, the two timed alternately in the same process with a fixed number
of torch threads (``--threads``, default 1), so that the load of the machine
weighs on both alike. ``fwd+bwd`` times the forward pass and the backward pass
of the sum of the outputs, ``no-grad`` the forward pass under
:func:`torch.no_grad`.

The burn-in rows (``lstm/gru burn-in 8 + 32``: 256 slices of 8 burn-in and
32 training steps, marked in ``("collector", "burn_in")`` as a
:class:`~torchrl.data.SliceSampler` with ``burn_in=8`` marks them) are
compared with the bare RNN doing the same work: the 8-step prefix under
:func:`torch.no_grad`, then the 32 training steps from its final state.

Each mode is measured in ``--rounds`` independent rounds (fresh data and
modules, default 3) and the median ratio is printed: a single round on a busy
2-core machine now and then reads 15% high.

Run: ``python benchmarks/recurrent_mode.py [--repeat N] [--threads N] [--rounds N]``.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import _harness

NUM_SLICES = 256
MAX_LEN = 32
MIN_LEN = 8
BURN_IN = 8
INPUT_SIZE = 64
HIDDEN_SIZE = 128


def _case(kind: str, variable: bool, repeat: int) -> dict:
    import torch
    from tensordict import TensorDict
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
    from torchrl.modules import GRUModule, LSTMModule, set_recurrent_mode

    generator = torch.Generator().manual_seed(0)
    if variable:
        lengths = torch.randint(
            MIN_LEN, MAX_LEN + 1, (NUM_SLICES,), generator=generator
        )
    else:
        lengths = torch.full((NUM_SLICES,), MAX_LEN)
    numel = int(lengths.sum())
    starts = torch.cumsum(lengths, 0) - lengths
    is_init = torch.zeros(numel, 1, dtype=torch.bool)
    is_init[starts] = True

    torch.manual_seed(0)
    state_keys = ["h", "c"] if kind == "lstm" else ["h"]
    if kind == "lstm":
        module = LSTMModule(
            INPUT_SIZE,
            HIDDEN_SIZE,
            in_keys=["obs", *state_keys],
            out_keys=["out", *[("next", key) for key in state_keys]],
        )
        rnn = module.lstm
    else:
        module = GRUModule(
            INPUT_SIZE,
            HIDDEN_SIZE,
            in_keys=["obs", *state_keys],
            out_keys=["out", *[("next", key) for key in state_keys]],
        )
        rnn = module.gru
    sample = TensorDict(
        {
            "obs": torch.randn(numel, INPUT_SIZE),
            "is_init": is_init,
            **{key: torch.randn(numel, 1, HIDDEN_SIZE) for key in state_keys},
        },
        [numel],
    )

    # the same data, in the layout the bare RNN takes
    hx = tuple(sample[key][starts].transpose(0, 1).contiguous() for key in state_keys)
    hx = hx if kind == "lstm" else hx[0]
    if variable:
        padded = torch.zeros(NUM_SLICES, MAX_LEN, INPUT_SIZE)
        mask = torch.arange(MAX_LEN) < lengths.unsqueeze(1)
        padded[mask] = sample["obs"]

        def bare_forward():
            packed = pack_padded_sequence(
                padded, lengths, batch_first=True, enforce_sorted=False
            )
            out, _ = rnn(packed, hx)
            return pad_packed_sequence(out, batch_first=True)[0]

    else:
        dense = sample["obs"].view(NUM_SLICES, MAX_LEN, INPUT_SIZE)

        def bare_forward():
            return rnn(dense, hx)[0]

    def module_forward():
        with set_recurrent_mode(True):
            return module(sample.copy())["out"]

    def bare_step():
        bare_forward().sum().backward()

    def module_step():
        module_forward().sum().backward()

    def no_grad(fn):
        def wrapped():
            with torch.no_grad():
                fn()

        return wrapped

    return {
        "fwd+bwd": _harness.alternate(module_step, bare_step, repeat),
        "no-grad": _harness.alternate(
            no_grad(module_forward), no_grad(bare_forward), repeat
        ),
    }


def _burn_in_case(kind: str, repeat: int) -> dict:
    """256 slices of ``BURN_IN`` burn-in steps and ``MAX_LEN`` training steps.

    The module runs the flat sample with ``("collector", "burn_in")`` marking
    the burn-in rows; the bare RNN runs the ``[B, BURN_IN]`` prefix under
    :func:`torch.no_grad` and the ``[B, MAX_LEN]`` rest from its final state.
    ``fwd+bwd`` back-propagates the sum of the training rows' outputs.
    """
    import torch
    from tensordict import TensorDict
    from torchrl.modules import GRUModule, LSTMModule, set_recurrent_mode

    length = BURN_IN + MAX_LEN
    numel = NUM_SLICES * length
    offset = torch.arange(numel) % length
    torch.manual_seed(0)
    state_keys = ["h", "c"] if kind == "lstm" else ["h"]
    cls = LSTMModule if kind == "lstm" else GRUModule
    module = cls(
        INPUT_SIZE,
        HIDDEN_SIZE,
        in_keys=["obs", *state_keys],
        out_keys=["out", *[("next", key) for key in state_keys]],
    )
    rnn = module.lstm if kind == "lstm" else module.gru
    burn_in = offset < BURN_IN
    sample = TensorDict(
        {
            "obs": torch.randn(numel, INPUT_SIZE),
            "is_init": (offset == 0).unsqueeze(-1),
            ("collector", "burn_in"): burn_in,
            **{key: torch.randn(numel, 1, HIDDEN_SIZE) for key in state_keys},
        },
        [numel],
    )
    train = ~burn_in
    dense = sample["obs"].view(NUM_SLICES, length, INPUT_SIZE)
    prefix, rest = dense[:, :BURN_IN], dense[:, BURN_IN:]
    starts = torch.arange(0, numel, length)
    hx = tuple(sample[key][starts].transpose(0, 1).contiguous() for key in state_keys)
    hx = hx if kind == "lstm" else hx[0]

    def bare(backward: bool):
        with torch.no_grad():
            _, warm = rnn(prefix, hx)
        out = rnn(rest, warm)[0]
        if backward:
            out.sum().backward()

    def module_run(backward: bool):
        with set_recurrent_mode(True):
            out = module(sample.copy())["out"]
        if backward:
            out[train].sum().backward()

    def no_grad(fn):
        def wrapped():
            with torch.no_grad():
                fn(False)

        return wrapped

    return {
        "fwd+bwd": _harness.alternate(
            lambda: module_run(True), lambda: bare(True), repeat
        ),
        "no-grad": _harness.alternate(no_grad(module_run), no_grad(bare), repeat),
    }


def measure(args: argparse.Namespace) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    results = {}
    for kind in ("lstm", "gru"):
        for variable in (False, True):
            name = f"{kind} {'variable 8..32' if variable else 'equal 32'}"
            rounds = [_case(kind, variable, args.repeat) for _ in range(args.rounds)]
            results[name] = {
                col: statistics.median(r[col] for r in rounds) for col in rounds[0]
            }
        rounds = [_burn_in_case(kind, args.repeat) for _ in range(args.rounds)]
        results[f"{kind} burn-in {BURN_IN} + {MAX_LEN}"] = {
            col: statistics.median(r[col] for r in rounds) for col in rounds[0]
        }
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="independent rounds per mode; the median ratio is printed",
    )
    _harness.main(
        str(Path(__file__).resolve()),
        "LSTMModule/GRUModule recurrent mode / bare torch RNN (median time ratio; "
        "256 slices, input 64, hidden 128)",
        measure,
        ["fwd+bwd", "no-grad"],
        parser=parser,
    )

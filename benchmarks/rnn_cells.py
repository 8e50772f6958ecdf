# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Cost of a bare ``torch.nn.GRU`` relative to a bare ``torch.nn.LSTM`` on CPU.

Why the GRU recipe runs fewer frames per second than the LSTM recipe
(``benchmarks/popgym.py``): at the recurrent PPO recipe's sizes (hidden 64, a
minibatch of up to 64 slices of 32 steps, a collection step of 16 envs), the
two cells are timed alternately in one process with one torch thread, with no
TorchRL code involved. ``benchmarks/recurrent_mode.py`` shows that
:class:`~torchrl.modules.GRUModule` and :class:`~torchrl.modules.LSTMModule`
each run at their bare cell's cost, so the ratio here is PyTorch's: on CPU its
LSTM runs through oneDNN's fused RNN kernels, forward and backward, and its
GRU step by step through generic kernels and autograd.

Each row prints the median time of the GRU over the median time of the LSTM
(above 1: the GRU is slower), median over ``--rounds`` rounds.

Run: ``python benchmarks/rnn_cells.py [--repeat N] [--rounds N]``.
"""
from __future__ import annotations

import argparse
import statistics

import _harness

INPUT_SIZE = 8  # a POPGym observation, one-hot, with the previous action
HIDDEN_SIZE = 64  # recurrent_ppo.py --hidden
CASES = {
    # name: (slices, steps, backward)
    "training minibatch 64 x 32, fwd+bwd": (64, 32, True),
    "training minibatch 16 x 32, fwd+bwd": (16, 32, True),
    "collection step 16 envs, no-grad": (16, 1, False),
}


def _ratio(slices: int, steps: int, backward: bool, repeat: int) -> float:
    import torch

    torch.manual_seed(0)
    x = torch.randn(slices, steps, INPUT_SIZE)
    cells = [
        cls(INPUT_SIZE, HIDDEN_SIZE, batch_first=True)
        for cls in (torch.nn.GRU, torch.nn.LSTM)
    ]

    def run(cell):
        def fn():
            if backward:
                cell(x)[0].sum().backward()
            else:
                with torch.no_grad():
                    cell(x)

        return fn

    return _harness.alternate(run(cells[0]), run(cells[1]), repeat)


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=100, help="timed calls")
    parser.add_argument("--rounds", type=int, default=3, help="median over rounds")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"bare torch.nn.GRU / torch.nn.LSTM, torch {torch.__version__}, 1 thread")
    for name, (slices, steps, backward) in CASES.items():
        rounds = [
            _ratio(slices, steps, backward, args.repeat) for _ in range(args.rounds)
        ]
        print(f"{name:40} {statistics.median(rounds):.2f}")


if __name__ == "__main__":
    main()

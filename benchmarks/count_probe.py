# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Can the memory count? CountRecallEasy as a supervised task, GTrXL against LSTM.

POPGym's CountRecallEasy deals one colour per step for 51 steps (iid fair
coins) and shows a queried colour; the right answer at each step is how many
of the dealt colours so far equal the queried one. This probe takes the
question out of reinforcement learning: the recipes' memories
(:class:`~torchrl.modules.GTrXLModule` with ``recurrent_ppo.py --policy
gtrxl``'s width and one layer, a window of 64 steps over the episode;
:class:`~torchrl.modules.LSTMModule` with 64 units) read the same one-hot
input with a first-step flag, run in recurrent mode over whole episodes, and
a linear head is trained by cross-entropy on the exact counts: Adam, lr 1e-3,
32 episodes per step, the same steps for both. It prints each model's
accuracy and mean absolute error on 1,024 fresh episodes (over all steps and
over the last 19, where the count is largest) and its wall time.

Whatever a memory learns here it can represent and learn from a dense,
exact signal; what it then misses in ``benchmarks/popgym.py`` is down to the
reinforcement learning.
"""
from __future__ import annotations

import argparse
import time

import torch
from tensordict import TensorDict
from torch import nn

from torchrl.modules import GTrXLModule, LSTMModule, set_recurrent_mode

STEPS_PER_EPISODE = 51
COUNTS = STEPS_PER_EPISODE + 1  # 0..51: the head's classes


def episodes(n: int, generator: torch.Generator) -> tuple[TensorDict, torch.Tensor]:
    """``n`` episodes ``[n, 51]`` (one-hot dealt and queried colour, first-step flag) and their counts."""
    dealt = torch.randint(0, 2, (n, STEPS_PER_EPISODE), generator=generator)
    query = torch.randint(0, 2, (n, STEPS_PER_EPISODE), generator=generator)
    is_init = torch.zeros(n, STEPS_PER_EPISODE, 1, dtype=torch.bool)
    is_init[:, 0] = True
    observation = torch.cat(
        [
            nn.functional.one_hot(dealt, 2),
            nn.functional.one_hot(query, 2),
            is_init,
        ],
        -1,
    ).float()
    # the count of the queried colour among the dealt ones, this step's included
    count = torch.where(query == 1, dealt.cumsum(1), (1 - dealt).cumsum(1))
    data = TensorDict(
        {"observation": observation, "is_init": is_init}, [n, STEPS_PER_EPISODE]
    )
    return data, count


def make(model: str, memory_len: int) -> tuple[nn.Module, nn.Linear]:
    """The memory, as the recipes build it, and a linear head over the counts."""
    if model == "lstm":
        memory = LSTMModule(
            input_size=5, hidden_size=64, in_key="observation", out_key="embed"
        )
        return memory, nn.Linear(64, COUNTS)
    memory = GTrXLModule(
        5,
        32,
        num_layers=1,
        num_heads=4,
        memory_len=memory_len,
        in_key="observation",
        out_key="embed",
    )
    return memory, nn.Linear(32, COUNTS)


def train(model: str, steps: int, seed: int, memory_len: int) -> dict[str, float]:
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    memory, head = make(model, memory_len)
    optim = torch.optim.Adam([*memory.parameters(), *head.parameters()], lr=1e-3)
    start = time.perf_counter()
    for _ in range(steps):
        data, count = episodes(32, generator)
        with set_recurrent_mode(True):
            logits = head(memory(data)["embed"])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), count.flatten())
        optim.zero_grad()
        loss.backward()
        optim.step()
    wall = time.perf_counter() - start
    data, count = episodes(1024, torch.Generator().manual_seed(10_000 + seed))
    with torch.no_grad(), set_recurrent_mode(True):
        answer = head(memory(data)["embed"]).argmax(-1)
    right = (answer == count).float()
    error = (answer - count).abs().float()
    return {
        "accuracy": right.mean().item(),
        "accuracy_late": right[:, 32:].mean().item(),
        "error": error.mean().item(),
        "error_late": error[:, 32:].mean().item(),
        "wall_s": wall,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--steps", type=int, default=2000, help="training steps per model"
    )
    parser.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1")
    parser.add_argument(
        "--memory-len",
        type=int,
        default=64,
        help="GTrXL's window (64 covers the 51-step episode)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke mode: 20 steps, one seed"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.seeds = 20, 1
    torch.set_num_threads(1)
    print(
        f"counting CountRecallEasy's colours, supervised: {args.steps} steps of 32 "
        "episodes, accuracy / mean |error| on 1,024 fresh episodes "
        "(all steps; steps 32-50)"
    )
    print(f"{'model':<6} {'seed':>4} {'accuracy':>15} {'|error|':>13} {'wall s':>7}")
    for model in ("gtrxl", "lstm"):
        for seed in range(args.seeds):
            r = train(model, args.steps, seed, args.memory_len)
            print(
                f"{model:<6} {seed:>4} {r['accuracy']:>7.3f} {r['accuracy_late']:>7.3f} "
                f"{r['error']:>6.2f} {r['error_late']:>6.2f} {r['wall_s']:>7.1f}"
            )


if __name__ == "__main__":
    main()

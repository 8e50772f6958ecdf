# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Which batch of CartPoles steps fastest under a recurrent policy, on this machine.

The recurrent PPO recipe (``examples/recurrent/recurrent_ppo.py``) steps 8
CartPoles at a time. This compares the three ways TorchRL offers, each with the
recipe's observation filter, episode-return counter and the policy's
``InitTracker`` and LSTM primer, stepped by a one-LSTM policy in a
:class:`~torchrl.collectors.Collector` (what the recipe does):

- ``SerialEnv`` of 8 ``GymEnv`` (one process);
- ``ParallelEnv`` of 8 ``GymEnv`` (one worker process per env);
- ``GymEnv("CartPole-v1", num_envs=8)``: gymnasium's own vector env.

Prints the median frames per second of each over ``--repeat`` collections and
the ratio to ``SerialEnv``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential

from torchrl.collectors import Collector
from torchrl.envs import GymEnv, ParallelEnv, RewardSum, SerialEnv, TransformedEnv
from torchrl.modules import LSTMModule, OneHotCategorical, ProbabilisticActor

sys.path.insert(
    0, str(Path(__file__).resolve().parent.parent / "examples" / "recurrent")
)
from recurrent_ppo import _make_one_env  # noqa: E402

KEEP = (0, 2)


def _policy() -> ProbabilisticActor:
    lstm = LSTMModule(
        input_size=len(KEEP), hidden_size=64, in_key="observation", out_key="embed"
    )
    head = TensorDictModule(
        torch.nn.Linear(64, 2), in_keys=["embed"], out_keys=["logits"]
    )
    return ProbabilisticActor(
        TensorDictSequential(lstm, head),
        in_keys=["logits"],
        distribution_class=OneHotCategorical,
    )


def _vector_env(num_envs: int):
    from recurrent_ppo import _keep_entries
    from torchrl.envs import UnaryTransform

    return TransformedEnv(
        GymEnv("CartPole-v1", num_envs=num_envs),
        UnaryTransform(
            in_keys=["observation"],
            out_keys=["observation"],
            fn=partial(_keep_entries, index=torch.tensor(KEEP)),
        ),
    )


def _make(kind: str, num_envs: int):
    one = partial(_make_one_env, "CartPole-v1", KEEP)
    if kind == "SerialEnv":
        base = SerialEnv(num_envs, one)
    elif kind == "ParallelEnv":
        base = ParallelEnv(num_envs, one)
    else:
        base = _vector_env(num_envs)
    return TransformedEnv(base, RewardSum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-envs", type=int, default=8, help="envs per batch")
    parser.add_argument(
        "--frames", type=int, default=8192, help="frames per collection"
    )
    parser.add_argument("--repeat", type=int, default=3, help="collections per kind")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {}
    for kind in ("SerialEnv", "ParallelEnv", "gymnasium vector env"):
        env = _make(kind, args.num_envs)
        env.set_seed(0)
        collector = Collector(
            env,
            _policy(),
            frames_per_batch=args.num_envs * 32,
            total_frames=-1,
            auto_register_policy_transforms=True,
        )
        fps = []
        iterator = iter(collector)
        next(iterator)  # warm-up
        for _ in range(args.repeat):
            start, frames = time.perf_counter(), 0
            while frames < args.frames:
                frames += next(iterator).numel()
            fps.append(frames / (time.perf_counter() - start))
        collector.shutdown()
        results[kind] = statistics.median(fps)
    base = results["SerialEnv"]
    print(
        f"{args.num_envs} CartPoles under a 64-unit LSTM policy, 1 torch thread: "
        "median frames/s over "
        f"{args.repeat} collections of {args.frames} frames"
    )
    for kind, value in results.items():
        print(f"  {kind:<22} {value:8.0f} frames/s  {value / base:5.2f}x SerialEnv")


if __name__ == "__main__":
    main()

# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Which batch of CartPoles steps fastest under a recurrent policy, on this machine.

The recurrent PPO recipe (``examples/recurrent/recurrent_ppo.py``) steps 16
CartPoles at a time. This compares the ways TorchRL offers, each built by the
recipe's own ``make_env`` (observation filter, episode returns, reward scale,
observation statistics) and completed by the collector with the policy's
``InitTracker`` and LSTM primer, stepped by a 64-unit LSTM policy in a
:class:`~torchrl.collectors.Collector`, as in the recipe:

- ``vector``: gymnasium's ``SyncVectorEnv`` through
  :class:`~torchrl.envs.GymWrapper` (auto-reset off; the recipe's default);
- ``serial``: :class:`~torchrl.envs.SerialEnv` of :class:`~torchrl.envs.GymEnv`;
- ``parallel``: :class:`~torchrl.envs.ParallelEnv` of
  :class:`~torchrl.envs.GymEnv` (one worker process per env);
- ``async``: ``GymEnv("CartPole-v1", num_envs=16)``, which TorchRL builds on
  gymnasium's ``AsyncVectorEnv`` (one process per env).

Prints the median frames per second of each over ``--repeat`` collections and
the ratio to ``serial``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential

from torchrl.collectors import Collector
from torchrl.envs import GymEnv, RewardSum, TransformedEnv
from torchrl.modules import LSTMModule, OneHotCategorical, ProbabilisticActor

sys.path.insert(
    0, str(Path(__file__).resolve().parent.parent / "examples" / "recurrent")
)
import recurrent_ppo  # noqa: E402

KINDS = ("vector", "serial", "parallel", "async")


def _policy(obs_dim: int) -> ProbabilisticActor:
    lstm = LSTMModule(
        input_size=obs_dim, hidden_size=64, in_key="observation", out_key="embed"
    )
    head = TensorDictModule(
        torch.nn.Linear(64, 2), in_keys=["embed"], out_keys=["logits"]
    )
    return ProbabilisticActor(
        TensorDictSequential(lstm, head),
        in_keys=["logits"],
        distribution_class=OneHotCategorical,
    )


def _make(kind: str, num_envs: int):
    if kind == "async":
        env = TransformedEnv(
            GymEnv("CartPole-v1", num_envs=num_envs), recurrent_ppo._keep((0, 2))
        )
        env.append_transform(RewardSum())
        env.set_seed(0)
        return env
    args = recurrent_ppo.parse_args(["--batched-env", kind])
    return recurrent_ppo.make_env(args, num_envs, seed=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-envs", type=int, default=16, help="envs per batch")
    parser.add_argument(
        "--frames", type=int, default=16384, help="frames per collection"
    )
    parser.add_argument("--repeat", type=int, default=3, help="collections per kind")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {}
    for kind in KINDS:
        env = _make(kind, args.num_envs)
        collector = Collector(
            env,
            _policy(env.observation_spec["observation"].shape[-1]),
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
    base = results["serial"]
    print(
        f"{args.num_envs} CartPoles under a 64-unit LSTM policy, 1 torch thread: "
        f"median frames/s over {args.repeat} collections of {args.frames} frames"
    )
    for kind, value in results.items():
        print(f"  {kind:<9} {value:8.0f} frames/s  {value / base:5.2f}x serial")


if __name__ == "__main__":
    main()

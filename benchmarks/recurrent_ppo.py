# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Recurrent PPO on CartPole without velocities: the fork's recipe against SB3-contrib, and its GTrXL variant.

Runs, one after the other in one run on the same machine with the same torch
thread count and the same number of frames:

- ``fork``: ``examples/recurrent/recurrent_ppo.py`` with its defaults (16
  envs x 32 steps per batch, 20 epochs, gamma 0.995, GAE lambda 0.95,
  learning rate linear from 1e-3, clip linear from 0.2, rewards x 0.1,
  observation statistics frozen after 20k frames, separate 64-unit LSTMs);
- ``sb3``: SB3-contrib's ``RecurrentPPO`` with RL Zoo's ``ppo_lstm``
  hyperparameters for ``CartPoleNoVel-v1`` (8 envs, ``n_steps`` 32, batch
  256, 20 epochs, gamma 0.98, GAE lambda 0.8, learning rate linear from 1e-3,
  clip range linear from 0.2, no entropy bonus, separate 64-unit LSTMs for the
  actor and the critic, ReLU heads of 64 units, ``ortho_init=False``) on
  ``CartPole-v1`` whose observation keeps entries 0 and 2, as in the Zoo;
- ``gtrxl`` (with ``--sides gtrxl,fork``): the same recipe with
  ``--policy gtrxl`` and its defaults, a
  :class:`~torchrl.modules.GTrXLModule` in place of each LSTM.

All evaluate every ``--eval-every`` frames on 10 deterministic episodes, and
the evaluation time counts in their wall time. Each run is its own
subprocess; the wall time is measured around it. Printed per seed and side:
wall time, frames per second, the first frame count at which the evaluation
reached 475, the time then on the run's own clock (from the start of
training: the interpreter's start-up left out), and the final evaluation
return; then the wall-time ratios of every side over the last one (medians
over seeds), for whole runs and to the first evaluation >= 475
(``--sides gtrxl,fork``: GTrXL over LSTM). The ``sb3`` side needs
``sb3-contrib`` (``requirements/bench.txt``).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "examples" / "recurrent" / "recurrent_ppo.py"
SOLVED = 475.0
# the sides that run the fork's recipe, with their extra flags
RECIPE_SIDES = {"fork": [], "gtrxl": ["--policy", "gtrxl"]}


def _sb3_worker(args: argparse.Namespace) -> list[dict[str, float]]:
    """Trains RecurrentPPO with the Zoo hyperparameters; returns the evaluation curve."""
    import gymnasium as gym
    import numpy as np
    import torch
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    torch.set_num_threads(args.threads)

    class KeepEntries(gym.ObservationWrapper):
        def __init__(self, env, keep=(0, 2)):
            super().__init__(env)
            self._keep = list(keep)
            low = env.observation_space.low[self._keep]
            high = env.observation_space.high[self._keep]
            self.observation_space = gym.spaces.Box(low, high, dtype=np.float32)

        def observation(self, observation):
            return observation[self._keep]

    def linear(start):
        return lambda progress_remaining: progress_remaining * start

    env = make_vec_env(
        "CartPole-v1", n_envs=8, seed=args.seed, wrapper_class=KeepEntries
    )
    eval_env = make_vec_env(
        "CartPole-v1", n_envs=10, seed=args.seed + 10_000, wrapper_class=KeepEntries
    )
    model = RecurrentPPO(
        "MlpLstmPolicy",
        env,
        n_steps=32,
        batch_size=256,
        n_epochs=20,
        gamma=0.98,
        gae_lambda=0.8,
        ent_coef=0.0,
        learning_rate=linear(1e-3),
        clip_range=linear(0.2),
        policy_kwargs={
            "ortho_init": False,
            "activation_fn": torch.nn.ReLU,
            "lstm_hidden_size": 64,
            "enable_critic_lstm": True,
            "net_arch": {"pi": [64], "vf": [64]},
        },
        seed=args.seed,
        device="cpu",
        verbose=0,
    )
    curve: list[dict[str, float]] = []
    start = time.monotonic()

    def evaluate(frames: int) -> None:
        mean, _ = evaluate_policy(
            model, eval_env, n_eval_episodes=10, deterministic=True
        )
        curve.append(
            {
                "frames": frames,
                "eval_return": float(mean),
                "wall_s": time.monotonic() - start,
            }
        )

    class Evaluate(BaseCallback):
        next_eval = args.eval_every

        def _on_step(self) -> bool:
            if self.num_timesteps >= self.next_eval:
                evaluate(self.num_timesteps)
                self.next_eval += args.eval_every
            return True

    evaluate(0)
    model.learn(total_timesteps=args.frames, callback=Evaluate())
    if curve[-1]["frames"] < model.num_timesteps:
        evaluate(model.num_timesteps)
    return curve


def _run(side: str, args: argparse.Namespace, seed: int) -> dict:
    """One training run in a subprocess: wall time around it, and its curve."""
    env = dict(os.environ, RL_WARNINGS="0", OMP_NUM_THREADS=str(args.threads))
    with tempfile.TemporaryDirectory() as out:
        common = [
            "--seed",
            str(seed),
            "--frames",
            str(args.frames),
            "--threads",
            str(args.threads),
            "--eval-every",
            str(args.eval_every),
        ]
        if side in RECIPE_SIDES:
            cmd = [sys.executable, str(RECIPE), *common, "--no-progress", "--out", out]
            cmd += RECIPE_SIDES[side]
        else:
            cmd = [sys.executable, __file__, "--worker", *common]
        start = time.monotonic()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.monotonic() - start
        if proc.returncode != 0:
            raise RuntimeError(
                f"{side} run (seed {seed}) failed:\n{proc.stdout[-3000:]}\n"
                f"{proc.stderr[-3000:]}"
            )
        if side in RECIPE_SIDES:
            with open(Path(out) / "learning_curve.csv") as file:
                curve = [
                    {k: float(v) for k, v in row.items()}
                    for row in csv.DictReader(file)
                ]
        else:
            curve = json.loads(proc.stdout.strip().splitlines()[-1])
    solved = next((r for r in curve if r["eval_return"] >= SOLVED), None)
    frames = curve[-1]["frames"]
    return {
        "wall_s": wall,
        "fps": frames / wall,
        "solved_at": None if solved is None else solved["frames"],
        "solved_wall_s": None if solved is None else solved["wall_s"],
        "final": curve[-1]["eval_return"],
        "frames": frames,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--frames", type=int, default=100_000, help="frames per training run"
    )
    parser.add_argument(
        "--seeds",
        default="0",
        help="comma-separated seeds; each seed runs both sides (default: 0)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help=argparse.SUPPRESS
    )  # worker only
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads on both sides"
    )
    parser.add_argument(
        "--eval-every",
        type=int,
        default=10_000,
        help="frames between two evaluations, on both sides",
    )
    parser.add_argument(
        "--sides",
        default="fork,sb3",
        help="which sides to run, comma-separated, the last one the reference "
        "of the ratios: fork (the LSTM recipe), sb3 and/or gtrxl (default: "
        "fork,sb3)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_sb3_worker(args)))
        return
    sides = args.sides.split(",")
    unknown = set(sides) - {"sb3", *RECIPE_SIDES}
    if unknown:
        parser.error(f"--sides takes fork, sb3 and/or gtrxl, got {sorted(unknown)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    print(
        f"recurrent PPO, CartPole-v1 keeping entries 0 and 2, {args.frames} frames, "
        f"{args.threads} torch thread(s), evaluation every {args.eval_every} frames "
        f"(10 deterministic episodes); 'solved at' = first evaluation >= {SOLVED:g}"
    )
    header = [
        "side",
        "seed",
        "wall s",
        "frames/s",
        "solved at",
        "s to solve",
        "final return",
    ]
    rows = [header]
    walls = {side: [] for side in sides}
    to_solve = {side: [] for side in sides}
    for seed in seeds:
        for side in sides:
            result = _run(side, args, seed)
            walls[side].append(result["wall_s"])
            # a run that never solves counts as its whole wall time
            solved_wall = result["solved_wall_s"]
            to_solve[side].append(
                result["wall_s"] if solved_wall is None else solved_wall
            )
            solved = result["solved_at"]
            rows.append(
                [
                    side,
                    str(seed),
                    f"{result['wall_s']:.1f}",
                    f"{result['fps']:.0f}",
                    "never" if solved is None else f"{solved:.0f}",
                    "-" if solved is None else f"{result['solved_wall_s']:.1f}",
                    f"{result['final']:.1f}",
                ]
            )
            print("  ".join(rows[-1]), flush=True)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    print()
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
    reference = sides[-1]
    for side in sides[:-1]:
        for what, times in (("whole runs", walls), ("to solve", to_solve)):
            ratio = statistics.median(times[side]) / statistics.median(times[reference])
            print(
                f"wall-time ratio {side} / {reference}, {what} (medians over "
                f"{len(seeds)} seed(s)): {ratio:.2f}x"
            )


if __name__ == "__main__":
    main()

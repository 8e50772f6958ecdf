# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Recurrent DQN scaled out on Ray: two collector actors fill one sequence replay buffer.

Two :class:`~torchrl.collectors.distributed.RayCollector` workers play CartPole
with an LSTM Q-value policy and write whole trajectories into a
:class:`~torchrl.data.RayReplayBuffer` (a Ray actor) whose
:class:`~torchrl.data.SliceSampler` is given no key argument. The learner, on
the driver, samples flat sequence batches from it, trains a DQN loss under
``set_recurrent_mode(True)`` and pushes its weights back to the workers with
``collector.update_policy_weights_()``:

- each worker completes its env from the policy
  (``auto_register_policy_transforms=True``: the ``InitTracker`` and the LSTM's
  recurrent-state primer);
- worker ``i`` of ``n`` numbers its trajectories ``i, i + n, ...``, so the
  sampler never joins two workers' trajectories written next to each other;
  it marks every slice start in ``"is_init"``, and pads the short slices with
  a ``("collector", "mask")`` that :class:`~torchrl.objectives.DQNLoss` honours;
- nothing is reshaped to ``[batch, time]``, no hidden state is carried by hand,
  no mask is handled here.

``--mode background`` (the default) collects in a thread (``collector.start()``)
while the learner trains; ``--mode iterator`` alternates: one collection round
(``for _ in collector``), then the updates.

Resources: the script starts a local Ray cluster of ``--ray-cpus`` (2) CPUs;
each collector actor asks for ``--collector-cpus`` (0.5) and the buffer actor
for ``--buffer-cpus`` (0.5) of them, with no memory reservation, so that the
two collectors, the buffer and the driver fit on a 2-CPU machine. Ray waits
forever for an actor it cannot place; RayCollector and RayReplayBuffer raise
an error that says what is missing instead.

It prints a progress bar, one line per evaluation (``--eval-episodes``
deterministic episodes on the driver), writes ``learning_curve.csv`` and
``learning_curve.png`` to ``--out`` and ends with
``eval return R after F frames in W s``; TorchRL's and Ray's INFO log lines
are left out (``RL_LOGGING_LEVEL=INFO`` shows TorchRL's). ``--help`` lists
every flag.
"""
from __future__ import annotations

import argparse
import csv
import functools
import logging
import os
import time
from pathlib import Path

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential

from torchrl.collectors.distributed import RayCollector
from torchrl.data import LazyTensorStorage, RayReplayBuffer, SliceSampler
from torchrl.envs import ExplorationType, GymEnv, set_exploration_type
from torchrl.modules import (
    EGreedyModule,
    LSTMModule,
    MLP,
    QValueModule,
    set_recurrent_mode,
)
from torchrl.objectives import DQNLoss, SoftUpdate

DESCRIPTION = __doc__.split("\n")[0]


def _at_least(minimum: float, kind=int):
    def parse(value: str):
        try:
            number = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"takes a {kind.__name__}, got {value!r}"
            ) from None
        if number < minimum:
            raise argparse.ArgumentTypeError(
                f"must be at least {minimum}, got {number}"
            )
        return number

    return parse


def _in_range(low: float, high: float, *, low_open: bool = False):
    """A float in ``[low, high]`` (``(low, high]`` with ``low_open``)."""

    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"takes a float, got {value!r}") from None
        if number > high or number < low or (low_open and number == low):
            bounds = f"{'(' if low_open else '['}{low}, {high}]"
            raise argparse.ArgumentTypeError(f"must be in {bounds}, got {number}")
        return number

    return parse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=DESCRIPTION,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--mode",
        choices=["background", "iterator"],
        default="background",
        help="collect in a background thread (collector.start()) or alternate "
        "collection rounds and updates (for _ in collector)",
    )
    parser.add_argument(
        "--frames", type=_at_least(1), default=20_000, help="frames to collect"
    )
    parser.add_argument(
        "--workers", type=_at_least(1), default=2, help="Ray collector actors"
    )
    parser.add_argument(
        "--frames-per-batch",
        type=_at_least(1),
        default=128,
        help="frames each worker collects per round",
    )
    parser.add_argument(
        "--warmup", type=_at_least(0), default=1_000, help="frames before training"
    )
    parser.add_argument(
        "--updates-per-round",
        type=_at_least(1),
        default=16,
        help="learner updates per collection round of all workers "
        "(background: per --frames-per-batch x --workers new frames)",
    )
    parser.add_argument(
        "--slice-len", type=_at_least(2), default=16, help="steps per slice"
    )
    parser.add_argument(
        "--num-slices", type=_at_least(1), default=16, help="slices per batch"
    )
    parser.add_argument(
        "--lr",
        type=_in_range(0.0, float("inf"), low_open=True),
        default=2e-3,
        help="Adam learning rate",
    )
    parser.add_argument(
        "--gamma", type=_in_range(0.0, 1.0), default=0.99, help="discount"
    )
    parser.add_argument(
        "--eval-every", type=_at_least(1), default=5_000, help="frames between evals"
    )
    parser.add_argument(
        "--eval-episodes",
        type=_at_least(1),
        default=5,
        help="deterministic episodes per evaluation",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of torch and envs")
    parser.add_argument(
        "--threads",
        type=_at_least(1),
        default=1,
        help="torch threads of the learner and of each worker",
    )
    parser.add_argument(
        "--ray-cpus",
        type=_at_least(1),
        default=2,
        help="CPUs of the local Ray cluster the script starts",
    )
    parser.add_argument(
        "--collector-cpus",
        type=_at_least(0.0, float),
        default=0.5,
        help="CPUs each collector actor asks Ray for",
    )
    parser.add_argument(
        "--buffer-cpus",
        type=_at_least(0.0, float),
        default=0.5,
        help="CPUs the replay-buffer actor asks Ray for",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("runs/ray_sequence_replay"),
        help="folder for learning_curve.csv and learning_curve.png",
    )
    return parser.parse_args(argv)


def make_env(seed: int | None = None):
    env = GymEnv("CartPole-v1")
    if seed is not None:
        env.set_seed(seed)
    return env


def make_policy(env) -> TensorDictSequential:
    """observation -> LSTM -> MLP -> action values -> greedy action."""
    obs_dim = env.observation_spec["observation"].shape[-1]
    lstm = LSTMModule(
        input_size=obs_dim, hidden_size=32, in_key="observation", out_key="embed"
    )
    head = TensorDictModule(
        MLP(in_features=32, out_features=env.action_spec.shape[-1], num_cells=[64]),
        in_keys=["embed"],
        out_keys=["action_value"],
    )
    return TensorDictSequential(lstm, head, QValueModule(spec=env.action_spec))


def evaluate(env, policy, episodes: int) -> float:
    returns = []
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        for _ in range(episodes):
            rollout = env.rollout(500, policy, break_when_any_done=True)
            returns.append(rollout["next", "reward"].sum().item())
    return sum(returns) / len(returns)


def write_curve(out: Path, rows: list[dict[str, float]], title: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "learning_curve.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=["frames", "eval_return", "wall_s"])
        writer.writeheader()
        writer.writerows(rows)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["frames"] for r in rows], [r["eval_return"] for r in rows], marker="o")
    ax.set_xlabel("frames collected")
    ax.set_ylabel("deterministic eval return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "learning_curve.png", dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, float]:
    import ray
    from tqdm import tqdm

    args = parse_args(argv)
    # INFO log lines (a Ray actor killed at shutdown) are not the run's output
    if "RL_LOGGING_LEVEL" not in os.environ:
        logging.getLogger("torchrl").setLevel(logging.WARNING)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    t0 = time.monotonic()

    threads = str(args.threads)
    ray.init(
        num_cpus=args.ray_cpus,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
        runtime_env={"env_vars": {"OMP_NUM_THREADS": threads}},
    )
    eval_env = make_env(args.seed + 1000)
    policy = make_policy(eval_env)
    # the driver's env gets its transforms from the policy too
    eval_env = GymEnv("CartPole-v1", policy=policy)
    eval_env.set_seed(args.seed + 1000)
    exploration = EGreedyModule(
        eval_env.action_spec,
        eps_init=1.0,
        eps_end=0.05,
        annealing_num_steps=max(1, args.frames // 2),
    )
    # The workers explore with the epsilon they were sent last
    collect_policy = TensorDictSequential(policy, exploration)

    rb = RayReplayBuffer(
        storage=functools.partial(LazyTensorStorage, 100_000),
        # no key argument: the trajectories come from ("collector", "traj_ids")
        sampler=functools.partial(
            SliceSampler,
            slice_len=args.slice_len,
            strict_length=False,
            pad_output=True,
        ),
        batch_size=args.num_slices * args.slice_len,
        remote_config={"num_cpus": args.buffer_cpus, "memory": None},
    )
    round_frames = args.frames_per_batch * args.workers
    collector = RayCollector(
        [functools.partial(make_env, args.seed + i) for i in range(args.workers)],
        collect_policy,
        # async: each worker's round; sync: all workers' round together
        frames_per_batch=round_frames
        if args.mode == "iterator"
        else args.frames_per_batch,
        total_frames=args.frames,
        replay_buffer=rb,
        remote_configs={"num_cpus": args.collector_cpus, "memory": None},
        auto_register_policy_transforms=True,
        sync=args.mode == "iterator",
    )
    collector.update_policy_weights_()

    loss_fn = DQNLoss(policy, action_space=eval_env.action_spec, delay_value=True)
    loss_fn.make_value_estimator(gamma=args.gamma)
    target_updater = SoftUpdate(loss_fn, eps=0.99)
    optim = torch.optim.Adam(loss_fn.parameters(), lr=args.lr)

    curve: list[dict[str, float]] = []
    next_eval = 0
    updates = 0
    loss_value = float("nan")
    bar = tqdm(total=args.frames, unit="frame", mininterval=1.0)

    def train(n: int) -> None:
        nonlocal updates, loss_value
        for _ in range(n):
            sample = rb.sample()  # flat: num_slices * slice_len rows
            with set_recurrent_mode(True):
                loss = loss_fn(sample)["loss"]
            optim.zero_grad()
            loss.backward()
            optim.step()
            target_updater.step()
            updates += 1
            loss_value = loss.item()
        exploration.step(n * round_frames // args.updates_per_round)
        collector.update_policy_weights_()

    def log(frames: int) -> None:
        nonlocal next_eval
        bar.update(min(frames, args.frames) - bar.n)
        bar.set_postfix(loss=f"{loss_value:.3f}", eps=f"{exploration.eps.item():.2f}")
        while frames >= next_eval:
            ret = evaluate(eval_env, policy, args.eval_episodes)
            wall = time.monotonic() - t0
            curve.append({"frames": frames, "eval_return": ret, "wall_s": wall})
            bar.write(
                f"eval: return {ret:.1f} after {frames} frames ({updates} updates)"
            )
            next_eval += args.eval_every

    try:
        log(0)
        if args.mode == "iterator":
            for _ in collector:  # the workers wrote the round into the buffer
                frames = rb.write_count
                if frames >= args.warmup:
                    train(args.updates_per_round)
                log(frames)
        else:
            collector.start()
            trained_for = 0
            while True:
                frames = rb.write_count
                if frames >= args.frames:
                    break
                if frames >= args.warmup and frames - trained_for >= round_frames:
                    train(args.updates_per_round)
                    trained_for += round_frames
                else:
                    time.sleep(0.05)
                log(frames)
        frames = rb.write_count
        if curve[-1]["frames"] != frames:  # a last evaluation at the end
            next_eval = min(next_eval, frames)
        log(frames)
    finally:
        bar.close()
        collector.shutdown()
        rb.close()
        ray.shutdown()

    write_curve(args.out, curve, f"recurrent DQN on Ray ({args.mode})")
    wall = time.monotonic() - t0
    print(
        f"eval return {curve[-1]['eval_return']:.1f} after {frames} frames "
        f"in {wall:.0f} s"
    )
    return {"eval_return": curve[-1]["eval_return"], "frames": frames, "wall": wall}


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()

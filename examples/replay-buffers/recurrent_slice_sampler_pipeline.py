# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Recurrent sequence training fed by a background collector, with no hand-wiring.

A recurrent (GRU) Q-value policy plays CartPole in a collector that runs in the
background (``collector.start()``) and writes whole trajectories into a replay
buffer. The training loop samples sequences from that buffer with a
:class:`~torchrl.data.SliceSampler` given no key argument, and feeds the flat
sample straight into a DQN loss under ``set_recurrent_mode(True)``:

- the env is completed from the policy by the collector
  (``auto_register_policy_transforms=True`` appends the ``InitTracker`` and the
  GRU's recurrent-state primer);
- the sampler finds the trajectories from ``("collector", "traj_ids")`` and
  marks every slice start in ``"is_init"``, so the GRU runs each slice as its
  own sequence from the hidden state stored at its first step;
- nothing is reshaped to ``[batch, time]``, padded or masked in this script.

Run ``python examples/replay-buffers/recurrent_slice_sampler_pipeline.py
--help`` for the flags. It runs in well under a minute on 2 CPU cores and
ends with a line that compares the loss at the start and at the end.
"""
from __future__ import annotations

import argparse
import time

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential

from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, SliceSampler, TensorDictReplayBuffer
from torchrl.envs import GymEnv
from torchrl.modules import (
    EGreedyModule,
    GRUModule,
    MLP,
    QValueModule,
    set_recurrent_mode,
)
from torchrl.objectives import DQNLoss, SoftUpdate


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--frames",
        type=int,
        default=1_000,
        help="frames the collector writes before training starts (default: 1000)",
    )
    parser.add_argument(
        "--steps", type=int, default=60, help="optimisation steps (default: 60)"
    )
    parser.add_argument(
        "--slice-len", type=int, default=16, help="steps per slice (default: 16)"
    )
    parser.add_argument(
        "--num-slices", type=int, default=8, help="slices per batch (default: 8)"
    )
    parser.add_argument(
        "--lr", type=float, default=1e-3, help="Adam learning rate (default: 1e-3)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("frames", "steps", "slice_len", "num_slices"):
        if getattr(args, name) < 1:
            parser.error(
                f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}"
            )
    return args


def make_policy(env):
    """A GRU Q-value policy: observation -> GRU -> MLP -> action values -> action."""
    obs_dim = env.observation_spec["observation"].shape[-1]
    gru = GRUModule(
        input_size=obs_dim, hidden_size=32, in_key="observation", out_key="embed"
    )
    head = TensorDictModule(
        MLP(in_features=32, out_features=env.action_spec.shape[-1], num_cells=[32]),
        in_keys=["embed"],
        out_keys=["action_value"],
    )
    qvalue = QValueModule(spec=env.action_spec)
    return TensorDictSequential(gru, head, qvalue)


def main(argv=None) -> dict[str, float]:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    # Tiny models, and the collector thread runs next to the training loop:
    # more intra-op threads only make them wait on each other.
    torch.set_num_threads(1)

    env = GymEnv("CartPole-v1")
    env.set_seed(args.seed)
    policy = make_policy(env)
    exploration = EGreedyModule(
        env.action_spec, eps_init=0.5, eps_end=0.05, annealing_num_steps=args.steps
    )
    collect_policy = TensorDictSequential(policy, exploration)

    # One flat storage; the sampler is given no key argument.
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(100_000),
        sampler=SliceSampler(slice_len=args.slice_len),
        batch_size=args.num_slices * args.slice_len,
    )
    collector = Collector(
        env,
        collect_policy,
        frames_per_batch=64,
        total_frames=-1,
        replay_buffer=rb,
        trajs_per_batch=1,  # write whole trajectories only
        auto_register_policy_transforms=True,  # InitTracker + GRU primer
    )
    print(f"env completed by the collector: {collector.env.transform}")
    collector.start()

    t0 = time.monotonic()
    while len(rb) < args.frames:
        if time.monotonic() - t0 > 120:
            collector.async_shutdown()
            raise RuntimeError(
                f"the collector wrote {len(rb)} frames in 120 s, fewer than "
                f"--frames={args.frames}: lower --frames"
            )
        time.sleep(0.05)
    print(f"buffer warm: {len(rb)} frames in {time.monotonic() - t0:.1f}s")

    loss_fn = DQNLoss(policy, action_space=env.action_spec, delay_value=True)
    loss_fn.make_value_estimator(gamma=0.9)
    target_updater = SoftUpdate(loss_fn, eps=0.95)
    optim = torch.optim.Adam(loss_fn.parameters(), lr=args.lr)

    losses = []
    try:
        for step in range(args.steps):
            sample = rb.sample()  # flat: num_slices * slice_len rows
            with set_recurrent_mode(True):
                loss = loss_fn(sample)["loss"]
            optim.zero_grad()
            loss.backward()
            optim.step()
            target_updater.step()
            exploration.step()
            losses.append(loss.item())
            if step % max(1, args.steps // 10) == 0 or step == args.steps - 1:
                print(
                    f"step {step:4d}: loss {loss.item():.4f}, buffer {len(rb)} "
                    f"frames, sample {tuple(sample.shape)}"
                )
    finally:
        collector.async_shutdown()

    window = max(1, min(10, len(losses) // 4))
    first = sum(losses[:window]) / window
    last = sum(losses[-window:]) / window
    print(
        f"loss trend: first {window} steps {first:.4f} -> last {window} steps "
        f"{last:.4f} ({'down' if last < first else 'up'} {abs(last - first) / first:.0%})"
    )
    return {"first": first, "last": last}


if __name__ == "__main__":
    main()

# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""R2D2-style recurrent DQN from replay on CartPole without velocities.

Recurrent double DQN trained off-policy from a replay buffer of sequences, as
in R2D2 (Kapturowski et al., ICLR 2019), built from TorchRL's own pieces:

- the env is the one of ``recurrent_ppo.py`` (the same flags): a batch of
  gymnasium CartPoles that show only the cart position and the pole angle
  (``--obs-keep 0,2``), so the Q-network must infer the velocities from
  memory; the :class:`~torchrl.collectors.Collector` completes it from the
  policy (``auto_register_policy_transforms=True``) and stores the LSTM's
  recurrent state at every step;
- each batch of ``[envs, steps]`` goes to a replay buffer that keeps one time
  series per env (``LazyTensorStorage(..., ndim=2)``); the
  :class:`~torchrl.data.SliceSampler` (``--prioritized``:
  :class:`~torchrl.data.PrioritizedSliceSampler`) finds the trajectories
  itself and returns flat sequences that start from the recurrent state
  stored at collection time, each preceded by ``--burn-in`` earlier steps of
  its trajectory: the LSTM runs them without gradient to warm up that stale
  state, and the loss ignores them (they are masked out, like the padding);
- :class:`~torchrl.objectives.DQNLoss` (double DQN, a target network updated
  with :class:`~torchrl.objectives.SoftUpdate`) with TD(lambda) targets,
  under ``set_recurrent_mode(True)``: the bootstrap pass runs every sequence
  from its stored state, with the same burn-in.

``--policy gtrxl`` swaps the LSTM for a gated Transformer-XL memory
(:class:`~torchrl.modules.GTrXLModule`). Its memory is too large to store at
every step (``2 x --layers x --memory-len x --embed-dim`` floats), so by
default the buffer drops it on writing (an inverse
:class:`~torchrl.envs.ExcludeTransform`) and each sequence starts from an
empty memory that a burn-in of ``--layers x --memory-len`` steps rebuilds
exactly; ``--store-memory`` keeps it.

TD(lambda) rather than n-step returns: the targets come out of the whole
replayed sequence in one pass (R2D2's n-step returns are its ``lmbda``-free
special case), and ``--lmbda 0`` gives one-step targets.

Nothing is reshaped, no hidden state is carried by hand, no mask is handled
here. The script prints a progress bar and one line per evaluation
(``--eval-episodes`` greedy episodes), writes ``learning_curve.csv`` and
``learning_curve.png`` to ``--out`` and ends with
``eval return R after F frames in W s``; TorchRL's INFO log lines are left
out (``RL_LOGGING_LEVEL=INFO`` shows them). ``--help`` lists every flag.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from recurrent_ppo import (
    _check_env,
    _obs_keep,
    _positive_int,
    _unit_float,
    _vecnorm,
    add_gtrxl_flags,
    add_logger_flag,
    check_gtrxl_flags,
    HelpFormatter,
    inputs_used,
    make_env,
    make_gtrxl,
    quiet_info_logs,
    RunLog,
)
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn

from torchrl.collectors import Collector
from torchrl.data import (
    LazyTensorStorage,
    PrioritizedSliceSampler,
    SliceSampler,
    TensorDictReplayBuffer,
)
from torchrl.envs import ExcludeTransform
from torchrl.modules import (
    EGreedyModule,
    GRUModule,
    LSTMModule,
    MLP,
    QValueModule,
    set_recurrent_mode,
)
from torchrl.objectives import DQNLoss, SoftUpdate, ValueEstimators

DESCRIPTION = __doc__.split("\n")[0]


def _non_negative_int(name: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{name} takes a non-negative integer, got {value!r}"
        ) from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"{name} must be at least 0, got {number}")
    return number


def _positive_float(name: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{name} takes a number, got {value!r}"
        ) from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"{name} must be positive, got {number}")
    return number


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=DESCRIPTION,
        epilog="Defaults solve CartPole-v1 without velocities within 300k frames.",
        formatter_class=HelpFormatter,
    )
    env = parser.add_argument_group("environment")
    env.add_argument(
        "--env",
        default="CartPole-v1",
        help="gymnasium id (POPGym's as popgym:popgym-<Task>-v0) with a 1-d "
        "Box, Discrete, MultiDiscrete or Tuple-of-Discrete observation (the "
        "discrete ones one-hot encoded) and a Discrete action space",
    )
    env.add_argument(
        "--obs-keep",
        type=_obs_keep,
        default="auto",
        metavar="I,J|all|auto",
        help="entries of a Box observation the agent sees ('all' for every "
        "entry); 'auto' keeps CartPole-v1's cart position and pole angle, and "
        "every entry of another env",
    )
    env.add_argument(
        "--max-episode-steps",
        type=lambda v: _positive_int("--max-episode-steps", v),
        default=None,
        help="step limit of an evaluation episode (default: the env's "
        "registered limit, else its own max_episode_length, as POPGym's envs)",
    )
    env.add_argument(
        "--prev-action",
        action="store_true",
        help="append the previous action (one-hot) and a first-step flag to "
        "the observation, as POPGym's baselines feed every model",
    )
    env.add_argument(
        "--num-envs",
        type=lambda v: _positive_int("--num-envs", v),
        default=8,
        help="envs stepped together by the collector",
    )
    env.add_argument(
        "--batched-env",
        choices=["vector", "serial", "parallel"],
        default="vector",
        help="gymnasium's SyncVectorEnv, or TorchRL's SerialEnv / ParallelEnv "
        "of GymEnv",
    )
    env.add_argument(
        "--reward-scale",
        type=lambda v: _positive_float("--reward-scale", v),
        default=0.1,
        help="rewards are multiplied by this (RewardScaling)",
    )
    env.add_argument(
        "--no-obs-norm",
        dest="obs_norm",
        action="store_false",
        default=None,
        help="do not normalize the observation (by default VecNormV2 normalizes "
        "a Box observation; a one-hot one is left as it is)",
    )
    env.add_argument(
        "--obs-norm-frames",
        type=lambda v: _non_negative_int("--obs-norm-frames", v),
        default=20_000,
        help="the observation statistics stop moving after this many frames "
        "(0: never frozen)",
    )
    agent = parser.add_argument_group("agent")
    agent.add_argument(
        "--policy",
        choices=["rnn", "gtrxl", "mlp"],
        default="rnn",
        help="'rnn': a recurrent Q-network (--rnn); 'gtrxl': a gated "
        "Transformer-XL memory (GTrXLModule, the GTrXL flags); 'mlp': the same "
        "agent without memory, the control",
    )
    agent.add_argument(
        "--rnn", choices=["lstm", "gru"], default="lstm", help="recurrent cell"
    )
    agent.add_argument(
        "--hidden",
        type=lambda v: _positive_int("--hidden", v),
        default=64,
        help="units of the RNN and of the Q head's hidden layer",
    )
    add_gtrxl_flags(parser, embed_dim=64)
    replay = parser.add_argument_group("replay")
    replay.add_argument(
        "--burn-in",
        type=lambda v: _non_negative_int("--burn-in", v),
        default=None,
        help="steps replayed before each sequence to warm up its stored "
        "recurrent state, without gradient and outside the loss (0: none; "
        "default 8, and --layers x --memory-len with --policy gtrxl, which "
        "rebuilds the memory exactly when the buffer stores none)",
    )
    replay.add_argument(
        "--store-memory",
        action="store_true",
        help="--policy gtrxl: store the GTrXL memory of every step in the "
        "buffer (2 x --layers x --memory-len x --embed-dim floats per step); "
        "by default it is dropped on writing and each sequence starts from "
        "an empty memory warmed up by the burn-in",
    )
    replay.add_argument(
        "--seq-len",
        type=lambda v: _positive_int("--seq-len", v),
        default=16,
        help="training steps per replayed sequence",
    )
    replay.add_argument(
        "--num-slices",
        type=lambda v: _positive_int("--num-slices", v),
        default=32,
        help="sequences per minibatch",
    )
    replay.add_argument(
        "--buffer-size",
        type=lambda v: _positive_int("--buffer-size", v),
        default=100_000,
        help="replay capacity, in steps",
    )
    replay.add_argument(
        "--prioritized",
        action="store_true",
        help="prioritized sequence replay (PrioritizedSliceSampler, priorities "
        "from the TD errors of the training steps)",
    )
    replay.add_argument(
        "--alpha",
        type=lambda v: _unit_float("--alpha", v),
        default=0.6,
        help="prioritization exponent (with --prioritized)",
    )
    replay.add_argument(
        "--beta",
        type=lambda v: _unit_float("--beta", v),
        default=0.4,
        help="importance-sampling exponent (with --prioritized)",
    )
    learn = parser.add_argument_group("learning")
    learn.add_argument(
        "--frames",
        type=lambda v: _positive_int("--frames", v),
        default=300_000,
        help="environment steps to collect",
    )
    learn.add_argument(
        "--steps-per-env",
        type=lambda v: _positive_int("--steps-per-env", v),
        default=16,
        help="steps each env takes per collected batch",
    )
    learn.add_argument(
        "--updates-per-batch",
        type=lambda v: _positive_int("--updates-per-batch", v),
        default=8,
        help="gradient steps after each collected batch",
    )
    learn.add_argument(
        "--warmup-frames",
        type=lambda v: _non_negative_int("--warmup-frames", v),
        default=5_000,
        help="frames collected before the first update",
    )
    learn.add_argument(
        "--lr",
        type=lambda v: _positive_float("--lr", v),
        default=5e-4,
        help="Adam learning rate at the start; it decays linearly to 0 at " "--frames",
    )
    learn.add_argument(
        "--gamma",
        type=lambda v: _unit_float("--gamma", v),
        default=0.99,
        help="discount",
    )
    learn.add_argument(
        "--lmbda",
        type=lambda v: _unit_float("--lmbda", v),
        default=0.9,
        help="TD(lambda) of the targets (0: one-step targets)",
    )
    learn.add_argument(
        "--tau",
        type=lambda v: _unit_float("--tau", v, low_open=True),
        default=0.005,
        help="soft update rate of the target network",
    )
    learn.add_argument(
        "--eps-start",
        type=lambda v: _unit_float("--eps-start", v),
        default=1.0,
        help="initial epsilon of the epsilon-greedy exploration",
    )
    learn.add_argument(
        "--eps-end",
        type=lambda v: _unit_float("--eps-end", v),
        default=0.05,
        help="final epsilon",
    )
    learn.add_argument(
        "--eps-frames",
        type=lambda v: _positive_int("--eps-frames", v),
        default=50_000,
        help="frames over which epsilon decays linearly",
    )
    learn.add_argument(
        "--max-grad-norm",
        type=lambda v: _positive_float("--max-grad-norm", v),
        default=10.0,
        help="gradient norm clipping",
    )
    run = parser.add_argument_group("run")
    run.add_argument("--seed", type=int, default=0, help="random seed")
    run.add_argument(
        "--threads",
        type=lambda v: _positive_int("--threads", v),
        default=1,
        help="torch threads",
    )
    run.add_argument(
        "--eval-every",
        type=lambda v: _positive_int("--eval-every", v),
        default=20_000,
        help="frames between two evaluations",
    )
    run.add_argument(
        "--eval-episodes",
        type=lambda v: _positive_int("--eval-episodes", v),
        default=10,
        help="greedy episodes per evaluation (one per env of the evaluation batch)",
    )
    run.add_argument(
        "--out",
        type=Path,
        default=Path("runs/r2d2"),
        help="folder of learning_curve.csv and learning_curve.png",
    )
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_logger_flag(run)
    args = parser.parse_args(argv)
    check_gtrxl_flags(parser, args)
    if args.store_memory and args.policy != "gtrxl":
        parser.error("--store-memory is for --policy gtrxl (an RNN's state is stored)")
    if args.burn_in is None:
        args.burn_in = args.layers * args.memory_len if args.policy == "gtrxl" else 8
    if args.frames < args.num_envs * args.steps_per_env:
        parser.error(
            f"--frames={args.frames} is less than one batch "
            f"(--num-envs x --steps-per-env = {args.num_envs * args.steps_per_env})"
        )
    if args.buffer_size < args.num_envs * (args.burn_in + args.seq_len):
        parser.error(
            f"--buffer-size={args.buffer_size} cannot hold one sequence of "
            f"--burn-in + --seq-len = {args.burn_in + args.seq_len} steps per env "
            f"for --num-envs={args.num_envs}"
        )
    _check_env(parser, args)
    return args


def make_qnet(args: argparse.Namespace, obs_dim: int, action_spec) -> nn.Module:
    """The Q-network: an RNN, a GTrXL (or nothing, for ``--policy mlp``), an MLP head and the greedy action."""
    hidden = args.hidden
    if args.policy == "mlp":
        trunk = TensorDictModule(
            nn.Identity(), in_keys=["observation"], out_keys=["embed"]
        )
    elif args.policy == "gtrxl":
        trunk = make_gtrxl(args, obs_dim, "q", "embed")
    elif args.rnn == "lstm":
        trunk = LSTMModule(
            input_size=obs_dim,
            hidden_size=hidden,
            in_keys=["observation", "q_h", "q_c"],
            out_keys=["embed", ("next", "q_h"), ("next", "q_c")],
        )
    else:
        trunk = GRUModule(
            input_size=obs_dim,
            hidden_size=hidden,
            in_keys=["observation", "q_h"],
            out_keys=["embed", ("next", "q_h")],
        )
    head = TensorDictModule(
        MLP(
            in_features={"mlp": obs_dim, "gtrxl": args.embed_dim}.get(
                args.policy, hidden
            ),
            out_features=action_spec.shape[-1],
            num_cells=[hidden],
            activation_class=nn.ReLU,
        ),
        in_keys=["embed"],
        out_keys=["action_value"],
    )
    return TensorDictSequential(trunk, head, QValueModule(spec=action_spec))


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    quiet_info_logs()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    start = time.monotonic()

    env = make_env(args, args.num_envs, args.seed)
    obs_dim = env.observation_spec["observation"].shape[-1]
    qnet = make_qnet(args, obs_dim, env.action_spec_unbatched)
    explore = EGreedyModule(
        env.action_spec,
        eps_init=args.eps_start,
        eps_end=args.eps_end,
        annealing_num_steps=args.eps_frames // args.num_envs,
    )
    policy = TensorDictSequential(qnet, explore)
    # Evaluation is greedy: policy= completes its env for the Q-network.
    eval_env = make_env(args, args.eval_episodes, args.seed + 10_000, policy=qnet)
    frames_per_batch = args.num_envs * args.steps_per_env
    total_frames = args.frames // frames_per_batch * frames_per_batch
    collector = Collector(
        env,
        policy,
        frames_per_batch=frames_per_batch,
        total_frames=total_frames,
        auto_register_policy_transforms=True,
    )

    loss_fn = DQNLoss(
        qnet,
        action_space=env.action_spec_unbatched,
        delay_value=True,
        double_dqn=True,
    )
    if args.lmbda > 0:
        loss_fn.make_value_estimator(
            ValueEstimators.TDLambda, gamma=args.gamma, lmbda=args.lmbda
        )
    else:
        # TD(0): TorchRL's vectorized TD(lambda) fails on lmbda=0
        loss_fn.make_value_estimator(ValueEstimators.TD0, gamma=args.gamma)
    target_update = SoftUpdate(loss_fn, tau=args.tau)
    optim = torch.optim.Adam(loss_fn.parameters(), lr=args.lr)

    sampler_kwargs = {
        "slice_len": args.seq_len,
        "burn_in": args.burn_in,
        "strict_length": False,
        "pad_output": True,
    }
    if args.prioritized:
        sampler = PrioritizedSliceSampler(
            max_capacity=args.buffer_size,
            alpha=args.alpha,
            beta=args.beta,
            **sampler_kwargs,
        )
    else:
        sampler = SliceSampler(**sampler_kwargs)
    # One time series per env: a trajectory goes on across batches.
    buffer = TensorDictReplayBuffer(
        storage=LazyTensorStorage(args.buffer_size, ndim=2),
        sampler=sampler,
        batch_size=args.num_slices * args.seq_len,
        priority_key="td_error",
    )
    if args.policy == "gtrxl" and not args.store_memory:
        # The memory is rebuilt by the burn-in: nothing of it is written.
        buffer.append_transform(ExcludeTransform(*qnet[0].memory_keys), invert=True)

    kind = args.rnn if args.policy == "rnn" else args.policy
    title = (
        f"{args.env}: {kind} R2D2, burn-in {args.burn_in}, seed {args.seed}\n"
        f"{inputs_used(args)}"
    )

    log = RunLog(args, total_frames, start)
    log.evaluate(env, eval_env, qnet)
    next_eval = args.eval_every
    try:
        for batch in collector:
            log.collected(batch)
            if args.obs_norm and 0 < args.obs_norm_frames <= log.frames:
                _vecnorm(env).freeze()
            buffer.extend(batch)
            explore.step(batch.shape[-1])
            if log.frames >= args.warmup_frames:
                for _ in range(args.updates_per_batch):
                    sample = buffer.sample()
                    with set_recurrent_mode(True):
                        loss = loss_fn(sample)["loss"]
                    optim.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(loss_fn.parameters(), args.max_grad_norm)
                    optim.step()
                    target_update.step()
                    if args.prioritized:
                        buffer.update_tensordict_priority(sample)
                collector.update_policy_weights_()

            log.progress(batch.numel())
            if log.frames >= next_eval or log.frames >= total_frames:
                log.evaluate(env, eval_env, qnet)
                next_eval += args.eval_every
    finally:
        collector.shutdown()
        eval_env.close()  # ParallelEnv workers would keep the process alive
        log.close()
    return log.finish(title)


if __name__ == "__main__":
    main()

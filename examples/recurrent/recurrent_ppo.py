# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Recurrent PPO on CartPole without velocities, built from TorchRL's own pieces.

CartPole's observation is cut to the cart position and the pole angle
(``--obs-keep 0,2``): the velocities are gone, so a policy has to infer them
from what it saw before. An LSTM actor and an LSTM critic learn it with PPO:

- a batch of 16 gymnasium envs (gymnasium's ``SyncVectorEnv`` through
  :class:`~torchrl.envs.GymWrapper`, with TorchRL resetting the done envs:
  the fastest way here, see ``benchmarks/batched_envs.py``;
  ``--batched-env serial`` or ``parallel`` for
  :class:`~torchrl.envs.SerialEnv` / :class:`~torchrl.envs.ParallelEnv` of
  :class:`~torchrl.envs.GymEnv`) behind a
  :class:`~torchrl.envs.UnaryTransform` that keeps the chosen observation
  entries; a :class:`~torchrl.envs.RewardSum` for the episode returns, a
  :class:`~torchrl.envs.RewardScaling` and a
  :class:`~torchrl.envs.VecNormV2` on the observation whose statistics stop
  moving after ``--obs-norm-frames`` (inputs that keep drifting make a good
  policy collapse late in training);
- the :class:`~torchrl.collectors.Collector` completes the env from the policy
  (``auto_register_policy_transforms=True`` adds the ``InitTracker`` and both
  LSTMs' recurrent-state primers), and stores each step's recurrent state;
- :class:`~torchrl.objectives.value.GAE` runs the critic over the collected
  ``[envs, steps]`` batch under ``set_recurrent_mode(True)``, the bootstrap
  values included;
- each batch goes to a replay buffer whose
  :class:`~torchrl.data.SliceSamplerWithoutReplacement` cuts it into the
  trajectory pieces it holds, marks every piece start in ``"is_init"`` so that
  the LSTMs restart from the state stored there, and pads the pieces to one
  length with a mask that :class:`~torchrl.objectives.ClipPPOLoss` honours;
  when all the pieces fit in one minibatch (``--minibatch-slices``, the usual
  case once episodes last), :class:`~torchrl.objectives.ClipPPOLoss` runs on
  the batch as collected instead, under ``set_recurrent_mode(True)`` too: the
  LSTMs restart at every ``"is_init"`` inside a row, so it is the same loss
  and gradient without the gather and the padding (see
  :func:`fits_one_minibatch`).

Nothing is reshaped to ``[batch, time]``, no hidden state is carried by hand,
no mask is handled here. ``--policy gtrxl`` swaps each LSTM for a gated
Transformer-XL memory (:class:`~torchrl.modules.GTrXLModule`, stored and
replayed the same way; ``--memory-len``, ``--layers``, ``--heads``,
``--embed-dim``; a learning rate of 3e-4 by default, :data:`POLICY_LR`).
``--policy mlp`` trains the same agent without memory: the
control, which cannot balance the pole from positions alone.

The script prints a progress bar, one line per evaluation (``--eval-episodes``
deterministic episodes), writes ``learning_curve.csv`` and
``learning_curve.png`` to ``--out`` and ends with
``eval return R after F frames in W s``; TorchRL's INFO log lines are left
out (``RL_LOGGING_LEVEL=INFO`` shows them). ``--stop-return R`` ends the run
at the first evaluation that returns at least ``R``. ``--help`` lists every
flag.
"""
from __future__ import annotations

import argparse
import csv
import logging
import os
import time
from collections import deque
from functools import partial
from pathlib import Path

import gymnasium as gym
import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn

from torchrl.collectors import Collector
from torchrl.data import (
    LazyTensorStorage,
    MultiCategorical,
    MultiOneHot,
    OneHot,
    SliceSamplerWithoutReplacement,
    TensorDictReplayBuffer,
    Unbounded,
)
from torchrl.envs import (
    Compose,
    EnvBase,
    ExplorationType,
    GymEnv,
    GymWrapper,
    ParallelEnv,
    RewardScaling,
    RewardSum,
    SerialEnv,
    set_exploration_type,
    Transform,
    TransformedEnv,
    UnaryTransform,
    VecNormV2,
)
from torchrl.modules import (
    GRUModule,
    GTrXLModule,
    LSTMModule,
    MLP,
    OneHotCategorical,
    ProbabilisticActor,
    set_recurrent_mode,
)
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

DESCRIPTION = __doc__.split("\n")[0]


def _positive_int(name: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{name} takes a positive integer, got {value!r}"
        ) from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{name} must be at least 1, got {number}")
    return number


def _unit_float(name: str, value: str, *, low_open: bool = False) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{name} takes a number, got {value!r}"
        ) from None
    if not (0.0 < number <= 1.0 if low_open else 0.0 <= number <= 1.0):
        interval = "(0, 1]" if low_open else "[0, 1]"
        raise argparse.ArgumentTypeError(f"{name} must be in {interval}, got {number}")
    return number


def _obs_keep(value: str) -> tuple[int, ...] | str | None:
    if value in ("all", "auto"):
        return None if value == "all" else value
    try:
        entries = tuple(int(v) for v in value.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--obs-keep takes 'all' or comma-separated entry indices such as "
            f"'0,2', got {value!r}"
        ) from None
    if len(set(entries)) != len(entries) or min(entries) < 0:
        raise argparse.ArgumentTypeError(
            f"--obs-keep takes distinct non-negative indices, got {value!r}"
        )
    return entries


def add_gtrxl_flags(parser: argparse.ArgumentParser, embed_dim: int = 32) -> None:
    """The ``--policy gtrxl`` flags of both recipes: memory length, layers, heads, width.

    ``embed_dim`` is the recipe's default ``--embed-dim``.
    """
    gtrxl = parser.add_argument_group("GTrXL (--policy gtrxl)")
    gtrxl.add_argument(
        "--memory-len",
        type=partial(_positive_int, "--memory-len"),
        default=16,
        help="earlier steps each step attends to (the memory kept per layer)",
    )
    gtrxl.add_argument(
        "--layers",
        type=partial(_positive_int, "--layers"),
        default=1,
        help="transformer layers",
    )
    gtrxl.add_argument(
        "--heads",
        type=partial(_positive_int, "--heads"),
        default=4,
        help="attention heads per layer (they must divide --embed-dim)",
    )
    gtrxl.add_argument(
        "--embed-dim",
        type=partial(_positive_int, "--embed-dim"),
        default=embed_dim,
        help="width of the transformer and of its output",
    )


def check_gtrxl_flags(parser: argparse.ArgumentParser, args) -> None:
    """Errors out on GTrXL flags that cannot build the module."""
    if args.embed_dim % args.heads:
        parser.error(
            f"--heads {args.heads} must divide --embed-dim {args.embed_dim} (each "
            "head gets embed_dim / heads channels)"
        )


def make_gtrxl(args, obs_dim: int, name: str, out_key: str) -> GTrXLModule:
    """A GTrXL memory over ``"observation"`` whose memory entries are ``{name}_memory*``."""
    return GTrXLModule(
        obs_dim,
        args.embed_dim,
        num_layers=args.layers,
        num_heads=args.heads,
        memory_len=args.memory_len,
        in_keys=["observation", f"{name}_memory", f"{name}_memory_count"],
        out_keys=[
            out_key,
            ("next", f"{name}_memory"),
            ("next", f"{name}_memory_count"),
        ],
    )


def fits_one_minibatch(batch: TensorDictBase, minibatch_slices: int) -> bool:
    """Whether the trajectory pieces of a ``[envs, steps]`` batch fit in one minibatch.

    The pieces are what the slice sampler cuts the batch into: a row per env,
    cut again after every episode end inside it. When they fit in
    ``--minibatch-slices``, each epoch's one minibatch is the whole batch, and
    the loss runs on the batch as collected: the recurrent modules restart at
    every ``"is_init"`` inside a row, so the loss and its gradient are those of
    the sampler's padded sample (``test_recurrent_ppo_example.py`` checks it),
    without gathering the rows and computing on the padding.
    """
    pieces = batch.shape[0] + int(batch["next", "done"][:, :-1].sum())
    return pieces <= minibatch_slices


# One set of defaults per family, for the flags left unset
# (benchmarks/results/popgym-tuning.md has the sweep behind POPGym's): POPGym's
# tasks that score each step's answer alone and whose answers change nothing
# dealt later (any discount has the same best policy there, and a short one
# spares the critic predicting the rest of the episode), POPGym's other tasks
# (PositionOnlyCartPole, Battleship, ...), and the rest (CartPole, the
# SB3-contrib comparison).
POPGYM_ANSWER_TASKS = (
    "Autoencode",
    "CountRecall",
    "HigherLower",
    "RepeatFirst",
    "RepeatPrevious",
)
FAMILY_DEFAULTS = {
    "popgym-answers": {"entropy_coef": 0.05, "steps_per_env": 64, "gamma": 0.7},
    "popgym": {"entropy_coef": 0.05, "steps_per_env": 64, "gamma": 0.995},
    "other": {"entropy_coef": 0.0, "steps_per_env": 32, "gamma": 0.995},
}

# The learning rate per --policy: the GTrXL's attention takes a smaller step
# (benchmarks/results/popgym-horizon.md: with 1e-3 it stays near the no-memory
# ceiling of CountRecallEasy, with 3e-4 it learns the count; CartPole and
# RepeatPreviousMedium are solved with either)
POLICY_LR = {"rnn": 1e-3, "gtrxl": 3e-4, "mlp": 1e-3}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each default after a flag's help, except where it would mislead.

    An on/off flag's help says what it turns on or off (``--no-obs-norm
    (default: True)`` reads as "off by default"), and a flag whose default is
    ``None`` is resolved from other flags or from the env, as its help says
    (``(default: None)`` would read as "none").
    """

    def _get_help_string(self, action):
        if action.nargs == 0 or action.default is None:
            return action.help
        return super()._get_help_string(action)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=DESCRIPTION,
        epilog="Defaults solve CartPole-v1 without velocities within 100k frames.",
        formatter_class=HelpFormatter,
    )
    # the help of the flags set per family quotes the values it resolves to
    answers, popgym, other = (
        FAMILY_DEFAULTS[key] for key in ("popgym-answers", "popgym", "other")
    )
    env = parser.add_argument_group("environment")
    env.add_argument(
        "--env",
        default="CartPole-v1",
        help="gymnasium id (POPGym's as popgym:popgym-<Task>-v0): a 1-d Box, "
        "Discrete, MultiDiscrete or Tuple-of-Discrete observation (the discrete "
        "ones one-hot encoded) and a Discrete action",
    )
    env.add_argument(
        "--obs-keep",
        type=_obs_keep,
        default="auto",
        metavar="I,J,...|all|auto",
        help="entries of a Box observation the agent sees ('0,2': CartPole's "
        "cart position and pole angle, no velocities); 'all' keeps every "
        "entry; 'auto' is '0,2' on CartPole-v1 and 'all' otherwise",
    )
    env.add_argument(
        "--max-episode-steps",
        type=partial(_positive_int, "--max-episode-steps"),
        default=None,
        help="step limit of an evaluation episode (default: the env's "
        "registered limit, else its own max_episode_length, which POPGym's "
        "envs have)",
    )
    env.add_argument(
        "--num-envs",
        type=partial(_positive_int, "--num-envs"),
        default=16,
        help="envs stepped together (a SerialEnv)",
    )
    env.add_argument(
        "--prev-action",
        action="store_true",
        help="append the previous action (one-hot) and a first-step flag to "
        "the observation, as POPGym's baselines feed every model",
    )
    env.add_argument(
        "--obs-norm",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="normalize the observation with running statistics (VecNormV2); "
        "the evaluation env uses a frozen copy of them (default: on for a Box "
        "observation, off for a one-hot one)",
    )
    env.add_argument(
        "--obs-norm-frames",
        type=int,
        default=20_000,
        help="with --obs-norm: frames after which the statistics stop moving "
        "(0: never), so that the policy's inputs stop drifting",
    )
    env.add_argument(
        "--batched-env",
        choices=("vector", "serial", "parallel"),
        default="vector",
        help="how the envs are stepped together: gymnasium's SyncVectorEnv "
        "through GymWrapper, or TorchRL's SerialEnv / ParallelEnv of GymEnv "
        "(benchmarks/batched_envs.py measures them)",
    )
    agent = parser.add_argument_group("agent")
    agent.add_argument(
        "--policy",
        choices=("rnn", "gtrxl", "mlp"),
        default="rnn",
        help="'rnn': recurrent actor and critic (--rnn); 'gtrxl': a gated "
        "Transformer-XL memory for each (GTrXLModule, --memory-len and the "
        "flags after it); 'mlp': the same agent without memory (the control)",
    )
    agent.add_argument(
        "--rnn",
        choices=("lstm", "gru"),
        default="lstm",
        help="recurrent cell of the actor and of the critic",
    )
    agent.add_argument(
        "--shared-rnn",
        action="store_true",
        help="one RNN for the actor and the critic (default: one each, as "
        "SB3-contrib's RecurrentPPO)",
    )
    agent.add_argument(
        "--hidden",
        type=partial(_positive_int, "--hidden"),
        default=64,
        help="recurrent state size, and width of the heads' hidden layer",
    )
    add_gtrxl_flags(parser)
    ppo = parser.add_argument_group("PPO")
    ppo.add_argument(
        "--frames",
        type=partial(_positive_int, "--frames"),
        default=100_000,
        help="env frames to collect in all",
    )
    ppo.add_argument(
        "--steps-per-env",
        type=partial(_positive_int, "--steps-per-env"),
        default=None,
        help="steps each env runs per batch (a batch is num-envs x this), "
        "which is also the longest piece of trajectory the loss backpropagates "
        f"through (default: {popgym['steps_per_env']} on POPGym's envs, so that "
        "a piece holds a whole CountRecallEasy episode, "
        f"{other['steps_per_env']} elsewhere: the CartPole setting)",
    )
    ppo.add_argument(
        "--epochs",
        type=partial(_positive_int, "--epochs"),
        default=20,
        help="passes over each batch",
    )
    ppo.add_argument(
        "--minibatch-slices",
        type=partial(_positive_int, "--minibatch-slices"),
        default=64,
        help="trajectory pieces per minibatch; a batch holds num-envs pieces "
        "plus one per episode that ends in it, so the default takes the whole "
        "batch in one minibatch once episodes last (the loss then runs on the "
        "batch as collected, with no replay-buffer sample)",
    )
    ppo.add_argument(
        "--lr",
        type=float,
        default=None,
        help="Adam learning rate, decayed linearly to 0; default "
        + ", ".join(f"{lr} with --policy {policy}" for policy, lr in POLICY_LR.items()),
    )
    ppo.add_argument(
        "--clip",
        type=partial(_unit_float, "--clip", low_open=True),
        default=0.2,
        help="PPO clipping, decayed linearly to 0",
    )
    ppo.add_argument(
        "--gamma",
        type=partial(_unit_float, "--gamma"),
        default=None,
        help=f"discount (default: {answers['gamma']} on POPGym's tasks that "
        "score each answer alone and whose answers change nothing dealt later: "
        f"{', '.join(POPGYM_ANSWER_TASKS)}, where any discount has the same "
        "best policy and a short one spares the critic predicting the rest of "
        f"the episode; {other['gamma']} elsewhere, a long horizon: the cart "
        "drifts off the track slowly)",
    )
    ppo.add_argument(
        "--gae-lambda",
        type=partial(_unit_float, "--gae-lambda"),
        default=0.95,
        help="GAE lambda",
    )
    ppo.add_argument(
        "--normalize-advantage",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="standardize the advantages of each minibatch (default: on; "
        "--no-normalize-advantage turns it off)",
    )
    ppo.add_argument(
        "--entropy-coef",
        type=float,
        default=None,
        help="weight of the entropy bonus (default: "
        f"{popgym['entropy_coef']} on POPGym's envs, whose runs can otherwise "
        "settle early on a deterministic wrong answer, "
        f"{other['entropy_coef']} elsewhere: the CartPole setting; "
        "benchmarks/results/popgym-tuning.md has the sweep)",
    )
    ppo.add_argument(
        "--max-grad-norm",
        type=float,
        default=0.5,
        help="gradient norm clipping (actor and critic together)",
    )
    ppo.add_argument(
        "--reward-scale",
        type=float,
        default=0.1,
        help="factor on the rewards the agent learns from (the returns shown "
        "are the env's): it keeps the critic's gradients from crowding out the "
        "actor's under the joint gradient clipping",
    )
    run = parser.add_argument_group("run")
    run.add_argument("--seed", type=int, default=0, help="seed of torch and the envs")
    run.add_argument(
        "--threads",
        type=partial(_positive_int, "--threads"),
        default=1,
        help="torch intra-op threads (the networks are small: 1 is fastest)",
    )
    run.add_argument(
        "--eval-every",
        type=partial(_positive_int, "--eval-every"),
        default=10_000,
        help="frames between two evaluations",
    )
    run.add_argument(
        "--eval-episodes",
        type=partial(_positive_int, "--eval-episodes"),
        default=10,
        help="deterministic episodes per evaluation",
    )
    run.add_argument(
        "--stop-return",
        type=float,
        default=None,
        metavar="R",
        help="stop early once an evaluation returns at least R "
        "(default: train for all of --frames)",
    )
    run.add_argument(
        "--out",
        type=Path,
        default=Path("runs/recurrent_ppo"),
        help="folder for learning_curve.csv and learning_curve.png",
    )
    run.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (the evaluation lines are still printed)",
    )
    add_logger_flag(run)
    args = parser.parse_args(argv)
    if args.obs_norm_frames < 0:
        parser.error(f"--obs-norm-frames must be >= 0, got {args.obs_norm_frames}")
    if args.lr is None:
        args.lr = POLICY_LR[args.policy]
    for flag in ("lr", "max_grad_norm", "reward_scale"):
        if not getattr(args, flag) > 0:
            parser.error(
                f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}"
            )
    check_gtrxl_flags(parser, args)
    for flag, value in FAMILY_DEFAULTS[family(args.env)].items():
        if getattr(args, flag) is None:
            setattr(args, flag, value)
    if args.entropy_coef < 0:
        parser.error(f"--entropy-coef must be >= 0, got {args.entropy_coef}")
    if args.frames < args.num_envs * args.steps_per_env:
        parser.error(
            f"--frames={args.frames} is less than one batch "
            f"(--num-envs x --steps-per-env = {args.num_envs * args.steps_per_env})"
        )
    _check_env(parser, args)
    return args


def family(env_id: str) -> str:
    """The key of :data:`FAMILY_DEFAULTS` for ``env_id``.

    ``"popgym-answers"`` for a POPGym task of :data:`POPGYM_ANSWER_TASKS`
    (``popgym:popgym-CountRecallEasy-v0``), ``"popgym"`` for any other POPGym
    id, ``"other"`` for the rest.
    """
    name = env_id.rsplit(":", 1)[-1]
    if not name.startswith("popgym-"):
        return "other"
    if name.removeprefix("popgym-").startswith(POPGYM_ANSWER_TASKS):
        return "popgym-answers"
    return "popgym"


def add_logger_flag(group) -> None:
    """``--logger``: the :mod:`torchrl.record.loggers` logger a run writes its scalars to."""
    group.add_argument(
        "--logger",
        choices=("csv", "tensorboard", "none"),
        default="csv",
        help="TorchRL logger (torchrl.record.loggers) for the evaluation "
        "return, the training return and the frames per second, written "
        "under <out>/logs (tensorboard needs the tensorboard package); the "
        "learning-curve CSV and PNG are written either way",
    )


def _check_env(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--env`` and its flags against the env's spaces; resolves the ``auto`` defaults.

    Also checks that ``--logger tensorboard`` has its package.

    Sets ``args.max_episode_steps``, ``args.obs_nvec`` (the category counts of a
    discrete observation, ``None`` for a Box) and ``args.obs_tuple`` (whether
    it is a ``Tuple`` of ``Discrete`` spaces), and resolves ``--obs-keep auto``
    and an unset ``--obs-norm``.
    """
    if getattr(args, "logger", None) == "tensorboard":
        import importlib.util

        if importlib.util.find_spec("tensorboard") is None:
            parser.error(
                "--logger tensorboard needs the tensorboard package: pip install "
                "tensorboard, or use --logger csv"
            )
    try:
        env = gym.make(args.env)
    except gym.error.Error as err:
        parser.error(f"--env {args.env}: gymnasium cannot make it ({err})")
    obs_space, action_space = env.observation_space, env.action_space
    registered = env.spec.max_episode_steps if env.spec else None
    own = getattr(env.unwrapped, "max_episode_length", None)
    env.close()
    if getattr(args, "max_episode_steps", None) is None:
        args.max_episode_steps = registered or own
    if args.max_episode_steps is None:
        parser.error(
            f"--env {args.env} has no episode step limit (none registered, no "
            "max_episode_length): the evaluation needs one, pass "
            "--max-episode-steps"
        )
    if not isinstance(action_space, gym.spaces.Discrete):
        parser.error(
            f"--env {args.env}: the recipe needs a Discrete action space, got "
            f"{action_space}"
        )
    args.obs_nvec, args.obs_tuple = _discrete_nvec(obs_space), False
    if isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) == 1:
        pass
    elif isinstance(obs_space, gym.spaces.Tuple) and args.obs_nvec is not None:
        args.obs_tuple = True
    elif args.obs_nvec is None:
        parser.error(
            f"--env {args.env}: the recipe needs a 1-d Box, Discrete, "
            f"MultiDiscrete or Tuple-of-Discrete observation space, got {obs_space}"
        )
    if args.obs_keep == "auto":
        args.obs_keep = (0, 2) if args.env == "CartPole-v1" else None
    if args.obs_norm is None:
        args.obs_norm = args.obs_nvec is None
    if args.obs_keep is None:
        return
    if args.obs_nvec is not None:
        parser.error(
            f"--obs-keep {','.join(map(str, args.obs_keep))}: the observation of "
            f"{args.env} is discrete ({obs_space}); --obs-keep selects entries "
            "of a Box observation: pass --obs-keep all"
        )
    obs_dim = obs_space.shape[0]
    if max(args.obs_keep) >= obs_dim:
        parser.error(
            f"--obs-keep {','.join(map(str, args.obs_keep))}: the observation of "
            f"{args.env} has {obs_dim} entries (0 to {obs_dim - 1})"
        )


def _discrete_nvec(space) -> tuple[int, ...] | None:
    """The category counts of a discrete observation space (``None`` for another one)."""
    if isinstance(space, gym.spaces.Discrete) and space.start == 0:
        return (int(space.n),)
    if (
        isinstance(space, gym.spaces.MultiDiscrete)
        and space.nvec.ndim == 1
        and not space.start.any()
    ):
        return tuple(int(n) for n in space.nvec)
    if isinstance(space, gym.spaces.Tuple):
        parts = [_discrete_nvec(part) for part in space.spaces]
        if parts and all(p is not None and len(p) == 1 for p in parts):
            return tuple(p[0] for p in parts)
    return None


class TupleAsMultiDiscrete(gym.ObservationWrapper):
    """Shows a ``Tuple`` of ``Discrete`` observation as a ``MultiDiscrete`` one.

    TorchRL's gym wrappers cannot encode a ``Tuple`` observation (POPGym's
    ``Autoencode`` has one); the same categories as one ``MultiDiscrete``
    array are one-hot encoded like any other.
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        nvec = _discrete_nvec(env.observation_space)
        self.observation_space = gym.spaces.MultiDiscrete(nvec)

    def observation(self, observation):
        import numpy as np

        return np.asarray(observation, dtype=self.observation_space.dtype)


def _one_hot_entries(
    observation: torch.Tensor, feature_dims: int, categories: MultiCategorical | None
) -> torch.Tensor:
    if categories is not None:
        observation = categories.to_one_hot(observation)
    elif feature_dims > 1:
        observation = observation.flatten(-feature_dims)
    return observation.float()


def _one_hot(env: EnvBase, nvec: tuple[int, ...]) -> UnaryTransform:
    """A transform that shows ``env``'s discrete observation one-hot, as floats.

    TorchRL's gym wrappers give a discrete observation either one-hot already
    (:class:`~torchrl.data.OneHot`, ``[k, n]`` for ``k`` equal counts,
    :class:`~torchrl.data.MultiOneHot`), flattened here, or as category
    indices (a vector env's ``MultiDiscrete``), encoded with
    :meth:`~torchrl.data.MultiCategorical.to_one_hot`.
    """
    spec = env.observation_spec["observation"]
    feature_dims = spec.ndim - len(env.batch_size)
    categories = None
    if not isinstance(spec, (OneHot, MultiOneHot)):
        categories = MultiCategorical(shape=(len(nvec),), nvec=list(nvec))
    return UnaryTransform(
        in_keys=["observation"],
        out_keys=["observation"],
        fn=partial(_one_hot_entries, feature_dims=feature_dims, categories=categories),
    )


class PreviousAction(Transform):
    """Appends the previous action (one-hot) and a first-step flag to ``"observation"``.

    POPGym's baselines feed every model the previous action and whether the
    step is an episode's first: after a reset the action part is zeros and
    the flag 1, after a step the action part is the one-hot action just taken
    and the flag 0. Put it after any normalization of the observation, so
    that those entries stay as they are.

    Args:
        num_actions: the number of actions (the width of the one-hot action).
    """

    def __init__(self, num_actions: int):
        super().__init__(in_keys=["observation"], out_keys=["observation"])
        self.num_actions = num_actions

    def _extended(
        self, observation: torch.Tensor, action: torch.Tensor | None
    ) -> torch.Tensor:
        first = torch.zeros_like(observation[..., :1]) + float(action is None)
        if action is None:
            action = first.new_zeros((*first.shape[:-1], self.num_actions))
        return torch.cat([observation, action.to(observation.dtype), first], -1)

    def _step(self, tensordict, next_tensordict):
        next_tensordict.set(
            "observation",
            self._extended(next_tensordict["observation"], tensordict["action"]),
        )
        return next_tensordict

    def _reset(self, tensordict, tensordict_reset):
        # every row is marked first: the env keeps the reset rows only
        tensordict_reset.set(
            "observation", self._extended(tensordict_reset["observation"], None)
        )
        return tensordict_reset

    def transform_observation_spec(self, observation_spec):
        spec = observation_spec["observation"]
        observation_spec["observation"] = Unbounded(
            shape=(*spec.shape[:-1], spec.shape[-1] + self.num_actions + 1),
            dtype=torch.float32,
            device=spec.device,
        )
        return observation_spec


def inputs_used(args: argparse.Namespace) -> str:
    """What the agent sees, in words (printed at the start of a run)."""
    if args.obs_nvec is not None:
        seen = f"observation one-hot ({'+'.join(map(str, args.obs_nvec))} categories)"
    elif args.obs_keep is None:
        seen = "observation (all entries)"
    else:
        seen = f"observation entries {','.join(map(str, args.obs_keep))}"
    if args.obs_norm:
        seen += ", normalized"
    if args.prev_action:
        seen += ", previous action (one-hot), first-step flag"
    return seen


def _gym_env(env_id: str, tuple_obs: bool) -> EnvBase:
    if not tuple_obs:
        return GymEnv(env_id)
    return GymWrapper(TupleAsMultiDiscrete(gym.make(env_id)))


def _observation_transforms(
    env: EnvBase, obs_keep: tuple[int, ...] | None, nvec: tuple[int, ...] | None
) -> list[UnaryTransform]:
    if nvec is not None:
        return [_one_hot(env, nvec)]
    return [] if obs_keep is None else [_keep(obs_keep)]


def _keep_entries(observation: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return observation.index_select(-1, index)


def _keep(obs_keep: tuple[int, ...]) -> UnaryTransform:
    return UnaryTransform(
        in_keys=["observation"],
        out_keys=["observation"],
        fn=partial(_keep_entries, index=torch.tensor(obs_keep)),
    )


def _make_one_env(
    env_id: str,
    obs_keep: tuple[int, ...] | None,
    nvec: tuple[int, ...] | None = None,
    tuple_obs: bool = False,
):
    env = _gym_env(env_id, tuple_obs)
    transforms = _observation_transforms(env, obs_keep, nvec)
    return TransformedEnv(env, Compose(*transforms)) if transforms else env


def _make_batch(
    kind: str,
    env_id: str,
    num_envs: int,
    obs_keep,
    nvec: tuple[int, ...] | None = None,
    tuple_obs: bool = False,
) -> tuple[EnvBase, list[UnaryTransform]]:
    """``num_envs`` envs stepped together, and the transforms that show the agent its input.

    The transforms keep the chosen entries of a Box observation, or one-hot
    encode a discrete one. ``"vector"`` is gymnasium's ``SyncVectorEnv``
    (auto-reset off: TorchRL resets the done envs), returned with the
    transforms to put on it; ``"serial"`` and ``"parallel"`` are TorchRL's
    batched envs of transformed ``GymEnv``, returned with none.
    """
    if kind == "vector":
        env = GymWrapper(
            gym.make_vec(
                env_id,
                num_envs=num_envs,
                vectorization_mode="sync",
                vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.DISABLED},
                wrappers=[TupleAsMultiDiscrete] if tuple_obs else None,
            )
        )
        return env, _observation_transforms(env, obs_keep, nvec)
    batched = SerialEnv if kind == "serial" else ParallelEnv
    one = partial(_make_one_env, env_id, obs_keep, nvec, tuple_obs)
    return batched(num_envs, one), []


def make_env(
    args: argparse.Namespace, num_envs: int, seed: int, policy=None
) -> TransformedEnv:
    """A batch of ``num_envs`` gym envs that show the agent the kept entries only.

    With ``policy``, the env is completed with what the policy needs
    (``InitTracker``, recurrent-state primers), through ``policy=``.
    """
    base_env, obs_filter = _make_batch(
        args.batched_env,
        args.env,
        num_envs,
        args.obs_keep,
        getattr(args, "obs_nvec", None),
        getattr(args, "obs_tuple", False),
    )
    # One TransformedEnv holds every transform: wrapping a TransformedEnv in
    # another would rely on TransformedEnv's auto-unwrapping, whose default
    # is changing.
    env = TransformedEnv(base_env, Compose(*obs_filter, RewardSum()), policy=policy)
    if args.reward_scale != 1.0:
        env.append_transform(RewardScaling(loc=0.0, scale=args.reward_scale))
    if args.obs_norm:
        env.append_transform(VecNormV2(in_keys=["observation"], reduce_batch_dims=True))
    if getattr(args, "prev_action", False):
        env.append_transform(PreviousAction(env.full_action_spec["action"].shape[-1]))
    env.set_seed(seed)
    return env


def make_agent(
    args: argparse.Namespace, obs_dim: int, num_actions: int
) -> tuple[ProbabilisticActor, TensorDictSequential]:
    """The actor and the critic: each an RNN (or nothing, for ``--policy mlp``) and an MLP head."""
    hidden = args.hidden

    def trunk(name: str) -> list[TensorDictModule]:
        if args.policy == "mlp":
            return [
                TensorDictModule(
                    nn.Identity(), in_keys=["observation"], out_keys=[f"{name}_in"]
                )
            ]
        if args.policy == "gtrxl":
            module = make_gtrxl(args, obs_dim, name, f"{name}_in")
        elif args.rnn == "lstm":
            module = LSTMModule(
                input_size=obs_dim,
                hidden_size=hidden,
                in_keys=["observation", f"{name}_h", f"{name}_c"],
                out_keys=[f"{name}_in", ("next", f"{name}_h"), ("next", f"{name}_c")],
            )
        else:
            module = GRUModule(
                input_size=obs_dim,
                hidden_size=hidden,
                in_keys=["observation", f"{name}_h"],
                out_keys=[f"{name}_in", ("next", f"{name}_h")],
            )
        return [module]

    head_in = {"mlp": obs_dim, "gtrxl": args.embed_dim}.get(args.policy, hidden)
    actor_trunk = trunk("actor")
    # --shared-rnn: the critic's head reads the actor's RNN output
    critic_trunk = actor_trunk if args.shared_rnn else trunk("critic")
    critic_in = "actor_in" if args.shared_rnn else "critic_in"
    actor_net = TensorDictSequential(
        *actor_trunk,
        TensorDictModule(
            MLP(
                in_features=head_in,
                out_features=num_actions,
                num_cells=[hidden],
                activation_class=nn.ReLU,
            ),
            in_keys=["actor_in"],
            out_keys=["logits"],
        ),
    )
    actor = ProbabilisticActor(
        actor_net,
        in_keys=["logits"],
        out_keys=["action"],
        distribution_class=OneHotCategorical,
        return_log_prob=True,
    )
    critic = TensorDictSequential(
        *critic_trunk,
        TensorDictModule(
            MLP(
                in_features=head_in,
                out_features=1,
                num_cells=[hidden],
                activation_class=nn.ReLU,
            ),
            in_keys=[critic_in],
            out_keys=["state_value"],
        ),
    )
    return actor, critic


def reached(stop_return: float | None, value: float) -> bool:
    """Whether an evaluation ``value`` meets ``--stop-return`` (never when it is unset)."""
    return stop_return is not None and value >= stop_return


def evaluate(env, policy, episodes: int, max_steps: int) -> float:
    """Mean return of the first episode of each of ``episodes`` envs, acting deterministically."""
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        # Done envs are reset and go on; each env's first episode is read.
        rollout = env.rollout(max_steps, policy, break_when_any_done=False)
    done = rollout["next", "done"].squeeze(-1)
    returns = rollout["next", "episode_reward"].squeeze(-1)
    # Each env's first episode: its return at its first done, or, for an env
    # that ran out of steps, what it earned by then.
    first = done.int().argmax(-1)
    first = torch.where(done.any(-1), first, done.shape[-1] - 1)
    return returns.gather(-1, first.unsqueeze(-1)).mean().item()


def _vecnorm(env) -> VecNormV2:
    return next(t for t in env.transform if isinstance(t, VecNormV2))


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
    ax.set_xlabel("frames")
    ax.set_ylabel("deterministic evaluation return")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "learning_curve.png", dpi=100)
    plt.close(fig)


def quiet_info_logs() -> None:
    """Keeps TorchRL's INFO log lines out of the run's output; its warnings stay.

    The output of a run is its progress bar, its evaluation lines and its last
    line; an INFO line such as a storage's first allocation is not for the
    user. ``RL_LOGGING_LEVEL`` (e.g. ``RL_LOGGING_LEVEL=INFO``), when set,
    decides instead.
    """
    if "RL_LOGGING_LEVEL" not in os.environ:
        logging.getLogger("torchrl").setLevel(logging.WARNING)


class RunLog:
    """What a training script shows: a progress bar, evaluation lines, the curve, the last line.

    Args:
        args: the parsed flags (``no_progress``, ``obs_norm``, ``eval_episodes``,
            ``max_episode_steps``, ``out``, and those :func:`inputs_used` reads).
        total_frames: the frames the run collects.
        start: ``time.monotonic()`` at the start of the run.
    """

    def __init__(self, args: argparse.Namespace, total_frames: int, start: float):
        from tqdm import tqdm

        self.args, self.start = args, start
        self.rows: list[dict[str, float]] = []
        self.recent: deque[float] = deque(maxlen=20)  # the last training episodes
        self.frames = 0
        self.bar = None
        self.logger = None
        if getattr(args, "logger", "none") != "none":
            from torchrl.record.loggers import get_logger

            self.logger = get_logger(
                args.logger, str(args.out / "logs"), experiment_name=args.out.name
            )
        print(f"inputs: {inputs_used(args)}", flush=True)
        if not args.no_progress:
            self.bar = tqdm(total=total_frames, unit="frame", dynamic_ncols=True)

    def collected(self, batch) -> None:
        """Counts a batch's frames and the returns of the episodes it ends."""
        self.frames += batch.numel()
        done = batch["next", "done"]
        returns = batch["next", "episode_reward"][done].tolist()
        self.recent.extend(returns)
        if self.logger is not None and returns:
            self.logger.log_scalar(
                "train_return", sum(returns) / len(returns), step=self.frames
            )

    def progress(self, num_frames: int) -> None:
        """Moves the bar on, with the frames per second and the recent return."""
        if self.logger is not None:
            fps = self.frames / max(time.monotonic() - self.start, 1e-9)
            self.logger.log_scalar("fps", fps, step=self.frames)
        if self.bar is None:
            return
        self.bar.update(num_frames)
        elapsed = self.bar.format_dict["elapsed"] or 1.0
        postfix = {"fps": f"{self.frames / elapsed:.0f}"}
        if self.recent:
            postfix["return"] = f"{sum(self.recent) / len(self.recent):.1f}"
        self.bar.set_postfix(postfix)

    def evaluate(self, env, eval_env, policy) -> None:
        """One evaluation line, with ``env``'s observation statistics frozen into ``eval_env``."""
        args = self.args
        if args.obs_norm:
            eval_norm = _vecnorm(eval_env)
            eval_norm.load_state_dict(_vecnorm(env).state_dict())
            eval_norm.freeze()
        value = evaluate(eval_env, policy, args.eval_episodes, args.max_episode_steps)
        wall = time.monotonic() - self.start
        self.rows.append(
            {"frames": self.frames, "eval_return": value, "wall_s": round(wall, 2)}
        )
        if self.logger is not None:
            self.logger.log_scalar("eval_return", value, step=self.frames)
        message = f"eval: return {value:.2f} after {self.frames} frames ({wall:.0f} s)"
        if self.bar is not None:
            self.bar.write(message)
        else:
            print(message, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def finish(self, title: str) -> dict[str, float]:
        """Writes the curve and prints the last line; returns the run's summary."""
        wall = time.monotonic() - self.start
        write_curve(self.args.out, self.rows, title)
        final = self.rows[-1]["eval_return"]
        print(f"eval return {final:.2f} after {self.frames} frames in {wall:.0f} s")
        return {
            "eval_return": final,
            "frames": self.frames,
            "wall_s": wall,
            "curve": self.rows,
        }


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    quiet_info_logs()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    start = time.monotonic()

    env = make_env(args, args.num_envs, args.seed)
    obs_dim = env.observation_spec["observation"].shape[-1]
    actor, critic = make_agent(args, obs_dim, env.action_spec.shape[-1])

    # Evaluation runs the actor alone: policy= completes its env for the actor.
    eval_env = make_env(args, args.eval_episodes, args.seed + 10_000, policy=actor)
    frames_per_batch = args.num_envs * args.steps_per_env
    # Whole batches only, never more than --frames.
    total_frames = args.frames // frames_per_batch * frames_per_batch
    # A recurrent critic runs during collection too, so that its recurrent
    # state is stored at every step and its values can restart from any step.
    collect_policy = (
        actor
        if args.policy == "mlp" or args.shared_rnn
        else TensorDictSequential(actor, critic)
    )
    collector = Collector(
        env,
        collect_policy,
        frames_per_batch=frames_per_batch,
        total_frames=total_frames,
        auto_register_policy_transforms=True,
    )

    advantage = GAE(
        gamma=args.gamma,
        lmbda=args.gae_lambda,
        value_network=critic,
        average_gae=False,
    )
    loss_fn = ClipPPOLoss(
        actor,
        critic,
        clip_epsilon=args.clip,
        entropy_coeff=args.entropy_coef,
        entropy_bonus=args.entropy_coef > 0,
        critic_coeff=0.5,
        loss_critic_type="l2",
        normalize_advantage=args.normalize_advantage,
    )
    # foreach: the same updates as the per-parameter loop (bit for bit), in
    # fewer calls: the loop's overhead is felt at 20 epochs of a small network
    optim = torch.optim.Adam(loss_fn.parameters(), lr=args.lr, eps=1e-5, foreach=True)

    # The recurrent state after each step, ("next", <state>), carries the state
    # from one step to the next in collection (and GAE reads the batch): the
    # loss starts each slice from the state stored at its first row and never
    # reads it. Not storing it halves the bytes per step of a GTrXL memory.
    next_state = [
        k for k in collect_policy.out_keys if isinstance(k, tuple) and k[0] == "next"
    ]
    buffer = TensorDictReplayBuffer(
        storage=LazyTensorStorage(frames_per_batch, ndim=2),
        sampler=SliceSamplerWithoutReplacement(
            slice_len=args.steps_per_env, strict_length=False, pad_output=True
        ),
        batch_size=args.minibatch_slices * args.steps_per_env,
    )

    title = (
        f"{args.env}: {args.rnn if args.policy == 'rnn' else args.policy} PPO, "
        f"seed {args.seed}\n{inputs_used(args)}"
    )

    log = RunLog(args, total_frames, start)
    log.evaluate(env, eval_env, actor)
    next_eval = args.eval_every
    num_batches = total_frames // frames_per_batch
    try:
        for i, batch in enumerate(collector):
            log.collected(batch)
            progress = i / num_batches
            for group in optim.param_groups:
                group["lr"] = args.lr * (1 - progress)
            loss_fn.clip_epsilon.fill_(args.clip * (1 - progress))
            if args.obs_norm and 0 < args.obs_norm_frames <= log.frames:
                _vecnorm(env).freeze()

            with torch.no_grad(), set_recurrent_mode(True):
                advantage(batch)
            if fits_one_minibatch(batch, args.minibatch_slices):
                epoch = [batch]
            else:
                buffer.empty()
                buffer.extend(batch.exclude(*next_state))
                epoch = buffer
            for _ in range(args.epochs):
                for minibatch in epoch:
                    with set_recurrent_mode(True):
                        losses = loss_fn(minibatch)
                    loss = losses["loss_objective"] + losses["loss_critic"]
                    if "loss_entropy" in losses.keys():
                        loss = loss + losses["loss_entropy"]
                    optim.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(loss_fn.parameters(), args.max_grad_norm)
                    optim.step()
            collector.update_policy_weights_()

            log.progress(batch.numel())
            if log.frames >= next_eval or log.frames >= total_frames:
                log.evaluate(env, eval_env, actor)
                next_eval += args.eval_every
                if reached(args.stop_return, log.rows[-1]["eval_return"]):
                    break
    finally:
        collector.shutdown()
        eval_env.close()  # ParallelEnv workers would keep the process alive
        log.close()
    return log.finish(title)


if __name__ == "__main__":
    main()

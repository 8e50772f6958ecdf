# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Policies and envs shared by the recurrent env-wiring tests.

Factories live at module level so that collector workers started with the
``spawn`` method can import them.
"""
from __future__ import annotations

import torch
from tensordict.nn import (
    TensorDictModule as Mod,
    TensorDictModuleBase,
    TensorDictSequential as Seq,
)
from torch import nn
from torchrl.data import Categorical, Composite, Unbounded
from torchrl.envs import (
    Compose,
    EnvBase,
    GymEnv,
    InitTracker,
    TensorDictPrimer,
    TransformedEnv,
)
from torchrl.modules import (
    ConsistentDropoutModule,
    GRUModule,
    LSTMModule,
    OneHotCategorical,
    ProbabilisticActor,
)

OBS_DIM = 4
N_ACTIONS = 2
HIDDEN = 8


def env_transforms(env) -> list:
    """Every transform of ``env`` and of the envs it wraps, outermost last."""
    found = []
    while isinstance(env, TransformedEnv):
        transform = env.transform
        found = (
            list(transform) if isinstance(transform, Compose) else [transform]
        ) + found
        env = env.base_env
    return found


def count_transforms(env, cls) -> int:
    return sum(isinstance(t, cls) for t in env_transforms(env))


def make_cartpole(**kwargs):
    return GymEnv("CartPole-v1", **kwargs)


def make_tracked_cartpole():
    return GymEnv("CartPole-v1").append_transform(InitTracker())


def _actor(core: nn.Module, features: int = HIDDEN) -> ProbabilisticActor:
    """A one-hot CartPole actor on top of ``core`` (which writes ``"features"``)."""
    head = Mod(
        nn.Linear(features, N_ACTIONS), in_keys=["features"], out_keys=["logits"]
    )
    return ProbabilisticActor(
        Seq(core, head),
        in_keys=["logits"],
        distribution_class=OneHotCategorical,
    )


def make_rnn(kind: str = "lstm"):
    cls = {"lstm": LSTMModule, "gru": GRUModule}[kind]
    return cls(
        input_size=OBS_DIM,
        hidden_size=HIDDEN,
        in_key="observation",
        out_key="features",
    )


def make_recurrent_policy(kind: str = "lstm") -> ProbabilisticActor:
    return _actor(make_rnn(kind))


def make_lstm_policy() -> ProbabilisticActor:
    return make_recurrent_policy("lstm")


def make_feedforward_policy() -> ProbabilisticActor:
    return _actor(
        Mod(nn.Linear(OBS_DIM, HIDDEN), in_keys=["observation"], out_keys=["features"])
    )


def make_dropout_lstm_policy(input_shape=None) -> ProbabilisticActor:
    dropout = ConsistentDropoutModule(
        p=0.1, in_keys="observation", input_shape=input_shape
    )
    return _actor(Seq(dropout, make_rnn("lstm")))


def state_keys(kind: str) -> list[str]:
    if kind == "lstm":
        return ["recurrent_state_h", "recurrent_state_c"]
    return ["recurrent_state"]


class StepCountingModule(TensorDictModuleBase):
    """A recurrent module that reads a custom init key (``init_key`` in-key).

    It counts the steps since the last reset in a carried state and writes
    ``"features"``; it needs a primer for its state and an init tracker for its
    init key, like an LSTM.
    """

    def __init__(
        self,
        init_key="my_init",
        obs_key="observation",
        state_key="step_state",
        out_key="features",
        shape=(HIDDEN,),
    ):
        super().__init__()
        self.in_keys = [obs_key, state_key, init_key]
        self.out_keys = [out_key, ("next", state_key)]
        self.shape = torch.Size(shape)

    def forward(self, tensordict):
        obs_key, state_key, init_key = self.in_keys
        is_init = tensordict.get(init_key)
        state = tensordict.get(state_key, None)
        if state is None:
            state = torch.zeros(*is_init.shape[:-1], *self.shape)
        state = torch.where(is_init.expand_as(state), torch.zeros_like(state), state)
        state = state + 1
        tensordict.set(self.out_keys[0], state)
        tensordict.set(self.out_keys[1], state)
        return tensordict

    def make_tensordict_primer(self):
        state_key = self.in_keys[1]
        spec = Unbounded(shape=self.shape)
        if isinstance(state_key, tuple):
            # the nested entry lives in a sub-composite shaped like its group
            primers = Composite(
                {state_key[0]: Composite({state_key[1]: spec}, shape=self.shape[:1])}
            )
        else:
            primers = Composite({state_key: spec})
        return TensorDictPrimer(primers, expand_specs=True)


def make_my_init_policy() -> ProbabilisticActor:
    return _actor(StepCountingModule(init_key="my_init"))


class TwoAgentEnv(EnvBase):
    """A tiny multi-agent env whose done and reset keys live under ``"agents"``.

    An :class:`~torchrl.envs.InitTracker` appended to it writes
    ``("agents", "is_init")``. Episodes last 4 steps.
    """

    def __init__(self, n_agents: int = 2, **kwargs):
        super().__init__(**kwargs)
        self.n_agents = n_agents
        shape = (n_agents,)
        self.full_observation_spec = Composite(
            agents=Composite(observation=Unbounded(shape=(n_agents, 3)), shape=shape)
        )
        self.full_action_spec = Composite(
            agents=Composite(action=Unbounded(shape=(n_agents, 1)), shape=shape)
        )
        self.full_reward_spec = Composite(
            agents=Composite(reward=Unbounded(shape=(n_agents, 1)), shape=shape)
        )
        self.full_done_spec = Composite(
            agents=Composite(
                done=Categorical(2, shape=(n_agents, 1), dtype=torch.bool),
                terminated=Categorical(2, shape=(n_agents, 1), dtype=torch.bool),
                shape=shape,
            )
        )
        self._t = 0

    def _reset(self, tensordict):
        self._t = 0
        out = self.full_observation_spec.zero()
        out.update(self.full_done_spec.zero())
        return out

    def _step(self, tensordict):
        self._t += 1
        out = self.full_observation_spec.zero()
        out["agents", "observation"] += self._t
        out.update(self.full_reward_spec.zero())
        done = self.full_done_spec.zero()
        done["agents", "done"] |= self._t % 4 == 0
        done["agents", "terminated"] |= self._t % 4 == 0
        out.update(done)
        return out

    def _set_seed(self, seed):
        return seed


def make_agents_policy() -> Seq:
    """A policy for :class:`TwoAgentEnv` reading ``("agents", "is_init")``."""
    core = StepCountingModule(
        init_key=("agents", "is_init"),
        obs_key=("agents", "observation"),
        state_key=("agents", "step_state"),
        out_key=("agents", "features"),
        shape=(2, 3),
    )
    head = Mod(
        nn.Linear(3, 1),
        in_keys=[("agents", "features")],
        out_keys=[("agents", "action")],
    )
    return Seq(core, head)


def make_two_init_keys_policy() -> ProbabilisticActor:
    """A GRU reading ``"is_init"`` next to a counter reading ``"my_init"``."""
    return _actor(Seq(make_rnn("gru"), StepCountingModule(out_key="counts")))


def make_primed_cartpole(hidden_size: int = 2 * HIDDEN):
    """CartPole carrying an init tracker and the primer of an LSTM of ``hidden_size``.

    With the default size, the primer's ``recurrent_state_*`` entries disagree
    with the policies above (hidden size ``HIDDEN``).
    """
    lstm = LSTMModule(
        input_size=OBS_DIM,
        hidden_size=hidden_size,
        in_key="observation",
        out_key="features",
    )
    return TransformedEnv(
        GymEnv("CartPole-v1"), Compose(InitTracker(), lstm.make_tensordict_primer())
    )

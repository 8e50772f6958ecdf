# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Env transforms derived from the policy: helpers and the ``policy=`` env keyword."""
from __future__ import annotations

import logging
import warnings

import pytest
import torch
from _recurrent_policies import (
    count_transforms as _count,
    env_transforms as _transforms,
    make_agents_policy,
    make_cartpole,
    make_dropout_lstm_policy,
    make_feedforward_policy,
    make_my_init_policy,
    make_primed_cartpole,
    make_recurrent_policy,
    make_tracked_cartpole,
    make_two_init_keys_policy,
    state_keys,
    TwoAgentEnv,
)
from tensordict.nn import TensorDictModule as Mod
from torch import nn
from torchrl import set_auto_unwrap_transformed_env
from torchrl.collectors import Collector
from torchrl.envs import (
    AutoResetEnv,
    Compose,
    EnvBase,
    InitTracker,
    ParallelEnv,
    SerialEnv,
    StepCounter,
    TensorDictPrimer,
    TransformedEnv,
)
from torchrl.modules import (
    get_env_transforms_from_module,
    get_primers_from_module,
    LSTMModule,
    MultiStepActorWrapper,
)
from torchrl.modules.utils._env_transforms import (
    _append_missing_env_transforms,
    _missing_env_transforms,
)


class TestGetPrimersFromModule:
    def test_warn_false_returns_none_silently(self):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert (
                get_primers_from_module(make_feedforward_policy(), warn=False) is None
            )

    def test_warn_true_keeps_warning(self):
        with pytest.warns(UserWarning, match="No primers found"):
            assert get_primers_from_module(make_feedforward_policy()) is None

    def test_strict_true_propagates(self):
        with pytest.raises(RuntimeError, match="input_shape"):
            get_primers_from_module(make_dropout_lstm_policy())

    def test_strict_false_skips_failing_module(self):
        with pytest.warns(UserWarning, match="ConsistentDropoutModule") as record:
            primer = get_primers_from_module(make_dropout_lstm_policy(), strict=False)
        assert len([w for w in record if "could not build" in str(w.message)]) == 1
        message = str(record[0].message)
        assert "input_shape" in message and "append_transform" in message
        assert record[0].filename == __file__
        assert isinstance(primer, TensorDictPrimer)
        assert set(primer.primers.keys()) == set(state_keys("lstm"))

    def test_strict_false_all_working(self):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            primers = get_primers_from_module(
                make_dropout_lstm_policy(input_shape=(4,)), strict=False
            )
        assert isinstance(primers, Compose) and len(primers) == 2

    @pytest.mark.parametrize("kwarg", ["warn", "strict"])
    def test_non_bool_raises(self, kwarg):
        with pytest.raises(TypeError, match=f"{kwarg} must be True or False"):
            get_primers_from_module(make_recurrent_policy(), **{kwarg: "yes"})

    def test_non_module_raises(self):
        with pytest.raises(TypeError, match="module must be a torch.nn.Module"):
            get_primers_from_module(lambda td: td)


class TestGetEnvTransformsFromModule:
    def test_exported(self):
        import torchrl.modules
        import torchrl.modules.utils

        assert "get_env_transforms_from_module" in torchrl.modules.__all__
        assert "get_env_transforms_from_module" in torchrl.modules.utils.__all__
        assert (
            torchrl.modules.utils.get_env_transforms_from_module
            is get_env_transforms_from_module
        )

    @pytest.mark.parametrize("kind", ["lstm", "gru"])
    def test_recurrent(self, kind):
        transforms = get_env_transforms_from_module(make_recurrent_policy(kind))
        assert isinstance(transforms, Compose)
        assert [type(t) for t in transforms] == [InitTracker, TensorDictPrimer]
        assert transforms[0].init_key == "is_init"
        assert set(transforms[1].primers.keys()) == set(state_keys(kind))
        env = TransformedEnv(make_cartpole(), transforms)
        assert {"is_init", *state_keys(kind)} <= set(env.observation_spec.keys())

    def test_feedforward_gets_bare_tracker(self):
        tracker = get_env_transforms_from_module(make_feedforward_policy())
        assert type(tracker) is InitTracker
        assert tracker.init_key == "is_init"
        env = TransformedEnv(make_cartpole(), tracker)
        assert env.transform is tracker
        assert env.rollout(3)["is_init"][0].all()

    def test_single_transform_not_wrapped(self):
        # a tracker is all a module with an init key and no state needs
        actor = Mod(nn.Linear(4, 2), in_keys=["observation"], out_keys=["action"])
        wrapper = MultiStepActorWrapper(
            actor, n_steps=2, action_keys=["action"], init_key="start"
        )
        tracker = get_env_transforms_from_module(wrapper)
        assert type(tracker) is InitTracker and tracker.init_key == "start"
        # several transforms come in a Compose
        assert type(get_env_transforms_from_module(make_recurrent_policy())) is Compose

    def test_discovers_renamed_init_key(self):
        transforms = get_env_transforms_from_module(make_my_init_policy())
        assert [type(t) for t in transforms] == [InitTracker, TensorDictPrimer]
        assert transforms[0].init_key == "my_init"

    def test_explicit_init_key_overrides(self):
        transforms = get_env_transforms_from_module(
            make_recurrent_policy(), init_key="other_init"
        )
        assert [t.init_key for t in transforms if isinstance(t, InitTracker)] == [
            "other_init"
        ]

    def test_nested_init_key_uses_leaf(self):
        transforms = get_env_transforms_from_module(make_agents_policy())
        assert transforms[0].init_key == "is_init"
        transforms = get_env_transforms_from_module(
            make_recurrent_policy(), init_key=("agents", "my_init")
        )
        assert transforms[0].init_key == "my_init"

    def test_two_init_keys_two_trackers(self):
        policy = make_two_init_keys_policy()
        transforms = get_env_transforms_from_module(policy)
        trackers = [t.init_key for t in transforms if isinstance(t, InitTracker)]
        assert sorted(trackers) == ["is_init", "my_init"]
        primers = [t for t in transforms if isinstance(t, TensorDictPrimer)]
        assert len(primers) == 2
        env = TransformedEnv(make_cartpole(), transforms)
        data = env.rollout(3, policy)
        assert data["is_init"][0].all() and data["my_init"][0].all()

    def test_init_key_attribute(self):
        # MultiStepActorWrapper reads the key named by its ``init_key`` attribute
        actor = Mod(nn.Linear(4, 2), in_keys=["observation"], out_keys=["action"])
        wrapper = MultiStepActorWrapper(
            actor, n_steps=2, action_keys=["action"], init_key="start"
        )
        assert get_env_transforms_from_module(wrapper).init_key == "start"
        # it needs a tracker and no primer: that is all the env gets
        env = make_cartpole(policy=wrapper)
        assert [type(t) for t in _transforms(env)] == [InitTracker]
        assert "start" in env.observation_spec.keys()

    def test_fresh_transforms_each_call(self):
        policy = make_recurrent_policy()
        first = get_env_transforms_from_module(policy)
        second = get_env_transforms_from_module(policy)
        assert all(a is not b for a, b in zip(first, second))

    def test_strict_primers(self):
        with pytest.raises(RuntimeError, match="input_shape"):
            get_env_transforms_from_module(make_dropout_lstm_policy())

    def test_errors(self):
        with pytest.raises(TypeError, match="module must be a torch.nn.Module"):
            get_env_transforms_from_module("policy")
        with pytest.raises(TypeError, match="init_key must be None, a string"):
            get_env_transforms_from_module(make_recurrent_policy(), init_key=3)


class TestMissingTransforms:
    def test_bare_env_lacks_everything(self):
        env = make_cartpole()
        missing = _missing_env_transforms(env, make_recurrent_policy())
        assert [type(t) for t in missing] == [InitTracker, TensorDictPrimer]
        assert not isinstance(env, TransformedEnv)  # pure read

    def test_feedforward_needs_nothing(self):
        assert _missing_env_transforms(make_cartpole(), make_feedforward_policy()) == []

    def test_tracked_env_lacks_primer_only(self):
        missing = _missing_env_transforms(
            make_tracked_cartpole(), make_recurrent_policy()
        )
        assert [type(t) for t in missing] == [TensorDictPrimer]

    def test_renamed_key_judged_by_name(self):
        policy = make_my_init_policy()
        missing = _missing_env_transforms(make_tracked_cartpole(), policy)
        assert [type(t) for t in missing] == [InitTracker, TensorDictPrimer]
        assert missing[0].init_key == "my_init"
        env = make_cartpole().append_transform(InitTracker(init_key="my_init"))
        assert [type(t) for t in _missing_env_transforms(env, policy)] == [
            TensorDictPrimer
        ]

    def test_nested_leaf_counts(self):
        policy = make_agents_policy()
        env = TwoAgentEnv()
        assert [type(t) for t in _missing_env_transforms(env, policy)] == [
            InitTracker,
            TensorDictPrimer,
        ]
        env = env.append_transform(InitTracker())
        assert ("agents", "is_init") in env.observation_spec.keys(True, True)
        assert [type(t) for t in _missing_env_transforms(env, policy)] == [
            TensorDictPrimer
        ]

    def test_batched_env_with_tracked_children(self):
        # ParallelEnv is covered by TestPolicyKeyword.test_batched and the collector tests
        policy = make_recurrent_policy()
        env = SerialEnv(2, make_tracked_cartpole)
        try:
            missing = _missing_env_transforms(env, policy)
            assert [type(t) for t in missing] == [TensorDictPrimer]
            env = _append_missing_env_transforms(env, policy)
            assert _count(env, InitTracker) == 0
            assert _count(env, TensorDictPrimer) == 1
            data = env.rollout(3, policy)
            assert data["is_init"][:, 0].all()
            assert data["next", "recurrent_state_h"].shape == (2, 3, 1, 8)
        finally:
            env.close()

    def test_append_idempotent_and_parents(self):
        policy = make_recurrent_policy()
        env = make_cartpole()
        assert (
            env.full_state_spec.is_empty() if env.full_state_spec is not None else True
        )
        env = _append_missing_env_transforms(env, policy)
        appended = _transforms(env)
        assert [type(t) for t in appended] == [InitTracker, TensorDictPrimer]
        assert all(t.parent is not None for t in appended)
        assert _append_missing_env_transforms(env, policy) is env
        assert len(_transforms(env)) == 2
        env.action_spec  # noqa: B018
        data = env.rollout(4, policy)
        assert data["is_init"][0].all() and not data["is_init"][1:].any()
        # the hidden state is carried from step to step
        assert (
            data["recurrent_state_h"][1:] == data["next", "recurrent_state_h"][:-1]
        ).all()
        assert data["recurrent_state_h"][1].abs().sum() > 0

    def test_append_with_transforms(self):
        transforms = list(get_env_transforms_from_module(make_recurrent_policy()))
        env = _append_missing_env_transforms(make_tracked_cartpole(), transforms)
        assert _count(env, InitTracker) == 1 and _count(env, TensorDictPrimer) == 1


class TestPrimerShapeMismatch:
    """A primer already in the env with other shapes than the policy's is an error."""

    _MATCH = r"'recurrent_state_[hc]' of shape \(1, 16\).*has shape \(1, 8\)"

    def test_missing_transforms_raises(self):
        with pytest.raises(ValueError, match=self._MATCH) as excinfo:
            _missing_env_transforms(make_primed_cartpole(), make_recurrent_policy())
        assert "get_env_transforms_from_module(policy)" in str(excinfo.value)

    def test_policy_keyword_raises(self):
        lstm = LSTMModule(
            input_size=4, hidden_size=16, in_key="observation", out_key="features"
        )
        with pytest.raises(ValueError, match=self._MATCH):
            TransformedEnv(
                make_cartpole(),
                Compose(InitTracker(), lstm.make_tensordict_primer()),
                policy=make_recurrent_policy(),
            )

    def test_batched_env_reports_shape_per_env(self):
        env = SerialEnv(2, make_primed_cartpole)
        try:
            assert env.observation_spec["recurrent_state_h"].shape == (2, 1, 16)
            with pytest.raises(ValueError, match=self._MATCH):
                _missing_env_transforms(env, make_recurrent_policy())
        finally:
            env.close(raise_if_closed=False)

    def test_matching_shapes_pass(self):
        env = make_primed_cartpole(hidden_size=8)
        assert _missing_env_transforms(env, make_recurrent_policy()) == []


class _CustomEnv(EnvBase):
    """A user subclass whose ``__init__`` knows nothing about ``policy=``."""

    def __init__(self, steps: int = 3):
        super().__init__()
        from torchrl.data import Composite, OneHot, Unbounded

        self.full_observation_spec = Composite(observation=Unbounded(shape=(4,)))
        self.full_action_spec = Composite(action=OneHot(2))
        self.steps = steps

    def _reset(self, tensordict):
        out = self.full_observation_spec.zero()
        out.update(self.full_done_spec.zero())
        return out

    def _step(self, tensordict):
        out = self.full_observation_spec.rand()
        out.update(self.full_reward_spec.zero())
        out.update(self.full_done_spec.zero())
        return out

    def _set_seed(self, seed):
        return seed


class _EnvWithPolicyArg(_CustomEnv):
    def __init__(self, policy=None):
        super().__init__()
        self.received_policy = policy


class TestPolicyKeyword:
    @pytest.mark.parametrize("kind", ["lstm", "gru"])
    def test_gym_env(self, kind):
        policy = make_recurrent_policy(kind)
        env = make_cartpole(policy=policy)
        assert isinstance(env, TransformedEnv)
        assert [type(t) for t in _transforms(env)] == [InitTracker, TensorDictPrimer]
        assert all(t.parent is not None for t in _transforms(env))
        data = env.rollout(3, policy)
        assert data["is_init"][0].all()
        assert all(key in data.keys() for key in state_keys(kind))

    def test_custom_subclass(self):
        policy = make_recurrent_policy()
        env = _CustomEnv(policy=policy)
        assert [type(t) for t in _transforms(env)] == [InitTracker, TensorDictPrimer]
        env.rollout(3, policy)

    def test_subclass_declaring_policy_receives_it(self):
        policy = make_recurrent_policy()
        env = _EnvWithPolicyArg(policy=policy)
        assert env.received_policy is policy
        assert not isinstance(env, TransformedEnv)

    def test_already_tracked_not_twice(self):
        policy = make_recurrent_policy()
        env = TransformedEnv(
            make_cartpole(),
            Compose(InitTracker(), InitTracker(init_key="other")),
            policy=policy,
        )
        assert _count(env, InitTracker) == 2  # "is_init" + the explicit "other"
        assert _count(env, TensorDictPrimer) == 1
        assert isinstance(_transforms(env)[-1], TensorDictPrimer)

    def test_transformed_env(self):
        policy = make_recurrent_policy()
        env = TransformedEnv(make_cartpole(), InitTracker(), policy=policy)
        assert [type(t) for t in _transforms(env)] == [InitTracker, TensorDictPrimer]
        env.rollout(3, policy)

    @pytest.mark.parametrize("batched_cls", [SerialEnv, ParallelEnv])
    def test_batched(self, batched_cls):
        policy = make_recurrent_policy()
        env = batched_cls(2, make_tracked_cartpole, policy=policy)
        try:
            assert _count(env, InitTracker) == 0
            assert _count(env, TensorDictPrimer) == 1
            data = env.rollout(3, policy)
            assert data["is_init"][:, 0].all()
        finally:
            env.close()

    def test_renamed_init_key(self):
        policy = make_my_init_policy()
        env = make_cartpole(policy=policy)
        assert [t.init_key for t in _transforms(env) if isinstance(t, InitTracker)] == [
            "my_init"
        ]
        data = env.rollout(5, policy, break_when_any_done=False)
        assert data["my_init"][0].all()
        assert data["features"][:, 0].tolist()[:2] == [1.0, 2.0]

    def test_nested_multi_agent(self):
        policy = make_agents_policy()
        env = TwoAgentEnv(policy=policy)
        assert ("agents", "is_init") in env.observation_spec.keys(True, True)
        data = env.rollout(6, policy, break_when_any_done=False)
        # the carried state counts the steps since the last reset (every 4 steps)
        assert data["agents", "features"][:, 0, 0].tolist() == [1, 2, 3, 4, 1, 2]

    def test_auto_reset(self):
        policy = make_recurrent_policy()
        env = make_cartpole(policy=policy, auto_reset=True)
        assert isinstance(env, AutoResetEnv)
        assert _count(env, InitTracker) == 1 and _count(env, TensorDictPrimer) == 1
        assert {"is_init", *state_keys("lstm")} <= set(env.observation_spec.keys())

    def test_feedforward_untouched(self):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            env = make_cartpole(policy=make_feedforward_policy())
        assert not isinstance(env, TransformedEnv)

    def test_none_is_default(self):
        assert not isinstance(make_cartpole(policy=None), TransformedEnv)

    def test_failing_primer_reported_not_raised(self):
        policy = make_dropout_lstm_policy()
        with pytest.warns(UserWarning, match="ConsistentDropoutModule"):
            env = make_cartpole(policy=policy)
        assert [type(t) for t in _transforms(env)] == [InitTracker, TensorDictPrimer]
        env.rollout(3, policy)

    def test_plain_callable_gets_nothing(self):
        # as with the collectors' auto_register_policy_transforms: a callable
        # that is not a module has nothing to inspect
        def policy(td):
            return td.set("action", torch.tensor([1, 0]))

        env = make_cartpole(policy=policy)
        assert not isinstance(env, TransformedEnv)
        env.rollout(3, policy)
        env = TransformedEnv(make_cartpole(), policy=policy)
        assert _transforms(env) == []
        env.rollout(3, policy)

    def test_non_callable_raises(self):
        with pytest.raises(
            TypeError, match="policy must be a torch.nn.Module .* or a callable"
        ):
            make_cartpole(policy=3)

    @pytest.mark.parametrize("auto_unwrap", [True, False])
    def test_transformed_env_over_transformed_env(self, auto_unwrap):
        # no transform argument, only policy=: nested or unwrapped, the env
        # gets the policy's transforms after the inner env's own
        policy = make_recurrent_policy()
        inner = TransformedEnv(make_cartpole(), StepCounter())
        with set_auto_unwrap_transformed_env(auto_unwrap):
            env = TransformedEnv(inner, policy=policy)
        assert isinstance(env.base_env, TransformedEnv) is not auto_unwrap
        assert [type(t) for t in _transforms(env)] == [
            StepCounter,
            InitTracker,
            TensorDictPrimer,
        ]
        data = env.rollout(3, policy)
        assert data["is_init"][0].all()

    def test_documented(self):
        assert "policy (torch.nn.Module or Callable, optional)" in EnvBase.__doc__
        assert "does not show it" in EnvBase.__doc__

    def test_action_spec_after_wrapping(self):
        env = make_cartpole(policy=make_recurrent_policy())
        assert env.action_spec.shape == torch.Size([2])


@pytest.fixture
def torchrl_log():
    """The records of TorchRL's logger, from INFO up, while the test runs."""
    records = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append
    logger = logging.getLogger("torchrl")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(level)


class TestTransformsJoinTheEnvCleanly:
    """A policy with two primers: they join the env as fresh transforms.

    A transform taken out of a ``Compose`` that is then dropped would still
    point at it, and joining an env would log that its container is gone.
    """

    @pytest.mark.parametrize("path", ["function", "policy-keyword", "collector"])
    def test_two_primers_log_nothing(self, torchrl_log, path):
        policy = make_two_init_keys_policy()
        if path == "function":
            transforms = get_env_transforms_from_module(policy)
            env = TransformedEnv(make_cartpole(), transforms)
        elif path == "policy-keyword":
            env = make_cartpole(policy=policy)
        else:
            collector = Collector(
                make_cartpole(),
                policy,
                frames_per_batch=4,
                total_frames=4,
                auto_register_policy_transforms=True,
            )
            env = collector.env
            collector.shutdown()
        assert [r.getMessage() for r in torchrl_log] == []
        primers = [t for t in _transforms(env) if isinstance(t, TensorDictPrimer)]
        assert len(primers) == 2
        assert all(isinstance(p.parent, EnvBase) for p in primers)

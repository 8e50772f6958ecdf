# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""``auto_register_policy_transforms`` and the ``split_trajs`` advisory on collectors."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torchrl._utils
from _recurrent_policies import (
    count_transforms as _count,
    env_transforms as _transforms,
    make_agents_policy,
    make_cartpole,
    make_dropout_lstm_policy,
    make_feedforward_policy,
    make_lstm_policy,
    make_my_init_policy,
    make_primed_cartpole,
    make_recurrent_policy,
    make_tracked_cartpole,
    state_keys,
    TwoAgentEnv,
)
from torchrl.collectors import (
    Collector,
    MultiCollector,
    PolicyTransformsFutureWarning,
    SplitTrajsWarning,
)
from torchrl.envs import InitTracker, SerialEnv, TensorDictPrimer, TransformedEnv

FRAMES = 8


def _collector(env, policy=None, **kwargs) -> Collector:
    """A one-batch collector of ``FRAMES`` frames."""
    return Collector(
        env, policy, frames_per_batch=FRAMES, total_frames=FRAMES, **kwargs
    )


def _first_batch(collector):
    try:
        for data in collector:
            return data
    finally:
        collector.shutdown()


def _policy_warnings(record) -> list:
    return [w for w in record if issubclass(w.category, PolicyTransformsFutureWarning)]


def _snapshot(env) -> dict:
    """What the collector must leave unchanged in the env it is given."""
    return {
        "type": type(env),
        "transform": getattr(env, "transform", None),
        "transforms": _transforms(env),
        "observation_spec": env.full_observation_spec.clone(),
        "state_spec": env.full_state_spec.clone(),
    }


def _assert_unchanged(env, snapshot) -> None:
    assert type(env) is snapshot["type"]
    assert getattr(env, "transform", None) is snapshot["transform"]
    transforms = _transforms(env)
    assert len(transforms) == len(snapshot["transforms"])
    assert all(a is b for a, b in zip(transforms, snapshot["transforms"]))
    assert env.full_observation_spec == snapshot["observation_spec"]
    assert env.full_state_spec == snapshot["state_spec"]


class TestAutoRegisterTrue:
    @pytest.mark.parametrize("env_fn", [make_cartpole, make_tracked_cartpole])
    def test_user_env_left_unchanged(self, env_fn):
        env = env_fn()
        snapshot = _snapshot(env)
        collector = _collector(
            env, make_lstm_policy(), auto_register_policy_transforms=True
        )
        _assert_unchanged(env, snapshot)
        assert collector.env is not env
        assert isinstance(collector.env, TransformedEnv)
        assert _count(collector.env, InitTracker) == 1
        assert _count(collector.env, TensorDictPrimer) == 1
        data = _first_batch(collector)
        assert data["is_init"][0].all() and "recurrent_state_h" in data.keys()
        _assert_unchanged(env, snapshot)

    @pytest.mark.parametrize("kind", ["lstm", "gru"])
    @pytest.mark.parametrize("use_buffers", [True, False])
    def test_bare_env_collects(self, kind, use_buffers):
        collector = _collector(
            make_cartpole(),
            make_recurrent_policy(kind),
            use_buffers=use_buffers,
            auto_register_policy_transforms=True,
        )
        data = _first_batch(collector)
        assert data["is_init"][0].all()
        for key in state_keys(kind):
            assert key in data.keys() and ("next", key) in data.keys(True)
        # the recurrent state is carried from one step to the next
        key = state_keys(kind)[0]
        not_reset = ~data["next", "done"].squeeze(-1)[:-1]
        assert (data[key][1:][not_reset] == data["next", key][:-1][not_reset]).all()
        assert data[key][1:][not_reset].abs().sum() > 0

    def test_policy_kwarg_env_gets_one_tracker(self):
        policy = make_lstm_policy()
        env = make_cartpole(policy=policy)
        collector = _collector(
            env,
            policy,
            auto_register_policy_transforms=True,
        )
        assert _count(collector.env, InitTracker) == 1
        assert _count(collector.env, TensorDictPrimer) == 1
        assert _first_batch(collector)["is_init"][0].all()

    def test_batched_tracked_children(self):
        # ParallelEnv children are covered (cheaper) in test_recurrent_env_wiring.py
        policy = make_lstm_policy()
        env = SerialEnv(2, make_tracked_cartpole)
        collector = _collector(
            env,
            policy,
            auto_register_policy_transforms=True,
        )
        assert _count(collector.env, InitTracker) == 0
        assert _count(collector.env, TensorDictPrimer) == 1
        data = _first_batch(collector)
        assert data["is_init"][:, 0].all()
        assert "recurrent_state_h" in data.keys()

    def test_renamed_init_key(self):
        policy = make_my_init_policy()
        collector = _collector(
            make_cartpole(),
            policy,
            auto_register_policy_transforms=True,
        )
        trackers = [t for t in _transforms(collector.env) if isinstance(t, InitTracker)]
        assert [t.init_key for t in trackers] == ["my_init"]
        data = _first_batch(collector)
        assert data["my_init"][0].all()
        assert "is_init" not in data.keys()
        assert data["features"][:2, 0].tolist() == [1.0, 2.0]

    def test_nested_multi_agent(self):
        collector = _collector(
            TwoAgentEnv(),
            make_agents_policy(),
            auto_register_policy_transforms=True,
        )
        data = _first_batch(collector)
        assert data["agents", "is_init"][0].all()
        assert data["agents", "features"][:, 0, 0].tolist() == [1, 2, 3, 4] * 2

    def test_nested_multi_agent_tracked(self):
        env = TwoAgentEnv().append_transform(InitTracker())
        collector = _collector(
            env,
            make_agents_policy(),
            auto_register_policy_transforms=True,
        )
        assert _count(collector.env, InitTracker) == 1
        collector.shutdown()

    def test_policy_factory(self):
        collector = _collector(
            make_cartpole(),
            policy_factory=make_lstm_policy,
            auto_register_policy_transforms=True,
        )
        data = _first_batch(collector)
        assert data["is_init"][0].all() and "recurrent_state_c" in data.keys()

    def test_consistent_dropout_next_to_lstm(self):
        with pytest.warns(UserWarning, match="ConsistentDropoutModule") as record:
            collector = _collector(
                make_cartpole(),
                make_dropout_lstm_policy(),
                auto_register_policy_transforms=True,
            )
        assert any(w.filename == __file__ for w in record)
        data = _first_batch(collector)
        assert data["is_init"][0].all() and "recurrent_state_h" in data.keys()

    def test_consistent_dropout_with_shape(self):
        collector = _collector(
            make_cartpole(),
            make_dropout_lstm_policy(input_shape=(4,)),
            auto_register_policy_transforms=True,
        )
        assert _count(collector.env, TensorDictPrimer) == 2
        data = _first_batch(collector)
        assert any(str(key).startswith("mask_") for key in data.keys())


class TestAutoRegisterDefault:
    def test_warns_once_and_changes_nothing(self):
        env = make_tracked_cartpole()
        transforms_before = _transforms(env)
        with pytest.warns(FutureWarning) as record:
            collector = Collector(
                env, make_lstm_policy(), frames_per_batch=FRAMES, total_frames=FRAMES
            )
        found = _policy_warnings(record)
        assert len(found) == 1
        message = str(found[0].message)
        assert "TensorDictPrimer" in message and "recurrent_state_h" in message
        assert "will become True" in message
        assert "auto_register_policy_transforms=True" in message
        assert "auto_register_policy_transforms=False" in message
        assert found[0].filename == __file__
        assert collector.env is env
        assert _transforms(collector.env) == transforms_before
        data = _first_batch(collector)
        assert "recurrent_state_h" not in data.keys()

    def test_warns_before_error(self):
        with pytest.warns(PolicyTransformsFutureWarning) as record:
            with pytest.raises(RuntimeError, match="cannot run the policy"):
                _collector(make_cartpole(), make_lstm_policy())
        found = _policy_warnings(record)
        assert len(found) == 1 and found[0].filename == __file__
        assert "InitTracker" in str(found[0].message)

    @pytest.mark.parametrize("use_buffers", [True, False])
    def test_error_when_policy_cannot_run(self, use_buffers):
        with pytest.warns(PolicyTransformsFutureWarning), pytest.raises(
            RuntimeError
        ) as excinfo:
            _collector(
                make_cartpole(),
                make_lstm_policy(),
                use_buffers=use_buffers,
            )
        message = str(excinfo.value)
        assert "'is_init'" in message and "'recurrent_state_h'" in message
        assert "auto_register_policy_transforms=True" in message
        assert "get_env_transforms_from_module" in message
        assert isinstance(excinfo.value.__cause__, KeyError)

    def test_nothing_missing_is_silent(self):
        policy = make_lstm_policy()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            collector = _collector(
                make_cartpole(policy=policy),
                policy,
            )
        collector.shutdown()


class TestPrimerShapeMismatch:
    @pytest.mark.parametrize("mode", [None, True])
    def test_reported_at_construction(self, mode):
        with pytest.raises(ValueError) as excinfo:
            _collector(
                make_primed_cartpole(hidden_size=16),
                make_lstm_policy(),
                auto_register_policy_transforms=mode,
            )
        message = str(excinfo.value)
        assert "'recurrent_state_h'" in message or "'recurrent_state_c'" in message
        assert "(1, 16)" in message and "(1, 8)" in message
        assert "get_env_transforms_from_module(policy)" in message


class TestAutoRegisterFalse:
    def test_silent_and_untouched(self):
        env = make_tracked_cartpole()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            collector = _collector(
                env,
                make_lstm_policy(),
                auto_register_policy_transforms=False,
            )
        assert collector.env is env
        assert _count(collector.env, TensorDictPrimer) == 0
        collector.shutdown()

    def test_bare_env_not_completed(self):
        with pytest.raises(KeyError, match="is_init"):
            _collector(
                make_cartpole(),
                make_lstm_policy(),
                auto_register_policy_transforms=False,
            )


class TestFeedForward:
    @pytest.mark.parametrize("mode", [None, True, False])
    def test_no_warning_no_transform(self, mode):
        env = make_cartpole()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            collector = _collector(
                env,
                make_feedforward_policy(),
                auto_register_policy_transforms=mode,
            )
            assert collector.env is env
            data = _first_batch(collector)
        assert "is_init" not in data.keys()

    def test_default_not_passed(self):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            collector = _collector(
                make_cartpole(),
                make_feedforward_policy(),
            )
        assert not isinstance(collector.env, TransformedEnv)
        collector.shutdown()


class TestArgumentErrors:
    def test_collector_bad_flag(self):
        with pytest.raises(
            TypeError,
            match="auto_register_policy_transforms must be True, False or None",
        ):
            _collector(
                make_cartpole(),
                make_lstm_policy(),
                auto_register_policy_transforms="yes",
            )

    def test_multi_collector_bad_flag_and_split_trajs_warning(self):
        # both checks happen before any worker is started
        with pytest.warns(UserWarning, match="split_trajs=True") as record:
            with pytest.raises(
                TypeError, match="auto_register_policy_transforms must be True"
            ):
                MultiCollector(
                    [make_cartpole, make_cartpole],
                    make_lstm_policy(),
                    frames_per_batch=FRAMES,
                    total_frames=FRAMES,
                    split_trajs=True,
                    sync=True,
                    auto_register_policy_transforms=1,
                )
        assert record[0].filename == __file__


class TestSplitTrajsAdvisory:
    def test_warns(self):
        with pytest.warns(SplitTrajsWarning, match="split_trajs=True") as record:
            collector = _collector(
                make_cartpole(),
                make_feedforward_policy(),
                split_trajs=True,
            )
        found = [w for w in record if issubclass(w.category, SplitTrajsWarning)]
        assert len(found) == 1
        message = str(found[0].message)
        assert "(N_traj, T_max)" in message and "mask" in message
        assert "replay_buffer=" in message and "SliceSampler" in message
        assert "data-layout" in message and "DeprecationWarning" in message
        assert found[0].filename == __file__
        data = _first_batch(collector)
        assert ("collector", "mask") in data.keys(True)

    @pytest.mark.parametrize("split_trajs", [None, False])
    def test_silent(self, split_trajs):
        kwargs = {} if split_trajs is None else {"split_trajs": split_trajs}
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            collector = _collector(
                make_cartpole(),
                make_feedforward_policy(),
                **kwargs,
            )
        collector.shutdown()


class TestWarningControls:
    def test_classes_public(self):
        import torchrl.collectors
        import torchrl.modules.utils

        assert issubclass(PolicyTransformsFutureWarning, FutureWarning)
        assert issubclass(SplitTrajsWarning, UserWarning)
        assert (
            torchrl.modules.utils.PolicyTransformsFutureWarning
            is PolicyTransformsFutureWarning
        )
        assert {"PolicyTransformsFutureWarning", "SplitTrajsWarning"} <= set(
            torchrl.collectors.__all__
        )

    def test_future_warning_names_release(self):
        with pytest.warns(PolicyTransformsFutureWarning, match=r"True in v0\.14"):
            _collector(make_tracked_cartpole(), make_lstm_policy()).shutdown()

    def test_filtered_by_category(self):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            warnings.simplefilter("ignore", PolicyTransformsFutureWarning)
            warnings.simplefilter("ignore", SplitTrajsWarning)
            collector = _collector(
                make_tracked_cartpole(), make_lstm_policy(), split_trajs=True
            )
        collector.shutdown()

    def test_rl_warnings_off_silences(self, monkeypatch):
        monkeypatch.setattr(torchrl._utils, "RL_WARNINGS", False)
        assert not torchrl._utils.rl_warnings()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            collector = _collector(
                make_tracked_cartpole(), make_lstm_policy(), split_trajs=True
            )
        collector.shutdown()
        # the error still comes when the policy cannot run
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(RuntimeError, match="cannot run the policy"):
                _collector(make_cartpole(), make_lstm_policy())

    def test_rl_warnings_env_var(self):
        # RL_WARNINGS is read when torchrl is imported: check it in a fresh process
        script = textwrap.dedent(
            """
            import warnings
            from _recurrent_policies import make_lstm_policy, make_tracked_cartpole
            from torchrl.collectors import Collector

            with warnings.catch_warnings():
                warnings.simplefilter("error")
                Collector(
                    make_tracked_cartpole(), make_lstm_policy(), frames_per_batch=8,
                    total_frames=8, split_trajs=True,
                ).shutdown()
            """
        )
        env = dict(os.environ, RL_WARNINGS="0")
        env["PYTHONPATH"] = os.pathsep.join(
            p
            for p in (os.path.dirname(__file__), env.get("PYTHONPATH"))
            if p is not None
        )
        result = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr


class TestMultiCollector:
    """Lean: two workers, a few frames, three collectors in all (worker start-up is slow)."""

    def test_sync_default_warns_once_in_main(self):
        with pytest.warns(FutureWarning) as record:
            collector = MultiCollector(
                [make_tracked_cartpole, make_tracked_cartpole],
                policy_factory=make_lstm_policy,
                frames_per_batch=FRAMES,
                total_frames=FRAMES,
                sync=True,
            )
        found = _policy_warnings(record)
        assert len(found) == 1
        assert "auto_register_policy_transforms=True" in str(found[0].message)
        assert str(found[0].message).startswith("MultiSyncCollector: ")
        assert found[0].filename == __file__
        data = _first_batch(collector)
        assert "recurrent_state_h" not in data.keys()
        assert "is_init" in data.keys()

    def test_true_leaves_passed_env_unchanged(self):
        # env instances are sent to the workers, which complete their own copy
        env = make_tracked_cartpole()
        snapshot = _snapshot(env)
        collector = MultiCollector(
            [env, env],
            policy_factory=make_lstm_policy,
            frames_per_batch=FRAMES,
            total_frames=FRAMES,
            sync=True,
            auto_register_policy_transforms=True,
        )
        _assert_unchanged(env, snapshot)
        data = _first_batch(collector)
        assert "recurrent_state_h" in data.keys()
        _assert_unchanged(env, snapshot)

    def test_default_warns_before_worker_error(self):
        # the worker's warning and error name the collector the user built
        with pytest.warns(PolicyTransformsFutureWarning) as record:
            with pytest.raises(
                RuntimeError,
                match=r"MultiSyncCollector worker \d cannot run the policy",
            ):
                MultiCollector(
                    [make_cartpole, make_cartpole],
                    policy_factory=make_lstm_policy,
                    frames_per_batch=FRAMES,
                    total_frames=FRAMES,
                    sync=True,
                )
        found = _policy_warnings(record)
        assert len(found) == 1 and found[0].filename == __file__
        assert str(found[0].message).startswith("MultiSyncCollector: ")

    @pytest.mark.parametrize("sync", [True, False])
    def test_true_with_policy_factory(self, sync):
        with warnings.catch_warnings():
            warnings.simplefilter("error", PolicyTransformsFutureWarning)
            collector = MultiCollector(
                [make_cartpole, make_cartpole],
                policy_factory=make_lstm_policy,
                frames_per_batch=FRAMES,
                total_frames=FRAMES,
                sync=sync,
                auto_register_policy_transforms=True,
            )
        data = _first_batch(collector)
        assert "is_init" in data.keys()
        assert "recurrent_state_h" in data.keys()
        assert ("next", "recurrent_state_c") in data.keys(True)

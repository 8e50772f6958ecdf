# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""``auto_register_policy_transforms`` and the ``split_trajs`` advisory on collectors."""
from __future__ import annotations

import warnings

import pytest
from _recurrent_policies import (
    count_transforms as _count,
    env_transforms as _transforms,
    make_agents_policy,
    make_cartpole,
    make_dropout_lstm_policy,
    make_feedforward_policy,
    make_lstm_policy,
    make_my_init_policy,
    make_recurrent_policy,
    make_tracked_cartpole,
    state_keys,
    TwoAgentEnv,
)
from torchrl.collectors import Collector, MultiCollector
from torchrl.envs import InitTracker, SerialEnv, TensorDictPrimer, TransformedEnv
from torchrl.modules.utils._env_transforms import PolicyTransformsFutureWarning

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


class TestAutoRegisterTrue:
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

    @pytest.mark.parametrize("use_buffers", [True, False])
    def test_error_when_policy_cannot_run(self, use_buffers):
        with pytest.raises(RuntimeError) as excinfo:
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
        with pytest.warns(UserWarning, match="split_trajs=True") as record:
            collector = _collector(
                make_cartpole(),
                make_feedforward_policy(),
                split_trajs=True,
            )
        found = [w for w in record if "split_trajs=True" in str(w.message)]
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
        assert found[0].filename == __file__
        data = _first_batch(collector)
        assert "recurrent_state_h" not in data.keys()
        assert "is_init" in data.keys()

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

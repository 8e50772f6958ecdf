# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""``GymWrapper`` over a gymnasium vector env steps with any number of envs, one included."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from torchrl.envs import GymWrapper


def _sync_cartpoles(num_envs: int):
    return gym.make_vec(
        "CartPole-v1",
        num_envs=num_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.DISABLED},
    )


@pytest.mark.parametrize("num_envs", [1, 2])
class TestSyncVectorEnv:
    def test_rollout(self, num_envs):
        env = GymWrapper(_sync_cartpoles(num_envs))
        try:
            assert env.batch_size == (num_envs,)
            data = env.rollout(3, break_when_any_done=False)
            assert data.batch_size == (num_envs, 3)
            assert data["next", "observation"].shape == (num_envs, 3, 4)
            assert env.reward_spec.shape == (num_envs, 1)
            assert data["next", "reward"].shape == (num_envs, 3, 1)
            assert data["next", "done"].shape == (num_envs, 3, 1)
        finally:
            env.close()

    def test_step_matches_gymnasium(self, num_envs):
        # the wrapper hands the vector env one action per env, as gymnasium
        # itself takes it, and returns what gymnasium returns
        env = GymWrapper(_sync_cartpoles(num_envs))
        reference = _sync_cartpoles(num_envs)
        try:
            td = env.reset(seed=0)
            expected, _ = reference.reset(seed=0)
            torch.testing.assert_close(
                td["observation"], torch.as_tensor(expected, dtype=torch.float32)
            )
            actions = np.arange(num_envs) % 2
            td["action"] = torch.nn.functional.one_hot(torch.as_tensor(actions), 2).to(
                env.action_spec.dtype
            )
            td = env.step(td)
            expected, *_ = reference.step(actions)
            torch.testing.assert_close(
                td["next", "observation"],
                torch.as_tensor(expected, dtype=torch.float32),
            )
        finally:
            env.close()
            reference.close()

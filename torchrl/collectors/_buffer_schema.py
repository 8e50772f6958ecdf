# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""What a collector writes to its replay buffer.

The multiprocessed collectors initialise the storage of a shared replay buffer
in the main process, before their workers write to it: the storage can only
hold the keys it was initialised with, so it must be initialised from what the
workers write. Each worker is a :class:`~torchrl.collectors.Collector` that
completes its environment from the policy (``auto_register_policy_transforms``,
``max_frames_per_traj``), writes the policy's outputs and the collector's
trajectory ids, and post-processes whole batches; :func:`_collector_write_template`
builds a zeroed step of exactly that, without stepping the environment.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from tensordict import is_tensor_collection, TensorDictBase
from torch import nn


def _completed_env(env, policy, auto_register_policy_transforms, max_frames_per_traj):
    """The env as a :class:`~torchrl.collectors.Collector` completes it, without warnings.

    With ``auto_register_policy_transforms=True`` the transforms of the policy
    that ``env`` lacks are added (the other values leave the env as it is: the
    collector's workers emit the warning and raise the errors themselves), then
    a :class:`~torchrl.envs.StepCounter` when ``max_frames_per_traj`` is set.
    ``env`` itself is left unchanged.
    """
    from torchrl.envs import StepCounter, TransformedEnv
    from torchrl.modules.utils._env_transforms import _wrap_missing_env_transforms

    if auto_register_policy_transforms and isinstance(policy, nn.Module):
        env = _wrap_missing_env_transforms(env, policy)
    if max_frames_per_traj and not any(
        "step_count" in ((key,) if isinstance(key, str) else key)
        for key in env.output_spec.keys(True, True)
    ):
        # (with a step_count already there, the workers raise the error)
        env = TransformedEnv(env, StepCounter(max_steps=max_frames_per_traj))
    return env


def _runs_the_policy(policy) -> bool:
    """Whether the policy's outputs must be computed by running it.

    ``None`` (the workers build a :class:`~torchrl.modules.RandomPolicy`) and a
    :class:`~torchrl.modules.RandomPolicy` write the action only, which the
    env's fake tensordict has; a policy with parameters on the ``meta`` device
    cannot run before its weights are received.
    """
    from torchrl.modules import RandomPolicy

    if policy is None or isinstance(policy, RandomPolicy):
        return False
    if isinstance(policy, nn.Module) and any(
        p.device.type == "meta" for p in policy.parameters()
    ):
        return False
    return True


def _with_policy_outputs(
    template: TensorDictBase, env, policy, trust_policy: bool, exploration_type
) -> TensorDictBase:
    """Runs ``policy`` once on a copy of ``template`` and adds what it writes."""
    from torchrl.envs.utils import _make_compatible_policy, set_exploration_type
    from torchrl.modules import set_exploration_modules_spec_from_env

    if not trust_policy:
        policy = _make_compatible_policy(
            policy=policy, observation_spec=env.observation_spec, env=env
        )
    if isinstance(policy, nn.Module):
        # what every worker does to its copy of the policy
        set_exploration_modules_spec_from_env(policy, env)
    policy_input = template.copy()
    param = next(policy.parameters(), None) if isinstance(policy, nn.Module) else None
    if param is not None:
        policy_input = policy_input.to(param.device)
    exploration = (
        set_exploration_type(exploration_type)
        if exploration_type is not None
        else contextlib.nullcontext()
    )
    try:
        with torch.no_grad(), exploration:
            policy_output = policy(policy_input)
    except KeyError:
        # The policy reads a key that the env does not write: the workers fail
        # the same way and report it (with auto_register_policy_transforms=None,
        # as an error that names the missing transforms).
        return template
    return template.update(policy_output)


def _collector_write_template(
    create_env_fn,
    create_env_kwargs: dict | None,
    policy,
    *,
    auto_register_policy_transforms: bool | None,
    max_frames_per_traj: int = 0,
    trust_policy: bool = False,
    exploration_type=None,
    postproc: Callable | None = None,
    whole_batches: bool = True,
) -> TensorDictBase:
    """A zeroed one-step batch of what a collector worker writes to its replay buffer.

    The worker is a :class:`~torchrl.collectors.Collector` built on
    ``create_env_fn(**create_env_kwargs)`` and ``policy``. The template holds
    the fake tensordict of the env as the worker completes it (the policy's
    transforms, a step counter), updated with what the policy writes when run
    on it and with ``("collector", "traj_ids")``. Its shape is the env's batch
    size followed by one time step. With ``whole_batches=True`` (the workers
    write whole batches, not step by step) it is then post-processed as the
    workers' batches are: ``postproc``, then private keys (``"_..."``) removed.

    Args:
        create_env_fn (EnvBase, EnvCreator or callable): the env of the worker.
        create_env_kwargs (dict, optional): the kwargs of ``create_env_fn``.
        policy (Callable, optional): the policy of the worker (built from its
            ``policy_factory`` if it has one). ``None`` stands for the
            :class:`~torchrl.modules.RandomPolicy` that the worker builds.

    Keyword Args:
        auto_register_policy_transforms (bool, optional): the collector's value.
        max_frames_per_traj (int, optional): the collector's value. Defaults to ``0``.
        trust_policy (bool, optional): the collector's value. Defaults to ``False``.
        exploration_type (ExplorationType, optional): the collector's exploration type.
        postproc (Callable, optional): the collector's post-processing.
        whole_batches (bool, optional): whether the workers write whole batches.
            Defaults to ``True``.
    """
    from torchrl.envs import EnvBase, EnvCreator

    runs_policy = _runs_the_policy(policy)
    if (
        isinstance(create_env_fn, EnvCreator)
        and not runs_policy
        and not max_frames_per_traj
    ):
        # Nothing to complete, nothing to run: the creator's metadata suffices,
        # less the "_reset" entries it adds next to the done keys (an env
        # never writes them)
        template = create_env_fn.meta_data.tensordict.clone()
        template = template.exclude(
            *[
                key
                for key in template.keys(True, True)
                if (key if isinstance(key, str) else key[-1]) == "_reset"
            ]
        )
    else:
        if isinstance(create_env_fn, EnvBase):
            env = create_env_fn
        else:
            env = create_env_fn(**(create_env_kwargs or {}))
        env = _completed_env(
            env, policy, auto_register_policy_transforms, max_frames_per_traj
        )
        template = env.fake_tensordict()
        if runs_policy:
            template = _with_policy_outputs(
                template, env, policy, trust_policy, exploration_type
            )
    template["collector", "traj_ids"] = torch.zeros(template.shape, dtype=torch.long)
    template = template.unsqueeze(-1)
    if whole_batches:
        if postproc is not None:
            template = postproc(template)
        private = [
            key
            for key in template.keys(True)
            if any(k.startswith("_") for k in ((key,) if isinstance(key, str) else key))
        ]
        template = template.exclude(*private)
    return template


def _check_keys_on_write(replay_buffer) -> None:
    """Makes the storage of ``replay_buffer`` reject the writes whose keys are not its keys.

    Called by every collector given a replay buffer: a collector writes rows
    of one schema, so a write that lacks a key of the storage (the rows would
    keep stale values) or carries a key the storage lacks (it would be dropped,
    by a locked storage or by a copy of a shared one in another process) is a
    bug, reported by
    :meth:`~torchrl.data.replay_buffers.storages.TensorStorage.set` with the
    keys named. Storages that hold no tensordict are not concerned.
    """
    from torchrl.data.replay_buffers.storages import TensorStorage

    storage = getattr(replay_buffer, "_storage", None)
    if isinstance(storage, TensorStorage):
        storage._check_keys_on_write = True


def _writes_are_checkable(replay_buffer) -> bool:
    """Whether the data a collector gives to ``replay_buffer`` is what its storage receives.

    True for an initialised tensordict storage of a buffer without transforms
    (the transforms of a buffer may change the keys written).
    """
    from torchrl.data.replay_buffers.storages import TensorStorage

    storage = getattr(replay_buffer, "_storage", None)
    transform = getattr(replay_buffer, "_transform", None)
    return (
        isinstance(storage, TensorStorage)
        and storage.initialized
        and is_tensor_collection(storage._storage)
        and (transform is None or not len(transform))
    )

# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Env transforms derived from a policy (init trackers and primers).

A recurrent policy (:class:`~torchrl.modules.LSTMModule`,
:class:`~torchrl.modules.GRUModule`, or any module with a
``make_tensordict_primer()`` method) needs the environment to write an
initialization marker (:class:`~torchrl.envs.InitTracker`) and to carry its
recurrent state from step to step (:class:`~torchrl.envs.TensorDictPrimer`).
This module computes those transforms from the policy, tells which of them an
environment still lacks (from the environment's specs only) and appends the
missing ones.
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence

from tensordict.utils import NestedKey, unravel_key
from torch import nn
from torchrl._user_stacklevel import _user_stacklevel

__all__ = ["get_env_transforms_from_module"]

_DEFAULT_INIT_KEY = "is_init"

# Exceptions that a failing ``make_tensordict_primer()`` is expected to raise
# (e.g. ``ConsistentDropoutModule`` built without ``input_shape`` raises a
# RuntimeError). Anything else is a bug and propagates.
_PRIMER_ERRORS = (RuntimeError, ValueError, NotImplementedError)


class PolicyTransformsFutureWarning(FutureWarning):
    """The ``FutureWarning`` emitted when ``auto_register_policy_transforms`` is left to its default.

    A dedicated subclass lets multiprocessed collectors recognise this warning
    in their workers and re-emit it once in the main process.
    """


def _check_bool(name: str, value, allow_none: bool = False) -> None:
    if isinstance(value, bool) or (allow_none and value is None):
        return
    expected = "True, False or None" if allow_none else "True or False"
    raise TypeError(
        f"{name} must be {expected}, got {value!r} of type {type(value).__name__}. "
        f"Pass {expected} instead."
    )


def _check_module(name: str, module) -> None:
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"{name} must be a torch.nn.Module (e.g. a tensordict.nn.TensorDictModule "
            f"or TensorDictSequential policy), got {module!r} of type "
            f"{type(module).__name__}. Pass the policy module itself: its submodules "
            "tell which environment transforms it needs."
        )


def _leaf(key: NestedKey) -> str:
    key = unravel_key(key)
    return key if isinstance(key, str) else key[-1]


def _check_init_key(init_key) -> NestedKey | None:
    if init_key is None:
        return None
    if isinstance(init_key, str) or (
        isinstance(init_key, tuple)
        and init_key
        and all(isinstance(k, str) for k in init_key)
    ):
        return unravel_key(init_key)
    raise TypeError(
        f"init_key must be None, a string or a tuple of strings (a nested key), got "
        f"{init_key!r} of type {type(init_key).__name__}. Pass the key your "
        "recurrent modules read, e.g. init_key='is_init', or None to discover it "
        "from the modules' in_keys."
    )


def _module_init_keys(module: nn.Module) -> list[NestedKey]:
    """The init keys read by ``module`` itself (its submodules are not visited).

    The rule, by order of precedence:

    - a module with a non-``None`` ``init_key`` attribute reads that key;
    - :class:`~torchrl.modules.LSTMModule` and :class:`~torchrl.modules.GRUModule`
      read their last in-key (the init marker they append to their in-keys);
    - any other module with a ``make_tensordict_primer()`` method (a module that
      keeps a state between steps) reads the in-keys whose last element ends with
      ``"init"``;
    - any other module reads the in-keys whose last element is ``"is_init"``.
    """
    from torchrl.modules.tensordict_module.rnn import GRUModule, LSTMModule

    init_key = getattr(module, "init_key", None)
    if isinstance(init_key, (str, tuple)):
        return [unravel_key(init_key)]
    in_keys = getattr(module, "in_keys", None)
    if in_keys is None:
        return []
    if isinstance(in_keys, (str, tuple)):
        in_keys = [in_keys]
    try:
        in_keys = [unravel_key(key) for key in in_keys]
    except (TypeError, ValueError):
        return []
    if isinstance(module, (LSTMModule, GRUModule)):
        return in_keys[-1:]
    if hasattr(module, "make_tensordict_primer"):
        return [key for key in in_keys if _leaf(key).endswith("init")]
    return [key for key in in_keys if _leaf(key) == _DEFAULT_INIT_KEY]


def _policy_init_keys(module: nn.Module) -> list[str]:
    """The leaf init keys read by any submodule of ``module``, in discovery order."""
    leaves = []
    for submodule in module.modules():
        for key in _module_init_keys(submodule):
            leaf = _leaf(key)
            if leaf not in leaves:
                leaves.append(leaf)
    return leaves


def _collect_primers(module: nn.Module, warn: bool, strict: bool) -> list:
    """Calls ``make_tensordict_primer()`` on every submodule that has it.

    With ``strict=False``, the submodules whose primer cannot be built are
    skipped and reported in a single ``UserWarning``.
    """
    _check_module("module", module)
    _check_bool("warn", warn)
    _check_bool("strict", strict)
    primers = []
    failures = []

    def make_primers(submodule):
        if not hasattr(submodule, "make_tensordict_primer"):
            return
        if strict:
            primers.append(submodule.make_tensordict_primer())
            return
        try:
            primers.append(submodule.make_tensordict_primer())
        except _PRIMER_ERRORS as err:
            failures.append((submodule, err))

    module.apply(make_primers)
    if failures:
        culprits = ", ".join(
            f"{type(submodule).__name__} ({type(err).__name__}: {err})"
            for submodule, err in failures
        )
        warnings.warn(
            f"get_primers_from_module could not build the primer of "
            f"{len(failures)} submodule(s): {culprits}. These modules were "
            f"skipped and the {len(primers)} other primer(s) are returned, so the "
            "environment will not reset or carry their state. Fix the module so "
            "that make_tensordict_primer() succeeds (for ConsistentDropoutModule, "
            "pass input_shape) and append its primer by hand with "
            "env.append_transform(module.make_tensordict_primer()), or pass "
            "strict=True to raise the error instead.",
            UserWarning,
            stacklevel=_user_stacklevel(),
        )
    return primers


def _flatten_primers(primers) -> list:
    from torchrl.envs.transforms import Compose

    if primers is None:
        return []
    if isinstance(primers, Compose):
        return list(primers.transforms)
    return [primers]


def _required_env_transforms(module: nn.Module) -> list:
    """What ``module`` needs from the env, and nothing else (used by the automatic paths).

    Unlike :func:`get_env_transforms_from_module`, a policy that reads no init key
    gets no :class:`~torchrl.envs.InitTracker`, and a policy with neither init key
    nor primer gets an empty list. Primers that cannot be built are reported
    with a ``UserWarning`` and skipped: this never raises for a working policy.
    """
    from torchrl.envs.transforms import InitTracker
    from torchrl.modules.utils.utils import get_primers_from_module

    if not isinstance(module, nn.Module):
        return []
    trackers = [InitTracker(init_key=leaf) for leaf in _policy_init_keys(module)]
    primers = _flatten_primers(
        get_primers_from_module(module, warn=False, strict=False)
    )
    return trackers + primers


def get_env_transforms_from_module(
    module: nn.Module, init_key: NestedKey | None = None
):
    """Returns the environment transforms a policy needs, ready for :class:`~torchrl.envs.TransformedEnv`.

    A recurrent policy reads an initialization marker written by
    :class:`~torchrl.envs.InitTracker` and carries a recurrent state that a
    :class:`~torchrl.envs.TensorDictPrimer` must put in the environment's
    specs and reset. This function gathers both from the policy:

    - one :class:`~torchrl.envs.InitTracker` per init key that the policy's
      modules read. The key is discovered from the modules' ``in_keys``
      (:class:`~torchrl.modules.LSTMModule` and
      :class:`~torchrl.modules.GRUModule` read their last in-key; a module
      reading ``"my_init"`` gets ``InitTracker(init_key="my_init")``); two
      modules reading different init keys get one tracker each. A module with
      an ``init_key`` attribute reads that key. When no module reads an init
      key, a bare ``InitTracker()`` (key ``"is_init"``) is returned;
    - the primer(s) of every submodule that has a ``make_tensordict_primer()``
      method (see :func:`~torchrl.modules.utils.get_primers_from_module`).

    The trackers come first, then the primers.

    Args:
        module (torch.nn.Module): the policy, usually a
            :class:`~tensordict.nn.TensorDictSequential` holding recurrent modules.
        init_key (NestedKey, optional): the init key to track, overriding the
            discovered ones. Only its last element is used, since
            :class:`~torchrl.envs.InitTracker` writes the key next to every
            reset key of the environment (``("agents", "is_init")`` in a
            multi-agent env whose reset key is ``("agents", "_reset")``).
            Defaults to ``None`` (discovered from the modules' ``in_keys``).

    Returns:
        a :class:`~torchrl.envs.Compose` of fresh transforms. Pass it to
        ``TransformedEnv(env, transforms)`` or append its elements one by one
        with :meth:`~torchrl.envs.EnvBase.append_transform`.

    Raises:
        TypeError: if ``module`` is not a :class:`torch.nn.Module` or ``init_key``
            is not a nested key.

    .. note:: The primers are built with ``strict=True``: a submodule whose
        ``make_tensordict_primer()`` fails makes this function fail. Call
        :func:`~torchrl.modules.utils.get_primers_from_module` with
        ``strict=False`` to skip such modules.

    .. seealso:: The ``policy=`` keyword of every environment and the
        ``auto_register_policy_transforms`` argument of the collectors append
        the transforms that the environment still lacks
        (:ref:`Environment-policy-arg`).

    Examples:
        >>> import torch
        >>> from tensordict.nn import TensorDictModule as Mod, TensorDictSequential as Seq
        >>> from torchrl.envs import GymEnv, TransformedEnv
        >>> from torchrl.modules import LSTMModule, get_env_transforms_from_module
        >>> lstm = LSTMModule(input_size=4, hidden_size=8, in_key="observation", out_key="features")
        >>> policy = Seq(lstm, Mod(torch.nn.Linear(8, 2), in_keys=["features"], out_keys=["action"]))
        >>> transforms = get_env_transforms_from_module(policy)
        >>> [type(t).__name__ for t in transforms]
        ['InitTracker', 'TensorDictPrimer']
        >>> env = TransformedEnv(GymEnv("CartPole-v1"), transforms)
        >>> sorted(env.observation_spec.keys())
        ['is_init', 'observation', 'recurrent_state_c', 'recurrent_state_h']
    """
    from torchrl.envs.transforms import Compose, InitTracker
    from torchrl.modules.utils.utils import get_primers_from_module

    _check_module("module", module)
    init_key = _check_init_key(init_key)
    if init_key is not None:
        leaves = [_leaf(init_key)]
    else:
        leaves = _policy_init_keys(module) or [_DEFAULT_INIT_KEY]
    trackers = [InitTracker(init_key=leaf) for leaf in leaves]
    primers = _flatten_primers(get_primers_from_module(module, warn=False, strict=True))
    return Compose(*trackers, *primers)


def _env_spec_keys(env) -> list[tuple[str, ...]]:
    """The observation and state keys of ``env`` as tuples (pure read of the specs)."""
    keys = []
    for spec_name in ("full_observation_spec", "full_state_spec"):
        spec = getattr(env, spec_name, None)
        if spec is None:
            continue
        for key in spec.keys(True, True):
            key = unravel_key(key)
            keys.append((key,) if isinstance(key, str) else key)
    return keys


def _transform_keys(transform) -> list[tuple[str, ...]]:
    primers = getattr(transform, "primers", None)
    if primers is None:
        return []
    keys = []
    for key in primers.keys(True, True):
        key = unravel_key(key)
        keys.append((key,) if isinstance(key, str) else key)
    return keys


def _describe_transform(transform) -> str:
    from torchrl.envs.transforms import InitTracker

    if isinstance(transform, InitTracker):
        return f"InitTracker(init_key={transform.init_key!r})"
    keys = ", ".join(
        repr(key[0] if len(key) == 1 else key) for key in _transform_keys(transform)
    )
    return f"{type(transform).__name__}(keys=[{keys}])"


def _describe_transforms(transforms: Sequence) -> str:
    return ", ".join(_describe_transform(t) for t in transforms)


def _missing_keys(transforms: Sequence) -> list[NestedKey]:
    from torchrl.envs.transforms import InitTracker

    keys = []
    for transform in transforms:
        if isinstance(transform, InitTracker):
            keys.append(transform.init_key)
        else:
            keys.extend(
                key[0] if len(key) == 1 else key for key in _transform_keys(transform)
            )
    return keys


def _missing_env_transforms(env, module_or_transforms) -> list:
    """Returns the transforms of a policy that ``env`` still lacks (pure read).

    The environment is judged from its specs only (``full_observation_spec`` and
    ``full_state_spec``), so the answer is right for batched environments whose
    children hold the transforms and for transforms appended by hand:

    - an :class:`~torchrl.envs.InitTracker` is present when any observation or
      state key ends with its ``init_key`` (``("agents", "is_init")`` counts for
      ``"is_init"``);
    - a primer is present when all of its keys are in the specs.

    Args:
        env (EnvBase): the environment, left untouched.
        module_or_transforms (nn.Module or sequence of transforms): the policy
            (its needs are computed with ``_required_env_transforms``) or the
            transforms to look for.
    """
    from torchrl.envs.transforms import InitTracker

    if isinstance(module_or_transforms, nn.Module):
        transforms = _required_env_transforms(module_or_transforms)
    else:
        transforms = list(module_or_transforms)
    if not transforms:
        return []
    env_keys = set(_env_spec_keys(env))
    env_leaves = {key[-1] for key in env_keys}
    missing = []
    for transform in transforms:
        if isinstance(transform, InitTracker):
            if transform.init_key not in env_leaves:
                missing.append(transform)
        elif not all(key in env_keys for key in _transform_keys(transform)):
            missing.append(transform)
    return missing


def _append_missing_env_transforms(env, module_or_transforms):
    """Appends to ``env`` the transforms of a policy it still lacks; returns the env.

    Idempotent: what the specs already show is not appended again. Each
    transform is appended on its own with
    :meth:`~torchrl.envs.EnvBase.append_transform`, so its parent is the live
    environment. When nothing is missing, ``env`` is returned as is.
    """
    for transform in _missing_env_transforms(env, module_or_transforms):
        env = env.append_transform(transform)
    return env


def _future_warning_message(owner: str, missing: Sequence) -> str:
    return (
        f"The policy given to {owner} needs environment transforms that the "
        f"environment lacks: {_describe_transforms(missing)}. Without them the "
        "policy does not see where trajectories start and its recurrent state is "
        "not carried from step to step. The collector leaves the environment "
        "untouched because auto_register_policy_transforms=None (the default); "
        "the default will become True in v0.14 and the collector will then append "
        "these transforms itself. Pass auto_register_policy_transforms=True to "
        "append them now, or auto_register_policy_transforms=False to keep the "
        "environment as it is; either silences this warning. See the "
        "'Environment-policy-arg' section of the environment docs."
    )


def _missing_error_message(owner: str, missing: Sequence) -> str:
    keys = ", ".join(repr(k) for k in _missing_keys(missing))
    return (
        f"{owner} cannot run the policy: the environment lacks the keys [{keys}] "
        f"that the policy reads (they are written by {_describe_transforms(missing)}). "
        "Either pass auto_register_policy_transforms=True to the collector so that "
        "it appends the missing transforms, or append them to the environment "
        "yourself: env = TransformedEnv(env, "
        "torchrl.modules.get_env_transforms_from_module(policy)). See the "
        "'Environment-policy-arg' section of the environment docs."
    )


def _wire_policy_transforms(env, policy, auto_register, owner: str):
    """The collector side of ``auto_register_policy_transforms``.

    Returns ``(env, missing)``: with ``True`` the missing transforms are appended
    and ``missing`` is empty; with ``False`` nothing is computed; with ``None``
    the env is returned untouched and ``missing`` lists what would have been
    appended (the caller warns, or raises when the policy cannot run).
    """
    _check_bool("auto_register_policy_transforms", auto_register, allow_none=True)
    if auto_register is False or not isinstance(policy, nn.Module):
        return env, []
    if auto_register:
        return _append_missing_env_transforms(env, policy), []
    return env, _missing_env_transforms(env, policy)


def _check_policy_runs_or_raise(policy, carrier, policy_device, owner, missing) -> None:
    """Runs ``policy`` once on a copy of the collector's first env output.

    Called only when ``auto_register_policy_transforms`` is left to its default
    and the env lacks transforms of the policy: a ``KeyError`` on one of the
    missing keys becomes an error that names them and both fixes, instead of a
    bare ``KeyError: 'is_init'`` from deep inside the collector. Policies with
    parameters on the ``meta`` device (weights still to be received) are not run.
    """
    import torch

    if isinstance(policy, nn.Module) and any(
        p.device.type == "meta" for p in policy.parameters()
    ):
        return
    policy_input = carrier.copy()
    if policy_device:
        policy_input = policy_input.to(policy_device)
    try:
        with torch.no_grad():
            policy(policy_input)
    except KeyError as err:
        leaves = {_leaf(key) for key in _missing_keys(missing)}
        if any(leaf in str(err) for leaf in leaves):
            raise RuntimeError(_missing_error_message(owner, missing)) from err
        raise


# In a collector worker process, the policy-transforms warnings are collected
# here instead of being emitted, and sent to the main process which emits them
# once (see ``_start_worker_warning_sink`` and ``_pop_worker_warnings``).
_worker_warning_sink: list[str] | None = None


def _start_worker_warning_sink() -> list[str]:
    """Makes this (worker) process collect the policy-transforms warnings; returns the list."""
    global _worker_warning_sink
    _worker_warning_sink = []
    return _worker_warning_sink


def _pop_worker_warnings(msg, worker_warnings: list[str]):
    """Unpacks a worker's ``("instantiated", warnings)`` message into ``"instantiated"``."""
    if (
        isinstance(msg, tuple)
        and len(msg) == 2
        and isinstance(msg[0], str)
        and msg[0] == "instantiated"
    ):
        worker_warnings.extend(msg[1])
        return "instantiated"
    return msg


def _emit_policy_transforms_warning(message: str) -> None:
    if _worker_warning_sink is not None:
        if message not in _worker_warning_sink:
            _worker_warning_sink.append(message)
        return
    warnings.warn(message, PolicyTransformsFutureWarning, stacklevel=_user_stacklevel())


def _warn_missing_policy_transforms(owner: str, missing: Sequence) -> None:
    _emit_policy_transforms_warning(_future_warning_message(owner, missing))


def _warn_split_trajs(owner: str) -> None:
    """The advisory emitted when ``split_trajs=True`` is passed to a collector."""
    warnings.warn(
        f"split_trajs=True was passed to {owner}: each batch is split into "
        "trajectories and zero-padded to a (N_traj, T_max) tensordict with a "
        "('collector', 'mask') entry marking the real steps. This layout wastes "
        "memory on padding, cuts trajectories at frames_per_batch boundaries and "
        "does not fit replay buffers. Prefer the contiguous layout: pass "
        "replay_buffer= to the collector and sample sub-trajectories with "
        "torchrl.data.SliceSampler (see the 'data-layout' page of the docs). "
        "This warning will become a DeprecationWarning in a future release; pass "
        "split_trajs=False (or leave it out) to silence it.",
        UserWarning,
        stacklevel=_user_stacklevel(),
    )

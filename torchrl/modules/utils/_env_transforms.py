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
from torchrl._utils import rl_warnings

__all__ = [
    "get_env_transforms_from_module",
    "PolicyTransformsFutureWarning",
    "SplitTrajsWarning",
]

_DEFAULT_INIT_KEY = "is_init"

# Exceptions that a failing ``make_tensordict_primer()`` is expected to raise
# (e.g. ``ConsistentDropoutModule`` built without ``input_shape`` raises a
# RuntimeError). Anything else is a bug and propagates.
_PRIMER_ERRORS = (RuntimeError, ValueError, NotImplementedError)


class PolicyTransformsFutureWarning(FutureWarning):
    """Emitted by the collectors when ``auto_register_policy_transforms`` is left to ``None``.

    The policy needs environment transforms (an
    :class:`~torchrl.envs.InitTracker`, primers) that the environment lacks;
    the default becomes ``True`` in v0.14. Pass
    ``auto_register_policy_transforms=True`` or ``False`` to the collector to
    silence it, filter it with
    ``warnings.filterwarnings("ignore", category=PolicyTransformsFutureWarning)``,
    or set the ``RL_WARNINGS=0`` environment variable to silence all of
    TorchRL's advisory warnings. Multiprocessed collectors emit it once in the
    main process, however many workers found the same gap.
    """


class SplitTrajsWarning(UserWarning):
    """Emitted by the collectors when ``split_trajs=True`` is passed.

    The padded ``(N_traj, T_max)`` layout wastes memory and does not fit replay
    buffers; leave ``split_trajs`` out to silence it, filter it with
    ``warnings.filterwarnings("ignore", category=SplitTrajsWarning)``, or set
    the ``RL_WARNINGS=0`` environment variable.
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


def _is_inspectable_policy(name: str, policy) -> bool:
    """Whether ``policy`` is a module whose submodules can tell its env transforms.

    A plain callable is accepted but has nothing to inspect (``False``), as for
    the collectors' ``auto_register_policy_transforms``; anything else raises.
    """
    if isinstance(policy, nn.Module):
        return True
    if callable(policy):
        return False
    raise TypeError(
        f"{name} must be a torch.nn.Module (e.g. a tensordict.nn.TensorDictModule "
        f"or TensorDictSequential policy) or a callable, got {policy!r} of type "
        f"{type(policy).__name__}. Pass the policy module itself: its submodules "
        "tell which environment transforms it needs (a plain callable gets none)."
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


def _required_env_transforms(module: nn.Module) -> list:
    """What ``module`` needs from the env, and nothing else (used by the automatic paths).

    Unlike :func:`get_env_transforms_from_module`, a policy that reads no init key
    gets no :class:`~torchrl.envs.InitTracker`, and a policy with neither init key
    nor primer gets an empty list. Primers that cannot be built are reported
    with a ``UserWarning`` and skipped: this never raises for a working policy.
    """
    from torchrl.envs.transforms import InitTracker

    if not isinstance(module, nn.Module):
        return []
    trackers = [InitTracker(init_key=leaf) for leaf in _policy_init_keys(module)]
    # The primers as built, in no container: a transform taken out of a
    # Compose that is then dropped keeps a dead reference to it.
    return trackers + _collect_primers(module, warn=False, strict=False)


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
        fresh transforms, ready for ``TransformedEnv(env, transforms)`` or
        :meth:`~torchrl.envs.EnvBase.append_transform`: the
        :class:`~torchrl.envs.InitTracker` itself when that is all the policy
        needs (e.g. a feed-forward policy), a :class:`~torchrl.envs.Compose`
        of them otherwise.

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
        >>> feed_forward = Mod(torch.nn.Linear(4, 2), in_keys=["observation"], out_keys=["action"])
        >>> get_env_transforms_from_module(feed_forward)
        InitTracker(keys=[])
    """
    from torchrl.envs.transforms import Compose, InitTracker

    _check_module("module", module)
    init_key = _check_init_key(init_key)
    if init_key is not None:
        leaves = [_leaf(init_key)]
    else:
        leaves = _policy_init_keys(module) or [_DEFAULT_INIT_KEY]
    transforms = [InitTracker(init_key=leaf) for leaf in leaves]
    transforms += _collect_primers(module, warn=False, strict=True)
    if len(transforms) == 1:
        return transforms[0]
    return Compose(*transforms)


def _env_specs(env) -> dict:
    """The observation and state leaf specs of ``env``, by tuple key (pure read of the specs)."""
    specs = {}
    for spec_name in ("full_observation_spec", "full_state_spec"):
        spec = getattr(env, spec_name, None)
        if spec is None:
            continue
        for key, leaf in spec.items(True, True):
            key = unravel_key(key)
            specs.setdefault((key,) if isinstance(key, str) else key, leaf)
    return specs


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
    - a primer is present when all of its keys are in the specs. A key that
      is there with another shape than the primer's (e.g. a hidden size of 16
      in the env against the policy's 8) raises a ``ValueError``.

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
    env_specs = _env_specs(env)
    env_leaves = {key[-1] for key in env_specs}
    missing = []
    for transform in transforms:
        if isinstance(transform, InitTracker):
            if transform.init_key not in env_leaves:
                missing.append(transform)
            continue
        _check_primer_shapes(env, env_specs, transform)
        if not all(key in env_specs for key in _transform_keys(transform)):
            missing.append(transform)
    return missing


def _check_primer_shapes(env, env_specs: dict, primer) -> None:
    """Raises if a key of ``primer`` is in the env's specs with another shape.

    The env's spec carries the env's batch dims in front (and a nested entry
    the dims of its group), so the primer's shape is compared with the
    trailing dims of the env's one.
    """
    batch_size = tuple(env.batch_size)
    for key in _transform_keys(primer):
        env_spec = env_specs.get(key)
        if env_spec is None:
            continue
        expected = tuple(primer.primers[key].shape)
        found = tuple(env_spec.shape)
        if not expected or found[-len(expected) :] == expected:
            continue
        if found[: len(batch_size)] == batch_size:
            found = found[len(batch_size) :]
        name = key[0] if len(key) == 1 else key
        raise ValueError(
            f"The environment already has an entry {name!r} of shape {found}, but "
            f"the policy's primer for it has shape {expected}: the policy's "
            "recurrent module would fail at its first step. Make them agree: "
            "build the environment's primer from the policy, e.g. "
            "TransformedEnv(base_env, "
            "torchrl.modules.get_env_transforms_from_module(policy)), or build the "
            "policy with the environment's sizes."
        )


def _append_missing_env_transforms(env, module_or_transforms):
    """Appends to ``env`` the transforms of a policy it still lacks; returns the env.

    Used by the ``policy=`` keyword, on the env being built. Idempotent: what
    the specs already show is not appended again. Each transform is appended
    on its own with :meth:`~torchrl.envs.EnvBase.append_transform`, so its
    parent is the live environment. When nothing is missing, ``env`` is
    returned as is.
    """
    for transform in _missing_env_transforms(env, module_or_transforms):
        env = env.append_transform(transform)
    return env


def _wrap_missing_env_transforms(env, module_or_transforms):
    """Returns a new env that adds to ``env`` the transforms of a policy it still lacks.

    Used by the collectors, which must not change the env they were given:
    ``env`` (its transforms and specs) is left as it is and wrapped in a new
    :class:`~torchrl.envs.TransformedEnv` carrying the missing transforms.
    When nothing is missing, ``env`` is returned as is.
    """
    from torchrl.envs.transforms import Compose, TransformedEnv

    missing = _missing_env_transforms(env, module_or_transforms)
    if not missing:
        return env
    transform = missing[0] if len(missing) == 1 else Compose(*missing)
    # auto_unwrap=False: a TransformedEnv passed in is wrapped, not unwrapped
    # (unwrapping would share its base env with a copy of its transforms).
    return TransformedEnv(env, transform, auto_unwrap=False)


def _future_warning_message(owner: str, missing: Sequence) -> str:
    return (
        f"{_worker_owner or owner}: the environment lacks {_describe_transforms(missing)}, which "
        "the policy needs to see where trajectories start and to carry its "
        "recurrent state. They are not added because "
        "auto_register_policy_transforms=None; the default will become True in "
        "v0.14. Pass auto_register_policy_transforms=True to add them, or "
        "auto_register_policy_transforms=False to keep the environment as it is."
    )


def _missing_error_message(owner: str, missing: Sequence) -> str:
    keys = ", ".join(repr(k) for k in _missing_keys(missing))
    return (
        f"{_owner_name(owner)} cannot run the policy: the environment lacks the keys [{keys}] "
        f"that the policy reads (they are written by {_describe_transforms(missing)}). "
        "Either pass auto_register_policy_transforms=True to the collector so that "
        "it appends the missing transforms, or append them to the environment "
        "yourself: env = TransformedEnv(env, "
        "torchrl.modules.get_env_transforms_from_module(policy)). See the "
        "'Environment-policy-arg' section of the environment docs."
    )


def _wire_policy_transforms(env, policy, auto_register, owner: str):
    """The collector side of ``auto_register_policy_transforms``.

    Returns ``(env, missing)``: with ``True`` the returned env is a new one
    carrying the missing transforms (``env`` itself is left unchanged) and
    ``missing`` is empty; with ``False`` nothing is computed; with ``None`` the
    env is returned untouched, the ``FutureWarning`` is emitted at once when
    something is missing, and ``missing`` lists it (the caller then raises when
    the policy cannot run).
    """
    _check_bool("auto_register_policy_transforms", auto_register, allow_none=True)
    if auto_register is False or not isinstance(policy, nn.Module):
        return env, []
    if auto_register:
        return _wrap_missing_env_transforms(env, policy), []
    missing = _missing_env_transforms(env, policy)
    if missing:
        _warn_missing_policy_transforms(owner, missing)
    return env, missing


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
# The collector the user built, as the worker's messages name it: its warnings,
# emitted once by the main process, name the collector ("MultiSyncCollector"),
# its errors name the worker too ("MultiSyncCollector worker 0"). The worker's
# own inner collector is an implementation detail.
_worker_owner: str | None = None
_worker_idx: int | None = None


def _start_worker_warning_sink(
    owner: str | None = None, worker_idx: int | None = None
) -> list[str]:
    """Makes this (worker) process collect the policy-transforms warnings; returns the list.

    Args:
        owner (str, optional): the class name of the collector the user built,
            e.g. ``"MultiSyncCollector"``, which the warnings and errors of this
            worker name. Defaults to the class name of the worker's own collector.
        worker_idx (int, optional): the index of this worker, which its errors name
            (``"MultiSyncCollector worker 0 cannot run the policy"``); the warnings,
            emitted once for all the workers, do not.
    """
    global _worker_warning_sink, _worker_owner, _worker_idx
    _worker_warning_sink = []
    _worker_owner = owner
    _worker_idx = worker_idx
    return _worker_warning_sink


def _owner_name(owner: str) -> str:
    """How an error raised in this process names its collector."""
    if _worker_owner is None:
        return owner
    if _worker_idx is None:
        return _worker_owner
    return f"{_worker_owner} worker {_worker_idx}"


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


def _worker_warnings() -> list[str]:
    """The policy-transforms warnings collected so far in this (worker) process."""
    return list(_worker_warning_sink or ())


def _emit_policy_transforms_warning(message: str) -> None:
    if _worker_warning_sink is not None:
        if message not in _worker_warning_sink:
            _worker_warning_sink.append(message)
        return
    if rl_warnings():
        warnings.warn(
            message, PolicyTransformsFutureWarning, stacklevel=_user_stacklevel()
        )


def _emit_worker_warnings(worker_warnings: Sequence[str]) -> None:
    """Emits once, in the main process, each warning that the workers reported."""
    for message in dict.fromkeys(worker_warnings):
        _emit_policy_transforms_warning(message)


def _warn_missing_policy_transforms(owner: str, missing: Sequence) -> None:
    _emit_policy_transforms_warning(_future_warning_message(owner, missing))


def _warn_truncated_trajectories(
    owner: str, trajs_per_batch, set_truncated: bool, replay_buffer
) -> None:
    """Warns that ``set_truncated=True`` cuts the whole trajectories of ``trajs_per_batch``."""
    if trajs_per_batch is None or not set_truncated or replay_buffer is None:
        return
    warnings.warn(
        f"{owner}(replay_buffer=..., trajs_per_batch={trajs_per_batch}, "
        "set_truncated=True): set_truncated marks the last step of every batch "
        "as truncated, so each batch end counts as a trajectory end and episode "
        "pieces that start without is_init are written to the buffer, instead of "
        "whole episodes only. With trajs_per_batch nothing needs the batch-end "
        "marker (no trajectory is written before its end): pass "
        "set_truncated=False.",
        UserWarning,
        stacklevel=3,
    )


def _warn_split_trajs(owner: str) -> None:
    """The advisory emitted when ``split_trajs=True`` is passed to a collector."""
    if not rl_warnings():
        return
    warnings.warn(
        f"{owner}(split_trajs=True) pads every batch to (N_traj, T_max) with a "
        "('collector', 'mask') entry: the padding wastes memory and does not fit "
        "replay buffers. Prefer replay_buffer= and torchrl.data.SliceSampler "
        "(see the data-layout docs page). This may become a DeprecationWarning; "
        "leave split_trajs out to silence it.",
        SplitTrajsWarning,
        stacklevel=_user_stacklevel(),
    )

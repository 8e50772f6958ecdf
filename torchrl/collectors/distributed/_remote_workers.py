# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""What the distributed collectors add to their remote collectors.

The remote collectors of every distributed collector number their
trajectories ``worker_idx + k * num_workers`` (:func:`_traj_ids_worker_class`;
on RPC nodes :func:`_build_with_traj_ids_layout`).
Each remote collector of :class:`~torchrl.collectors.distributed.RayCollector`
is an actor of a subclass of the collector class (see
:func:`_ray_worker_class`) that

- draws its trajectory ids from a pool of its own, ``worker_idx + k *
  num_workers``, so that ids never collide across workers and a trajectory
  keeps its id from one batch to the next;
- collects the policy-transforms ``FutureWarning`` of its constructor instead
  of printing it to the actor's stderr, and keeps the error its constructor
  raised instead of dying: the driver asks each actor for both once
  (:func:`_wait_for_ray_workers`), warns once and raises the worker's own
  exception (type and message), with the remote traceback as its cause.

The actor of a :class:`~torchrl.data.RayReplayBuffer` is built the same way
(:func:`_ray_buffer_class`, error part only): a buffer whose constructor fails
raises the constructor's exception on the driver.

The resource check (:func:`_check_ray_resources`) turns an actor request that
the cluster cannot place, which Ray would wait on forever, into an error.
"""
from __future__ import annotations

import functools
import pickle
import time
import traceback
import types
import warnings
from collections.abc import Sequence
from typing import Any

import cloudpickle

from torchrl._utils import logger as torchrl_logger
from torchrl.collectors._multi_base import MultiCollector
from torchrl.collectors.utils import _TrajectoryPool
from torchrl.modules.utils._env_transforms import (
    _emit_worker_warnings,
    _start_worker_warning_sink,
)

# Ray's default for an actor that does not say: one CPU to be placed.
_RAY_DEFAULT_ACTOR_CPUS = 1.0
# Seconds to wait for the remote collectors before saying what they wait for.
_READY_WARN_AFTER = 60.0
# Seconds to wait for resources that actors killed just before still hold.
_RELEASE_GRACE = 5.0


class _RemoteTraceback(Exception):
    """The traceback of an exception raised in a Ray actor, as its ``__cause__``."""

    def __init__(self, tb: str):
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


def _pack_error(err: BaseException) -> dict[str, Any]:
    """What the driver needs to raise ``err`` again: the exception and its traceback."""
    info = {
        "type": f"{type(err).__module__}.{type(err).__qualname__}",
        "message": str(err),
        "traceback": "".join(
            traceback.format_exception(type(err), err, err.__traceback__)
        ),
        "exception": None,
    }
    try:
        info["exception"] = cloudpickle.dumps(err)
    except (pickle.PicklingError, TypeError, AttributeError) as pickling_error:
        torchrl_logger.debug(f"Cannot pickle {info['type']}: {pickling_error}")
    return info


def _unpack_error(info: dict[str, Any]) -> BaseException:
    """The worker's exception (or a ``RuntimeError`` naming its type when it does not unpickle)."""
    if info["exception"] is not None:
        try:
            return pickle.loads(info["exception"])
        except (pickle.UnpicklingError, ImportError, AttributeError, TypeError):
            pass
    return RuntimeError(f"{info['type']}: {info['message']}")


class _TrajIdsLayoutMixin:
    """Put in front of the collector class of a remote worker: ``traj_ids_layout=(i, n)``.

    The collector (or the workers of a :class:`~torchrl.collectors.MultiCollector`)
    then numbers its trajectories ``i, i + n, i + 2n, ...``.
    """

    def __init__(
        self,
        *args,
        traj_ids_layout: tuple[int, int] | None = None,
        **kwargs,
    ):
        if traj_ids_layout is not None:
            kwargs = _apply_traj_ids_layout(self, traj_ids_layout, kwargs)
        super().__init__(*args, **kwargs)


def _apply_traj_ids_layout(
    collector, traj_ids_layout: tuple[int, int], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """Makes ``collector``, before its ``__init__``, number its trajectories ``i + k * n``.

    Returns the keyword arguments to build it with.
    """
    offset, stride = traj_ids_layout
    if isinstance(collector, MultiCollector):
        # read by MultiCollector when it makes the pool its workers share
        collector._traj_pool_layout = {"offset": offset, "stride": stride}
        return kwargs
    return {"traj_pool": _TrajectoryPool(offset=offset, stride=stride), **kwargs}


def _build_with_traj_ids_layout(
    collector_class: type, traj_ids_layout: tuple[int, int], *args, **kwargs
):
    """``collector_class(*args, **kwargs)``, numbering its trajectories ``i + k * n``.

    What an RPC node builds. The collector is an instance of ``collector_class``
    itself, not of :func:`_traj_ids_worker_class`: RPC pickles classes by
    reference (by module and name), and the proxy of the collector's ``RRef``
    asks the node for the type of the collector before each call, which a
    class made at run time cannot be found by.
    """
    collector = collector_class.__new__(collector_class)
    kwargs = _apply_traj_ids_layout(collector, traj_ids_layout, kwargs)
    collector.__init__(*args, **kwargs)
    return collector


@functools.lru_cache(maxsize=None)
def _traj_ids_worker_class(collector_class: type) -> type:
    """``collector_class`` with :class:`_TrajIdsLayoutMixin` in front, named like it."""
    if issubclass(collector_class, _TrajIdsLayoutMixin):
        return collector_class
    return _subclass(_TrajIdsLayoutMixin, collector_class)


def _subclass(mixin: type, collector_class: type) -> type:
    cls = types.new_class(collector_class.__name__, (mixin, collector_class), {})
    cls.__qualname__ = collector_class.__qualname__
    cls.__doc__ = collector_class.__doc__
    return cls


class _RayConstructionMixin:
    """Put in front of the class of a Ray actor: keeps its constructor's error.

    The actor stays alive when the constructor raises; the driver asks for the
    error (:func:`_wait_for_ray_workers`) and raises it.
    """

    def __init__(self, *args, **kwargs):
        self._ray_worker_error = None
        try:
            super().__init__(*args, **kwargs)
        except Exception as err:
            # Not swallowed: the driver gets it from _ray_worker_report and
            # raises it. Raising here would kill the actor with a Ray error
            # whose text buries the message.
            self._ray_worker_error = _pack_error(err)

    def _ray_worker_report(self) -> tuple[list[str], dict[str, Any] | None]:
        """The warnings of the constructor and its error (``None`` when it succeeded)."""
        return list(getattr(self, "_ray_worker_warnings", ())), self._ray_worker_error


class _RayWorkerMixin(_RayConstructionMixin, _TrajIdsLayoutMixin):
    """Put in front of the collector class of each :class:`RayCollector` actor."""

    def __init__(self, *args, **kwargs):
        self._ray_worker_warnings = _start_worker_warning_sink(
            "RayCollector", kwargs.get("worker_idx")
        )
        super().__init__(*args, **kwargs)

    def __repr__(self) -> str:
        # Ray prefixes the actor's log lines with its repr: keep it short
        return f"{type(self).__name__}(worker_idx={getattr(self, 'worker_idx', None)})"


@functools.lru_cache(maxsize=None)
def _ray_worker_class(collector_class: type) -> type:
    """``collector_class`` with :class:`_RayWorkerMixin` in front, named like it."""
    if issubclass(collector_class, _RayWorkerMixin):
        return collector_class
    return _subclass(_RayWorkerMixin, collector_class)


@functools.lru_cache(maxsize=None)
def _ray_buffer_class(buffer_class: type) -> type:
    """``buffer_class`` (the actor of a ``RayReplayBuffer``) with :class:`_RayConstructionMixin` in front."""
    if issubclass(buffer_class, _RayConstructionMixin):
        return buffer_class
    return _subclass(_RayConstructionMixin, buffer_class)


def _wait_for_ray_workers(
    owner: str,
    actors: Sequence,
    what: str = "remote collectors",
    argument: str = "remote_configs",
) -> None:
    """Waits until every actor is built; warns once; raises the first worker error.

    On an error, every actor is killed before the worker's exception is raised.
    ``what`` names the actors, and ``argument`` their resources, in the message
    of a wait that lasts.
    """
    import ray

    refs = [actor._ray_worker_report.remote() for actor in actors]
    ready, pending = ray.wait(refs, num_returns=len(refs), timeout=_READY_WARN_AFTER)
    if pending:
        warnings.warn(
            f"{owner}: {len(pending)} of {len(refs)} {what} are not built "
            f"after {_READY_WARN_AFTER:.0f} s. Ray places an actor only where the "
            f"resources of its {argument} are free; the cluster has "
            f"{_format_resources(ray.available_resources())} free of "
            f"{_format_resources(ray.cluster_resources())}. Still waiting.",
            UserWarning,
            stacklevel=3,
        )
    reports = ray.get(refs)
    _emit_worker_warnings(
        [w for worker_warnings, _ in reports for w in worker_warnings]
    )
    errors = [error for _, error in reports if error is not None]
    if errors:
        for actor in actors:
            ray.kill(actor)
        raise _unpack_error(errors[0]) from _RemoteTraceback(errors[0]["traceback"])


def _format_resources(resources: dict[str, float]) -> str:
    parts = [f"{resources.get('CPU', 0):g} CPU"]
    if resources.get("GPU"):
        parts.append(f"{resources['GPU']:g} GPU")
    if "memory" in resources:
        parts.append(f"{resources['memory'] / 1024**3:.1f} GiB memory")
    return ", ".join(parts)


def _requested_resources(remote_configs: Sequence[dict[str, Any]]) -> dict[str, float]:
    need = {"CPU": 0.0, "GPU": 0.0, "memory": 0.0}
    for config in remote_configs:
        config = config or {}
        num_cpus = config.get("num_cpus")
        need["CPU"] += _RAY_DEFAULT_ACTOR_CPUS if num_cpus is None else num_cpus
        need["GPU"] += config.get("num_gpus") or 0
        need["memory"] += config.get("memory") or 0
    return need


def _check_ray_resources(
    owner: str, remote_configs: Sequence[dict[str, Any]], argument: str
) -> None:
    """Raises when the cluster has not the resources the new actors ask for now.

    Ray would leave such actors pending, and the first call to them would wait
    forever with no message (e.g. two collectors of one CPU each and a
    :class:`~torchrl.data.RayReplayBuffer` of one CPU on a 2-CPU machine).
    """
    import ray

    need = _requested_resources(remote_configs)

    def shortfall():
        available = ray.available_resources()
        short = [
            key
            for key, amount in need.items()
            if amount > 0 and amount > available.get(key, 0.0) + 1e-6
        ]
        return short, available

    # actors killed just before (e.g. by a shutdown()) free theirs in a moment
    deadline = time.monotonic() + _RELEASE_GRACE
    short, available = shortfall()
    while short and time.monotonic() < deadline:
        time.sleep(0.2)
        short, available = shortfall()
    if not short:
        return
    total = ray.cluster_resources()
    n = len(remote_configs)
    held = {key: total.get(key, 0.0) - available.get(key, 0.0) for key in need}
    what = "actor asks" if n == 1 else f"{n} actors ask"
    raise RuntimeError(
        f"{owner}: the {what} for {_format_resources(need)} ({argument}) but the Ray "
        f"cluster has {_format_resources(available)} free of "
        f"{_format_resources(total)} ({_format_resources(held)} held by actors "
        "already placed, e.g. a RayReplayBuffer or other collectors): Ray would "
        f"wait for the {', '.join(short)} forever. Ask for less, e.g. "
        f"{argument}={{'num_cpus': {max(available.get('CPU', 0.0), 0.0) / n:g}, "
        "'memory': None}, or give the cluster more, e.g. ray.init(num_cpus=...)."
    )

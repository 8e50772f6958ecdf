# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Envs and helpers of the Ray tests.

They live at module level so that Ray actors (which import this module by
name: the test folder is on their ``PYTHONPATH``) can unpickle them.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from tensordict import TensorDictBase
from torchrl.data import Unbounded
from torchrl.envs import GymEnv, InitTracker, Transform

TEST_DIR = str(Path(__file__).resolve().parent)


class WorkerId(Transform):
    """Writes a constant ``"worker_id"`` entry at every step: the row's worker."""

    def __init__(self, worker_id: int):
        super().__init__(in_keys=[], out_keys=["worker_id"])
        self.worker_id = worker_id

    def _call(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        next_tensordict.set(
            "worker_id",
            torch.full(next_tensordict.batch_size, self.worker_id, dtype=torch.int64),
        )
        return next_tensordict

    def _reset(self, tensordict, tensordict_reset):
        return self._call(tensordict_reset)

    def transform_observation_spec(self, observation_spec):
        observation_spec["worker_id"] = Unbounded(
            shape=observation_spec.shape, dtype=torch.int64
        )
        return observation_spec


class FailAfter(Transform):
    """Raises a ``ValueError`` at the ``steps``-th step of the env."""

    def __init__(self, steps: int):
        super().__init__()
        self.steps = steps
        self.count = 0

    def _step(self, tensordict, next_tensordict):
        self.count += 1
        if self.count >= self.steps:
            raise ValueError(f"FailAfter: step {self.count} of this env fails")
        return next_tensordict


def make_worker_cartpole(worker_id: int):
    """A bare CartPole whose rows carry ``"worker_id"``."""
    return GymEnv("CartPole-v1").append_transform(WorkerId(worker_id))


def make_tracked_worker_cartpole(worker_id: int):
    """CartPole with an :class:`~torchrl.envs.InitTracker` and ``"worker_id"``."""
    return make_worker_cartpole(worker_id).append_transform(InitTracker())


def make_failing_cartpole(steps: int):
    return (
        GymEnv("CartPole-v1")
        .append_transform(InitTracker())
        .append_transform(FailAfter(steps))
    )


def ray_init_kwargs(**kwargs) -> dict:
    """A small local cluster whose workers import the test helpers, one thread each."""
    pythonpath = os.pathsep.join(
        p for p in (TEST_DIR, os.environ.get("PYTHONPATH")) if p
    )
    return {
        "num_cpus": 2,
        "include_dashboard": False,
        "log_to_driver": False,
        "runtime_env": {"env_vars": {"PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"}},
        **kwargs,
    }


def ray_processes(temp_dir: str) -> list[int]:
    """Pids of the processes whose command line names ``temp_dir`` (Ray's session)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if temp_dir.encode() in cmdline:
            pids.append(int(entry.name))
    return pids


def wait_until(predicate, timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def check_traj_ids(
    batches, num_workers: int | None = None, max_batches: int = 40
) -> dict[int, int]:
    """Checks the trajectory ids of a distributed collector's batches; returns id -> worker.

    Every id belongs to one worker (rows carry ``"worker_id"``), and the
    trajectory running at the end of a worker's batch keeps its id at the start
    of that worker's next batch unless it ended there.

    With ``num_workers``, batches are read until each of the workers has
    delivered rows in two of them (an asynchronous collector yields whichever
    worker is ready first, so a fixed number of batches may hold one worker
    only), and at most ``max_batches``.
    """
    owner: dict[int, int] = {}
    last: dict[int, tuple[int, bool]] = {}
    seen: dict[int, int] = {}
    for i, data in enumerate(batches):
        if num_workers is not None:
            assert i < max_batches, f"batches per worker after {i}: {seen}"
        flat = data.reshape(-1)
        for w in flat["worker_id"].unique().tolist():
            rows = flat[flat["worker_id"] == w]  # in time order
            traj = rows["collector", "traj_ids"]
            for t in traj.unique().tolist():
                assert owner.setdefault(t, w) == w, f"id {t} used by two workers"
            if w in last:
                prev_traj, prev_done = last[w]
                assert (
                    int(traj[0]) == prev_traj
                ) != prev_done, "a trajectory changed its id from one batch to the next"
            last[w] = (int(traj[-1]), bool(rows["next", "done"][-1]))
            seen[w] = seen.get(w, 0) + 1
        if num_workers is not None and len(seen) == num_workers:
            if min(seen.values()) >= 2:
                break
    return owner

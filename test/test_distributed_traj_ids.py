# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Trajectory ids of the torch.distributed collectors: unique across nodes, stable across batches.

The nodes are processes on this machine (``launcher="mp"``, gloo over
loopback); each row carries the index of the node that wrote it.
"""
from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys

import pytest
from _ray_helpers import check_traj_ids, make_tracked_worker_cartpole, TEST_DIR
from torchrl.collectors import Collector
from torchrl.collectors.distributed import (
    DistributedCollector,
    DistributedSyncCollector,
)
from torchrl.modules import RandomPolicy

FRAMES_PER_BATCH = 40


def _free_port() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("localhost", 0))
        return str(s.getsockname()[1])


@pytest.mark.parametrize(
    "cls,kwargs",
    [
        (DistributedCollector, {"sync": True}),
        (DistributedCollector, {"sync": False}),
        (DistributedSyncCollector, {}),
    ],
    ids=["distributed-sync", "distributed-async", "distributed-sync-collector"],
)
def test_traj_ids_unique_and_stable(cls, kwargs):
    envs = [functools.partial(make_tracked_worker_cartpole, i) for i in range(2)]
    policy = RandomPolicy(envs[0]().action_spec)
    collector = cls(
        envs,
        policy,
        collector_class=Collector,
        frames_per_batch=FRAMES_PER_BATCH,
        # an upper bound: check_traj_ids stops once both nodes delivered twice
        total_frames=40 * FRAMES_PER_BATCH,
        launcher="mp",
        tcp_port=_free_port(),
        **kwargs,
    )
    try:
        owner = check_traj_ids(collector, num_workers=2)
    finally:
        collector.shutdown()
    assert set(owner.values()) == {0, 1}


RPC_SCRIPT = """
import functools, sys
sys.path.insert(0, {test_dir!r})
from _ray_helpers import check_traj_ids, make_tracked_worker_cartpole
from torchrl.collectors import {collector_class}
from torchrl.collectors.distributed import RPCCollector
from torchrl.modules import RandomPolicy

if __name__ == "__main__":
    envs = [functools.partial(make_tracked_worker_cartpole, i) for i in range(2)]
    collector = RPCCollector(
        envs,
        RandomPolicy(envs[0]().action_spec),
        collector_class={collector_class},
        frames_per_batch={frames_per_batch},
        total_frames={total_frames},
        launcher="mp",
        tcp_port={tcp_port!r},
        sync=True,
    )
    try:
        owner = check_traj_ids(collector)
    finally:
        collector.shutdown()
    assert set(owner.values()) == {{0, 1}}, owner
    print("ids ok")
"""


@pytest.mark.parametrize("collector_class", ["Collector", "MultiSyncCollector"])
def test_rpc_traj_ids_unique_and_stable(collector_class, tmp_path):
    # A second RPC session in one process waits forever in init_rpc: each
    # case runs in a fresh interpreter.
    script = tmp_path / "rpc_traj_ids.py"
    script.write_text(
        RPC_SCRIPT.format(
            test_dir=TEST_DIR,
            collector_class=collector_class,
            frames_per_batch=FRAMES_PER_BATCH,
            total_frames=6 * FRAMES_PER_BATCH,
            tcp_port=_free_port(),
        )
    )
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=240,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ids ok" in out.stdout

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
import socket

import pytest
from _ray_helpers import check_traj_ids, make_tracked_worker_cartpole
from torchrl.collectors import Collector
from torchrl.collectors.distributed import (
    DistributedCollector,
    DistributedSyncCollector,
    RPCCollector,
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
        (RPCCollector, {"sync": True}),
    ],
    ids=["distributed-sync", "distributed-async", "distributed-sync-collector", "rpc"],
)
def test_traj_ids_unique_and_stable(cls, kwargs):
    envs = [functools.partial(make_tracked_worker_cartpole, i) for i in range(2)]
    policy = RandomPolicy(envs[0]().action_spec)
    collector = cls(
        envs,
        policy,
        collector_class=Collector,
        frames_per_batch=FRAMES_PER_BATCH,
        total_frames=6 * FRAMES_PER_BATCH,
        launcher="mp",
        tcp_port=_free_port(),
        **kwargs,
    )
    try:
        owner = check_traj_ids(collector)
    finally:
        collector.shutdown()
    assert set(owner.values()) == {0, 1}

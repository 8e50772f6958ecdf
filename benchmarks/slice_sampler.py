# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Cost of ``rb.sample()`` with a :class:`~torchrl.data.SliceSampler`, relative to one gather.

The buffer holds 20,000 rows with ``pixels`` and ``("next", "pixels")``
(3x64x64 uint8), trajectories of 50 steps and an ``"is_init"`` entry, in a
:class:`~torchrl.data.LazyTensorStorage`. Each mode samples 256 slices of 32
steps and prints the median ``rb.sample()`` time divided by the median time of
one plain gather of the same number of rows (``storage[idx]``, with ``idx`` the
index of one sample, so that both read memory with the same locality): 1.0
means the sampler costs nothing beyond the gather the buffer must do anyway.

Run with ``python benchmarks/slice_sampler.py`` (``make bench`` runs it).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import main, median_time  # noqa: E402

NUM_ROWS = 20_000
TRAJ_LEN = 50
NUM_SLICES = 256
SLICE_LEN = 32


def _make_buffer(truncated_key):
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, SliceSampler, TensorDictReplayBuffer

    step = torch.arange(NUM_ROWS) % TRAJ_LEN
    done = (step == TRAJ_LEN - 1).unsqueeze(-1)
    data = TensorDict(
        {
            "pixels": torch.randint(255, (NUM_ROWS, 3, 64, 64), dtype=torch.uint8),
            "is_init": (step == 0).unsqueeze(-1),
            "action": torch.randn(NUM_ROWS, 2),
            ("collector", "traj_ids"): torch.arange(NUM_ROWS) // TRAJ_LEN,
            ("next", "pixels"): torch.randint(
                255, (NUM_ROWS, 3, 64, 64), dtype=torch.uint8
            ),
            ("next", "reward"): torch.randn(NUM_ROWS, 1),
            ("next", "done"): done,
            ("next", "terminated"): done.clone(),
            ("next", "truncated"): torch.zeros_like(done),
        },
        [NUM_ROWS],
    )
    storage = LazyTensorStorage(NUM_ROWS)
    rb = TensorDictReplayBuffer(
        storage=storage,
        sampler=SliceSampler(
            slice_len=SLICE_LEN,
            traj_key=("collector", "traj_ids"),
            truncated_key=truncated_key,
        ),
        batch_size=NUM_SLICES * SLICE_LEN,
    )
    rb.extend(data)
    return rb, storage


def _interleaved_medians(fns, repeat: int, warmup: int = 3) -> list[float]:
    """Median wall time of each function, timed in turn so drift hits all alike."""
    for fn in fns:
        median_time(fn, repeat=1, warmup=warmup)
    times = [[] for _ in fns]
    for _ in range(repeat):
        for fn, acc in zip(fns, times):
            acc.append(median_time(fn, repeat=1, warmup=0))
    return [statistics.median(acc) for acc in times]


def measure(args: argparse.Namespace) -> dict:
    import torch

    torch.manual_seed(0)
    out = {}
    modes = {
        "truncated_key default": ("next", "truncated"),
        "truncated_key=None": None,
    }
    for name, truncated_key in modes.items():
        rb, storage = _make_buffer(truncated_key)
        # the rows of one sample: same count and same memory locality
        idx = rb.sample(return_info=True)[1]["index"]
        gather, sample = _interleaved_medians(
            [lambda storage=storage, idx=idx: storage[idx], rb.sample], args.repeat
        )
        out[name] = {"ratio": sample / gather}
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=25)
    main(
        __file__,
        "rb.sample() / one gather of the sampled rows (lower is better; 1.0 is the floor)",
        measure,
        ["ratio"],
        parser,
    )

# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Cost of ``rb.sample()`` with burn-in, relative to a plain sample of as many rows.

The buffer holds 100,000 rows of 50-step trajectories (an observation, an
action, a reward, ``"is_init"`` and the done flags) in a
:class:`~torchrl.data.LazyTensorStorage`. The burn-in sample is 64 slices of
16 training steps, each preceded by up to 8 burn-in steps
(``SliceSampler(slice_len=16, burn_in=8, strict_length=False,
pad_output=True)``: 1,536 rows, some slices with fewer burn-in steps near
their trajectory's start); the plain one is 64 slices of 24 steps
(``SliceSampler(slice_len=24)``: the same 1,536 rows). The ratio is the
median burn-in ``rb.sample()`` time divided by the median plain one, the
samples timed in turn in the same process, and the median over ``--rounds``
rounds is printed: 1.0 means burn-in costs nothing beyond the rows it adds.
The second row compares with a plain sample that is padded as well
(``strict_length=False, pad_output=True``: a ``("collector", "mask")``
column, no burn-in rows), to tell the cost of the burn-in from that of the
padding. Pristine 0.12.0 has no burn-in (``n/a``).

Run with ``python benchmarks/slice_sampler_burn_in.py`` (``make bench`` runs it).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import main, median_time  # noqa: E402

NUM_ROWS = 100_000
TRAJ_LEN = 50
NUM_SLICES = 64
SLICE_LEN = 16
BURN_IN = 8


def _data():
    import torch
    from tensordict import TensorDict

    step = torch.arange(NUM_ROWS) % TRAJ_LEN
    done = (step == TRAJ_LEN - 1).unsqueeze(-1)
    return TensorDict(
        {
            "observation": torch.randn(NUM_ROWS, 8),
            "action": torch.randn(NUM_ROWS, 2),
            "is_init": (step == 0).unsqueeze(-1),
            ("collector", "traj_ids"): torch.arange(NUM_ROWS) // TRAJ_LEN,
            ("next", "observation"): torch.randn(NUM_ROWS, 8),
            ("next", "reward"): torch.randn(NUM_ROWS, 1),
            ("next", "done"): done,
            ("next", "terminated"): done.clone(),
            ("next", "truncated"): torch.zeros_like(done),
        },
        [NUM_ROWS],
    )


def _buffer(data, **kwargs):
    from torchrl.data import LazyTensorStorage, SliceSampler, TensorDictReplayBuffer

    rows = NUM_SLICES * (SLICE_LEN + BURN_IN)
    slice_len = rows // NUM_SLICES - kwargs.get("burn_in", 0)
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(NUM_ROWS),
        sampler=SliceSampler(
            slice_len=slice_len, traj_key=("collector", "traj_ids"), **kwargs
        ),
        batch_size=NUM_SLICES * slice_len,
    )
    rb.extend(data)
    return rb


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
    data = _data()
    plain = _buffer(data)
    try:
        burn = _buffer(data, burn_in=BURN_IN, strict_length=False, pad_output=True)
        padded = _buffer(data, strict_length=False, pad_output=True)
    except TypeError:
        # pristine 0.12.0: no burn_in or pad_output argument
        return {}
    assert burn.sample().shape == plain.sample().shape == padded.sample().shape
    ratios, padded_ratios = [], []
    for _ in range(args.rounds):
        burn_time, plain_time, padded_time = _interleaved_medians(
            [burn.sample, plain.sample, padded.sample], args.repeat
        )
        ratios.append(burn_time / plain_time)
        padded_ratios.append(burn_time / padded_time)
    name = f"burn-in {BURN_IN} + {SLICE_LEN} / plain {BURN_IN + SLICE_LEN}"
    return {
        name: {"ratio": statistics.median(ratios)},
        f"{name}, padded": {"ratio": statistics.median(padded_ratios)},
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=25)
    parser.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="independent rounds; the median ratio is printed",
    )
    main(
        __file__,
        "rb.sample() with burn-in / plain rb.sample() of as many rows (lower is "
        "better; 1.0 is the floor)",
        measure,
        ["ratio"],
        parser,
    )

# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""How the cost of ``rb.sample()`` with a :class:`~torchrl.data.SliceSampler` grows with the buffer.

State-sized rows (16-float observations, the entries a collector writes, 200-step
trajectories), 64 slices of 32 steps, one torch thread, in a full
:class:`~torchrl.data.LazyTensorStorage` and a full
:class:`~torchrl.data.LazyMemmapStorage` of 10k, 100k and 1M rows (10M with
``--large``), with the trajectory key found by the sampler itself
(``("collector", "traj_ids")``) and with ``end_key`` only (no trajectory ids
stored). For pristine TorchRL 0.12.0 and the fork, measured in the same run:

- ``sample/gather``: the median ``rb.sample()`` time divided by the median time
  of one plain gather (``storage[idx]``) of the rows of a sample. The gathers
  use the indices of earlier samples, one each, so that they read memory with
  the locality of a sample (a gather repeated on the same rows would find them
  in cache). 1.0 means the sampler costs nothing beyond the gather the buffer
  does anyway.
- ``after write``: the same ratio when every sample follows an ``extend`` of
  1,000 rows (what a training loop does; the fork's index is updated from
  those rows then).
- ``sample us``, ``gather us``: the median ``rb.sample()`` time and the median
  gather time, to compare sizes: a gather of rows spread over a large buffer
  misses the CPU caches, so it slows down as the buffer grows.
- ``sampler us``: the median time of the sampler's own ``sample()`` called
  alone (the indices and markers, without the buffer's gather; alone, the
  fork's sampler reads the marker columns itself, which it leaves to the
  buffer's gather when a buffer samples).
- ``extend us/1k``: the median time of ``rb.extend`` of 1,000 rows into the
  full buffer, per 1,000 rows.

Below the table, for each storage and key: how each time grows from 10k rows to
the largest size, with the cost of ``rb.sample()`` beyond the gather it holds
(``sample us`` less ``gather us``). A sampler that costs O(batch) keeps that
cost as the buffer grows; ``rb.sample()`` still grows with its gather, which
misses the caches more in a larger buffer.

The machine's speed drifts over seconds: every quantity is timed back to back
in each of ``--rounds`` rounds, a ratio is taken within a round, and each
column is the median over rounds.

Run with ``python benchmarks/slice_sampler_scale.py`` (``make bench`` runs it).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import _run_side, print_table, SIDES  # noqa: E402

TRAJ_LEN = 200
NUM_SLICES = 64
SLICE_LEN = 32
WRITE = 1000
COLUMNS = [
    "sample/gather",
    "after write",
    "sample us",
    "gather us",
    "sampler us",
    "extend us/1k",
]


def _rows(start: int, num_rows: int, with_ids: bool):
    import torch
    from tensordict import TensorDict

    step = (torch.arange(start, start + num_rows)) % TRAJ_LEN
    done = (step == TRAJ_LEN - 1).unsqueeze(-1)
    false = torch.zeros(num_rows, 1, dtype=torch.bool)
    data = {
        "observation": torch.randn(num_rows, 16),
        "action": torch.randn(num_rows, 2),
        "is_init": (step == 0).unsqueeze(-1),
        "done": false,
        "terminated": false.clone(),
        "truncated": false.clone(),
        ("next", "observation"): torch.randn(num_rows, 16),
        ("next", "reward"): torch.randn(num_rows, 1),
        ("next", "done"): done,
        ("next", "terminated"): done.clone(),
        ("next", "truncated"): false.clone(),
        ("next", "is_init"): false.clone(),
    }
    if with_ids:
        data[("collector", "traj_ids")] = (
            torch.arange(start, start + num_rows) // TRAJ_LEN
        )
    return TensorDict(data, [num_rows])


def _buffer(kind: str, size: int, key: str, scratch: str):
    from torchrl.data import (
        LazyMemmapStorage,
        LazyTensorStorage,
        ReplayBuffer,
        SliceSampler,
    )

    if kind == "tensor":
        storage = LazyTensorStorage(size)
    else:
        storage = LazyMemmapStorage(size, scratch_dir=scratch)
    if key == "auto":
        # pristine 0.12.0 cannot find the key: it is given there
        sampler = SliceSampler(
            num_slices=NUM_SLICES, traj_key=("collector", "traj_ids")
        )
    else:
        sampler = SliceSampler(num_slices=NUM_SLICES, end_key=("next", "done"))
    rb = ReplayBuffer(
        storage=storage, sampler=sampler, batch_size=NUM_SLICES * SLICE_LEN
    )
    chunk = 500_000
    for start in range(0, size, chunk):
        rb.extend(_rows(start, min(chunk, size - start), key == "auto"))
    return rb


def _median(fn, repeat: int, before=None) -> float:
    times = []
    for _ in range(repeat):
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _measure_buffer(kind: str, key: str, size: int, repeat: int, rounds: int) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        rb = _buffer(kind, size, key, scratch)
        storage, sampler = rb._storage, rb._sampler
        rb.sample()
        data = _rows(0, WRITE, key == "auto")
        written = [size]

        def write():
            # continue the trajectories where the buffer left them
            rb.extend(_shift(data, written[0], key == "auto"))
            written[0] += WRITE

        # The machine's speed drifts over seconds: each round times every
        # quantity back to back, and the ratios are taken within a round.
        per_round = []
        for _ in range(rounds):
            indices = [rb.sample(return_info=True)[1]["index"] for _ in range(repeat)]
            gather = _median(lambda it=iter(indices): storage[next(it)], repeat)
            sample = _median(rb.sample, repeat)
            own = _median(
                lambda: sampler.sample(storage, NUM_SLICES * SLICE_LEN), repeat
            )
            after = _median(rb.sample, repeat, before=write)
            extend = _median(write, repeat)
            per_round.append(
                {
                    "sample/gather": sample / gather,
                    "after write": after / gather,
                    "sample us": sample * 1e6,
                    "gather us": gather * 1e6,
                    "sampler us": own * 1e6,
                    "extend us/1k": extend * 1e6 * 1000 / WRITE,
                }
            )
        return {col: statistics.median(r[col] for r in per_round) for col in COLUMNS}


def measure(args: argparse.Namespace) -> dict:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    sizes = [10_000, 100_000, 1_000_000] + ([10_000_000] if args.large else [])
    out = {}
    for kind in ("tensor", "memmap"):
        for key in ("auto", "end_key"):
            for size in sizes:
                out[f"{kind} {key} {size // 1000}k"] = _measure_buffer(
                    kind, key, size, args.repeat, args.rounds
                )
    return out


def _shift(data, start: int, with_ids: bool):
    import torch

    step = torch.arange(start, start + WRITE) % TRAJ_LEN
    data["is_init"] = (step == 0).unsqueeze(-1)
    data["next", "done"] = (step == TRAJ_LEN - 1).unsqueeze(-1)
    data["next", "terminated"] = data["next", "done"].clone()
    if with_ids:
        data["collector", "traj_ids"] = torch.arange(start, start + WRITE) // TRAJ_LEN
    return data


def _report(results: dict) -> None:
    rows = list(results["fork"])
    print_table(
        results,
        COLUMNS,
        first="buffer",
        fmt=lambda col, value: f"{value:.0f}" if " us" in col else f"{value:.2f}",
    )
    print()
    print(
        "growth from 10k rows to the largest size (sample: rb.sample(); gather: "
        "the plain gather it contains; sampler: the sampler's own work; beyond "
        "the gather: rb.sample() less the gather), and extend time per row, "
        "fork / pristine:"
    )
    for prefix in sorted({row.rsplit(" ", 1)[0] for row in rows}):
        sized = [row for row in rows if row.startswith(prefix + " ")]
        parts = []
        for col in ("sample us", "gather us", "sampler us"):
            growth = {
                side: results[side][sized[-1]][col] / results[side][sized[0]][col]
                for side in SIDES
            }
            parts.append(
                f"{col.split()[0]} pristine {growth['pristine']:.2f} "
                f"fork {growth['fork']:.2f}"
            )
        # what rb.sample() costs beyond the gather it holds
        beyond = {
            side: [
                results[side][row]["sample us"] - results[side][row]["gather us"]
                for row in (sized[0], sized[-1])
            ]
            for side in SIDES
        }
        parts.append(
            f"beyond the gather pristine {beyond['pristine'][1] / beyond['pristine'][0]:.2f} "
            f"fork {beyond['fork'][1] / beyond['fork'][0]:.2f}"
        )
        extend = statistics.median(
            results["fork"][row]["extend us/1k"]
            / results["pristine"][row]["extend us/1k"]
            for row in sized
        )
        print(
            f"  {prefix} {sized[-1].rsplit(' ', 1)[1]}/10k: "
            + "; ".join(parts)
            + f"; extend fork/pristine {extend:.2f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeat",
        type=int,
        default=40,
        help="timed calls per measurement (the median is kept)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=7,
        help="rounds of measurements per buffer; each column is the median "
        "over rounds of what a round measured (ratios within a round)",
    )
    parser.add_argument(
        "--large", action="store_true", help="also measure a 10M-row buffer"
    )
    parser.add_argument("--worker", choices=sorted(SIDES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        import json

        print(json.dumps(measure(args)))
    else:
        extra = sys.argv[1:]
        results = {side: _run_side(__file__, side, extra) for side in SIDES}
        print(
            "rb.sample() against one gather of its rows, and extend(), as the "
            "buffer grows (lower is better)"
        )
        _report(results)

# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Runs one benchmark on pristine upstream and on the fork, side by side.

Each side runs in its own subprocess with ``PYTHONPATH`` set to
``build/upstream`` or ``build/fork`` (same interpreter, same torch, same
tensordict), so both are measured in the same run on the same machine. A
benchmark script calls :func:`main` with a ``measure`` function that returns
``{row_name: {column: value}}``; the script re-runs itself as a worker.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
SIDES = {"pristine": ROOT / "build" / "upstream", "fork": ROOT / "build" / "fork"}


def median_time(fn: Callable[[], object], repeat: int, warmup: int = 3) -> float:
    """Median wall time of ``fn()`` over ``repeat`` calls, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def alternate(fn_a, fn_b, repeat: int, warmup: int = 3) -> float:
    """Median time of ``fn_a`` over median time of ``fn_b``, timed alternately."""
    for _ in range(warmup):
        fn_a()
        fn_b()
    times_a, times_b = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        fn_a()
        times_a.append(time.perf_counter() - start)
        start = time.perf_counter()
        fn_b()
        times_b.append(time.perf_counter() - start)
    return statistics.median(times_a) / statistics.median(times_b)


def _run_side(script: str, side: str, extra: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=str(SIDES[side]), RL_WARNINGS="0")
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.run(
        [sys.executable, script, "--worker", side, *extra],
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{side} worker failed:\n{proc.stdout}\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(
    script: str,
    title: str,
    measure: Callable[[argparse.Namespace], dict],
    ratio_columns: list[str],
    parser: argparse.ArgumentParser | None = None,
) -> None:
    """Entry point of a benchmark script: worker mode, or the side-by-side table.

    Args:
        script (str): the benchmark's path (``__file__``).
        title (str): the line printed above the table.
        measure (Callable): run in each worker, returns ``{row: {column: value}}``.
        ratio_columns (list of str): the columns printed for each side.
        parser (argparse.ArgumentParser, optional): the script's own options;
            they are forwarded to the workers.
    """
    parser = parser or argparse.ArgumentParser(description=title)
    parser.add_argument("--worker", choices=sorted(SIDES), help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args()
    if args.worker:
        print(json.dumps(measure(args)))
        return
    extra = list(sys.argv[1:])
    for path in SIDES.values():
        if not path.is_dir():
            sys.exit(f"{path} is missing: run `make sync` first")
    results = {side: _run_side(script, side, extra) for side in SIDES}
    print(title)
    print_table(results, ratio_columns)


def print_table(
    results: dict,
    columns: list[str],
    first: str = "mode",
    fmt: Callable[[str, float], str] = lambda column, value: f"{value:.3f}",
) -> None:
    """Prints ``{side: {row: {column: value}}}`` with the sides next to each other."""
    rows = list(results["fork"])
    header = [first] + [f"{side} {col}" for col in columns for side in SIDES]
    table = [header]
    for row in rows:
        line = [row]
        for col in columns:
            for side in SIDES:
                value = results[side].get(row, {}).get(col)
                line.append("n/a" if value is None else fmt(col, value))
        table.append(line)
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for r in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)))

# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""``examples/recurrent/ray_sequence_replay.py`` run briefly, as a user runs it, in both modes."""
from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "recurrent" / "ray_sequence_replay.py"
LAST_LINE = re.compile(r"^eval return (\d+\.\d) after (\d+) frames in (\d+) s$")
SHORT = [
    "--frames",
    "2048",
    "--warmup",
    "512",
    "--eval-every",
    "1024",
    "--eval-episodes",
    "2",
]


def _run(*args, timeout=300):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


@pytest.mark.parametrize("mode", ["background", "iterator"])
def test_short_run(tmp_path, mode):
    proc = _run(*SHORT, "--mode", mode, "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "frame/s" in proc.stderr  # the progress bar
    assert "[torchrl]" not in proc.stdout, proc.stdout  # no INFO log line
    evals = re.findall(r"eval: return \d+\.\d after (\d+) frames", proc.stdout)
    assert evals and int(evals[0]) == 0
    last = LAST_LINE.match(proc.stdout.strip().splitlines()[-1])
    assert last, proc.stdout[-1000:]
    assert int(last.group(2)) >= 2048
    with open(tmp_path / "learning_curve.csv") as file:
        rows = list(csv.DictReader(file))
    assert [int(r["frames"]) for r in rows] == [int(f) for f in evals]
    assert int(rows[-1]["frames"]) == int(last.group(2))
    assert (tmp_path / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_help_lists_the_resources():
    proc = _run("--help", timeout=60)
    assert proc.returncode == 0
    for flag in ("--collector-cpus", "--buffer-cpus", "--ray-cpus", "--mode", "--seed"):
        assert flag in proc.stdout


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--gamma", "5"], "--gamma: must be in [0.0, 1.0], got 5.0"),
        (["--gamma", "-0.1"], "--gamma: must be in [0.0, 1.0], got -0.1"),
        (["--lr", "-1"], "--lr: must be in (0.0, inf], got -1.0"),
        (["--lr", "0"], "--lr: must be in (0.0, inf], got 0.0"),
        (["--lr", "fast"], "--lr: takes a float, got 'fast'"),
    ],
)
def test_bad_flags(flags, message):
    proc = _run(*flags, timeout=60)
    assert proc.returncode == 2
    assert message in proc.stderr, proc.stderr

# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""The fork installs from a fresh clone the way people install a fork."""
from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fork import CACHE_ENV, Fork  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent.parent
CHECK_SCRIPT = """
import torch, torchrl
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, PrioritizedSliceSampler, ReplayBuffer
rb = ReplayBuffer(
    storage=LazyTensorStorage(100),
    sampler=PrioritizedSliceSampler(
        max_capacity=100, alpha=0.7, beta=0.9, num_slices=2, traj_key="episode"
    ),
    batch_size=8,
)
rb.extend(TensorDict({"episode": torch.arange(100) // 10}, [100]))
sample = rb.sample()
assert sample.shape == (8,), sample.shape
print(torchrl.__version__)
"""


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A fresh clone of the committed repository, sharing the download cache."""
    dest = tmp_path_factory.mktemp("clone") / "torchrl-seqrl"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(dest)], check=True)
    return dest


def _env() -> dict[str, str]:
    return dict(os.environ, **{CACHE_ENV: str(Fork(ROOT).cache)}, RL_WARNINGS="0")


def test_pip_install_fresh_clone_into_clean_venv(clone: Path, tmp_path: Path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = str(env_dir / "bin" / "python")
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run(
        pip + ["-r", str(ROOT / "requirements" / "runtime.txt")], check=True, env=_env()
    )
    subprocess.run(pip + [str(clone)], check=True, env=_env())
    out = subprocess.run(
        [py, "-c", CHECK_SCRIPT],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "0.12.0+seqrl"
    site = Path(
        subprocess.run(
            [py, "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    assert (site / "torchrl-0.12.0+seqrl.dist-info" / "RECORD").is_file()
    subprocess.run(
        [py, "-m", "pip", "uninstall", "-y", "-q", "torchrl"], check=True, env=_env()
    )
    assert not (site / "torchrl").exists()
    assert not list(site.glob("torchrl-*.dist-info"))


def test_pip_wheel_is_the_tool_wheel(clone: Path, tmp_path: Path):
    """``pip wheel .`` and ``tools/fork.py wheel`` give the very same bytes."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps"]
        + ["--no-build-isolation", "--disable-pip-version-check"]
        + [str(clone), "-w", str(tmp_path / "pip")],
        check=True,
        env=_env(),
    )
    (built,) = (tmp_path / "pip").glob("*.whl")
    assert built.name.startswith("torchrl-0.12.0+seqrl-")
    proc = subprocess.run(
        [sys.executable, str(clone / "tools" / "fork.py"), "wheel"]
        + ["--dist", str(tmp_path / "tool")],
        capture_output=True,
        text=True,
        env=_env(),
    )
    assert proc.returncode == 0, proc.stderr
    tool = Path(proc.stdout.strip())
    assert tool.name == built.name
    assert tool.read_bytes() == built.read_bytes()

# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Builds torchrl-seqrl: the pinned torchrl release with this repository's overlay.

This file stays thin. ``pip install .``, ``pip wheel .`` and
``pip install git+<url>`` all end in :meth:`tools.fork.Fork.wheel`, the same
code path as ``python tools/fork.py wheel`` and ``make install``.
"""
from __future__ import annotations

import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tools"))

from fork import Fork  # noqa: E402

FORK = Fork(ROOT)


class ForkWheel(bdist_wheel):
    """Writes the fork's wheel into ``--dist-dir`` instead of packing a tree."""

    def run(self):
        print(f"built {FORK.wheel(Path(self.dist_dir))}")


setup(
    name="torchrl",
    version=FORK.version,
    description="TorchRL with first-class sequence RL (torchrl-seqrl fork)",
    license="MIT",
    python_requires=">=3.10",
    install_requires=FORK.pin["requires"],
    packages=[],
    py_modules=[],
    cmdclass={"bdist_wheel": ForkWheel},
)

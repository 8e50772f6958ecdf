# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Checks of the documentation pages, the example and the tutorial.

The reference pages' ``.. code-block:: python`` blocks are executed in order
(one namespace per page), and the example and the tutorial are run as
scripts, so that what the docs show keeps working.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "source"
REFERENCE = DOCS / "reference"
EXAMPLE = ROOT / "examples" / "replay-buffers" / "recurrent_slice_sampler_pipeline.py"
TUTORIAL = ROOT / "tutorials" / "sphinx-tutorials" / "recurrent_sequence_training.py"

_BLOCK = re.compile(
    r"^\.\. code-block:: python[ \t]*\n((?:[ \t]*\n|[ \t]+\S.*\n)+)", re.M
)
_LABEL = re.compile(r"^\.\. _([^:]+):\s*$", re.M)


def python_blocks(text: str) -> list[str]:
    """The ``.. code-block:: python`` bodies of an rst text, dedented, in order."""
    blocks = []
    for match in _BLOCK.finditer(text):
        body = match.group(1)
        # Leading option lines (``:caption: ...``) are not code.
        lines = [ln for ln in body.splitlines() if not re.match(r"^\s+:\w+:", ln)]
        blocks.append(textwrap.dedent("\n".join(lines)).strip("\n") + "\n")
    return blocks


def run_blocks(path: Path) -> None:
    namespace = {"__name__": f"docs_{path.stem}"}
    for i, block in enumerate(python_blocks(path.read_text())):
        code = compile(block, f"{path.name}[code-block {i}]", "exec")
        exec(code, namespace)  # noqa: S102


def _env_with_fork() -> dict[str, str]:
    """The environment of a subprocess that imports the same torchrl as this one."""
    import torchrl

    env = dict(os.environ)
    package_parent = str(Path(torchrl.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (package_parent, env.get("PYTHONPATH")) if p
    )
    env.setdefault("MPLBACKEND", "Agg")
    return env


class TestReferencePages:
    def test_block_extraction(self):
        text = textwrap.dedent(
            """\
            Title
            =====

            .. code-block:: python

                x = 1

                y = x + 1

            Some prose.

            .. code-block:: python
               :caption: second

               assert y == 2

            .. code-block:: bash

               echo not python
            """
        )
        assert python_blocks(text) == ["x = 1\n\ny = x + 1\n", "assert y == 2\n"]

    def test_data_layout_has_code(self):
        assert len(python_blocks((REFERENCE / "data_layout.rst").read_text())) >= 6

    @pytest.mark.parametrize(
        "page", sorted(p.name for p in REFERENCE.glob("*.rst")), ids=str
    )
    def test_code_blocks_run(self, page):
        """Every reference page's code runs (pages without code pass trivially)."""
        # A page must not trip a FutureWarning it does not catch itself (such
        # as the collector's auto_register_policy_transforms default).
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            run_blocks(REFERENCE / page)

    def test_labels_the_code_points_to(self):
        """Warnings and docstrings in the fork point readers at these labels."""
        labels = set()
        for path in REFERENCE.glob("*.rst"):
            labels.update(_LABEL.findall(path.read_text()))
        assert {"data-layout", "Environment-policy-arg"} <= labels


class TestRunnableScripts:
    def test_example(self):
        proc = subprocess.run(
            [sys.executable, str(EXAMPLE), "--frames", "400", "--steps", "4"],
            capture_output=True,
            text=True,
            env=_env_with_fork(),
            timeout=300,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "loss" in proc.stdout.splitlines()[-1]

    def test_tutorial(self, tmp_path):
        pytest.importorskip("matplotlib")
        proc = subprocess.run(
            [sys.executable, str(TUTORIAL)],
            capture_output=True,
            text=True,
            env=_env_with_fork(),
            cwd=tmp_path,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

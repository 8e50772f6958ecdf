# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Checks of the documentation site, the example, the tutorial and the CI workflows.

The reference pages' ``.. code-block:: python`` blocks are executed in order
(one namespace per page), the example and the tutorial are run as scripts,
and the GitHub Actions workflows are validated (against the GitHub workflow
JSON schema vendored by ``check-jsonschema`` when it is installed, and
structurally in any case).
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "source"
REFERENCE = DOCS / "reference"
WORKFLOWS = ROOT / ".github" / "workflows"
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

    @pytest.mark.parametrize("page", ["data_layout.rst", "envs_policy.rst"])
    def test_code_blocks_run(self, page):
        run_blocks(REFERENCE / page)

    def test_labels_the_code_points_to(self):
        """Warnings and docstrings in the fork point readers at these labels."""
        labels = set()
        for path in REFERENCE.glob("*.rst"):
            labels.update(_LABEL.findall(path.read_text()))
        assert {"data-layout", "Environment-policy-arg"} <= labels

    def test_pages_in_toctree(self):
        index = (DOCS / "index.rst").read_text()
        for path in sorted(REFERENCE.glob("*.rst")):
            assert f"reference/{path.stem}" in index, f"{path.name} is not in index.rst"

    def test_no_page_collides_with_upstream(self):
        """Upstream TorchRL's docs/source/reference holds these pages already."""
        upstream = {"index", "envs", "data", "collectors", "modules", "objectives"}
        assert not upstream & {p.stem for p in REFERENCE.glob("*.rst")}


def _make_targets() -> dict[str, str]:
    """Maps each Makefile target to its recipe."""
    targets, current = {}, None
    for line in (ROOT / "Makefile").read_text().splitlines():
        match = re.match(r"^([A-Za-z][\w./-]*)\s*:(?!=)", line)
        if match:
            current = match.group(1)
            targets.setdefault(current, "")
        elif line.startswith("\t") and current is not None:
            targets[current] += line.strip() + "\n"
        elif line and not line.startswith("#"):
            current = None
    return targets


class TestMakeTargets:
    def test_docs_target(self):
        recipe = _make_targets()["docs"]
        assert "-m sphinx" in recipe and "-W" in recipe and "--keep-going" in recipe
        assert "docs/source docs/_build/html" in recipe

    def test_demo_runs_the_example(self):
        assert str(EXAMPLE.relative_to(ROOT)) in _make_targets()["demo"]

    def test_docs_requirements_pinned(self):
        reqs = (ROOT / "requirements" / "docs.txt").read_text().splitlines()
        reqs = [r for r in reqs if r.strip() and not r.startswith("#")]
        names = {re.split(r"[=<>!~]", r)[0].lower() for r in reqs}
        assert {"sphinx", "sphinx-gallery", "matplotlib"} <= names
        assert all(re.fullmatch(r"[\w.-]+==[\w.]+", r) for r in reqs), reqs


def _workflows() -> dict[str, dict]:
    out = {}
    for path in sorted(WORKFLOWS.glob("*.yml")):
        data = yaml.safe_load(path.read_text())
        # YAML 1.1 (PyYAML) reads the bare key ``on`` as the boolean True.
        if True in data:
            data["on"] = data.pop(True)
        out[path.name] = data
    return out


def _run_steps(workflows) -> list[str]:
    return [
        step["run"]
        for wf in workflows.values()
        for job in wf["jobs"].values()
        for step in job["steps"]
        if "run" in step
    ]


class TestWorkflows:
    def test_schema(self):
        """Validates every workflow against GitHub's workflow schema (SchemaStore's)."""
        if importlib.util.find_spec("check_jsonschema") is None:
            pytest.skip("check-jsonschema (requirements/docs.txt) is not installed")
        files = sorted(str(p) for p in WORKFLOWS.glob("*.yml"))
        assert files
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "check_jsonschema",
                "--builtin-schema",
                "vendor.github-workflows",
                *files,
            ],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr

    def test_schema_catches_errors(self, tmp_path):
        if importlib.util.find_spec("check_jsonschema") is None:
            pytest.skip("check-jsonschema (requirements/docs.txt) is not installed")
        bad = tmp_path / "bad.yml"
        # A misspelt job key ("step" for "steps").
        bad.write_text(
            "name: x\non: push\njobs:\n  a:\n    runs-on: ubuntu-24.04\n"
            "    step:\n      - run: echo hi\n"
        )
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "check_jsonschema",
                "--builtin-schema",
                "vendor.github-workflows",
                str(bad),
            ],
            capture_output=True,
            text=True,
        )
        assert proc.returncode != 0, proc.stdout

    def test_structure(self):
        workflows = _workflows()
        assert workflows
        for name, wf in workflows.items():
            assert {"name", "on", "jobs"} <= set(wf), name
            for job_name, job in wf["jobs"].items():
                assert "runs-on" in job, (name, job_name)
                assert job["steps"], (name, job_name)
                for step in job["steps"]:
                    assert ("run" in step) != ("uses" in step), (name, job_name, step)

    def test_python_matrix(self):
        versions, required = set(), set()
        for wf in _workflows().values():
            for job in wf["jobs"].values():
                for entry in (
                    job.get("strategy", {}).get("matrix", {}).get("include", [])
                ):
                    versions.add(entry["python-version"])
                    if not entry.get("experimental", False):
                        required.add(entry["python-version"])
        assert versions == {"3.10", "3.11", "3.12"}
        # The pinned wheel is cp311: that job must pass.
        assert required == {"3.11"}

    def test_jobs_cover_the_issue(self):
        runs = "\n".join(_run_steps(_workflows()))
        for target in ("pytest", "lint", "docs", "check", "upstream-diff"):
            assert re.search(rf"make\b[^\n]*\b{target}\b", runs), target

    def test_make_targets_exist(self):
        targets = _make_targets()
        for run in _run_steps(_workflows()):
            for line in run.splitlines():
                if not re.match(r"^\s*make\b", line):
                    continue
                words = line.split(">")[0].split()[1:]
                for word in words:
                    if not word.startswith("-") and "=" not in word:
                        assert word in targets, (word, line)


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

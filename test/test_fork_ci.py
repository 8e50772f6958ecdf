# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Checks of what only the fork has: its CI workflows, Makefile targets and docs site.

The GitHub Actions workflows are validated against GitHub's workflow JSON
schema (the copy vendored by ``check-jsonschema``, from
``requirements/docs.txt``) and structurally; the ``docs`` and ``demo`` make
targets and the site's table of contents are checked too. Upstream TorchRL
has its own CI, Makefile-free build and ``index.rst``, so this module does not
belong in the upstream diff.
"""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "source"
REFERENCE = DOCS / "reference"
WORKFLOWS = ROOT / ".github" / "workflows"
EXAMPLE = ROOT / "examples" / "replay-buffers" / "recurrent_slice_sampler_pipeline.py"


class TestDocsSite:
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
        versions = set()
        for wf in _workflows().values():
            for job in wf["jobs"].values():
                matrix = job.get("strategy", {}).get("matrix", {})
                versions.update(matrix.get("python-version", []))
                # No job may fail without failing its workflow.
                assert not job.get("continue-on-error", False), job
        assert versions == {"3.10", "3.11", "3.12"}

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

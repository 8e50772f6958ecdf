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
import json
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

    def test_demo_runs_the_examples(self):
        recipe = _make_targets()["demo"]
        assert str(EXAMPLE.relative_to(ROOT)) in recipe
        # the main job first: recurrent PPO with its defaults
        first = recipe.splitlines()[0]
        assert first.endswith("examples/recurrent/recurrent_ppo.py"), first

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

    def test_jobs_cover_the_checks(self):
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


def _ci_run_commands() -> list[str]:
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    return [line.strip() for line in lines if re.match(r"^\s*make\b", line)]


class TestUpstreamTests:
    """``make upstream-tests``: upstream's own suite against the fork, in CI."""

    RUNNER = ROOT / ".ci" / "upstream_tests.py"

    def test_target_and_ci(self):
        assert ".ci/upstream_tests.py" in _make_targets()["upstream-tests"]
        commands = _ci_run_commands()
        assert commands[0] == "make test"
        assert any(c.startswith("make upstream-tests") for c in commands[1:])

    def test_requirements_pinned_and_locked(self):
        reqs = (ROOT / "requirements" / "upstream-tests.txt").read_text().splitlines()
        reqs = [r for r in reqs if r.strip() and not r.startswith("#")]
        assert all(re.fullmatch(r"[\w.-]+==[\w.]+", r) for r in reqs), reqs
        lock = (ROOT / "requirements" / "constraints.txt").read_text().splitlines()
        for req in reqs:
            assert any(line.split(";")[0].strip() == req for line in lock), req
        names = {r.split("==")[0] for r in reqs}
        assert {"pytest-timeout", "scipy", "psutil", "pytest-mock"} <= names

    @staticmethod
    def _side(path: Path, value: int) -> Path:
        (path / "torchrl").mkdir(parents=True)
        (path / "torchrl" / "__init__.py").write_text(f"VALUE = {value}\n")
        return path

    def _run(
        self,
        tmp_path: Path,
        suite: Path,
        *,
        fork_value: int,
        targets: str | tuple[str, ...],
        known: Path | None = None,
        fixes: Path | None = None,
        workers: int = 0,
        extra: tuple[str, ...] = (),
    ) -> subprocess.CompletedProcess:
        """The runner on ``suite``: a fork side with ``VALUE = fork_value``, pristine 1."""
        return subprocess.run(
            [
                sys.executable,
                str(self.RUNNER),
                "--tests",
                str(suite),
                "--fixes",
                str(fixes or tmp_path / "no-fixes"),
                "--fork",
                str(self._side(tmp_path / "fork", fork_value)),
                "--pristine",
                str(self._side(tmp_path / "pristine", 1)),
                "--known",
                str(known or tmp_path / "absent.txt"),
                "--targets",
                *([targets] if isinstance(targets, str) else targets),
                "-n",
                str(workers),
                "--timeout",
                "0",
                *extra,
                "--out",
                str(tmp_path / "out"),
            ],
            capture_output=True,
            text=True,
        )

    def _fake_suite(self, tmp_path: Path) -> Path:
        suite = tmp_path / "suite"
        (suite / "test").mkdir(parents=True)
        (suite / "pytest.ini").write_text("[pytest]\ntestpaths = test\n")
        flag = tmp_path / "flaky-ran-once"
        (suite / "test" / "test_fake.py").write_text(
            "import os\nimport pytest\nimport torchrl\n\n"
            "def test_same():\n    assert True\n\n"
            "@pytest.mark.parametrize('x', [0, 1])\n"
            "def test_regression(x):\n    assert torchrl.VALUE == 1\n\n"
            "def test_both_known():\n    assert False, 'old failure'\n\n"
            "def test_both_unknown():\n    assert False, 'another old failure'\n\n"
            "def test_skip():\n    pytest.skip('needs something absent')\n\n"
            "def test_flaky():\n"
            f"    if not os.path.exists({str(flag)!r}):\n"
            f"        open({str(flag)!r}, 'w').close()\n"
            "        raise AssertionError('fails under load')\n"
        )
        # Fails on the fork; on pristine it passes the first time only, the
        # way a timing-dependent test passes there once in a while.
        ran = tmp_path / "intermittent-ran-on-pristine"
        (suite / "test" / "test_intermittent.py").write_text(
            "import os\nimport torchrl\n\n"
            "def test_intermittent():\n"
            "    assert torchrl.VALUE == 1\n"
            f"    if os.path.exists({str(ran)!r}):\n"
            "        raise AssertionError('fails under load on pristine too')\n"
            f"    open({str(ran)!r}, 'w').close()\n"
        )
        (suite / "test" / "test_broken_on_fork.py").write_text(
            "import torchrl\nassert torchrl.VALUE == 1\n\ndef test_a():\n    pass\n"
        )
        return suite

    @pytest.mark.parametrize("sides,workers", [("rerun", 2), ("both", 0)])
    def test_reports_fork_only_failures(self, tmp_path, sides, workers):
        if workers and importlib.util.find_spec("xdist") is None:
            pytest.skip("pytest-xdist is not installed")
        suite = self._fake_suite(tmp_path)
        known = tmp_path / "known.txt"
        known.write_text(
            "# pattern # reason\ntest/test_fake.py::test_both_k* # changed upstream\n"
        )
        proc = self._run(
            tmp_path,
            suite,
            fork_value=2,
            targets="test",
            known=known,
            workers=workers,
            extra=("--sides", sides),
        )
        out = proc.stdout
        assert proc.returncode == 1, out + proc.stderr
        fork_only = out.split("FORK-ONLY FAILURES")[1].split("\n\n")[0]
        for nodeid in (
            "test/test_fake.py::test_regression[0]",
            "test/test_fake.py::test_regression[1]",
            "test/test_broken_on_fork.py",
        ):
            assert f"\n  {nodeid}  [" in fork_only, out
        assert "test_both" not in fork_only and "test_flaky" not in fork_only
        assert "test_intermittent" not in fork_only
        assert "(intermittent there): 1\n  test/test_intermittent.py::" in out, out
        assert "1 x test/test_fake.py::test_both_k*  -- changed upstream" in out
        unexplained = out.split("not in")[1].split("\n\n")[0]
        assert "test/test_fake.py::test_both_unknown  -- AssertionError" in unexplained
        assert "passed alone): 1\n  test/test_fake.py::test_flaky\n" in out
        last = out.rstrip().splitlines()[-1]
        assert last.startswith("upstream-tests: FAIL, fork-only failures: 3;"), last
        # CI reads pytest-like closing lines: the runner's own must not be one.
        assert not re.search(r"\d+ (passed|failed|errors?)\b", last), last
        report = json.loads((tmp_path / "out" / "report.json").read_text())
        assert report["fork"]["test/test_fake.py::test_skip"] == "skipped"
        assert report["fork"]["test/test_fake.py::test_flaky"] == "passed"
        if sides == "both":
            assert (
                report["pristine"]["test/test_fake.py::test_regression[0]"] == "passed"
            )
            assert report["pristine"]["test/test_fake.py::test_same"] == "passed"
        else:
            # Only what failed on the fork is rerun on pristine.
            assert "test/test_fake.py::test_same" not in report["pristine"]

    def test_no_fork_only_failure_exits_zero(self, tmp_path):
        suite = self._fake_suite(tmp_path)
        (suite / "test" / "test_broken_on_fork.py").unlink()
        proc = self._run(tmp_path, suite, fork_value=1, targets="test/test_fake.py")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        last = proc.stdout.rstrip().splitlines()[-1]
        assert last.startswith("upstream-tests: OK, fork-only failures: 0;"), last

    def test_a_file_that_does_not_collect_fails_the_run(self, tmp_path):
        # broken on both sides (as a fix's test hunk under another test's
        # decorators breaks it): none of its tests run, so the run fails
        suite = self._fake_suite(tmp_path)
        (suite / "test" / "test_broken_on_fork.py").write_text(
            "import pytest\n\n@pytest.mark.parametrize('x', [0])\n"
            "def test_a():\n    pass\n"
        )
        proc = self._run(tmp_path, suite, fork_value=1, targets="test")
        out = proc.stdout
        assert proc.returncode == 1, out + proc.stderr
        assert "DO NOT COLLECT (none of their tests ran): 1\n" in out, out
        assert "\n  test/test_broken_on_fork.py\n" in out, out
        last = out.rstrip().splitlines()[-1]
        assert last.startswith("upstream-tests: FAIL, fork-only failures: 0;"), last

    def test_known_failure_gets_more_confirmation_runs(self, tmp_path):
        # listed as failing on pristine too; there it passes three runs, then
        # fails: more runs than --confirm show it, and it is no fork-only failure
        suite = tmp_path / "suite"
        (suite / "test").mkdir(parents=True)
        (suite / "pytest.ini").write_text("[pytest]\ntestpaths = test\n")
        count = tmp_path / "pristine-runs"
        (suite / "test" / "test_timing.py").write_text(
            "import os\nimport torchrl\n\n"
            "def test_timing():\n"
            "    assert torchrl.VALUE == 1\n"
            f"    with open({str(count)!r}, 'a') as f:\n"
            "        f.write('x')\n"
            f"    assert os.path.getsize({str(count)!r}) <= 3, 'under load'\n"
        )
        known = tmp_path / "known.txt"
        known.write_text("test/test_timing.py::test_timing # timing-dependent\n")
        proc = self._run(
            tmp_path,
            suite,
            fork_value=2,
            targets="test",
            known=known,
            extra=("--confirm", "2"),
        )
        out = proc.stdout
        assert proc.returncode == 0, out + proc.stderr
        assert "(intermittent there): 1\n  test/test_timing.py::test_timing" in out
        assert count.read_text() == "xxxx"

    def test_one_call_for_all_targets(self, tmp_path):
        suite = tmp_path / "suite"
        (suite / "test" / "sub").mkdir(parents=True)
        (suite / "pytest.ini").write_text("[pytest]\ntestpaths = test\n")
        (suite / "test" / "test_a.py").write_text(
            "def test_one():\n    pass\n\ndef test_two():\n    pass\n"
        )
        (suite / "test" / "sub" / "test_b.py").write_text(
            "import torchrl\n\ndef test_b():\n    assert torchrl.VALUE == 1\n"
        )
        (suite / "test" / "test_c.py").write_text("def test_c():\n    pass\n")
        proc = self._run(
            tmp_path,
            suite,
            fork_value=2,
            targets=("test/test_a.py", "test/sub"),
        )
        out = proc.stdout
        assert proc.returncode == 1, out + proc.stderr
        # one pytest call on the fork, then the serial retry and the rerun
        logs = sorted(p.name for p in (tmp_path / "out").glob("[0-9][0-9]-*.log"))
        assert logs[0] == "01-fork-targets.log", logs
        assert not any("test_a" in name or "sub" in name for name in logs), logs
        lines = out.splitlines()
        part_a = next(line for line in lines if line.strip().startswith("test/test_a"))
        part_b = next(line for line in lines if line.strip().startswith("test/sub"))
        assert "pass=2 fail=0" in part_a and "pass=0 fail=1" in part_b, out
        assert "test_c" not in out
        assert "\n  test/sub/test_b.py::test_b  [" in out.split("FORK-ONLY")[1], out

    @pytest.mark.parametrize("fork_value", [2, 1])
    def test_fix_tests_must_pass_on_the_fork(self, tmp_path, fork_value):
        # a fix's regression test fails on pristine by design: on the fork it
        # must pass, also in a file that no target runs
        suite = tmp_path / "suite"
        (suite / "test").mkdir(parents=True)
        (suite / "pytest.ini").write_text("[pytest]\ntestpaths = test\n")
        (suite / "test" / "test_a.py").write_text("def test_a():\n    pass\n")
        (suite / "test" / "test_b.py").write_text("def test_b():\n    pass\n")
        fixes = tmp_path / "fixes"
        fixes.mkdir()
        (fixes / "0001-fix.patch").write_text(
            "Subject: [PATCH] [BugFix] a fix\n\n"
            "--- a/test/test_b.py\n+++ b/test/test_b.py\n"
            "@@ -1,2 +1,7 @@\n def test_b():\n     pass\n"
            "+\n+\n+def test_fixed():\n+    import torchrl\n"
            "+    assert torchrl.VALUE == 2\n"
        )
        (fixes / "series").write_text("0001-fix.patch\n")
        proc = self._run(
            tmp_path,
            suite,
            fork_value=fork_value,
            targets="test/test_a.py",
            fixes=fixes,
        )
        out = proc.stdout + proc.stderr
        report = json.loads((tmp_path / "out" / "report.json").read_text())
        # only the fix's test of test_b.py runs, not test_b itself, and in the
        # same pytest call as the targets
        assert "test/test_b.py::test_b" not in report["fork"], out
        logs = sorted(p.name for p in (tmp_path / "out").glob("[0-9][0-9]-fork-*.log"))
        assert logs[0] == "01-fork-targets.log", logs
        assert not any("elsewhere" in name for name in logs), logs
        first = (tmp_path / "out" / "01-fork-targets.jsonl").read_text()
        assert "test/test_b.py::test_fixed" in first, out
        if fork_value == 2:
            assert report["fork"]["test/test_b.py::test_fixed"] == "passed", out
            assert proc.returncode == 0, out
        else:
            assert report["pristine"]["test/test_b.py::test_fixed"] == "failed", out
            assert proc.returncode == 1, out
            fork_only = out.split("FORK-ONLY FAILURES")[1].split("\n\n")[0]
            assert "test/test_b.py::test_fixed" in fork_only, out

    @pytest.mark.parametrize("start_method", ["forkserver", "default"])
    def test_start_method(self, tmp_path, start_method):
        # forkserver (the default): the tests' default start method, on both
        # sides, and a worker pickled to it runs; "default" leaves it unset
        suite = tmp_path / "suite"
        (suite / "test").mkdir(parents=True)
        (suite / "pytest.ini").write_text("[pytest]\ntestpaths = test\n")
        (suite / "test" / "test_mp.py").write_text(
            "import multiprocessing as mp\n\n"
            "def _square(x):\n    return x * x\n\n"
            "def test_forkserver():\n"
            "    assert mp.get_start_method() == 'forkserver'\n"
            "    with mp.get_context().Pool(1) as pool:\n"
            "        assert pool.map(_square, [3]) == [9]\n"
        )
        proc = self._run(
            tmp_path,
            suite,
            fork_value=1,
            targets="test",
            extra=("--sides", "both", "--start-method", start_method),
        )
        report = json.loads((tmp_path / "out" / "report.json").read_text())
        expected = "passed" if start_method == "forkserver" else "failed"
        for side in ("fork", "pristine"):
            outcome = report[side]["test/test_mp.py::test_forkserver"]
            assert outcome == expected, proc.stdout + proc.stderr
        if start_method == "forkserver":
            assert "start method: forkserver, preloading" in proc.stdout


_PRISTINE_MODULE = '''"""A stand-in for the torchrl package."""
import os


def used():
    return 1


def unused():
    return 2


class Config:
    """Read by its method."""

    value = 1

    def read(self):
        return self.value
'''

_SUITE = """import torchrl


def test_used():
    assert torchrl.used() == 1


def test_config():
    assert torchrl.Config().read() == 1


def test_untouched():
    assert torchrl.os is not None


def test_fails_on_pristine():
    assert torchrl.used() == 3
"""


class TestUpstreamTestMap:
    """The test-impact map: only tests that execute changed code are run."""

    RUNNER = ROOT / ".ci" / "upstream_tests.py"
    MAP = ROOT / ".ci" / "upstream_map.py"

    @staticmethod
    def _git(cwd: Path, *args: str) -> None:
        env = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
        env.update({f"GIT_{w}_NAME": "t" for w in ("AUTHOR", "COMMITTER")})
        env.update({f"GIT_{w}_EMAIL": "t@t" for w in ("AUTHOR", "COMMITTER")})
        subprocess.run(
            ["git", *args], cwd=cwd, check=True, env=env, capture_output=True
        )

    def _layout(self, tmp_path: Path) -> tuple[Path, Path, Path]:
        suite = tmp_path / "suite"
        (suite / "test").mkdir(parents=True)
        (suite / "pytest.ini").write_text("[pytest]\ntestpaths = test\n")
        (suite / "test" / "test_fake.py").write_text(_SUITE)
        pristine, fork = tmp_path / "pristine", tmp_path / "fork"
        for side in (pristine, fork):
            (side / "torchrl").mkdir(parents=True)
            (side / "torchrl" / "__init__.py").write_text(_PRISTINE_MODULE)
        self._git(fork, "init", "-q")
        self._git(fork, "add", "-A")
        self._git(fork, "commit", "-q", "-m", "pristine")
        self._git(fork, "tag", "upstream")
        return suite, pristine, fork

    def _run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, *map(str, args)], capture_output=True, text=True
        )

    def test_selects_tests_that_execute_a_change(self, tmp_path):
        pytest.importorskip("coverage")
        suite, pristine, fork = self._layout(tmp_path)
        common = ["--tests", suite, "--pristine", pristine, "--fork", fork]
        common += ["--fixes", tmp_path / "no-fixes"]
        rec = self._run(
            self.RUNNER,
            *common,
            "--record-map",
            "--targets",
            "test",
            "-n",
            "0",
            "--timeout",
            "0",
            "--out",
            tmp_path / "rec",
        )
        assert rec.returncode == 0, rec.stdout + rec.stderr
        tmap = tmp_path / "map.json.gz"
        built = self._run(
            self.MAP,
            "build",
            "--run",
            tmp_path / "rec",
            "--tests",
            suite,
            "--pristine",
            pristine,
            "--fork",
            fork,
            "--out",
            tmap,
        )
        assert built.returncode == 0, built.stdout + built.stderr
        # the fork changes a function one test runs, a class attribute another
        # test reads through a method, and a function no test runs
        module = fork / "torchrl" / "__init__.py"
        module.write_text(
            module.read_text()
            .replace("return 1\n", "return -1\n", 1)
            .replace("value = 1", "value = 2")
            .replace("return 2\n", "return 5\n")
        )
        check = self._run(
            self.MAP, "check", "--map", tmap, "--pristine", pristine, "--fork", fork
        )
        assert check.returncode == 0, check.stdout + check.stderr
        proc = self._run(
            self.RUNNER,
            *common,
            "--map",
            tmap,
            "--known",
            tmp_path / "absent.txt",
            "--targets",
            "test",
            "-n",
            "0",
            "--timeout",
            "0",
            "--out",
            tmp_path / "out",
        )
        out = proc.stdout
        assert proc.returncode == 1, out + proc.stderr
        assert "2 of the 3 tests of the test-impact map" in out, out
        report = json.loads((tmp_path / "out" / "report.json").read_text())
        assert report["fork"] == {
            "test/test_fake.py::test_used": "failed",
            "test/test_fake.py::test_config": "failed",
            # failed on pristine while the map was recorded: always runs
            "test/test_fake.py::test_fails_on_pristine": "failed",
        }
        assert sorted(report["fork_only"]) == [
            "test/test_fake.py::test_config",
            "test/test_fake.py::test_used",
        ]
        # FULL=1 runs the deselected test too
        full = self._run(
            self.RUNNER,
            *common,
            "--map",
            tmap,
            "--full",
            "--known",
            tmp_path / "absent.txt",
            "--targets",
            "test",
            "-n",
            "0",
            "--timeout",
            "0",
            "--out",
            tmp_path / "full",
        )
        report = json.loads((tmp_path / "full" / "report.json").read_text())
        assert (
            report["fork"]["test/test_fake.py::test_untouched"] == "passed"
        ), full.stdout
        # a map recorded on another base is stale
        (pristine / "torchrl" / "__init__.py").write_text(_PRISTINE_MODULE + "\n")
        check = self._run(
            self.MAP, "check", "--map", tmap, "--pristine", pristine, "--fork", fork
        )
        assert check.returncode == 1
        assert (
            "torchrl/__init__.py: pristine is not what the map was recorded on"
            in check.stdout
        )

    def test_map_is_current(self):
        """The committed map matches the pinned base (what ``make check`` runs)."""
        fork, pristine = ROOT / "build" / "fork", ROOT / "build" / "upstream"
        if not (pristine / "torchrl").is_dir():
            pytest.skip("build/upstream is not laid out (make build/fork)")
        proc = self._run(self.MAP, "check", "--pristine", pristine, "--fork", fork)
        assert proc.returncode == 0, proc.stdout + proc.stderr


class TestUpstreamPrs:
    """How ``make upstream-prs`` judges the outcomes of a fix's new tests."""

    @pytest.fixture(scope="class")
    def judge(self):
        spec = importlib.util.spec_from_file_location(
            "upstream_prs", ROOT / "tools" / "upstream_prs.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(ROOT / "tools"))
        try:
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(str(ROOT / "tools"))
        return module._judge

    def test_fails_on_pristine_passes_with_the_fix(self, judge):
        node = "test.test_rb::test_new"
        assert judge({"test_new"}, {node: "failed"}, {node: "passed"}) == []

    def test_a_file_that_no_longer_collects(self, judge):
        # what junit writes when a test hunk lands under another test's
        # decorators: one error for the module, none of its tests
        problems = judge({"test_new"}, {}, {"::test.test_rb": "failed"})
        assert problems == [
            "test_new: did not run with the fix (collection error?)",
            "::test.test_rb: fails with the fix (collection error?)",
        ]

    def test_passes_on_pristine_or_fails_with_the_fix(self, judge):
        node = "test.test_rb::test_new[0]"
        assert judge({"test_new"}, {node: "passed"}, {node: "passed"}) == [
            f"{node}: passes on pristine too: it tests nothing new"
        ]
        assert judge({"test_new"}, {}, {node: "skipped"}) == [
            f"{node}: skipped with the fix"
        ]

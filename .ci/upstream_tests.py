# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Runs upstream TorchRL's own test suite against the fork and compares with pristine.

``make upstream-tests`` calls this. The suite (``--tests``, a copy of upstream's
``test/`` tree with its ``pytest.ini``) is copied to a writable temporary folder
and run from there, one pytest call per target, with ``PYTHONPATH`` set to
``build/fork`` (the fork) or ``build/upstream`` (pristine 0.12.0).

Modes (``--sides``):

- ``rerun`` (default): the fork runs every target; each test that fails or
  errors there is retried once, serially, on the fork (a test that passes alone
  failed under load: it is counted as passed and listed as flaky); what still
  fails is run on pristine, in one call. A test that fails on the fork and not
  on pristine is a *fork-only failure*, once it has passed on pristine in
  ``--confirm`` more serial runs (a test that fails in one of them fails
  intermittently on both sides and is counted as failing on both).
- ``both``: pristine runs every target as well, and the full comparison is
  reported.

Tests that fail on both sides are matched against ``--known``
(``.ci/upstream-pristine-failures.txt``: ``PATTERN # reason`` lines, ``*`` the
only wildcard); those that match no entry are listed, but do not fail the run.

Exit status: 0 when there is no fork-only failure, 1 when there is, 2 when the
run itself broke (a target whose pytest crashed without reporting, a wrong
``torchrl`` on the path). The last line printed says which, in words that do
not imitate a pytest summary.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = (
    "test/test_rb.py",
    "test/test_tensordictmodules.py",
    "test/test_modules.py",
    "test/test_collectors.py",
    "test/objectives",
    "test/envs",
    "test/transforms",
)
FAILING = ("failed", "error")
# Confirmation runs on pristine of a fork failure that the known-failures file
# lists (``--confirm`` for any other).
KNOWN_CONFIRM = 6
PLUGIN = Path(__file__).resolve().parent / "upstream_outcomes.py"
IMPACT_PLUGIN = Path(__file__).resolve().parent / "upstream_impact.py"
# What a forkserver imports once, instead of every spawned worker: the side's
# torchrl is imported in its server too (PYTHONPATH is the side's).
FORKSERVER_PRELOAD = "torch,tensordict,torchrl"


@dataclass
class Result:
    """The outcome of each test of one pytest call (or several merged)."""

    outcomes: dict[str, str] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)
    longreprs: dict[str, str] = field(default_factory=dict)
    durations: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    cpu_seconds: float = 0.0

    def update(self, other: Result) -> None:
        self.outcomes.update(other.outcomes)
        self.messages.update(other.messages)
        self.longreprs.update(other.longreprs)
        self.durations.update(other.durations)
        self.seconds += other.seconds
        self.cpu_seconds += other.cpu_seconds

    def failing(self) -> list[str]:
        return sorted(n for n, o in self.outcomes.items() if o in FAILING)

    def counts(self) -> collections.Counter:
        return collections.Counter(self.outcomes.values())


def parse_outcomes(path: Path) -> Result:
    """Folds the plugin's per-phase records into one outcome per node id.

    A failing setup or teardown is an ``error``, a failing call ``failed``,
    a failed collection (a module that does not import) an ``error`` of the
    collector's node id; ``xfailed`` counts as skipped.
    """
    result = Result()
    if not path.exists():
        return result
    rank = {"passed": 0, "skipped": 1, "failed": 2, "error": 2}
    for line in path.read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        nodeid, outcome = rec["nodeid"], rec["outcome"]
        result.durations[nodeid] = result.durations.get(nodeid, 0.0) + rec.get(
            "duration", 0.0
        )
        if outcome == "xfailed":
            outcome = "skipped"
        if outcome == "failed" and rec["when"] != "call":
            outcome = "error"
        if rec["when"] == "teardown" and outcome == "passed":
            continue
        old = result.outcomes.get(nodeid)
        if old is None or rank[outcome] > rank[old]:
            result.outcomes[nodeid] = outcome
        if rec["message"] or rec["longrepr"]:
            result.messages.setdefault(nodeid, rec["message"])
            result.longreprs.setdefault(nodeid, rec["longrepr"])
    return result


class Known:
    """The committed list of tests that fail on pristine 0.12.0 too."""

    def __init__(self, path: Path | None):
        self.entries: list[tuple[str, re.Pattern, str]] = []
        if path is None or not path.exists():
            return
        for raw in path.read_text(encoding="utf-8").splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            pattern, _, reason = line.partition(" # ")
            pattern = pattern.strip()
            regex = re.compile(
                ".*".join(re.escape(part) for part in pattern.split("*")) + r"\Z"
            )
            self.entries.append((pattern, regex, reason.strip()))

    def match(self, nodeid: str) -> tuple[str, str] | None:
        for pattern, regex, reason in self.entries:
            if regex.match(nodeid):
                return pattern, reason
        return None


class Runner:
    def __init__(self, args):
        self.args = args
        self.python = args.python
        self.out = Path(args.out).resolve()
        self.calls = 0
        self.deselect: Path | None = None
        self.fix_tests: set[tuple[str, str]] = set()

    def _env(
        self,
        side_path: Path,
        select: Path | None,
        outcomes: Path,
        only: Path | None = None,
    ) -> dict:
        env = dict(os.environ)
        plugin_dir = self.work / "_plugin"
        env["PYTHONPATH"] = os.pathsep.join([str(side_path), str(plugin_dir)])
        env["PATH"] = os.pathsep.join(
            [str(Path(self.python).parent), env.get("PATH", "")]
        )
        env["UPSTREAM_OUTCOMES"] = str(outcomes)
        env.pop("UPSTREAM_SELECT", None)
        env.pop("UPSTREAM_DESELECT", None)
        env.pop("UPSTREAM_ONLY", None)
        if only is not None:
            env["UPSTREAM_ONLY"] = str(only)
        if select is not None:
            env["UPSTREAM_SELECT"] = str(select)
        elif self.deselect is not None:
            env["UPSTREAM_DESELECT"] = str(self.deselect)
        env.pop("PYTEST_ADDOPTS", None)
        env.pop("UPSTREAM_IMPACT", None)
        env.pop("UPSTREAM_FORKSERVER", None)
        if self.args.start_method == "forkserver":
            env["UPSTREAM_FORKSERVER"] = FORKSERVER_PRELOAD
        if self.args.record_map:
            env["UPSTREAM_IMPACT"] = str(self.out / "impact")
        return env

    def check_side(self, side_path: Path) -> None:
        """The ``torchrl`` that tests import must be the side's own."""
        code = "import torchrl, sys; sys.stdout.write(torchrl.__file__)"
        proc = subprocess.run(
            [self.python, "-c", code],
            cwd=self.work,
            env=self._env(side_path, None, self.out / "unused"),
            capture_output=True,
            text=True,
        )
        found = Path(proc.stdout.strip() or "?").resolve()
        if proc.returncode or side_path.resolve() not in found.parents:
            sys.exit(
                f"upstream-tests: cannot import torchrl from {side_path} "
                f"(got {found}): {proc.stderr.strip()[-500:]}\n"
                "Run `make build/fork` (it lays out build/fork and build/upstream)."
            )

    def pytest(
        self,
        side: str,
        side_path: Path,
        paths: list[str],
        *,
        workers: int,
        label: str,
        select: list[str] | None = None,
        only: Path | None = None,
        extra: tuple[str, ...] = (),
    ) -> tuple[Result, int]:
        """One pytest call; its log goes to ``--out``, its outcomes are returned."""
        self.calls += 1
        safe = re.sub(r"[^\w.-]+", "_", label)
        stem = f"{self.calls:02d}-{side}-{safe}"
        outcomes = self.out / f"{stem}.jsonl"
        log = self.out / f"{stem}.log"
        select_file = None
        if select is not None:
            select_file = self.out / f"{stem}.select"
            select_file.write_text("".join(n + "\n" for n in select))
        cmd = [
            self.python,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-p",
            "upstream_outcomes",
            *(["-p", "upstream_impact"] if self.args.record_map else []),
            "-q",
            # One module that does not import must not hide the others' results.
            "--continue-on-collection-errors",
            *([f"--timeout={self.args.timeout}"] if self.args.timeout else []),
            *(
                ["-n", str(workers), "--dist", "worksteal"]
                if workers > 0
                else ["-p", "no:xdist"]
            ),
            *self.args.pytest_args,
            *extra,
            *paths,
        ]
        start, cpu = time.monotonic(), _children_cpu()
        with open(log, "w") as f:
            f.write(" ".join(cmd) + "\n")
            f.flush()
            proc = subprocess.run(
                cmd,
                cwd=self.work,
                env=self._env(side_path, select_file, outcomes, only),
                stdout=f,
                stderr=subprocess.STDOUT,
            )
        result = parse_outcomes(outcomes)
        result.seconds = time.monotonic() - start
        result.cpu_seconds = _children_cpu() - cpu
        return result, proc.returncode

    def run_targets(self, side: str, side_path: Path) -> tuple[Result, list[str]]:
        # One pytest call for all targets: the workers start and collect once,
        # and no worker idles at the end of one target while the other
        # finishes it. The fixes' regression tests in files that no target
        # runs join the same call (only those tests of such a file run). The
        # summary splits the outcomes by target.
        total, broken = Result(), []
        label = "targets"
        outside = sorted(
            {f for f, _ in self.fix_tests if not _in_targets(f, self.args.targets)}
        )
        if self.args.record_map:
            outside = []
        only = None
        if outside:
            only = self.out / f"{self.calls + 1:02d}-{side}-{label}.only"
            only.write_text(
                "".join(
                    f"{f}::{n}\n" for f, n in sorted(self.fix_tests) if f in outside
                )
            )
        res, rc = self.pytest(
            side,
            side_path,
            # first: the Ray test of a fix is long, and would otherwise end the run
            [*outside, *self.args.targets],
            workers=self.args.workers,
            label=label,
            only=only,
        )
        # 0 all passed, 1 some failed, 5 nothing collected: anything else
        # (interrupted, internal error, usage error) with no failure
        # recorded means the outcomes cannot be trusted.
        if rc not in (0, 1, 5) and not res.failing():
            broken.append(f"{side} {label}: pytest exited {rc}")
        if rc == 1 and not res.failing():
            broken.append(f"{side} {label}: pytest failed, no test recorded")
        total.update(res)
        self.timings.append((side, label, res))
        print(f"  {side:8} {label:34} {_fmt_counts(res)}", flush=True)
        for target in [*self.args.targets, *outside]:
            part = _part(res, target)
            self.parts.append((side, target, part))
            print(
                f"  {'':8}   {target:32} {_fmt_counts(part, unit='test-s')}",
                flush=True,
            )
        return total, broken

    def rerun(
        self, side: str, side_path: Path, nodeids: list[str], workers: int, label: str
    ) -> Result:
        if not nodeids:
            return Result()
        paths = sorted({n.split("::")[0] for n in nodeids})
        res, _ = self.pytest(
            side,
            side_path,
            paths,
            workers=workers,
            label=label,
            select=nodeids,
        )
        self.timings.append((side, label, res))
        print(f"  {side:8} {label:34} {_fmt_counts(res)}", flush=True)
        return res

    def apply_fix_tests(self) -> int:
        """Adds the test hunks of the fixes layer to the copy of the suite."""
        sys.path.insert(0, str(ROOT / "tools"))
        import fork as fork_tool

        import upstream_prs

        series = fork_tool.fix_series(Path(self.args.fixes))
        fork_tool.apply_fixes(Path(self.args.fixes), self.work, "test/*")
        # (file, test function) of each test the fixes add: it fails on
        # pristine by design, so on the fork it must pass whatever pristine does
        files = sorted(
            {
                line.split("\t")[-1]
                for patch in series
                for line in subprocess.run(
                    ["git", "apply", "--numstat", "--include=test/*", str(patch)],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.splitlines()
            }
        )
        tests = Path(self.args.tests).resolve()
        added = upstream_prs._test_names(self.work, files) - upstream_prs._test_names(
            tests, files
        )
        self.fix_tests = {tuple(n.split("::")) for n in added}
        return len(series)

    def select_by_map(self, tests: Path, fork: Path, pristine: Path, known) -> str:
        """Deselects the mapped tests that execute nothing the fork changes.

        Also deselected: the tests that failed on pristine while the map was
        recorded and that an entry of ``--known`` explains (they pass on
        neither side, so no fork-only failure can hide there).

        Returns a line that says what was selected. Nothing is deselected with
        ``--full``, without a map, or for another suite than the map's.
        """
        args = self.args
        if args.full or args.record_map or args.sides == "both":
            return "every test (--full)" if args.full else "every test"
        path = Path(args.map)
        if not path.exists():
            return f"every test (no test-impact map at {path})"
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import upstream_map

        tmap = upstream_map.Map(path)
        if tmap.data["suite_sha256"] != upstream_map.suite_sha256(tests):
            return f"every test ({tests} is not the suite the map was recorded on)"
        stale = tmap.stale(pristine, fork)
        if stale:
            sys.exit(
                "upstream-tests: the test-impact map is stale:"
                + "".join(f"\n  {p}" for p in stale)
                + "\nRun `make upstream-test-map` to record it again, or pass FULL=1."
            )
        wanted = upstream_map.changed_scopes(fork, pristine)
        chosen, _ = tmap.select(wanted)
        skipped = sorted(set(tmap.tests) - chosen)
        failing = sorted(
            n
            for n in tmap.data.get("failing_on_pristine", [])
            if known.match(n) is not None
        )
        self.deselect = self.out / "deselected.txt"
        self.deselect.write_text("".join(n + "\n" for n in skipped + failing))
        return (
            f"{len(chosen)} of the {len(tmap.tests)} tests of the test-impact map "
            f"execute a function the fork changes and run, with every test the map "
            f"has not seen; {len(skipped)} deselected "
            f"({tmap.seconds(skipped) / 60:.0f} test-minutes on pristine), and "
            f"{len(failing)} known failures that failed on pristine while the map "
            f"was recorded (FULL=1 runs them all)"
        )

    def main(self) -> int:
        args = self.args
        tests = Path(args.tests).resolve()
        if not (tests / "test").is_dir():
            sys.exit(f"upstream-tests: no test/ folder in {tests} (--tests)")
        fork, pristine = Path(args.fork).resolve(), Path(args.pristine).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        for stale in self.out.glob("[0-9][0-9]-*"):
            stale.unlink()
        self.timings: list[tuple[str, str, Result]] = []
        self.parts: list[tuple[str, str, Result]] = []
        self.intermittent: list[str] = []
        known = Known(Path(args.known) if args.known else None)
        self.selection = self.select_by_map(tests, fork, pristine, known)
        wall = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="upstream-tests-") as tmp:
            self.work = Path(tmp) / "suite"
            shutil.copytree(tests, self.work)
            # the regression tests of the fixes layer run too (the map has
            # never seen them); the suite the map was recorded on is `tests`
            fixes = self.apply_fix_tests()
            (self.work / "_plugin").mkdir()
            shutil.copy(PLUGIN, self.work / "_plugin" / PLUGIN.name)
            shutil.copy(IMPACT_PLUGIN, self.work / "_plugin" / IMPACT_PLUGIN.name)
            for side_path in (fork, pristine):
                self.check_side(side_path)
            print(
                f"upstream-tests: {tests} against {fork} (fork) and {pristine} "
                f"(pristine), {args.workers} workers, logs in {self.out}",
                flush=True,
            )
            print(f"upstream-tests: runs {self.selection}", flush=True)
            if fixes:
                print(
                    f"upstream-tests: with the regression tests of {fixes} fixes "
                    f"({args.fixes}/series)",
                    flush=True,
                )
            if args.record_map:
                # What each test runs of pristine torchrl, for the map builder
                # (it reads the outcomes from the logs of this run).
                _, broken = self.run_targets("pristine", pristine)
                if broken:
                    print("\n".join(broken))
                return 2 if broken else 0
            fork_res, broken = self.run_targets("fork", fork)
            first_fail = fork_res.failing()
            retry = self.rerun("fork", fork, first_fail, 0, "retry-serial")
            flaky = sorted(n for n in first_fail if retry.outcomes.get(n) == "passed")
            for n in flaky:
                fork_res.outcomes[n] = "passed"
            fork_fail = fork_res.failing()
            if args.sides == "both":
                pristine_res, broken_p = self.run_targets("pristine", pristine)
                broken += broken_p
                p_fail = pristine_res.failing()
                p_retry = self.rerun("pristine", pristine, p_fail, 0, "retry-serial")
                for n in p_fail:
                    if p_retry.outcomes.get(n) == "passed":
                        pristine_res.outcomes[n] = "passed"
            else:
                pristine_res = self.rerun(
                    "pristine", pristine, fork_fail, args.workers, "fork-failures"
                )
                # A failure on pristine that no known entry explains is
                # checked once more alone, so that load cannot make a fork
                # regression look like an old failure.
                suspect = [n for n in pristine_res.failing() if known.match(n) is None]
                p_retry = self.rerun("pristine", pristine, suspect, 0, "retry-serial")
                for n in suspect:
                    if p_retry.outcomes.get(n) == "passed":
                        pristine_res.outcomes[n] = "passed"
            # A test that fails on the fork and passed on pristine once may be
            # one that fails intermittently on both sides (timing under load): it
            # is run on pristine ``--confirm`` more times, and one failure there
            # makes it a failure of both sides.
            # A test of the known-failures file fails on pristine by record:
            # it gets more confirmation runs (a timing-dependent one that
            # fails half the time passes two runs in four).
            candidates = [
                n for n in fork_fail if pristine_res.outcomes.get(n) == "passed"
            ]
            for k in range(max(args.confirm, KNOWN_CONFIRM)):
                if k >= args.confirm:
                    candidates = [n for n in candidates if known.match(n) is not None]
                if not candidates:
                    break
                again = self.rerun(
                    "pristine", pristine, candidates, 0, f"confirm-{k + 1}"
                )
                for n in candidates:
                    if again.outcomes.get(n) in FAILING:
                        pristine_res.outcomes[n] = again.outcomes[n]
                        self.intermittent.append(n)
                candidates = [n for n in candidates if n not in self.intermittent]
        wall = time.monotonic() - wall
        return self.report(fork_res, pristine_res, flaky, known, broken, wall)

    def _is_fix_test(self, nodeid: str) -> bool:
        """Whether a node id is one of the tests the fixes layer adds."""
        parts = nodeid.split("::")
        return (parts[0], parts[-1].split("[")[0]) in self.fix_tests

    def report(self, fork_res, pristine_res, flaky, known, broken, wall) -> int:
        args = self.args
        fork_fail = fork_res.failing()
        both, fork_only = [], []
        for n in fork_fail:
            on_pristine = pristine_res.outcomes.get(n) in FAILING
            (both if on_pristine and not self._is_fix_test(n) else fork_only).append(n)
        by_entry: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
        unexplained = []
        for n in both:
            entry = known.match(n)
            if entry is None:
                unexplained.append(n)
            else:
                by_entry[entry].append(n)
        print("\n== upstream-tests summary")
        print("time per target:")
        for side, target, res in self.timings:
            print(
                f"  {side:8} {target:34} {res.seconds:6.0f} s wall "
                f"{res.cpu_seconds:6.0f} s cpu  {_fmt_counts(res)}"
            )
            for part_side, part_target, part in self.parts:
                if target == "targets" and part_side == side:
                    print(
                        f"  {'':8}   {part_target:32} {part.seconds:6.0f} s of "
                        "test time"
                    )
        print(f"selection: {self.selection}")
        if args.start_method == "forkserver":
            print(f"start method: forkserver, preloading {FORKSERVER_PRELOAD}")
        else:
            print("start method: torchrl's default (spawn)")
        print(f"fork:     {_fmt_counts(fork_res)} (after the serial retry)")
        if args.sides == "both":
            print(f"pristine: {_fmt_counts(pristine_res)} (after the serial retry)")
        else:
            print(
                f"pristine: {len(pristine_res.outcomes)} of the fork's failing "
                f"tests rerun: {_fmt_counts(pristine_res)}"
            )
        cpu = sum(r.cpu_seconds for _, _, r in self.timings)
        print(
            f"wall time: {wall / 60:.1f} min; cpu time of the pytest runs: "
            f"{cpu / 60:.1f} min (load average now: {os.getloadavg()[0]:.1f})"
        )
        if flaky:
            print(
                f"\nflaky on the fork (failed under load, passed alone): {len(flaky)}"
            )
            for n in flaky:
                print(f"  {n}")
        if self.intermittent:
            print(
                "\nfailing on pristine too in a confirmation run (intermittent "
                f"there): {len(self.intermittent)}"
            )
            for n in self.intermittent:
                print(f"  {n}")
        print(
            f"\nknown failures on pristine too ({args.known}): {len(both) - len(unexplained)}"
        )
        for (pattern, reason), ids in sorted(by_entry.items()):
            print(f"  {len(ids):4} x {pattern}  -- {reason}")
        if known.entries:
            matched = {p for p, _ in by_entry}
            stale = [p for p, _, _ in known.entries if p not in matched]
            whole = len(args.targets) == len(TARGETS) and self.deselect is None
            if stale and (args.sides == "both" or whole):
                print(f"known entries that no longer fail on the fork: {len(stale)}")
                for p in stale:
                    print(f"  {p}")
        if unexplained:
            print(
                f"\nfailing on both sides, not in {args.known} "
                f"(add them with a reason): {len(unexplained)}"
            )
            for n in unexplained:
                print(f"  {n}  -- {fork_res.messages.get(n, '')}")
        # A test file that does not collect runs none of its tests, on either
        # side: nothing in it is compared (a fix's test hunk can cause it).
        uncollected = [n for n in unexplained if "::" not in n]
        if uncollected:
            print(
                f"\nTEST FILES THAT DO NOT COLLECT (none of their tests ran): "
                f"{len(uncollected)}"
            )
            for n in uncollected:
                print(f"  {n}")
        if args.sides == "both":
            fixed = sorted(
                n
                for n, o in pristine_res.outcomes.items()
                if o in FAILING and fork_res.outcomes.get(n) == "passed"
            )
            if fixed:
                print(f"\nfailing on pristine only (the fork fixes them): {len(fixed)}")
                for n in fixed:
                    print(f"  {n}")
            only = sorted(set(pristine_res.outcomes) ^ set(fork_res.outcomes))
            if only:
                print(f"\ncollected on one side only: {len(only)}")
                for n in only[:50]:
                    side = "fork" if n in fork_res.outcomes else "pristine"
                    print(f"  {side}: {n}")
        if fork_only:
            print(
                f"\nFORK-ONLY FAILURES (pass on pristine, fail on the fork): {len(fork_only)}"
            )
            for n in fork_only:
                p = _outcome_or_children(pristine_res, n)
                print(f"  {n}  [pristine: {p}]  -- {fork_res.messages.get(n, '')}")
            for n in fork_only[: args.tracebacks]:
                print(f"\n---- {n}\n{fork_res.longreprs.get(n, '').rstrip()}")
        if broken:
            print("\nruns that broke:")
            for b in broken:
                print(f"  {b}")
        report = {
            "fork": fork_res.outcomes,
            "pristine": pristine_res.outcomes,
            "fork_messages": {n: fork_res.messages.get(n, "") for n in fork_fail},
            "fork_only": fork_only,
            "flaky": flaky,
            "intermittent_on_pristine": self.intermittent,
            "unexplained": unexplained,
            "timings": [[s, t, r.seconds, r.cpu_seconds] for s, t, r in self.timings],
        }
        (self.out / "report.json").write_text(json.dumps(report, indent=1))
        print(f"\nfull outcomes: {self.out / 'report.json'}")
        c = fork_res.counts()
        if broken:
            status, rc = "BROKEN RUN (see above)", 2
        elif fork_only or uncollected:
            status, rc = "FAIL", 1
        else:
            status, rc = "OK", 0
        print(
            f"upstream-tests: {status}, fork-only failures: {len(fork_only)}; "
            f"on the fork {c['passed']} pass, {len(fork_fail)} fail "
            f"({len(both)} on pristine too), {c['skipped']} skip"
        )
        return rc


def _in_targets(path: str, targets: list[str]) -> bool:
    return any(path == t or path.startswith(t.rstrip("/") + "/") for t in targets)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _outcome_or_children(res: Result, nodeid: str) -> str:
    """The outcome of ``nodeid``; for a module or class, those of its tests."""
    if nodeid in res.outcomes:
        return res.outcomes[nodeid]
    children = [o for n, o in res.outcomes.items() if n.startswith(nodeid + "::")]
    if not children:
        return "not collected"
    c = collections.Counter(children)
    return "its tests: " + ", ".join(f"{k}={v}" for k, v in sorted(c.items()))


def _fmt_counts(res: Result, unit: str = "s") -> str:
    c = res.counts()
    return (
        f"pass={c['passed']} fail={c['failed']} error={c['error']} "
        f"skip={c['skipped']} ({res.seconds:.0f} {unit})"
    )


def _part(res: Result, target: str) -> Result:
    """The outcomes of ``res`` under ``target``; its seconds are their test time."""
    part = Result()
    for nodeid, outcome in res.outcomes.items():
        if _in_targets(nodeid.split("::")[0], [target]):
            part.outcomes[nodeid] = outcome
            part.durations[nodeid] = res.durations.get(nodeid, 0.0)
    part.seconds = sum(part.durations.values())
    return part


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tests",
        default=str(ROOT.parent / "shared" / "upstream-tests-v0.12.0"),
        help="upstream's test tree (holds test/ and pytest.ini)",
    )
    parser.add_argument("--fork", default=str(ROOT / "build" / "fork"))
    parser.add_argument("--pristine", default=str(ROOT / "build" / "upstream"))
    parser.add_argument("--sides", choices=("rerun", "both"), default="rerun")
    parser.add_argument(
        "--known", default=str(ROOT / ".ci" / "upstream-pristine-failures.txt")
    )
    parser.add_argument("--targets", nargs="+", default=list(TARGETS))
    parser.add_argument(
        "--confirm",
        type=int,
        default=2,
        help="serial pristine reruns of a test that fails on the fork only",
    )
    parser.add_argument(
        "-n",
        "--workers",
        type=int,
        default=2,
        help="xdist workers (default 2; 3 on 2 cores made every test slower: "
        "the suite is CPU-bound)",
    )
    parser.add_argument(
        "--timeout", type=int, default=300, help="seconds per test; 0: no limit"
    )
    parser.add_argument("--out", default=str(ROOT / "build" / "upstream-tests"))
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument(
        "--fixes",
        default=str(ROOT / "upstream-fixes"),
        help="the fixes layer, whose regression tests are added to the suite",
    )
    parser.add_argument(
        "--map",
        default=str(ROOT / ".ci" / "upstream-test-map.json.gz"),
        help="the test-impact map (.ci/upstream_map.py)",
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help="run every test, not only those the test-impact map selects",
    )
    parser.add_argument(
        "--record-map",
        action="store_true",
        help="run pristine only, recording what each test executes (upstream_map.py)",
    )
    parser.add_argument(
        "--start-method",
        choices=("forkserver", "default"),
        default="forkserver",
        help="the default multiprocessing start method of the tests, on both "
        "sides: 'forkserver' (workers still start from a pickled process, "
        "as with spawn, but torch, tensordict and torchrl are imported once "
        "per server: about half the time of the multiprocess tests) or "
        "'default' (torchrl's own default, spawn)",
    )
    parser.add_argument(
        "--tracebacks", type=int, default=10, help="fork-only tracebacks to print"
    )
    parser.add_argument(
        "pytest_args", nargs="*", help="after --: extra pytest arguments"
    )
    return Runner(parser.parse_args(argv)).main()


if __name__ == "__main__":
    sys.exit(main())

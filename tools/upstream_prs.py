# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""The fixes layer as upstream pull requests (``python tools/upstream_prs.py --help``).

``upstream-fixes/series`` lists, in order, one ``git format-patch`` file per
bug fix to pristine TorchRL v0.12.0: its subject and body are the PR text, its
diff touches upstream's sources (``torchrl/``) and upstream's own tests
(``test/``). ``tools/fork.py`` lays the source hunks under the overlay;
``make upstream-tests`` adds the test hunks to its copy of upstream's suite.

- ``workspace`` lays ``build/fixes``: a git repository of pristine ``torchrl/``
  and upstream's ``test/``, tagged ``pristine``, with one commit per fix
  (``git am``). Edit there with git (``commit --amend``, ``rebase -i``), then
- ``export`` writes the commits back as the series (``git format-patch``).
- ``check`` (``make upstream-prs``) checks every fix on its own: it applies to
  pristine (sources and tests); the tests it adds fail on pristine and pass
  with it; upstream's flake8 and ufmt pass on the files it touches; and the
  whole series applies in order. It writes each fix and its PR text into
  ``dist/upstream-prs/``.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import email
import email.policy
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fork import (  # noqa: E402
    apply_fixes,
    bullets,
    fix_series,
    FIXES,
    Fork,
    ForkError,
    git,
    PACKAGE,
)

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT.parent / "shared" / "upstream-tests-v0.12.0"
# ``git format-patch`` with stable bytes: no commit ids, no version signature.
FORMAT_PATCH = "format-patch --zero-commit --no-signature --no-numbered".split()
FORMAT_PATCH += "--no-stat -U3 --diff-algorithm=myers".split()
TEST_DEF = re.compile(r"^\s*def (test_\w+)\(", flags=re.M)
MAX_SOURCE_LINES = 60


def _lay(dest: Path, tests: Path, fork: Fork, binaries: bool = False) -> Path:
    """Pristine ``torchrl/`` (with its compiled extension when asked) and upstream's tests."""
    pristine = fork.ensure_upstream()
    ignore = None if binaries else shutil.ignore_patterns("*.so", ".pristine-sha256")
    shutil.copytree(pristine / PACKAGE, dest / PACKAGE, ignore=ignore)
    for name in ("test", "pytest.ini", "setup.cfg"):
        src = tests / name
        if src.is_dir():
            shutil.copytree(src, dest / name)
        elif src.is_file():
            shutil.copyfile(src, dest / name)
    return dest


def workspace(fork: Fork, tests: Path) -> Path:
    dest = fork.build / "fixes"
    if (dest / ".git").is_dir():
        status = git("status", "--porcelain", cwd=dest).stdout.strip()
        ahead = git("log", "--oneline", "pristine..HEAD", cwd=dest).stdout
        if status or len(ahead.splitlines()) != len(fix_series(fork.root / FIXES)):
            raise ForkError(
                f"{dest} holds work that the series does not: export it first, or "
                "delete the folder"
            )
    shutil.rmtree(dest, ignore_errors=True)
    _lay(dest, tests, fork)
    (dest / ".gitignore").write_text("__pycache__\n*.py[co]\n.pytest_cache\n")
    git("init", "-q", cwd=dest)
    git("add", "-A", cwd=dest)
    git("commit", "-q", "--no-gpg-sign", "-m", "pristine", cwd=dest)
    git("tag", "pristine", cwd=dest)
    for path in fix_series(fork.root / FIXES):
        git(
            "am",
            "-q",
            "--keep-cr",
            "--keep-non-patch",
            cwd=dest,
            input=path.read_bytes(),
        )
    return dest


def export(fork: Fork) -> list[str]:
    src, folder = fork.build / "fixes", fork.root / FIXES
    if git("status", "--porcelain", cwd=src).stdout.strip():
        raise ForkError(f"{src} has uncommitted changes: commit them first")
    with tempfile.TemporaryDirectory() as tmp:
        git(*FORMAT_PATCH, "-o", tmp, "pristine..HEAD", cwd=src)
        made = sorted(Path(tmp).glob("*.patch"))
        folder.mkdir(exist_ok=True)
        for old in folder.glob("*.patch"):
            old.unlink()
        for path in made:
            shutil.copyfile(path, folder / path.name)
    (folder / "series").write_text("".join(p.name + "\n" for p in made))
    return [p.name for p in made]


def _message(path: Path) -> tuple[str, str]:
    """The subject (without ``[PATCH]``) and the body of a format-patch file."""
    msg = email.message_from_bytes(path.read_bytes(), policy=email.policy.default)
    subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", str(msg["Subject"]))
    body = msg.get_content().split("\n---\n", 1)[0]
    return " ".join(subject.split()), body.strip()


def _touched(patch: bytes) -> list[str]:
    return re.findall(r"^\+\+\+ b/(\S+)$", patch.decode(), flags=re.M)


def _source_lines(patch: bytes) -> int:
    """Changed lines of the patch's ``torchrl/`` files."""
    count, source = 0, False
    for line in patch.decode().splitlines():
        if line.startswith("diff --git "):
            source = line.split()[-1].startswith(f"b/{PACKAGE}/")
        elif source and line[:1] in "+-" and not line.startswith(("+++", "---")):
            count += 1
    return count


def _run_tests(tree: Path, files: list[str], names: list[str], python: str) -> dict:
    """Runs the tests ``names`` of ``files`` in ``tree``; returns ``{nodeid: outcome}``."""
    report = tree / "report.xml"
    report.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(tree), "RL_WARNINGS": "0"}
    env["PATH"] = os.pathsep.join([str(Path(python).parent), env.get("PATH", "")])
    cmd = [python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-p", "no:xdist"]
    selected = " or ".join(sorted({n.split("::")[-1] for n in names}))
    cmd += ["--timeout=300", f"--junitxml={report}", "-k", selected, *files]
    subprocess.run(cmd, cwd=tree, env=env, capture_output=True)
    if not report.is_file():
        return {}
    outcomes = {}
    for case in ET.parse(report).iter("testcase"):
        node = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        outcomes[node] = (
            "failed"
            if kinds & {"failure", "error"}
            else "skipped"
            if "skipped" in kinds
            else "passed"
        )
    return outcomes


def _depends_on(body: str, series: list[Path], path: Path) -> list[Path]:
    """The earlier fixes that a ``Depends-on: NNNN`` line of the PR text names.

    A fix whose hunks touch lines another fix changed cannot apply to pristine
    alone; upstream it would be a stacked PR. It is checked on pristine with
    those fixes applied.
    """
    wanted = re.findall(r"^Depends-on:\s*(.+)$", body, flags=re.M)
    numbers = [n for line in wanted for n in re.findall(r"\b(\d{4})\b", line)]
    earlier = series[: series.index(path)] if path in series else series
    deps = []
    for number in numbers:
        match = [p for p in earlier if p.name.startswith(number + "-")]
        if not match:
            raise ForkError(
                f"{path.name}: 'Depends-on: {number}' names no earlier fix of the series"
            )
        deps.append(match[0])
    return deps


def check_fix(
    path: Path, fork: Fork, tests: Path, python: str, series: list[Path] = ()
) -> list[str]:
    """What is wrong with one fix, checked on its own against pristine.

    "Pristine" is pristine v0.12.0 with only the fixes that the PR text names
    in a ``Depends-on:`` line applied first.
    """
    patch, problems = path.read_bytes(), []
    subject, body = _message(path)
    try:
        deps = _depends_on(body, list(series), path)
    except ForkError as err:
        return [str(err)]
    if not body:
        problems.append("no PR text: the commit message has no body")
    lines = _source_lines(patch)
    if lines > MAX_SOURCE_LINES and "Size:" not in body:
        problems.append(
            f"{lines} changed source lines (more than {MAX_SOURCE_LINES}): split it, "
            "or say why in a 'Size:' paragraph of its message"
        )
    touched = _touched(patch)
    test_files = [t for t in touched if t.startswith("test/")]
    if not test_files:
        return problems + ["adds no regression test to upstream's test files"]
    with tempfile.TemporaryDirectory() as tmp:
        tree = _lay(Path(tmp) / "tree", tests, fork, binaries=True)
        for dep in deps:
            proc = git("apply", cwd=tree, check=False, input=dep.read_bytes())
            if proc.returncode != 0:
                return problems + [
                    f"{dep.name}, which it depends on, does not apply to pristine: "
                    f"{proc.stderr.decode()}"
                ]
        proc = git("apply", "--check", cwd=tree, check=False, input=patch)
        if proc.returncode != 0:
            return problems + [f"does not apply to pristine: {proc.stderr.decode()}"]
        old_names, old_style = _test_names(tree, test_files), _style(
            tree, touched, python, cached=True
        )
        git("apply", cwd=tree, input=patch)
        names = sorted(_test_names(tree, test_files) - old_names)
        if not names:
            return problems + ["adds no regression test to upstream's test files"]
        git("apply", "-R", cwd=tree, input=patch)
        before = _run_tests(tree, test_files, names, python)
        git("apply", cwd=tree, input=patch)
        after = _run_tests(tree, test_files, names, python)
        if not after:
            return problems + ["its tests did not run (collection error?)"]
        names = {n.split("::")[-1] for n in names}
        problems += _judge(names, before, after)
        new_style = _style(tree, touched, python)
        for tool, lines in new_style.items():
            added = [line for line in lines if line not in old_style[tool]]
            if added:
                problems.append(f"{tool}: {bullets(added)}")
    return problems


def _judge(names: set[str], before: dict, after: dict) -> list[str]:
    """What is wrong with the outcomes of a fix's new tests ``names``.

    ``before`` and ``after`` map node ids to outcomes on pristine and with the
    fix. Each new test must run and pass with the fix and fail on pristine;
    any other node failing with the fix is a file that no longer collects.
    """
    problems = []
    ran = {node.split("::")[-1].split("[")[0] for node in after}
    for name in sorted(names - ran):
        # e.g. a test inserted under another test's decorators: the file no
        # longer collects, and none of its tests run
        problems.append(f"{name}: did not run with the fix (collection error?)")
    for node, outcome in sorted(after.items()):
        if node.split("::")[-1].split("[")[0] not in names:
            if outcome == "failed":
                problems.append(f"{node}: fails with the fix (collection error?)")
        elif outcome != "passed":
            problems.append(f"{node}: {outcome} with the fix")
        elif before.get(node) == "passed":
            problems.append(f"{node}: passes on pristine too: it tests nothing new")
    return problems


def _test_names(tree: Path, files: list[str]) -> set[str]:
    return {
        f"{rel}::{name}"
        for rel in files
        if (tree / rel).is_file()
        for name in TEST_DEF.findall((tree / rel).read_text())
    }


# ``(path, sha256 of its bytes) -> _style`` of that one file. The fixes without
# a ``Depends-on:`` all start from the same pristine files (``test/test_rb.py``
# and the like, slow to lint): each is linted once, whichever fix asks first.
_STYLE_CACHE: dict[tuple[str, str], dict[str, list[str]]] = {}


def _style(
    tree: Path, files: list[str], python: str, cached: bool = False
) -> dict[str, list[str]]:
    """What upstream's flake8 and ufmt say of ``files``, less line numbers.

    Compared before and after a fix: a fix must add no complaint (upstream's
    files are not all clean under the pinned tools). With ``cached``, each
    file is linted alone and its result kept by content, for the next fix
    that touches the same bytes (the output names no line and no tree, so it
    depends on nothing else).
    """
    files = [f for f in files if f.endswith(".py") and (tree / f).is_file()]
    if cached:
        out = {"flake8": [], "ufmt": []}
        for rel in files:
            key = (rel, hashlib.sha256((tree / rel).read_bytes()).hexdigest())
            if key not in _STYLE_CACHE:  # two threads may both lint it: same answer
                _STYLE_CACHE[key] = _style(tree, [rel], python)
            for tool, lines in _STYLE_CACHE[key].items():
                out[tool] += lines
        return out
    cfg = ["--config", str(tree / "setup.cfg")]
    out = {}
    for tool in (["flake8", *cfg], ["ufmt", "diff"]):
        proc = subprocess.run(
            [python, "-m", *tool, *files], cwd=tree, capture_output=True
        )
        text = (proc.stdout + proc.stderr).decode(errors="replace")
        if tool[0] == "flake8":
            lines = [re.sub(r":\d+:\d+:", ":", line) for line in text.splitlines()]
        else:  # the changed lines of the diff ufmt would make
            lines = [
                line
                for line in text.splitlines()
                if line[:1] in "+-" and not line.startswith(("+++", "---"))
            ]
        out[tool[0]] = lines
    return out


def check(fork: Fork, tests: Path, python: str, out: Path, jobs: int = 1) -> int:
    series = fix_series(fork.root / FIXES)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        try:  # the whole series, in order, sources and tests
            apply_fixes(fork.root / FIXES, _lay(Path(tmp) / "all", tests, fork), "*")
        except ForkError as err:
            print(f"upstream-prs: the series does not apply in order: {err}")
            failed += 1
    for path in series:
        subject, body = _message(path)
        shutil.copyfile(path, out / path.name)
        (out / path.with_suffix(".md").name).write_text(f"# {subject}\n\n{body}\n")
    # Each fix is checked in a tree of its own: ``jobs`` of them at a time (most
    # of a check is two pytest processes importing torch and a test file).
    with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
        results = pool.map(
            lambda path: check_fix(path, fork, tests, python, series), series
        )
        for path, problems in zip(series, results):
            size = _source_lines(path.read_bytes())
            status = "FAILED" if problems else "ok"
            print(
                f"upstream-prs: {status:6} {path.name} ({size} source lines)"
                f"{bullets(problems)}",
                flush=True,
            )
            failed += bool(problems)
    print(
        f"upstream-prs: {len(series) - failed} of {len(series)} fixes pass their "
        f"checks; patches and PR texts in {out}"
    )
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="upstream_prs.py", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--tests", type=Path, default=TESTS, help="upstream's test suite"
    )
    parser.add_argument("--python", default=sys.executable, help="the interpreter")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "dist" / "upstream-prs", help="output folder"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="fixes checked at a time (default: the number of CPUs)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("workspace", help="lay build/fixes, one commit per fix")
    sub.add_parser("export", help="write build/fixes back as the series")
    sub.add_parser("check", help="check every fix and write the PRs")
    args = parser.parse_args(argv)
    fork = Fork(ROOT)
    try:
        if not (args.tests / "test").is_dir():
            raise ForkError(f"no test/ folder in {args.tests}: pass --tests")
        if args.command == "workspace":
            print(f"upstream-prs: fixes workspace in {workspace(fork, args.tests)}")
        elif args.command == "export":
            print("\n".join(export(fork)) or "upstream-prs: no fixes")
        else:
            return check(fork, args.tests, args.python, args.out, args.jobs)
    except ForkError as err:
        print(f"upstream-prs {args.command}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""The test-impact map of upstream's suite: which tests can see what the fork changes.

``make upstream-test-map`` runs upstream TorchRL v0.12.0's own suite on
pristine ``build/upstream`` under ``coverage`` (``.ci/upstream_impact.py``)
and folds what each test executed into ``.ci/upstream-test-map.json.gz``: for
every function (and class body) of the ``torchrl`` package, the tests that ran
one of its lines, in the test itself, its function-scoped fixtures or a wider
fixture it uses. ``make upstream-tests`` then runs, of the tests the map knows,
only those that execute a function the fork changes, and every test the map
has never seen.

What counts as changed (``git diff upstream`` in ``build/fork``, line by line):

- a line inside a function that pristine has: that function;
- a line in a class body, or a new method of a class that pristine has: every
  function of that class and its body (a new method may override an inherited
  one, a class attribute reaches every method);
- a line at module level: nothing for imports and for new top-level functions
  and classes (only changed code, selected above, reaches them); for any other
  statement, every function of the module;
- a file that pristine lacks (a new module): nothing by itself, for the same
  reason.

What the map cannot see, and how it is covered: code run in a subprocess (a
``ParallelEnv`` worker, a multiprocess collector) is not measured; those tests
build the same classes in the test process, so they are selected through it.
A test that failed on pristine while the map was recorded is left out of the
map, so it always runs. The map records the sha256 of every pristine module
and of the suite: ``check`` fails when the pinned base no longer matches, and
``make upstream-tests`` runs everything when the suite is another one.
"""
from __future__ import annotations

import argparse
import ast
import base64
import collections
import gzip
import hashlib
import json
import re
import subprocess
import sys
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAP = ROOT / ".ci" / "upstream-test-map.json.gz"
PACKAGE = "torchrl"
MODULE = "<module>"
BODY = "<body>"
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@", flags=re.M)


# -- scopes: which function or class body a line belongs to --------------------


class Scopes:
    """Maps each line of a module to the innermost function or class around it."""

    def __init__(self, source: str):
        tree = ast.parse(source)
        self.n = len(source.splitlines())
        self.line_scope: list[str] = [MODULE] * (self.n + 2)
        self.classes: set[str] = set()
        self.functions: set[str] = set()
        # docstrings change no behaviour
        self.doc_lines: set[int] = set()
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if isinstance(body, list) and body and _is_docstring(body[0]):
                self.doc_lines.update(range(body[0].lineno, body[0].end_lineno + 1))
        # the names a class-body statement binds (None: not only bindings)
        self.binds: dict[int, frozenset[str] | None] = {}
        # top-level statement (first, last line, kind) of each module-level line
        self.module_stmt: dict[int, str] = {}
        for stmt in tree.body:
            start = min([stmt.lineno] + [d.lineno for d in _decorators(stmt)])
            for line in range(start, stmt.end_lineno + 1):
                self.module_stmt[line] = type(stmt).__name__
        self._walk(tree.body, "")

    def _walk(self, body, prefix: str) -> None:
        for node in body:
            if _is_scope(node):
                name = f"{prefix}{node.name}"
                start = min([node.lineno] + [d.lineno for d in _decorators(node)])
                if isinstance(node, ast.ClassDef):
                    self.classes.add(name)
                    scope = f"{name}.{BODY}"
                    for stmt in node.body:
                        names = _bound_names(stmt)
                        for line in range(stmt.lineno, stmt.end_lineno + 1):
                            self.binds[line] = names
                else:
                    self.functions.add(name)
                    scope = name
                for line in range(start, node.end_lineno + 1):
                    self.line_scope[line] = scope
                self._walk(node.body, name + ".")
            else:
                # scopes nested in compound statements (if/try/with blocks)
                for field in ("body", "orelse", "finalbody", "handlers"):
                    inner = getattr(node, field, None)
                    if isinstance(inner, list):
                        self._walk([n for n in inner if isinstance(n, ast.AST)], prefix)

    def scope(self, line: int) -> str:
        return self.line_scope[line] if 0 < line <= self.n else MODULE


def _bound_names(stmt) -> frozenset[str] | None:
    """What a class-body statement binds, when binding names is all it does."""
    if _is_scope(stmt):
        return frozenset([stmt.name])
    targets = []
    if isinstance(stmt, ast.Assign):
        targets = stmt.targets
    elif isinstance(stmt, ast.AnnAssign):
        targets = [stmt.target]
    if targets and all(isinstance(t, ast.Name) for t in targets):
        return frozenset(t.id for t in targets)
    return None


def _words(pristine: Path) -> set[str]:
    """Every word of pristine torchrl's source: the names any of its code can reach."""
    words: set[str] = set()
    for path in (pristine / PACKAGE).rglob("*.py"):
        words.update(re.findall(r"\w+", path.read_text(encoding="utf-8")))
    return words


def _is_docstring(node) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def _is_scope(node) -> bool:
    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))


def _decorators(node) -> list:
    return list(getattr(node, "decorator_list", []))


def _class_of(scope: str, classes: set[str]) -> str | None:
    """The outermost class that ``scope`` (a function or a class body) belongs to.

    The outermost: a nested class (such as a loss's ``_AcceptedKeys``) has its
    body run at import, and is read by the methods of the class around it.
    """
    parts = scope.split(".")
    for k in range(1, len(parts)):
        if ".".join(parts[:k]) in classes:
            return ".".join(parts[:k])
    return None


# -- building the map ------------------------------------------------------------


def _encode(indices) -> str:
    """Sorted test indices as zlib'ed varint deltas, base64: a compact string."""
    out, last = bytearray(), -1
    for i in sorted(indices):
        d = i - last
        last = i
        while d >= 0x80:
            out.append((d & 0x7F) | 0x80)
            d >>= 7
        out.append(d)
    return base64.b64encode(zlib.compress(bytes(out), 9)).decode()


def _decode(text: str) -> list[int]:
    raw, out, cur, shift, last = zlib.decompress(base64.b64decode(text)), [], 0, 0, -1
    for b in raw:
        cur |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            last += cur
            out.append(last)
            cur, shift = 0, 0
    return out


def suite_sha256(tests: Path) -> str:
    """One hash of the suite's files (paths and bytes)."""
    h = hashlib.sha256()
    for path in sorted((tests / "test").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(tests)).encode() + b"\0")
            h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def base_sha256(pristine: Path) -> dict[str, str]:
    return {
        str(p.relative_to(pristine)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((pristine / PACKAGE).rglob("*.py"))
    }


def build(runs: list[Path], pristine: Path, tests: Path, out: Path) -> None:
    """Folds one or more ``--record-map`` runs (their targets) into the map."""
    import coverage

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from upstream_tests import parse_outcomes

    outcomes: dict[str, tuple[str, float]] = {}
    for run in runs:
        for path in sorted(run.glob("[0-9][0-9]-pristine-*.jsonl")):
            res = parse_outcomes(path)
            for n, o in res.outcomes.items():
                outcomes[n] = (o, res.durations.get(n, 0.0))
    # Only tests that passed or skipped on pristine are mapped: the others
    # (failing there, or whose coverage a timeout cut short) always run.
    names = sorted(n for n, (o, _) in outcomes.items() if o in ("passed", "skipped"))
    index = {n: i for i, n in enumerate(names)}
    wide: dict[str, list[str]] = {}
    for run in runs:
        for path in sorted((run / "impact").glob("fixtures.*.jsonl")):
            for line in path.read_text().splitlines():
                nodeid, fixtures = json.loads(line)
                wide[nodeid] = [f"fixture {s} {b}::{a}" for s, b, a in fixtures]
    users: dict[str, set[int]] = collections.defaultdict(set)
    for nodeid, contexts in wide.items():
        if nodeid in index:
            for c in contexts:
                users[c].add(index[nodeid])
    root = (pristine / PACKAGE).resolve()
    per_scope: dict[str, dict[str, set[int]]] = collections.defaultdict(
        lambda: collections.defaultdict(set)
    )
    scopes_cache: dict[str, Scopes] = {}
    data_files = [f for run in runs for f in sorted((run / "impact").glob("cov.*"))]
    for data_file in data_files:
        data = coverage.CoverageData(str(data_file))
        data.read()
        for measured in data.measured_files():
            path = Path(measured).resolve()
            if root not in path.parents:
                continue
            rel = str(path.relative_to(pristine.resolve()))
            if rel not in scopes_cache:
                scopes_cache[rel] = Scopes(path.read_text(encoding="utf-8"))
            scopes = scopes_cache[rel]
            for line, contexts in data.contexts_by_lineno(measured).items():
                scope = scopes.scope(line)
                for c in contexts:
                    if c in index:
                        per_scope[rel][scope].add(index[c])
                    elif c in users:
                        per_scope[rel][scope].update(users[c])
    result = {
        "version": 1,
        "suite_sha256": suite_sha256(tests),
        "base_sha256": base_sha256(pristine),
        "tests": names,
        "failing_on_pristine": sorted(
            n for n, (o, _) in outcomes.items() if o in ("failed", "error")
        ),
        "durations": [round(outcomes[n][1], 2) for n in names],
        "files": {
            rel: {s: _encode(ix) for s, ix in sorted(scopes.items())}
            for rel, scopes in sorted(per_scope.items())
        },
    }
    with gzip.GzipFile(out, "wb", mtime=0) as f:
        f.write(json.dumps(result, sort_keys=True).encode())
    print(
        f"upstream-map: {len(names)} tests, {len(per_scope)} modules, "
        f"{sum(len(s) for s in per_scope.values())} scopes -> {out} "
        f"({out.stat().st_size / 1e6:.1f} MB)"
    )


# -- what the fork changes -------------------------------------------------------


def changed_lines(fork: Path) -> dict[str, tuple[list[int], list[int]]]:
    """For each modified upstream module: (pristine lines removed, fork lines added)."""
    diff = subprocess.run(
        ["git", "diff", "-U0", "--no-renames", "--no-color", "--no-ext-diff"]
        + ["--diff-filter=M", "upstream", "--", f"{PACKAGE}/*.py"],
        cwd=fork,
        check=True,
        capture_output=True,
        text=True,
        env={"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"},
    ).stdout
    result: dict[str, tuple[list[int], list[int]]] = {}
    for chunk in re.split(r"^diff --git ", diff, flags=re.M)[1:]:
        rel = re.match(r"a/(\S+)", chunk).group(1)
        removed, added = result.setdefault(rel, ([], []))
        for m in HUNK.finditer(chunk):
            a, b = int(m.group(1)), int(m.group(2) or 1)
            c, d = int(m.group(3)), int(m.group(4) or 1)
            removed.extend(range(a, a + b))
            added.extend(range(c, c + d))
    return result


def changed_scopes(fork: Path, pristine: Path) -> dict[str, set[str]]:
    """For each modified module, the pristine scopes whose tests must run.

    ``"*"`` stands for every scope of the module, ``"Cls.*"`` for every scope
    of class ``Cls``.
    """
    result: dict[str, set[str]] = {}
    words = _words(pristine)
    for rel, (removed, added) in changed_lines(fork).items():
        old_src = (pristine / rel).read_text(encoding="utf-8")
        new_src = (fork / rel).read_text(encoding="utf-8")
        old, new = Scopes(old_src), Scopes(new_src)
        new_lines = new_src.splitlines()
        wanted: set[str] = set()
        for side, lines, src_lines in (
            (old, removed, old_src.splitlines()),
            (new, added, new_lines),
        ):
            for line in lines:
                text = src_lines[line - 1].strip() if line <= len(src_lines) else ""
                if not text or text.startswith("#") or line in side.doc_lines:
                    continue
                scope = side.scope(line)
                if scope == MODULE:
                    kind = side.module_stmt.get(line)
                    if kind not in ("Import", "ImportFrom", None):
                        wanted.add("*")
                    continue
                owner = _class_of(scope, side.classes)
                top = scope.split(".")[0]
                if (
                    side is new
                    and owner in old.classes
                    and _new_names(scope, owner, line, new, old, words)
                ):
                    # a method or attribute under a name that no pristine
                    # code uses: only changed code reaches it
                    continue
                if scope.endswith(BODY) or scope not in old.functions:
                    # a class body, or a function pristine lacks
                    if owner is not None and owner in old.classes:
                        wanted.add(f"{owner}.*")
                    elif owner is None and top in old.functions | old.classes:
                        wanted.add(top if top in old.functions else f"{top}.*")
                    # else: a new top-level function or class, reached only
                    # through changed code
                    continue
                wanted.add(scope)
        result[rel] = wanted
    return result


def _new_names(scope, owner, line, new: Scopes, old: Scopes, words) -> bool:
    """Whether the fork's ``line`` of class ``owner`` only adds names pristine never uses."""
    rest = scope[len(owner) + 1 :].split(".")
    if rest[0] != BODY:
        member = f"{owner}.{rest[0]}"
        if member in new.classes and member not in old.classes:
            return rest[0] not in words  # a new nested class
        if member in old.functions or member in old.classes:
            return False  # inside a member pristine has
        return rest[0] not in words  # a new method
    names = new.binds.get(line)
    return bool(names) and not (names & words)


def _matches(scope: str, wanted: set[str]) -> bool:
    if "*" in wanted or scope in wanted:
        return True
    parts = scope.split(".")
    return any(".".join(parts[:k]) + ".*" in wanted for k in range(1, len(parts)))


class Map:
    def __init__(self, path: Path = MAP):
        with gzip.open(path, "rb") as f:
            self.data = json.loads(f.read())
        self.tests: list[str] = self.data["tests"]

    def stale(self, pristine: Path, fork: Path | None = None) -> list[str]:
        """What no longer matches: pristine modules whose bytes changed, or are new."""
        problems = []
        recorded = self.data["base_sha256"]
        for rel, sha in base_sha256(pristine).items():
            if recorded.get(rel) != sha:
                problems.append(f"{rel}: pristine is not what the map was recorded on")
        if fork is not None:
            for rel in changed_lines(fork):
                if rel not in recorded:
                    problems.append(f"{rel}: patched, but not in the map")
        return problems

    def select(self, wanted: dict[str, set[str]]) -> tuple[set[str], dict[str, int]]:
        """The mapped tests that can see a change, and how many each module adds."""
        chosen: set[int] = set()
        per_module: dict[str, int] = {}
        files = self.data["files"]
        for rel, scopes in sorted(wanted.items()):
            hit: set[int] = set()
            for scope, encoded in files.get(rel, {}).items():
                if _matches(scope, scopes):
                    hit.update(_decode(encoded))
            per_module[rel] = len(hit)
            chosen |= hit
        return {self.tests[i] for i in chosen}, per_module

    def seconds(self, names) -> float:
        d = dict(zip(self.tests, self.data["durations"]))
        return sum(d.get(n, 0.0) for n in names)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="fold a --record-map run into the map")
    b.add_argument(
        "--run",
        nargs="+",
        default=[str(ROOT / "build" / "upstream-map-run")],
        help="the --out folders of `upstream_tests.py --record-map` runs",
    )
    b.add_argument(
        "--tests", default=str(ROOT.parent / "shared" / "upstream-tests-v0.12.0")
    )
    b.add_argument("--out", default=str(MAP))
    s = sub.add_parser("show", help="what the map selects for build/fork today")
    s.add_argument("--map", default=str(MAP))
    c = sub.add_parser("check", help="fail when the map is stale for build/fork")
    c.add_argument("--map", default=str(MAP))
    for p in (b, s, c):
        p.add_argument("--pristine", default=str(ROOT / "build" / "upstream"))
        p.add_argument("--fork", default=str(ROOT / "build" / "fork"))
    args = parser.parse_args(argv)
    pristine, fork = Path(args.pristine), Path(args.fork)
    if args.cmd == "build":
        build([Path(r) for r in args.run], pristine, Path(args.tests), Path(args.out))
        return 0
    m = Map(Path(args.map))
    if args.cmd == "check":
        problems = m.stale(pristine, fork)
        for p in problems:
            print(f"upstream-map: stale: {p}")
        if problems:
            print("upstream-map: run `make upstream-test-map` to record it again")
        return 1 if problems else 0
    wanted = changed_scopes(fork, pristine)
    chosen, per_module = m.select(wanted)
    for rel, n in per_module.items():
        print(f"  {rel:55} {n:6} tests  {sorted(wanted[rel])[:6]}")
    total = m.seconds(m.tests)
    print(
        f"upstream-map: {len(chosen)} of {len(m.tests)} mapped tests see a change "
        f"({m.seconds(chosen) / 60:.0f} of {total / 60:.0f} test-minutes on pristine)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

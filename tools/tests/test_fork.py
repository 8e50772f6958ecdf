# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Tests of tools/fork.py on a fake, tiny upstream ``torchrl`` wheel."""
from __future__ import annotations

import base64
import csv
import hashlib
import io
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fork  # noqa: E402
from fork import Fork, ForkError  # noqa: E402

REAL_ROOT = Path(__file__).resolve().parent.parent.parent
UPSTREAM_FILES = {
    "torchrl/__init__.py": "from .core import answer\n",
    "torchrl/core.py": "".join(f"line_{i} = {i}\n" for i in range(30))
    + "\n\ndef answer():\n    return 42\n",
    "torchrl/sub/__init__.py": "",
    "torchrl/sub/util.py": "def double(x):\n    return 2 * x\n",
    "torchrl/no_newline.py": "x = 1",
    "benchmarks/bench_upstream.py": "",  # upstream's wheel ships more than torchrl
}
WHEEL_NAME = "torchrl-0.12.0-py3-none-any.whl"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"{name},sha256={digest.decode()},{len(data)}"


def make_wheel(path: Path, files: dict[str, str]) -> bytes:
    entries = {name: text.encode() for name, text in files.items()}
    info = "torchrl-0.12.0.dist-info"
    entries[
        f"{info}/METADATA"
    ] = b"Metadata-Version: 2.1\nName: torchrl\nVersion: 0.12.0\n"
    entries[
        f"{info}/WHEEL"
    ] = b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = [_record_line(n, d) for n, d in entries.items()] + [f"{info}/RECORD,,"]
    entries[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


@pytest.fixture
def repo(tmp_path: Path) -> Fork:
    """A checkout with a fake pinned upstream, synced, with an empty overlay."""
    data = make_wheel(tmp_path / "build" / "cache" / WHEEL_NAME, UPSTREAM_FILES)
    (tmp_path / "UPSTREAM.toml").write_text(
        "[torchrl]\n"
        'version = "0.12.0"\n'
        'local = "seqrl"\n'
        f'wheel = "{WHEEL_NAME}"\n'
        f'sha256 = "{hashlib.sha256(data).hexdigest()}"\n'
        'requires = ["torch>=2.1.0"]\n'
    )
    (tmp_path / "torchrl").mkdir()
    f = Fork(tmp_path)
    f.sync(extension=False)
    return f


def edit(f: Fork, rel: str, old: str, new: str) -> None:
    path = f.fork / rel
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def _overlay_bytes(f: Fork) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in (f.root / "torchrl").rglob("*") if p.is_file()}


def describe(f: Fork, rel: str) -> Path:
    """Gives a freshly exported patch a real description, as a developer would."""
    patch = f.root / rel
    patch.write_text(
        patch.read_text().replace(fork.PLACEHOLDER, "the fake gains a feature")
    )
    return patch


class TestSync:
    def test_materializes_pristine_and_overlay(self, repo: Fork):
        assert (repo.upstream / "torchrl/core.py").read_text() == UPSTREAM_FILES[
            "torchrl/core.py"
        ]
        assert repo.check() == []
        edit(repo, "torchrl/core.py", "return 42", "return 43")
        (repo.fork / "torchrl/new_mod.py").write_text("VALUE = 1\n")
        repo.export()
        describe(repo, "torchrl/core.py.patch")
        repo.sync()
        assert "return 43" in (repo.fork / "torchrl/core.py").read_text()
        assert (repo.fork / "torchrl/new_mod.py").read_text() == "VALUE = 1\n"
        assert "return 42" in (repo.upstream / "torchrl/core.py").read_text()
        assert repo.check() == []

    def test_refuses_to_drop_unexported_edits(self, repo: Fork):
        edit(repo, "torchrl/sub/util.py", "2 * x", "3 * x")
        with pytest.raises(ForkError, match=r"not exported[\s\S]*torchrl/sub/util.py"):
            repo.sync()
        assert "3 * x" in (repo.fork / "torchrl/sub/util.py").read_text()
        repo.sync(force=True)
        assert "2 * x" in (repo.fork / "torchrl/sub/util.py").read_text()

    def test_wrong_wheel_hash_is_refused(self, repo: Fork):
        wheel = repo.cache / WHEEL_NAME
        wheel.write_bytes(wheel.read_bytes() + b"tampered")
        with pytest.raises(ForkError, match="sha256"):
            repo.sync()


class TestExport:
    def test_round_trip_is_byte_stable(self, repo: Fork):
        edit(repo, "torchrl/core.py", "line_15 = 15", "line_15 = 'fifteen'")
        edit(repo, "torchrl/no_newline.py", "x = 1", "x = 2")
        (repo.fork / "torchrl/sub/extra.py").write_text("Y = 2\n")
        changed = repo.export()
        assert "wrote torchrl/core.py.patch" in changed
        assert "wrote torchrl/sub/extra.py" in changed
        patch = describe(repo, "torchrl/core.py.patch")
        describe(repo, "torchrl/no_newline.py.patch")
        first = _overlay_bytes(repo)
        assert repo.export() == []
        repo.sync()
        assert repo.export() == []
        assert _overlay_bytes(repo) == first
        text = patch.read_text()
        assert text.startswith("Description: the fake gains a feature\n")
        assert "diff --git a/torchrl/core.py b/torchrl/core.py\n" in text
        assert "\nindex " not in text and "\r" not in text
        assert text.endswith("\n") and not text.endswith("\n\n")
        base = hashlib.sha256(UPSTREAM_FILES["torchrl/core.py"].encode()).hexdigest()
        assert f"Base-SHA256: {base}\n" in text
        no_nl = (repo.root / "torchrl/no_newline.py.patch").read_text()
        assert "\\ No newline at end of file" in no_nl
        assert repo.check() == []

    def test_header_is_kept_byte_for_byte(self, repo: Fork):
        edit(repo, "torchrl/core.py", "return 42", "return 43")
        repo.export()
        patch = repo.root / "torchrl/core.py.patch"
        header, body = patch.read_text().split("diff --git", 1)
        custom = header.replace(fork.PLACEHOLDER, "answers 43").replace(
            " Why, in a few lines", " Because 43;\n  it is the\tbetter answer"
        )
        patch.write_text(custom + "diff --git" + body)
        edit(repo, "torchrl/core.py", "line_3 = 3", "line_3 = 'three'")
        repo.export()
        assert patch.read_text().startswith(custom)
        assert "line_3 = 'three'" in patch.read_text()

    def test_stale_patch_and_module_are_removed(self, repo: Fork):
        edit(repo, "torchrl/core.py", "return 42", "return 43")
        (repo.fork / "torchrl/sub/extra.py").write_text("Y = 2\n")
        repo.export()
        describe(repo, "torchrl/core.py.patch")
        edit(repo, "torchrl/core.py", "return 43", "return 42")
        (repo.fork / "torchrl/sub/extra.py").unlink()
        changed = repo.export()
        assert sorted(changed) == [
            "removed torchrl/core.py.patch",
            "removed torchrl/sub/extra.py",
        ]
        assert not list((repo.root / "torchrl").rglob("*"))
        assert repo.check() == []

    def test_deleting_upstream_file_is_refused(self, repo: Fork):
        (repo.fork / "torchrl/sub/util.py").unlink()
        with pytest.raises(ForkError, match="torchrl/sub/util.py"):
            repo.export()


class TestCheck:
    def _exported(self, repo: Fork) -> Path:
        edit(repo, "torchrl/core.py", "return 42", "return 43")
        edit(repo, "torchrl/sub/util.py", "2 * x", "4 * x")
        repo.export()
        describe(repo, "torchrl/sub/util.py.patch")
        return describe(repo, "torchrl/core.py.patch")

    def test_wrong_base_hash_is_refused(self, repo: Fork):
        patch = self._exported(repo)
        text = patch.read_text()
        good = hashlib.sha256(UPSTREAM_FILES["torchrl/core.py"].encode()).hexdigest()
        patch.write_text(text.replace(good, "0" * 64))
        problems = "\n".join(repo.check())
        assert "torchrl/core.py.patch: wrong base" in problems
        assert "0" * 64 in problems and good in problems
        with pytest.raises(ForkError, match="wrong base"):
            repo.sync(force=True)

    def test_patch_that_no_longer_applies_and_reports_all(self, repo: Fork):
        patch = self._exported(repo)
        util = repo.root / "torchrl/sub/util.py.patch"
        patch.write_text(
            patch.read_text().replace(" def answer():", " def question():")
        )
        util.write_text(
            util.read_text().replace("-    return 2 * x", "-    return 5 * x")
        )
        problems = "\n".join(repo.check())
        assert "torchrl/core.py.patch: does not apply" in problems
        assert "torchrl/sub/util.py.patch: does not apply" in problems

    def test_unexported_edits_are_reported(self, repo: Fork):
        self._exported(repo)
        assert repo.check() == []
        edit(repo, "torchrl/core.py", "line_7 = 7", "line_7 = 'seven'")
        (repo.fork / "torchrl/brand_new.py").write_text("Z = 3\n")
        problems = "\n".join(repo.check())
        assert "not exported" in problems
        assert "torchrl/core.py" in problems and "torchrl/brand_new.py" in problems
        repo.export()
        assert repo.check() == []

    def test_edits_committed_in_build_fork_are_still_unexported(self, repo: Fork):
        self._exported(repo)
        edit(repo, "torchrl/core.py", "line_7 = 7", "line_7 = 'seven'")
        dev = ["-c", "user.name=dev", "-c", "user.email=dev@localhost"]
        subprocess.run(
            ["git", *dev, "commit", "-qam", "mine"], cwd=repo.fork, check=True
        )
        assert "torchrl/core.py" in "\n".join(repo.check())
        with pytest.raises(ForkError, match="not exported"):
            repo.sync()

    def test_fork_older_than_overlay(self, repo: Fork):
        patch = self._exported(repo)
        # Someone pulls a new version of the patch: build/fork is now stale.
        edit(repo, "torchrl/core.py", "return 43", "return 44")
        repo.export()
        new = patch.read_bytes()
        edit(repo, "torchrl/core.py", "return 44", "return 43")
        repo.export()
        patch.write_bytes(new)
        assert any("run sync" in p for p in repo.check())

    def test_orphaned_patch_and_shadowing_module(self, repo: Fork):
        self._exported(repo)
        orphan = repo.root / "torchrl/gone.py.patch"
        orphan.write_bytes(
            (repo.root / "torchrl/core.py.patch")
            .read_bytes()
            .replace(b"core.py", b"gone.py")
        )
        (repo.root / "torchrl/sub/util.py").write_text("shadow = True\n")
        problems = "\n".join(repo.check())
        assert "torchrl/gone.py.patch: orphaned" in problems
        assert "torchrl/sub/util.py: upstream has this file" in problems

    def test_file_that_is_not_a_patch_is_reported(self, repo: Fork):
        self._exported(repo)
        util = repo.root / "torchrl/sub/util.py.patch"
        util.write_text(util.read_text().split("diff --git")[0])
        problems = "\n".join(repo.check())
        assert "torchrl/sub/util.py.patch: does not apply" in problems
        assert "torchrl/core.py.patch" not in problems
        with pytest.raises(ForkError, match="not a patch"):
            repo.export()
        with pytest.raises(ForkError, match="util.py.patch: does not apply"):
            repo.sync(force=True)

    def test_placeholder_description_is_refused(self, repo: Fork):
        edit(repo, "torchrl/core.py", "return 42", "return 43")
        repo.export()
        assert any("Description" in p for p in repo.check())

    def test_stale_empty_patch(self, repo: Fork):
        patch = self._exported(repo)
        text = patch.read_text().replace("+    return 43", "+    return 42")
        patch.write_text(text)
        repo.sync(force=True)
        problems = "\n".join(repo.check())
        assert "torchrl/core.py.patch: stale" in problems

    def test_cli_exit_codes(self, repo: Fork):
        cmd = [sys.executable, fork.__file__, "--root", str(repo.root), "check"]
        assert subprocess.run(cmd, capture_output=True).returncode == 0
        edit(repo, "torchrl/core.py", "return 42", "return 43")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        assert proc.returncode == 1
        assert "not exported" in proc.stderr and "torchrl/core.py" in proc.stderr


class TestWheel:
    def test_wheel_version_and_record(self, repo: Fork, tmp_path: Path):
        edit(repo, "torchrl/core.py", "return 42", "return 43")
        (repo.fork / "torchrl/sub/extra.py").write_text("Y = 2\n")
        repo.export()
        out = repo.wheel(tmp_path / "dist")
        assert out.name == "torchrl-0.12.0+seqrl-py3-none-any.whl"
        with zipfile.ZipFile(out) as zf:
            names = zf.namelist()
            assert "torchrl/sub/extra.py" in names
            assert "return 43" in zf.read("torchrl/core.py").decode()
            info = "torchrl-0.12.0+seqrl.dist-info"
            assert not any(n.startswith("torchrl-0.12.0.dist-info") for n in names)
            assert "Version: 0.12.0+seqrl\n" in zf.read(f"{info}/METADATA").decode()
            rows = list(csv.reader(io.StringIO(zf.read(f"{info}/RECORD").decode())))
            recorded = {row[0] for row in rows}
            assert recorded == set(names)
            for name, digest, size in rows:
                if name.endswith("RECORD"):
                    assert digest == size == ""
                    continue
                assert _record_line(name, zf.read(name)) == f"{name},{digest},{size}"
        # Byte-stable: building again gives the same file.
        first = out.read_bytes()
        assert repo.wheel(tmp_path / "dist").read_bytes() == first

    def test_wheel_uses_patches_not_unexported_edits(self, repo: Fork, tmp_path: Path):
        edit(repo, "torchrl/core.py", "return 42", "return 99")
        out = repo.wheel(tmp_path / "dist")
        with zipfile.ZipFile(out) as zf:
            assert "return 42" in zf.read("torchrl/core.py").decode()

    def test_editable_wheel_is_metadata_and_a_pth(self, repo: Fork, tmp_path: Path):
        out = repo.wheel(tmp_path / "dist", editable=True)
        assert out.parent == repo.build / "editable"
        pth = "__editable__.torchrl-0.12.0+seqrl.pth"
        with zipfile.ZipFile(out) as zf:
            tops = {name.split("/")[0] for name in zf.namelist()}
            assert tops == {pth, "torchrl-0.12.0+seqrl.dist-info"}
            assert zf.read(pth).decode() == f"{repo.fork.resolve()}\n"


class TestUpstreamDiff:
    def test_applies_to_pristine_layout(self, repo: Fork, tmp_path: Path):
        edit(repo, "torchrl/core.py", "return 42", "return 43")
        edit(repo, "torchrl/no_newline.py", "x = 1", "x = 2")
        (repo.fork / "torchrl/sub/extra.py").write_text("Y = 2\n")
        repo.export()
        for rel, text in {
            "test/test_extra.py": "def test_x():\n    pass\n",
            "docs/source/reference/page.rst": "Page\n====\n",
            "docs/source/conf.py": "project = 'fork only'\n",
            "tools/helper.py": "fork_only = True\n",
            "test/test_fork_ci.py": "fork_only = True\n",
            "benchmarks/bench.py": "fork_only = True\n",
            "Makefile": "all:\n",
        }.items():
            (repo.root / rel).parent.mkdir(parents=True, exist_ok=True)
            (repo.root / rel).write_text(text)
        diff = repo.upstream_diff()
        assert b"index " not in diff
        assert b"docs/source/conf.py" not in diff and b"tools/helper.py" not in diff
        assert b"Makefile" not in diff and b"Base-SHA256" not in diff
        assert b"test_fork_ci.py" not in diff and b"benchmarks/" not in diff
        target = tmp_path / "upstream-checkout"
        repo.materialize(target)  # lays pristine + overlay: undo the overlay
        subprocess.run(["git", "checkout", "-q", "upstream", "--", "."], cwd=target)
        (target / "torchrl/sub/extra.py").unlink()
        subprocess.run(
            ["git", "apply", "--check", "-"], cwd=target, input=diff, check=True
        )
        subprocess.run(["git", "apply", "-"], cwd=target, input=diff, check=True)
        assert "return 43" in (target / "torchrl/core.py").read_text()
        assert (target / "test/test_extra.py").is_file()
        assert (target / "docs/source/reference/page.rst").is_file()


def test_real_overlay_upstream_diff_applies_to_pristine(tmp_path: Path):
    """The project's own upstream diff applies to pristine torchrl 0.12.0 + fixes."""
    real = Fork(REAL_ROOT)
    target = real._unpack_pristine(tmp_path)
    fork.apply_fixes(REAL_ROOT / fork.FIXES, target, "torchrl/*")
    diff = real.upstream_diff()
    proc = subprocess.run(
        ["git", "apply", "--check", "-"], cwd=target, input=diff, capture_output=True
    )
    assert proc.returncode == 0, proc.stderr.decode()


FIX = """From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: A Maintainer <m@example.com>
Date: Thu, 1 Jan 1970 00:00:00 +0000
Subject: [PATCH] [BugFix] double() doubles

It tripled.

---
diff --git a/test/test_util.py b/test/test_util.py
new file mode 100644
--- /dev/null
+++ b/test/test_util.py
@@ -0,0 +1,2 @@
+def test_double():
+    assert double(2) == 4
diff --git a/torchrl/sub/util.py b/torchrl/sub/util.py
--- a/torchrl/sub/util.py
+++ b/torchrl/sub/util.py
@@ -1,2 +1,2 @@
 def double(x):
-    return 2 * x
+    return x + x
"""


class TestFixes:
    """The fixes layer: source hunks under the overlay, the base of its patches."""

    def _with_fix(self, repo: Fork) -> Path:
        folder = repo.root / fork.FIXES
        folder.mkdir()
        (folder / "0001-fix.patch").write_text(FIX)
        (folder / "series").write_text("# in order\n0001-fix.patch\n")
        repo.sync()
        return folder

    def test_sync_lays_the_fixes_under_the_overlay(self, repo: Fork):
        self._with_fix(repo)
        assert "x + x" in (repo.fork / "torchrl/sub/util.py").read_text()
        assert not (repo.fork / "test").exists()  # test hunks go to the suite
        assert "2 * x" in (repo.upstream / "torchrl/sub/util.py").read_text()
        assert repo.check() == []

    def test_overlay_patches_are_made_against_the_fixes(self, repo: Fork):
        self._with_fix(repo)
        edit(repo, "torchrl/sub/util.py", "x + x", "x + x  # doubled")
        repo.export()
        patch = describe(repo, "torchrl/sub/util.py.patch").read_text()
        assert "-    return x + x\n+    return x + x  # doubled" in patch
        assert "2 * x" not in patch
        fixed = (repo.fork / "torchrl/sub/util.py").read_bytes()
        assert (
            hashlib.sha256(b"def double(x):\n    return x + x\n").hexdigest() in patch
        )
        repo.sync()
        assert (repo.fork / "torchrl/sub/util.py").read_bytes() == fixed
        assert repo.check() == []

    def test_test_hunks_apply_to_a_suite(self, repo: Fork, tmp_path: Path):
        folder = self._with_fix(repo)
        suite = tmp_path / "suite"
        (suite / "test").mkdir(parents=True)
        fork.apply_fixes(folder, suite, "test/*")
        assert "double(2) == 4" in (suite / "test/test_util.py").read_text()
        assert not (suite / "torchrl").exists()

    def test_series_lists_every_patch(self, repo: Fork):
        folder = self._with_fix(repo)
        (folder / "0002-unlisted.patch").write_text(FIX)
        with pytest.raises(ForkError, match=r"leaves out[\s\S]*0002-unlisted.patch"):
            fork.fix_series(folder)

    def test_depends_on_names_earlier_fixes(self, tmp_path: Path):
        import upstream_prs

        series = [tmp_path / "0001-a.patch", tmp_path / "0002-b.patch"]
        body = "What changed.\n\nDepends-on: 0001 (a): it changes the same lines."
        assert upstream_prs._depends_on(body, series, series[1]) == [series[0]]
        assert upstream_prs._depends_on("No dependency.", series, series[1]) == []
        # only an earlier fix can be depended on
        with pytest.raises(ForkError, match="Depends-on: 0002"):
            upstream_prs._depends_on("Depends-on: 0002", series, series[0])

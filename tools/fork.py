# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""The patch-overlay tool of torchrl-seqrl (``python tools/fork.py --help``).

A change to upstream module ``torchrl/X/Y.py`` is one unified diff at
``torchrl/X/Y.py.patch``; a brand-new module is a full file under ``torchrl/``.
Under the overlay lies the fixes layer: ``upstream-fixes/series`` names, in
order, ``git format-patch`` files against pristine upstream, one bug fix each,
with its regression test in upstream's own test files. ``sync`` unpacks the
pinned wheel into ``build/upstream`` and lays pristine + the fixes' source
hunks + overlay into ``build/fork``, a git repository whose tags ``upstream``,
``fixes`` and ``overlay`` hold pristine, pristine + fixes (the base of every
patch of the overlay) and what the last sync or export left. ``export`` writes
the overlay back from ``build/fork``, ``check`` verifies both, ``wheel`` builds
the fork's wheel (with the ``wheel`` tool and ``cpp_extension.load``) and
``upstream-diff`` prints the feature change as one diff against pristine +
fixes (``tools/upstream_prs.py`` turns the fixes into pull requests).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from packaging.utils import parse_wheel_filename

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "torchrl"
FIXES = "upstream-fixes"
PATCH_SUFFIX = ".patch"
PLACEHOLDER = "(say what this file gains)"
BASE_LINE = re.compile(r"^Base-SHA256:.*$", flags=re.M)
HEADER = (  # of a new patch; export keeps the header of an existing one
    f"Description: {PLACEHOLDER}\n"
    " Why, in a few lines: the user-visible problem it solves.\n"
    "Origin: vendor\nForwarded: no\n\n"
)
# Files that never belong to the overlay: caches and compiled artifacts.
IGNORED = ("__pycache__", "*.py[co]", "*.so", ".pytest_cache", ".hypothesis")
NO_BINARIES = shutil.ignore_patterns("*.so", ".pristine-sha256")
# Pinned git: the same edits always export to the same bytes.
GIT_DIFF = "diff -U3 --no-renames --no-color --no-ext-diff --no-textconv".split()
GIT_DIFF += "--src-prefix=a/ --dst-prefix=b/ --diff-algorithm=myers".split()
GIT_ENV = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C"}
for _who in ("AUTHOR", "COMMITTER"):
    GIT_ENV[f"GIT_{_who}_NAME"] = "upstream"
    GIT_ENV[f"GIT_{_who}_EMAIL"] = "upstream@localhost"
    GIT_ENV[f"GIT_{_who}_DATE"] = "1970-01-01T00:00:00Z"
# What `upstream-diff` carries besides the patches, at the same paths upstream.
UPSTREAM_DIRS = ("test", "docs/source", "examples", "tutorials")
# Fork-only files inside those folders: the docs site's frame and the checks of
# the fork's own CI. (benchmarks/ compare build/upstream with build/fork, so
# they stay in the fork too.)
FORK_ONLY = ("docs/source/conf.py", "docs/source/index.rst", "test/test_fork_ci.py")
# Wheel entries dated 1980-01-01, the earliest a zip holds: reproducible bytes.
WHEEL_ENV = {"SOURCE_DATE_EPOCH": "315532800"}
CACHE_ENV = "TORCHRL_SEQRL_CACHE"
EXT_CFLAGS = ["-O3", "-g0"]


class ForkError(Exception):
    """A failure the user can act on; the message says what to do."""


def fix_series(folder: Path) -> list[Path]:
    """The patches that ``folder/series`` lists, in order (none without it)."""
    folder = Path(folder)
    series = folder / "series"
    if not series.is_file():
        return []
    names = [line.split("#")[0].strip() for line in series.read_text().splitlines()]
    paths = [folder / name for name in names if name]
    listed = {path.name for path in paths}
    unlisted = sorted(p.name for p in folder.glob("*.patch") if p.name not in listed)
    missing = [path.name for path in paths if not path.is_file()]
    if missing or unlisted:
        raise ForkError(
            f"{series}: lists missing files{bullets(missing)}\nand leaves out"
            f"{bullets(unlisted)}\nevery fix patch is listed once, in order"
        )
    return paths


def apply_fixes(folder: Path, dest: Path, include: str) -> None:
    """Applies the paths ``include`` (a ``git apply`` glob) of every fix to ``dest``."""
    for path in fix_series(folder):
        proc = git(
            "apply",
            f"--include={include}",
            cwd=dest,
            check=False,
            input=path.read_bytes(),
        )
        if proc.returncode != 0:
            why = proc.stderr.decode(errors="replace").strip()
            raise ForkError(
                f"{path} does not apply ({include}) on pristine "
                f"and the fixes before it:\n  {why}"
            )


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def bullets(items) -> str:
    return "".join(f"\n  {item}" for item in items)


def tree_files(top: Path) -> dict[str, Path]:
    """Every file below ``top`` that can be part of the overlay, by POSIX path."""
    ignored = shutil.ignore_patterns(*IGNORED, ".git")
    rels = sorted(p.relative_to(top) for p in top.rglob("*") if p.is_file())
    return {r.as_posix(): top / r for r in rels if not ignored("", r.parts)}


def run(cmd: list, cwd: Path | None = None, env=None, check: bool = True, **kw):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, **kw)
    if check and proc.returncode != 0:
        output = (proc.stdout + proc.stderr).decode(errors="replace")
        raise ForkError(f"{' '.join(map(str, cmd))} failed in {cwd}:\n{output}")
    return proc


def git(*args: str, cwd: Path, check: bool = True, input: bytes | None = None):
    # Never let git discover an enclosing repository (such as this project's).
    ceiling = str(Path(cwd).resolve().parent)
    env = {**os.environ, **GIT_ENV, "GIT_CEILING_DIRECTORIES": ceiling}
    return run(["git", *args], cwd, env, check, input=input)


def wheel_tool(*args) -> None:
    """Runs the ``wheel`` command line: ``wheel unpack``, ``pack`` or ``tags``."""
    run([sys.executable, "-m", "wheel", *args], env={**os.environ, **WHEEL_ENV})


def read_patch(path: Path) -> tuple[str, bytes]:
    """Splits a patch into its DEP-3 style header and its ``git diff`` body."""
    data = path.read_bytes()
    match = re.search(rb"^diff --git ", data, flags=re.MULTILINE)
    if match is None:
        raise ForkError(f"{path}: no 'diff --git' line: not a patch")
    return data[: match.start()].decode(), data[match.start() :]


def field(text: str, name: str) -> str | None:
    """Header field ``name`` of a patch's text (no ``git diff`` line starts so)."""
    match = re.search(rf"^{name}:[ \t]*(.*)$", text, flags=re.MULTILINE)
    return match.group(1).strip() if match else None


def normalize_diff(raw: bytes) -> bytes:
    """Drop ``index`` lines, force LF endings and exactly one trailing newline."""
    lines = raw.replace(b"\r\n", b"\n").split(b"\n")
    kept = [line for line in lines if not line.startswith(b"index ")]
    return b"\n".join(kept).rstrip(b"\n") + b"\n"


def commit(tree: Path, tag: str) -> None:
    """Commits all of ``tree`` (a ``build/fork``-like repo) and tags it ``tag``."""
    git("add", "-A", cwd=tree)
    git("commit", "-q", "--allow-empty", "--no-gpg-sign", "-m", tag, cwd=tree)
    git("tag", "-f", tag, cwd=tree)


def blobs(tree: Path) -> set[str]:
    """The ``overlay`` commit's files and contents (not their modes)."""
    out = git("ls-tree", "-r", "-z", "overlay", cwd=tree).stdout.decode()
    return {entry.split(" ", 2)[2] for entry in out.split("\0") if entry}


def changes(tree: Path, since: str) -> dict[str, str]:
    """Stages all of ``tree``; returns ``{path: A, M or D}`` against ``since``."""
    git("add", "-A", cwd=tree)
    cmd = ["diff", "--cached", "--name-status", "--no-renames", "-z", since]
    out = git(*cmd, cwd=tree).stdout.decode().split("\0")[:-1]
    return dict(zip(out[1::2], out[0::2]))


class Fork:
    """The overlay of the checkout at ``root``, built under ``root/build``."""

    def __init__(self, root: Path = ROOT):
        self.root, self.build = Path(root), Path(root) / "build"
        self.pin = tomllib.loads((self.root / "UPSTREAM.toml").read_text())["torchrl"]
        self.version = f"{self.pin['version']}+{self.pin['local']}"
        # Downloads and compiled extensions; shareable between clones.
        self.cache = Path(os.environ.get(CACHE_ENV, self.build / "cache"))
        self.upstream = self.build / "upstream"
        self.fork = self.build / "fork"
        self.overlay_dir = self.root / PACKAGE

    def pristine_wheel(self) -> Path:
        """The pinned upstream wheel, downloaded once and verified each time."""
        path = self.cache / self.pin["wheel"]
        if not path.is_file():
            # The pinned file whatever the running Python: the Python sources
            # are the same, and the C++ extension is compiled for this Python.
            cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:"]
            cmd += ["--no-deps", "-d", self.cache, f"torchrl=={self.pin['version']}"]
            for tag in parse_wheel_filename(path.name)[3]:
                cmd += ["--platform", tag.platform]
                if tag.interpreter.startswith("cp"):  # pip reads "py3" as Python 3.0
                    cmd += ["--implementation", "cp", "--abi", tag.abi]
                    cmd += ["--python-version", tag.interpreter[2:]]
            proc = run(cmd, check=False, text=True)
            if not path.is_file():
                raise ForkError(
                    f"could not download {path.name}; put it in {self.cache} by "
                    f"hand if this machine is offline:\n{proc.stdout}{proc.stderr}"
                )
        actual = sha256_file(path)
        if actual != self.pin["sha256"]:
            raise ForkError(
                f"{path} has sha256 {actual}, but UPSTREAM.toml pins "
                f"{self.pin['sha256']}: delete the file and sync again, or fix the pin."
            )
        return path

    def overlay(self) -> tuple[dict[str, Path], dict[str, Path]]:
        """Returns ``(patches, modules)``: both map an upstream path to our file."""
        patches, modules = {}, {}
        for rel, path in tree_files(self.overlay_dir).items():
            if rel.endswith(PATCH_SUFFIX):
                patches[f"{PACKAGE}/{rel[: -len(PATCH_SUFFIX)]}"] = path
            else:
                modules[f"{PACKAGE}/{rel}"] = path
        return patches, modules

    def _unpack_pristine(self, dest: Path) -> Path:
        """``wheel unpack`` of the pin into ``dest``; returns the unpacked tree."""
        wheel_tool("unpack", "--dest", dest, self.pristine_wheel())
        return dest / "-".join(map(str, parse_wheel_filename(self.pin["wheel"])[:2]))

    def ensure_upstream(self) -> Path:
        """Unpacks pristine upstream, less binaries, to ``build/upstream``."""
        stamp = self.upstream / ".pristine-sha256"
        if stamp.is_file() and stamp.read_text().strip() == self.pin["sha256"]:
            return self.upstream
        shutil.rmtree(self.upstream, ignore_errors=True)
        with tempfile.TemporaryDirectory() as tmp:
            tree = self._unpack_pristine(Path(tmp)) / PACKAGE
            shutil.copytree(tree, self.upstream / PACKAGE, ignore=NO_BINARIES)
        stamp.write_text(self.pin["sha256"] + "\n")
        return self.upstream

    def apply_overlay(self, dest: Path) -> None:
        """Applies every patch and copies every new module into ``dest``.

        ``dest`` holds pristine + fixes, the base of the patches. Each patch is
        checked first (base hash, then ``git apply --check``, which never
        fuzzes); all failures are reported together.
        """
        pristine, (patches, modules) = self.ensure_upstream(), self.overlay()
        errors = []
        for target, path in patches.items():
            shown, base = path.relative_to(self.root), dest / target
            if not base.is_file():
                errors.append(f"{shown}: orphaned: upstream has no {target}")
                continue
            data = path.read_bytes()
            want, have = field(data.decode(), "Base-SHA256"), sha256_file(base)
            # git apply skips the header, as it skips the message of a mail.
            proc = git("apply", "--check", cwd=dest, check=False, input=data)
            if want is None:
                errors.append(f"{shown}: no Base-SHA256 header line")
            elif want != have:
                errors.append(
                    f"{shown}: wrong base: it was made against a file with sha256 "
                    f"{want}, but {target} of pristine + fixes has sha256 {have}. "
                    "Rebase the patch on the pinned release and the fixes (edit "
                    "build/fork, then export)."
                )
            elif proc.returncode != 0:
                why = proc.stderr.decode(errors="replace").strip()
                errors.append(
                    f"{shown}: does not apply to {target} of pristine + fixes:\n  {why}"
                )
        for target, path in modules.items():
            if (pristine / target).exists():
                errors.append(
                    f"{path.relative_to(self.root)}: upstream has this file: "
                    f"keep the change as {target}{PATCH_SUFFIX} instead"
                )
        if errors:
            raise ForkError(f"{len(errors)} overlay problem(s):\n" + "\n".join(errors))
        for path in patches.values():
            git("apply", cwd=dest, input=path.read_bytes())
        for target, path in modules.items():
            (dest / target).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest / target)

    def materialize(self, dest: Path) -> Path:
        """Lays pristine + fixes + overlay into ``dest``, a git repo tagged
        ``upstream`` (pristine), ``fixes`` (pristine + the fixes' source hunks)
        and ``overlay`` (pristine + fixes + overlay)."""
        pristine = self.ensure_upstream()
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(pristine, dest, ignore=NO_BINARIES)
        (dest / ".gitignore").write_text("\n".join((*IGNORED, ".gitignore\n")))
        git("init", "-q", cwd=dest)
        commit(dest, "upstream")
        apply_fixes(self.root / FIXES, dest, f"{PACKAGE}/*")
        commit(dest, "fixes")
        self.apply_overlay(dest)
        commit(dest, "overlay")
        return dest

    def unexported_edits(self) -> list[str]:
        """Files of ``build/fork`` changed since the last sync or export."""
        if not self.fork.is_dir():
            return []
        if git("tag", "-l", "overlay", cwd=self.fork).stdout.strip() != b"overlay":
            return ["(no record of the last sync or export: export, or sync --force)"]
        return sorted(changes(self.fork, "overlay"))

    def sync(self, force: bool = False, extension: bool = True) -> None:
        """Fetches the pin, unpacks upstream and materializes ``build/fork``."""
        edits = self.unexported_edits()
        if edits and not force:
            raise ForkError(
                "build/fork has edits that were not exported; sync would lose them:"
                f"{bullets(edits)}\nRun export first, or sync --force to drop them."
            )
        self.pristine_wheel()  # verified even when build/upstream is up to date
        self.materialize(self.fork)
        if extension and (self.upstream / PACKAGE / "csrc").is_dir():
            so = self.extension()
            for tree in (self.upstream, self.fork):
                shutil.copy(so, tree / PACKAGE)

    def _wanted_overlay(self, tree: Path) -> dict[str, bytes]:
        """What the overlay must hold so that it reproduces ``tree``."""
        changed = changes(tree, "fixes")
        removed = [rel for rel, kind in changed.items() if kind == "D"]
        if removed:
            raise ForkError(
                f"deleting upstream files is not supported; restore:{bullets(removed)}"
            )
        wanted = {}
        for rel, kind in changed.items():
            ours = rel[len(PACKAGE) + 1 :]
            if kind == "A":
                wanted[ours] = (tree / rel).read_bytes()
                continue
            old = self.overlay_dir / (ours + PATCH_SUFFIX)
            header = read_patch(old)[0] if old.is_file() else HEADER
            fixed = git("show", f"fixes:{rel}", cwd=tree).stdout
            base = f"Base-SHA256: {hashlib.sha256(fixed).hexdigest()}"
            header, found = BASE_LINE.subn(base, header, count=1)
            if not found:
                header = header.rstrip("\n") + f"\n{base}\n\n"
            diff = git(*GIT_DIFF, "fixes", "--", rel, cwd=tree).stdout
            wanted[ours + PATCH_SUFFIX] = header.encode() + normalize_diff(diff)
        return wanted

    def _compare(self, wanted: dict[str, bytes]) -> dict[str, str]:
        """The overlay files that differ from ``wanted``, each with what is wrong."""
        present, out = tree_files(self.overlay_dir), {}
        for rel in sorted(present.keys() | wanted.keys()):
            if rel not in wanted:
                out[rel] = "stale: it changes nothing upstream"
            elif rel not in present:
                out[rel] = "missing from the overlay"
            elif present[rel].read_bytes() != wanted[rel]:
                out[rel] = "not in canonical form: run sync, then export"
        return out

    def export(self) -> list[str]:
        """Rewrites the overlay from ``build/fork``; returns what changed."""
        if not self.fork.is_dir():
            raise ForkError("build/fork does not exist: run sync first")
        self.ensure_upstream()
        changed = []
        wanted = self._wanted_overlay(self.fork)
        for rel in self._compare(wanted):
            path = self.overlay_dir / rel
            if rel not in wanted:
                path.unlink()
                changed.append(f"removed {PACKAGE}/{rel}")
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(wanted[rel])
                changed.append(f"wrote {PACKAGE}/{rel}")
        for dirpath, _, _ in sorted(os.walk(self.overlay_dir), reverse=True):
            if dirpath != str(self.overlay_dir) and not os.listdir(dirpath):
                os.rmdir(dirpath)
        commit(self.fork, "overlay")
        return changed

    def check(self) -> list[str]:
        """Returns every problem found; an empty list means all is well."""
        problems = []
        for target, path in self.overlay()[0].items():
            if field(path.read_text(), "Description") in (None, "", PLACEHOLDER):
                problems.append(f"{target}{PATCH_SUFFIX}: write a Description: line")
        with tempfile.TemporaryDirectory() as tmp:
            try:
                scratch = self.materialize(Path(tmp) / "fork")
            except ForkError as err:
                return problems + [str(err)]
            for rel, wrong in self._compare(self._wanted_overlay(scratch)).items():
                problems.append(f"{PACKAGE}/{rel}: {wrong}")
            edits = self.unexported_edits()
            if edits:
                problems.append(
                    "build/fork has edits that were not exported (run export):"
                    + bullets(edits)
                )
            elif self.fork.is_dir() and blobs(self.fork) != blobs(scratch):
                problems.append(
                    "build/fork is older than the overlay (a pull or checkout "
                    "changed it): run sync"
                )
        return problems

    def extension(self) -> Path:
        """Compiles ``torchrl._torchrl`` against the installed torch, cached.

        The cache folder, keyed by the torch version, the Python, the platform,
        the flags and the sources, is the build directory of ``load()``.
        """
        import torch  # the build needs torch; import late so other verbs do not
        from torch.utils.cpp_extension import load

        csrc = self.ensure_upstream() / PACKAGE / "csrc"
        sources = sorted(p for p in csrc.rglob("*") if p.is_file())
        key = [torch.__version__, sys.version, sysconfig.get_platform(), *EXT_CFLAGS]
        key += [f"{p.relative_to(csrc)}:{sha256_file(p)}" for p in sources]
        key = hashlib.sha256("\n".join(key).encode()).hexdigest()[:16]
        out, build = self.cache / "ext" / key, self.cache / "ext" / key / "build"
        so = out / f"_torchrl{sysconfig.get_config_var('EXT_SUFFIX')}"
        if so.is_file():
            return so
        # load() runs ninja from PATH, which may lack the venv's bin folder.
        path = [str(Path(sys.executable).parent), os.environ.get("PATH", "")]
        os.environ["PATH"] = os.pathsep.join(path)
        print("fork: compiling _torchrl for torch", torch.__version__, file=sys.stderr)
        shutil.rmtree(build, ignore_errors=True)  # and a crashed run's lock file
        build.mkdir(parents=True)
        cpp = [str(p) for p in sources if p.suffix == ".cpp"]
        try:
            load("_torchrl", cpp, extra_cflags=EXT_CFLAGS, build_directory=str(build))
        except (ImportError, OSError, RuntimeError) as err:
            raise ForkError(f"compiling the C++ extension failed:\n{err}") from err
        shutil.copy(build / "_torchrl.so", so)
        shutil.rmtree(build)
        return so

    def wheel(self, dist: Path, editable: bool = False) -> Path:
        """Builds the fork's wheel into ``dist`` and returns its path.

        The wheel is the pristine one with the overlay applied, the C++
        extension recompiled against the installed torch, and the version
        ``<upstream>+seqrl``. With ``editable=True`` it holds only the metadata
        and a ``.pth`` file that puts ``build/fork`` on ``sys.path``.
        """
        with tempfile.TemporaryDirectory() as tmp:
            tree = self._unpack_pristine(Path(tmp))
            binaries = sorted((tree / PACKAGE).glob("_torchrl*.so"))
            if editable:
                if not self.fork.is_dir():
                    raise ForkError("build/fork does not exist: run sync first")
                for entry in tree.iterdir():  # only the metadata stays, and a .pth
                    if entry.suffix != ".dist-info":
                        (shutil.rmtree if entry.is_dir() else Path.unlink)(entry)
                pth = tree / f"__editable__.{PACKAGE}-{self.version}.pth"
                pth.write_text(f"{self.fork.resolve()}\n")
            else:
                apply_fixes(self.root / FIXES, tree, f"{PACKAGE}/*")
                self.apply_overlay(tree)
                for binary in binaries:  # built for upstream's torch: rebuilt
                    binary.unlink()
                    shutil.copy(self.extension(), tree / PACKAGE)
            wheel_tool("pack", tree, "-d", tmp, "--local-version", self.pin["local"])
            if binaries:  # the extension is compiled for the running Python: tag so
                cp = f"cp{sys.version_info.major}{sys.version_info.minor}"
                tags = ["--python-tag", cp, "--abi-tag", cp, "--remove"]
                wheel_tool("tags", *tags, *Path(tmp).glob("*.whl"))
            (built,) = Path(tmp).glob("*.whl")
            out = (self.build / "editable" if editable else dist) / built.name
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(built, out)
        return out

    def upstream_diff(self) -> bytes:
        """The feature change as one diff a maintainer can ``git apply`` on
        pristine + fixes (the fixes go upstream first, one pull request each)."""
        patches, modules = self.overlay()
        chunks = [normalize_diff(read_patch(path)[1]) for path in patches.values()]
        ours = [f"{d}/{r}" for d in UPSTREAM_DIRS for r in tree_files(self.root / d)]
        query = "\n".join(ours).encode()
        proc = git("check-ignore", "--stdin", cwd=self.root, check=False, input=query)
        ignored = {*FORK_ONLY, *proc.stdout.decode().splitlines()}
        for rel in sorted({*modules, *ours} - ignored):
            cmd = [*GIT_DIFF, "--no-index", "--", os.devnull, rel]
            proc = git(*cmd, cwd=self.root, check=False)
            if proc.returncode > 1 or re.search(rb"^Binary files ", proc.stdout, re.M):
                raise ForkError(f"{rel}: binary files cannot go into the upstream diff")
            chunks.append(normalize_diff(proc.stdout))
        return b"".join(chunks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fork.py", description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="repository root")
    sub = parser.add_subparsers(dest="command", required=True)
    sync = sub.add_parser("sync", help="lay build/upstream and build/fork")
    sync.add_argument("--force", action="store_true", help="drop un-exported edits")
    sync.add_argument("--no-extension", action="store_true", help="skip C++ build")
    sub.add_parser("export", help="write the overlay from build/fork")
    sub.add_parser("check", help="verify the overlay and build/fork")
    wheel = sub.add_parser("wheel", help="build the fork's wheel")
    wheel.add_argument("--dist", type=Path, help="output folder (default: dist/)")
    wheel.add_argument("--editable", action="store_true", help="a .pth to build/fork")
    sub.add_parser("extension", help="compile the C++ extension, print its path")
    sub.add_parser("upstream-diff", help="print the whole change as one diff")
    args = parser.parse_args(argv)
    fork = Fork(args.root)
    try:
        if args.command == "sync":
            fork.sync(force=args.force, extension=not args.no_extension)
            print(f"fork: build/fork is pristine {fork.pin['version']} + overlay")
        elif args.command == "export":
            changed = fork.export()
            print("\n".join(changed) if changed else "fork: overlay already up to date")
        elif args.command == "check":
            problems = fork.check()
            if problems:
                print("fork check FAILED:\n" + "\n".join(problems), file=sys.stderr)
                return 1
            print("fork check: every patch applies; build/fork matches the overlay")
        elif args.command == "wheel":
            print(fork.wheel(args.dist or fork.root / "dist", editable=args.editable))
        elif args.command == "extension":
            print(fork.extension())
        elif args.command == "upstream-diff":
            sys.stdout.buffer.write(fork.upstream_diff())
    except ForkError as err:
        print(f"fork {args.command}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""The patch-overlay tool of torchrl-seqrl.

The repository keeps a change to upstream module ``torchrl/X/Y.py`` as one
unified diff at ``torchrl/X/Y.py.patch`` and a brand-new module as a full file
at its path under ``torchrl/``. This tool turns the pinned upstream wheel and
that overlay into trees one can import, and back:

- ``sync``: fetch and verify the pinned wheel, unpack pristine upstream into
  ``build/upstream/`` and materialize ``build/fork/`` (pristine + overlay).
- ``export``: regenerate the overlay from the edits made in ``build/fork/``.
- ``check``: every patch applies to pristine upstream, nothing is stale, and
  ``build/fork/`` holds no edit that was not exported.
- ``wheel``: build ``dist/torchrl-<version>+seqrl-<tags>.whl``.
- ``upstream-diff``: print the whole change as one diff against upstream.

Run ``python tools/fork.py --help`` for the options.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "torchrl"
PATCH_SUFFIX = ".patch"
PLACEHOLDER = "(say what this file gains)"
# Files that never belong to the overlay: caches and compiled artifacts.
IGNORED_DIRS = {".git", "__pycache__", ".pytest_cache", ".hypothesis"}
IGNORED_SUFFIXES = (".pyc", ".pyo", ".so")
# Pinned git: the same edits always export to the same bytes.
GIT_DIFF = [
    "diff",
    "-U3",
    "--no-renames",
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "--src-prefix=a/",
    "--dst-prefix=b/",
    "--diff-algorithm=myers",
]
GIT_ENV = {
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "LC_ALL": "C",
    "GIT_AUTHOR_NAME": "upstream",
    "GIT_AUTHOR_EMAIL": "upstream@localhost",
    "GIT_COMMITTER_NAME": "upstream",
    "GIT_COMMITTER_EMAIL": "upstream@localhost",
    "GIT_AUTHOR_DATE": "1970-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "1970-01-01T00:00:00Z",
}
# What `upstream-diff` carries besides the patches, at the same paths upstream.
UPSTREAM_DIRS = ("test", "docs/source", "examples", "tutorials")
# Fork-only files inside those folders: the docs site's frame and the checks of
# the fork's own CI. (benchmarks/ compare build/upstream with build/fork, so
# they stay in the fork too.)
FORK_ONLY = ("docs/source/conf.py", "docs/source/index.rst", "test/test_fork_ci.py")
FIXED_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
CACHE_ENV = "TORCHRL_SEQRL_CACHE"


class ForkError(Exception):
    """A failure the user can act on; the message says what to do."""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    return sha256_bytes(path.read_bytes())


def _ignored(rel: Path) -> bool:
    return bool(IGNORED_DIRS.intersection(rel.parts)) or rel.name.endswith(
        IGNORED_SUFFIXES
    )


def tree_files(top: Path) -> dict[str, Path]:
    """Every file below ``top`` that can be part of the overlay, by POSIX path."""
    out = {}
    if not top.is_dir():
        return out
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if d not in IGNORED_DIRS)
        for name in sorted(filenames):
            path = Path(dirpath, name)
            rel = path.relative_to(top)
            if not _ignored(rel):
                out[rel.as_posix()] = path
    return out


def git(*args: str, cwd: Path, input: bytes | None = None, check: bool = True):
    env = dict(os.environ, **GIT_ENV)
    # Never let git discover an enclosing repository (such as this project's).
    env["GIT_CEILING_DIRECTORIES"] = str(Path(cwd).resolve().parent)
    proc = subprocess.run(
        ["git", *args], cwd=cwd, input=input, capture_output=True, env=env
    )
    if check and proc.returncode != 0:
        raise ForkError(
            f"git {' '.join(args)} failed in {cwd}:\n"
            + proc.stderr.decode(errors="replace")
        )
    return proc


@dataclass
class Patch:
    """One overlay patch: a DEP-3 style header and a ``git diff`` body."""

    path: Path
    target: str
    header: str
    diff: bytes

    @classmethod
    def read(cls, path: Path, target: str) -> Patch:
        data = path.read_bytes()
        match = re.search(rb"^diff --git ", data, flags=re.MULTILINE)
        if match is None:
            raise ForkError(f"{path}: no 'diff --git' line: not a patch")
        return cls(path, target, data[: match.start()].decode(), data[match.start() :])

    def field(self, name: str) -> str | None:
        match = re.search(rf"^{name}:[ \t]*(.*)$", self.header, flags=re.MULTILINE)
        return match.group(1).strip() if match else None

    @staticmethod
    def default_header(base_sha: str) -> str:
        return (
            f"Description: {PLACEHOLDER}\n"
            " Why, in a few lines: the user-visible problem it solves.\n"
            "Origin: vendor\n"
            "Forwarded: no\n"
            f"Base-SHA256: {base_sha}\n"
            "\n"
        )

    def with_base(self, base_sha: str) -> str:
        if self.field("Base-SHA256") is None:
            return self.header.rstrip("\n") + f"\nBase-SHA256: {base_sha}\n\n"
        return re.sub(
            r"^Base-SHA256:.*$",
            f"Base-SHA256: {base_sha}",
            self.header,
            count=1,
            flags=re.MULTILINE,
        )


def normalize_diff(raw: bytes) -> bytes:
    """Drop ``index`` lines, force LF endings and exactly one trailing newline."""
    lines = raw.replace(b"\r\n", b"\n").split(b"\n")
    kept = [line for line in lines if not line.startswith(b"index ")]
    return b"\n".join(kept).rstrip(b"\n") + b"\n"


class Fork:
    """The overlay of one checkout: where things are and what to do with them.

    Args:
        root (Path): the repository root, holding ``UPSTREAM.toml`` and the
            overlay under ``torchrl/``.
        build (Path, optional): the ignored build folder. Defaults to
            ``root / "build"``.
    """

    def __init__(self, root: Path = ROOT, build: Path | None = None):
        self.root = Path(root)
        self.build = Path(build) if build is not None else self.root / "build"
        pins_file = self.root / "UPSTREAM.toml"
        if not pins_file.is_file():
            raise ForkError(f"{pins_file} is missing: it pins the upstream release")
        self.pins = tomllib.loads(pins_file.read_text())
        # Downloads and compiled extensions; shareable between clones.
        self.cache = Path(os.environ.get(CACHE_ENV, self.build / "cache"))
        self.upstream = self.build / "upstream"
        self.fork = self.build / "fork"
        self.manifest = self.build / "fork-manifest.json"
        self.overlay_dir = self.root / PACKAGE

    # ------------------------------------------------------------------ pins
    @property
    def version(self) -> str:
        return f"{self.pins['torchrl']['version']}+{self.pins['torchrl']['local']}"

    def pristine_wheel(self) -> Path:
        """The pinned upstream wheel, downloaded once and verified each time."""
        pin = self.pins["torchrl"]
        path = self.cache / pin["wheel"]
        if not path.is_file():
            self.cache.mkdir(parents=True, exist_ok=True)
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--dest",
                str(self.cache),
                f"torchrl=={pin['version']}",
            ]
            # The pinned file, whatever the running interpreter: its Python
            # sources are the same for every Python, and the C++ extension is
            # recompiled for the interpreter that builds the wheel.
            python, abi, platform = pin["wheel"][: -len(".whl")].split("-")[-3:]
            if python.startswith("cp"):
                cmd += ["--implementation", "cp", "--abi", abi]
                cmd += ["--python-version", f"{python[2]}.{python[3:]}"]
            for plat in platform.split("."):
                cmd += ["--platform", plat]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0 or not path.is_file():
                raise ForkError(
                    f"could not download {pin['wheel']} ({' '.join(cmd)}):\n"
                    f"{proc.stdout}{proc.stderr}\n"
                    f"Put the file in {self.cache} by hand if this machine is offline."
                )
        actual = sha256_file(path)
        if actual != pin["sha256"]:
            raise ForkError(
                f"{path} has sha256 {actual}, but UPSTREAM.toml pins "
                f"{pin['sha256']}: delete the file and run sync again, or fix the pin."
            )
        return path

    # --------------------------------------------------------------- overlay
    def overlay(self) -> tuple[dict[str, Path], dict[str, Path]]:
        """Returns ``(patches, modules)``: both map an upstream path to our file."""
        patches, modules = {}, {}
        for rel, path in tree_files(self.overlay_dir).items():
            rel = f"{PACKAGE}/{rel}"
            if rel.endswith(PATCH_SUFFIX):
                patches[rel[: -len(PATCH_SUFFIX)]] = path
            else:
                modules[rel] = path
        return patches, modules

    def _unpack_pristine(self, dest: Path) -> None:
        with zipfile.ZipFile(self.pristine_wheel()) as zf:
            for info in zf.infolist():
                rel = Path(info.filename)
                if rel.parts[0] != PACKAGE or info.is_dir() or _ignored(rel):
                    continue
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(zf.read(info))

    def ensure_upstream(self) -> Path:
        """Unpacks pristine upstream to ``build/upstream`` unless already there."""
        stamp = self.upstream / ".pristine-sha256"
        sha = self.pins["torchrl"]["sha256"]
        if stamp.is_file() and stamp.read_text().strip() == sha:
            return self.upstream
        if self.upstream.exists():
            shutil.rmtree(self.upstream)
        self.upstream.mkdir(parents=True)
        self._unpack_pristine(self.upstream)
        stamp.write_text(sha + "\n")
        return self.upstream

    def apply_overlay(self, dest: Path, pristine: Path) -> None:
        """Applies every patch and copies every new module into ``dest``.

        Each patch is checked first (base hash, then ``git apply --check``,
        which never fuzzes); all failures are reported together.
        """
        patches, modules = self.overlay()
        errors = []
        loaded = []
        for target, path in patches.items():
            shown = path.relative_to(self.root)
            base = pristine / target
            if not base.is_file():
                errors.append(f"{shown}: orphaned: upstream has no {target}")
                continue
            try:
                patch = Patch.read(path, target)
            except ForkError as err:
                errors.append(str(err))
                continue
            want, have = patch.field("Base-SHA256"), sha256_file(base)
            if want is None:
                errors.append(f"{shown}: no Base-SHA256 header line")
            elif want != have:
                errors.append(
                    f"{shown}: wrong base: it was made against a file with "
                    f"sha256 {want}, but pristine {target} has sha256 {have}. "
                    "Rebase the patch on the pinned release (edit build/fork, "
                    "then export)."
                )
            else:
                proc = git(
                    "apply", "--check", "-", cwd=dest, input=patch.diff, check=False
                )
                if proc.returncode != 0:
                    errors.append(
                        f"{shown}: does not apply to pristine {target}:\n  "
                        + proc.stderr.decode(errors="replace").strip()
                    )
                else:
                    loaded.append(patch)
        for target, path in modules.items():
            if (pristine / target).exists():
                errors.append(
                    f"{path.relative_to(self.root)}: upstream has this file: "
                    f"keep the change as {target}{PATCH_SUFFIX} instead"
                )
        if errors:
            raise ForkError(f"{len(errors)} overlay problem(s):\n" + "\n".join(errors))
        for patch in loaded:
            git("apply", "-", cwd=dest, input=patch.diff)
        for target, path in modules.items():
            out = dest / target
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, out)

    def materialize(self, dest: Path) -> Path:
        """Lays pristine + overlay into ``dest``, a git repo tagged ``upstream``."""
        pristine = self.ensure_upstream()
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(
            pristine, dest, ignore=shutil.ignore_patterns(".pristine-sha256", "*.so")
        )
        (dest / ".gitignore").write_text(
            "".join(f"{p}\n" for p in ("__pycache__/", "*.pyc", "*.so", ".gitignore"))
        )
        git("init", "-q", cwd=dest)
        git("add", "-A", cwd=dest)
        git("commit", "-q", "--no-gpg-sign", "-m", "pristine upstream", cwd=dest)
        git("tag", "upstream", cwd=dest)
        self.apply_overlay(dest, pristine)
        return dest

    # ------------------------------------------------------------- manifest
    def _snapshot(self, top: Path) -> dict[str, str]:
        return {rel: sha256_file(path) for rel, path in tree_files(top).items()}

    def unexported_edits(self) -> list[str]:
        """Files of ``build/fork`` changed since the last sync or export."""
        if not self.fork.is_dir():
            return []
        if not self.manifest.is_file():
            return ["(no record of the last sync: run sync --force)"]
        recorded = json.loads(self.manifest.read_text())
        current = self._snapshot(self.fork)
        return sorted(
            rel
            for rel in recorded.keys() | current.keys()
            if recorded.get(rel) != current.get(rel)
        )

    # ------------------------------------------------------------- commands
    def sync(self, force: bool = False, extension: bool = True) -> None:
        """Fetches the pin, unpacks upstream and materializes ``build/fork``."""
        edits = self.unexported_edits()
        if edits and not force:
            raise ForkError(
                "build/fork has edits that were not exported; sync would lose "
                "them:\n  "
                + "\n  ".join(edits)
                + "\nRun export first, or sync --force to drop them."
            )
        self.pristine_wheel()
        self.ensure_upstream()
        self.materialize(self.fork)
        self.manifest.write_text(json.dumps(self._snapshot(self.fork), indent=1))
        if extension and self.has_extension():
            so = self.extension()
            for tree in (self.upstream, self.fork):
                shutil.copyfile(so, tree / PACKAGE / so.name)

    def _canonical_patch(self, target: str, diff: bytes) -> bytes:
        old = self.overlay_dir / (target[len(PACKAGE) + 1 :] + PATCH_SUFFIX)
        base_sha = sha256_file(self.upstream / target)
        if old.is_file():
            header = Patch.read(old, target).with_base(base_sha)
        else:
            header = Patch.default_header(base_sha)
        return header.encode() + normalize_diff(diff)

    def _wanted_overlay(self, tree: Path) -> dict[str, bytes]:
        """What the overlay must hold so that it reproduces ``tree``."""
        upstream = tree_files(self.upstream)
        current = tree_files(tree)
        removed = sorted(set(upstream) - set(current) - {".pristine-sha256"})
        if removed:
            raise ForkError(
                "deleting upstream files is not supported; restore:\n  "
                + "\n  ".join(removed)
            )
        wanted = {}
        for rel, path in current.items():
            if rel == ".gitignore":
                continue
            ours = rel[len(PACKAGE) + 1 :]
            if rel not in upstream:
                wanted[ours] = path.read_bytes()
            elif path.read_bytes() != upstream[rel].read_bytes():
                diff = git(*GIT_DIFF, "upstream", "--", rel, cwd=tree).stdout
                wanted[ours + PATCH_SUFFIX] = self._canonical_patch(rel, diff)
        return wanted

    def export(self) -> list[str]:
        """Rewrites the overlay from ``build/fork``; returns what changed."""
        if not self.fork.is_dir():
            raise ForkError("build/fork does not exist: run sync first")
        self.ensure_upstream()
        wanted = self._wanted_overlay(self.fork)
        present = tree_files(self.overlay_dir)
        changed = []
        for rel in sorted(present.keys() - wanted.keys()):
            present[rel].unlink()
            changed.append(f"removed {PACKAGE}/{rel}")
        for rel, data in sorted(wanted.items()):
            path = self.overlay_dir / rel
            if not path.is_file() or path.read_bytes() != data:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
                changed.append(f"wrote {PACKAGE}/{rel}")
        for dirpath, _, _ in sorted(os.walk(self.overlay_dir), reverse=True):
            if dirpath != str(self.overlay_dir) and not os.listdir(dirpath):
                os.rmdir(dirpath)
        self.manifest.write_text(json.dumps(self._snapshot(self.fork), indent=1))
        return changed

    def check(self) -> list[str]:
        """Returns every problem found; an empty list means all is well."""
        problems = []
        patches, _ = self.overlay()
        for target, path in patches.items():
            try:
                patch = Patch.read(path, target)
            except ForkError as err:
                problems.append(str(err))
                continue
            description = patch.field("Description")
            if not description or description == PLACEHOLDER:
                problems.append(
                    f"{path.relative_to(self.root)}: write a Description: line"
                )
        with tempfile.TemporaryDirectory() as tmp:
            scratch = Path(tmp) / "fork"
            try:
                self.materialize(scratch)
            except ForkError as err:
                return problems + [str(err)]
            wanted = self._wanted_overlay(scratch)
            present = tree_files(self.overlay_dir)
            for rel in sorted(present.keys() | wanted.keys()):
                shown = f"{PACKAGE}/{rel}"
                if rel not in wanted:
                    problems.append(f"{shown}: stale: it changes nothing upstream")
                elif rel not in present:
                    problems.append(f"{shown}: missing from the overlay")
                elif present[rel].read_bytes() != wanted[rel]:
                    problems.append(
                        f"{shown}: not in canonical form: run sync, then export"
                    )
            edits = self.unexported_edits()
            if edits:
                problems.append(
                    "build/fork has edits that were not exported (run export):\n  "
                    + "\n  ".join(edits)
                )
            elif self.fork.is_dir() and self._snapshot(self.fork) != self._snapshot(
                scratch
            ):
                problems.append(
                    "build/fork is older than the overlay (a pull or checkout "
                    "changed it): run sync"
                )
        return problems

    # ------------------------------------------------------------ extension
    def has_extension(self) -> bool:
        """Whether the pinned wheel ships the C++ extension's sources."""
        with zipfile.ZipFile(self.pristine_wheel()) as zf:
            return any(n.startswith(f"{PACKAGE}/csrc/") for n in zf.namelist())

    def extension(self) -> Path:
        """Compiles ``torchrl._torchrl`` against the installed torch, cached."""
        import torch  # the build needs torch; import late so other verbs do not

        with zipfile.ZipFile(self.pristine_wheel()) as zf:
            sources = {
                info.filename: zf.read(info)
                for info in zf.infolist()
                if info.filename.startswith(f"{PACKAGE}/csrc/") and not info.is_dir()
            }
        cpp = sorted(n for n in sources if n.endswith(".cpp"))
        script = (
            "from setuptools import setup\n"
            "from torch.utils.cpp_extension import BuildExtension, CppExtension\n"
            "setup(name='torchrl_ext', ext_modules=[CppExtension('torchrl._torchrl',"
            f" {cpp!r}, extra_compile_args={{'cxx': ['-O3', '-g0']}})],"
            " cmdclass={'build_ext': BuildExtension},"
            " script_args=['build_ext', '--build-lib', 'lib', '--build-temp', 'tmp'])\n"
        )
        key_parts = [torch.__version__, sys.version, sysconfig.get_platform(), script]
        key_parts += [
            f"{name}:{sha256_bytes(data)}" for name, data in sorted(sources.items())
        ]
        key = sha256_bytes("\n".join(key_parts).encode())[:16]
        out_dir = self.cache / "ext" / key
        so = out_dir / f"_torchrl{sysconfig.get_config_var('EXT_SUFFIX')}"
        if so.is_file():
            return so
        work = out_dir / "work"
        if work.exists():
            shutil.rmtree(work)
        for name, data in sources.items():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            (work / name).write_bytes(data)
        env = dict(os.environ)
        env.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
        path = [os.path.dirname(sys.executable)]
        try:
            import ninja

            path.insert(0, ninja.BIN_DIR)
        except ImportError:
            pass
        env["PATH"] = os.pathsep.join(path + [env.get("PATH", "")])
        print(
            f"fork: compiling {PACKAGE}._torchrl for torch {torch.__version__}",
            file=sys.stderr,
        )
        proc = subprocess.run(
            [sys.executable, "-c", script],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
        )
        built = sorted((work / "lib" / PACKAGE).glob("_torchrl*.so"))
        if proc.returncode != 0 or not built:
            raise ForkError(
                f"compiling the C++ extension failed:\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}"
            )
        shutil.copyfile(built[0], so)
        shutil.rmtree(work)
        return so

    # ---------------------------------------------------------------- wheel
    def _dist_info_files(
        self, zf: zipfile.ZipFile, old: str, new: str, tag: str
    ) -> dict[str, bytes]:
        out = {}
        base = self.pins["torchrl"]["version"]
        for info in zf.infolist():
            if not info.filename.startswith(old + "/") or info.is_dir():
                continue
            rel = info.filename[len(old) + 1 :]
            if rel == "RECORD":
                continue
            data = zf.read(info)
            if rel == "METADATA":
                data = re.sub(
                    rb"^Version: .*$",
                    f"Version: {self.version}".encode(),
                    data,
                    count=1,
                    flags=re.MULTILINE,
                )
                if self.version.encode() not in data:
                    raise ForkError(f"METADATA of {base} has no Version line")
            elif rel == "WHEEL":
                data = re.sub(rb"^Tag: .*$", f"Tag: {tag}".encode(), data, flags=re.M)
            out[f"{new}/{rel}"] = data
        return out

    def wheel(self, dist: Path, editable: bool = False) -> Path:
        """Builds the fork's wheel into ``dist`` and returns its path.

        The wheel is the pristine one with the overlay applied, the C++
        extension recompiled against the installed torch, and the version
        ``<upstream>+seqrl``. With ``editable=True`` it holds only the metadata
        and a ``.pth`` file that puts ``build/fork`` on ``sys.path``.
        """
        pristine_whl = self.pristine_wheel()
        base = self.pins["torchrl"]["version"]
        old_info = f"{PACKAGE}-{base}.dist-info"
        new_info = f"{PACKAGE}-{self.version}.dist-info"
        files: dict[str, bytes] = {}
        modes: dict[str, int] = {}
        tag = pristine_whl.name[len(f"{PACKAGE}-{base}-") : -len(".whl")]
        if self.has_extension():
            # The extension is compiled for the running interpreter: tag it so.
            impl = f"cp{sys.version_info.major}{sys.version_info.minor}"
            tag = f"{impl}-{impl}-{tag.split('-', 2)[2]}"
        with zipfile.ZipFile(pristine_whl) as zf:
            files.update(self._dist_info_files(zf, old_info, new_info, tag))
            if editable:
                if not self.fork.is_dir():
                    raise ForkError("build/fork does not exist: run sync first")
                files[f"__editable__.{PACKAGE}-{self.version}.pth"] = (
                    str(self.fork.resolve()) + "\n"
                ).encode()
            else:
                with tempfile.TemporaryDirectory() as tmp:
                    tree = self.materialize(Path(tmp) / "fork")
                    for info in zf.infolist():
                        name = info.filename
                        if info.is_dir() or name.startswith(old_info + "/"):
                            continue
                        modes[name] = info.external_attr
                        if name.startswith(f"{PACKAGE}/_torchrl") and name.endswith(
                            ".so"
                        ):
                            so = self.extension()
                            files[f"{PACKAGE}/{so.name}"] = so.read_bytes()
                            modes[f"{PACKAGE}/{so.name}"] = info.external_attr
                        elif name.startswith(PACKAGE + "/"):
                            files[name] = (tree / name).read_bytes()
                        else:
                            files[name] = zf.read(info)
                    for rel in tree_files(tree):
                        if rel != ".gitignore" and rel not in files:
                            files[rel] = (tree / rel).read_bytes()
        record = []
        for name, data in sorted(files.items()):
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(
                b"="
            )
            record.append(f"{name},sha256={digest.decode()},{len(data)}")
        record.append(f"{new_info}/RECORD,,")
        files[f"{new_info}/RECORD"] = ("\n".join(record) + "\n").encode()
        dist.mkdir(parents=True, exist_ok=True)
        out = dist / f"{PACKAGE}-{self.version}-{tag}.whl"
        if editable:
            out = self.build / "editable" / out.name
            out.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            # dist-info last, as the wheel spec recommends.
            order = sorted(files, key=lambda n: (n.startswith(new_info + "/"), n))
            for name in order:
                info = zipfile.ZipInfo(name, date_time=FIXED_ZIP_TIME)
                info.external_attr = modes.get(name, 0o644 << 16)
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, files[name])
        if not out.is_file() or out.read_bytes() != buf.getvalue():
            out.write_bytes(buf.getvalue())
        return out

    # -------------------------------------------------------- upstream diff
    def upstream_diff(self) -> bytes:
        """The whole change as one diff a maintainer can ``git apply``."""
        chunks = []
        patches, modules = self.overlay()
        for target, path in patches.items():
            chunks.append(normalize_diff(Patch.read(path, target).diff))
        new_files = [(target, path) for target, path in modules.items()]
        for top in UPSTREAM_DIRS:
            for rel, path in tree_files(self.root / top).items():
                rel = f"{top}/{rel}"
                if rel not in FORK_ONLY and not self._git_ignored(rel):
                    new_files.append((rel, path))
        for rel, path in sorted(new_files):
            chunks.append(_new_file_diff(rel, path.read_bytes()))
        return b"".join(chunks)

    def _git_ignored(self, rel: str) -> bool:
        proc = subprocess.run(
            ["git", "check-ignore", "-q", rel], cwd=self.root, capture_output=True
        )
        return proc.returncode == 0


def _new_file_diff(rel: str, data: bytes) -> bytes:
    head = f"diff --git a/{rel} b/{rel}\nnew file mode 100644\n".encode()
    if b"\0" in data:
        raise ForkError(f"{rel}: binary files cannot go into the upstream diff")
    if not data:
        return head
    lines = data.split(b"\n")
    missing_newline = lines[-1] != b""
    if not missing_newline:
        lines = lines[:-1]
    body = [f"--- /dev/null\n+++ b/{rel}\n@@ -0,0 +1,{len(lines)} @@\n".encode()]
    body += [b"+" + line + b"\n" for line in lines]
    if missing_newline:
        body.append(b"\\ No newline at end of file\n")
    return head + b"".join(body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fork.py", description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="repository root")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "sync", help="fetch the pin, materialize build/upstream and build/fork"
    )
    p.add_argument(
        "--force", action="store_true", help="drop un-exported edits in build/fork"
    )
    p.add_argument(
        "--no-extension", action="store_true", help="skip compiling the C++ extension"
    )
    sub.add_parser("export", help="write the overlay from build/fork")
    sub.add_parser("check", help="verify the overlay and build/fork")
    p = sub.add_parser("wheel", help="build the fork's wheel")
    p.add_argument(
        "--dist", type=Path, default=None, help="output folder (default: dist/)"
    )
    p.add_argument(
        "--editable", action="store_true", help="metadata + a .pth to build/fork"
    )
    sub.add_parser(
        "extension", help="compile the C++ extension (cached) and print its path"
    )
    sub.add_parser(
        "upstream-diff", help="print the whole change as one diff against upstream"
    )
    args = parser.parse_args(argv)
    fork = Fork(args.root)
    try:
        if args.command == "sync":
            fork.sync(force=args.force, extension=not args.no_extension)
            print(
                f"fork: build/fork is pristine {fork.pins['torchrl']['version']} + overlay"
            )
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
            dist = args.dist if args.dist is not None else fork.root / "dist"
            print(fork.wheel(dist, editable=args.editable))
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

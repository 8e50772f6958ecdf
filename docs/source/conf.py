# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Sphinx configuration of the torchrl-seqrl documentation site.

The site documents what the fork adds to or changes in TorchRL 0.12.0. It is
built against the ``torchrl`` that the running interpreter imports (``make
docs`` uses the fork installed in ``.venv``), with warnings as errors.

This file and ``index.rst`` only make the fork stand on its own: upstream
TorchRL has its own ``conf.py`` and ``index.rst``, so ``tools/fork.py
upstream-diff`` leaves them out and carries the pages under ``reference/``.
"""
from __future__ import annotations

import importlib
import os
import shutil
import tomllib
from pathlib import Path

import torchrl
from docutils import nodes

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

project = "torchrl-seqrl"
author = "torchrl-seqrl contributors"
copyright = "Meta Platforms, Inc. and affiliates"
# ``torchrl.__version__`` is None when the fork is imported from build/fork
# (no installed distribution): fall back to the pins.
_pins = tomllib.loads((ROOT / "UPSTREAM.toml").read_text())["torchrl"]
release = torchrl.__version__ or f"{_pins['version']}+{_pins['local']}"
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx_gallery.gen_gallery",
]

# Google-style docstrings, as upstream TorchRL writes them.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_member_order = "bysource"
autodoc_typehints = "none"
autodoc_default_options = {"show-inheritance": False}
# ``from __future__ import annotations`` keeps signatures as strings: show them.
autodoc_preserve_defaults = True

# No intersphinx: the build must work offline, and a docs build that depends
# on fetching torch's and tensordict's inventories does not.

exclude_patterns = ["_build"]
templates_path = []
html_theme = "furo"
html_title = f"torchrl-seqrl {release}"
html_static_path = []

# Every cross-reference of our pages must resolve (``-W`` turns a miss into a
# failure). Docstrings of upstream classes documented here also point at
# labels of upstream TorchRL's own site; those are rendered as links to it.
UPSTREAM_DOCS = "https://docs.pytorch.org/rl/stable/"
UPSTREAM_LABELS = {
    "Environment-lock": "reference/envs.html",
    "autoresetting_envs": "reference/envs.html",
    "dynamic_envs": "reference/envs.html",
    "ref_partial_resets": "reference/envs.html",
    "ref_partial_steps": "reference/envs.html",
    "transforms": "reference/envs.html",
    "TED-format": "reference/data.html",
    "ppo_entropy_coefficients": "reference/objectives.html",
}
_UPSTREAM_LABELS_LOWER = {k.lower(): v for k, v in UPSTREAM_LABELS.items()}


def _torchrl_object(node) -> tuple[str, int] | None:
    """The torchrl object a ``py`` cross-reference names, if it exists.

    Returns its dotted path and the number of leading parts that name its
    module.
    """
    target = node.get("reftarget", "")
    candidates = [target]
    if node.get("py:module") and not target.startswith("torchrl."):
        candidates.insert(0, f"{node['py:module']}.{target}")
    for path in candidates:
        if not path.startswith("torchrl."):
            continue
        parts = path.split(".")
        for split in range(len(parts) - 1, 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:split]))
            except ImportError:
                continue
            try:
                for attr in parts[split:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                break
            return path, split
    return None


def _upstream_label(app, env, node, contnode):
    """Resolves references to what only upstream TorchRL's site documents.

    - a ``:ref:`` to a label of upstream's pages (``UPSTREAM_LABELS``);
    - a ``py`` reference (``:class:``, ``:meth:``, ...) to a torchrl object
      that this site does not document but that exists: it links to upstream's
      generated API page. A reference to an object that does not exist still
      fails the build.
    """
    if node.get("refdomain") == "py":
        found = _torchrl_object(node)
        if found is None:
            return None
        path, split = found
        # Upstream generates one page per class or function of a module.
        page = ".".join(path.split(".")[: split + 1])
        anchor = "" if page == path else f"#{path}"
        ref = nodes.reference(
            "",
            "",
            internal=False,
            refuri=f"{UPSTREAM_DOCS}reference/generated/{page}.html{anchor}",
        )
        ref += contnode
        return ref
    if node.get("refdomain") != "std" or node.get("reftype") != "ref":
        return None
    # Sphinx lower-cases ``:ref:`` targets.
    page = _UPSTREAM_LABELS_LOWER.get(node.get("reftarget", "").lower())
    if page is None:
        return None
    ref = nodes.reference("", "", internal=False, refuri=UPSTREAM_DOCS + page)
    ref += contnode
    return ref


# The sphinx-gallery tutorials live in ``tutorials/sphinx-tutorials`` (where
# upstream keeps them). The gallery needs a header file next to them, which we
# write into a copy under ``_build`` so that no fork-only file sits in the
# upstream tree.
GALLERY_SRC = HERE.parent / "_build" / "gallery_src"
GALLERY_HEADER = """\
Tutorials
=========

Sequence reinforcement learning with the fork, executed when the site is
built.
"""


def _stage_tutorials() -> None:
    src = ROOT / "tutorials" / "sphinx-tutorials"
    GALLERY_SRC.mkdir(parents=True, exist_ok=True)
    wanted = {p.name for p in src.glob("*.py")}
    for stale in GALLERY_SRC.glob("*.py"):
        if stale.name not in wanted:
            stale.unlink()
    for path in sorted(src.glob("*.py")):
        dest = GALLERY_SRC / path.name
        if not dest.is_file() or dest.read_bytes() != path.read_bytes():
            shutil.copy2(path, dest)
    header = GALLERY_SRC / "GALLERY_HEADER.rst"
    if not header.is_file() or header.read_text() != GALLERY_HEADER:
        header.write_text(GALLERY_HEADER)


_stage_tutorials()

sphinx_gallery_conf = {
    "examples_dirs": os.path.relpath(GALLERY_SRC, HERE),
    "gallery_dirs": "gen_tutorials",
    # Every tutorial is executed, not only ``plot_*`` files.
    "filename_pattern": r"\.py$",
    "download_all_examples": False,
    "remove_config_comments": True,
    "abort_on_example_error": True,
    "only_warn_on_example_error": False,
    "plot_gallery": "True",
    "show_memory": False,
    "show_signature": False,
}


# Python cross-references (``:class:``, ``:func:``, ...) are checked strictly
# (``nitpicky``) on our own pages and tutorials. Docstrings of upstream
# classes point at much of TorchRL, torch and tensordict that this site does
# not document (upstream's site does): their misses are not reported.
nitpicky = True


def _quiet_upstream_docstrings(app, domain, node):
    if domain is None or domain.name != "py":
        return None
    source = node.source or ""
    if source.startswith(str(HERE)) and "docstring of" not in source:
        return None
    return True


def setup(app):
    app.connect("missing-reference", _upstream_label)
    app.connect("warn-missing-reference", _quiet_upstream_docstrings)

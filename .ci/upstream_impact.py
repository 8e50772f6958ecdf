# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""A pytest plugin for ``.ci/upstream_map.py``: which ``torchrl`` code each test runs.

Loaded with ``-p upstream_impact`` (its folder is put on ``PYTHONPATH``) when
``UPSTREAM_IMPACT=DIR`` is set. Each pytest process (the controller, or each
xdist worker) measures the lines of the imported ``torchrl`` package with
``coverage``, under one dynamic context per test: the test's node id while its
setup, call and teardown run, and ``fixture <scope> <baseid>::<name>`` while a
fixture of a wider scope than ``function`` is set up (such a fixture's work is
charged to every test that uses it, not to the first one only). It writes
``DIR/cov.<worker>.<pid>`` (a coverage data file) and
``DIR/fixtures.<worker>.<pid>.jsonl`` (the wide-scope fixtures of each test)
for the map builder.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest


def _out() -> Path | None:
    out = os.environ.get("UPSTREAM_IMPACT")
    return Path(out) if out else None


def pytest_configure(config):
    out = _out()
    if out is None or config.option.collectonly:
        return
    worker = getattr(config, "workerinput", {}).get("workerid", "main")
    if worker == "main" and getattr(config.option, "numprocesses", None):
        return  # the xdist controller runs no test
    # one pytest call per target: each process writes files of its own
    name = f"{worker}.{os.getpid()}"
    config.pluginmanager.register(_Tracer(out, name), "upstream_impact_tracer")


class _Tracer:
    def __init__(self, out: Path, worker: str):
        import coverage
        import torchrl

        out.mkdir(parents=True, exist_ok=True)
        root = Path(torchrl.__file__).resolve().parent
        self.cov = coverage.Coverage(
            data_file=str(out / f"cov.{worker}"),
            include=[f"{root}{os.sep}*"],
            config_file=False,
        )
        self.fixtures = open(out / f"fixtures.{worker}.jsonl", "w", encoding="utf-8")
        self.current = ""
        self.cov.start()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self.current = item.nodeid
        self.cov.switch_context(item.nodeid)
        wide = [
            [d.scope, d.baseid, d.argname]
            for defs in item._fixtureinfo.name2fixturedefs.values()
            for d in defs
            if d.scope != "function"
        ]
        self.fixtures.write(json.dumps([item.nodeid, wide]) + "\n")
        yield
        self.current = ""
        self.cov.switch_context("")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        if fixturedef.scope == "function":
            yield
            return
        self.cov.switch_context(
            f"fixture {fixturedef.scope} {fixturedef.baseid}::{fixturedef.argname}"
        )
        try:
            yield
        finally:
            self.cov.switch_context(self.current)

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config):
        self.cov.stop()
        self.cov.save()
        self.fixtures.close()

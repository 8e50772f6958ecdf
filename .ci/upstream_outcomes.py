# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""A pytest plugin for ``.ci/upstream_tests.py``: records outcomes, selects node ids.

Loaded with ``-p upstream_outcomes`` (its folder is put on ``PYTHONPATH``).

- ``UPSTREAM_OUTCOMES=FILE``: the controlling process (not an xdist worker)
  appends one JSON line per test phase report and per failed collection:
  ``{"nodeid", "when", "outcome", "duration", "message", "longrepr"}``.
- ``UPSTREAM_SELECT=FILE``: only the items whose node id (or a parent's node
  id: a module, a class) is listed in FILE, one per line, are run; the others
  are deselected. Ids that no longer exist are simply not run (pytest would
  refuse the whole command line for one unknown node id argument).
- ``UPSTREAM_DESELECT=FILE``: the items whose node id is listed in FILE are
  deselected (the tests the test-impact map shows cannot see the fork's
  change); every other item runs.
- ``UPSTREAM_ONLY=FILE``: ``PATH::FUNCTION`` lines; of the files named there,
  only the tests of those functions (any parametrization, in a class or not)
  are kept; other files are not restricted.
- ``UPSTREAM_FORKSERVER=MOD,MOD``: the default multiprocessing start method
  becomes ``forkserver`` with these modules preloaded in the server, set
  before any test module imports torchrl (which keeps a start method that is
  already set). Workers are still started from a pickled process object, as
  with ``spawn``, so every pickling path runs; only the imports that each
  ``spawn`` worker repeats (about 3 s of torch and tensordict) are done once
  per server. Tests that ask for a start method by name keep it.
"""
from __future__ import annotations

import json
import multiprocessing
import os

if os.environ.get("UPSTREAM_FORKSERVER"):
    multiprocessing.set_start_method("forkserver", force=True)
    multiprocessing.set_forkserver_preload(os.environ["UPSTREAM_FORKSERVER"].split(","))

_MAX_LONGREPR = 20000


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")


def _write(config, record: dict) -> None:
    path = os.environ.get("UPSTREAM_OUTCOMES")
    if not path or _is_worker(config):
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def _texts(report) -> tuple[str, str]:
    if not report.failed:
        return "", ""
    longrepr = str(report.longrepr or "")
    crash = getattr(report.longrepr, "reprcrash", None)
    message = getattr(crash, "message", None)
    if not message:
        lines = [line for line in longrepr.splitlines() if line.strip()]
        message = lines[-1] if lines else ""
    return message.splitlines()[0][:300] if message else "", longrepr[-_MAX_LONGREPR:]


def _read_ids(path: str) -> set[str]:
    with open(path, encoding="utf-8") as f:
        return {line.rstrip("\n") for line in f if line.strip()}


def pytest_configure(config):
    config.pluginmanager.register(_Recorder(config), "upstream_outcomes_recorder")


class _Recorder:
    def __init__(self, config):
        self.config = config

    def pytest_runtest_logreport(self, report):
        message, longrepr = _texts(report)
        outcome = report.outcome
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else outcome
        _write(
            self.config,
            {
                "nodeid": report.nodeid,
                "when": report.when,
                "outcome": outcome,
                "duration": round(report.duration, 4),
                "message": message,
                "longrepr": longrepr,
            },
        )

    def pytest_collectreport(self, report):
        if report.failed:
            message, longrepr = _texts(report)
            _write(
                self.config,
                {
                    "nodeid": report.nodeid,
                    "when": "collect",
                    "outcome": "failed",
                    "message": message,
                    "longrepr": longrepr,
                },
            )

    def pytest_collection_modifyitems(self, config, items):
        keep, drop = list(items), []
        path = os.environ.get("UPSTREAM_ONLY")
        if path:
            only = {tuple(line.split("::")) for line in _read_ids(path)}
            files = {f for f, _ in only}
            keep = []
            for item in items:
                parts = item.nodeid.split("::")
                name = parts[-1].split("[")[0]
                restricted = parts[0] in files
                (keep if not restricted or (parts[0], name) in only else drop).append(
                    item
                )
        path = os.environ.get("UPSTREAM_SELECT")
        if path:
            wanted = _read_ids(path)
            candidates, keep = keep, []
            for item in candidates:
                parts = item.nodeid.split("::")
                parents = {"::".join(parts[:i]) for i in range(1, len(parts) + 1)}
                (keep if parents & wanted else drop).append(item)
        path = os.environ.get("UPSTREAM_DESELECT")
        if path:
            unwanted = _read_ids(path)
            drop += [item for item in keep if item.nodeid in unwanted]
            keep = [item for item in keep if item.nodeid not in unwanted]
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep

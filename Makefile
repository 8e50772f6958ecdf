# torchrl-seqrl: every set-up step lives here, so a fresh clone needs nothing
# but Python 3.11 and the registries. Target names are a contract: CI and
# other tooling call them.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
FORK := $(PY) tools/fork.py
# requirements/*.txt name what each job needs; constraints.txt pins the rest.
CONSTRAINTS := requirements/constraints.txt
REQS := $(addprefix requirements/,runtime.txt build.txt test.txt examples.txt ray.txt)
OVERLAY := $(shell find torchrl -type f ! -path '*/__pycache__/*' 2>/dev/null)
# The fixes layer under the overlay: one format-patch per upstream bug fix.
FIXES := $(wildcard upstream-fixes/*)
# Our own Python files, held to upstream's lint bar.
OWN_PY = $(shell git ls-files --cached --others --exclude-standard -- '*.py')

.PHONY: install dev demo test pytest lint check docs bench upstream-diff \
	sync export wheel clean upstream-tests upstream-test-map upstream-prs fixes-workspace fixes-export

# The virtual environment with the pins (requirements/*.txt, UPSTREAM.toml).
$(VENV)/.deps: $(REQS) $(CONSTRAINTS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -c $(CONSTRAINTS) $(foreach r,$(REQS),-r $(r))
	touch $@

# Lint and docs toolchains are pinned for Python 3.11 (libcst 1.0.1 has no
# newer wheels): a unit-test run on another Python does not install them.
$(VENV)/.lint-deps: requirements/lint.txt $(CONSTRAINTS) | $(VENV)/.deps
	$(PIP) install -q -c $(CONSTRAINTS) -r requirements/lint.txt
	touch $@

$(VENV)/.docs-deps: requirements/docs.txt $(CONSTRAINTS) | $(VENV)/.deps
	$(PIP) install -q -c $(CONSTRAINTS) -r requirements/docs.txt
	touch $@

$(VENV)/.bench-deps: requirements/bench.txt $(CONSTRAINTS) | $(VENV)/.deps
	$(PIP) install -q -c $(CONSTRAINTS) -r requirements/bench.txt
	touch $@

$(VENV)/.upstream-test-deps: requirements/upstream-tests.txt $(CONSTRAINTS) | $(VENV)/.deps
	$(PIP) install -q -c $(CONSTRAINTS) -r requirements/upstream-tests.txt
	touch $@

# The fork's wheel, installed; rebuilt only when the overlay or tool changed.
$(VENV)/.installed: $(VENV)/.deps $(OVERLAY) $(FIXES) UPSTREAM.toml tools/fork.py setup.py pyproject.toml
	$(PIP) install -q --no-build-isolation --no-deps --force-reinstall .
	rm -f $(VENV)/.dev
	touch $@

install: $(VENV)/.installed

# Editable: the venv imports build/fork directly (edit there, then `make export`).
dev: $(VENV)/.deps build/fork
	$(PIP) install -q --no-deps --force-reinstall "$$($(FORK) wheel --editable)"
	rm -f $(VENV)/.installed
	touch $(VENV)/.dev

build/fork: | $(VENV)/.deps
	$(FORK) sync

sync: $(VENV)/.deps
	$(FORK) sync

export: $(VENV)/.deps
	$(FORK) export

check: $(VENV)/.deps
	$(FORK) check
	$(PY) .ci/upstream_map.py check

wheel: $(VENV)/.deps
	$(FORK) wheel

upstream-diff: $(VENV)/.deps
	@$(FORK) upstream-diff

# Patched upstream modules (as they are in build/fork) and all our own files.
lint: $(VENV)/.lint-deps build/fork
	$(VENV)/bin/ufmt check $(PATCHED_PY) $(OWN_PY)
	$(VENV)/bin/flake8 $(PATCHED_PY) $(OWN_PY)

PATCHED_PY = $(patsubst %.patch,build/fork/%,$(filter %.py.patch,$(OVERLAY)))

pytest:
	$(PY) -m pytest -n auto -q

test: install build/fork $(VENV)/.lint-deps $(VENV)/.docs-deps
	$(MAKE) --no-print-directory check lint pytest

# Upstream TorchRL 0.12.0's own suite against build/fork; what fails there is
# rerun on build/upstream (SIDES=both: pristine runs everything too). Exits
# non-zero on a test that passes on pristine and fails on the fork; the tests
# that fail on pristine too are listed in .ci/upstream-pristine-failures.txt.
# By default only the tests that the test-impact map (.ci/upstream_map.py) shows
# executing a function the fork changes run, with every test the map has not
# seen; FULL=1 runs them all. Multiprocess tests start their workers from a
# forkserver that has imported torch, tensordict and torchrl (pickled as with
# spawn, imported once); SPAWN=1 keeps torchrl's default start method.
UPSTREAM_TESTS ?= ../shared/upstream-tests-v0.12.0
SIDES ?= rerun
upstream-tests: $(VENV)/.upstream-test-deps build/fork
	$(PY) .ci/upstream_tests.py --tests $(UPSTREAM_TESTS) --sides $(SIDES) $(if $(FULL),--full) $(if $(SPAWN),--start-method default)

# The fixes layer as upstream pull requests: checks each fix on its own against
# pristine (applies, its new tests fail there and pass with it, flake8/ufmt)
# and writes the patches and PR texts into dist/upstream-prs/.
upstream-prs: $(VENV)/.upstream-test-deps $(VENV)/.lint-deps build/fork
	$(PY) tools/upstream_prs.py --tests $(UPSTREAM_TESTS) check

# Edit the fixes: build/fixes holds pristine + upstream's tests, a commit per fix.
fixes-workspace: $(VENV)/.deps build/fork
	$(PY) tools/upstream_prs.py --tests $(UPSTREAM_TESTS) workspace

fixes-export: $(VENV)/.deps
	$(PY) tools/upstream_prs.py --tests $(UPSTREAM_TESTS) export

# Records the test-impact map: upstream's suite on pristine under coverage
# (about an hour on 2 cores), folded into .ci/upstream-test-map.json.gz.
upstream-test-map: $(VENV)/.upstream-test-deps build/fork
	$(PY) .ci/upstream_tests.py --tests $(UPSTREAM_TESTS) --record-map --out build/upstream-map-run
	$(PY) .ci/upstream_map.py build --run build/upstream-map-run --tests $(UPSTREAM_TESTS)

# The main job: recurrent PPO learns CartPole without velocities (100k frames,
# about 2 minutes on 2 cores), then the replay-buffer pipeline example.
demo: install
	$(PY) examples/recurrent/recurrent_ppo.py
	$(PY) examples/replay-buffers/recurrent_slice_sampler_pipeline.py

# The documentation site (docs/source) against the fork installed in .venv,
# warnings as errors; the tutorials in tutorials/sphinx-tutorials are executed.
docs: install $(VENV)/.docs-deps
	$(PY) -m sphinx -W --keep-going -b html docs/source docs/_build/html

# Each benchmark prints the fork side by side with pristine upstream (or, for
# recurrent_ppo.py, with SB3-contrib), measured in one run.
bench: install build/fork $(VENV)/.bench-deps
	@for b in $(sort $(wildcard benchmarks/[!_]*.py)); do \
		echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf build dist $(VENV)

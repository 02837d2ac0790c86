# Two commands that work on a fresh machine (see README.md):
#   make quickstart   install dmlctl (+ torch 2.13.0 CPU) and train examples/quickstart here
#   make test         install dmlctl with its dev extras and run the whole test suite
# Everything goes into the project's own virtualenv .venv/, never into the system Python
# (Debian/Ubuntu refuse that, PEP 668, and it would hide undeclared dependencies).
# .venv/.installed-run records the last install of what running needs (dmlctl, torch),
# .venv/.installed that of the dev extras too (pytest, ruff, mypy, …): each is redone only
# when pyproject.toml changes. `make quickstart` installs no dev tool.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
RUN_STAMP := $(VENV)/.installed-run
STAMP := $(VENV)/.installed

.PHONY: install install-run quickstart test test-gpu test-compat lint bench

# Debian/Ubuntu ship venv's ensurepip in a separate package: say so in one line.
$(VPY):
	@$(PY) -c 'import ensurepip, venv' 2>/dev/null || { echo "make: $(PY) cannot create \
	a virtualenv (no ensurepip): run 'apt-get install python3-venv' (as root), then retry" >&2; \
	exit 1; }
	$(PY) -m venv $(VENV) || { rm -rf $(VENV); exit 1; }

$(RUN_STAMP): pyproject.toml | $(VPY)
	$(VPY) -m pip install --quiet --disable-pip-version-check torch==2.13.0 -e .
	touch $@

$(STAMP): pyproject.toml | $(VPY)
	$(VPY) -m pip install --quiet --disable-pip-version-check torch==2.13.0 -e '.[dev]'
	touch $@ $(RUN_STAMP)

# Byte-compile dmlctl's own modules (and the tests' helpers): an editable install has no
# .pyc of them, and where PYTHONDONTWRITEBYTECODE is set every process — each CLI call,
# host agent and fresh rank — would compile them again (about 0.1 s of a core each).
install-run: $(RUN_STAMP)
	@$(VPY) -m compileall -q dmlctl >/dev/null

install: $(STAMP)
	@$(VPY) -m compileall -q dmlctl tests >/dev/null

quickstart: install-run
	$(VENV)/bin/dmlctl launch examples/quickstart/job.yaml

# The suite in two parts, each ending with its slowest tests:
#   1. every test not marked `serial`, in $(TEST_WORKERS) pytest-xdist workers that each
#      take one group at a time (a file, or all of tests/ssh, all of tests/lab; see
#      tests/conftest.py), so the waiting of one group overlaps the work of another: 3
#      on 2 cores, the groups that wait on time (tests/ssh, tests/lab) in two of them and
#      the groups that compute at a lower priority in the third, filling the cores the
#      waiting leaves idle (tests/conftest.py, COMPUTING_NICE);
#   2. the `serial` tests (times bounded on an idle machine: hang detection, bench straggler,
#      a silent host), alone.
# `make test PYTEST_ARGS=tests/unit` (or PYTEST_ARGS='-m "not integration and not ssh"',
# which leaves out the serial part too) runs a part.
# Part 2 collects only the files that hold `serial` tests (collecting them all takes
# seconds), unless PYTEST_ARGS names what to run.
TEST_WORKERS ?= 3
PYTEST := $(VPY) -m pytest -q
SERIAL_FILES = $(shell grep -rl --include='test_*.py' 'mark\.serial' tests)
test: install
	$(PYTEST) -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder -m "not serial" --durations=30 $(PYTEST_ARGS)
	$(if $(findstring -m ,$(PYTEST_ARGS)),@echo "make: the serial part left out: PYTEST_ARGS chooses by mark",$(PYTEST) -m serial --durations=10 $(or $(PYTEST_ARGS),$(SERIAL_FILES)) || [ $$? -eq 5 ])  # 5: none selected

# The GPU suite (tests/gpu, marked `gpu`: every strategy on cuda:0, parameter servers fed
# by a GPU worker, the examples on one GPU). It needs PyTorch with CUDA, which `install`
# does not put in .venv/: run it with an interpreter that has it and dmlctl installed
# (`pip install -e '.[dev]'`), e.g. `make test-gpu GPU_PY=python3`. Without CUDA every
# test is skipped with the reason.
GPU_PY ?= $(VPY)
GPU_WORKERS ?= 4
test-gpu:
	$(GPU_PY) -m pytest -q -m gpu -n $(GPU_WORKERS) --durations=10 tests/gpu $(PYTEST_ARGS)

# The compatibility subset on another torch (`make test-compat TORCH=2.4.1`): a virtualenv
# of its own, .venv-compat-$(TORCH)/, with that torch and dmlctl's dev extras, then the
# tests marked `compat` (the quick start, a parameter-server strategy, a worker replaced
# in place, a failure restart, the environment compared with bare torchrun's, warm
# ranks). The package index's x86 wheels of older torch bring CUDA libraries (~3 GB a
# version): not part of `make test`; run it when the agent or the runtime changes.
TORCH ?= 2.13.0
COMPAT := .venv-compat-$(TORCH)
COMPAT_FILES = $(shell grep -rl --include='test_*.py' 'mark\.compat' tests)
test-compat:
	@test -x $(COMPAT)/bin/python || $(PY) -m venv $(COMPAT)
	$(COMPAT)/bin/python -m pip install --quiet --disable-pip-version-check \
		torch==$(TORCH) -e '.[dev]'
	$(COMPAT)/bin/python -c 'import torch; print("torch", torch.__version__)'
	$(COMPAT)/bin/python -m pytest -q -m compat -n 2 --durations=10 \
		$(or $(PYTEST_ARGS),$(COMPAT_FILES))

lint: install
	$(VPY) -m ruff check dmlctl tests examples
	$(VPY) -m ruff format --check dmlctl tests examples
	$(VPY) -m mypy

bench: install
	$(VENV)/bin/dmlctl bench launch
	$(VENV)/bin/dmlctl bench comm

# Two commands that work on a fresh machine (see README.md):
#   make quickstart   install dmlctl (+ torch 2.13.0 CPU) and train examples/quickstart here
#   make test         install dmlctl with its dev extras and run the whole test suite
PY ?= python3

.PHONY: install quickstart test lint bench

install:
	$(PY) -m pip install --quiet --disable-pip-version-check torch==2.13.0 -e '.[dev]'

quickstart: install
	$(PY) -m dmlctl launch examples/quickstart/job.yaml

test: install
	$(PY) -m pytest -q

lint: install
	$(PY) -m ruff check dmlctl tests
	$(PY) -m mypy

bench: install
	$(PY) -m dmlctl bench launch
	$(PY) -m dmlctl bench comm

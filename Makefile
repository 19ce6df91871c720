# The two commands of the README's first screen.  Both install what they need first.
VENV ?= .venv
export VENV

.PHONY: demo test bench setup

setup:
	@scripts/setup.sh

demo: setup
	$(VENV)/bin/sharedfs demo

test: setup
	$(VENV)/bin/python -m pytest

bench: setup
	$(VENV)/bin/python benchmarks/run_all.py

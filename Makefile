# The README's commands.  Each installs what it needs first.
VENV ?= .venv
export VENV
# make test's concurrent workers (pytest-xdist): the tests mostly wait (lags, lease expiries, Slurm
# polls, FUSE round trips), so more workers than cores; tests that share a Slurm cluster, a venv or a
# module's users stay together on one worker (xdist_group marks, --dist loadgroup).
TEST_WORKERS ?= 4

.PHONY: demo test check bench setup

setup:
	@scripts/setup.sh

demo: setup
	$(VENV)/bin/sharedfs demo

# The whole suite: unit, system (root, FUSE, users, mounts) and integration (real frameworks).
test: setup
	$(VENV)/bin/python -m pytest -n $(TEST_WORKERS) --dist loadgroup

# The maintainer's loop: static checks and the unit tests, no root, FUSE, users or framework venvs.
check: $(VENV)/.sharedfs-lint
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy sharedfs plugins shims
	$(VENV)/bin/python scripts/lint-imports
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) tests/unit

# The venv with sharedfs and the test requirements (scripts/setup.sh without its framework venvs), plus
# the linters; remade when their pins change.
$(VENV)/.sharedfs-lint: scripts/requirements-lint.txt scripts/requirements-test.txt scripts/constraints.txt pyproject.toml
	@SHAREDFS_SETUP_FRAMEWORK_VENVS=0 scripts/setup.sh
	$(VENV)/bin/python -m pip install -q --disable-pip-version-check -r scripts/requirements-lint.txt \
		-c scripts/constraints.txt
	@touch $@

bench: setup
	$(VENV)/bin/python benchmarks/run_all.py

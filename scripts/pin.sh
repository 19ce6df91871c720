#!/usr/bin/env bash
# Re-pin the main environment: resolve what `make test`, CI's static checks and the upstream suites
# install (the requirements files name only what they use), in a throwaway venv, and write every
# package it resolved to scripts/constraints.txt.  scripts/setup.sh, .ci/run and tests/upstream/run.py
# install under those constraints, so a fresh machine reproduces CI exactly.  Run it on purpose
# (after `scripts/compat.py --newest` says what moved), read the diff, run `make test`, commit.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PYTHON" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]' \
    -r scripts/requirements-test.txt -r scripts/requirements-lint.txt -r tests/upstream/requirements.txt
"$tmp/venv/bin/python" -m pip check
{
    echo "# Every package of the main environment (make test, CI's static checks, tests/upstream/run.py),"
    echo "# as scripts/pin.sh resolved it on Python $("$tmp/venv/bin/python" -c 'import platform; print(platform.python_version())') ($(date -u +%Y-%m-%d)).  Installed as constraints, so a fresh"
    echo "# machine gets exactly what CI ran; regenerate with scripts/pin.sh, never by hand."
    "$tmp/venv/bin/python" -m pip freeze --exclude-editable --disable-pip-version-check
} > scripts/constraints.txt
echo "pin: wrote scripts/constraints.txt ($(grep -vc '^#' scripts/constraints.txt) packages)"

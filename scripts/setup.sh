#!/usr/bin/env bash
# Install everything sharedfs's demo and tests need on a fresh Debian/Ubuntu machine:
# system packages for the FUSE test filesystems, then a virtual environment with sharedfs
# (editable) and the real frameworks it patches.  Idempotent; safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
APT_PACKAGES=(fuse3 libfuse3-3 libfuse2 gcc g++ ninja-build python3-dev acl strace slurmctld slurmd slurm-client munge chromium moosefs-master moosefs-chunkserver moosefs-client glusterfs-server glusterfs-client s3fs)  # acl: the non-root demo test; strace: `sharedfs locks` calls per entry; slurm: the test cluster; chromium: the docs site's search (tests/integration/test_docs_search.py); moosefs, glusterfs: real distributed filesystems (sharedfs.demo.realfs); s3fs: a bucket mount against a local S3 server (tests/integration/test_realfs_naming.py)

need_apt=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || need_apt+=("$pkg")
done
if ((${#need_apt[@]})); then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "setup: installing system packages: ${need_apt[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
    else
        echo "setup: missing system packages ${need_apt[*]} (needs root: apt-get install ${need_apt[*]});" \
             "FUSE scenarios will use the LD_PRELOAD fallback" >&2
    fi
fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.sharedfs-setup"
# The install copies autoload/ into site-packages (hatch_build.py), so a changed .pth reinstalls too.
want="$(cat pyproject.toml hatch_build.py autoload/sharedfs.pth autoload/sharedfs.start scripts/requirements-test.txt scripts/requirements-lint.txt scripts/constraints.txt | sha1sum)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "setup: installing sharedfs, the test requirements and the linters into $VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]' -r scripts/requirements-test.txt \
        -r scripts/requirements-lint.txt -c scripts/constraints.txt  # every package pinned (scripts/pin.sh)
    echo "$want" > "$stamp"
    touch "$VENV/.sharedfs-lint"  # make check's linters are in: its first run after setup installs nothing
fi
# yapf (mmengine imports it) rewrites its grammar pickle in ~/.cache/YAPF, non-atomically, whenever the
# venv's grammar file is newer: make test's workers all importing mmengine from a fresh venv raced on it
# (EOFError at collection).  Written once here, before any worker starts.
"$VENV/bin/python" -c 'import importlib.util as u; u.find_spec("yapf") and __import__("yapf")'

# `make check` needs none of the framework venvs below.
[ "${SHAREDFS_SETUP_FRAMEWORK_VENVS:-1}" = 0 ] && exit 0

# OLMo-core 3.x cannot live in this venv (it needs filelock<4 and huggingface-hub<2): the demo's OLMo#829
# scenario and tests/integration/test_olmo_core.py run it in a pinned venv of its own, built once here
# (~1.2 GB under ${SHAREDFS_TEST_VENV_CACHE:-/var/tmp/sharedfs-test-venvs}) so the demo does not pay for it.
"$VENV/bin/python" -c 'from sharedfs.demo.olmo_core_job import olmo_core_venv; olmo_core_venv(lambda line: print("setup: " + line))'

#!/usr/bin/env bash
# Install what is missing, then run the whole test suite on CPU (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
# The grading-at-scale tests start a real PostgreSQL server (Debian's package) on 127.0.0.1; the sandbox tests
# grade in bubblewrap (install.sh installs it where it can); the Slurm recipe runs on a single-node Slurm cluster;
# the browser tests drive Debian's chromium.
missing=""
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$missing postgresql"
command -v bwrap >/dev/null || missing="$missing bubblewrap"
PATH="$PATH:/usr/sbin" command -v slurmd >/dev/null || missing="$missing slurm-wlm munge"  # tests/test_deploy.py: a real Slurm
command -v chromium >/dev/null || missing="$missing chromium"
command -v chromedriver >/dev/null || missing="$missing chromium-driver"
if [ -n "$missing" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing$missing for the tests"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
fi
export MPLBACKEND=Agg
# Lint first (pyproject.toml [tool.ruff]): a few seconds, and the suite does not start on code that fails it.
"${PYTHON:-python3}" -m ruff check --quiet
# Two test processes (pytest-xdist), each running whole modules (tests/conftest.py orders the longest first); a
# single grading leaves a core idle much of the time. TEST_WORKERS=1 runs the suite in one process.
"${PYTHON:-python3}" -m pytest tests -n "${TEST_WORKERS:-2}" --dist loadfile "$@"

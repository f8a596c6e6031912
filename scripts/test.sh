#!/usr/bin/env bash
# Install what is missing, then run the whole test suite on CPU (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
# The grading-at-scale tests start a real PostgreSQL server (Debian's package) on 127.0.0.1.
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing PostgreSQL for the gradebook tests"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
export MPLBACKEND=Agg
"${PYTHON:-python3}" -m pytest tests "$@"

#!/usr/bin/env bash
# Install what is missing, then run the whole test suite on CPU (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export MPLBACKEND=Agg
"${PYTHON:-python3}" -m pytest tests "$@"

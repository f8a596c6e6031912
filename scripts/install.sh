#!/usr/bin/env bash
# Install what the labs and the course tooling need into the current Python environment (3.10-3.12),
# skipping what is already there. Use a virtual environment: python3 -m venv .venv && . .venv/bin/activate
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"

"$PY" -c 'import sys; v = sys.version_info[:2]; ok = (3, 10) <= v <= (3, 12); print(f"python {v[0]}.{v[1]}" + ("" if ok else " (untested: the labs support 3.10-3.12)"))'

if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  # Any torch in requirements.txt's range works; 2.13 is the one the course is tested with.
  echo "installing torch 2.13 (for a specific CUDA build see pytorch.org, then rerun this script)"
  "$PY" -m pip install --quiet "torch==2.13.*"
fi
"$PY" -m pip install --quiet -r requirements-course.txt  # requirements.txt (students) + grading tools
# The course tooling as a package (pyproject.toml), so nbgrader finds our extensions from any course folder, and
# jupyter_client the grading kernels' provisioner (its entry point). -I: without this folder on sys.path, so only an
# installed `course` that is this checkout's counts; an install older than the entry point is installed again.
if ! "$PY" -I -c 'import course, os, sys; from importlib.metadata import entry_points; sys.exit(os.path.dirname(os.path.dirname(os.path.realpath(course.__file__))) != os.path.realpath(sys.argv[1]) or not entry_points(group="jupyter_client.kernel_provisioners", name="efficient-ai-sandbox"))' "$PWD" 2>/dev/null; then
  "$PY" -m pip install --quiet -e .
fi

# Grading runs every student's kernel in a bubblewrap sandbox (course/grader/sandbox.py); without bwrap it runs unsandboxed.
if ! command -v bwrap >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing bubblewrap (the grading sandbox)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null
  else
    echo "bubblewrap is missing: grading will not be sandboxed (Debian/Ubuntu: sudo apt-get install bubblewrap)"
  fi
fi

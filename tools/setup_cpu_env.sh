#!/usr/bin/env bash
# Create .venv (Python 3.11) with the CPU test environment and this package installed (editable).
# Idempotent: re-running only installs what is missing. Used by the README and by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -r requirements-cpu.txt
python -m pip install -q --no-deps sglang==0.5.23
python -m pip install -q --no-deps --no-build-isolation -e .
python -c "import sglang_spec, sglang.srt.server_args; print('sglang-spec environment ready:', sglang_spec.__version__)"

#!/usr/bin/env bash
# Create .venv (Python 3.11) with the CPU test environment and this package installed (editable).
# Idempotent: re-running only installs what is missing. Used by the README and by .ci/run.
# Prints one progress line per step (the requirements step takes a few minutes on a fresh machine).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
step() { echo "[setup ${SECONDS}s] $*"; }
step "1/5 virtual environment .venv ($PY)"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
step "2/5 upgrading pip"
python -m pip install -q --upgrade pip
step "3/5 requirements-cpu.txt: torch (CPU), transformers, test tools -- the long step, minutes on a fresh machine"
python -m pip install -q -r requirements-cpu.txt
step "4/5 sglang==0.5.23 without its GPU dependencies"
python -m pip install -q --no-deps sglang==0.5.23
step "5/5 this package (editable)"
# setuptools prints an "Editable installation" notice for every editable install; it is not about
# this project's packaging (tests/test_packaging.py checks that the build has nothing to warn about).
PYTHONWARNINGS="ignore:Editable installation" \
  python -m pip install -q --no-deps --no-build-isolation -e .
python -c "import sglang_spec, sglang.srt.server_args; print('sglang-spec environment ready:', sglang_spec.__version__)"
step "done"

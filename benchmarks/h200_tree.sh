#!/usr/bin/env bash
# Run on the lent H200 from the repo root: the tree-core benchmark (with its correctness checks),
# full grid. Writes the table to $OUT/tree_h200.md.
set -euo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -m benchmarks.tree --device cuda 2>&1 | tee "${OUT:-/tmp}/tree_h200.md"

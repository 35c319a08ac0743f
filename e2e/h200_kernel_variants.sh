#!/usr/bin/env bash
# Time kernel branches against the checked-out kernel in one device call (the device runs this
# checkout, without git, so the branches' files travel as an untracked folder).
#   bash e2e/h200_kernel_variants.sh prepare main gdnlevel   # here: alt/<branch>/ from git
#   source .gpu-kit/setup.sh && OUT=$OUT bash e2e/h200_kernel_variants.sh run   # on the H200
# `run` times the checked-out kernel first as variant `checkout`, then each alt/<branch>/ with its
# files copied over the tracked ones, then restores them: `benchmarks/gdn_tree_recurrence.py
# --sweep` per variant into $OUT/<variant>.md and .json (checks included: a wrong kernel fails its
# run). FILES lists what a variant replaces; VARIANT_ARGS replaces the benchmark's arguments
# (default --sweep), e.g. VARIANT_ARGS="--sweep --bs 1 8 32 --widths 17 32 64".
#   OUT=$OUT bash e2e/h200_kernel_variants.sh pick 1 64   # after run: keep the fastest at bs 1, N 64
# `pick BS N` reads run's $OUT/*.json and leaves the variant with the smallest fused time at that
# cell (its checks passed) checked out, so that the rest of the same device call (servers, tests)
# runs it. PICK_TIME names the benchmark's time to compare (default fused_us, the walk's fused
# kernel; wy_fused_us for the WY verify the patched server runs, with VARIANT_ARGS="--wy ...").
set -uo pipefail
shopt -s nullglob
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# the kernels (the walk's; since session 31 the WY verify's; since session 33 the tree conv's),
# the verify entry point the benchmark calls (its signature follows the kernel's scratch; session
# 14's baseline variant failed on main's), and the benchmark
FILES=(sglang_spec/gdn/triton_tree_recurrence.py sglang_spec/gdn/triton_tree_wy.py sglang_spec/gdn/triton_tree_conv.py sglang_spec/gdn/sglang_verify.py benchmarks/gdn_tree_recurrence.py)
case "${1:-}" in
prepare)
  shift
  [ $# -ge 1 ] || { echo "usage: $0 prepare BRANCH..."; exit 2; }
  for br in "$@"; do
    # the checked-out files are variant `checkout`: an alt/checkout/ would overwrite its results
    [ "$(basename "$br")" != checkout ] || { echo "a variant named checkout is the checked-out tree; prepare another branch name"; exit 2; }
    git rev-parse --verify -q "$br" >/dev/null || { echo "no branch $br"; exit 2; }
    for f in "${FILES[@]}"; do
      mkdir -p "alt/$br/$(dirname "$f")"
      git show "$br:$f" >"alt/$br/$f"
    done
    echo "alt/$br: ${FILES[*]} from $(git rev-parse --short "$br")"
  done
  ;;
run)
  OUT=${OUT:?set OUT}
  mkdir -p "$OUT" /tmp/kernel_variants_main
  for f in "${FILES[@]}"; do install -D "$f" "/tmp/kernel_variants_main/$f"; done
  rc=0
  for variant in checkout alt/*/; do
    name=$(basename "$variant")
    if [ "$variant" != checkout ]; then
      for f in "${FILES[@]}"; do cp "$variant/$f" "$f"; done
    fi
    timeout "${VARIANT_LIMIT_S:-200}" "${SGLANG_KIT_PYTHON:-python3}" benchmarks/gdn_tree_recurrence.py \
      ${VARIANT_ARGS:---sweep} --json "$OUT/$name.json" >"$OUT/$name.md" 2>&1
    status=$?
    echo "$name rc $status"
    [ $status -eq 0 ] || rc=1
    grep -E '^\| (1|8|32) \| [0-9]+ \|' "$OUT/$name.md" | head -12
    for f in "${FILES[@]}"; do cp "/tmp/kernel_variants_main/$f" "$f"; done
  done
  exit $rc
  ;;
pick)
  OUT=${OUT:?set OUT}
  [ $# -eq 3 ] || { echo "usage: $0 pick BS N"; exit 2; }
  best=$("${SGLANG_KIT_PYTHON:-python3}" - "$OUT" "$2" "$3" "${PICK_TIME:-fused_us}" <<'PY'
import json
import pathlib
import sys

out, bs, n, key = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
times = {}
for f in sorted(out.glob("*.json")):
    for row in json.loads(f.read_text())["rows"]:
        if row["bs"] == bs and row["N"] == n and row["ok"] and key in row:
            times[f.stem] = row[key]
if not times:
    sys.exit(f"pick: no variant in {out} timed {key} at bs {bs}, N {n} with its checks passed")
print(min(times, key=times.get))
PY
) || exit 2
  echo "pick: fastest (${PICK_TIME:-fused_us}) at bs $2, N $3: $best"
  if [ "$best" != checkout ]; then
    for f in "${FILES[@]}"; do cp "alt/$best/$f" "$f"; done
  fi
  ;;
*)
  echo "usage: $0 prepare BRANCH... | run | pick BS N"
  exit 2
  ;;
esac

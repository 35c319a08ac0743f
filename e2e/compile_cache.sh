#!/usr/bin/env bash
# Triton and SGLang JIT compile caches across device calls (a fresh device machine starts with
# empty caches: on the 27B shape the GDN prefill/conv kernels alone compile for 20-45 s at serving
# time, inside a 10-minute call). Run after `source .gpu-kit/setup.sh` (it sets both cache dirs):
#   bash e2e/compile_cache.sh restore            # unpack .compile-cache/caches.tar.xz (or
#                                                # $COMPILE_CACHE), if carried
#   bash e2e/compile_cache.sh save "$OUT"        # pack both caches to $OUT/compile-cache.tar.xz
# Between calls, copy the returned file to .compile-cache/ (ignored) and carry that folder.
# The tarball is refused above 15 MiB (what a call can bring back per file is 16 MiB) and above
# what the next call could carry beside this checkout (kit included): 64 MiB less the checkout
# (what git would carry, and the kit), less a 0.5 MiB margin.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIRS=("${TRITON_CACHE_DIR:?source .gpu-kit/setup.sh first}" "${SGLANG_JIT_CACHE_DIR:?}")
case "${1:-}" in
restore)
  f="${COMPILE_CACHE:-$HERE/.compile-cache/caches.tar.xz}"
  if [ -f "$f" ]; then
    tar xJf "$f" -C / && echo "compile_cache: restored $(du -sh "$f" | cut -f1) into ${DIRS[*]}"
  else
    echo "compile_cache: nothing to restore ($f absent)"
  fi
  ;;
save)
  out="${2:?usage: compile_cache.sh save OUTDIR}"
  present=()
  for d in "${DIRS[@]}"; do [ -d "$d" ] && present+=("${d#/}"); done
  [ ${#present[@]} -eq 0 ] && { echo "compile_cache: no cache to save"; exit 0; }
  # xz -9e on every core: about 11 MB where tar's default -6 gives 14.5 MB, which no longer
  # fitted the 64 MiB a device call carries beside the kit and the project (session 12)
  tar cf - -C / "${present[@]}" | xz -9e -T0 >"$out/compile-cache.tar.xz"
  size=$(stat -c %s "$out/compile-cache.tar.xz")
  # what a call carries: the files git would (tracked, and untracked but not ignored) plus the kit.
  # Not `du` of the folder: the device's copy has a .git (session 28: -42 MB of room) and the
  # build/ a `pip install .` of the plugin leaves, 20 MB with the fixtures (session 29: -9 MB)
  listed=$(mktemp)  # not in $out: whatever is there goes back with the call
  (cd "$HERE" && git ls-files -co --exclude-standard -z >"$listed") ||
    { echo "compile_cache: $HERE is not a git checkout, cannot tell what a call carries; not saved"; rm -f "$out/compile-cache.tar.xz" "$listed"; exit 1; }
  checkout=$(cd "$HERE" && du -cb --files0-from="$listed" | tail -n 1 | cut -f1)
  rm -f "$listed"
  kit=$(du -sb "$HERE/.gpu-kit" 2>/dev/null | cut -f1)
  checkout=$((checkout + ${kit:-0}))
  room=$((64 * 1024 * 1024 - checkout - 512 * 1024))
  limit=$((15 * 1024 * 1024 < room ? 15 * 1024 * 1024 : room))
  if [ "$size" -gt "$limit" ]; then
    rm -f "$out/compile-cache.tar.xz"
    echo "compile_cache: $size bytes is over $limit (15 MiB, or what a call carries beside this $checkout-byte checkout), not saved"
  else
    echo "compile_cache: saved $size bytes ($limit allowed)"
  fi
  ;;
*)
  echo "usage: compile_cache.sh restore | save OUTDIR (got '${1:-}')" >&2
  exit 2
  ;;
esac

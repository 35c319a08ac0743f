"""Locate an SGLang tree, detect its version, and apply / check / revert our patch set.

Everything is decided before the first byte is written: each touched file's sha256 must
be the manifest's original (to apply) or patched (to revert) hash, and the new contents
are computed in memory and hashed against the manifest. Writing then replaces files one
by one (temp file + os.replace, mode preserved); if any write fails, the files already
replaced get their previous bytes back, so the tree is never left half patched.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import sglang_spec.patching.udiff as udiff
from sglang_spec.paths import shipped_dir

MANIFEST = "manifest.json"
SUPPORT = "support.json"  # the matrix written by `python -m sglang_spec.patching.survey`

ORIGINAL, PATCHED, MODIFIED, MISSING = "original", "patched", "modified", "missing"
APPLIED, NOT_APPLIED, PARTIAL, FOREIGN = (
    "applied",
    "not applied",
    "partially applied",
    "modified by someone else",
)


class PatchingError(Exception):
    """Refusal or failure; ``exit_code`` is what the CLI returns."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------- locating sglang


@dataclass
class SglangTree:
    root: Path  # the directory that CONTAINS the sglang/ package
    how: str  # how it was found, for the report

    @property
    def package(self) -> Path:
        return self.root / "sglang"


def _is_package_dir(p: Path) -> bool:
    return p.is_dir() and ((p / "__init__.py").is_file() or (p / "version.py").is_file())


def locate(sglang_dir: str | None) -> SglangTree:
    """``sglang_dir`` may be the directory containing ``sglang/`` or the package itself."""
    if sglang_dir is not None:
        p = Path(sglang_dir).resolve()
        if _is_package_dir(p / "sglang"):
            return SglangTree(p, f"--sglang-dir {sglang_dir} (directory containing sglang/)")
        if p.name == "sglang" and _is_package_dir(p):
            return SglangTree(p.parent, f"--sglang-dir {sglang_dir} (the sglang package itself)")
        raise PatchingError(
            f"--sglang-dir {sglang_dir}: neither it nor {p / 'sglang'} is an sglang package "
            "(expected __init__.py or version.py)",
            2,
        )
    # find_spec on a top-level name locates the package without executing it.
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise PatchingError("sglang is not installed in this Python; pass --sglang-dir DIR", 2)
    pkg = Path(list(spec.submodule_search_locations)[0]).resolve()
    return SglangTree(pkg.parent, f"installed package at {pkg}")


_VERSION_RES = [
    # sglang/_version.py (generated at build): "__version__ = version = '0.5.23'"
    (
        "sglang/_version.py",
        re.compile(r"^__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]", re.M),
    ),
    # sglang/version.py in releases that hard-code it: '__version__ = "0.4.6"'
    ("sglang/version.py", re.compile(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", re.M)),
]


def detect_version(tree: SglangTree) -> tuple[str, str]:
    """Return (version, where it was read). Reads text only; never imports sglang."""
    for rel, rx in _VERSION_RES:
        f = tree.root / rel
        if f.is_file():
            m = rx.search(f.read_text(encoding="utf-8", errors="replace"))
            if m:
                return m.group(1), str(f)
    for meta in sorted(tree.root.glob("sglang-*.dist-info/METADATA")):
        m = re.search(
            r"^Version:\s*(\S+)", meta.read_text(encoding="utf-8", errors="replace"), re.M
        )
        if m:
            return m.group(1), str(meta)
    raise PatchingError(f"cannot read the sglang version under {tree.root}", 2)


# ---------------------------------------------------------------- patch sets


def default_patches_dir() -> Path:
    env = os.environ.get("SGLANG_SPEC_PATCHES_DIR")
    if env:
        return Path(env)
    return shipped_dir("patches")


def supported_versions(patches_dir: Path) -> list[str]:
    if not patches_dir.is_dir():
        return []
    return sorted(p.name for p in patches_dir.iterdir() if (p / MANIFEST).is_file())


@dataclass
class PatchSet:
    version: str
    directory: Path
    series: list[str]
    files: dict[str, dict]  # rel path -> {"original_sha256", "patched_sha256", "patches"}
    parsed: list[tuple[str, list[udiff.FilePatch]]]


def support_matrix(patches_dir: Path) -> dict[str, dict]:
    """release -> {status, why, register, dflash_worker_v2, needs_met, ...} from support.json
    (empty when the file is absent)."""
    f = patches_dir / SUPPORT
    return json.loads(f.read_text())["releases"] if f.is_file() else {}


def unsupported_reason(patches_dir: Path, version: str) -> str:
    """One line: why ``version`` has no patch set, from the support matrix."""
    pins = ", ".join(supported_versions(patches_dir)) or "(none found)"
    entry = support_matrix(patches_dir).get(version)
    if entry is not None:
        why = f"sglang {version} is not supported: {entry['why']}"
    else:
        why = f"sglang {version} is not in the support matrix ({patches_dir / SUPPORT})"
    return f"{why}; supported pins: {pins} (sglang-spec patch --list)"


def load_patch_set(patches_dir: Path, version: str) -> PatchSet:
    d = patches_dir / version
    if not (d / MANIFEST).is_file():
        raise PatchingError(unsupported_reason(patches_dir, version), 2)
    manifest = json.loads((d / MANIFEST).read_text())
    if manifest.get("sglang_version") != version:
        raise PatchingError(
            f"{d / MANIFEST} is for {manifest.get('sglang_version')}, not {version}", 2
        )
    parsed = [(name, udiff.parse((d / name).read_bytes())) for name in manifest["series"]]
    touched = {fp.path for _, fps in parsed for fp in fps}
    if touched != set(manifest["files"]):
        raise PatchingError(f"{d / MANIFEST} does not list exactly the files the patches touch", 2)
    return PatchSet(version, d, list(manifest["series"]), manifest["files"], parsed)


def patched_contents(ps: PatchSet, originals: dict[str, bytes]) -> dict[str, bytes]:
    """Apply the whole series in memory to the given original contents."""
    out = dict(originals)
    for name, fps in ps.parsed:
        for fp in fps:
            try:
                out[fp.path] = udiff.apply(out[fp.path], fp)
            except udiff.PatchError as e:
                raise PatchingError(f"{name}: {e}") from e
    return out


def reverted_contents(
    ps: PatchSet, patched: dict[str, bytes], only: set[str] | None = None
) -> dict[str, bytes]:
    """Reverse the series in memory (restricted to the files in ``only`` if given)."""
    out = dict(patched)
    for name, fps in reversed(ps.parsed):
        for fp in reversed(fps):
            if only is not None and fp.path not in only:
                continue
            try:
                out[fp.path] = udiff.apply(out[fp.path], fp.reversed())
            except udiff.PatchError as e:
                raise PatchingError(f"{name} (reverse): {e}") from e
    return out


def build_manifest(patches_dir: Path, version: str, pristine: SglangTree) -> dict:
    """Maintainer helper: compute the manifest from a pristine tree and the series file."""
    d = patches_dir / version
    series_file = d / "series"
    series = [
        ln.strip()
        for ln in series_file.read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    parsed = [(n, udiff.parse((d / n).read_bytes())) for n in series]
    files: dict[str, dict] = {}
    for n, fps in parsed:
        for fp in fps:
            files.setdefault(fp.path, {"patches": []})["patches"].append(n)
    originals = {rel: (pristine.root / rel).read_bytes() for rel in files}
    ps = PatchSet(version, d, series, files, parsed)
    new = patched_contents(ps, originals)
    if reverted_contents(ps, new) != originals:
        raise PatchingError("series does not reverse cleanly")
    for rel in files:
        files[rel]["original_sha256"] = sha256(originals[rel])
        files[rel]["patched_sha256"] = sha256(new[rel])
    return {
        "sglang_version": version,
        "series": series,
        "files": {k: files[k] for k in sorted(files)},
    }


# ---------------------------------------------------------------- state


@dataclass
class TreeState:
    overall: str
    per_file: dict[str, str]
    contents: dict[str, bytes]  # current bytes of every file that exists


def inspect_state(tree: SglangTree, ps: PatchSet) -> TreeState:
    per_file, contents = {}, {}
    for rel, h in ps.files.items():
        f = tree.root / rel
        if not f.is_file():
            per_file[rel] = MISSING
            continue
        data = f.read_bytes()
        contents[rel] = data
        digest = sha256(data)
        per_file[rel] = (
            ORIGINAL
            if digest == h["original_sha256"]
            else PATCHED
            if digest == h["patched_sha256"]
            else MODIFIED
        )
    states = set(per_file.values())
    if states & {MODIFIED, MISSING}:
        overall = FOREIGN
    elif states == {PATCHED}:
        overall = APPLIED
    elif states == {ORIGINAL}:
        overall = NOT_APPLIED
    else:
        overall = PARTIAL
    return TreeState(overall, per_file, contents)


# ---------------------------------------------------------------- transactional write


def _replace_file(path: Path, data: bytes) -> None:
    """Atomically replace ``path`` with ``data``, keeping its permission bits."""
    mode = path.stat().st_mode & 0o7777
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".sglang-spec.tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _drop_bytecode(path: Path) -> list[Path]:
    """Remove cached bytecode of a rewritten module so that no stale .pyc can be used."""
    removed = []
    cache = path.parent / "__pycache__"
    if cache.is_dir():
        for pyc in cache.glob(f"{path.stem}.*.pyc"):
            try:
                pyc.unlink()
                removed.append(pyc)
            except OSError:
                pass
    return removed


def write_all(tree: SglangTree, old: dict[str, bytes], new: dict[str, bytes]) -> list[str]:
    """Write every changed file or none: on failure, restore the ones already written."""
    todo = [rel for rel in sorted(new) if new[rel] != old[rel]]
    done: list[str] = []
    try:
        for rel in todo:
            _replace_file(tree.root / rel, new[rel])
            done.append(rel)
    except BaseException as exc:
        failed_restore = []
        for rel in reversed(done):
            try:
                _replace_file(tree.root / rel, old[rel])
            except BaseException:  # keep restoring the others
                failed_restore.append(rel)
        msg = f"writing {tree.root / todo[len(done)]} failed ({exc!r}); "
        if failed_restore:
            msg += (
                "could NOT restore: "
                + ", ".join(failed_restore)
                + " -- run `sglang-spec patch check` and reinstall sglang"
            )
        else:
            msg += f"rolled back {len(done)} file(s); the tree is unchanged"
        raise PatchingError(msg) from exc
    for rel in todo:
        _drop_bytecode(tree.root / rel)
    return todo


# ---------------------------------------------------------------- operations


@dataclass
class Result:
    code: int
    lines: list[str]


def _prepare(sglang_dir: str | None, patches_dir: Path | None):
    tree = locate(sglang_dir)
    version, source = detect_version(tree)
    ps = load_patch_set(patches_dir or default_patches_dir(), version)
    head = [
        f"sglang {version} (read from {source})",
        f"tree: {tree.root} [{tree.how}]",
        f"patch set: {ps.directory} ({len(ps.series)} patch(es), {len(ps.files)} file(s))",
    ]
    return tree, ps, head


def _state_lines(st: TreeState, ps: PatchSet) -> list[str]:
    return [
        f"  {st.per_file[rel]:>9}  {rel}  ({', '.join(ps.files[rel]['patches'])})"
        for rel in sorted(ps.files)
    ]


def installed_state(sglang_dir: str | None = None, patches_dir: Path | None = None) -> str:
    """Overall patch state (``applied`` / ``not applied`` / ...) of the sglang this Python imports."""
    tree, ps, _ = _prepare(sglang_dir, patches_dir)
    return inspect_state(tree, ps).overall


def check(sglang_dir: str | None = None, patches_dir: Path | None = None) -> Result:
    tree, ps, lines = _prepare(sglang_dir, patches_dir)
    st = inspect_state(tree, ps)
    lines += [f"state: {st.overall}"] + _state_lines(st, ps)
    return Result(0 if st.overall == APPLIED else 1, lines)


def _originals(st: TreeState, ps: PatchSet, verb: str, lines: list[str]) -> dict[str, bytes]:
    """The release's original bytes of every touched file, rebuilt in memory (patched files are
    reverted) and checked against the manifest; refuses a tree someone else modified."""
    if st.overall == FOREIGN:
        raise PatchingError(
            "\n".join(
                lines
                + [
                    f"refusing to {verb}: files differ from both the original and the patched "
                    "release (sha256 mismatch); nothing was changed"
                ]
                + _state_lines(st, ps)
            )
        )
    patched_now = {rel for rel, s in st.per_file.items() if s == PATCHED}
    originals = reverted_contents(ps, st.contents, only=patched_now)
    for rel, h in ps.files.items():
        if sha256(originals[rel]) != h["original_sha256"]:
            raise PatchingError(
                f"reverted {rel} does not match the original hash; nothing was changed"
            )
    return originals


def apply(sglang_dir: str | None = None, patches_dir: Path | None = None) -> Result:
    tree, ps, lines = _prepare(sglang_dir, patches_dir)
    st = inspect_state(tree, ps)
    if st.overall == APPLIED:
        return Result(0, lines + ["already applied; nothing to do"])
    # The whole series applies from the original base; only files whose bytes change are written.
    new = patched_contents(ps, _originals(st, ps, "apply", lines))
    for rel, h in ps.files.items():
        if sha256(new[rel]) != h["patched_sha256"]:
            raise PatchingError(
                f"patched {rel} does not match the manifest hash; nothing was changed"
            )
    changed = write_all(tree, st.contents, new)
    if st.overall == PARTIAL:
        lines.append("tree was partially applied; completed it")
    lines.append(f"applied {len(ps.series)} patch(es); rewrote {len(changed)} file(s):")
    lines += [
        f"  {rel}  {ps.files[rel]['original_sha256'][:12]} -> {ps.files[rel]['patched_sha256'][:12]}"
        for rel in changed
    ]
    return Result(0, lines)


def revert(sglang_dir: str | None = None, patches_dir: Path | None = None) -> Result:
    tree, ps, lines = _prepare(sglang_dir, patches_dir)
    st = inspect_state(tree, ps)
    if st.overall == NOT_APPLIED:
        return Result(0, lines + ["not applied; nothing to revert"])
    changed = write_all(tree, st.contents, _originals(st, ps, "revert", lines))
    lines.append(f"reverted {len(ps.series)} patch(es); restored {len(changed)} file(s):")
    lines += [f"  {rel}  -> {ps.files[rel]['original_sha256'][:12]}" for rel in changed]
    return Result(0, lines)


def list_matrix(sglang_dir: str | None = None, patches_dir: Path | None = None) -> Result:
    """The support matrix, newest release first, and where this Python's sglang stands."""
    pdir = patches_dir or default_patches_dir()
    matrix = support_matrix(pdir)
    if not matrix:
        raise PatchingError(f"no support matrix at {pdir / SUPPORT}", 2)
    head = ("release", "status", "SpeculativeAlgorithm.register", "DFlashWorkerV2", "needs")
    rows = [
        (
            v,
            e["status"],
            e["register"].removeprefix("sglang/srt/speculative/"),
            e["dflash_worker_v2"].removeprefix("sglang/srt/speculative/"),
            e["needs_met"],
        )
        for v, e in matrix.items()
    ]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = [f"SGLang releases for DDTREE ({pdir / SUPPORT}; patches/README.md says how)"]
    for r, v in zip([head, *rows], [None, *matrix]):
        cells = "  ".join(c.ljust(w) for c, w in zip(r, widths))
        lines.append(f"{cells}  {'why' if v is None else matrix[v]['why']}")
    try:
        tree = locate(sglang_dir)
        version, _ = detect_version(tree)
    except PatchingError as e:
        lines.append(f"this Python's sglang: {e}")
    else:
        status = matrix.get(version, {}).get("status", "not in the matrix")
        lines.append(f"this Python's sglang: {version} at {tree.package} ({status})")
    return Result(0, lines)

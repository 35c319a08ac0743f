"""A small unified-diff parser and exact applier (no fuzz, no offsets).

Only what our patch files use: one or more ``--- path`` / ``+++ path`` file sections,
each with ``@@ -a,b +c,d @@`` hunks of `` ``/``-``/``+`` lines and the optional
``\\ No newline at end of file`` marker. Text before the first ``--- `` line is the
patch header and is ignored. Contents are handled as bytes split after ``\\n`` so that
line endings survive untouched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_HUNK_RE = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(Exception):
    """A patch file is malformed or does not apply exactly."""


@dataclass
class Hunk:
    old_start: int  # 1-based, as written in the header (0 when old_len == 0)
    old_len: int
    new_start: int
    new_len: int
    old_lines: list[bytes] = field(default_factory=list)  # context + removed, with EOLs
    new_lines: list[bytes] = field(default_factory=list)  # context + added, with EOLs

    def reversed(self) -> Hunk:
        return Hunk(
            self.new_start,
            self.new_len,
            self.old_start,
            self.old_len,
            list(self.new_lines),
            list(self.old_lines),
        )


@dataclass
class FilePatch:
    path: str  # relative to the directory that contains ``sglang/``
    hunks: list[Hunk]

    def reversed(self) -> FilePatch:
        return FilePatch(self.path, [h.reversed() for h in self.hunks])


def _clean_path(raw: bytes) -> str:
    text = raw.decode("utf-8").split("\t", 1)[0].strip()
    # Accept git-style a/ b/ prefixes, but our own files use bare sglang/... paths.
    for prefix in ("a/", "b/"):
        if text.startswith(prefix + "sglang/"):
            text = text[len(prefix) :]
    if text.startswith("/") or ".." in text.split("/"):
        raise PatchError(f"refusing unsafe path in patch: {text!r}")
    return text


def parse(data: bytes) -> list[FilePatch]:
    """Parse a unified diff. Raises PatchError on anything it does not understand."""
    lines = data.splitlines(keepends=True)
    i = 0
    # Skip the header: everything before the first "--- " that is followed by "+++ ".
    while i < len(lines) and not (
        lines[i].startswith(b"--- ") and i + 1 < len(lines) and lines[i + 1].startswith(b"+++ ")
    ):
        i += 1
    files: list[FilePatch] = []
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        if not line.startswith(b"--- "):
            raise PatchError(f"line {i + 1}: expected '--- <path>', got {line[:60]!r}")
        if i + 1 >= len(lines) or not lines[i + 1].startswith(b"+++ "):
            raise PatchError(f"line {i + 2}: expected '+++ <path>'")
        old_path = _clean_path(line[4:])
        new_path = _clean_path(lines[i + 1][4:])
        if old_path != new_path:
            raise PatchError(f"renames are not supported ({old_path} -> {new_path})")
        i += 2
        hunks: list[Hunk] = []
        while i < len(lines) and lines[i].startswith(b"@@"):
            m = _HUNK_RE.match(lines[i])
            if not m:
                raise PatchError(f"line {i + 1}: bad hunk header {lines[i][:60]!r}")
            h = Hunk(
                int(m.group(1)),
                int(m.group(2)) if m.group(2) is not None else 1,
                int(m.group(3)),
                int(m.group(4)) if m.group(4) is not None else 1,
            )
            i += 1
            seen_old = seen_new = 0
            last: list[list[bytes]] = []
            while (
                seen_old < h.old_len
                or seen_new < h.new_len
                or (i < len(lines) and lines[i].startswith(b"\\"))
            ):
                if i >= len(lines):
                    raise PatchError(f"hunk at line {i}: truncated")
                body = lines[i]
                tag, text = body[:1], body[1:]
                if tag == b"\\":  # "\ No newline at end of file": strip EOL of previous line(s)
                    for target in last:
                        if target and target[-1].endswith(b"\n"):
                            target[-1] = target[-1][:-1]
                    i += 1
                    continue
                if body in (b"\n", b"\r\n"):  # an empty context line whose space was stripped
                    tag, text = b" ", body
                if tag == b" ":
                    h.old_lines.append(text)
                    h.new_lines.append(text)
                    seen_old += 1
                    seen_new += 1
                    last = [h.old_lines, h.new_lines]
                elif tag == b"-":
                    h.old_lines.append(text)
                    seen_old += 1
                    last = [h.old_lines]
                elif tag == b"+":
                    h.new_lines.append(text)
                    seen_new += 1
                    last = [h.new_lines]
                else:
                    raise PatchError(f"line {i + 1}: unexpected hunk line {body[:60]!r}")
                i += 1
            if seen_old != h.old_len or seen_new != h.new_len:
                raise PatchError(f"hunk near line {i}: line counts do not match its header")
            hunks.append(h)
        if not hunks:
            raise PatchError(f"no hunks for {old_path}")
        files.append(FilePatch(old_path, hunks))
    if not files:
        raise PatchError("no file sections found")
    return files


def apply(content: bytes, fp: FilePatch) -> bytes:
    """Apply one file's hunks with exact context at the exact line numbers."""
    src = content.splitlines(keepends=True)
    out: list[bytes] = []
    pos = 0  # index into src of the next line not yet copied
    for n, h in enumerate(fp.hunks, 1):
        start = h.old_start - 1 if h.old_len > 0 else h.old_start
        if start < pos:
            raise PatchError(f"{fp.path}: hunk {n} overlaps the previous one")
        if src[start : start + h.old_len] != h.old_lines:
            raise PatchError(f"{fp.path}: hunk {n} (line {h.old_start}) does not match the file")
        out.extend(src[pos:start])
        out.extend(h.new_lines)
        pos = start + h.old_len
    out.extend(src[pos:])
    return b"".join(out)

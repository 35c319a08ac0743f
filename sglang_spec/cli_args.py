"""The argument parser and ``type=`` validators shared by every command line of the project.

A bad value is refused while the arguments are parsed, before anything heavy is imported or
loaded, with one line that names the flag, the value and what would be valid, and exit code 2::

    sglang-spec demo: error: argument --budget: got '100000'; valid: an integer from 1 to 1023

Each validator turns the command-line string into a value or raises
``argparse.ArgumentTypeError("got ...; valid: ...")``; argparse adds the flag and :class:`Parser`
prints the one line. The CPU server's engines check their ``--engine-arg KEY=VALUE`` strings with
the same validators. Only the standard library is imported here.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Iterable
from pathlib import Path


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` to an option's help unless X is None, False or empty, or the help
    names it."""

    def _get_help_string(self, action):
        default = action.default
        if (
            default is None
            or default is False
            or default == []
            or "%(default)" in (action.help or "")
        ):
            return action.help
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with the defaults in ``--help`` and one-line usage errors."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _DefaultsFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, _line(self.prog, message))


def _line(prog: str, message: str) -> str:
    return f"{prog}: error: {message} (see --help)\n"


def fail(prog: str, message: str) -> int:
    """Print the one-line error :class:`Parser` prints, for a check made after parsing; returns 2."""
    sys.stderr.write(_line(prog, message))
    return 2


def usage_error(prog: str, flag: str, value: object, valid: str) -> int:
    """:func:`fail` in the validators' words: the flag, the value and what is valid."""
    return fail(prog, f"argument {flag}: {_refuse(str(value), valid)}")


def _refuse(text: str, valid: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"got {text!r}; valid: {valid}")


def _span(lo, hi) -> str:
    if lo is not None and hi is not None:
        return f"from {lo} to {hi}"
    return f">= {lo}" if lo is not None else f"<= {hi}"


def int_range(lo: int | None = None, hi: int | None = None) -> Callable[[str], int]:
    """An integer in ``[lo, hi]`` (either bound may be None)."""
    valid = "an integer" + ("" if lo is None and hi is None else " " + _span(lo, hi))

    def parse(text: str) -> int:
        try:
            value = int(text)
        except (TypeError, ValueError):
            raise _refuse(text, valid) from None
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise _refuse(text, valid)
        return value

    return parse


def float_range(
    lo: float | None = None, hi: float | None = None, *, lo_open: bool = False
) -> Callable[[str], float]:
    """A finite number in ``[lo, hi]``, or ``(lo, hi]`` with ``lo_open``."""
    if lo_open:
        valid = f"a number > {lo}" + ("" if hi is None else f" and <= {hi}")
    else:
        valid = "a number " + _span(lo, hi)

    def parse(text: str) -> float:
        try:
            value = float(text)
        except (TypeError, ValueError):
            raise _refuse(text, valid) from None
        low_bad = lo is not None and (value <= lo if lo_open else value < lo)
        if not math.isfinite(value) or low_bad or (hi is not None and value > hi):
            raise _refuse(text, valid)
        return value

    return parse


positive_int = int_range(1)
nonneg_int = int_range(0)
port = int_range(1, 65535)
positive_float = float_range(0.0, lo_open=True)
nonneg_float = float_range(0.0)
probability = float_range(0.0, 1.0, lo_open=True)  # top-p


def nonempty(text: str) -> str:
    """A string with something other than white space in it."""
    if not text.strip():
        raise _refuse(text, "a non-empty string")
    return text


def existing_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise _refuse(
            text, "an existing file" + (" (that is a directory)" if path.is_dir() else "")
        )
    return path


def existing_dir(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise _refuse(text, "an existing directory")
    return path


def output_file(text: str) -> Path:
    """A file to write (its directory is created later); not an existing directory."""
    if not text.strip() or Path(text).is_dir():
        raise _refuse(text, "a file path (not a directory)")
    return Path(text)


def output_dir(text: str) -> Path:
    """A directory to write into (created later); not an existing file."""
    if not text.strip() or Path(text).is_file():
        raise _refuse(text, "a directory path (not a file)")
    return Path(text)


def csv_choices(choices: Iterable[str]) -> Callable[[str], list[str]]:
    """A comma-separated, non-empty subset of ``choices`` (order kept, duplicates dropped)."""
    choices = tuple(choices)
    valid = "a comma-separated subset of " + ",".join(choices)

    def parse(text: str) -> list[str]:
        items = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
        if not items or any(x not in choices for x in items):
            raise _refuse(text, valid)
        return items

    return parse

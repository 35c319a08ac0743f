"""Where the data that ships with the package lives: a checkout (or editable install) or a wheel.

``patches/`` and ``server_configs/`` sit at the repository's top level; a wheel carries them as
``sglang_spec/data/<name>`` (see ``[tool.setuptools]`` in pyproject.toml).
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def shipped_dir(name: str) -> Path:
    """``<repo>/<name>`` in a checkout, else ``sglang_spec/data/<name>`` of an installed wheel."""
    repo = _PACKAGE.parent / name
    return repo if repo.is_dir() else _PACKAGE / "data" / name

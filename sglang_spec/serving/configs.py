"""Server configs: one YAML file per model x algorithm, turned into ``sglang.launch_server`` argv.

File layout (``server_configs/<model>-<algorithm>.yaml``)::

    name: qwen3-8b-dflash          # defaults to the file stem
    model: Qwen/Qwen3-8B           # informational; --model-path in ``args`` is what SGLang sees
    algorithm: DFLASH              # AR | NEXTN | EAGLE3 | DFLASH | DDTREE (label for loadtests.compare)
    drafter: z-lab/Qwen3-8B-DFlash-b16   # optional, informational
    budget: 64                     # DDTREE only, informational (num_draft_tokens = budget + 1)
    env: {NAME: value}             # optional environment for the server process
    args:                          # flag name without the leading "--" -> value
      model-path: Qwen/Qwen3-8B
      trust-remote-code: true      # true -> bare flag, false/null -> omitted
      json-model-override-args: {..}  # mappings are passed as JSON
      some-list-flag: [a, b]       # lists -> "--some-list-flag a b"

``--host`` and ``--port`` do not belong in a config: ``sglang-spec serve`` sets them (loopback by default).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_spec.paths import shipped_dir

# Where the configs live (``<repo>/server_configs``, or inside an installed wheel), to resolve bare names.
CONFIG_DIR = shipped_dir("server_configs")

KNOWN_ALGORITHMS = ("AR", "NEXTN", "EAGLE3", "DFLASH", "DDTREE")
_RESERVED_ARGS = ("host", "port")


class ConfigError(ValueError):
    """A server config is malformed."""


@dataclass
class ServerConfig:
    name: str
    model: str
    algorithm: str
    args: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)
    drafter: str | None = None
    budget: int | None = None
    path: Path | None = None

    def argv(self) -> list[str]:
        """The SGLang server arguments (without ``--host``/``--port``)."""
        return args_to_argv(self.args)


def args_to_argv(args: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in args.items():
        flag = "--" + str(key).lstrip("-")
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, dict):
            out += [flag, json.dumps(value, separators=(",", ":"))]
        elif isinstance(value, (list, tuple)):
            out += [flag, *(str(v) for v in value)]
        else:
            out += [flag, str(value)]
    return out


def resolve_config_path(name_or_path: str | Path, config_dir: Path | None = None) -> Path:
    """A path as given, else ``<config_dir>/<name>.yaml``; raises ConfigError listing the choices."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    d = config_dir or CONFIG_DIR
    for cand in (d / p, d / f"{p}.yaml", d / f"{p}.yml"):
        if cand.is_file():
            return cand
    names = ", ".join(sorted(c.stem for c in d.glob("*.yaml"))) if d.is_dir() else "(none)"
    raise ConfigError(f"no server config {str(name_or_path)!r}; known: {names}")


def load_config(name_or_path: str | Path, config_dir: Path | None = None) -> ServerConfig:
    import yaml  # pyyaml; imported lazily so `sglang-spec --help` does not need it

    path = resolve_config_path(name_or_path, config_dir)
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at top level")
    args = raw.get("args")
    if not isinstance(args, dict) or not args:
        raise ConfigError(f"{path}: 'args' must be a non-empty mapping")
    for reserved in _RESERVED_ARGS:
        if reserved in args:
            raise ConfigError(
                f"{path}: '{reserved}' is set by `sglang-spec serve`, not by the config"
            )
    if "model-path" not in args:
        raise ConfigError(f"{path}: args must contain model-path")
    algorithm = str(raw.get("algorithm", "")).upper()
    if algorithm not in KNOWN_ALGORITHMS:
        raise ConfigError(f"{path}: algorithm must be one of {KNOWN_ALGORITHMS}, got {algorithm!r}")
    env = raw.get("env") or {}
    if not isinstance(env, dict):
        raise ConfigError(f"{path}: 'env' must be a mapping")
    return ServerConfig(
        name=str(raw.get("name") or path.stem),
        model=str(raw.get("model") or args["model-path"]),
        algorithm=algorithm,
        args=dict(args),
        env={str(k): str(v) for k, v in env.items()},
        drafter=raw.get("drafter"),
        budget=raw.get("budget"),
        path=path,
    )


def list_configs(config_dir: Path | None = None) -> list[Path]:
    d = config_dir or CONFIG_DIR
    return sorted(d.glob("*.yaml"))

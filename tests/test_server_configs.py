"""server_configs/*.yaml: structure, the flags each algorithm needs, and SGLang 0.5.23's own parser.

The parser test imports ``sglang.srt.server_args`` (CPU-importable, ~13 s) once per module and feeds it
every config's argv exactly as ``sglang-spec serve`` would build it.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from sglang_spec.serving.configs import (
    CONFIG_DIR,
    ConfigError,
    args_to_argv,
    list_configs,
    load_config,
)
from sglang_spec.serving.launch import build_command

CONFIGS = list_configs()
MODELS = {"Qwen/Qwen3.6-27B": "hybrid", "Qwen/Qwen3.5-4B": "hybrid", "Qwen/Qwen3-8B": "attention"}


def _by_id():
    return [pytest.param(p, id=p.stem) for p in CONFIGS]


def test_every_model_has_every_algorithm():
    have = defaultdict(set)
    for p in CONFIGS:
        cfg = load_config(p)
        have[cfg.model].add(cfg.algorithm)
    assert set(have) == set(MODELS)
    for model, kind in MODELS.items():
        assert {"AR", "DFLASH", "DDTREE"} <= have[model], model
        if kind == "hybrid":
            assert "NEXTN" in have[model], model
        else:
            # Qwen3-8B has no MTP head: its chain baseline is EAGLE3, and there must be no NEXTN config.
            assert "NEXTN" not in have[model] and "EAGLE3" in have[model], model


@pytest.mark.parametrize("path", _by_id())
def test_config_flags(path):
    cfg = load_config(path)
    a = cfg.args
    assert cfg.name == path.stem
    assert a["model-path"] == cfg.model
    if MODELS[cfg.model] == "hybrid":
        assert a["mamba-radix-cache-strategy"] == "extra_buffer"
        # extra_buffer asserts mamba_track_interval (default 256) >= num_draft_tokens.
        assert int(a.get("speculative-num-draft-tokens", 1)) <= 256
    else:
        assert "mamba-radix-cache-strategy" not in a
    alg = a.get("speculative-algorithm")
    if cfg.algorithm == "AR":
        assert alg is None and not any(k.startswith("speculative") for k in a)
    elif cfg.algorithm in ("NEXTN", "EAGLE3"):
        assert alg == cfg.algorithm
        assert (
            a["speculative-num-steps"],
            a["speculative-eagle-topk"],
            a["speculative-num-draft-tokens"],
        ) == (3, 1, 4)
        assert ("speculative-draft-model-path" in a) == (cfg.algorithm == "EAGLE3")
    elif cfg.algorithm == "DFLASH":
        assert alg == "DFLASH" and a["speculative-dflash-block-size"] == 16
        assert a["speculative-draft-model-path"].startswith("z-lab/")
    elif cfg.algorithm == "DDTREE":
        assert alg == "DDTREE"
        assert a["speculative-num-draft-tokens"] == 1 + cfg.budget and cfg.budget >= 1
        assert a["speculative-dflash-block-size"] == 16
        assert a["attention-backend"] == "triton" and a["page-size"] == 1
        assert a["speculative-draft-model-path"].startswith("z-lab/")
        # hybrid trees verify without per-node GDN states (patches 0002/0003)
        assert a.get("enable-linear-replayssm-spec", False) is (MODELS[cfg.model] == "hybrid")
    else:
        assert "enable-linear-replayssm-spec" not in a


def test_args_to_argv_encodings():
    argv = args_to_argv(
        {"a": True, "b": False, "c": None, "d": 3, "e": {"k": 1, "j": [1, 2]}, "f": ["x", "y"]}
    )
    assert argv == ["--a", "--d", "3", "--e", '{"k":1,"j":[1,2]}', "--f", "x", "y"]


@pytest.mark.parametrize("path", _by_id())
def test_sglang_parser_accepts_config(path, sglang_parse):
    cfg = load_config(path)
    cmd = build_command(
        cfg, "127.0.0.1", 30123, extra=[], launcher="python -m sglang.launch_server"
    )
    assert cmd[:3] == ["python", "-m", "sglang.launch_server"]
    sa = sglang_parse(cmd[3:])
    a = cfg.args
    assert sa.model_path == a["model-path"]
    assert (sa.host, sa.port) == ("127.0.0.1", 30123)
    assert sa.tp_size == a["tp-size"] and sa.context_length == a["context-length"]
    assert sa.mem_fraction_static == pytest.approx(a["mem-fraction-static"])
    assert sa.max_running_requests == a["max-running-requests"]
    assert sa.speculative_algorithm == a.get("speculative-algorithm")
    assert sa.attention_backend == a.get("attention-backend")
    if "speculative-num-draft-tokens" in a:
        assert sa.speculative_num_draft_tokens == a["speculative-num-draft-tokens"]
    if "speculative-draft-model-path" in a:
        assert sa.speculative_draft_model_path == a["speculative-draft-model-path"]
    if "speculative-dflash-block-size" in a:
        assert sa.speculative_dflash_block_size == a["speculative-dflash-block-size"]
    if "mamba-radix-cache-strategy" in a:
        assert sa.mamba_radix_cache_strategy == a["mamba-radix-cache-strategy"]
    if "page-size" in a:
        assert sa.page_size == a["page-size"]
    assert sa.disable_overlap_schedule is bool(a.get("disable-overlap-schedule", False))
    assert sa.enable_linear_replayssm_spec is bool(a.get("enable-linear-replayssm-spec", False))


def test_config_dir_is_the_repository_one():
    assert CONFIG_DIR.name == "server_configs" and len(CONFIGS) >= 12


def test_a_config_file_reads_every_field(tmp_path):
    """Every documented field of a config file (module docstring of serving.configs), by name
    from a config directory, and its defaults (name = the file stem, model = --model-path)."""
    (tmp_path / "m-ddtree.yaml").write_text(
        "name: custom\nmodel: Org/Model\nalgorithm: ddtree\ndrafter: Org/Drafter\nbudget: 63\n"
        "env: {SGLANG_X: 1, B: two}\nargs:\n  model-path: /models/m\n  --trust-remote-code: true\n"
    )
    (tmp_path / "bare.yml").write_text("algorithm: AR\nargs: {model-path: /models/b}\n")
    cfg = load_config("m-ddtree", tmp_path)
    assert (cfg.name, cfg.model, cfg.algorithm) == ("custom", "Org/Model", "DDTREE")
    assert (cfg.drafter, cfg.budget, cfg.path) == ("Org/Drafter", 63, tmp_path / "m-ddtree.yaml")
    assert cfg.env == {"SGLANG_X": "1", "B": "two"}
    assert cfg.argv() == ["--model-path", "/models/m", "--trust-remote-code"]
    bare = load_config("bare", tmp_path)
    assert (bare.name, bare.model, bare.env, bare.drafter, bare.budget) == (
        "bare",
        "/models/b",
        {},
        None,
        None,
    )
    assert list_configs(tmp_path) == [tmp_path / "m-ddtree.yaml"]  # *.yaml only


BAD_CONFIGS = [
    ("args: [\n", r"invalid YAML: "),
    ("- a\n- b\n", r"expected a mapping at top level$"),
    ("algorithm: AR\n", r"'args' must be a non-empty mapping$"),
    ("algorithm: AR\nargs: {}\n", r"'args' must be a non-empty mapping$"),
    (
        "algorithm: AR\nargs: {model-path: m, port: 1}\n",
        r"'port' is set by `sglang-spec serve`, not by the config$",
    ),
    ("algorithm: AR\nargs: {tp-size: 2}\n", r"args must contain model-path$"),
    (
        "algorithm: MEDUSA\nargs: {model-path: m}\n",
        r"algorithm must be one of \('AR', 'NEXTN', 'EAGLE3', 'DFLASH', 'DDTREE'\), got 'MEDUSA'$",
    ),
    ("args: {model-path: m}\n", r"algorithm must be one of .*, got ''$"),
    ("algorithm: AR\nenv: [A]\nargs: {model-path: m}\n", r"'env' must be a mapping$"),
]


@pytest.mark.parametrize(("text", "msg"), BAD_CONFIGS)
def test_a_bad_config_file_is_refused_naming_the_file(tmp_path, text, msg):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=msg) as e:
        load_config(path)
    assert str(e.value).startswith(f"{path}: ")


def test_an_unknown_config_name_lists_the_known_ones(tmp_path):
    (tmp_path / "b.yaml").write_text("algorithm: AR\nargs: {model-path: m}\n")
    (tmp_path / "a.yaml").write_text("algorithm: AR\nargs: {model-path: m}\n")
    with pytest.raises(ConfigError, match=r"^no server config 'c'; known: a, b$"):
        load_config("c", tmp_path)
    with pytest.raises(ConfigError, match=r"^no server config 'c'; known: \(none\)$"):
        load_config("c", tmp_path / "missing")

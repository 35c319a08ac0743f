"""``python -m e2e.scale``: server specs, the server flags it builds, and whole runs against a fake SGLang.

The fake (``tests/e2e_fake_sglang.py``, started through the harness's ``--launcher``) prints the log
lines a real server prints, answers batched ``/generate`` with SGLang's counts after a sleep per
step, writes a profiler trace and DDTREE stage times, and records the argv and environment each
server got. SGLang's own argument parser checks the flags the harness builds for every shape and
algorithm (as ``tests/test_server_configs.py`` does for the configs themselves).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path

import pytest
import torch

from e2e import kit, records, scale
from e2e.shapes import SHAPES
from sglang_spec.serving.configs import ServerConfig

FAKE = Path(__file__).with_name("e2e_fake_sglang.py")
KIT_FLAGS = (
    "--attention-backend triton --sampling-backend pytorch --disable-cuda-graph "
    "--grammar-backend none --mem-fraction-static 0.3 --skip-server-warmup"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------ specs
@pytest.mark.parametrize(
    ("text", "budget", "acc", "tp", "flags", "profile"),
    [
        ("qwen3.6-27b:ar", None, None, None, (), ()),
        ("qwen3.6-27b:ddtree:b=15", 15, None, None, (), ()),
        ("qwen3.5-4b:nextn:acc=3.1:tp=2", None, 3.1, 2, (), ()),
        (
            "qwen3-8b:ddtree:stages:b=63:no-overlap:profile=8",
            63,
            None,
            None,
            ("no-overlap", "stages"),
            (8,),
        ),
        ("qwen3-8b:dflash:profile=1,8", None, None, None, (), (1, 8)),
        ("qwen3.6-27b:ddtree:b=255", 255, None, None, (), ()),
        ("qwen3-8b:ddtree:b=1023", 1023, None, None, (), ()),
    ],
)
def test_parse_spec(text, budget, acc, tp, flags, profile):
    spec = scale.parse_spec(text)
    assert (spec.budget, spec.acc, spec.tp, spec.flags, spec.profile) == (
        budget,
        acc,
        tp,
        flags,
        profile,
    )
    assert spec.shape is SHAPES[text.split(":")[0]]
    assert spec.algorithm == text.split(":")[1].upper()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("qwen3.6-70b:ar", "unknown shape 'qwen3.6-70b'; valid: qwen3.6-27b"),
        ("qwen3.6-27b", "algorithm '' is not one of ar, nextn, dflash, ddtree"),
        ("qwen3.6-27b:eagle", "algorithm 'eagle' is not one of"),
        ("qwen3-8b:nextn", "qwen3-8b has no MTP layer"),
        ("qwen3.6-27b:ddtree", "ddtree needs b=BUDGET"),
        ("qwen3.6-27b:ddtree:b=0", "b='0' must be a int >= 1"),
        ("qwen3.6-27b:ddtree:b=x", "b='x' must be a int >= 1"),
        ("qwen3.6-27b:ddtree:b=256", "b=256 is too large; valid: 1..255"),
        ("qwen3-8b:ddtree:b=1024", "b=1024 is too large; valid: 1..1023"),
        ("qwen3.6-27b:dflash:b=15", "b= applies to ddtree only"),
        ("qwen3.6-27b:ar:acc=3", "acc= applies to speculative servers"),
        ("qwen3.6-27b:dflash:acc=0.5", "acc='0.5' must be a float >= 1"),
        ("qwen3.6-27b:dflash:acc=nan", "acc='nan' must be a float >= 1"),
        ("qwen3.6-27b:nextn:stages", "stages applies to ddtree and dflash"),
        ("qwen3.6-27b:dflash:replayssm", "replayssm applies to nextn on hybrid shapes"),
        ("qwen3.6-27b:ddtree:b=15:replayssm", "replayssm applies to nextn on hybrid shapes"),
        ("qwen3.6-27b:dflash:tp=0", "tp='0' must be a int >= 1"),
        ("qwen3.6-27b:dflash:overlap", "bad option 'overlap'"),
        ("qwen3.6-27b:ddtree:b=15:b=31", "bad option 'b=31'"),
        ("qwen3.6-27b:ar:profile=1,x", "profile='1,x' must list concurrencies >= 1"),
        ("qwen3.6-27b:ar:profile=0", "profile='0' must list concurrencies >= 1"),
        ("qwen3.6-27b:dflash:tree-temp=0.5", "tree-temp= apply to ddtree only"),
        ("qwen3.6-27b:ddtree:b=7:tree-temp=0", "tree-temp=: SGLANG_DDTREE_TREE_TEMPERATURE='0'"),
        ("qwen3.6-27b:ddtree:b=7:tree-temp=inf", "must be a finite number > 0"),
    ],
)
def test_parse_spec_refuses(text, says):
    with pytest.raises(argparse.ArgumentTypeError) as e:
        scale.parse_spec(text)
    assert says in str(e.value) and repr(text) in str(e.value)


ADAPTIVE_27B = Path(__file__).parents[1] / "benchmarks/results/adaptive_budget_qwen3.6-27b.json"


def test_adaptive_server_at_a_tau_per_budget(tmp_path, monkeypatch, sglang_parse):
    """adaptive=FILE: --speculative-adaptive with FILE, the budget its largest; acc=B@TAU/...: a
    tau per budget for DDTREE, the largest as SGLang's knob; both named in variant and label."""
    text = f"qwen3.6-27b:ddtree:adaptive={ADAPTIVE_27B}:acc=63@4.23/7@3.17/15@3/31@4.01:stages"
    spec = scale.parse_spec(text)
    assert spec.budget == 63 and spec.acc == 4.23 and spec.adaptive == str(ADAPTIVE_27B)
    assert spec.acc_by_budget == ((7, 3.17), (15, 3.0), (31, 4.01), (63, 4.23))
    assert (
        spec.variant
        == "stages+adaptive=adaptive_budget_qwen3.6-27b+acc=7@3.17/15@3/31@4.01/63@4.23"
    )
    assert "/" not in spec.slug and "=" not in spec.slug
    monkeypatch.setenv("SGLANG_KIT_FLAGS", KIT_FLAGS)
    ns = argparse.Namespace(graph_bs=32, max_running_requests=32, server_arg=None)
    cfg = scale.server_config(spec, tmp_path / "t", tmp_path / "d", ns, tmp_path)
    assert cfg.args["speculative-adaptive"] is True
    assert cfg.args["speculative-adaptive-config"] == str(ADAPTIVE_27B)
    assert cfg.args["speculative-num-draft-tokens"] == 64
    assert cfg.env["SGLANG_SIMULATE_ACC_LEN"] == "4.23"
    assert cfg.env["SGLANG_DDTREE_SIMULATE_ACC_LEN_BY_BUDGET"] == "7:3.17,15:3,31:4.01,63:4.23"
    sa = sglang_parse(
        kit.Server(cfg, tmp_path / "log", launcher="python -m sglang.launch_server").cmd[3:]
    )
    assert sa.speculative_adaptive_config == str(ADAPTIVE_27B)
    # tree-temp=T: the server's tree temperature, named in variant and label
    sharp = scale.parse_spec("qwen3.6-27b:ddtree:b=7:acc=3.17:tree-temp=1e-8")
    assert sharp.tree_temperature == 1e-8 and sharp.variant == "tree-temp=1e-08"
    assert sharp.label == "qwen3.6-27b:ddtree:b=7:acc=3.17:tree-temp=1e-08"
    cfg = scale.server_config(sharp, tmp_path / "t", tmp_path / "d", ns, tmp_path)
    assert cfg.env["SGLANG_DDTREE_TREE_TEMPERATURE"] == "1e-08"
    from sglang_spec.plugin.config import parse_tree_temperature

    assert parse_tree_temperature(cfg.env["SGLANG_DDTREE_TREE_TEMPERATURE"]) == 1e-8
    # a plain tau stays SGLang's alone
    plain = scale.parse_spec("qwen3.6-27b:ddtree:b=15:acc=3")
    assert plain.acc_by_budget == () and plain.variant == "" and plain.label.endswith("acc=3")


@pytest.mark.parametrize(
    ("option", "says"),
    [
        ("acc=7@3/7@4", "bad '7@4'; valid: BUDGET@TAU pairs joined by /"),
        ("acc=7@0.5", "bad '7@0.5'"),
        ("acc=x@3", "bad 'x@3'"),
        ("acc=7@3/15", "bad '15'"),
        (f"adaptive={ADAPTIVE_27B}:b=31", "b=31 disagrees with adaptive="),
        (
            "adaptive=/nonexistent.json",
            "adaptive=: --speculative-adaptive-config='/nonexistent.json'",
        ),
    ],
)
def test_adaptive_and_tau_per_budget_refusals(option, says):
    text = f"qwen3.6-27b:ddtree:{option}" + ("" if "adaptive" in option else ":b=15")
    with pytest.raises(argparse.ArgumentTypeError) as e:
        scale.parse_spec(text)
    assert says in str(e.value) and "\n" not in str(e.value)
    for other in ("dflash:acc=7@3", f"nextn:adaptive={ADAPTIVE_27B}"):
        with pytest.raises(argparse.ArgumentTypeError, match="apply to ddtree only"):
            scale.parse_spec(f"qwen3.6-27b:{other}")


def test_cli_refuses_bad_input_before_anything_runs(tmp_path, capsys):
    for argv in (
        ["--servers", "qwen3.6-27b:ddtree", "--out", str(tmp_path)],
        ["--servers", "qwen3.6-27b:ar", "--out", str(tmp_path), "--levels", "1,0"],
        ["--servers", "qwen3.6-27b:ar", "--out", str(tmp_path), "--time-budget", "-5"],
        ["--servers", "qwen3.6-27b:ar", "--out", str(tmp_path), "--server-arg", "--tp-size=2"],
    ):
        with pytest.raises(SystemExit) as e:
            scale.main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and "error:" in err
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------------------------ server flags
SPECS = [
    f"{shape}:{alg}"
    for shape in SHAPES
    for alg in (
        "ar",
        "nextn",
        "dflash",
        "dflash:stages",
        "nextn:replayssm",
        "ddtree:b=15",
        "ddtree:b=15:no-replayssm",
        "ddtree:b=63:acc=4:stages:no-overlap",
    )
    if not alg.startswith("nextn") or SHAPES[shape].has_mtp
]


@pytest.mark.parametrize("text", SPECS)
def test_server_config_in_the_kit(text, tmp_path, monkeypatch, sglang_parse):
    """Config args < kit flags < the dummy-weight layer < the spec's options; SGLang parses it."""
    monkeypatch.setenv("SGLANG_KIT_FLAGS", KIT_FLAGS)
    monkeypatch.setenv("SGLANG_KIT_SPEC_FLAGS", "--speculative-draft-attention-backend triton")
    spec = scale.parse_spec(text)
    ns = argparse.Namespace(graph_bs=32, max_running_requests=32, server_arg=[("tp-size", "1")])
    target, drafter = tmp_path / "t", tmp_path / "d"
    cfg = scale.server_config(spec, target, drafter, ns, tmp_path)
    a = cfg.args
    base = kit.config_for(spec.shape.config_prefix, spec.algorithm)
    assert cfg.name == base.name
    assert a["model-path"] == str(target)
    assert ("speculative-draft-model-path" in a) == (spec.algorithm in ("DFLASH", "DDTREE"))
    if spec.algorithm in ("DFLASH", "DDTREE"):
        assert a["speculative-draft-model-path"] == str(drafter)
    assert a["load-format"] == "dummy" and a["skip-tokenizer-init"] is True
    assert a["mem-fraction-static"] == 0.8 and a["context-length"] == 4096
    assert a["disable-cuda-graph"] is False and a["cuda-graph-max-bs-decode"] == 32
    assert a["attention-backend"] == "triton"  # the kit's, over the config's fa3
    assert a["tp-size"] == "1"  # --server-arg has the last word
    if spec.algorithm == "DDTREE":
        assert a["speculative-num-draft-tokens"] == spec.budget + 1
        assert a["speculative-dflash-block-size"] == 16
    assert ("speculative-draft-attention-backend" in a) == spec.speculative
    assert a.get("disable-overlap-schedule", False) == (
        "no-overlap" in spec.flags or base.args.get("disable-overlap-schedule", False)
    )
    if spec.algorithm == "DDTREE" and spec.shape.hybrid:
        assert a["enable-linear-replayssm-spec"] is ("no-replayssm" not in spec.flags)
    if spec.algorithm == "NEXTN":
        assert a.get("enable-linear-replayssm-spec", False) is ("replayssm" in spec.flags)
    env = cfg.env
    assert env.get("SGLANG_SIMULATE_ACC_LEN") == (None if spec.acc is None else f"{spec.acc:g}")
    assert ("SGLANG_DDTREE_STAGE_TIMES" in env) == ("stages" in spec.flags)

    cmd = kit.Server(cfg, tmp_path / "log", launcher="python -m sglang.launch_server").cmd
    assert "--disable-cuda-graph" not in cmd
    sa = sglang_parse(cmd[3:])
    assert sa.load_format == "dummy" and sa.skip_tokenizer_init
    assert sa.disable_prefill_cuda_graph and not sa.disable_cuda_graph
    assert sa.cuda_graph_max_bs_decode == 32 and sa.max_running_requests == 32
    assert sa.context_length == 4096 and sa.mem_fraction_static == pytest.approx(0.8)
    assert sa.speculative_algorithm == (None if spec.algorithm == "AR" else spec.algorithm)
    if spec.algorithm == "DDTREE":
        assert sa.speculative_num_draft_tokens == spec.budget + 1


def test_server_config_outside_the_kit_keeps_the_config_backend(tmp_path, monkeypatch):
    monkeypatch.delenv("SGLANG_KIT_FLAGS", raising=False)
    ns = argparse.Namespace(graph_bs=0, max_running_requests=8, server_arg=None)
    cfg = scale.server_config(
        scale.parse_spec("qwen3.6-27b:dflash"), tmp_path, tmp_path, ns, tmp_path
    )
    assert cfg.args["attention-backend"] == "fa3"
    assert cfg.args["disable-cuda-graph"] is True and "cuda-graph-max-bs-decode" not in cfg.args
    assert "sampling-backend" not in cfg.args


def test_server_arg_empty_value_drops_a_flag(tmp_path):
    ns = argparse.Namespace(
        graph_bs=8,
        max_running_requests=8,
        server_arg=[kit.server_arg("disable-overlap-schedule=")],
    )
    cfg = scale.server_config(
        scale.parse_spec("qwen3-8b:ddtree:b=15"), tmp_path, tmp_path, ns, tmp_path
    )
    assert "--disable-overlap-schedule" not in cfg.argv()
    assert "--page-size" in cfg.argv()


# ------------------------------------------------------------------------------------ whole runs
def _run(tmp_path, monkeypatch, servers, *extra, out="out", **env):
    monkeypatch.delenv("SGLANG_KIT_FLAGS", raising=False)
    monkeypatch.setenv("FAKE_CALLS", str(tmp_path / "calls.jsonl"))
    for k, v in env.items():
        monkeypatch.setenv(k, str(v))
    argv = [
        "--servers",
        *servers,
        "--out",
        str(tmp_path / out),
        "--levels",
        "1,2,4",
        "--new-tokens",
        "13",
        "--prompt-len",
        "8",
        "--time-budget",
        "120",
        "--start-estimate",
        "1",
        "--first-level-estimate",
        "1",
        "--reserve",
        "1",
        "--models-dir",
        str(tmp_path / "models"),
        "--port",
        str(_free_port()),
        "--launcher",
        f"{{python}} {FAKE}",
        *extra,
    ]
    rc = scale.main(argv)
    calls = tmp_path / "calls.jsonl"
    started = [json.loads(x) for x in calls.read_text().splitlines()] if calls.exists() else []
    run_log = json.loads((tmp_path / out / "run.json").read_text())
    return rc, records.load(tmp_path / out / "scale.json"), started, run_log


def test_an_adaptive_server_keeps_its_budget_switch_lines(tmp_path, monkeypatch):
    """run.json keeps the adaptive server's switch lines (which budget each batch-size bucket ran,
    and the tau behind it), read from its log after the levels; a fixed server has none. The
    adaptive server's warm-up runs each level's full length (its controller explores and picks
    before anything is timed), a fixed server's 8 tokens."""
    config = tmp_path / "budgets.json"
    config.write_text(json.dumps({"cost_ms": {"1": {"7": 26.0, "15": 28.0}}}))
    rc, recs, started, log = _run(
        tmp_path,
        monkeypatch,
        [
            f"qwen3.6-27b:ddtree:adaptive={config}:acc=7@3/15@3:stages",
            "qwen3.6-27b:ddtree:b=15:acc=3:stages",
        ],
    )
    assert rc == 0 and len(recs) == 6
    adaptive, fixed = log["servers"]
    lines = adaptive["budget_switch_log"]
    # the harness warms each level's batch size first, so every level's bucket has a line
    assert sorted(int(ln.split()[1]) for ln in lines) == [1, 2, 4]
    assert lines[0].endswith("runs budget 15 (was None); tau per budget {15: 3.0}.")
    assert fixed["budget_switch_log"] == []
    # decode steps of the three batch sizes: the warm-up's and the level's (the prefill alone has
    # none); 13 tokens at 3 a step are 4 steps, the fixed server's 8-token warm-up ceil(7 / 3) = 3
    assert adaptive["stages"]["steps"] == 3 * (4 + 4)
    assert fixed["stages"]["steps"] == 3 * (3 + 4)
    # late Triton compilations are logged from 50 ms (SGLang's default: 1 s)
    assert all(c["env"]["SGLANG_TRITON_SLOW_COMPILE_THRESHOLD_SECS"] == "0.05" for c in started)


def test_run_writes_one_record_per_level(tmp_path, monkeypatch):
    rc, recs, started, log = _run(
        tmp_path,
        monkeypatch,
        ["qwen3.6-27b:ar", "qwen3.6-27b:ddtree:b=15:acc=3:stages:profile=2,1"],
        "--profile-steps",
        "3",
    )
    assert rc == 0 and [s["status"] for s in log["servers"]] == ["finished", "finished"]
    assert len(started) == 2
    ar_argv, dd_argv = (c["argv"] for c in started)
    assert ar_argv[ar_argv.index("--model-path") + 1] == str(tmp_path / "models/qwen3.6-27b/target")
    assert dd_argv[dd_argv.index("--speculative-num-draft-tokens") + 1] == "16"
    assert started[1]["env"]["SGLANG_SIMULATE_ACC_LEN"] == "3"
    assert started[1]["env"]["SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS"] == "1"
    assert "SGLANG_SIMULATE_ACC_LEN" not in started[0]["env"]

    assert [(r["algorithm"], r["concurrency"]) for r in recs] == [
        ("AR", 1),
        ("AR", 2),
        ("AR", 4),
        ("DDTREE", 1),
        ("DDTREE", 2),
        ("DDTREE", 4),
    ]
    for r in recs:
        assert set(records.REQUIRED) <= set(r)
        assert r["max_running_requests"] == 32 and r["tp"] == 1
        assert r["mamba_cache_log"] == [
            "Mamba Cache is allocated. max_mamba_cache_size: 7, conv_state size: 0.1GB"
        ]
        assert r["ms_per_step"] == pytest.approx(1000 * r["wall_s"] / r["steps"])
        assert r["tokens_per_s"] == pytest.approx(13 * r["concurrency"] / r["wall_s"])
        assert r["start_s"] > 0 and r["requests"] == r["concurrency"]
    ar, dd = recs[0], recs[3]
    assert (ar["width"], ar["budget"], ar["steps"], ar["tokens_per_step"]) == (1, None, 12, 1.0)
    assert ar["simulated_accept_len"] is None
    # 13 tokens: the prefill's + 12 more in ceil(12 / 3) = 4 verify steps of 3 tokens
    assert (dd["width"], dd["budget"], dd["steps"]) == (16, 15, 4)
    assert dd["tokens_per_step"] == pytest.approx(13 / 4) and dd["simulated_accept_len"] == 3.0
    assert dd["variant"] == "stages"
    # the fake sleeps 2 ms per step: ms/step is the step time, not wall / tokens
    assert 2.0 <= dd["ms_per_step"] < 40

    stages = json.loads(
        (tmp_path / "out/stages/qwen3.6-27b_ddtree_b15_acc3_stages.json").read_text()
    )
    assert stages["by_bs"]["2"]["gpu_ms"] == {"draft": 0.5, "verify": 20.0}
    # bs 4: the warmup's 3 steps (8 tokens) and the level's 4; the fake's draft host ms alternate
    # 1, 2, 1 | 1, 2, 1, 2: median 1 (a mean would say 1.43)
    assert stages["by_bs"]["4"]["steps"] == 7 and stages["by_bs"]["4"]["host_ms"]["draft"] == 1.0
    # bs 2: the warmup's 3 steps (every level's batch size is warmed), the level's 4 and the
    # profiled run's 4: 1, 2, 1 | 1, 2, 1, 2 | 1, 2, 1, 2, median 1
    assert stages["by_bs"]["2"]["steps"] == 11 and stages["by_bs"]["2"]["host_ms"]["draft"] == 1.0
    # GPU ms between steps, the first of each request left out: 0.5, 1 | 0.5, 1, 0 | 0.5, 1, 0
    assert stages["by_bs"]["2"]["gpu_between_ms"] == 0.5
    # the prefills are kept apart from the decode steps: per batch size of new requests
    assert stages["extends_by_bs"]["2"] == {
        "extends": 4,  # the warmup's, the level's, its prefill alone and the profiled run's
        "tokens": 2 * 8,  # the test runs 8-token prompts
        "host_ms": 3.0,
        "gpu_ms": 8.0,
        "gpu_between_ms": None,
    }
    assert stages["extends_by_bs"]["4"]["extends"] == 3
    prof = json.loads(
        (tmp_path / "out/profiles/qwen3.6-27b_ddtree_b15_acc3_stages-C2.json").read_text()
    )
    assert prof["verify_graph_replayed"] is True and prof["steps"] == 3
    assert prof["gpu_ms_per_step"] == pytest.approx(7.0)
    assert not list((tmp_path / "out/profiles/qwen3.6-27b_ddtree_b15_acc3_stages-C2").iterdir())
    assert log["servers"][1]["profiles"] == [
        {"concurrency": 2, "status": "ok", "verify_graph_replayed": True},
        {"concurrency": 1, "status": "ok", "verify_graph_replayed": True},
    ]
    assert (tmp_path / "out/profiles/qwen3.6-27b_ddtree_b15_acc3_stages-C1.json").exists()


def test_a_level_times_its_prefill_apart_from_its_decode_steps(tmp_path, monkeypatch):
    """The fake takes 60 ms per prefill round and 20 ms per step: ms_per_step spreads the
    prefill over the level's steps, decode_ms_per_step takes it out (the level's prompts prefilled
    alone, one new token each, timed after it)."""
    rc, recs, _, _ = _run(
        tmp_path,
        monkeypatch,
        ["qwen3.6-27b:ddtree:b=15:acc=3"],
        FAKE_PREFILL_MS=60,
        FAKE_STEP_MS=20,
    )
    assert rc == 0 and [r["concurrency"] for r in recs] == [1, 2, 4]
    for r in recs:  # 4 verify steps of 20 ms after a 60 ms prefill
        assert 0.06 <= r["prefill_s"] < 0.06 + 0.03
        assert r["decode_ms_per_step"] == pytest.approx(
            1000 * (r["wall_s"] - r["prefill_s"]) / r["steps"]
        )
        assert 15.0 <= r["decode_ms_per_step"] < 28.0
        assert r["ms_per_step"] >= r["decode_ms_per_step"] + 10.0  # + 60 ms over 4 steps
    # a prefill timed as long as the whole level (noise on a tiny level) leaves no decode figure
    slow = records.level_metrics([{"completion_tokens": 13}], 0.4, False, prefill_s=0.5)
    assert slow["prefill_s"] == 0.5 and "decode_ms_per_step" not in slow
    with pytest.raises(records.RecordError, match="decode_ms_per_step=0 must be a positive"):
        records.validate({**recs[0], "decode_ms_per_step": 0})


def test_resume_skips_levels_already_measured(tmp_path, monkeypatch):
    _run(tmp_path, monkeypatch, ["qwen3-8b:ar"], out="first")
    rc, recs, started, log = _run(
        tmp_path,
        monkeypatch,
        ["qwen3-8b:ar", "qwen3-8b:dflash"],
        "--resume",
        str(tmp_path / "first/scale.json"),
        out="second",
    )
    assert rc == 0 and len(started) == 2  # the first call's server, then only DFLASH now
    assert log["servers"][0]["status"] == "done earlier"
    assert {r["algorithm"] for r in recs} == {"DFLASH"}
    assert started[1]["argv"][started[1]["argv"].index("--speculative-algorithm") + 1] == "DFLASH"


def test_resume_skips_profiles_already_taken(tmp_path, monkeypatch):
    from e2e import scale_report

    server = "qwen3-8b:dflash:profile=1,2"
    _run(tmp_path, monkeypatch, [server], "--profile-steps", "3", out="first")
    results = tmp_path / "merged.json"
    assert scale_report.main([str(results), str(tmp_path / "first")]) == 0
    (tmp_path / "merged/profiles/qwen3-8b_dflash-C2.json").unlink()
    rc, recs, started, log = _run(
        tmp_path,
        monkeypatch,
        [server],
        "--profile-steps",
        "3",
        "--resume",
        str(results),
        out="second",
    )
    assert rc == 0 and len(started) == 2 and recs == []  # restarted for the missing profile only
    assert [p["concurrency"] for p in log["servers"][0]["profiles"]] == [2]
    _, _, started, log = _run(
        tmp_path, monkeypatch, [server], "--resume", str(results), out="first"
    )
    assert len(started) == 2 and log["servers"][0]["status"] == "done earlier"


def test_time_budget_skips_what_cannot_finish(tmp_path, monkeypatch):
    rc, recs, started, log = _run(
        tmp_path, monkeypatch, ["qwen3-8b:ar"], "--time-budget", "30", "--start-estimate", "40"
    )
    assert rc == 0 and recs == [] and started == []
    assert log["servers"][0]["status"].startswith("skipped:")
    assert [s["concurrency"] for s in log["servers"][0]["skipped_levels"]] == [1, 2, 4]


def test_capped_server_skips_levels_needing_too_many_rounds(tmp_path, monkeypatch):
    rc, recs, _, log = _run(
        tmp_path, monkeypatch, ["qwen3.6-27b:ddtree:b=63"], "--max-waves", "2", FAKE_CAP=1
    )
    assert rc == 0 and [r["concurrency"] for r in recs] == [1, 2]
    assert all(r["max_running_requests"] == 1 for r in recs)
    assert recs[0]["capped_log"] == ["max_running_requests is capped to 1 by the mamba state cache"]
    (skip,) = log["servers"][0]["skipped_levels"]
    assert skip["concurrency"] == 4 and "max_running_requests 1 < C = 4" in skip["why"]
    # C = 2 ran one request after the other: twice the wall time of C = 1 per longest request
    assert recs[1]["ms_per_step"] == pytest.approx(2 * recs[0]["ms_per_step"], rel=0.5)


def test_a_failed_server_does_not_stop_the_others(tmp_path, monkeypatch, capsys):
    rc, recs, started, log = _run(
        tmp_path, monkeypatch, ["qwen3-8b:ar", "qwen3-8b:dflash"], FAKE_CRASH="AR"
    )
    assert rc == 1 and len(started) == 2
    assert log["servers"][0]["status"].startswith(
        "failed: ServerFailed: qwen3-8b-ar exited with code 3"
    )
    assert "RuntimeError: CUDA out of memory" in log["servers"][0]["log_tail"]
    assert {r["algorithm"] for r in recs} == {"DFLASH"}
    assert "CUDA out of memory" in capsys.readouterr().out


def test_fused_norms_servers_run_only_where_the_plugin_said_it_ran(tmp_path, monkeypatch):
    """``fused-norms``: the kit_norms plugin goes into the kit's site before any server, each such
    server gets SGLANG_SPEC_KIT_NORMS=triton, and one whose log lacks the plugin's line (its norms
    would be the stand-in's torch ones) fails instead of being measured; its own records and
    label say fused-norms. Outside the kit the option is refused before anything starts."""
    from e2e.kit_norms import READY

    monkeypatch.setattr(kit, "sglang_site", lambda: tmp_path / "site")
    (tmp_path / "site").mkdir()
    servers = ["qwen3-8b:ar:fused-norms", "qwen3-8b:ar"]
    rc, recs, started, log = _run(tmp_path, monkeypatch, servers, SGLANG_KIT_FLAGS=KIT_FLAGS)
    assert rc == 1 and (tmp_path / "site" / "sglang_spec_kit_norms.py").is_file()
    assert started[0]["env"]["SGLANG_SPEC_KIT_NORMS"] == "triton"
    assert "SGLANG_SPEC_KIT_NORMS" not in started[1]["env"]
    assert log["servers"][0]["status"].startswith(
        f"failed: HarnessError: fused-norms: no {READY!r}"
    )
    assert {r["variant"] for r in recs} == {""}  # only the torch-norm server measured
    rc, recs, started, log = _run(
        tmp_path, monkeypatch, servers, out="o2", SGLANG_KIT_FLAGS=KIT_FLAGS, FAKE_START_LINE=READY
    )
    assert rc == 0 and {r["variant"] for r in recs} == {"", "fused-norms"}
    assert log["servers"][0]["server"] == "qwen3-8b:ar:fused-norms"
    monkeypatch.delenv("FAKE_START_LINE")
    rc, recs, again, log = _run(tmp_path, monkeypatch, servers[:1], out="o3")  # not in the kit
    assert rc == 2 and len(again) == len(started) and not recs and not log["servers"]


def test_busy_port_is_refused(tmp_path, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        rc, recs, started, log = _run(tmp_path, monkeypatch, ["qwen3-8b:ar"], "--port", str(port))
    assert rc == 1 and started == [] and recs == []
    assert f"port {port} is already in use" in log["servers"][0]["status"]


def test_python_m_entry_point(tmp_path):
    import subprocess

    out = subprocess.run(
        [sys.executable, "-m", "e2e.scale", "--servers", "qwen3-8b:bogus", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert out.returncode == 2 and "algorithm 'bogus' is not one of" in out.stderr


def test_sigterm_stops_the_server_and_keeps_finished_levels(tmp_path, monkeypatch):
    """A device call's time limit (``timeout`` sends SIGTERM) must not leave a server running."""
    import os
    import signal
    import threading
    import time

    out = tmp_path / "out"
    running = threading.Event()
    running.set()

    def terminate_during_the_second_level():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (out / "scale.json").exists():
            time.sleep(0.05)
        if running.is_set():  # C = 1 is written; C = 2 takes 12 x 150 ms
            os.kill(os.getpid(), signal.SIGTERM)

    def not_handled(signum, frame):  # noqa: ARG001 (what runs if the harness installed nothing)
        raise AssertionError("the harness did not handle SIGTERM")

    before = signal.signal(signal.SIGTERM, not_handled)
    watcher = threading.Thread(target=terminate_during_the_second_level)
    watcher.start()
    try:
        rc, recs, started, log = _run(
            tmp_path, monkeypatch, ["qwen3-8b:ar"], "--levels", "1,2", FAKE_STEP_MS=150
        )
    finally:
        running.clear()
        watcher.join()
        assert signal.signal(signal.SIGTERM, before) is not_handled  # the harness restored it
    assert rc == 130 and log["interrupted"] is True
    assert [r["concurrency"] for r in recs] == [1]
    (call,) = started
    with pytest.raises(ProcessLookupError):
        os.kill(call["pid"], 0)


def test_group_alive_ignores_zombies():
    """Server.stop waits for the old server's process group; a zombie (never reaped in some
    containers) must not count as alive, a sleeping member must."""
    import subprocess
    import time

    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    try:
        assert kit.group_alive(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not kit.group_alive(sleeper.pid)
    quick = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # exited but not waited for: a zombie of this process
        state = Path(f"/proc/{quick.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "Z":
            break
        time.sleep(0.05)
    assert state == "Z" and not kit.group_alive(quick.pid)
    quick.wait()


def test_plugin_install_in_the_kit_and_outside(monkeypatch, tmp_path):
    assert (kit.sglang_site() / "sglang" / "__init__.py").is_file()
    site = tmp_path  # the kit's site, where the install stamps what it installed
    monkeypatch.setattr(kit, "sglang_site", lambda: site)
    ran = []
    monkeypatch.setattr(kit.subprocess, "run", lambda cmd, **kw: ran.append((cmd, kw)))
    monkeypatch.setenv("SGLANG_KIT_FLAGS", KIT_FLAGS)
    assert kit.install_plugin() == f"installed {kit.REPO} into {site}"
    # the same checkout again (a second harness on the machine): no reinstall under its servers
    assert kit.install_plugin() == f"{kit.REPO} already installed into {site}"
    # a changed checkout installs again
    (site / "sglang_spec.installed-digest").write_text("an older checkout")
    assert kit.install_plugin() == f"installed {kit.REPO} into {site}"
    assert len(ran) == 2
    cmd, kw = ran[0]
    # --upgrade: a warm machine keeps the previous call's copy, which --target alone would keep
    assert cmd[1:] == [
        "-m",
        "pip",
        "install",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "--upgrade",
        "--target",
        str(site),
        str(kit.REPO),
    ]
    assert kw["check"] is True
    monkeypatch.delenv("SGLANG_KIT_FLAGS")
    assert kit.install_plugin() == "plugin entry point already registered"
    monkeypatch.setattr(kit.importlib.metadata, "entry_points", lambda group: [])  # noqa: ARG005
    with pytest.raises(kit.HarnessError, match="pip install -e '.\\[sglang\\]'"):
        kit.install_plugin()


# ------------------------------------------------------------------------------------ Server.start
def _sleeping_server(tmp_path, port: int) -> kit.Server:
    """A "server" that never binds its port (SGLang still loading the model)."""
    cfg = ServerConfig("sleeper", "m", "AR", {}, env={"PIDFILE": str(tmp_path / "pid")})
    script = (
        "import os, time; open(os.environ['PIDFILE'], 'w').write(str(os.getpid())); time.sleep(120)"
    )
    launcher = f'{{python}} -c "{script}"'
    return kit.Server(cfg, tmp_path / "log", port=port, start_timeout=60, launcher=launcher)


def test_sigterm_while_starting_stops_the_server(tmp_path):
    """Session 7's call 3: ``timeout`` stopped the harness while a server was loading; start() did
    not stop it (``with`` never reached ``__exit__``), and it later answered for the next run."""
    import os
    import signal
    import threading

    srv = _sleeping_server(tmp_path, _free_port())
    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGTERM))
    with kit.sigterm_as_interrupt():
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            srv.start()
    timer.join()
    assert srv.proc is None
    assert not kit.group_alive(int((tmp_path / "pid").read_text()))


def test_a_port_answered_by_another_process_is_refused(tmp_path):
    """The same incident's second half: an older server bound the port after the check and
    answered /health for the new one, whose run then measured the old server."""
    import http.server
    import threading

    class Healthy(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *a):
            pass

    orphan = http.server.HTTPServer(("127.0.0.1", 0), Healthy)
    port = orphan.server_address[1]
    threading.Thread(target=orphan.serve_forever, daemon=True).start()
    srv = _sleeping_server(tmp_path, port)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(kit, "port_in_use", lambda *_: False)  # bound after the check
            with pytest.raises(kit.HarnessError, match=f"port {port} is answered by pid"):
                srv.start()
    finally:
        orphan.shutdown()
        orphan.server_close()
    assert srv.proc is None  # stopped (it may not have written its pid yet)


def test_stage_medians_split_a_batch_size_by_the_widths_its_steps_ran_at():
    """Budget by batch size runs steps of one batch size at several widths (the chosen budget,
    probes): their medians are kept apart as "bs:width"; a batch size at one width keeps its
    plain "bs" key; the report orders them by batch size, then width."""
    from e2e.scale import stage_medians
    from e2e.scale_report import stage_key

    def step(bs, width, verify):
        return {"bs": bs, "width": width, "host_ms": {"verify": 1.0}, "gpu_ms": {"verify": verify}}

    steps = [step(8, 16, 44.0), step(8, 16, 45.0), step(8, 16, 46.0), step(8, 32, 50.0)]
    steps += [step(1, 32, 30.0), step(1, 32, 32.0)]
    out = stage_medians(steps)
    assert sorted(out, key=stage_key) == ["1", "8:16", "8:32"]
    assert out["8:16"]["gpu_ms"]["verify"] == 45.0 and out["8:16"]["steps"] == 3
    assert out["8:32"]["gpu_ms"]["verify"] == 50.0 and out["8:32"]["width"] == 32
    assert out["1"]["gpu_ms"]["verify"] == 31.0 and out["1"]["width"] == 32


def test_cpu_blocks_deal_whole_physical_cores_of_the_allowed_cpus(tmp_path, monkeypatch):
    """kit.cpu_blocks: hyperthreads of one core (sysfs thread_siblings_list) stay together, only
    allowed CPUs count, cores are dealt in order as evenly as they go, a CPU without topology is
    its own core, and asking for more blocks than cores is refused with the numbers."""
    siblings = {0: "0,4", 1: "1,5", 2: "2-3", 3: "2-3", 4: "0,4", 5: "1,5", 6: "6"}
    for cpu, text in siblings.items():
        (tmp_path / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (tmp_path / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(text + "\n")
    monkeypatch.setattr(kit.os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3, 4, 5, 6, 7})
    # cores in order of their first CPU: {0,4} {1,5} {2,3} {6} {7} (cpu7 has no topology)
    assert kit.cpu_blocks(3, sysfs=tmp_path) == [{0, 4, 1, 5}, {2, 3, 6}, {7}]
    assert kit.cpu_blocks(5, sysfs=tmp_path) == [{0, 4}, {1, 5}, {2, 3}, {6}, {7}]
    monkeypatch.setattr(kit.os, "sched_getaffinity", lambda _pid: {0, 1, 5})  # 4 not allowed
    assert kit.cpu_blocks(2, sysfs=tmp_path) == [{0}, {1, 5}]
    with pytest.raises(kit.HarnessError, match=r"3 CPU blocks asked for, 2 physical cores allowed"):
        kit.cpu_blocks(3, sysfs=tmp_path)


def test_pin_scheduler_gives_the_schedulers_threads_a_core_of_their_own(tmp_path, monkeypatch):
    """kit.pin_scheduler: in the server's block, every thread of the process titled
    sglang::scheduler... goes to the block's first physical core, every thread of the group's
    other live processes to the rest; zombies, other groups and CPUs outside the block are left;
    a one-core block or a group without a scheduler moves nothing."""
    sysfs, proc = tmp_path / "sys", tmp_path / "proc"
    for cpu, text in {
        0: "0,4",
        1: "1,5",
        2: "2,6",
        3: "3,7",
        4: "0,4",
        5: "1,5",
        6: "2,6",
        7: "3,7",
    }.items():
        (sysfs / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (sysfs / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(text)
    monkeypatch.setattr(kit.os, "sched_getaffinity", lambda _pid: set(range(8)))

    def process(pid, pgrp, title, state="S", tasks=()):
        d = proc / str(pid)
        (d / "task").mkdir(parents=True)
        (d / "stat").write_text(f"{pid} (python3) {state} 1 {pgrp} 0")
        (d / "cmdline").write_bytes(title.encode() + b"\0")
        for t in (pid, *tasks):
            (d / "task" / str(t)).mkdir()

    process(100, 100, "python3\0-m\0sglang.launch_server")
    process(101, 100, "sglang::scheduler_TP0", tasks=(107, 108))
    process(102, 100, "sglang::detokenizer")
    process(103, 100, "sglang::scheduler_old", state="Z")  # a zombie: not this server's loop
    process(200, 200, "sglang::scheduler_TP0")  # another server's
    moved = {}
    monkeypatch.setattr(
        kit.os, "sched_setaffinity", lambda tid, cpus: moved.update({tid: set(cpus)})
    )
    block = frozenset({1, 5, 2, 6, 3, 7})
    # the harness runs on a block of its own (tiny_pair --pin-cpus; session 32's device run found
    # no core when the server's block was read through the harness's affinity)
    monkeypatch.setattr(kit.os, "sched_getaffinity", lambda _pid: {0, 4})
    assert kit.scheduler_pid(100, proc) == 101  # not the zombie 103, not group 200's
    assert kit.scheduler_pid(200, proc) == 200 and kit.scheduler_pid(300, proc) is None
    assert kit.pin_scheduler(100, block, sysfs, proc) == 101
    assert moved == {
        101: {1, 5}, 107: {1, 5}, 108: {1, 5},  # the scheduler: the block's first core
        100: {2, 6, 3, 7}, 102: {2, 6, 3, 7},  # the rest of the group: the other cores
    }  # fmt: skip
    moved.clear()
    assert kit.pin_scheduler(100, frozenset({0, 4}), sysfs, proc) is None  # one core: nothing
    assert kit.pin_scheduler(300, block, sysfs, proc) is None and moved == {}  # no such group


def test_run_periods_spread_the_loops_period_over_runs_between_prefills():
    """run_periods: runs are the decode steps between prefills; a run's period is the median of
    its steps' summed GPU ms plus the GPU time before each (steps without it left out); runs
    shorter than min_steps do not count; None without a long enough run."""
    from e2e.scale import run_periods

    def step(gpu, between):
        return {
            "bs": 1,
            "host_ms": {"a": 9.0},
            "gpu_ms": {"a": gpu, "b": 1.0},
            "gpu_between_ms": between,
        }

    extend = {"phase": "extend", "bs": 1, "host_ms": {"extend": 50.0}, "gpu_ms": {"extend": 50.0}}
    fast = [step(2.0, None)] + [step(2.0, 1.0)] * 3 + [step(3.0, 1.0)]  # period 4 (3 of 4 steps)
    slow = [step(5.0, 0.5)] * 4  # period 6.5
    short = [step(50.0, 50.0)] * 3  # below min_steps: a check's request, not a level
    lines = [extend, *fast, extend, *slow, extend, *short, extend, *slow]
    assert run_periods(lines, min_steps=4) == {
        "runs": 3,
        "min_steps": 4,
        "min_ms": 4.0,
        "median_ms": 6.5,
        "max_ms": 6.5,
    }
    assert run_periods(lines, min_steps=5) is None  # the fast run has 4 steps with a gap


def test_a_sharp_tree_temperature_lets_a_small_budget_carry_a_stated_tau_on_flat_logits():
    """Why ``tree-temp=1e-8`` exists: at SGLang's dummy-weight scale the drafter's logits differ by
    about 1e-5 (weights from U(-1e-3, 1e-3)), so at the default temperature a budget of 7 is a
    depth-1 star whose best path accepts at most 2 tokens; at 1e-8 it is the 7-deep argmax chain."""
    from sglang_spec.plugin.simulate import best_path
    from sglang_spec.tree import DEFAULT_TREE_TEMPERATURE, build_ddtree

    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 15, 4096, generator=g) * 2.4e-5).to(torch.bfloat16).float()
    roots = torch.tensor([1, 2])
    star = build_ddtree(logits, 7, roots, temperature=DEFAULT_TREE_TEMPERATURE)
    assert star.depths.max(dim=1).values.tolist() == [1, 1]
    assert (best_path(star) >= 0).sum(dim=1).tolist() == [2, 2]
    chain = build_ddtree(logits, 7, roots, temperature=1e-8)
    assert (best_path(chain) >= 0).sum(dim=1).tolist() == [8, 8]
    assert chain.tokens[:, 1:].tolist() == logits[:, :7].argmax(-1).tolist()


def test_a_seen_start_replaces_the_start_estimate(tmp_path, monkeypatch):
    """Once a server has started, the next one of its shape is judged by that start in this call,
    not by --start-estimate (session 13 skipped a 27B server that fitted: 168 s left, 76 s
    starts, a 150 s estimate). The first server's levels take about 4 s (100 ms steps), so the
    second would not fit the 34 s budget under a 30 s estimate."""
    rc, recs, started, log = _run(
        tmp_path,
        monkeypatch,
        ["qwen3-8b:ar", "qwen3-8b:dflash"],
        "--time-budget",
        "34",
        "--start-estimate",
        "30",
        FAKE_STEP_MS=100,
    )
    assert rc == 0 and len(started) == 2, log["servers"]
    assert {r["algorithm"] for r in recs} == {"AR", "DFLASH"}


def test_the_skip_says_which_start_it_assumed(tmp_path, monkeypatch):
    _, _, _, log = _run(
        tmp_path, monkeypatch, ["qwen3-8b:ar"], "--time-budget", "30", "--start-estimate", "40"
    )
    assert "a start (40 s, --start-estimate)" in log["servers"][0]["status"]


def test_start_estimate_is_the_latest_start_of_the_same_shape():
    # a fresh machine's first start compiles the kernels the next one finds cached (session 18)
    seen = {"qwen3.6-27b": 61.6}
    assert scale.expected_start(seen, "qwen3.6-27b", 100.0) == (
        61.6,
        "the latest qwen3.6-27b start seen",
    )
    assert scale.expected_start(seen, "qwen3-8b", 100.0) == (100.0, "--start-estimate")
    assert scale.expected_start({}, "qwen3.6-27b", 100.0)[0] == 100.0

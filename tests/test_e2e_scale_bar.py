"""e2e.scale_bar: issue 15's real-scale verdict from merged e2e.scale records (CPU)."""

from __future__ import annotations

import json

import pytest

from e2e import records, scale_bar

CONFIG = "adaptive_budget_qwen3.6-27b_7-13-31_wy"
ADAPTIVE = f"adaptive={CONFIG}+acc=7@3.17/13@3.51/31@4.01+tree-temp=1e-08"


def _rec(algorithm, c, tps, acc=None, variant="", budget=None, decode_ms=None, **extra):
    rec = {
        "shape": "qwen3.6-27b",
        "algorithm": algorithm,
        "budget": budget,
        "width": (budget + 1) if budget is not None else 1,
        "variant": variant,
        "concurrency": c,
        "ms_per_step": 30.0,
        "tokens_per_s": tps,
        "tokens_per_step": 3.0,
        "max_running_requests": 32,
        "simulated_accept_len": acc,
        "tp": 1,
        **extra,
    }
    if decode_ms is not None:
        rec["decode_ms_per_step"] = decode_ms
    return rec


def _servers(adaptive_tps, fused=False, skip=()):
    """AR, NEXTN (3.1), DFLASH (3.0) and the adaptive server at every C; NEXTN is the best
    baseline at 100 * C tokens/s, AR 60 * C, DFLASH 80 * C."""
    flag = "fused-norms" if fused else ""
    join = (lambda v: f"{flag}+{v}" if v else flag) if fused else (lambda v: v)
    recs = []
    for c, a in zip(scale_bar.LEVELS, adaptive_tps):
        recs += [
            _rec("AR", c, 60.0 * c, variant=join("")),
            _rec("NEXTN", c, 100.0 * c, acc=3.1, variant=join(""), decode_ms=30.0),
            _rec("DFLASH", c, 80.0 * c, acc=3.0, variant=join("")),
            _rec("DDTREE", c, a * c, acc=4.01, budget=31, variant=join(ADAPTIVE), decode_ms=25.0),
        ]
    return [r for r in recs if (r["algorithm"], r["concurrency"]) not in skip]


def _main(tmp_path, recs, *args):
    path = tmp_path / "scale.json"
    records.save(path, [records.validate(r) for r in recs])
    out = tmp_path / "bar.json"
    rc = scale_bar.main([str(path), "--adaptive", CONFIG, "--json", str(out), *args])
    return rc, json.loads(out.read_text()) if out.exists() else None


def test_the_bar_is_met_where_adaptive_beats_the_best_baseline_at_every_c(tmp_path, capsys):
    rc, rows = _main(tmp_path, _servers([120, 110, 105, 101, 100, 130]), "--norms", "torch")
    assert rc == 0 and [r["concurrency"] for r in rows] == [1, 2, 4, 8, 16, 32]
    assert all(r["best_baseline"] == "NEXTN" for r in rows)
    assert rows[0]["ratio"] == pytest.approx(1.2) and rows[4]["ratio"] == pytest.approx(1.0)
    assert rows[0]["decode_ratio"] == pytest.approx(30 / 25)  # same tokens a step, 25 vs 30 ms
    assert "issue 15 real-scale bar: met at every C" in capsys.readouterr().out


def test_a_miss_is_named_with_its_concurrency(tmp_path, capsys):
    rc, rows = _main(tmp_path, _servers([120, 110, 105, 101, 98.8, 130]), "--norms", "torch")
    assert rc == 1 and [r["met"] for r in rows] == [True] * 4 + [False, True]
    text = capsys.readouterr().out
    assert "| 16 | 960 | 1600 | 1280 | 1581 | NEXTN | 0.988 **miss** | 1.200 |" in text
    assert "issue 15 real-scale bar: missed at C = 16" in text


def test_the_norms_never_mix_and_other_variants_do_not_count(tmp_path, capsys):
    """``--norms fused`` reads only fused-norms servers, ``torch`` only the others; a ``stages``
    or ``no-overlap`` baseline times something else and does not count, even when faster."""
    recs = _servers([120, 110, 105, 101, 100, 130])
    fused = _servers([150] * 6, fused=True)
    faster = [_rec("NEXTN", c, 1e4, acc=3.1, variant="stages") for c in scale_bar.LEVELS]
    rc, rows = _main(tmp_path, recs + fused + faster, "--norms", "torch")
    assert rc == 0 and rows[0]["tokens_per_s"]["adaptive"] == 120
    rc, rows = _main(tmp_path, recs + fused + faster, "--norms", "fused")
    assert rc == 0 and rows[0]["tokens_per_s"]["adaptive"] == 150
    # fused baselines beside torch-norm adaptive records only: refused either way, not compared
    mixed = [r for r in recs if r["algorithm"] == "DDTREE"]
    mixed += [r for r in fused if r["algorithm"] != "DDTREE"]
    capsys.readouterr()
    assert _main(tmp_path, mixed, "--norms", "fused")[0] == 2
    assert "valid: none recorded with these norms" in capsys.readouterr().err
    assert _main(tmp_path, mixed, "--norms", "torch")[0] == 2
    assert "torch-norm records lack AR C = 1, AR C = 2" in capsys.readouterr().err


def test_a_missing_level_or_config_is_refused_in_one_line(tmp_path, capsys):
    rc, _ = _main(tmp_path, _servers([120] * 6, skip={("NEXTN", 32)}), "--norms", "torch")
    assert rc == 2
    assert "torch-norm records lack NEXTN C = 32; the bar needs every C" in capsys.readouterr().err
    path = tmp_path / "scale.json"
    rc = scale_bar.main([str(path), "--norms", "torch", "--adaptive", "other"])
    assert rc == 2
    assert f"records of config 'other' on qwen3.6-27b; valid: {CONFIG}" in capsys.readouterr().err
    rc = scale_bar.main([str(tmp_path / "nope.json"), "--norms", "torch", "--adaptive", CONFIG])
    assert rc == 2 and "no such file" in capsys.readouterr().err

"""e2e.tiny_bar: issue 15's tiny-pair load-sweep verdict from one run's sweep files (CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from e2e import tiny_bar

ADAPTIVE = "ddtree63+graphs+adaptive"


def _write(folder: Path, label: str, levels: list[tuple], **fields) -> None:
    """One server's sweep file: levels (C, tokens/s[, tokens per step, median chunk gap ms])."""
    rows = []
    for c, t, *step in levels:
        row = {"label": label, "max_concurrency": c, "output_throughput": t, **fields}
        if step:
            row.update(tokens_per_step=step[0], median_chunk_gap_ms=step[1])
        rows.append(row)
    name = label.replace("+", "_") + ".jsonl"
    (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


def _run(tmp_path, adaptive: list[tuple[int, float]]) -> Path:
    """Two passes of C = 1 and 2 (pass 2 of everything 1.5x slower: a drifting machine)."""
    d = tmp_path / "sweeps"
    d.mkdir()
    _write(d, "ar+graphs", [(1, 400), (2, 800), (1, 267), (2, 533)])
    _write(d, "dflash+graphs", [(1, 1000), (2, 2000), (1, 667), (2, 1333)])
    _write(d, "ddtree15+graphs", [(1, 900), (2, 2300), (1, 600), (2, 1533)])
    _write(d, "ddtree63+graphs", [(1, 1200), (2, 2100), (1, 800), (2, 1400)])
    _write(d, ADAPTIVE, adaptive)
    return d


def test_ratios_are_taken_within_a_pass_and_the_verdict_reads_their_median(tmp_path, capsys):
    # adaptive: C = 1 at 1.0x the best fixed (63) in both passes; C = 2 at 0.96x (15 is best)
    d = _run(tmp_path, [(1, 1200), (2, 2208), (1, 800), (2, 1472)])
    out = tmp_path / "bar.json"
    assert tiny_bar.main([str(d), "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["concurrency"] for r in rows] == [1, 2] and rows[0]["passes"] == 2
    c1 = rows[0]["adaptive_over"]
    assert c1["best_fixed"]["median"] == pytest.approx(1.0)
    assert c1["dflash"]["median"] == pytest.approx(1.2, abs=1e-3)
    assert c1["ar"]["low"] == pytest.approx(2.996, abs=1e-3)  # pass 2: 800 / 267
    assert rows[1]["adaptive_over"]["best_fixed"]["median"] == pytest.approx(0.96, abs=1e-3)
    assert rows[0]["tokens_per_s"]["ddtree63+graphs"] == 1000.0  # median of 1200 and 800
    text = capsys.readouterr().out
    # AR, DFLASH, the fixed budgets, adaptive: medians of the passes
    assert (
        "| 2 | 2 | 666 | 1666 | 1916 | 1750 | 1840 | 1.104 [1.10, 1.10: held] (1.10-1.10) |" in text
    )
    assert "issue 15 tiny bar: met at every C" in text
    # two passes bound the median with 50 % only; C = 2's 0.96 of the best fixed both times holds
    assert rows[1]["adaptive_over"]["best_fixed"]["coverage"] == 0.5
    assert "the medians' intervals (>= 50.0 % each): held at C = 1, 2" in text


def test_servers_split_over_calls_read_from_several_folders(tmp_path, capsys):
    """The servers of one bar in two calls' sweeps folders give the verdict one folder gives; a
    server in both is refused."""
    d = _run(tmp_path, [(1, 1200), (2, 2208), (1, 800), (2, 1472)])
    assert tiny_bar.main([str(d)]) == 0
    whole = capsys.readouterr().out
    second = tmp_path / "call2"
    second.mkdir()
    for name in ("ddtree63_graphs.jsonl", "ddtree63_graphs_adaptive.jsonl"):
        (d / name).rename(second / name)
    assert tiny_bar.main([str(d), str(second)]) == 0
    assert capsys.readouterr().out == whole
    (second / "again.jsonl").write_text((d / "ar_graphs.jsonl").read_text())
    assert tiny_bar.main([str(d), str(second)]) == 2
    assert "valid: each server in one folder" in capsys.readouterr().err
    (d / "again.jsonl").write_text((d / "ar_graphs.jsonl").read_text())
    assert tiny_bar.main([str(d)]) == 2
    assert "a second file of server 'ar+graphs'" in capsys.readouterr().err


def _two_runs(tmp_path) -> tuple[Path, Path]:
    """Run 1: the adaptive server 10 % under DDTREE(63) at C = 1; run 2 (the same servers, its
    own folder): 5 % over."""
    one = _run(tmp_path, [(1, 1080), (2, 2300), (1, 720), (2, 1533)])
    two = tmp_path / "run2"
    two.mkdir()
    for f in one.glob("*.jsonl"):
        (two / f.name).write_text(f.read_text())
    _write(two, ADAPTIVE, [(1, 1260), (2, 2300), (1, 840), (2, 1533)])
    return one, two


def test_repeated_runs_pool_their_passes_run_after_run(tmp_path, capsys):
    """The same servers in two folders (the second call's servers started in the reverse order):
    pass k of every server is from one run, run 2's passes after run 1's. Run 1 has the adaptive
    server 10 % under DDTREE(63) at C = 1, run 2 5 % over: pooled, the four per-pass ratios
    0.9, 0.9, 1.05, 1.05 have the median 0.975, not the one of either run."""
    one, two = _two_runs(tmp_path)
    out = tmp_path / "bar.json"
    assert tiny_bar.main([str(one), str(two), "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert rows[0]["passes"] == 4
    best = rows[0]["adaptive_over"]["best_fixed"]
    assert (best["median"], best["low"], best["high"]) == pytest.approx((0.975, 0.9, 1.05))
    assert rows[0]["tokens_per_s"][ADAPTIVE] == 960  # median of 1080, 720, 1260, 840
    # one run missing a server is neither a split nor a repeat
    (two / "dflash_graphs.jsonl").unlink()
    assert tiny_bar.main([str(one), str(two)]) == 2
    err = capsys.readouterr().err
    assert "valid: each server in one folder (a bar split over calls; one run's folders" in err


def test_a_runs_calls_joined_by_commas_pool_with_another_run(tmp_path, capsys):
    """Two runs, each split over two calls (``A1,A2 B1,B2``, session 37): the verdict of the two
    runs each in one folder; a server in both calls of one run is refused, naming them."""
    one, two = _two_runs(tmp_path)
    whole = tmp_path / "whole.json"
    assert tiny_bar.main([str(one), str(two), "--json", str(whole)]) == 0
    calls = []
    for run in (one, two):
        later = tmp_path / f"{run.name}-call2"
        later.mkdir()
        for name in ("ar_graphs.jsonl", "ddtree63_graphs_adaptive.jsonl"):
            (run / name).rename(later / name)
        calls.append(f"{run},{later}")
    split = tmp_path / "split.json"
    assert tiny_bar.main([*calls, "--json", str(split)]) == 0
    assert json.loads(split.read_text()) == json.loads(whole.read_text())
    (one / "ar_graphs.jsonl").write_text(
        (tmp_path / "sweeps-call2" / "ar_graphs.jsonl").read_text()
    )
    assert tiny_bar.main(calls) == 2
    assert f"a second file of server 'ar+graphs' in {calls[0]}" in capsys.readouterr().err


def test_a_miss_is_named_with_its_concurrency(tmp_path, capsys):
    # C = 1: below DFLASH in both passes; C = 2: 0.9x the best fixed
    d = _run(tmp_path, [(1, 950), (2, 2070), (1, 600), (2, 1380)])
    assert tiny_bar.main([str(d)]) == 1
    text = capsys.readouterr().out
    assert "issue 15 tiny bar: missed at C = 1, 2" in text
    # C = 1 over DFLASH: 950/1000, 600/667, both under 1: the interval misses too
    assert "0.925 **miss** [0.90, 0.95: missed] (0.90-0.95)" in text
    assert "the medians' intervals (>= 50.0 % each): missed at C = 1, 2" in text


def test_a_run_without_an_adaptive_and_a_fixed_ddtree_server_is_refused_in_one_line(
    tmp_path, capsys
):
    d = tmp_path / "sweeps"
    d.mkdir()
    _write(d, "dflash+graphs", [(1, 1000)])
    _write(d, ADAPTIVE, [(1, 1000)])
    assert tiny_bar.main([str(d)]) == 2
    err = capsys.readouterr().err
    assert "the bar needs one +adaptive DDTREE server, at least one fixed DDTREE server" in err
    assert "got AR [], DFLASH ['dflash+graphs'], adaptive [" in err
    assert tiny_bar.main([str(tmp_path / "nope")]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_a_run_of_the_ddtree_servers_alone_judges_the_5_percent_criterion_alone(tmp_path, capsys):
    """Without AR and DFLASH (twice the passes in a call's time): only within 5 % of the best
    fixed budget is judged, and the verdict says so; the step table splits that ratio alone."""
    d = tmp_path / "sweeps"
    d.mkdir()
    _write(d, "ddtree63+graphs", [(1, 1000, 11.0, 3.0), (1, 800, 11.0, 4.0)])
    _write(d, ADAPTIVE, [(1, 970, 11.0, 3.1), (1, 760, 11.0, 4.2)])
    out = tmp_path / "bar.json"
    assert tiny_bar.main([str(d), "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert list(row["adaptive_over"]) == ["best_fixed"]
    assert row["adaptive_over"]["best_fixed"]["median"] == pytest.approx((0.97 + 0.95) / 2)
    assert list(row["steps"]) == ["per_server", "adaptive_over_best_fixed"]
    text = capsys.readouterr().out
    assert (
        "| C | passes | ddtree63+graphs | ddtree63+graphs+adaptive | adaptive / best fixed |"
        in text
    )
    assert "| C | ddtree63+graphs | ddtree63+graphs+adaptive | adaptive / best fixed |" in text
    assert (
        "issue 15 tiny bar (within 5 % of the best fixed budget only: no DFLASH or AR server "
        "in this run): met at every C" in text
    )
    _write(d, ADAPTIVE, [(1, 900), (1, 760)])  # 0.90 and 0.95: a miss
    assert tiny_bar.main([str(d)]) == 1
    assert "best fixed budget only: no DFLASH or AR server in this run): missed at C = 1" in (
        capsys.readouterr().out
    )


def test_servers_with_and_without_fused_norms_do_not_mix(tmp_path, capsys):
    """A bar reads servers that all ran the kit's torch norms or all ran +fusednorms."""
    d = tmp_path / "sweeps"
    d.mkdir()
    for label in ("ar+graphs", "dflash+graphs", "ddtree63+graphs"):
        _write(d, label + "+fusednorms", [(1, 1000)])
    _write(d, ADAPTIVE + "+fusednorms", [(1, 1100)])
    assert tiny_bar.main([str(d)]) == 0
    (d / "ar_graphs_fusednorms.jsonl").unlink()
    _write(d, "ar+graphs", [(1, 400)])
    assert tiny_bar.main([str(d)]) == 2
    err = capsys.readouterr().err
    assert "only ['ddtree63+graphs+adaptive+fusednorms', 'ddtree63+graphs+fusednorms', " in err
    assert "ran +fusednorms; valid: every server with the kit's torch norms or every one" in err


def test_passes_a_time_out_cut_are_left_out_at_their_concurrency(tmp_path, capsys):
    """A pass whose level of some server recorded 0 tokens/s (or ``interrupted``) does not count at
    that C; the others do, and the table says how many were cut."""
    d = tmp_path / "sweeps"
    d.mkdir()
    _write(d, "ar+graphs", [(1, 400), (1, 300)])
    _write(d, "dflash+graphs", [(1, 1000), (1, 0.0)])  # pass 2 cut by a time-out
    _write(d, "ddtree63+graphs", [(1, 1200), (1, 900)])
    _write(d, ADAPTIVE, [(1, 1100), (1, 100)])
    out = tmp_path / "bar.json"
    assert tiny_bar.main([str(d), "--json", str(out)]) == 1
    (row,) = json.loads(out.read_text())
    assert (row["passes"], row["skipped_passes"]) == (1, 1)
    assert row["adaptive_over"]["dflash"]["median"] == pytest.approx(1.1)
    assert row["tokens_per_s"][ADAPTIVE] == 1100.0
    assert "| 1 | 1 (1 cut) |" in capsys.readouterr().out
    _write(d, "ar+graphs", [(1, 400), (1, 300)], interrupted=True)  # no complete pass left
    assert tiny_bar.main([str(d)]) == 2
    assert "C = 1: no pass in which every server's level completed" in capsys.readouterr().err


def test_the_ratios_split_into_tokens_per_step_and_step_rate(tmp_path, capsys):
    """With tokens per step and chunk gaps recorded: their medians per server (AR's records carry
    no tokens per step: one), and the adaptive server's ratios over DFLASH and over each pass's
    best fixed budget as (tokens per step) x (step rate = the other's gap / its own)."""
    d = tmp_path / "sweeps"
    d.mkdir()
    _write(d, "ar+graphs", [(1, 400, None, 2.0), (1, 300, None, 3.0)])
    _write(d, "dflash+graphs", [(1, 1000, 9.0, 5.0), (1, 900, 9.0, 6.0)])
    _write(d, "ddtree15+graphs", [(1, 1100, 9.0, 6.0), (1, 700, 9.0, 9.0)])
    _write(d, "ddtree63+graphs", [(1, 1000, 11.0, 8.0), (1, 800, 11.0, 9.0)])
    _write(d, ADAPTIVE, [(1, 1050, 11.0, 7.0), (1, 850, 10.0, 8.0)])
    out = tmp_path / "bar.json"
    tiny_bar.main([str(d), "--json", str(out)])
    steps = json.loads(out.read_text())[0]["steps"]
    assert steps["per_server"]["ar+graphs"] == {"tokens_per_step": 1.0, "median_chunk_gap_ms": 2.5}
    assert steps["per_server"][ADAPTIVE]["tokens_per_step"] == pytest.approx(10.5)
    # over DFLASH: passes (11/9, 5/7) and (10/9, 6/8)
    over = steps["adaptive_over_dflash"]
    assert over["tokens_per_step"] == pytest.approx((11 / 9 + 10 / 9) / 2)
    assert over["step_rate"] == pytest.approx((5 / 7 + 6 / 8) / 2)
    # the best fixed budget is 15 in pass 1 (1100) and 63 in pass 2 (800)
    best = steps["adaptive_over_best_fixed"]
    assert best["tokens_per_step"] == pytest.approx((11 / 9 + 10 / 11) / 2)
    assert best["step_rate"] == pytest.approx((6 / 7 + 9 / 8) / 2)
    text = capsys.readouterr().out
    assert "| 1 | 1.00 / 2.50 | 9.00 / 5.50 | 9.00 / 7.50 | 11.00 / 8.50 | 10.50 / 7.50 |" in text
    assert f"| {(11 / 9 + 10 / 9) / 2:.3f} x {(5 / 7 + 6 / 8) / 2:.3f} |" in text
    # a run without them (older records) prints no second table
    _write(d, "dflash+graphs", [(1, 1000), (1, 900)])
    tiny_bar.main([str(d)])
    assert "Tokens per verify step" not in capsys.readouterr().out


def test_each_servers_levels_by_their_place_in_the_order(tmp_path, capsys):
    """Levels that name their place (loadtests.sweep since session 42): each server's level over
    its own median at that C, by place, pooled over C; here the adaptive server is 10 % slower
    whenever it runs first and 10 % faster last. Records without places print no such table."""
    d = tmp_path / "sweeps"
    d.mkdir()
    servers = ["ar+graphs", "dflash+graphs", "ddtree63+graphs", ADAPTIVE]
    for i, label in enumerate(servers):
        rows = []
        for k in range(4):  # passes: the order rotated by one each, so each server takes each place
            place = (i - k) % 4
            for c, t in ((1, 1000.0), (2, 2000.0)):
                slow = {0: 0.9, 3: 1.1}.get(place, 1.0) if label == ADAPTIVE else 1.0
                rows.append(
                    {
                        "label": label,
                        "max_concurrency": c,
                        "output_throughput": t * slow,
                        "place": place,
                    }
                )
        (d / (label.replace("+", "_") + ".jsonl")).write_text(
            "".join(json.dumps(r) + "\n" for r in rows)
        )
    tiny_bar.main([str(d)])
    text = capsys.readouterr().out
    assert "| server | place 0 | place 1 | place 2 | place 3 |" in text
    assert f"| {ADAPTIVE} | 0.900 (2) | 1.000 (2) | 1.000 (2) | 1.100 (2) |" in text
    assert "| ar+graphs | 1.000 (2) | 1.000 (2) | 1.000 (2) | 1.000 (2) |" in text
    places = tiny_bar.place_effect(tiny_bar.load_runs([d]))
    assert sorted(places[ADAPTIVE]) == [0, 1, 2, 3]
    (tmp_path / "plain").mkdir()
    plain = _run(tmp_path / "plain", [(1, 1200), (2, 2208), (1, 800), (2, 1472)])
    tiny_bar.main([str(plain)])
    assert "by its place" not in capsys.readouterr().out


def test_host_counters_show_each_pass_as_its_scheduler_spent_it(tmp_path, capsys):
    """With every level's host counters (loadtests.sweep --watch-pid): per server and pass, the
    chunk gap beside the decode loop's CPU and run-queue time within it (its shares of the
    level's wall time times the gap), the host's steal share, the GPU's clock and kernel share and
    the CPU probe's unit time where recorded, passes in order; one server
    without them: no such table (what is there cannot be compared)."""
    d = tmp_path / "sweeps"
    d.mkdir()

    def write(label, passes):  # passes: (tokens/s, chunk gap, on-CPU %, run-delay %, steal %)
        rows = [
            {"label": label, "max_concurrency": 1, "output_throughput": t,
             "tokens_per_step": 9.0, "median_chunk_gap_ms": gap,
             "host": {"on_cpu_pct": cpu, "run_delay_pct": rq, "steal_pct": st, "wall_s": 5.0}}
            for t, gap, cpu, rq, st in passes
        ]  # fmt: skip
        (d / (label.replace("+", "_") + ".jsonl")).write_text(
            "".join(json.dumps(r) + "\n" for r in rows)
        )

    write("ar+graphs", [(400, 2.0, 90, 0, 0), (300, 3.0, 90, 0, 0)])
    write("dflash+graphs", [(1000, 5.0, 80, 1, 0), (900, 6.0, 80, 1, 0)])
    write("ddtree63+graphs", [(1100, 4.0, 75, 0, 0.5), (700, 6.0, 95, 2, 0.5)])
    write(ADAPTIVE, [(1100, 8.0, 50, 10, 2.0), (800, 4.0, 100, 0, 0.0)])
    adaptive = d / (ADAPTIVE.replace("+", "_") + ".jsonl")
    levels = [json.loads(ln) for ln in adaptive.read_text().splitlines()]
    levels[0]["gpu"] = {"sm_mhz_mean": 1410.4, "util_pct_mean": 41.0}  # NVML read pass 1 alone
    levels[0]["cpu_probe"] = {"unit_ms_median": 1.667}
    levels[1]["cpu_probe"] = {"unit_ms_median": 2.5}
    adaptive.write_text("".join(json.dumps(r) + "\n" for r in levels))
    out = tmp_path / "bar.json"
    tiny_bar.main([str(d), "--json", str(out)])
    host = json.loads(out.read_text())[0]["host"]
    assert host[ADAPTIVE] == [
        {"chunk_gap_ms": 8.0, "cpu_ms": 4.0, "runq_ms": 0.8, "steal_pct": 2.0, "sm_mhz": 1410.4,
         "gpu_busy_pct": 41.0, "probe_ms": 1.667},
        {"chunk_gap_ms": 4.0, "cpu_ms": 4.0, "runq_ms": 0.0, "steal_pct": 0.0, "sm_mhz": None,
         "gpu_busy_pct": None, "probe_ms": 2.5},
    ]  # fmt: skip
    assert host["ddtree63+graphs"][1]["cpu_ms"] == pytest.approx(5.7)
    text = capsys.readouterr().out
    assert (
        f"| {ADAPTIVE} | 1 | 8.00 (cpu 4.00, runq 0.80; steal 2.0 %; SM 1410 MHz, busy 41 %; "
        "probe 1.667 ms) | 4.00 (cpu 4.00, runq 0.00; steal 0.0 %; probe 2.500 ms) |"
    ) in text
    assert "| ddtree63+graphs | 1 | 4.00 (cpu 3.00, runq 0.00; steal 0.5 %) |" in text
    lines = [ln for ln in (d / "ar_graphs.jsonl").read_text().splitlines()]
    bare = [json.loads(ln) for ln in lines]
    bare[1].pop("host")
    (d / "ar_graphs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bare))
    tiny_bar.main([str(d), "--json", str(out)])
    assert "host" not in json.loads(out.read_text())[0]
    assert "decode loop's time on a CPU" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "n,coverage,j",
    [(4, 0.875, 1), (5, 0.9375, 1), (9, 0.9609375, 2), (12, 0.9614, 3), (20, 0.9586, 6)],
)
def test_the_medians_interval_is_the_narrowest_with_its_coverage(n, coverage, j):
    """[x_(j), x_(n+1-j)] for the largest j whose coverage 1 - 2 P(Binomial(n, 1/2) < j) is at
    least 90 % (fewer than 5 values: the lowest to the highest, and their coverage), checked
    against the binomial sums and against a simulation of the coverage."""
    import random

    low, high, got = tiny_bar.median_interval([float(x) for x in range(n, 0, -1)])
    assert (low, high) == (j, n + 1 - j) and got == pytest.approx(coverage, abs=1e-4)
    rng, hits, draws = random.Random(15), 0, 4000  # the law's median: 0
    for _ in range(draws):
        lo, hi, _c = tiny_bar.median_interval([rng.gauss(0, 1) for _ in range(n)])
        hits += lo <= 0 <= hi
    assert abs(hits / draws - coverage) < 0.02


def test_an_interval_across_the_floor_is_open(tmp_path, capsys):
    """Five passes of C = 1 whose ratios over DDTREE(63) straddle 0.95 (0.90, 0.93, 0.97, 1.00,
    1.05): the median 0.97 meets the floor, but its interval (0.90-1.05, 93.75 %) cannot tell."""
    d = tmp_path / "sweeps"
    d.mkdir()
    fixed = [800, 1000, 1000, 900, 1000]
    adaptive = [900, 930, 970, 1000, 1050]
    _write(d, "ar+graphs", [(1, 100)] * 5)
    _write(d, "dflash+graphs", [(1, 700)] * 5)
    _write(d, "ddtree63+graphs", [(1, t) for t in fixed])
    _write(d, ADAPTIVE, [(1, a * f / 1000) for a, f in zip(adaptive, fixed, strict=True)])
    out = tmp_path / "bar.json"
    assert tiny_bar.main([str(d), "--json", str(out)]) == 0
    row = json.loads(out.read_text())[0]
    best = row["adaptive_over"]["best_fixed"]
    assert best["median"] == pytest.approx(0.97) and best["resolved"] == "open"
    assert best["interval"] == pytest.approx([0.9, 1.05]) and best["coverage"] == 0.9375
    assert row["adaptive_over"]["dflash"]["resolved"] == "held" and row["resolved"] == "open"
    assert "the medians' intervals (>= 93.8 % each): open at C = 1" in capsys.readouterr().out
    _write(d, "dflash+graphs", [(1, 2000)] * 5)  # now under DFLASH in every pass: a miss wins
    assert tiny_bar.main([str(d), "--json", str(out)]) == 1
    row = json.loads(out.read_text())[0]
    assert (row["adaptive_over"]["best_fixed"]["resolved"], row["resolved"]) == ("open", "missed")


def test_sweeps_kept_xz_compressed_read_as_the_plain_ones(tmp_path):
    """The repository keeps sweeps as .jsonl.xz: the verdict over them is the plain files'."""
    import lzma

    d = _run(tmp_path, [(1, 1200), (2, 2208), (1, 800), (2, 1472)])
    packed = tmp_path / "packed"
    packed.mkdir()
    for f in d.glob("*.jsonl"):
        (packed / f"{f.name}.xz").write_bytes(lzma.compress(f.read_bytes()))
    plain, xz = tmp_path / "plain.json", tmp_path / "xz.json"
    assert tiny_bar.main([str(d), "--json", str(plain)]) == 0
    assert tiny_bar.main([str(packed), "--json", str(xz)]) == 0
    assert json.loads(xz.read_text()) == json.loads(plain.read_text())

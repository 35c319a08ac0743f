"""``sglang_spec.plugin.context_graphs``: the drafter context append by graph replay, on the CPU.

The prefix-valid writer is a recorder here; a captured graph is a stand-in whose replay runs what
the capture recorded (the static-buffer call), so the copies into the static buffers, the
padding rows' commit lengths and the choice between replay and eager are checked without CUDA.
The capture itself (order, commit lengths 0 while capturing) runs with torch.cuda's graph API
stubbed. The GPU check is the tiny pair's greedy = AR on real SGLang (e2e.tiny_pair).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_spec.plugin import context_graphs as cg


class Recorder:
    """The writer: records each call's tensors (cloned: the static buffers change later)."""

    def __init__(self):
        self.calls = []

    def __call__(self, *, target_hidden, cache_loc_2d, positions, commit_lens):
        self.calls.append(
            {
                "hidden": target_hidden.clone(),
                "cache_loc_2d": cache_loc_2d.clone(),
                "positions": positions.clone(),
                "commit_lens": commit_lens.clone(),
            }
        )


def _step(bs, width, feat=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(bs * width, feat, generator=g)
    cache_loc = torch.randint(0, 1000, (bs, width), generator=g)
    prefix = torch.randint(5, 50, (bs,), generator=g)
    commit = torch.randint(1, width + 1, (bs,), generator=g, dtype=torch.int32)
    return hidden, cache_loc, prefix, commit


def test_append_context_writes_rows_at_prefix_positions():
    rec = Recorder()
    hidden, loc, prefix, commit = _step(2, 4)
    cg.append_context(rec, hidden, loc, torch.tensor([10, 20]), commit.to(torch.int64))
    (call,) = rec.calls
    assert call["positions"].tolist() == [10, 11, 12, 13, 20, 21, 22, 23]
    assert (
        call["commit_lens"].dtype == torch.int32 and call["commit_lens"].tolist() == commit.tolist()
    )
    assert torch.equal(call["hidden"], hidden) and torch.equal(call["cache_loc_2d"], loc)


def _graphs(rec, widths=(4, 8), graph_bs=(1, 2, 4)):
    return cg.ContextAppendGraphs(
        rec,
        widths=list(widths),
        graph_bs=list(graph_bs),
        feature_size=3,
        dtype=torch.float32,
        device="cpu",
    )


class StandInGraph:
    """What a capture of ``_run_static(width, bs)`` would replay."""

    def __init__(self, graphs, width, bs):
        self.replay = lambda: graphs._run_static(width, bs)


def test_a_step_without_a_graph_runs_eagerly_on_its_own_tensors():
    rec = Recorder()
    graphs = _graphs(rec)
    hidden, loc, prefix, commit = _step(3, 4)
    assert graphs(hidden, loc, prefix, commit) is False  # nothing captured
    (call,) = rec.calls
    assert torch.equal(call["hidden"], hidden) and torch.equal(call["cache_loc_2d"], loc)
    assert graphs.hidden.abs().sum() == 0  # the static buffers are not touched


def test_a_replay_copies_the_step_in_and_pads_with_commit_length_zero():
    """bs 3 replays the bs-4 graph: rows 0-2 are the step's, row 3 commits nothing; the writer
    sees the static buffers at the padded size."""
    rec = Recorder()
    graphs = _graphs(rec)
    graphs.commit_lens.fill_(7)  # a previous step's lengths must not leak into padding rows
    for width in graphs.widths:
        for bs in graphs.graph_bs:
            graphs.graphs[(width, bs)] = StandInGraph(graphs, width, bs)
    hidden, loc, prefix, commit = _step(3, 4, seed=1)
    assert graphs(hidden, loc, prefix, commit) is True
    (call,) = rec.calls
    assert call["cache_loc_2d"].shape == (4, 4) and call["hidden"].shape == (16, 3)
    assert torch.equal(call["hidden"][:12], hidden)
    assert torch.equal(call["cache_loc_2d"][:3], loc)
    assert call["commit_lens"].tolist() == [*commit.tolist(), 0]
    assert call["positions"][:12].tolist() == cg.context_positions(prefix, 4).tolist()
    # a width that was not captured runs eagerly
    hidden, loc, prefix, commit = _step(2, 5)
    assert graphs(hidden, loc, prefix, commit) is False
    # past the largest captured batch size too
    hidden, loc, prefix, commit = _step(5, 4)
    assert graphs(hidden, loc, prefix, commit) is False and len(rec.calls) == 3


def test_capture_goes_widest_and_largest_first_and_never_commits(fake_capture):
    """Every warm-up and capture run sees commit lengths 0 (nothing reaches the pool at
    start-up), under the scope's stream and pool, one graph per (width, batch size)."""
    rec = Recorder()
    graphs = _graphs(rec, widths=(8, 4), graph_bs=(2, 1))
    graphs.commit_lens.fill_(3)
    fake_capture.on_capture = lambda: len(rec.calls)  # the runs before each capture
    graphs.capture(fake_capture.scope)
    assert list(graphs.graphs) == [(8, 2), (8, 1), (4, 2), (4, 1)]
    sizes = [tuple(c["cache_loc_2d"].shape) for c in rec.calls]
    assert sizes == [(2, 8)] * 3 + [(1, 8)] * 3 + [(2, 4)] * 3 + [(1, 4)] * 3  # 2 warm-ups each
    assert all(c["commit_lens"].abs().sum() == 0 for c in rec.calls)
    assert fake_capture.captures == [2, 5, 8, 11]  # under the scope's pool and stream (FakeCapture)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="widths and batch sizes >= 1"):
        cg.ContextAppendGraphs(
            Recorder(), widths=[], graph_bs=[1], feature_size=3, dtype=torch.float32, device="cpu"
        )


def test_the_stage_hands_the_verify_windows_rows_to_the_append():
    """append_context_stage: the first bs * width target features and KV slots of the verify,
    the pre-verify prefix lengths and the accepted lengths, to whatever the worker built."""
    from sglang_spec.plugin.config import DDTreeConfig
    from sglang_spec.plugin.worker import Committed, DDTreeWorker, Verified, Walked

    worker = object.__new__(DDTreeWorker)
    worker.config = DDTreeConfig(
        block_size=4, verify_width=5, topk_per_depth=4, tree_temperature=1.0
    )
    seen = []
    worker.context_append = lambda *args: seen.append(args)
    hidden = torch.randn(12, 3)  # 2 requests x width 5, plus padding rows of the verify graph
    batch = SimpleNamespace(out_cache_loc=torch.arange(100, 112))
    verified = Verified(SimpleNamespace(hidden_states=hidden), "fb", True, None)
    walked = Walked(torch.zeros(10), torch.tensor([3, 1], dtype=torch.int32), None)
    committed = Committed(None, None, None, torch.tensor([40, 7]))
    worker.append_context_stage(batch, verified, walked, committed)
    ((h, loc, prefix, commit),) = seen
    assert (
        torch.equal(h, hidden[:10]) and loc.tolist() == torch.arange(100, 110).view(2, 5).tolist()
    )
    assert prefix.tolist() == [40, 7] and commit.tolist() == [3, 1]
    verified = Verified(SimpleNamespace(hidden_states=None), "fb", True, None)
    with pytest.raises(RuntimeError, match="target hidden states"):
        worker.append_context_stage(batch, verified, walked, committed)


def test_capture_runs_dflashs_per_layer_writer_and_restores_its_choice():
    """adapter.per_layer_kv_append: the fused helper off while capturing (its workspace is
    replaced when a prefill brings more rows, which a captured graph would keep writing), and
    DFLASH's own choice back afterwards, even when the capture fails."""
    from sglang_spec.plugin import adapter

    worker = SimpleNamespace(_use_fused_kv_materialize=True)
    with adapter.per_layer_kv_append(worker):
        assert worker._use_fused_kv_materialize is False
    assert worker._use_fused_kv_materialize is True
    with pytest.raises(RuntimeError), adapter.per_layer_kv_append(worker):
        raise RuntimeError("capture failed")
    assert worker._use_fused_kv_materialize is True

"""``sglang_spec.plugin.commit_graphs``: the commit stage by graph replay, on the CPU.

The commit is a stand-in with SGLang's data flow (new lengths, bonus, a state write per request
slot, a track write, the KV move of the accepted path to the window front, the compacted
``predict``) over fake pools; a captured graph is a stand-in whose replay runs what the capture
recorded (the static-buffer call). So the copies into the static buffers, the choice between
replay and eager, the clones of the outputs and the inputs every capture runs on are checked
without CUDA. The GPU check is the tiny pair's greedy = AR on real SGLang (e2e.tiny_pair).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_spec.plugin import commit_graphs as cm


class Pools:
    """What a commit writes: a state per request slot, a track slot's count, the KV slots."""

    def __init__(self):
        self.state = torch.zeros(64)
        self.track = torch.zeros(64)
        self.kv = torch.arange(1000, dtype=torch.float32) * 10


def fake_commit(pools, calls=None):
    def commit(batch, predict, accept_index, accept_lens, width):
        if calls is not None:
            calls.append(
                {
                    "accept_index": accept_index.clone(),
                    "accept_lens": accept_lens.clone(),
                    "seq_lens": batch.seq_lens.clone(),
                    "req_pool_indices": batch.req_pool_indices.clone(),
                    "out_cache_loc": batch.out_cache_loc.clone(),
                    "track": None
                    if batch.mamba_track_indices is None
                    else batch.mamba_track_indices.clone(),
                }
            )
        bs, a = accept_index.shape
        rows = torch.arange(bs)
        idx = accept_index.long()
        last = idx[rows, accept_lens.long() - 1]
        bonus = predict[last].to(torch.int32)
        new_seq_lens = batch.seq_lens + accept_lens
        pools.state[batch.req_pool_indices] = (last - rows * width).float() + batch.seq_lens
        if batch.mamba_track_indices is not None:
            hit = batch.mamba_track_indices >= 0
            pools.track[batch.mamba_track_indices[hit]] += 1
        valid = torch.arange(a)[None, :] < accept_lens[:, None].long()
        dst = (rows[:, None] * width + torch.arange(a)[None, :])[valid]
        src = idx[valid]
        loc = batch.out_cache_loc
        pools.kv[loc[dst]] = pools.kv[loc[src]].clone()
        compacted = predict.clone()
        compacted.view(bs, width)[:, :a] = predict[idx.clamp(min=0)].view(bs, a)
        return new_seq_lens, bonus, compacted

    return commit


def _graphs(pools, shapes=((8, 4, False), (16, 4, False)), max_bs=4, calls=None):
    return cm.CommitGraphs(
        fake_commit(pools, calls),
        SimpleNamespace,
        shapes=[cm.CommitShape(*s) for s in shapes],
        max_bs=max_bs,
        device="cpu",
    )


class StandInGraph:
    """What a capture of ``_run_static(shape, bs)`` would replay: the commit on the static
    inputs, its outputs written into the tensors the capture allocated (as a graph's are)."""

    def __init__(self, graphs, shape, bs):
        graphs._run_static(shape, bs)
        captured = graphs.outputs[(shape, bs)]

        def replay():
            graphs._run_static(shape, bs)
            for out, new in zip(captured, graphs.outputs[(shape, bs)]):
                out.copy_(new)
            graphs.outputs[(shape, bs)] = captured

        self.replay = replay


def _stand_ins(graphs):
    for shape in graphs.shapes:
        for bs in graphs.graph_bs:
            graphs.graphs[(shape, bs)] = StandInGraph(graphs, shape, bs)


def _step(bs, width, a=4, track=False, seed=0):
    """A step: accepted paths down random nodes of each request's window, distinct request
    slots and KV slots."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, a + 1, (bs,), generator=g, dtype=torch.int32)
    index = torch.full((bs, a), -1, dtype=torch.int32)
    for b in range(bs):
        nodes = torch.randperm(width - 1, generator=g)[: int(lens[b]) - 1] + 1
        index[b, : int(lens[b])] = torch.cat([torch.zeros(1, dtype=torch.long), nodes]) + b * width
    batch = SimpleNamespace(
        seq_lens=torch.randint(5, 50, (bs,), generator=g),
        req_pool_indices=torch.randperm(30, generator=g)[:bs] + 1,
        out_cache_loc=torch.randperm(900, generator=g)[: bs * width + 3] + 1,  # + padding
        mamba_track_indices=(torch.randperm(30, generator=g)[:bs] + 1) if track else None,
    )
    predict = torch.randint(0, 500, (bs * width,), generator=g, dtype=torch.int32)
    return batch, predict, index, lens


def _assert_same(out_a, pools_a, out_b, pools_b):
    for x, y in zip(out_a, out_b):
        assert x.dtype == y.dtype and torch.equal(x, y)
    for f in ("state", "track", "kv"):
        assert torch.equal(getattr(pools_a, f), getattr(pools_b, f)), f


def test_a_step_without_a_graph_commits_eagerly_on_the_batch_itself():
    pools = Pools()
    graphs = _graphs(pools)
    batch, predict, index, lens = _step(3, 8)
    (new_seq_lens, bonus, compacted), replayed = graphs(batch, predict, index, lens, 8)
    assert replayed is False
    want_pools = Pools()
    want = fake_commit(want_pools)(batch, predict, index, lens, 8)
    _assert_same((new_seq_lens, bonus, compacted), pools, want, want_pools)
    assert graphs.req_pool_indices.abs().sum() == 0  # the static buffers are not touched


@pytest.mark.parametrize("track", [False, True])
def test_a_replay_commits_what_the_eager_commit_does(track):
    """Every batch size up to the largest, both widths: the replay's outputs and pool writes
    equal the eager commit's on the same step (each static input copied in, none stale)."""
    shapes = ((8, 4, track), (16, 4, track))
    pools, want_pools = Pools(), Pools()
    graphs = _graphs(pools, shapes=shapes)
    _stand_ins(graphs)
    pools.__init__()  # the stand-in captures wrote on the harmless inputs
    seed = 0
    for width in (16, 8):
        for bs in (4, 1, 3, 2):
            seed += 1
            batch, predict, index, lens = _step(bs, width, track=track, seed=seed)
            out, replayed = graphs(batch, predict, index, lens, width)
            assert replayed is True
            want = fake_commit(want_pools)(batch, predict, index, lens, width)
            _assert_same(out, pools, want, want_pools)


def test_a_replays_outputs_survive_the_next_replay_of_its_graph():
    """Overlap scheduling reads a step's outputs after the next step launched: each replay
    hands out copies, not the graph's own output tensors."""
    pools = Pools()
    graphs = _graphs(pools)
    _stand_ins(graphs)
    first, _ = graphs(*_step(2, 8, seed=1), 8)
    kept = [t.clone() for t in first]
    second, _ = graphs(*_step(2, 8, seed=2), 8)
    assert all(torch.equal(a, b) for a, b in zip(first, kept))
    assert not all(torch.equal(a, b) for a, b in zip(first, second))


def test_what_no_graph_covers_commits_eagerly():
    pools = Pools()
    calls = []
    graphs = _graphs(pools, calls=calls)
    _stand_ins(graphs)
    calls.clear()
    cases = [
        (_step(5, 8), 8),  # past the largest batch size
        (_step(2, 12), 12),  # a width not captured
        (_step(2, 8, a=5), 8),  # an accept width not captured
        (_step(2, 8, track=True), 8),  # track indices the capture did not have
    ]
    for (batch, predict, index, lens), width in cases:
        _, replayed = graphs(batch, predict, index, lens, width)
        assert replayed is False
        assert torch.equal(calls[-1]["req_pool_indices"], batch.req_pool_indices)
    # a verify window shorter than bs * width (no slots to copy) also runs eagerly
    batch, predict, index, lens = _step(2, 8)
    batch.out_cache_loc = batch.out_cache_loc[:15]
    assert graphs(batch, predict, index, lens, 8)[1] is False


def test_an_eager_commit_after_capture_is_logged_once_per_shape_and_batch_size(caplog):
    """A server whose steps miss the graphs (a shape or track flag the capture did not have)
    says so in its log, once per (shape, batch size); before any capture, nothing is logged."""
    pools = Pools()
    graphs = _graphs(pools)
    with caplog.at_level("WARNING", logger="sglang_spec.plugin"):
        graphs(*_step(2, 8, track=True), 8)
        assert caplog.records == []  # nothing captured yet: eager by design
        _stand_ins(graphs)
        for seed in (1, 2):
            graphs(*_step(2, 8, track=True, seed=seed), 8)
        graphs(*_step(3, 8, track=True), 8)
        graphs(*_step(2, 8), 8)  # covered: replayed, not logged
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "CommitShape(width=8, accept_width=4, track=True) at batch size 2" in lines[0]
    assert "at batch size 3" in lines[1]


def test_capture_runs_on_harmless_inputs_set_outside_the_graph(fake_capture):
    """Every warm-up and capture commits only the root of request row 0 at KV slot 0 with no
    track slot, and the inputs are set before the warm-ups, never inside a capture (a graph
    that recorded them would reset every step's inputs on replay); widest first, one graph per
    exact batch size."""
    pools = Pools()
    calls = []
    graphs = _graphs(pools, shapes=((8, 4, True), (16, 5, True)), max_bs=2, calls=calls)
    graphs.accept_lens.fill_(7)  # a previous step's inputs must not leak into the capture
    graphs.req_pool_indices.fill_(9)
    fill = graphs._fill_harmless

    def watched_fill(shape, bs):
        assert not fake_capture.capturing, "static inputs set inside a capture"
        fill(shape, bs)

    graphs._fill_harmless = watched_fill
    graphs.capture(fake_capture.scope)
    s16, s8 = cm.CommitShape(16, 5, True), cm.CommitShape(8, 4, True)
    assert list(graphs.graphs) == [(s16, 2), (s16, 1), (s8, 2), (s8, 1)]
    assert [c["accept_index"].shape for c in calls] == [(2, 5)] * 3 + [(1, 5)] * 3 + [
        (2, 4)
    ] * 3 + [(1, 4)] * 3
    for c in calls:
        bs, a = c["accept_index"].shape
        width = 16 if a == 5 else 8
        assert c["accept_lens"].tolist() == [1] * bs
        assert c["accept_index"][:, 0].tolist() == [b * width for b in range(bs)]
        assert (c["accept_index"][:, 1:] == -1).all()
        assert c["req_pool_indices"].tolist() == [0] * bs
        assert (c["out_cache_loc"] == 0).all() and c["track"].tolist() == [-1] * bs
        assert c["seq_lens"].tolist() == [1] * bs
    assert pools.track.abs().sum() == 0  # no track slot written


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="shapes and a batch size >= 1"):
        _graphs(Pools(), shapes=())
    with pytest.raises(ValueError, match="shapes and a batch size >= 1"):
        _graphs(Pools(), max_bs=0)


def _stage_worker(commit_graphs=None):
    from sglang_spec.plugin.config import DDTreeConfig
    from sglang_spec.plugin.worker import DDTreeWorker

    worker = object.__new__(DDTreeWorker)
    worker.config = DDTreeConfig(
        block_size=4, verify_width=4, topk_per_depth=4, tree_temperature=1.0
    )
    worker.commit_graphs = commit_graphs
    worker.eager_commits = []

    def commit(*args):
        worker.eager_commits.append(args)
        return (torch.tensor([9, 9]), torch.tensor([1, 2]), torch.arange(8))

    worker.commit = commit
    return worker


def _recording_graphs(calls):
    def graphs(*args):
        calls.append(args)
        return (torch.tensor([9, 9]), torch.tensor([1, 2]), torch.arange(8)), True

    return graphs


def test_the_stage_commits_compacts_the_hidden_rows_and_publishes():
    """commit_stage: the eager commit without graphs, the graphs' call with them; the target
    hidden rows compacted along accept_index for the drafter's context; the new lengths
    published; the pre-verify lengths kept as the prefix."""
    from sglang_spec.plugin.worker import Verified, Walked

    accept_index = torch.tensor([[0, 2, -1], [4, 5, 7]], dtype=torch.int32)
    walked = Walked(
        torch.arange(8, dtype=torch.int32), torch.tensor([2, 3], dtype=torch.int32), accept_index
    )
    hidden = torch.arange(8.0)[:, None].repeat(1, 3)
    batch = SimpleNamespace(seq_lens=torch.tensor([40, 7]), return_logprob=False)
    for graphs_on in (False, True):
        seen = []
        graph_calls = []
        graphs = _recording_graphs(graph_calls)
        worker = _stage_worker(graphs if graphs_on else None)
        verified = Verified(SimpleNamespace(hidden_states=hidden.clone()), "fb", True, None)
        committed = worker.commit_stage(batch, verified, walked, seen.append)
        assert len(worker.eager_commits) == (0 if graphs_on else 1)
        assert len(graph_calls) == (1 if graphs_on else 0)
        (args,) = graph_calls or worker.eager_commits
        assert args[0] is batch and args[2] is accept_index and args[4] == 4
        rows = verified.logits_output.hidden_states[:, 0].tolist()
        assert rows == [0, 2, 0, 3, 4, 5, 7, 7]  # -1 clamps to node 0, past the length
        assert [t.tolist() for t in seen] == [[9, 9]]
        assert committed.prefix_lens is batch.seq_lens and committed.bonus.tolist() == [1, 2]


# ------------------------------------------- SGLang's own commit functions (patched copy, CPU)


@pytest.fixture(scope="module")
def sglang_commit(tmp_path_factory):
    from patched_sglang import patched_copy, run_cases

    root = patched_copy(tmp_path_factory.mktemp("patched_sglang_commit"))
    return run_cases(root, "commit_path_cases.py", timeout=600)


def test_the_commit_is_eagle_tree_verifys_commit(sglang_commit):
    """adapter.commit_accepted_path + compact_accepted_rows on SGLang's own functions (patch
    0003's GDN tree fold and conv commit, the KV move, the compaction) equal what the worker ran
    before commit graphs (prepare_verify_commit_outputs, commit_mamba_states_after_verify,
    _finalize_accept_tree_path): outputs, checkpoints, conv states and KV rows."""
    old, eager, before = sglang_commit["old"], sglang_commit["eager"], sglang_commit["before"]
    for key in old:
        assert torch.equal(old[key], eager[key]), key
    # the step committed something: states of the three requests' slots, the tracked one too
    changed = (old["temporal"] != before["temporal"]).flatten(2).any(-1).any(0)
    assert set(torch.nonzero(changed).flatten().tolist()) == {7, 5, 2, 10}  # rows 1, 4, 6; track
    assert not torch.equal(old["kv"], before["kv"])
    assert old["new_seq_lens"].tolist() == [
        sglang_commit["interval"] - 2 + 6,
        17 + 2,
        40 + 4,
    ]


def test_a_commit_graph_runs_sglangs_commit_on_its_static_batch(sglang_commit):
    """The graph path (CommitGraphs over adapter.commit_batch_maker) gives the eager commit's outputs
    and pool writes on SGLang's own functions: the static batch has every field they read."""
    eager, graph = sglang_commit["eager"], sglang_commit["graph"]
    for key in eager:
        assert torch.equal(eager[key], graph[key]), key


def test_the_static_batch_is_a_decode_batch_on_the_resolved_page(sglang_commit):
    """adapter.commit_batch_maker's batch over the static buffers: a decode batch whose tree page is
    the resolved page size (1) although the server was started without --page-size (the raw
    record's None made the H100 capture fail in math.lcm, session 36), its tensors views."""
    static = sglang_commit["static"]
    assert static["raw_page_size"] is None and static["page_size"] == 1
    assert static["decode"] and static["views"]


def test_commit_graph_captures_touch_only_the_dummy_slots(sglang_commit):
    """The warm-up inputs of every capture (max_bs 4 down to 1) commit into request row 0's
    state slot (slot 0 at start-up) and move KV slot 0 onto itself: nothing else changes."""
    assert sglang_commit["tracking"] is True  # extra_buffer: the graphs' shapes carry track
    capture = sglang_commit["capture"]
    assert [c["bs"] for c in capture] == [4, 3, 2, 1]
    for c in capture:
        assert set(c["slots"]) <= {0} and c["kv_rows"] == [], c

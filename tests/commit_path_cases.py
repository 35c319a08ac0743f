"""The DDTREE commit (``adapter.commit_accepted_path``) on SGLang's own functions, in a patched copy
of SGLang 0.5.23 under ``TRITON_INTERPRET=1``.

Used by tests/test_commit_graphs.py, which builds the copy (``patched_sglang.patched_copy``) and
runs this file as a script in a child process with the copy first on ``sys.path``:

    python tests/commit_path_cases.py OUT.pt

The tiny DDTREE server's configuration is published first (``publish_tiny_ddtree``: extra_buffer,
so verify batches carry mamba track indices). One decode step of three requests is committed on a
GDN tree ``MambaPool`` (patch 0003's fold and conv commit) with random rings, checkpoints and conv
inputs, and a KV pool stand-in whose ``move_kv_cache`` copies rows of one tensor:

* ``old``: the commit as the worker made it before commit graphs: ``prepare_verify_commit_outputs``,
  ``commit_mamba_states_after_verify``, then ``_finalize_accept_tree_path`` (the KV move and the
  compaction of ``predict`` and the hidden rows);
* ``eager``: ``adapter.commit_accepted_path`` then ``adapter.compact_accepted_rows``;
* ``graph``: the same step through ``CommitGraphs`` over ``adapter.commit_batch_maker``'s static
  batch,
  its graphs stand-ins that run the captured call (so every batch field SGLang reads must be on
  the static batch, and the copies into it complete);
* ``tracking``: ``adapter.mamba_tracking()`` under that configuration;
* ``static``: that static batch at batch size 3: its tree page (the resolved ``--page-size``; the
  raw record's is None, and SGLang's track grid is ``math.lcm`` of it), mode and buffer views;
* ``capture``: what the graphs' warm-up inputs change in the pools (``_fill_harmless`` for every
  shape and batch size): only request row 0's state slot and KV slot 0 may move.

It saves each path's outputs (new lengths, bonus, ``predict``, hidden rows) and pools (``temporal``,
``conv``, KV rows); the test compares them.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import torch

N, A, HK, HV, K, V, LAYERS, BS = 9, 6, 2, 6, 16, 48, 2, 3
SLOTS, REQS, KV_ROWS, D = 12, 8, 64, 5


def gdn_pool():
    from gdn_tree_commit_cases import gdn_params
    from sglang.srt.mem_cache.memory_pool import MambaPool

    return MambaPool(
        size=SLOTS,
        spec_state_size=BS + 1,
        cache_params=gdn_params(layers=LAYERS, hk=HK, hv=HV, k=K, v=V),
        mamba_layer_ids=list(range(LAYERS)),
        device="cpu",
        speculative_num_draft_tokens=N,
        speculative_eagle_topk=4,
        enable_linear_replayssm_spec=True,
    )


class Pools:
    """A GDN tree MambaPool with random contents, the request -> slot mapping, and KV rows."""

    FIELDS = ("temporal", "conv", "replayssm_rawk", "replayssm_rawv", "replayssm_g")

    def __init__(self, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.pool = gdn_pool()
        c = self.pool.mamba_cache
        for t in (c.replayssm_rawk, c.replayssm_rawv, c.replayssm_conv_inputs):
            t.copy_(torch.randn(t.shape, generator=gen).to(t.dtype))
        c.replayssm_g.copy_(-torch.rand(c.replayssm_g.shape, generator=gen) * 0.5)
        c.replayssm_beta.copy_(torch.rand(c.replayssm_beta.shape, generator=gen))
        c.temporal.copy_(torch.randn(c.temporal.shape, generator=gen) * 0.3)
        c.conv[0].copy_(torch.randn(c.conv[0].shape, generator=gen))
        # request row r -> mamba slot; row 0 -> slot 0 (SGLang's dummy) as at start-up
        self.mapping = torch.tensor([0, 7, 3, 9, 5, 11, 2, 4])
        self.kv = torch.randn(KV_ROWS, 4, generator=gen)
        self.req_pool = SimpleNamespace(
            mamba_pool=self.pool,
            get_speculative_mamba2_params_all_layers=lambda: self.pool.mamba_cache,
            get_mamba_indices=lambda rows: self.mapping[rows],
        )
        self.target_worker = SimpleNamespace(
            model_runner=SimpleNamespace(model_config=None, req_to_token_pool=self.req_pool)
        )
        kv = self
        self.allocator = SimpleNamespace(
            get_kvcache=lambda: SimpleNamespace(move_kv_cache=kv.move_kv_cache)
        )

    def move_kv_cache(self, tgt, src):
        self.kv[tgt] = self.kv[src].clone()

    def snapshot(self) -> dict[str, torch.Tensor]:
        c = self.pool.mamba_cache
        return {"temporal": c.temporal.clone(), "conv": c.conv[0].clone(), "kv": self.kv.clone()}


def step(track_interval: int):
    """One decode step: 3 requests (rows 1, 4, 6) down random paths of their trees, one crossing a
    track interval."""
    gen = torch.Generator().manual_seed(7)
    lens = torch.tensor([A, 2, 4], dtype=torch.int32)
    accept_index = torch.full((BS, A), -1, dtype=torch.int32)
    for b in range(BS):
        nodes = [0]
        while len(nodes) < int(lens[b]):  # a path: each node deeper than the last
            nodes.append(
                int(torch.randint(nodes[-1] + 1, N - (A - len(nodes)), (1,), generator=gen))
            )
        accept_index[b, : len(nodes)] = torch.tensor(nodes, dtype=torch.int32) + b * N
    seq_lens = torch.tensor([track_interval - 2, 17, 40], dtype=torch.int64)  # row 0 crosses
    batch = SimpleNamespace(
        forward_mode=None,
        tree_cache=SimpleNamespace(page_size=1),
        seq_lens=seq_lens,
        req_pool_indices=torch.tensor([1, 4, 6], dtype=torch.int64),
        out_cache_loc=torch.randperm(KV_ROWS - 1, generator=gen)[: BS * N] + 1,
        mamba_track_indices=torch.tensor([10, 8, 6], dtype=torch.int64),
    )
    predict = torch.randint(0, 1000, (BS * N,), generator=gen, dtype=torch.int32)
    hidden = torch.randn(BS * N, D, generator=gen)
    return batch, predict, accept_index, lens, hidden


def outputs(new_seq_lens, bonus, predict, hidden, pools) -> dict:
    return {
        "new_seq_lens": new_seq_lens.clone(),
        "bonus": bonus.clone(),
        "predict": predict.clone(),
        "hidden": hidden.clone(),
        **pools.snapshot(),
    }


def main(out_path: str) -> None:
    from patched_sglang import publish_tiny_ddtree

    sa = publish_tiny_ddtree()
    import sglang.srt.speculative.spec_utils as spec_utils
    from sglang.kernels.ops.speculative.eagle import prepare_verify_commit_outputs
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.runtime_context import mamba_track_grid
    from sglang.srt.speculative.eagle_worker_common import _finalize_accept_tree_path

    from sglang_spec.plugin import adapter
    from sglang_spec.plugin.commit_graphs import CommitGraphs, CommitShape

    spec_utils.mambaish_config = lambda _config: True  # the pool above is a GDN model's
    interval = mamba_track_grid(1)
    batch, predict, accept_index, lens, hidden = step(interval)
    batch.forward_mode = ForwardMode.DECODE
    saved = {"interval": interval, "tracking": adapter.mamba_tracking(), "before": None}

    pools = Pools(seed=1)
    saved["before"] = pools.snapshot()
    new_seq_lens, bonus = prepare_verify_commit_outputs(predict, accept_index, lens, batch.seq_lens)
    spec_utils.commit_mamba_states_after_verify(pools.target_worker, batch, lens, accept_index, N)
    logits_output = SimpleNamespace(hidden_states=hidden.clone())
    compacted = _finalize_accept_tree_path(
        batch,
        accept_index,
        lens,
        predict,
        logits_output,
        BS,
        token_to_kv_pool_allocator=pools.allocator,
        num_draft_tokens=N,
    )
    saved["old"] = outputs(new_seq_lens, bonus, compacted, logits_output.hidden_states, pools)

    pools = Pools(seed=1)
    new = adapter.commit_accepted_path(
        pools.target_worker, pools.allocator, batch, predict, accept_index, lens, N
    )
    rows = adapter.compact_accepted_rows(hidden, accept_index, N)
    saved["eager"] = outputs(*new, rows, pools)

    pools = Pools(seed=1)

    def commit(b, p, ai, al, width):
        return adapter.commit_accepted_path(
            pools.target_worker, pools.allocator, b, p, ai, al, width
        )

    shape = CommitShape(N, A, True)
    graphs = CommitGraphs(
        commit,
        adapter.commit_batch_maker(sa),
        shapes=[shape],
        max_bs=4,
        device="cpu",
    )
    static = graphs._static(shape, 3)[0]
    saved["static"] = {
        "raw_page_size": sa.page_size,
        "page_size": static.tree_cache.page_size,
        "decode": static.forward_mode == ForwardMode.DECODE,
        "views": static.seq_lens.data_ptr() == graphs.seq_lens.data_ptr()
        and tuple(static.mamba_track_indices.shape) == (3,)
        and tuple(static.out_cache_loc.shape) == (3 * N,),
    }
    touched = []
    for bs in reversed(graphs.graph_bs):  # the warm-up inputs of every capture, as capture runs
        before = pools.snapshot()
        graphs._fill_harmless(shape, bs)
        graphs._run_static(shape, bs)
        after = pools.snapshot()
        touched.append(
            {
                "bs": bs,
                "slots": sorted(
                    {
                        int(s)
                        for s in torch.nonzero(
                            (after["temporal"] != before["temporal"]).flatten(2).any(-1).any(0)
                            | (after["conv"] != before["conv"]).flatten(2).any(-1).any(0)
                        ).flatten()
                    }
                ),
                "kv_rows": torch.nonzero((after["kv"] != before["kv"]).any(-1)).flatten().tolist(),
            }
        )
    saved["capture"] = touched
    pools = Pools(seed=1)

    class StandIn:
        def replay(self):
            graphs._run_static(shape, BS)

    graphs.graphs[(shape, BS)] = StandIn()
    (new_seq_lens, bonus, compacted), replayed = graphs(batch, predict, accept_index, lens, N)
    assert replayed
    rows = adapter.compact_accepted_rows(hidden, accept_index, N)
    saved["graph"] = outputs(new_seq_lens, bonus, compacted, rows, pools)
    torch.save(saved, out_path)


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run under TRITON_INTERPRET=1"
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main(sys.argv[1])

"""`sglang_spec.plugin.adapter`: every SGLang internal the plug-in relies on, checked on CPU
against the installed SGLang, and the rule that the rest of the plug-in reaches private SGLang
names only through the adapter."""

from __future__ import annotations

import ast
import contextlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from sglang_spec.plugin import adapter
from sglang_spec.plugin.adapter import Exists, Kw, Member, Sig
from sglang_spec.tree import VocabShard

PLUGIN_DIR = Path(adapter.__file__).parent


def test_installed_sglang_meets_every_expectation():
    version = adapter.installed_sglang_version()
    assert version in adapter.EXPECTED, adapter.missing_internals()
    problems = adapter.missing_internals()
    assert not problems, "\n".join(problems)


def test_drift_is_reported_with_the_internal_and_the_version(monkeypatch):
    w = "sglang.srt.speculative.dflash_worker_v2:DFlashWorkerV2"
    fake = {
        f"{w}._ensure_draft_block_buffers": Sig(("self", "bs")),  # holds
        f"{w}._ensure_draft_block_buffers_renamed": Sig(("self", "bs")),
        f"{w}._make_next_draft_input_decode": Sig(("self", "bonus_tokens")),
        f"{w}._draft_block_ids_buf": Member(),  # holds (assigned in __init__)
        f"{w}._draft_block_ids_buffer": Member(),
        "sglang.srt.speculative.eagle_info:EagleVerifyInput": Kw(("draft_token", "tree_width")),
        "sglang.srt.speculative.no_such_module:thing": Exists(),
    }
    monkeypatch.setitem(adapter.EXPECTED, "9.9.9", fake)
    problems = adapter.missing_internals("9.9.9")
    installed = adapter.installed_sglang_version()
    assert all(p.startswith(f"SGLang {installed}: ") for p in problems)
    named = "\n".join(problems)
    for missing in (
        "_ensure_draft_block_buffers_renamed is missing",
        "_make_next_draft_input_decode has parameters ('self', 'bonus_tokens', 'new_seq_lens')",
        "_draft_block_ids_buffer is missing",
        "EagleVerifyInput no longer accepts ['tree_width']",
        "no_such_module:thing is missing",
    ):
        assert missing in named
    assert len(problems) == 5
    [unpinned] = adapter.missing_internals("0.0.1")
    assert "SGLang 0.0.1 is not a pinned version" in unpinned and "0.5.23" in unpinned


def _plugin_sources():
    return {p.name: ast.parse(p.read_text()) for p in sorted(PLUGIN_DIR.glob("*.py"))}


def _sglang_imports(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sglang":
            for alias in node.names:
                yield f"{node.module}:{alias.name}"


def test_every_sglang_name_the_plugin_imports_is_listed():
    expected = adapter.EXPECTED[adapter.installed_sglang_version()]
    for name, tree in _plugin_sources().items():
        for key in _sglang_imports(tree):
            assert key in expected, f"{name} imports {key}, which adapter.EXPECTED does not list"
            private = key.split(":")[1].startswith("_")
            assert name == "adapter.py" or not private, (
                f"{name} imports the private SGLang name {key}: reach it through the adapter"
            )


def test_private_dflash_worker_members_only_through_the_adapter():
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    private = {
        n
        for cls in DFlashWorkerV2.__mro__[:-1]
        for n in {*vars(cls), *adapter._assigned_on_self(cls)}
        if n.startswith("_") and not n.startswith("__")
    }
    assert "_draft_block_ids_buf" in private and "_mask_token_id" in private
    for name, tree in _plugin_sources().items():
        if name == "adapter.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in private:
                pytest.fail(f"{name}:{node.lineno} touches DFlashWorkerV2.{node.attr} directly")
            if isinstance(node, ast.FunctionDef) and node.name in private:
                assert node.name in adapter.OVERRIDES, f"{name} overrides {node.name} unlisted"


def test_hook_target_is_listed():
    module, _, qualname = adapter.GET_SPEC_INFO_TARGET.rpartition(".DecodeCudaGraphRunner.")
    key = f"{module}:DecodeCudaGraphRunner.{qualname}"
    assert key in adapter.EXPECTED[adapter.installed_sglang_version()]


# ------------------------------------------------------------------- helpers


def test_vocab_shard_of_a_sglang_head():
    indices = SimpleNamespace(
        org_vocab_start_index=100,
        num_org_elements=10,
        num_org_elements_padded=12,
        added_vocab_start_index=500,
        num_added_elements=3,
    )
    head = SimpleNamespace(weight=torch.zeros(15, 4), shard_indices=indices)
    assert adapter.vocab_shard(head) == VocabShard(100, 10, 12, 500, 3)
    assert adapter.vocab_shard(SimpleNamespace(weight=torch.zeros(7, 4))) == VocabShard(0, 7, 7)


def test_tp_all_gather():
    class Group:
        world_size = 2

        def all_gather_into_tensor(self, output, input):  # noqa: A002 - SGLang's parameter name
            output.copy_(torch.cat([input, input + 100]))

    sharded = SimpleNamespace(weight=torch.zeros(2, 2), shard_indices=object())
    t = torch.arange(6, dtype=torch.float64).view(2, 3)
    for capacity in (0, 6):  # fresh buffers every call / fixed ones a CUDA graph can capture
        gather = adapter.tp_all_gather(sharded, Group(), capacity=capacity)
        assert torch.equal(gather(t), torch.stack([t, t + 100]))
        assert (gather(t).data_ptr() == gather.out.data_ptr()) == (capacity > 0)
    assert adapter.tp_all_gather(SimpleNamespace(weight=torch.zeros(2, 2)), Group()) is None
    Group.world_size = 1
    assert adapter.tp_all_gather(sharded, Group()) is None


# DFlashWorkerV2's buffers sized from the block (dflash_worker_v2.py:571-584); listed here so that
# one dropped from the adapter's list fails.
BLOCK_SIZED_BUFFERS = (
    "_draft_block_ids_buf",
    "_draft_block_positions_buf",
    "_draft_block_tokens_buf",
    "_draft_verify_out_cache_loc_buf",
    "_draft_block_end_buf",
    "_draft_seq_lens_cpu_buf",
)


def test_resize_draft_block_undoes_the_width_leak():
    stale = torch.zeros(1)
    sized = []
    worker = SimpleNamespace(
        device="cpu",
        block_size=65,
        draft_model=SimpleNamespace(set_block_size=sized.append),
        **{name: stale for name in BLOCK_SIZED_BUFFERS},
    )
    adapter.resize_draft_block(worker, 16)
    assert worker.block_size == 16 and sized == [16]
    assert worker._block_pos_offsets.tolist() == list(range(16))
    assert worker._draft_block_spec_info.draft_token_num == 16
    for name in BLOCK_SIZED_BUFFERS:
        assert getattr(worker, name) is None, name


def test_unsupported_drafter_heads():
    plain = dict(selector=None, lilicorr=None, _is_domino=False, use_compact_draft_cache=False)
    assert adapter.unsupported_drafter_head(SimpleNamespace(**plain)) is None
    for field, value in (
        ("selector", object()),
        ("lilicorr", object()),
        ("_is_domino", True),
        ("use_compact_draft_cache", True),
    ):
        why = adapter.unsupported_drafter_head(SimpleNamespace(**{**plain, field: value}))
        assert why is not None and "not supported" in why, field


# ------------------------------------------------- the drafter's TP context on either pin


def test_draft_tp_context_enters_the_form_of_the_workers_release(monkeypatch):
    import sglang.srt.speculative.spec_utils as spec_utils

    entered = []

    class Entered:
        def __init__(self, arg):
            self.arg = arg

        def __enter__(self):
            entered.append(self.arg)

        def __exit__(self, *exc):
            return False

    layout = object()  # 0.5.23: DFlashWorkerV2.draft_parallel_layout, a DraftParallelLayout
    monkeypatch.setattr(spec_utils, "draft_tp_context", lambda layout: Entered(layout))
    with adapter.draft_tp_context(SimpleNamespace(draft_parallel_layout=layout)):
        pass

    def draft_tp_context_0_5_22(owns_attention: bool):  # spec_utils.py:766 in 0.5.22
        assert isinstance(owns_attention, bool), owns_attention
        return Entered(owns_attention)

    monkeypatch.setattr(spec_utils, "draft_tp_context", draft_tp_context_0_5_22)
    for owns in (True, False):
        with adapter.draft_tp_context(SimpleNamespace(draft_owns_attention=owns)):
            pass
    assert entered == [layout, True, False]


def test_draft_tp_context_with_the_installed_release():
    draft_parallel = pytest.importorskip(
        "sglang.srt.configs.draft_parallel",
        reason="a pin without DraftParallelLayout (0.5.22): tests/test_patching.py enters its form",
    )
    single = draft_parallel.DraftParallelLayout(tp_group=None, attn_tp_size=1)
    with adapter.draft_tp_context(SimpleNamespace(draft_parallel_layout=single)) as ctx:
        assert ctx is None  # no attention-TP split: the drafter keeps the target's placement


def test_each_pin_differs_from_0_5_23_exactly_where_the_survey_says():
    """The adapter's table and the pin survey's ADAPTED record (which decides the support
    matrix) name the same absorbed internals."""
    from sglang_spec.patching import survey

    base = adapter.EXPECTED["0.5.23"]
    assert set(survey.ADAPTED) <= set(adapter.EXPECTED)
    for version, table in adapter.EXPECTED.items():
        differs = {k for k in base.keys() | table.keys() if base.get(k) != table.get(k)}
        adapted = survey.ADAPTED.get(version, {})
        named = set(adapted) | {need.target for need in adapted.values()}
        assert differs == named, (version, sorted(differs ^ named))


def test_decode_graph_batch_sizes_are_the_resolved_capture_list(monkeypatch):
    """The graph runners capture ``cuda_graph_config.decode.bs``; the ``--cuda-graph-bs`` input
    leaf ``cuda_graph_bs_decode`` stays None unless the user gave it (the H200 run that first
    started the in-graph draft sampler crashed reading it: 'NoneType' object is not iterable).
    Graphs off -> None. And an override of the resolved config is accepted by SGLang's runtime
    context (the per-width verify states capture through it)."""
    import sglang.srt.model_executor.cuda_graph_config as cgc
    import sglang.srt.runtime_context as rc
    from sglang.srt.arg_groups.arg_utils import namespace_of
    from sglang.srt.model_executor.cuda_graph_config import Backend, CudaGraphConfig, PhaseConfig
    from sglang.srt.server_args import ServerArgs

    config = CudaGraphConfig(decode=PhaseConfig(backend=Backend.FULL, bs=[4, 1, 2]))
    graph = SimpleNamespace(cuda_graph_bs_decode=None, cuda_graph_config=config)
    for module in (rc, cgc):  # check_cuda_graph_backend reads its own imported get_exec
        monkeypatch.setattr(module, "get_exec", lambda: SimpleNamespace(graph=graph))
    assert adapter.decode_cuda_graph_bs() == [1, 2, 4]
    config.decode.backend = Backend.DISABLED
    assert adapter.decode_cuda_graph_bs() is None
    assert namespace_of(ServerArgs)["cuda_graph_config"].split(".")[0] == "exec"


def test_verify_states_capture_the_overridden_batch_sizes():
    """On a published DDTREE configuration (child process: publishing is process-wide): the plug-in
    reads the decode graph batch sizes SGLang resolved from ``--cuda-graph-max-bs-decode 4`` while
    the ``--cuda-graph-bs`` input leaf stays None, and a per-width verify state is built under the
    width and the batch sizes it asks for -- the leaf the graph runner reads -- restored after."""
    import json
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, str(repo / "tests/verify_capture_case.py")]
        + [str(repo / "sglang_spec/fixtures/tiny-pair")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=repo,
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT") :])
    assert out["input_leaf"] is None and out["graph_bs"] == [1, 2, 3, 4]
    assert out["inside"] == [[1, 2], 65]
    assert out["eager"] == [[1, 2, 3, 4], 33]
    assert out["after"] == [[1, 2, 3, 4], 16]


def test_refresh_verify_graph_buffers_calls_only_the_backends_that_keep_some():
    """The hybrid GDN backend forwards SGLang's update_verify_buffers_to_fill_after_draft to each
    child, and the base class raises NotImplementedError, which FlashInfer and FA3 keep: a hybrid
    target on either failed its first graph verify. The adapter calls the children one by one."""
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    calls = []

    class MaskAtReplay(AttentionBackend):  # FlashInfer / FA3: no method of their own
        pass

    class Linear(AttentionBackend):
        def update_verify_buffers_to_fill_after_draft(self, spec_info, cuda_graph_bs):
            calls.append((spec_info, cuda_graph_bs))

    masked, linear = object.__new__(MaskAtReplay), object.__new__(Linear)
    hybrid = object.__new__(HybridLinearAttnBackend)
    hybrid.attn_backend_list = [masked, linear]  # full attention first, as SGLang builds it
    with pytest.raises(NotImplementedError):
        hybrid.update_verify_buffers_to_fill_after_draft(spec_info="spec", cuda_graph_bs=4)
    calls.clear()
    adapter.refresh_verify_graph_buffers(hybrid, "spec", 4)
    assert calls == [("spec", 4)]
    adapter.refresh_verify_graph_buffers(masked, "spec", 8)  # a dense target on FA3
    adapter.refresh_verify_graph_buffers(linear, "spec", 8)
    assert calls == [("spec", 4), ("spec", 8)]
    # Triton's own (no-op) method is SGLang's, not the base class's: it is called
    triton = object.__new__(TritonAttnBackend)
    adapter.refresh_verify_graph_buffers(triton, "spec", 2)


def triton_np2(n: int) -> int:
    """``triton.next_power_of_2`` (SGLang's ``next_power_of_2``) for n >= 1."""
    return 1 << (n - 1).bit_length()


def _kv_pool(upper: int | None):
    """SGLang's own MHATokenToKVPool (its move_kv_cache and chunking), without buffers."""
    import sglang.srt.mem_cache.memory_pool as mp

    pool = object.__new__(mp.MHATokenToKVPool)
    pool.layer_num, pool.size, pool.page_size, pool.device = 16, 10_000, 1, "cpu"
    pool.use_hnd = pool.use_native_move_kv_cache = False
    pool.native_k_scale_buffer = pool.data_ptrs = pool.data_strides = None
    pool._kv_copy_config = (
        None
        if upper is None
        else {"bytes_per_tile": 128, "byte_tiles": 16, "num_warps": 4, "num_locs_upper": upper}
    )
    return pool


def test_kv_move_launches_are_capped_at_rows_that_do_not_spill(monkeypatch):
    """The tree compaction moves bs * (L + 1) slots: 512 at bs 32. SGLang's pool copies them in
    launches of up to 256 rows at the 27B shape's row size, a specialization that spills to a
    7440-byte stack (tests/test_triton_compile_sm90.py). After cap_kv_move_chunks (through a
    hybrid pool, as the 27B shape has) every launch is at most KV_MOVE_ROWS, and that
    specialization was launched at start-up on slot 0 with 1, 3 and KV_MOVE_ROWS slots."""
    import sglang.srt.mem_cache.memory_pool as mp

    launches = []

    def copy(_ptrs, _strides, tgt, src, num_locs, upper, _config):
        launches.append((num_locs, upper, int(tgt.max()), int(src.max())))

    monkeypatch.setattr(mp, "copy_all_layer_kv_cache_func", copy)
    pool = _kv_pool(256)
    slots = torch.arange(512)
    pool.move_kv_cache(slots, slots)
    assert [(n, u) for n, u, _, _ in launches] == [(256, 256)] * 2  # SGLang's chunks
    launches.clear()
    hybrid = object.__new__(mp.HybridLinearKVPool)
    hybrid.full_kv_pool = pool
    assert adapter.cap_kv_move_chunks(hybrid) is True
    rows = adapter.KV_MOVE_ROWS
    # the warm-up: slot 0 onto itself, once per variant a move of 1..rows slots compiles
    warm = [1, 2, 3, 5, 9, 16, 17, 32, 33, 48, 65, 80]
    assert adapter.kv_move_warm_counts(rows) == warm
    assert launches == [(n, triton_np2(n), 0, 0) for n in warm]
    variant = {(triton_np2(n), n == 1, n % 16 == 0) for n in range(1, rows + 1)}
    assert {(u, n == 1, n % 16 == 0) for n, u, _, _ in launches} == variant
    launches.clear()
    pool.move_kv_cache(slots, slots)
    assert [(n, u) for n, u, _, _ in launches] == [(rows, rows)] * (512 // rows)
    launches.clear()
    pool.move_kv_cache(slots[:200], slots[:200])
    assert [(n, u) for n, u, _, _ in launches] == [(128, 128), (72, 128)]
    # a pool whose cap is already lower keeps it; one without the tiled copy is left alone
    low = _kv_pool(64)
    assert adapter.cap_kv_move_chunks(low) and low._kv_copy_config["num_locs_upper"] == 64
    assert adapter.cap_kv_move_chunks(_kv_pool(None)) is False


def test_accept_compaction_warm_up_covers_every_variant_once(monkeypatch):
    """SGLang's two compaction lookups, launched once per compiled variant (their constexprs:
    the width and next_power_of_2(bs) for the front lookup, next_power_of_2(bs * accept width)
    for the accept lookup) for every candidate shape and batch size up to the cap, each with its
    smallest batch size and the dtypes a decode step passes; nothing else launched."""
    from sglang.kernels.ops.speculative import cache_locs, eagle

    launches = []

    def front(num_front, out_cache_loc, front_out_cache_loc):
        bs = num_front.numel()
        assert num_front.dtype == torch.int32 and out_cache_loc.dtype == torch.int64
        assert front_out_cache_loc.dtype == torch.int64
        launches.append(("front", out_cache_loc.numel() // bs, triton_np2(bs), bs))

    def accept(accept_index, out_cache_loc, accept_out_cache_loc, size):
        assert accept_index.dtype == torch.int32 and size == accept_index.numel()
        assert out_cache_loc.dtype == accept_out_cache_loc.dtype == torch.int64
        launches.append(("accept", triton_np2(size), accept_index.shape[1], accept_index.shape[0]))

    monkeypatch.setattr(cache_locs, "fill_front_out_cache_loc_func", front)
    monkeypatch.setattr(eagle, "fill_accept_out_cache_loc_func", accept)
    shapes, max_bs = [(8, 8), (8, 16), (32, 16)], 44
    n = adapter.warm_accept_compaction(shapes, max_bs, "cpu")
    assert n == len(launches)
    want_front = {(w, triton_np2(bs)) for w, _ in shapes for bs in range(1, max_bs + 1)}
    assert sorted((w, up) for kind, w, up, _ in launches if kind == "front") == sorted(want_front)
    want_accept = {triton_np2(bs * d) for _, d in shapes for bs in range(1, max_bs + 1)}
    got = [up for kind, up, _, _ in launches if kind == "accept"]
    assert sorted(got) == sorted(want_accept)  # each variant once
    # the smallest batch size reaching each variant: 1 for the front lookup's first class
    assert ("front", 8, 1, 1) in launches and ("front", 32, 64, 33) in launches
    # 0.5.22 has no front lookup of its own (its compaction reads req_to_token): the accept
    # lookup alone
    launches.clear()
    monkeypatch.delattr(cache_locs, "fill_front_out_cache_loc_func")
    assert adapter.warm_accept_compaction(shapes, max_bs, "cpu") == len(want_accept)
    assert {kind for kind, *_ in launches} == {"accept"}


def test_graph_capture_scope_is_sglangs_capture_context_stream_and_pool(monkeypatch):
    """The draft sampler's graphs capture as SGLang's own runners do: inside ``graph_capture`` on
    the shared capture stream (its TP group's graph-mode collectives on), into the shared pool;
    the current stream waits for the capture stream afterwards."""
    import sglang.srt.distributed.parallel_state as ps
    import sglang.srt.model_executor.runner_utils.pool as pool_mod

    events = []

    class Stream:
        def wait_stream(self, other):
            events.append(("wait", other))

    @contextlib.contextmanager
    def graph_capture(stream=None):
        events.append(("enter", stream))
        yield SimpleNamespace(stream=stream)
        events.append(("exit", stream))

    monkeypatch.setattr(ps, "graph_capture", graph_capture)
    monkeypatch.setattr(pool_mod, "get_or_create_global_graph_capture_stream", lambda: "capture")
    monkeypatch.setattr(
        pool_mod, "get_or_create_global_graph_memory_pool", lambda m: ("pool", m is torch.cuda)
    )
    monkeypatch.setattr(torch.cuda, "current_stream", Stream)
    with adapter.graph_capture_scope() as (stream, pool):
        events.append(("body", stream, pool))
    assert events == [
        ("enter", "capture"),
        ("body", "capture", ("pool", True)),
        ("exit", "capture"),
        ("wait", "capture"),
    ]

"""Which SGLang releases can run DDTREE: every SGLang internal the plug-in touches, looked up in
each release's source without importing it, and the support matrix derived from that.

``python -m sglang_spec.patching.survey WHEEL_OR_DIR ...`` reads SGLang wheels (``pip download
--no-deps sglang==X``; the ``.whl`` is read as a zip) or unpacked trees (a directory containing
``sglang/``) and prints, per release, every need that is missing or different, with the file and
line where the release has it (or what it has instead). Where the release is a pin
(``patches/<version>/``), its series is applied in memory first, so the report shows the release as
``sglang-spec patch apply`` leaves it. ``--write-support patches/support.json`` writes the matrix
that ``sglang-spec patch --list`` prints and ``apply`` refuses with.

How a need is looked up: the module file must exist; the name must be bound at its top level
(defined, assigned, or imported; ``from X import name`` and ``from X import *`` are followed to
``X``; imports under ``if TYPE_CHECKING`` do not count); a class attribute must be a method, a
class-body field or a ``self.<name> =`` assignment in the class or a base class (in the class
itself where the plug-in relies on an override); a callable must
accept every keyword the plug-in passes and as many positional arguments. It is a reading of the
source: it finds removed, renamed and re-signatured internals, not changed behaviour.

How a release's status follows: *supported* when it is a pin and every need is met, either as
0.5.23 has it or in the form ``ADAPTED`` records for that release (what the plug-in's adapter has to
absorb); otherwise *not supported*, with the unmet needs as the reason.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from sglang_spec.patching import core

# Matrix columns (need groups), in report order.
GROUPS = {
    "registry": "SpeculativeAlgorithm.register + CustomSpecAlgo (plug-in algorithm identity)",
    "plugins": "plug-in loading and HookRegistry",
    "dflash_v2": "DFlashWorkerV2 / DFlashDraftInputV2 (the worker DDTREE subclasses)",
    "server_args": "server-argument resolution the plug-in declares into",
    "tree_verify": "EAGLE tree verify, sampling and KV compaction",
    "gdn_commit": "tree-aware GDN / mamba commit",
    "graph_hook": "target CUDA-graph capture hook (H1)",
    "batch": "forward batch, runtime context and result types",
    "draft_graphs": "the draft sampler's own CUDA graphs (SGLang's capture context and pool)",
}


@dataclass(frozen=True)
class Need:
    """``target`` is ``module:Obj.attr`` (module dotted, object path after the colon), or
    alternatives joined by `` | `` when the plug-in reads the value the same way from either."""

    group: str
    target: str
    why: str
    kw: tuple[str, ...] = ()  # keywords the plug-in passes (or dataclass fields it sets)
    npos: int = 0  # positional arguments the plug-in passes (``self`` not counted)
    own: bool = False  # the class itself must define the member (an inherited one does not do)


def _n(group, target, why, kw=(), npos=0, own=False) -> Need:
    return Need(group, target, why, tuple(kw), npos, own)


SI = "sglang.srt.speculative"
DW = f"{SI}.dflash_worker_v2:DFlashWorkerV2"
MR = "sglang.srt.model_executor.model_runner:ModelRunner"
GR = "sglang.srt.model_executor.runner.decode_cuda_graph_runner:DecodeCudaGraphRunner"
FB = "sglang.srt.model_executor.forward_batch_info"
# fmt: off
NEEDS: tuple[Need, ...] = (
    _n("registry", f"{SI}.spec_info:SpeculativeAlgorithm.register", "registers DDTREE",
       kw=("supports_overlap", "spec_class"), npos=1),
    _n("registry", f"{SI}.spec_info:SpeculativeAlgorithm.from_string", "name lookup", npos=1),
    _n("registry", f"{SI}.spec_info:SpeculativeAlgorithm.DFLASH", "the drafter's algorithm"),
    _n("registry", f"{SI}.spec_registry:CustomSpecAlgo", "base of DDTreeSpecAlgo"),
    _n("registry", f"{SI}.spec_registry:get_spec", "idempotent registration", npos=1),
    _n("plugins", "sglang.srt.plugins:load_plugins", "entry point group sglang.srt.plugins"),
    _n("plugins", "sglang.srt.plugins.hook_registry:HookRegistry.register", "H1", npos=3),
    _n("plugins", "sglang.srt.plugins.hook_registry:HookType.AROUND", "H1"),
    _n("dflash_v2", DW, "DDTreeWorker's base class"),
    _n("dflash_v2", f"{DW}.__init__", "super().__init__", npos=4),
    _n("dflash_v2", f"{DW}.forward_batch_generation", "prefill (super())", npos=4),
    _n("dflash_v2", f"{DW}._maybe_build_draft_sampler", "overridden (no in-graph argmax)"),
    _n("dflash_v2", f"{DW}._make_next_draft_input_decode", "next draft input",
       kw=("bonus_tokens", "new_seq_lens")),
    _n("dflash_v2", f"{DW}._ensure_draft_block_buffers", "draft block buffers", npos=1),
    _n("dflash_v2", f"{DW}._append_target_hidden_to_draft_kv_by_loc", "drafter context KV",
       kw=("target_hidden", "cache_loc", "cache_loc_2d", "positions", "commit_lens")),
    *(_n("dflash_v2", f"{DW}.{a}", "worker state the plug-in reads or resets") for a in (
        "draft_model", "draft_model_runner", "model_runner", "target_worker", "device",
        "block_size", "speculative_num_draft_tokens", "selector", "lilicorr", "_is_domino",
        "use_compact_draft_cache", "_mask_token_id", "_full_embed_gpu", "_noise_embed_scale",
        "_block_pos_offsets", "_draft_block_spec_info", "_draft_block_ids_buf",
        "_draft_block_positions_buf", "_draft_block_tokens_buf", "_draft_verify_out_cache_loc_buf",
        "_draft_block_end_buf", "_draft_seq_lens_cpu_buf", "draft_parallel_layout")),
    _n("dflash_v2", f"{SI}.spec_utils:draft_tp_context", "drafter TP placement",
       kw=("layout",), npos=1),
    _n("dflash_v2", f"{SI}.dflash_worker_v2:_resolve_dflash_embedding_module", "embedding", npos=2),
    _n("dflash_v2", f"{SI}.dflash_info_v2:DFlashDraftInputV2.create_idle_input", "idle batch",
       kw=("device",)),
    *(_n("dflash_v2", f"{SI}.dflash_info_v2:DFlashDraftInputV2.{a}", "draft input") for a in (
        "bonus_tokens", "nxt_kv_lens_cpu", "nxt_kv_lens_sum", "new_seq_lens")),
    _n("dflash_v2", f"{SI}.dflash_info_v2:DFlashDraftInputV2.prepare_for_decode", "KV reserve (P3)",
       npos=1),
    _n("dflash_v2", f"{SI}.draft_worker_common:build_block_pos_offsets", "block positions",
       kw=("length", "device")),
    _n("dflash_v2", f"{SI}.draft_worker_common:make_draft_block_spec_info", "draft spec info",
       kw=("draft_token_num", "device")),
    _n("dflash_v2", f"{SI}.dflash_utils:parse_dflash_draft_config", "drafter block size",
       kw=("draft_hf_config",)),
    _n("dflash_v2", f"{SI}.dflash_utils:DFlashDraftConfig.resolve_block_size", "drafter block",
       kw=("default",)),
    _n("dflash_v2", "sglang.srt.mem_cache.kv_index_translator:KVIndexTranslator.plan",
       "draft forward KV plan",
       kw=("req_pool_indices", "seq_lens", "seq_lens_cpu", "write_virtual", "read_extent")),
    _n("dflash_v2", "sglang.srt.mem_cache.kv_loc_plan:KVLocPlan.bind", "draft KV plan", npos=2),
    _n("dflash_v2", "sglang.srt.lora.layers:unwrap_lora_layer", "plain embedding / head", npos=1),
    _n("server_args", "sglang.srt.arg_groups.overrides:declare_resolution", "declare", npos=2),
    _n("server_args", "sglang.srt.arg_groups.overrides:resolved_view", "read args", npos=1),
    _n("server_args", "sglang.srt.arg_groups.overrides:resolving_view", "read args", npos=1),
    _n("server_args", "sglang.srt.arg_groups.overrides:attention_backends_of", "backends", npos=1),
    _n("server_args", "sglang.srt.arg_groups.overrides:_ForeignDefaults", "plug-in stand-in"),
    _n("server_args", "sglang.srt.arg_groups.model_override_base:ResolvingConfig", "stand-in"),
    _n("server_args", "sglang.srt.arg_groups.model_override_base:record_of", "stand-in", npos=1),
    _n("server_args", "sglang.srt.arg_groups.speculative_hook:_handle_dflash", "DFLASH setup",
       npos=1),
    _n("server_args", "sglang.srt.arg_groups.speculative_hook:handle_speculative_decoding",
       "calls the algorithm's handle_server_args", npos=1),
    _n("server_args", "sglang.srt.utils.hf_transformers_utils:get_config", "drafter config",
       kw=("trust_remote_code", "revision", "model_override_args"), npos=1),
    _n("server_args", "sglang.srt.arg_groups.fields.spec:Spec.speculative_dflash_block_size"
       " | sglang.srt.server_args:ServerArgs.speculative_dflash_block_size", "the block flag"),
    _n("tree_verify", f"{SI}.eagle_info:EagleVerifyInput", "base of DDTreeVerifyInput",
       kw=("draft_token", "custom_mask", "positions", "retrieve_index", "retrieve_next_token",
           "retrieve_next_sibling", "retrieve_cum_len", "spec_steps", "topk", "draft_token_num",
           "capture_hidden_mode", "seq_lens_sum", "seq_lens_cpu")),
    _n("tree_verify", f"{SI}.eagle_utils:eagle_prepare_for_verify", "verify batch", npos=4),
    _n("tree_verify", f"{SI}.eagle_utils:eagle_sample", "tree walk", kw=("watermark_state",),
       npos=4),
    _n("tree_verify", f"{SI}.spec_utils:GrammarTree.from_device", "grammar", npos=3),
    _n("tree_verify", f"{SI}.spec_utils:build_grammar_vocab_mask", "grammar",
       kw=("reqs", "tree", "sampling_info", "device", "barrier")),
    _n("tree_verify", "sglang.kernels.ops.speculative.eagle:prepare_verify_commit_outputs",
       "new seq lens + bonus", npos=4),
    _n("tree_verify", "sglang.srt.layers.logprob_processor:compute_spec_logprobs", "logprobs",
       kw=("accept_index",), npos=3),
    _n("tree_verify", f"{SI}.spec_utils:move_accept_tokens_to_target_kvcache", "KV compaction",
       npos=4),
    _n("tree_verify", f"{SI}.eagle_worker_common:_compact_accept_to_front", "KV compaction",
       kw=("num_draft_tokens",), npos=3),
    _n("tree_verify", "sglang.kernels.ops.speculative.cache_locs:fill_front_out_cache_loc_func",
       "compaction warm-up", npos=3),
    _n("tree_verify", "sglang.kernels.ops.speculative.eagle:fill_accept_out_cache_loc_func",
       "compaction warm-up", npos=4),
    _n("tree_verify", f"{MR}.max_running_requests", "compaction warm-up"),
    _n("tree_verify", "sglang.srt.layers.attention.base_attn_backend:AttentionBackend.verify_mask",
       "mask buffer"),
    _n("tree_verify", "sglang.srt.layers.attention.verify_mask:VerifyMask.fits", "mask", npos=1),
    _n("tree_verify", "sglang.srt.layers.attention.hybrid_linear_attn_backend:"
       "HybridLinearAttnBackend.update_verify_buffers_to_fill_after_draft", "GDN graph buffers",
       npos=2, own=True),
    _n("gdn_commit", f"{SI}.spec_utils:commit_mamba_states_after_verify", "tree GDN commit",
       npos=5),
    _n("graph_hook", f"{GR}.get_spec_info", "H1 target", npos=1),
    _n("graph_hook", f"{GR}.captured_req_width", "H1 verify width"),
    _n("graph_hook", f"{GR}.buffers", "H1 custom_mask buffer"),
    _n("graph_hook", f"{MR}.is_draft_worker", "H1 target or drafter"),
    _n("batch", f"{FB}:ForwardBatch", "draft forward",
       kw=("forward_mode", "batch_size", "input_ids", "req_pool_indices", "seq_lens",
           "out_cache_loc", "seq_lens_sum", "seq_lens_cpu", "positions", "input_embeds",
           "spec_algorithm", "spec_info", "capture_hidden_mode", "num_token_non_padded",
           "global_num_token_non_padded_cpu", "can_run_decode_cuda_graph")),
    _n("batch", f"{FB}:ForwardMode.TARGET_VERIFY", "draft / verify mode"),
    _n("batch", f"{FB}:CaptureHiddenMode.FULL", "aux hidden capture"),
    _n("batch", f"{FB}:enable_num_token_non_padded", "draft forward"),
    _n("batch", "sglang.srt.runtime_context:get_spec", "spec config"),
    _n("batch", "sglang.srt.runtime_context:get_parallel", "TP rank / group"),
    _n("batch", "sglang.srt.managers.utils:GenerationBatchResult", "worker result",
       kw=("logits_output", "next_token_ids", "accept_lens", "accept_index", "can_run_cuda_graph",
           "next_draft_input", "speculative_num_draft_tokens", "new_seq_lens",
           "extra_keep_alive_refs")),
    _n("batch", "sglang.srt.managers.overlap_utils:FutureMap", "create_future_map", npos=5),
    _n("batch", f"{MR}.watermark_state", "eagle_sample argument"),
    _n("batch", f"{MR}.kv_index_translator", "draft forward KV plan"),
    _n("draft_graphs", "sglang.srt.distributed.parallel_state:graph_capture",
       "draft sampler graph capture", kw=("stream",)),
    _n("draft_graphs", "sglang.srt.distributed.parallel_state:GraphCaptureContext.stream",
       "draft sampler capture stream"),
    _n("draft_graphs", "sglang.srt.model_executor.runner_utils.pool:"
       "get_or_create_global_graph_memory_pool", "draft sampler graph pool", npos=1),
    _n("draft_graphs", "sglang.srt.model_executor.runner_utils.pool:"
       "get_or_create_global_graph_capture_stream", "draft sampler capture stream"),
)
# fmt: on

# Needs a release meets in another form that the plug-in's adapter (sglang_spec/plugin/adapter.py)
# handles: release -> {target of the 0.5.23 need: the need as that release has it}. Kept here, not
# derived from adapter.EXPECTED (which would make the patch tool import the plug-in and torch);
# tests/test_adapter.py checks that both name the same internals.
ADAPTED: dict[str, dict[str, Need]] = {
    "0.5.22": {
        f"{DW}.draft_parallel_layout": _n(
            "dflash_v2",
            f"{DW}.draft_owns_attention",
            "a bool instead of a DraftParallelLayout: pass it to draft_tp_context",
        ),
        f"{SI}.spec_utils:draft_tp_context": _n(
            "dflash_v2",
            f"{SI}.spec_utils:draft_tp_context",
            "draft_tp_context(owns_attention: bool)",
            kw=("owns_attention",),
            npos=1,
        ),
        # 0.5.22's compaction looks the targets up in req_to_token with this kernel directly
        # (one variant per batch-size class, not per width): nothing width-dependent to warm
        "sglang.kernels.ops.speculative.cache_locs:fill_front_out_cache_loc_func": _n(
            "tree_verify",
            "sglang.kernels.ops.speculative.cache_locs:assign_extend_cache_locs",
            "the targets looked up in req_to_token: the adapter skips that warm-up",
        ),
    },
}

# The two needs that bound the matrix: releases without both cannot host the plug-in at all.
REGISTER = f"{SI}.spec_info:SpeculativeAlgorithm.register"
WORKER_V2 = DW

# ------------------------------------------------------------------ reading a release


@dataclass
class Found:
    file: str  # relative to the directory that contains sglang/
    line: int
    node: ast.AST | None  # FunctionDef / ClassDef for signature checks, else None


class Source:
    """One release's files: a wheel (read as a zip) or a directory containing ``sglang/``, with
    some files replaced in memory (a pin's patched contents)."""

    def __init__(self, path: Path):
        self.path = path
        self.overrides: dict[str, bytes] = {}
        self._zip = zipfile.ZipFile(path) if path.is_file() else None
        self._names = set(self._zip.namelist()) if self._zip else None
        self._mods: dict[str, tuple[str, ast.Module] | None] = {}

    def read(self, rel: str) -> bytes | None:
        if rel in self.overrides:
            return self.overrides[rel]
        if self._zip is not None:
            return self._zip.read(rel) if rel in self._names else None
        f = self.path / rel
        return f.read_bytes() if f.is_file() else None

    def version(self) -> str:
        if self._zip is None:
            return core.detect_version(core.locate(str(self.path)))[0]
        for name in sorted(self._names):
            if re.fullmatch(r"sglang-[^/]+\.dist-info/METADATA", name):
                m = re.search(rb"^Version:\s*(\S+)", self._zip.read(name), re.M)
                if m:
                    return m.group(1).decode()
        raise core.PatchingError(f"{self.path}: no sglang-*.dist-info/METADATA with a Version", 2)

    def module(self, dotted: str) -> tuple[str, ast.Module] | None:
        if dotted not in self._mods:
            base = dotted.replace(".", "/")
            self._mods[dotted] = None
            for rel in (base + ".py", base + "/__init__.py"):
                data = self.read(rel)
                if data is not None:
                    self._mods[dotted] = (rel, ast.parse(data, rel))
                    break
        return self._mods[dotted]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _binds(st: ast.stmt, name: str) -> bool:
    if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return st.name == name
    if isinstance(st, (ast.Assign, ast.AnnAssign)):
        targets = st.targets if isinstance(st, ast.Assign) else [st.target]
        return any(isinstance(t, ast.Name) and t.id == name for t in targets)
    if isinstance(st, (ast.ImportFrom, ast.Import)):
        return any((a.asname or a.name.split(".")[0]) == name for a in st.names)
    return False


def _top_statements(mod: ast.Module):
    """Top-level statements, including those inside if/try blocks (not ``if TYPE_CHECKING``)."""
    stack = list(mod.body)
    while stack:
        st = stack.pop(0)
        if isinstance(st, ast.If) and _is_type_checking(st.test):
            continue
        if isinstance(st, (ast.If, ast.Try)):
            inner = st.body + st.orelse + getattr(st, "finalbody", [])
            for h in getattr(st, "handlers", []):
                inner += h.body
            stack[:0] = inner
            continue
        yield st


def _import_source(modname: str, is_package: bool, st: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` reads from."""
    if not st.level:
        return st.module or ""
    parts = modname.split(".")
    keep = len(parts) - st.level + (1 if is_package else 0)
    return ".".join(parts[:keep] + ([st.module] if st.module else []))


def _class_member(cls: ast.ClassDef, name: str) -> ast.AST | None:
    for st in cls.body:
        if _binds(st, name) and not isinstance(st, (ast.Import, ast.ImportFrom)):
            return st
    for node in ast.walk(cls):  # self.<name> = ... in any method
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        else:
            continue
        for t in targets:
            if (
                isinstance(t, ast.Attribute)
                and t.attr == name
                and isinstance(t.value, ast.Name)
                and t.value.id == "self"
            ):
                return node
    return None


def _is_def(node: ast.AST) -> bool:
    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))


class Resolver:
    MAX_HOPS = 8  # re-export chains and base classes followed at most this deep

    def __init__(self, src: Source):
        self.src = src

    def top(self, modname: str, name: str, hops: int = 0) -> tuple[Found | None, str]:
        got = self.src.module(modname)
        if got is None:
            return None, f"no module {modname}"
        rel, mod = got
        is_pkg = rel.endswith("__init__.py")
        hit = None
        stars = []
        for st in _top_statements(mod):
            if isinstance(st, ast.ImportFrom) and st.names[0].name == "*":
                stars.append(st)
            elif _binds(st, name):
                hit = st  # the last binding wins, as at run time
        if hit is None:
            sub = self.src.module(f"{modname}.{name}")
            if sub is not None:
                return Found(sub[0], 1, None), ""
            for st in stars if hops < self.MAX_HOPS else []:
                inner, _ = self.top(_import_source(modname, is_pkg, st), name, hops + 1)
                if inner is not None:
                    return inner, ""
            return None, f"{name} not in {rel}"
        if isinstance(hit, ast.ImportFrom) and hops < self.MAX_HOPS:
            origin = next(a.name for a in hit.names if (a.asname or a.name) == name)
            src_mod = _import_source(modname, is_pkg, hit)
            inner, why = self.top(src_mod, origin, hops + 1)
            if inner is None:
                return None, f"{rel}:{hit.lineno} imports {name} from {src_mod}, but {why}"
            return inner, ""
        return Found(rel, hit.lineno, hit if _is_def(hit) else None), ""

    def member(
        self, owner: Found, name: str, hops: int = 0, own: bool = False
    ) -> tuple[Found | None, str]:
        cls = owner.node
        if not isinstance(cls, ast.ClassDef):
            return None, f"{owner.file}:{owner.line} is not a class"
        st = _class_member(cls, name)
        if st is not None:
            return Found(owner.file, st.lineno, st if _is_def(st) else None), ""
        cls_mod = owner.file.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        for base in cls.bases if hops < self.MAX_HOPS and not own else []:
            if isinstance(base, ast.Name):
                bfound, _ = self.top(cls_mod, base.id)
                if bfound is not None:
                    got, _ = self.member(bfound, name, hops + 1)
                    if got is not None:
                        return got, ""
        return None, f"{cls.name}.{name} not in {owner.file} (class at line {owner.line})"

    def resolve(self, target: str, own: bool = False) -> tuple[Found | None, str]:
        """The first of the ``|``-separated alternatives that exists; with ``own`` the last
        member must be defined by its class itself."""
        whys = []
        for alt in target.split(" | "):
            modname, objpath = alt.split(":")
            parts = objpath.split(".")
            found, why = self.top(modname, parts[0])
            for i, p in enumerate(parts[1:], 2):
                if found is None:
                    break
                found, why = self.member(found, p, own=own and i == len(parts))
            if found is not None:
                return found, ""
            whys.append(why)
        return None, "; ".join(whys)


def signature_problem(node: ast.AST | None, need: Need) -> str:
    """'' when the callable (function, or class via __init__ or its fields) accepts the plug-in's
    call, else what differs."""
    if not need.kw and not need.npos:
        return ""
    if isinstance(node, ast.ClassDef):
        init = _class_member(node, "__init__")
        if not isinstance(init, ast.FunctionDef):  # a dataclass / msgspec struct: its own fields
            fields = {
                st.target.id
                for st in node.body
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)
            }
            missing = [k for k in need.kw if k not in fields]
            return f"no field(s) {', '.join(missing)}" if missing else ""
        node = init
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return ""
    a = node.args
    pos = [x.arg for x in a.posonlyargs + a.args]
    if pos and pos[0] in ("self", "cls"):
        pos = pos[1:]
    named = {x.arg for x in a.args + a.kwonlyargs}
    out = []
    missing = [k for k in need.kw if k not in named]
    if missing and a.kwarg is None:
        out.append(f"no keyword(s) {', '.join(missing)}")
    if len(pos) < need.npos and a.vararg is None:
        out.append(f"takes {len(pos)} positional, the plug-in passes {need.npos}")
    if out:
        shown = pos + (["*"] if a.kwonlyargs else []) + [x.arg for x in a.kwonlyargs]
        out.append(f"signature ({', '.join(shown)})")
    return "; ".join(out)


@dataclass
class Finding:
    need: Need
    ok: bool
    where: str  # file:line when the name was found ('' when absent)
    detail: str  # what is missing or different ('' when ok)


def check_need(res: Resolver, need: Need) -> Finding:
    found, why = res.resolve(need.target, need.own)
    if found is None:
        return Finding(need, False, "", why)
    problem = signature_problem(found.node, need)
    return Finding(need, not problem, f"{found.file}:{found.line}", problem)


# ------------------------------------------------------------------ releases and the matrix


def version_key(v: str) -> tuple[int, ...]:
    main, _, post = v.partition(".post")
    return (*(int(x) for x in main.split(".")), int(post or 0))


def survey_release(path: Path, patches_dir: Path) -> dict:
    """One release: its findings (a pin's series applied in memory), status and reason."""
    src = Source(path)
    version = src.version()
    pin = version in core.supported_versions(patches_dir)
    series: list[str] = []
    if pin:
        ps = core.load_patch_set(patches_dir, version)
        originals = {rel: src.read(rel) for rel in ps.files}
        absent = sorted(rel for rel, data in originals.items() if data is None)
        if absent:
            raise core.PatchingError(f"{path}: sglang {version} lacks {', '.join(absent)}", 2)
        src.overrides = core.patched_contents(ps, originals)
        series = ps.series
    res = Resolver(src)
    findings = [check_need(res, n) for n in NEEDS]
    adapted, unmet = [], []
    for f in findings:
        if f.ok:
            continue
        alt = ADAPTED.get(version, {}).get(f.need.target)
        alt_f = check_need(res, alt) if alt is not None else None
        if alt_f is not None and alt_f.ok:
            adapted.append(
                {"need": f.need.target, "has": alt.target, "where": alt_f.where, "note": alt.why}
            )
        else:
            unmet.append(
                {"group": f.need.group, "need": f.need.target, "where": f.where, "detail": f.detail}
            )
    by_target = {f.need.target: f for f in findings}
    report = {
        "version": version,
        "source": path.name,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None,
        "pin": pin,
        "patches": series,
        "register": by_target[REGISTER].where or "absent",
        "dflash_worker_v2": by_target[WORKER_V2].where or "absent",
        "needs_met": sum(f.ok for f in findings) + len(adapted),
        "needs_total": len(findings),
        "adapted": adapted,
        "unmet": unmet,
    }
    report["status"], report["why"] = decide(report)
    return report


def decide(r: dict) -> tuple[str, str]:
    """(status, one-line reason) from a release report."""
    if r["pin"] and not r["unmet"]:
        why = f"pin: patches/{r['version']} ({', '.join(r['patches']) or 'no patches'})"
        if r["adapted"]:
            names = ", ".join(a["need"].split(":", 1)[1] for a in r["adapted"])
            why += f"; the plug-in's adapter takes this release's form of {names}"
        return "supported", why
    base = [
        name
        for name, t in (("SpeculativeAlgorithm.register", REGISTER), ("DFlashWorkerV2", WORKER_V2))
        if any(u["need"] == t for u in r["unmet"])
    ]
    groups = sorted({u["group"] for u in r["unmet"]}, key=list(GROUPS).index)
    n = len(r["unmet"])
    if base:
        lead = f"no {' and no '.join(base)}"
    else:
        names = [u["need"].split(":")[1] for u in r["unmet"]]
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        lead = f"{n} internal(s) the plug-in uses are missing or changed: {shown}"
    why = f"{lead} ({n} of {r['needs_total']} needs unmet, in {', '.join(groups)})"
    if r["pin"]:
        why = "BROKEN PIN: " + why
    return "not supported", why


def format_report(reports: list[dict]) -> str:
    lines = []
    for r in sorted(reports, key=lambda r: version_key(r["version"])):
        head = (
            f"sglang {r['version']}: {r['status']}, {r['needs_met']}/{r['needs_total']} needs met"
        )
        if r["patches"]:
            head += f" (with {', '.join(r['patches'])})"
        lines.append(head)
        for a in r["adapted"]:
            lines.append(f"  ADAPTED {a['need']} -> {a['has']} [{a['where']}]: {a['note']}")
        for u in r["unmet"]:
            at = f" [{u['where']}]" if u["where"] else ""
            lines.append(f"  MISSING {u['group']:<11} {u['need']}{at}: {u['detail']}")
    return "\n".join(lines)


SUPPORT_HOW = (
    "Written by `python -m sglang_spec.patching.survey --write-support patches/support.json "
    "<sglang wheels>`: each release's wheel is read without importing it, the pin's patches are "
    "applied in memory, and every SGLang internal the plug-in uses (survey.NEEDS) is looked up; "
    "'register' / 'dflash_worker_v2' are where SpeculativeAlgorithm.register / DFlashWorkerV2 are "
    "defined in that wheel; 'unmet' lists each need that is absent or has another signature there."
)


def compact_unmet(unmet: list[dict]) -> list[str]:
    """One line per unmet need; needs of one absent module share a line."""
    lines: list[str] = []
    by_module: dict[str, list[str]] = {}
    for u in unmet:
        obj = u["need"].split(":", 1)[1]
        if u["detail"].startswith("no module ") and " | " not in u["need"]:
            if u["detail"] not in by_module:
                by_module[u["detail"]] = []
                lines.append(u["detail"])  # placeholder, filled below
            by_module[u["detail"]].append(obj)
        elif u["where"]:
            lines.append(f"{obj} [{u['where']}]: {u['detail']}")
        else:
            lines.append(u["detail"])
    return [f"{ln} ({', '.join(by_module[ln])})" if ln in by_module else ln for ln in lines]


def support_document(reports: list[dict]) -> dict:
    """patches/support.json: the matrix with its evidence, newest release first."""
    releases = {}
    for r in sorted(reports, key=lambda r: version_key(r["version"]), reverse=True):
        releases[r["version"]] = {
            **{k: r[k] for k in ("status", "why", "register", "dflash_worker_v2", "patches")},
            "needs_met": f"{r['needs_met']}/{r['needs_total']}",
            "source": f"{r['source']} sha256 {r['sha256']}" if r["sha256"] else r["source"],
            "adapted": [
                f"{a['need'].split(':', 1)[1]} -> {a['has'].split(':', 1)[1]} "
                f"[{a['where']}]: {a['note']}"
                for a in r["adapted"]
            ],
            "unmet": compact_unmet(r["unmet"]),
        }
    return {"how": SUPPORT_HOW, "releases": releases}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m sglang_spec.patching.survey", description=__doc__.splitlines()[0]
    )
    p.add_argument(
        "sources",
        nargs="+",
        type=Path,
        help="sglang wheels (.whl) or unpacked trees (directories containing sglang/)",
    )
    p.add_argument("--patches-dir", type=Path, default=None)
    p.add_argument(
        "--write-support",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write the support matrix (patches/support.json) here",
    )
    a = p.parse_args(argv)
    for s in a.sources:
        if not (s.is_dir() or (s.is_file() and s.suffix == ".whl")):
            p.error(
                f"{s}: not a .whl file or a directory (expected an sglang wheel or unpacked tree)"
            )
    try:
        reports = [
            survey_release(s, a.patches_dir or core.default_patches_dir()) for s in a.sources
        ]
    except core.PatchingError as e:
        print(f"survey: {e}", file=sys.stderr)
        return e.exit_code
    print(format_report(reports))
    if a.write_support:
        a.write_support.write_text(json.dumps(support_document(reports), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

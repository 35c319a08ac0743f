"""CPU tests of the DDTREE SGLang plug-in against the real sglang 0.5.23 package.

Needs the package pip-installed (entry points): `pip install -e . --no-deps`.
"""

from __future__ import annotations

import json
from importlib.metadata import entry_points

import pytest
import sglang  # noqa: F401  the CPU test environment installs sglang 0.5.23 (requirements-cpu.txt); never skip
import torch

from sglang_spec import plugin as P

TARGET_CFG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "num_hidden_layers": 4,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}


def _draft_cfg(block_size=8):
    cfg = dict(TARGET_CFG)
    cfg.update(
        architectures=["DFlashDraftModel"],
        num_hidden_layers=1,
        num_target_layers=4,
        dflash_config={"mask_token_id": 1000, "target_layer_ids": [1, 2]},
    )
    if block_size is not None:
        cfg["block_size"] = block_size
    return cfg


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("ddtree_models")
    paths = {}
    for name, cfg in (
        ("target", TARGET_CFG),
        ("draft8", _draft_cfg(8)),
        ("draft_noblock", _draft_cfg(None)),
    ):
        d = root / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
        paths[name] = str(d)
    return paths


@pytest.fixture(scope="module")
def loaded():
    from sglang.srt.plugins import load_plugins

    load_plugins()
    return True


def _resolve(models, *extra, draft="draft8", backend="flashinfer"):
    """prepare_server_args + handle_speculative_decoding, as launch does."""
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.arg_groups.speculative_hook import handle_speculative_decoding
    from sglang.srt.server_args import prepare_server_args

    args = [
        "--model-path",
        models["target"],
        "--device",
        "cuda",
        "--speculative-algorithm",
        "DDTREE",
    ]
    if draft is not None:
        args += ["--speculative-draft-model-path", models[draft]]
    if backend is not None:
        args += ["--attention-backend", backend]
    sa = prepare_server_args(args + list(extra))
    handle_speculative_decoding(sa)
    return resolving_view(sa), sa


# ----------------------------------------------------------------- discovery


def test_entry_point_declared():
    eps = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "ddtree"]
    assert eps and eps[0].value == "sglang_spec.plugin:register"


def test_load_plugins_registers_ddtree(loaded):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    algo = SpeculativeAlgorithm.from_string("DDTREE")
    assert isinstance(algo, CustomSpecAlgo) and algo.name == "DDTREE"
    assert SpeculativeAlgorithm.from_string("ddtree") is algo
    # DFLASH stays upstream's enum member.
    assert SpeculativeAlgorithm.from_string("DFLASH") is SpeculativeAlgorithm.DFLASH
    # What the scheduler calls unconditionally.
    assert algo.need_topk() is False
    assert algo.carries_draft_hidden_states() is False
    assert algo.is_dflash_family() and algo.is_dflash() and not algo.is_eagle()
    assert algo.supports_target_verify_for_draft()
    assert not algo.supports_mixed_chunk()
    assert algo.build_disagg_draft_input(None, None, None) is None
    # Re-registration is a no-op, not an error.
    P.register()


def test_create_future_map(loaded):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    algo = SpeculativeAlgorithm.from_string("DDTREE")
    assert callable(algo.create_future_map)


def test_worker_class_loads(loaded, models):
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2
    from sglang.srt.speculative.eagle_info import EagleVerifyInput
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_spec.plugin.worker import DDTreeVerifyInput, DDTreeWorker

    _, sa = _resolve(models)
    algo = SpeculativeAlgorithm.from_string("DDTREE")
    cls = algo.create_worker(sa)
    assert cls is DDTreeWorker and issubclass(cls, DFlashWorkerV2)
    assert issubclass(DDTreeVerifyInput, EagleVerifyInput)
    for stage in (
        "draft_stage",
        "topk_stage",
        "tree_stage",
        "verify_stage",
        "walk_stage",
        "commit_stage",
        "append_context_stage",
    ):
        assert callable(getattr(DDTreeWorker, stage))


def test_register_failure_is_loud(monkeypatch, caplog):
    import sglang.srt.speculative.spec_info as si

    monkeypatch.setattr(P, "_registered", False)

    def boom(*a, **k):
        raise RuntimeError("simulated")

    monkeypatch.setattr(si.SpeculativeAlgorithm, "register", classmethod(boom))
    monkeypatch.setattr("sglang.srt.speculative.spec_registry.get_spec", lambda name: None)
    with caplog.at_level("ERROR", logger="sglang_spec.plugin"):
        with pytest.raises(RuntimeError):
            P.register()
    assert any("FAILED to register" in r.message for r in caplog.records)


def test_cuda_graph_hook_registered(loaded):
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import (
        DecodeCudaGraphRunner,
    )
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_spec.plugin import hooks

    assert hooks.GET_SPEC_INFO_TARGET in HookRegistry._patched
    assert DecodeCudaGraphRunner.get_spec_info is not None

    class MR:  # non-DDTREE runner: upstream behaviour untouched
        spec_algorithm = type("A", (), {"name": "DFLASH"})()
        is_draft_worker = False

    class R:
        model_runner = MR()

    sentinel = object()
    assert hooks.get_spec_info_around(lambda self, n: sentinel, R(), 4) is sentinel


# ------------------------------------------------------------- server args


def test_valid_defaults(loaded, models):
    cfg, _ = _resolve(models)
    assert cfg.speculative_algorithm == "DDTREE"
    assert cfg.speculative_dflash_block_size == 8
    assert cfg.speculative_num_draft_tokens == 8  # budget = block - 1
    assert cfg.speculative_num_steps == 1
    assert cfg.speculative_eagle_topk == 7
    assert cfg.disable_overlap_schedule is True
    assert cfg.speculative_draft_attention_backend is not None


def test_valid_budget(loaded, models):
    cfg, sa = _resolve(
        models, "--speculative-num-draft-tokens", "33", "--speculative-dflash-block-size", "8"
    )
    assert cfg.speculative_num_draft_tokens == 33
    assert cfg.speculative_dflash_block_size == 8
    assert cfg.speculative_eagle_topk == 32
    assert P.resolve_max_speculative_num_draft_tokens(sa) == 33


def test_topk_env(loaded, models, monkeypatch):
    monkeypatch.setenv(P.ENV_TOPK, "4")
    cfg, _ = _resolve(models, "--speculative-num-draft-tokens", "17")
    assert cfg.speculative_eagle_topk == 4
    monkeypatch.setenv(P.ENV_TOPK, "1")
    cfg, _ = _resolve(models, "--speculative-num-draft-tokens", "17")
    assert cfg.speculative_eagle_topk == 2  # tree mode stays on


@pytest.mark.parametrize(
    "extra,kw,msg",
    [
        ((), {"draft": None}, "requires --speculative-draft-model-path"),
        (("--speculative-num-draft-tokens", "1"), {}, "budget must be >= 1"),
        (("--speculative-num-draft-tokens", "1025"), {}, "limit of 1024"),
        (("--speculative-num-draft-tokens", "3"), {}, "too small for drafter block"),
        (("--speculative-dflash-block-size", "16"), {}, "disagrees with the drafter"),
        ((), {"draft": "draft_noblock"}, "could not determine the drafter block"),
        (("--pp-size", "2"), {}, "pipeline parallel size 1"),
        ((), {"backend": "torch_native"}, "per-request tree mask"),
        ((), {"backend": "trtllm_mha"}, "per-request tree mask"),
        (("--page-size", "16"), {}, "--page-size 1"),
        (("--speculative-use-rejection-sampling",), {}, "rejection-sampling"),
        (("--speculative-accept-threshold-single", "0.5"), {}, "lossy"),
        (("--speculative-draft-window-size", "64"), {}, "draft-window-size"),
    ],
)
def test_refusals(loaded, models, extra, kw, msg):
    with pytest.raises(ValueError, match=msg):
        _resolve(models, *extra, **kw)


def test_small_width_needs_the_reserve_patch(loaded, models, monkeypatch):
    monkeypatch.setattr(P, "reserve_patch_applied", lambda: False)
    with pytest.raises(ValueError, match="sglang-spec patch apply"):
        _resolve(models, "--speculative-num-draft-tokens", "3")
    monkeypatch.setattr(P, "reserve_patch_applied", lambda: True)
    cfg, _ = _resolve(models, "--speculative-num-draft-tokens", "3")
    assert cfg.speculative_num_draft_tokens == 3 and cfg.speculative_dflash_block_size == 8


def test_bad_topk_env(loaded, models, monkeypatch):
    monkeypatch.setenv(P.ENV_TOPK, "99")
    with pytest.raises(ValueError, match="out of range"):
        _resolve(models)
    monkeypatch.setenv(P.ENV_TOPK, "x")
    with pytest.raises(ValueError, match="not an integer"):
        _resolve(models)


def test_tree_temperature_env(loaded, models, monkeypatch):
    monkeypatch.setenv(P.ENV_TREE_TEMPERATURE, "0.5")
    _resolve(models)  # accepted
    assert P.parse_tree_temperature_env() == 0.5
    monkeypatch.delenv(P.ENV_TREE_TEMPERATURE)
    assert P.parse_tree_temperature_env() == 1.0
    for bad in ("0", "-2", "nan", "inf", "warm"):
        monkeypatch.setenv(P.ENV_TREE_TEMPERATURE, bad)
        with pytest.raises(
            ValueError, match=f"SGLANG_DDTREE_TREE_TEMPERATURE={bad!r} is not valid"
        ):
            _resolve(models)


def test_drafter_not_dflash(loaded, models):
    with pytest.raises(ValueError, match="needs a DFlash drafter"):
        _resolve(models, draft="target")


def test_verify_widths(monkeypatch):
    monkeypatch.setattr(P, "_spec_block_size", lambda: 16)
    assert P.get_num_tokens_per_req_for_target_verify(65, is_draft_worker=True) == 16
    assert P.get_num_tokens_per_req_for_target_verify(65, is_draft_worker=False) == 65


# ------------------------------------------------------- decode-step pieces


def test_verify_input_class(loaded):
    from sglang_spec.plugin.worker import DDTreeVerifyInput

    vi = DDTreeVerifyInput(
        draft_token=torch.zeros(6, dtype=torch.int64),
        custom_mask=None,
        positions=torch.zeros(6, dtype=torch.int64),
        retrieve_index=torch.zeros(2, 3, dtype=torch.int64),
        retrieve_next_token=torch.zeros(2, 3, dtype=torch.int64),
        retrieve_next_sibling=torch.zeros(2, 3, dtype=torch.int64),
        retrieve_cum_len=None,
        spec_steps=7,
        topk=2,
        draft_token_num=3,
        capture_hidden_mode=None,
        seq_lens_sum=None,
        seq_lens_cpu=None,
    )
    assert vi.max_tree_depth == 8 and vi.tree_topk == -1
    assert vi.num_tokens_per_req == 3 and vi.is_verify_input()


class _Head:
    def __init__(self, weight, shard=None):
        self.weight = weight
        if shard is not None:
            self.shard_indices = shard


class _Shard:
    def __init__(self, start, n, padded):
        self.org_vocab_start_index = start
        self.num_org_elements = n
        self.num_org_elements_padded = padded
        self.num_added_elements = 0
        self.added_vocab_start_index = 0


def test_local_vocab_logits_drops_padding():
    from sglang_spec.plugin.worker import local_vocab_logits

    torch.manual_seed(0)
    w = torch.randn(12, 8)
    head = _Head(w, _Shard(start=100, n=10, padded=12))
    logits, ids = local_vocab_logits(torch.randn(3, 8), head)
    assert logits.shape == (3, 10) and ids.tolist() == list(range(100, 110))


def test_sharded_topk_matches_full_vocab():
    from sglang_spec import tree
    from sglang_spec.plugin.worker import local_vocab_logits, sharded_topk

    torch.manual_seed(0)
    V, H, bs, L, k = 40, 16, 2, 5, 6
    w = torch.randn(V, H)
    hid = torch.randn(bs, L, H)
    ref = torch.log_softmax(hid.reshape(-1, H) @ w.T, -1).topk(k, -1)
    logq, ids = sharded_topk(hid, _Head(w), k)
    torch.testing.assert_close(logq.reshape(-1, k), ref.values, rtol=1e-5, atol=1e-5)
    assert torch.equal(ids.reshape(-1, k), ref.indices)

    # Two vocab shards (20 rows each, padded to 24), merged without the vocab.
    vals, idss, lses = [], [], []
    for r in range(2):
        wp = torch.zeros(24, H)
        wp[:20] = w[r * 20 : (r + 1) * 20]
        lg, vid = local_vocab_logits(hid.reshape(-1, H), _Head(wp, _Shard(r * 20, 20, 24)))
        v, i = lg.topk(k, -1)
        vals.append(v.view(bs, L, k))
        idss.append(vid[i].view(bs, L, k))
        lses.append(torch.logsumexp(lg, -1).view(bs, L))
    logq2, ids2 = tree.merge_sharded_topk(
        torch.stack(vals), torch.stack(idss), torch.stack(lses), k
    )
    torch.testing.assert_close(logq2, logq, rtol=1e-5, atol=1e-5)
    assert torch.equal(ids2, ids)


def test_sharded_topk_tree_temperature():
    from sglang_spec import tree
    from sglang_spec.plugin.worker import sharded_topk

    torch.manual_seed(1)
    V, H, bs, L, k = 40, 16, 2, 5, 6
    w = torch.randn(V, H)
    hid = torch.randn(bs, L, H)
    logq, ids = sharded_topk(hid, _Head(w), k, temperature=0.5)
    ref_logq, ref_ids = tree.draft_topk((hid @ w.T).float(), k, temperature=0.5)
    torch.testing.assert_close(logq, ref_logq, rtol=1e-5, atol=1e-5)
    assert torch.equal(ids, ref_ids)


def test_tree_abi_to_verify_input():
    from sglang_spec import tree as tree_mod
    from sglang_spec.plugin.worker import build_verify_input

    torch.manual_seed(0)
    bs, L, V, budget = 2, 4, 50, 6
    logits = torch.randn(bs, L, V)
    roots = torch.tensor([3, 7])
    tree = tree_mod.build_ddtree(logits, budget, roots)
    n = budget + 1
    seq_lens = torch.tensor([5, 9])
    vi = build_verify_input(
        tree, seq_lens, horizon=L, eagle_topk=2, seq_lens_sum=int(seq_lens.sum())
    )
    abi = tree_mod.sglang_tree_abi(tree, seq_lens, seq_lens_sum=int(seq_lens.sum()))
    assert vi.draft_token_num == n and vi.max_tree_depth == L + 1 and vi.tree_topk == -1
    for f in ("retrieve_index", "retrieve_next_token", "retrieve_next_sibling"):
        t = getattr(vi, f)
        assert t.shape == (bs, n) and t.dtype == torch.int64
        assert torch.equal(t, getattr(abi, f))
    assert vi.draft_token.shape == (bs * n,) and vi.draft_token.dtype == torch.int64
    assert vi.positions.shape == (bs * n,) and vi.positions.dtype == torch.int64
    assert torch.equal(vi.draft_token.view(bs, n)[:, 0], roots)
    assert vi.retrieve_index.tolist() == [[b * n + i for i in range(n)] for b in range(bs)]
    assert vi.custom_mask.dtype == torch.bool
    assert vi.custom_mask.numel() == n * int(seq_lens.sum()) + bs * n * n
    # Written in place into a (larger) captured buffer, as the graph needs.
    buf = torch.zeros(10_000, dtype=torch.uint8)
    vi2 = build_verify_input(
        tree, seq_lens, horizon=L, eagle_topk=2, seq_lens_sum=int(seq_lens.sum()), mask_buffer=buf
    )
    assert vi2.custom_mask is buf
    assert torch.equal(buf[: vi.custom_mask.numel()].bool(), vi.custom_mask)
    # The EagleVerifyInput CSR mask-size padding accepts it.
    assert vi.num_tokens_per_req == n

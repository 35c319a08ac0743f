"""CPU tests of the DDTREE SGLang plug-in against the real sglang 0.5.23 package.

Needs the package pip-installed (entry points): `pip install -e . --no-deps`.

Every start-up refusal of docs/plugin-design.md §2 is tested on both sides of its boundary (the
refused value and its accepted neighbour), through SGLang's own `handle_speculative_decoding`, so
removing a check or moving its boundary by one fails a test.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import replace
from importlib.metadata import entry_points
from types import SimpleNamespace

import pytest
import sglang  # noqa: F401  the CPU test environment installs sglang 0.5.23 (requirements-cpu.txt); never skip
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_spec.plugin import algorithm, config, hooks
from sglang_spec.plugin.config import (
    ENV_TOPK,
    ENV_TREE_TEMPERATURE,
    REFUSED_SWITCHES,
    DDTreeConfig,
    DDTreeConfigError,
)
from sglang_spec.tree import TreeMaskMode

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


def _draft_cfg(block_size):
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
        ("draft2", _draft_cfg(2)),
        ("draft1", _draft_cfg(1)),
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


@pytest.fixture
def unpatched(monkeypatch):
    """The installed SGLang as released (the CPU environment may carry `sglang-spec patch`)."""
    monkeypatch.setattr(config, "applied_patches", lambda: ())


def _resolve(models, *extra, draft="draft8", backend="flashinfer"):
    """prepare_server_args + handle_speculative_decoding, as launch does."""
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.arg_groups.speculative_hook import handle_speculative_decoding
    from sglang.srt.server_args import prepare_server_args

    args = ["--model-path", models["target"], "--device", "cuda"]
    args += ["--speculative-algorithm", "DDTREE"]
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
    assert eps[0].load() is algorithm.register


@pytest.mark.usefixtures("loaded")
def test_load_plugins_registers_ddtree():
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
    assert callable(algo.create_future_map)
    # Re-registration is a no-op, not an error.
    algorithm.register()


@pytest.mark.usefixtures("loaded")
def test_worker_class_loads(models):
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2
    from sglang.srt.speculative.eagle_info import EagleVerifyInput
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_spec.plugin.verify_input import DDTreeVerifyInput
    from sglang_spec.plugin.worker import DDTreeWorker

    _, sa = _resolve(models)
    cls = SpeculativeAlgorithm.from_string("DDTREE").create_worker(sa)
    assert cls is DDTreeWorker and issubclass(cls, DFlashWorkerV2)
    assert issubclass(DDTreeVerifyInput, EagleVerifyInput)


def test_register_failure_is_loud(monkeypatch, caplog):
    import sglang.srt.speculative.spec_info as si

    monkeypatch.setattr(algorithm, "_registered", False)

    def boom(*_args, **_kwargs):
        raise RuntimeError("simulated")

    monkeypatch.setattr(si.SpeculativeAlgorithm, "register", classmethod(boom))
    monkeypatch.setattr("sglang.srt.speculative.spec_registry.get_spec", lambda _name: None)
    with caplog.at_level("ERROR", logger="sglang_spec.plugin"):
        with pytest.raises(RuntimeError):
            algorithm.register()
    assert any("FAILED to register" in r.message for r in caplog.records)


def _graph_runner(algo_name, is_draft_worker, width=7):
    return SimpleNamespace(
        model_runner=SimpleNamespace(
            spec_algorithm=SimpleNamespace(name=algo_name), is_draft_worker=is_draft_worker
        ),
        buffers=SimpleNamespace(custom_mask=torch.zeros(64, dtype=torch.bool)),
        captured_req_width=width,
    )


@pytest.mark.usefixtures("loaded")
def test_cuda_graph_hook(monkeypatch):
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_spec.plugin import adapter
    from sglang_spec.plugin.verify_input import DDTreeVerifyInput

    assert adapter.GET_SPEC_INFO_TARGET in HookRegistry._patched
    sentinel = object()

    def upstream(_self, _num_tokens):
        return sentinel

    # DFLASH runners and DDTREE's drafter runner keep upstream's capture.
    assert hooks.get_spec_info_around(upstream, _graph_runner("DFLASH", False), 4) is sentinel
    assert hooks.get_spec_info_around(upstream, _graph_runner("DDTREE", True), 4) is sentinel
    # DDTREE's target runner captures a tree verify input over the graph's mask buffer.
    cfg = DDTreeConfig(block_size=16, verify_width=33, topk_per_depth=5, tree_temperature=1.0)
    monkeypatch.setattr(hooks, "runtime_config", lambda: cfg)
    runner = _graph_runner("DDTREE", False, width=33)
    vi = hooks.get_spec_info_around(upstream, runner, 2 * 33)
    assert isinstance(vi, DDTreeVerifyInput)
    assert vi.custom_mask is runner.buffers.custom_mask
    assert vi.draft_token_num == 33 and vi.spec_steps == 15 and vi.topk == 5
    assert vi.max_tree_depth == 16 and vi.tree_topk == -1 and vi.retrieve_index is None
    # A valid path table of the graph's shape (bs 2, width 33, depth L + 1 = 16): every node a
    # child of the root, on the mask buffer's device.
    paths = vi.retrieve_tree_paths
    assert paths.shape == (2, 33, 16) and paths.dtype == torch.int32
    assert paths.device == runner.buffers.custom_mask.device
    want = torch.full((33, 16), -1, dtype=torch.int32)
    want[:, 0] = 0
    want[1:, 1] = torch.arange(1, 33)
    assert torch.equal(paths[0], want) and torch.equal(paths[1], want)


def test_accept_index_fits_the_verify_width_below_the_horizon():
    """A budget below the drafter horizon (width 5, L = 15): eagle_sample's accept_index has
    ``max_tree_depth`` columns, and EAGLE's tree compaction refuses more columns than the width
    (the 0.5.22 H200 run crashed there with spec_steps = L)."""
    from sglang.srt.speculative.eagle_worker_common import _compact_accept_to_front

    from sglang_spec.plugin.verify_input import DDTreeVerifyInput, placeholder_paths

    for width, depth in ((5, 5), (16, 16), (17, 16), (65, 16)):
        cfg = DDTreeConfig(
            block_size=16, verify_width=width, topk_per_depth=4, tree_temperature=1.0
        )
        vi = DDTreeVerifyInput.create(
            cfg, width=width, custom_mask=None, paths=placeholder_paths(cfg, 2, width, "cpu")
        )
        assert vi.max_tree_depth == depth
        # patch 0002's per-bs graph buffer is spec_steps + 1 wide: the path table must match
        assert vi.retrieve_tree_paths.shape == (2, width, depth)
        bs = 2
        accept_index = torch.full((bs, vi.max_tree_depth), -1, dtype=torch.int32)
        accept_index[:, 0] = torch.arange(bs) * width
        x = torch.arange(bs * width)
        assert (
            _compact_accept_to_front(x, accept_index, bs, num_draft_tokens=width).shape == x.shape
        )


# ------------------------------------------------------------- the config


def test_config_properties():
    cfg = DDTreeConfig.build(block_size=16, verify_width=65, environ={})
    # K: the ranks that keep the chain-inclusive tree exact, budget - L + 1 (tree.exact_topk)
    assert (cfg.budget, cfg.horizon, cfg.topk_per_depth, cfg.tree_temperature) == (64, 15, 50, 0.75)
    assert cfg.eagle_topk == 50
    chain = DDTreeConfig.build(block_size=16, verify_width=16, environ={})
    assert (chain.topk_per_depth, chain.eagle_topk) == (1, 2)  # budget L: the tree is the chain
    assert DDTreeConfig.build(block_size=16, verify_width=9, environ={}).topk_per_depth == 8
    env = {ENV_TOPK: "1", ENV_TREE_TEMPERATURE: "0.5"}
    cfg = DDTreeConfig.build(block_size=16, verify_width=65, environ=env)
    assert (cfg.topk_per_depth, cfg.tree_temperature, cfg.eagle_topk) == (1, 0.5, 2)
    assert DDTreeConfig.build(block_size=4, verify_width=3, environ={ENV_TOPK: "2"}).eagle_topk == 2
    assert DDTreeConfig.build(block_size=4, verify_width=4, environ={ENV_TOPK: "3"}).eagle_topk == 3
    with pytest.raises(AttributeError):
        cfg.verify_width = 3  # frozen


def test_config_from_spec():
    spec = SimpleNamespace(speculative_dflash_block_size=8, speculative_num_draft_tokens=33)
    assert DDTreeConfig.from_spec(spec, environ={}) == DDTreeConfig(8, 33, 26, 0.75)
    for missing in ("speculative_dflash_block_size", "speculative_num_draft_tokens"):
        bad = SimpleNamespace(**{**vars(spec), missing: None})
        with pytest.raises(RuntimeError) as refused:
            DDTreeConfig.from_spec(bad, environ={})
        assert str(refused.value) == (
            "DDTREE: speculative_dflash_block_size / speculative_num_draft_tokens are unset in the "
            "spec config; handle_server_args did not run for this server."
        )
    # the environment it is given, not the process's
    assert DDTreeConfig.from_spec(spec, environ={ENV_TOPK: "4"}).topk_per_depth == 4


def test_runtime_config_reads_the_published_spec(monkeypatch):
    import sglang.srt.runtime_context as runtime_context

    spec = SimpleNamespace(speculative_dflash_block_size=4, speculative_num_draft_tokens=9)
    monkeypatch.setattr(runtime_context, "get_spec", lambda: spec)
    monkeypatch.delenv(ENV_TOPK, raising=False)
    monkeypatch.delenv(ENV_TREE_TEMPERATURE, raising=False)
    assert config.runtime_config() == DDTreeConfig(4, 9, 6, 0.75)  # K = budget 8 - L 3 + 1


def test_verify_widths(monkeypatch):
    monkeypatch.setattr(algorithm, "runtime_config", lambda: DDTreeConfig(16, 65, 64, 1.0))
    assert algorithm.get_num_tokens_per_req_for_target_verify(65, is_draft_worker=True) == 16
    assert algorithm.get_num_tokens_per_req_for_target_verify(65, is_draft_worker=False) == 65


# ------------------------------------------------------------- server args


@contextlib.contextmanager
def _plugin_log_messages():
    """The messages the plug-in logs at INFO and above, caught on its own logger
    (``prepare_server_args`` replaces the root logger's handlers, pytest's among them)."""
    log = logging.getLogger("sglang_spec.plugin")
    messages: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: messages.append(record.getMessage())
    level = log.level
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    try:
        yield messages
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


@pytest.mark.usefixtures("loaded")
def test_valid_defaults(models):
    with _plugin_log_messages() as messages:
        cfg, sa = _resolve(models, backend=None)
    assert messages == [
        "DDTREE: no attention backend given; using 'triton' (tree verify needs a per-request "
        "mask: one of ('flashinfer', 'fa3', 'triton'); 'triton' is the one DDTREE's greedy = AR "
        "checks ran with on a GPU).",
        # the default width is twice the block: the greedy chain (7 nodes) and 8 more, K = 15 - 7 + 1
        "DDTREE resolved: block_size=8 (horizon 7), budget=15, verify width=16, K per depth=9, "
        "tree temperature=0.75, simulated acceptance=None, attention=triton.",
    ]
    assert cfg.speculative_algorithm == "DDTREE"
    assert cfg.speculative_dflash_block_size == 8
    assert cfg.speculative_num_draft_tokens == 16  # budget = 2 * block - 1
    assert cfg.speculative_num_steps == 1
    assert cfg.speculative_eagle_topk == 9
    assert cfg.disable_overlap_schedule is False  # SGLang's overlap scheduler, as for DFLASH
    assert cfg.enable_mixed_chunk is False
    assert cfg.attention_backend == "triton"  # declared when none is given
    assert cfg.speculative_draft_attention_backend == "triton"  # declared, not the target's
    assert algorithm.resolve_max_speculative_num_draft_tokens(sa) == 16


@pytest.mark.usefixtures("loaded")
def test_the_drafter_runs_triton_unless_told_otherwise(models):
    """Upstream hands the drafter the target's backend; FA3 would read DDTREE's tree topk and
    verify width for the drafter's maskless block pass. An explicit choice is kept."""
    cfg, _ = _resolve(models, backend="fa3")
    assert (cfg.attention_backend, cfg.speculative_draft_attention_backend) == ("fa3", "triton")
    cfg, _ = _resolve(models, "--speculative-draft-attention-backend", "flashinfer", backend="fa3")
    assert cfg.speculative_draft_attention_backend == "flashinfer"


@pytest.mark.usefixtures("loaded")
def test_a_budget_at_the_horizon_is_said_to_be_the_chain(models):
    """Width = block (the reference's default budget, L): a chain-inclusive tree is the chain."""
    with _plugin_log_messages() as messages:
        cfg, _ = _resolve(models, "--speculative-num-draft-tokens", "8")
    assert messages[-1] == (
        "DDTREE: budget 7 = the drafter's horizon, so every tree is the drafter's greedy chain "
        "(what DFLASH verifies); for a tree give --speculative-num-draft-tokens above 8 (e.g. 32)."
    )
    assert cfg.speculative_num_draft_tokens == 8
    assert cfg.speculative_eagle_topk == 2  # K = 1 (the tree is the chain), tree mode kept


@pytest.mark.usefixtures("loaded")
def test_valid_budget(models, monkeypatch):
    monkeypatch.setenv(config.ENV_SIMULATE_ACC_LEN, "2.5")
    monkeypatch.setenv(ENV_TREE_TEMPERATURE, "0.5")
    with _plugin_log_messages() as messages:
        cfg, sa = _resolve(
            models, "--speculative-num-draft-tokens", "33", "--speculative-dflash-block-size", "8"
        )
    assert messages == [
        "DDTREE resolved: block_size=8 (horizon 7), budget=32, verify width=33, K per depth=26, "
        "tree temperature=0.5, simulated acceptance=2.5, attention=flashinfer."
    ]
    assert cfg.speculative_num_draft_tokens == 33
    assert cfg.speculative_dflash_block_size == 8
    assert cfg.speculative_eagle_topk == 26
    assert algorithm.resolve_max_speculative_num_draft_tokens(sa) == 33


# Listed here, not taken from config.REFUSED_SWITCHES, so that dropping a switch there fails.
REFUSED_FLAGS = (
    "--speculative-use-rejection-sampling",
    "--enable-dp-attention",
    "--enable-two-batch-overlap",
    "--enable-pdmux",
    "--enable-multi-layer-eagle",
    "--enable-linear-replayssm",
    "--enable-lora",
)


def test_refused_flags_cover_the_switch_table():
    assert {"--" + f.replace("_", "-") for f, _ in REFUSED_SWITCHES} == set(REFUSED_FLAGS)


@pytest.mark.usefixtures("loaded")
@pytest.mark.parametrize("flag", REFUSED_FLAGS)
def test_refused_switches(models, flag):
    with pytest.raises(DDTreeConfigError, match=f"does not support {flag} "):
        _resolve(models, flag)


# (refused: extra args, _resolve kwargs, the whole message) -- (accepted neighbour: extra args,
# kwargs). A message is compared whole, `{name}` standing for the path of models[name]: each one
# names the flag, the value and what is valid.
WIDTH_VALID = "valid: 2..1024."
BACKEND_VALID = "valid: flashinfer, fa3, triton."
BOUNDARIES = {
    "draft path": (
        (
            (),
            {"draft": None},
            "DDTREE requires --speculative-draft-model-path (a DFlash drafter); none was given.",
        ),
        ((), {}),
    ),
    "pp size": (
        (
            ("--pp-size", "2"),
            {},
            "DDTREE supports only --pp-size 1 (no pipeline parallelism); got --pp-size 2.",
        ),
        (("--pp-size", "1"), {}),
    ),
    "threshold single": (
        (
            ("--speculative-accept-threshold-single", "0.99"),
            {},
            "DDTREE does not support --speculative-accept-threshold-single=0.99: thresholds below "
            "1 are lossy; valid: 1.0 (the default).",
        ),
        (("--speculative-accept-threshold-single", "1.0"), {}),
    ),
    "threshold acc": (
        (
            ("--speculative-accept-threshold-acc", "0.99"),
            {},
            "DDTREE does not support --speculative-accept-threshold-acc=0.99: thresholds below 1 "
            "are lossy; valid: 1.0 (the default).",
        ),
        (("--speculative-accept-threshold-acc", "1.0"), {}),
    ),
    "draft window": (
        (
            ("--speculative-draft-window-size", "1"),
            {},
            "DDTREE does not support --speculative-draft-window-size=1 (a compact drafter KV "
            "cache); leave it unset.",
        ),
        ((), {}),
    ),
    "PD disaggregation": (
        (
            ("--disaggregation-mode", "prefill"),
            {},
            "DDTREE does not support PD disaggregation: --disaggregation-mode prefill; valid: null "
            "(the default).",
        ),
        (("--disaggregation-mode", "null"), {}),
    ),
    "block flag <= 0": (
        (
            ("--speculative-dflash-block-size", "0"),
            {},
            "--speculative-dflash-block-size=0 must be a positive integer (the drafter's block "
            "size).",
        ),
        (("--speculative-dflash-block-size", "8"), {}),
    ),
    # 1 is positive: it passes the flag check and meets the block >= 2 one
    "block flag 1": (
        (
            ("--speculative-dflash-block-size", "1"),
            {"draft": "draft1"},
            "DDTREE needs a drafter block size >= 2 (a horizon of at least one depth); got block "
            "size 1.",
        ),
        (("--speculative-dflash-block-size", "2"), {"draft": "draft2"}),
    ),
    "block flag above the drafter's": (
        (
            ("--speculative-dflash-block-size", "9"),
            {},
            "--speculative-dflash-block-size=9 disagrees with the drafter config's block_size=8; "
            "valid: 8 (the drafter was trained for it).",
        ),
        (("--speculative-dflash-block-size", "8"), {}),
    ),
    "block flag below the drafter's": (
        (
            ("--speculative-dflash-block-size", "7"),
            {},
            "--speculative-dflash-block-size=7 disagrees with the drafter config's block_size=8; "
            "valid: 8 (the drafter was trained for it).",
        ),
        (("--speculative-dflash-block-size", "8"), {}),
    ),
    "block unknown": (
        (
            (),
            {"draft": "draft_noblock"},
            "DDTREE could not determine the drafter block size: the drafter config has no "
            "block_size; pass --speculative-dflash-block-size B.",
        ),
        (("--speculative-dflash-block-size", "8"), {"draft": "draft_noblock"}),
    ),
    "block < 2": (
        (
            (),
            {"draft": "draft1"},
            "DDTREE needs a drafter block size >= 2 (a horizon of at least one depth); got block "
            "size 1.",
        ),
        ((), {"draft": "draft2"}),
    ),
    "budget < 1": (
        (
            ("--speculative-num-draft-tokens", "1"),
            {"draft": "draft2"},
            "--speculative-num-draft-tokens=1 leaves no draft node: it is the verify width 1 + "
            f"budget and the budget must be >= 1; {WIDTH_VALID}",
        ),
        (("--speculative-num-draft-tokens", "2"), {"draft": "draft2"}),
    ),
    # (the default --mamba-track-interval 256 would refuse both: see the mamba case)
    "width > 1024": (
        (
            ("--speculative-num-draft-tokens", "1025", "--mamba-track-interval", "2048"),
            {},
            "--speculative-num-draft-tokens=1025 exceeds the tree kernels' limit of 1024 tokens "
            f"(budget 1024 > 1023); {WIDTH_VALID}",
        ),
        (("--speculative-num-draft-tokens", "1024", "--mamba-track-interval", "1024"), {}),
    ),
    "decode backend": (
        (
            (),
            {"backend": "torch_native"},
            "DDTREE tree verify needs an attention backend that takes a per-request tree mask; "
            f"got 'torch_native'; {BACKEND_VALID}",
        ),
        ((), {"backend": "triton"}),
    ),
    "decode backend (trtllm)": (
        (
            (),
            {"backend": "trtllm_mha"},
            "DDTREE tree verify needs an attention backend that takes a per-request tree mask; "
            f"got 'trtllm_mha'; {BACKEND_VALID}",
        ),
        ((), {"backend": "fa3"}),
    ),
    "prefill backend": (
        (
            ("--prefill-attention-backend", "torch_native"),
            {},
            "DDTREE tree verify needs the prefill attention backend to take a per-request tree "
            f"mask too; got --prefill-attention-backend 'torch_native'; {BACKEND_VALID}",
        ),
        (("--prefill-attention-backend", "triton"), {}),
    ),
    "page size": (
        (
            ("--page-size", "2"),
            {},
            "DDTREE requires --page-size 1 (accepted tree nodes are compacted token by token in "
            "the KV cache); got --page-size 2.",
        ),
        (("--page-size", "1"), {}),
    ),
    "unified memory": (
        (
            ("--enable-unified-memory",),
            {},
            "DDTREE does not support --enable-unified-memory; run without it.",
        ),
        ((), {}),
    ),
    "mamba track interval": (
        (
            ("--mamba-track-interval", "15"),  # the default width, 2 x block 8
            {},
            "--mamba-track-interval=15 is below the DDTREE verify width 16; valid: >= 16 (hybrid "
            "linear-attention targets).",
        ),
        (("--mamba-track-interval", "16"), {}),
    ),
    "drafter not DFlash": (
        (
            (),
            {"draft": "target"},
            "DDTREE needs a DFlash drafter; --speculative-draft-model-path='{target}' declares "
            "architectures=['Qwen3ForCausalLM'].",
        ),
        ((), {}),
    ),
    # (SGLang itself reads the drafter config first, without the override arguments)
    "drafter config unreadable": (
        (
            ("--json-model-override-args", "{bad"),
            {},
            "DDTREE could not read the DFlash drafter config at "
            "--speculative-draft-model-path='{draft8}': JSONDecodeError: Expecting property name "
            "enclosed in double quotes: line 1 column 2 (char 1)",
        ),
        (("--json-model-override-args", "{}"), {}),
    ),
}


@pytest.mark.usefixtures("loaded", "unpatched")
@pytest.mark.parametrize("case", list(BOUNDARIES))
def test_refusal_boundaries(models, case):
    (bad_args, bad_kw, msg), (good_args, good_kw) = BOUNDARIES[case]
    with pytest.raises(DDTreeConfigError) as refused:
        _resolve(models, *bad_args, **bad_kw)
    assert str(refused.value) == msg.format(**models)
    cfg, _ = _resolve(models, *good_args, **good_kw)
    assert cfg.speculative_algorithm == "DDTREE"


@pytest.mark.usefixtures("loaded", "unpatched")
def test_small_width_needs_the_reserve_patch(models, monkeypatch):
    # B = 8: the unpatched reserve 2N must cover the block, so N = 4 is the smallest width.
    with pytest.raises(DDTreeConfigError) as refused:
        _resolve(models, "--speculative-num-draft-tokens", "3")
    assert str(refused.value) == (
        "--speculative-num-draft-tokens=3 is too small for drafter block size 8: SGLang 0.5.23 "
        "reserves 2*speculative_num_draft_tokens KV slots per request per decode step "
        "(dflash_info_v2.py:147) and the draft block needs 8; valid: >= 4, or any width after "
        "`sglang-spec patch apply` (patches/0.5.23/0001, docs/plugin-design.md P3)."
    )
    cfg, _ = _resolve(models, "--speculative-num-draft-tokens", "4")
    assert cfg.speculative_num_draft_tokens == 4
    monkeypatch.setattr(config, "applied_patches", lambda: (config.RESERVE_PATCH,))
    cfg, _ = _resolve(models, "--speculative-num-draft-tokens", "3")
    assert cfg.speculative_num_draft_tokens == 3 and cfg.speculative_dflash_block_size == 8


@pytest.mark.usefixtures("loaded", "unpatched")
def test_linear_replayssm_spec_needs_the_gdn_tree_patches(models, monkeypatch):
    flag = "--enable-linear-replayssm-spec"
    with pytest.raises(DDTreeConfigError, match=f"{flag} needs the GDN tree patches .*0002.*0003"):
        _resolve(models, flag)
    # the series of a release whose patch set has only P3 (0.5.22), applied: still refused
    monkeypatch.setattr(config, "applied_patches", lambda: (config.RESERVE_PATCH,))
    with pytest.raises(DDTreeConfigError, match="run `sglang-spec patch apply`"):
        _resolve(models, flag)
    monkeypatch.setattr(
        config, "applied_patches", lambda: (config.RESERVE_PATCH, config.GDN_TREE_PATCHES[1])
    )
    with pytest.raises(DDTreeConfigError, match="patches 0002-gdn-tree-replayssm-verify.patch ap"):
        _resolve(models, flag)
    monkeypatch.setattr(
        config, "applied_patches", lambda: (config.RESERVE_PATCH, *config.GDN_TREE_PATCHES)
    )
    cfg, _ = _resolve(models, flag)
    assert cfg.enable_linear_replayssm_spec is True and cfg.speculative_eagle_topk == 9
    cfg, _ = _resolve(models, flag, "--linear-attn-verify-backend", "triton")
    assert cfg.speculative_algorithm == "DDTREE"
    # the tree verify is the Triton kernel: an explicit FlashInfer verify, or the one SGLang
    # derives from a FlashInfer decode backend, is refused
    for extra in (
        ("--linear-attn-verify-backend", "flashinfer"),
        ("--linear-attn-decode-backend", "flashinfer"),
    ):
        with pytest.raises(DDTreeConfigError, match="verify-backend='flashinfer'; valid: triton"):
            _resolve(models, flag, *extra)
    # the GDN tree kernel's widest tree (triton_tree_wy.MAX_WY_NODES): 256 passes, 257 is refused
    # with the flag and passes without it (past 256 the mamba track interval must grow too)
    cfg, _ = _resolve(models, flag, "--speculative-num-draft-tokens", "256")
    assert cfg.speculative_num_draft_tokens == 256
    wide = ("--speculative-num-draft-tokens", "257", "--mamba-track-interval", "512")
    with pytest.raises(DDTreeConfigError, match="at most 256 tokens per request .* width of 257"):
        _resolve(models, flag, *wide)
    assert _resolve(models, *wide)[0].speculative_num_draft_tokens == 257
    # without the flag nothing about the patches is asked
    monkeypatch.setattr(config, "applied_patches", lambda: ())
    assert _resolve(models)[0].enable_linear_replayssm_spec is False


def test_the_replayssm_tree_width_is_the_wy_kernels_limit():
    from sglang_spec.gdn import tree_replayssm, triton_tree_wy

    assert tree_replayssm.MAX_TREE_WIDTH == triton_tree_wy.MAX_WY_NODES


def test_applied_patches_only_when_the_installed_state_is_applied(monkeypatch):
    """The series counts only when every file of the installed tree is patched; a partial,
    foreign or unreadable tree counts as nothing applied."""
    from types import SimpleNamespace

    from sglang_spec.patching import core

    series = ("0001-a.patch", "0002-b.patch")
    monkeypatch.setattr(core, "locate", lambda _d: "tree")
    monkeypatch.setattr(core, "detect_version", lambda _t: ("0.5.23", "file"))
    monkeypatch.setattr(core, "load_patch_set", lambda _d, _v: SimpleNamespace(series=list(series)))
    for state in (core.APPLIED, core.NOT_APPLIED, core.PARTIAL, core.FOREIGN):
        monkeypatch.setattr(
            core, "inspect_state", lambda _t, _p, s=state: SimpleNamespace(overall=s)
        )
        assert config.applied_patches() == (series if state == core.APPLIED else ())

    def unreadable(_d):
        raise core.PatchingError("no SGLang install found")

    monkeypatch.setattr(core, "locate", unreadable)
    assert config.applied_patches() == ()


@pytest.mark.usefixtures("loaded")
def test_topk_env(models, monkeypatch):
    # budget 16, horizon 7: K in 1..16, by default the 10 ranks an exact chain-inclusive tree needs
    for k, eagle_topk in (("1", 2), ("4", 4), ("16", 16), ("", 10)):
        monkeypatch.setenv(ENV_TOPK, k)
        cfg, _ = _resolve(models, "--speculative-num-draft-tokens", "17")
        assert cfg.speculative_eagle_topk == eagle_topk  # tree mode stays on at K = 1
    for bad, msg in (("0", "=0 is out of range"), ("17", "=17 is out of range"), ("x", "'x'")):
        monkeypatch.setenv(ENV_TOPK, bad)
        with pytest.raises(DDTreeConfigError, match=f"{msg}.*valid: 1..budget=16"):
            _resolve(models, "--speculative-num-draft-tokens", "17")


@pytest.mark.usefixtures("loaded")
def test_tree_temperature_env(models, monkeypatch):
    """The tree temperature server option: resolved in the launcher (the value it logs), 0.75 when
    unset or empty, and refused with one line naming the value before any model loads."""
    resolved = []
    # prepare_server_args resets the root logger's handlers, so listen on the plug-in's logger
    monkeypatch.setattr(config.logger, "info", lambda msg, *a: resolved.append(msg % a))
    for raw, want in (("0.5", 0.5), ("1e-3", 0.001), ("", 0.75), (None, 0.75)):
        if raw is None:
            monkeypatch.delenv(ENV_TREE_TEMPERATURE, raising=False)
        else:
            monkeypatch.setenv(ENV_TREE_TEMPERATURE, raw)
        resolved.clear()
        _resolve(models)
        (line,) = [m for m in resolved if m.startswith("DDTREE resolved")]
        assert f"tree temperature={want:g}," in line
    assert config.parse_tree_temperature(None) == config.parse_tree_temperature(" ") == 0.75
    for bad in ("0", "-2", "nan", "inf", "warm"):
        monkeypatch.setenv(ENV_TREE_TEMPERATURE, bad)
        with pytest.raises(DDTreeConfigError) as refused:
            _resolve(models)
        assert str(refused.value) == (
            f"SGLANG_DDTREE_TREE_TEMPERATURE={bad!r} is not valid: the tree temperature must be a "
            "finite number > 0 (1 = the drafter's own distribution, < 1 sharpens it; default 0.75)."
        )


@pytest.mark.usefixtures("loaded")
def test_block_verification_never_reaches_ddtree(models):
    """SGLang itself refuses block verification for DDTREE (speculative_hook.py:175), so the
    plug-in has no check of its own; this pins that upstream behaviour."""
    with pytest.raises(ValueError, match="block-verification only supports"):
        _resolve(models, "--speculative-use-block-verification")


def _budget_file(tmp_path, cost_ms, name="budgets.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"cost_ms": cost_ms}))
    return str(path)


@pytest.mark.usefixtures("loaded")
def test_budget_by_batch_size_server_args(models, tmp_path, monkeypatch):
    """--speculative-adaptive + --speculative-adaptive-config: SGLang resolves its EAGLE-only
    adaptive mode off, DDTREE reads the flag as given, sizes the server for the largest candidate
    and carries the file to the scheduler, whose config follows the width a capture overrides."""
    path = _budget_file(tmp_path, {"1": {"7": 30, "31": 40}, "8": {"3": 40, "7": 45}})
    adaptive = ("--speculative-adaptive", "--speculative-adaptive-config", path)
    monkeypatch.setenv(ENV_TOPK, "16")
    for extra in ((), ("--speculative-num-draft-tokens", "32")):
        cfg, _ = _resolve(models, *adaptive, *extra)
        assert cfg.speculative_adaptive is False  # SGLang's own mode stays off
        assert (cfg.speculative_num_draft_tokens, cfg.speculative_adaptive_config) == (32, path)
        assert cfg.speculative_eagle_topk == 16
    server = DDTreeConfig.from_spec(cfg)
    assert (server.verify_width, server.topk_per_depth, server.adaptive_config) == (32, 16, path)
    with_width = SimpleNamespace(
        **{
            **vars(
                SimpleNamespace(
                    **{
                        k: getattr(cfg, k)
                        for k in ("speculative_dflash_block_size", "speculative_adaptive_config")
                    }
                )
            ),
            "speculative_num_draft_tokens": 8,
        }
    )
    small = DDTreeConfig.from_spec(with_width)  # K 16 at budget 7 = L: capped at the chain's 1
    assert small == server.for_budget(7)
    assert (small.verify_width, small.topk_per_depth, small.adaptive_config) == (8, 1, path)
    # off: no file carried, the width as given
    monkeypatch.delenv(ENV_TOPK)
    cfg, _ = _resolve(models, "--speculative-num-draft-tokens", "32")
    assert cfg.speculative_adaptive_config is None
    assert DDTreeConfig.from_spec(cfg).adaptive_config is None


@pytest.mark.usefixtures("loaded")
def test_budget_by_batch_size_refusals(models, tmp_path):
    path = _budget_file(tmp_path, {"1": {"7": 30, "31": 40}})
    cases = [
        (("--speculative-adaptive",), "--speculative-adaptive needs --speculative-adaptive-config"),
        (
            ("--speculative-adaptive-config", path),
            "--speculative-adaptive-config='.*' is given without --speculative-adaptive",
        ),
        (
            (
                "--speculative-adaptive",
                "--speculative-adaptive-config",
                path,
                "--speculative-num-draft-tokens",
                "31",
            ),
            "--speculative-num-draft-tokens=31 disagrees .* needs verify width 32; valid: 32",
        ),
        (
            ("--speculative-adaptive", "--speculative-adaptive-config", str(tmp_path / "no.json")),
            "--speculative-adaptive-config='.*no.json': cannot read a JSON config",
        ),
        (
            (
                "--speculative-adaptive",
                "--speculative-adaptive-config",
                _budget_file(tmp_path, {"1": {"7": 0}}, "zero.json"),
            ),
            r"cost_ms\['1'\]\['7'\]=0 is not valid",
        ),
    ]
    for extra, msg in cases:
        with pytest.raises(DDTreeConfigError, match=msg) as e:
            _resolve(models, *extra)
        assert "\n" not in str(e.value)
    for budget, ok in ((1023, True), (1024, False)):
        big = _budget_file(tmp_path, {"1": {str(budget): 1}}, f"{budget}.json")
        if ok:
            assert config.load_budget_policy(big).budgets == (budget,)
        else:
            with pytest.raises(
                DDTreeConfigError, match="budget 1024 exceeds .* valid budgets: 1..1023"
            ):
                config.load_budget_policy(big)


# ------------------------------------------------------- decode-step pieces


@pytest.mark.usefixtures("loaded")
def test_overlap_scheduling_is_supported_and_left_to_the_user(models):
    """DDTREE registers with overlap support (SGLang refuses overlap for an algorithm without it,
    and calls non-overlap plug-ins deprecated); --disable-overlap-schedule still turns it off."""
    from sglang.srt.speculative.spec_registry import get_spec

    assert get_spec("DDTREE").supports_overlap is True
    cfg, _ = _resolve(models, "--disable-overlap-schedule")
    assert cfg.disable_overlap_schedule is True


@pytest.mark.usefixtures("loaded")
def test_verify_input_from_tree():
    from sglang_spec import tree as tree_mod
    from sglang_spec.plugin.verify_input import verify_input_from_tree

    torch.manual_seed(0)
    bs, L, V, budget = 2, 4, 50, 6
    logits = torch.randn(bs, L, V)
    roots = torch.tensor([3, 7])
    tree = tree_mod.build_ddtree(logits, budget, roots)
    n = budget + 1
    cfg = DDTreeConfig(block_size=L + 1, verify_width=n, topk_per_depth=3, tree_temperature=1.0)
    seq_lens = torch.tensor([5, 9])
    total = int(seq_lens.sum())
    vi = verify_input_from_tree(tree, seq_lens, cfg, seq_lens_sum=total, with_paths=True)
    abi = tree_mod.sglang_tree_abi(tree, seq_lens, seq_lens_sum=total)
    assert vi.draft_token_num == n and vi.max_tree_depth == L + 1 and vi.tree_topk == -1
    # without the GDN tree ReplaySSM nothing reads the path table: it is not built
    no_paths = verify_input_from_tree(tree, seq_lens, cfg, seq_lens_sum=total)
    assert no_paths.retrieve_tree_paths is None
    assert vi.topk == 3 and vi.seq_lens_sum == total
    for f in ("retrieve_index", "retrieve_next_token", "retrieve_next_sibling"):
        t = getattr(vi, f)
        assert t.shape == (bs, n) and t.dtype == torch.int64
        assert torch.equal(t, getattr(abi, f))
    assert torch.equal(vi.draft_token, abi.draft_tokens) and vi.draft_token.shape == (bs * n,)
    assert torch.equal(vi.positions, abi.positions) and vi.positions.dtype == torch.int64
    assert torch.equal(vi.draft_token.view(bs, n)[:, 0], roots)
    assert vi.retrieve_index.tolist() == [[b * n + i for i in range(n)] for b in range(bs)]
    assert vi.custom_mask.dtype == torch.bool
    assert vi.custom_mask.numel() == n * total + bs * n * n
    assert torch.equal(vi.custom_mask, abi.tree_mask)
    assert vi.num_tokens_per_req == n and vi.is_verify_input()
    # The GDN tree verify's path table (patch 0002): node i's root-first path, -1 padded, read
    # off the tree's parents here independently of sglang_spec.gdn.tree_paths.
    paths = vi.retrieve_tree_paths
    assert paths.shape == (bs, n, L + 1) and paths.dtype == torch.int32
    assert paths.device == tree.parents.device
    for b in range(bs):
        for i in range(n):
            want = [i]
            while tree.parents[b, want[-1]] >= 0:
                want.append(int(tree.parents[b, want[-1]]))
            want = want[::-1]
            assert paths[b, i].tolist() == want + [-1] * (L + 1 - len(want)), (b, i)
    assert max(int(d) for d in tree.depths.flatten()) >= 2  # paths longer than root + node
    # the target's hidden states of every verified token, which the drafter's context takes
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

    assert vi.capture_hidden_mode == CaptureHiddenMode.FULL
    # the host copies the caller has reach the input and the ABI (no host sync to form them) ...
    cpu_lens = seq_lens.clone()
    seen = {}

    def abi_spy(*args, **kwargs):
        seen.update(kwargs)
        return tree_mod.sglang_tree_abi(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sglang_spec.plugin.verify_input.sglang_tree_abi", abi_spy)
        vi3 = verify_input_from_tree(tree, seq_lens, cfg, seq_lens_sum=total, seq_lens_cpu=cpu_lens)
    assert seen["seq_lens_sum"] == total and vi3.seq_lens_cpu is cpu_lens
    # ... and another mask layout is what the backend asked for (per request N x N)
    qlen = verify_input_from_tree(
        tree, seq_lens, cfg, mask_mode=int(tree_mod.TreeMaskMode.QLEN_ONLY), seq_lens_sum=total
    )
    assert qlen.custom_mask.numel() == bs * n * n
    assert torch.equal(
        qlen.custom_mask,
        tree_mod.sglang_tree_abi(tree, seq_lens, mode=tree_mod.TreeMaskMode.QLEN_ONLY).tree_mask,
    )
    # Written in place into a (larger) captured buffer, as the graph needs ...
    buf = torch.zeros(10_000, dtype=torch.uint8)
    vi2 = verify_input_from_tree(tree, seq_lens, cfg, seq_lens_sum=total, mask_buffer=buf)
    assert vi2.custom_mask is buf
    assert torch.equal(buf[: vi.custom_mask.numel()].bool(), vi.custom_mask)
    # ... without the host-side sum, which SGLang's overlap scheduler does not provide ...
    buf.zero_()
    vi4 = verify_input_from_tree(tree, seq_lens, cfg, seq_lens_sum=None, mask_buffer=buf)
    assert vi4.custom_mask is buf and torch.equal(
        buf[: vi.custom_mask.numel()].bool(), abi.tree_mask
    )
    assert not buf[vi.custom_mask.numel() :].any()
    # ... and never past the end of one too small for it.
    small = torch.zeros(vi.custom_mask.numel() - 1, dtype=torch.uint8)
    with pytest.raises(ValueError, match=rf"^out holds {small.numel()} mask entries; this batch's"):
        verify_input_from_tree(tree, seq_lens, cfg, mask_buffer=small)
    assert not small.any()
    with pytest.raises(
        ValueError, match=r"^out must be a flat buffer of torch.bool or torch.uint8"
    ):
        verify_input_from_tree(tree, seq_lens, cfg, mask_buffer=torch.zeros(10_000))


STAGES = ("draft", "topk", "tree", "verify", "walk", "commit", "append_context")


def _decode_batch(spec_info, bs):
    return SimpleNamespace(
        forward_mode=SimpleNamespace(is_extend=lambda: False, is_idle=lambda: False),
        is_extend_in_batch=False,
        spec_info=spec_info,
        seq_lens=torch.zeros(bs, dtype=torch.int64),
    )


def _extend_batch(bs, extend_lens):
    return SimpleNamespace(
        forward_mode=SimpleNamespace(is_extend=lambda: True, is_idle=lambda: False),
        is_extend_in_batch=False,
        extend_lens=extend_lens,
        spec_info=None,
        seq_lens=torch.zeros(bs, dtype=torch.int64),
    )


@pytest.mark.usefixtures("loaded")
@pytest.mark.parametrize("mode", [None, TreeMaskMode.QLEN_ONLY])
def test_every_candidate_budget_lays_out_a_tree_at_start_up(tmp_path, monkeypatch, mode):
    """An adaptive server lays out one tree at each candidate budget before serving, in the
    target backend's mask mode (FULL_MASK without a VerifyMask) and with the GDN path table when
    ReplaySSM verifies: the eager Triton layout kernel then compiles once per width at start-up,
    where session 23's 27B server compiled it inside served levels (0.3-0.4 s each)."""
    from sglang_spec.plugin import adapter
    from sglang_spec.plugin import worker as worker_mod

    w, _ = _staged_worker([])
    path = _budget_file(tmp_path, {"1": {"3": 10, "7": 11}, "8": {"15": 12}})
    w.config = DDTreeConfig(8, 16, 4, 1.0, adaptive_config=path)  # horizon 7
    monkeypatch.setattr(adapter, "decode_cuda_graph_bs", lambda: [1, 2, 4, 8])
    monkeypatch.setattr(worker_mod, "get_parallel", lambda: SimpleNamespace(tp_rank=0))
    w.init_budgets()
    vm = None if mode is None else SimpleNamespace(mode=int(mode))
    w._target_worker = SimpleNamespace(
        model_runner=SimpleNamespace(attn_backend=SimpleNamespace(verify_mask=vm))
    )
    w.server_args = SimpleNamespace(enable_linear_replayssm_spec=True)
    laid = []
    real = worker_mod.verify_input_from_tree

    def record(tree, seq_lens, config, **kw):
        laid.append((tree.width, config.verify_width, kw["mask_mode"], kw["with_paths"]))
        return real(tree, seq_lens, config, **kw)

    monkeypatch.setattr(worker_mod, "verify_input_from_tree", record)
    w.warm_tree_layouts()
    want = TreeMaskMode.FULL_MASK if mode is None else mode
    assert sorted(laid) == [(n, n, want, True) for n in (4, 8, 16)]


def test_every_candidate_budget_warms_the_compaction_lookups_at_start_up(tmp_path, monkeypatch):
    """The tree compaction's slot lookups are warmed for every candidate budget's width and both
    accept widths (the walk's max_depth + 1, simulated acceptance's horizon + 1), up to the
    target's running-request cap (the CUDA-graph batch sizes when it is unset); a fixed-budget
    server warms its one width; nothing runs on a CPU device."""
    from sglang_spec.plugin import adapter
    from sglang_spec.plugin import worker as worker_mod

    warmed = []
    monkeypatch.setattr(
        adapter, "warm_accept_compaction", lambda shapes, bs, _dev: warmed.append((shapes, bs))
    )
    monkeypatch.setattr(adapter, "decode_cuda_graph_bs", lambda: [1, 2, 4, 8])
    monkeypatch.setattr(worker_mod, "get_parallel", lambda: SimpleNamespace(tp_rank=0))
    w, _ = _staged_worker([])
    w.device = torch.device("cuda")  # the launches themselves are replaced above
    w.config = DDTreeConfig(block_size=16, verify_width=8, topk_per_depth=4, tree_temperature=1.0)
    w._target_worker = SimpleNamespace(model_runner=SimpleNamespace(max_running_requests=44))
    w.warm_accept_compaction()  # budget 7 below horizon 15: depth 7
    assert warmed.pop() == ([(8, 8), (8, 16)], 44)
    path = _budget_file(tmp_path, {"1": {"3": 10, "7": 11}, "8": {"15": 12}})
    w.config = DDTreeConfig(8, 16, 4, 1.0, adaptive_config=path)  # horizon 7
    w.init_budgets()
    w._target_worker.model_runner.max_running_requests = None
    w.warm_accept_compaction()  # budgets 3, 7, 15: widths 4, 8, 16, depths 3, 7, 7
    assert warmed.pop() == ([(4, 4), (4, 8), (8, 8), (16, 8)], 8)
    w.device = torch.device("cpu")
    w.warm_accept_compaction()
    assert warmed == []


def _staged_worker(calls, tick=None):
    """A DDTreeWorker without SGLang runners: each stage records its call (and ``tick``s the fake
    clocks of a timing test) and returns a token."""
    from sglang_spec.plugin.worker import Committed, DDTreeWorker, DraftOutput, Verified, Walked

    worker = object.__new__(DDTreeWorker)
    worker.config = DDTreeConfig(
        block_size=4, verify_width=5, topk_per_depth=4, tree_temperature=1.0
    )
    worker.device = torch.device("cpu")
    worker.context_append = None  # __init__'s; these workers stub append_context_stage
    out = SimpleNamespace(hidden_states=torch.zeros(2, 3))
    verified = Verified(
        logits_output=out, forward_batch="fb", can_run_cuda_graph=True, grammar_mask=None
    )
    walked = Walked(torch.arange(10), torch.tensor([2, 1]), torch.zeros(2, 4, dtype=torch.long))
    committed = Committed(
        torch.arange(10) + 1, torch.tensor([9, 8]), torch.tensor([5, 6]), torch.tensor([7, 7])
    )
    results = {
        "draft": DraftOutput(
            hidden=torch.zeros(2, 4, 3),
            root_tokens=torch.tensor([1, 2]),
            ran_as_graph=True,
            window=torch.zeros(2, 5, dtype=torch.long),
            kv_loc_plan="plan",
        ),
        "topk": "tree",
        "tree": "verify_input",
        "verify": verified,
        "walk": walked,
        "commit": committed,
        "append_context": None,
    }

    def stage(name):
        def run(*args):
            calls.append((name, args))
            if tick is not None:
                tick(name)
            return results[name]

        return run

    for name in STAGES:
        setattr(worker, f"{name}_stage", stage(name))
    return worker, results


@pytest.mark.usefixtures("loaded")
def test_decode_step_runs_the_stages_in_order():
    from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2

    calls = []
    worker, r = _staged_worker(calls)
    batch = _decode_batch(DFlashDraftInputV2.create_idle_input(device="cpu"), bs=2)
    published = []
    res = worker.forward_batch_generation(batch, on_publish=published.append, grammar_barrier="gb")
    assert [name for name, _ in calls] == list(STAGES)
    args = dict(calls)
    assert args["draft"] == (batch, batch.spec_info)
    assert args["topk"] == (r["draft"],)
    assert args["tree"] == (batch, "tree")
    assert args["verify"] == (batch, "verify_input", r["draft"], "gb")
    assert args["walk"] == (batch, "tree", "verify_input", r["verify"])
    assert args["commit"] == (batch, r["verify"], r["walk"], published.append)
    assert args["append_context"] == (batch, r["verify"], r["walk"], r["commit"])
    assert res.next_token_ids is r["commit"].predict
    assert res.accept_lens is r["walk"].accept_lens and res.accept_index is r["walk"].accept_index
    assert res.new_seq_lens is r["commit"].new_seq_lens
    assert torch.equal(res.next_draft_input.bonus_tokens, r["commit"].bonus)
    assert res.speculative_num_draft_tokens == 5 and res.can_run_cuda_graph is True
    assert res.extra_keep_alive_refs == ["fb"]
    assert res.logits_output.hidden_states is None  # not kept past the step


class NoHostBuiltTensors(torch.overrides.TorchFunctionMode):
    """Fails on a tensor built from host data (``torch.tensor``, ``as_tensor``, ``from_numpy``)
    inside a decode step: on CUDA each is a host-to-device copy from pageable memory, which waits
    for the GPU and so undoes overlap scheduling. Session 12's adaptive server built the budgets
    it measures this way in every step and left the H200 idle 1.8-3.2 ms between steps."""

    BANNED = {"tensor", "as_tensor", "from_numpy"}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", None) in self.BANNED:
            raise AssertionError(f"torch.{func.__name__} inside a decode step")
        return func(*args, **(kwargs or {}))


@pytest.mark.usefixtures("loaded")
def test_budget_by_batch_size_switches_the_verify_width(tmp_path, monkeypatch, caplog):
    """Each decode step runs at the controller's budget for its batch size: the target's verify
    state (per-width backend and graphs, built once per candidate) and the config switch to it, the
    step measures every nested budget on the device, and the scheduler's CPU hook feeds tau."""
    from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    from sglang_spec.plugin import adapter
    from sglang_spec.plugin import worker as worker_mod

    path = _budget_file(tmp_path, {"1": {"3": 10, "4": 11}, "4": {"3": 10}, "8": {"4": 12}})
    cfg = json.loads(open(path).read())
    # every step measured (one step in measure_interval: the next test)
    open(path, "w").write(
        json.dumps({**cfg, "warmup_steps": 1, "probe_interval": 0, "measure_interval": 1})
    )
    calls = []
    w, r = _staged_worker(calls)
    w.config = DDTreeConfig(4, 5, 4, 1.0, adaptive_config=path)  # horizon 3, budgets 3 and 4
    w._target_worker = SimpleNamespace(  # BaseSpecWorker.target_worker's storage
        model_runner=SimpleNamespace(attn_backend="backend5", decode_cuda_graph_runner="graphs5")
    )
    built = []

    def build(worker, width, graph_bs):
        assert worker is w
        built.append((width, graph_bs))
        return adapter.TargetVerifyState(width, f"backend{width}", f"graphs{width}")

    monkeypatch.setattr(adapter, "decode_cuda_graph_bs", lambda: [1, 2, 4, 8])
    monkeypatch.setattr(worker_mod, "get_parallel", lambda: SimpleNamespace(tp_rank=0))
    monkeypatch.setattr(adapter, "build_target_verify_state", build)
    monkeypatch.setattr(
        DFlashWorkerV2, "init_cuda_graphs", lambda self: calls.append(("drafter", self is w))
    )
    monkeypatch.setattr(
        worker_mod.DDTreeWorker, "warm_tree_layouts", lambda self: calls.append(("warm", self is w))
    )
    monkeypatch.setattr(
        worker_mod.draft_sampler, "capture", lambda worker: calls.append(("sampler", worker is w))
    )
    w.init_budgets()
    assert w.budgets.on_switch is worker_mod._log_budget_switch  # rank 0 logs each switch
    with caplog.at_level("INFO", logger="sglang_spec.plugin"):
        worker_mod._log_budget_switch(8, 7, 15, {15: 3.0, 7: 2.01234})
    assert (
        "DDTREE budget by batch size: bucket 8 runs budget 15 (was 7); tau per budget "
        "{7: 2.012, 15: 3.0}." in caplog.messages
    )
    w.init_cuda_graphs()
    # the drafter's graphs, then the draft sampler's (they read the block the drafter's stage);
    # budget 4 keeps the target's state; budget 3 captures the graph sizes of buckets 1 and 4;
    # then every budget's tree layout is compiled
    assert calls == [("drafter", True), ("sampler", True), ("warm", True)]
    assert built == [(4, [1, 2, 4])]
    assert w.verify_states[4] == adapter.TargetVerifyState(5, "backend5", "graphs5")
    mr = w.target_worker.model_runner

    def launch(bs, accept_index):
        r["walk"] = worker_mod.Walked(torch.zeros(1), torch.ones(bs), torch.tensor(accept_index))
        batch = _decode_batch(DFlashDraftInputV2.create_idle_input(device="cpu"), bs=bs)
        with NoHostBuiltTensors():  # on CUDA each is a copy that makes the host wait for the GPU
            return w.forward_batch_generation(batch).speculative_num_draft_tokens

    def step(bs, accept_index):
        width = launch(bs, accept_index)
        w.on_verify_complete_cpu([0] * bs, batch_size=bs)
        return width

    # 4 requests (bucket 4: budget 3 only, nothing to choose, so nothing measured): width 4
    assert step(4, [[0, 1, 2, -1], [4, 5, -1, -1], [8, 9, 10, -1], [12, 13, -1, -1]]) == 4
    assert (mr.attn_backend, mr.decode_cuda_graph_runner) == ("backend4", "graphs4")
    # budget 3 = L: K 1, the ranks its tree (the chain) needs
    assert (w.config.verify_width, w.config.topk_per_depth, w.speculative_num_draft_tokens) == (
        4,
        1,
        4,
    )
    assert w.budgets.tau == {} and not w.measured
    w.on_verify_complete_cpu([0] * 4, batch_size=4)  # no new decode step: nothing to feed
    assert w.budgets.evidence == {}
    # 2 requests (bucket 1): 3 and 4 unmeasured -> run 4, the largest that measures 3; it
    # measures 3 (slots <= 3 accepted: 2 + 2 tokens) and 4 (3 + 3)
    assert step(2, [[0, 3, 4, -1], [5, 6, 9, -1]]) == 5
    assert (mr.attn_backend, w.config.verify_width) == ("backend5", 5)
    assert w.budgets.tau == {3: 2.0, 4: 3.0}
    # both known: 4 -> 3/11 beats 3 -> 2.4/10
    assert step(1, [[0, 1, -1, -1]]) == 5
    # Overlap scheduling: the next step is launched before the scheduler reports the previous
    # one; each report feeds its own step's sums, in launch order.
    tau = dict(w.budgets.tau)
    assert launch(1, [[0, 1, 2, 3]]) == 5 and launch(1, [[0, -1, -1, -1]]) == 5
    w.on_verify_complete_cpu([0], batch_size=1)
    assert w.budgets.tau[4] == pytest.approx(0.8 * tau[4] + 0.2 * 4)
    w.on_verify_complete_cpu([0], batch_size=1)
    assert w.budgets.tau[4] == pytest.approx(0.8 * (0.8 * tau[4] + 0.2 * 4) + 0.2 * 1)
    assert not w.measured
    launch(1, [[0, 1, -1, -1]])
    with pytest.raises(RuntimeError, match="a step of 1 requests measured, results of 2 reported"):
        w.on_verify_complete_cpu([0, 0], batch_size=2)
    # a switch between a step's launch and its report: its sums use the width it ran at (5; at
    # width 4, request 1's slot-4 node, id 9, would read as slot 5 and be left out of budget 4)
    tau = dict(w.budgets.tau)
    assert launch(2, [[0, 3, 4, -1], [5, 6, 9, -1]]) == 5
    assert launch(4, [[0, 1, 2, -1], [4, 5, -1, -1], [8, 9, 10, -1], [12, 13, -1, -1]]) == 4
    w.on_verify_complete_cpu([0, 0], batch_size=2)
    assert w.budgets.tau[4] == pytest.approx(0.8 * tau[4] + 0.2 * 3)
    assert w.budgets.tau[3] == pytest.approx(0.8 * tau[3] + 0.2 * 2)
    w.on_verify_complete_cpu([0] * 4, batch_size=4)
    assert not w.measured
    assert [name for name, _ in calls[3:10]] == list(STAGES)
    assert w.budgets.nested and w.budgets.measured_by(4) == (3, 4)
    # a simulated tau per budget: each step measures only the budget it ran
    w.config = replace(
        w.config, simulated_accept_len=2.5, simulated_accept_by_budget=((3, 2.0), (4, 2.5))
    )
    w.init_budgets()
    assert not w.budgets.nested and w.budgets.measured_by(4) == (4,)


@pytest.mark.usefixtures("loaded")
def test_only_the_steps_the_controller_measures_are_copied_and_fed(monkeypatch):
    """measure_interval 3: after warm-up the worker copies the accepted node ids of one step in
    three to the host and feeds only those to tau; the others queue None, so that under overlap
    scheduling each report still meets its own step (and a report of the wrong size is still
    refused)."""
    from collections import deque

    from sglang_spec.plugin import worker as worker_mod
    from sglang_spec.plugin.budget import BudgetController, BudgetPolicy

    policy = BudgetPolicy.from_dict(
        {
            "cost_ms": {"1": {"3": 10, "4": 10}},  # 3 nested in 4, no cheaper: both candidates
            "warmup_steps": 2,
            "probe_interval": 0,
            "measure_interval": 3,
        }
    )
    w = object.__new__(worker_mod.DDTreeWorker)
    w.config = DDTreeConfig(block_size=4, verify_width=5, topk_per_depth=4, tree_temperature=1.0)
    w.budgets = BudgetController(policy, horizon=3)
    w.measured = deque()
    copies = []
    monkeypatch.setattr(worker_mod, "host_copy", lambda ids: copies.append(ids) or ids.clone())
    fed = []
    observe = w.budgets.observe
    monkeypatch.setattr(
        w.budgets, "observe", lambda b, sums, n: fed.append(sums) or observe(b, sums, n)
    )

    def launch(k):  # step k accepts k % 4 + 1 tokens (root included) at slots 0, 4, 1, 2
        assert w.budgets.choose(1) == 4  # warm-up: the largest that measures 3; then the best
        ids = torch.full((1, 4), -1)
        ids[0, : k % 4 + 1] = torch.tensor([0, 4, 1, 2])[: k % 4 + 1]
        w.measure_budgets(ids, 1)

    launch(0)
    for k in range(1, 10):  # overlap: step k is launched before step k - 1 is reported
        launch(k)
        w.on_verify_complete_cpu([0], batch_size=1)
    w.on_verify_complete_cpu([0], batch_size=1)
    # warm-up: steps 0-2 (step 2 is chosen before step 1 is reported, so budget 3 still has one
    # step of evidence of the two it needs); then the third step after each measured one: 5, 8
    # step 3 chooses with steps 0 and 1 known: tau(4) 1.2 > tau(3) 1, at equal cost; each sum is
    # [slots <= 3, slots <= 4]
    assert len(copies) == 5 and fed == [[1, 1], [1, 2], [2, 3], [1, 2], [1, 1]]
    assert w.budgets.evidence == {3: 5, 4: 5} and not w.measured
    launch(10)  # not measured, still checked against its report
    with pytest.raises(RuntimeError, match="a step of 1 requests measured, results of 2 reported"):
        w.on_verify_complete_cpu([0, 0], batch_size=2)


# ------------------------------------------ SGLANG_SIMULATE_ACC_LEN (benchmarks only)


def _tree(parents, scores, horizon):
    from sglang_spec.tree import DraftTree

    parents = torch.tensor(parents)
    depths = torch.full_like(parents, -1)
    for b in range(parents.shape[0]):
        for i in range(parents.shape[1]):
            p = int(parents[b, i])
            depths[b, i] = 0 if i == 0 else (-1 if p < 0 else int(depths[b, p]) + 1)
    return DraftTree(
        tokens=torch.zeros_like(parents),
        parents=parents,
        depths=depths,
        scores=torch.tensor(scores),
        num_nodes=(depths >= 0).sum(dim=1),
        horizon=horizon,
    )


def test_best_path_takes_the_highest_score_child_at_each_depth():
    from sglang_spec.plugin.simulate import best_path

    ninf = float("-inf")
    tree = _tree(
        # row 0: the lowest-slot child (1) is not the best (2); node 3 is 2's only child
        # row 1: a chain 0 -> 1 -> 2 -> 3 -> 4 deeper than the horizon allows is cut at L
        # row 2: equal scores go to the lowest slot (1 over 2), whose child is 4
        [[-1, 0, 0, 2, 1], [-1, 0, 1, 2, -1], [-1, 0, 0, 2, 1]],
        [
            [0.0, -2.0, -0.5, -1.0, -3.0],
            [0.0, -0.1, -0.2, -0.3, ninf],
            [0.0, -1.0, -1.0, -1.5, -1.2],
        ],
        horizon=3,
    )
    assert best_path(tree).tolist() == [[0, 2, 3, -1], [0, 1, 2, 3], [0, 1, 4, -1]]


def test_best_path_of_a_ddtree_is_the_drafters_greedy_chain():
    from sglang_spec.plugin.simulate import best_path
    from sglang_spec.tree import build_ddtree

    torch.manual_seed(0)
    logits = torch.randn(3, 5, 40)
    tree = build_ddtree(logits, 24, torch.tensor([1, 2, 3]))
    path = best_path(tree)
    for b in range(3):
        nodes = [int(i) for i in path[b] if i >= 0]
        assert tree.parents[b, nodes[1:]].tolist() == nodes[:-1]
        assert tree.depths[b, nodes].tolist() == list(range(len(nodes)))
        assert tree.tokens[b, nodes[1:]].tolist() == logits[b, : len(nodes) - 1].argmax(-1).tolist()
        assert len(nodes) - 1 == int(tree.depths[b].max())  # as deep as the tree


def _best_path_by_depth(tree):
    """The oracle: from the root, the highest-score child at each depth (lowest slot on ties)."""
    out = []
    for b in range(tree.parents.shape[0]):
        path, cur = [0], 0
        for _ in range(tree.horizon):
            kids = [i for i in range(tree.parents.shape[1]) if int(tree.parents[b, i]) == cur]
            if not kids:
                break
            cur = max(kids, key=lambda i: (float(tree.scores[b, i]), -i))
            path.append(cur)
        out.append(path + [-1] * (tree.horizon + 1 - len(path)))
    return out


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), horizon=st.integers(1, 6), n=st.integers(1, 14))
def test_best_path_equals_the_depth_by_depth_walk_on_random_trees(seed, horizon, n):
    """Random trees (parents before children, a few padding slots, scores drawn from a handful of
    values so that ties are common, depths past the horizon): the scatter and pointer-doubling
    best path is the depth-by-depth one."""
    from sglang_spec.plugin.simulate import best_path

    g = torch.Generator().manual_seed(seed)
    bs = 3
    parents = torch.full((bs, n), -1, dtype=torch.long)
    for i in range(1, n):
        parents[:, i] = torch.randint(0, i, (bs,), generator=g)
    padding = torch.rand(bs, n, generator=g) < 0.15
    padding[:, 0] = False
    depths = torch.zeros(bs, n, dtype=torch.long)
    for b in range(bs):
        for i in range(1, n):
            p = int(parents[b, i])
            if padding[b, i] or padding[b, p]:  # a padding slot's subtree is padding too
                padding[b, i] = True
                parents[b, i], depths[b, i] = -1, -1
            else:
                depths[b, i] = depths[b, p] + 1
    scores = -torch.randint(0, 4, (bs, n), generator=g).float()
    scores[:, 0] = 0.0
    tree = _tree(parents.tolist(), scores.tolist(), horizon)
    assert tree.depths.tolist() == depths.tolist()
    assert best_path(tree).tolist() == _best_path_by_depth(tree)


def test_simulated_acceptance_follows_the_best_path_clipped_to_it():
    from sglang_spec.plugin.simulate import simulated_acceptance

    ninf = float("-inf")
    tree = _tree(
        [[-1, 0, 0, 2, 1], [-1, 0, 1, 2, -1]],
        [[0.0, -2.0, -0.5, -1.0, -3.0], [0.0, -0.1, -0.2, -0.3, ninf]],
        horizon=3,
    )  # best paths: [0, 2, 3] (3 tokens) and [0, 1, 2, 3] (4 tokens)
    width = 5
    for drawn, lens, index in (
        (4, [3, 4], [[0, 2, 3, -1], [5, 6, 7, 8]]),
        (2, [2, 2], [[0, 2, -1, -1], [5, 6, -1, -1]]),
        (1, [1, 1], [[0, -1, -1, -1], [5, -1, -1, -1]]),
    ):
        drawn_lens = torch.full((2,), drawn, dtype=torch.int32)
        got_lens, got_index = simulated_acceptance(tree, drawn_lens, width)
        assert got_lens.tolist() == lens and got_index.tolist() == index
        assert got_lens.dtype == got_index.dtype == torch.int32
    # a width below the horizon: accept_index has width columns (depth <= width - 1)
    got_lens, got_index = simulated_acceptance(tree, torch.full((2,), 4, dtype=torch.int32), 3)
    assert got_lens.tolist() == [3, 3] and got_index.tolist() == [[0, 2, 3], [3, 4, 5]]


def test_simulated_acceptance_env():
    from sglang_spec.plugin.config import ENV_SIMULATE_ACC_LEN, ENV_SIMULATE_ACC_TOKEN_MODE

    def build(**env):
        return DDTreeConfig.build(block_size=8, verify_width=9, environ=env)

    assert build().simulated_accept_len is None
    for off in ("", "0", "-1"):
        assert build(**{ENV_SIMULATE_ACC_LEN: off}).simulated_accept_len is None
    assert build(**{ENV_SIMULATE_ACC_LEN: "3.5"}).simulated_accept_len == 3.5
    assert build(**{ENV_SIMULATE_ACC_LEN: "0.5"}).simulated_accept_len == 0.5  # on: any n > 0
    on = {ENV_SIMULATE_ACC_LEN: "3.5", ENV_SIMULATE_ACC_TOKEN_MODE: "fixed"}
    assert build(**on).simulated_accept_len == 3.5
    for unset in ("", " "):  # an empty mode is the default, fixed
        assert build(**{**on, ENV_SIMULATE_ACC_TOKEN_MODE: unset}).simulated_accept_len == 3.5
    with pytest.raises(DDTreeConfigError) as refused:
        build(**{ENV_SIMULATE_ACC_LEN: "fast"})
    assert str(refused.value) == (
        "SGLANG_SIMULATE_ACC_LEN='fast' is not a number; it sets the forced tokens per step of a "
        "benchmark; valid: a number > 0, or <= 0 / unset for off."
    )
    real = {**on, ENV_SIMULATE_ACC_TOKEN_MODE: "real-draft-token"}
    with pytest.raises(DDTreeConfigError) as refused:
        build(**real)
    assert str(refused.value) == (
        "SGLANG_SIMULATE_ACC_TOKEN_MODE='real-draft-token' is not supported by DDTREE (SGLang "
        "simulates real draft tokens for chains only, eagle_utils.py:818); valid: fixed."
    )
    # the mode only matters when the simulation is on
    assert build(**{**real, ENV_SIMULATE_ACC_LEN: "-1"}).simulated_accept_len is None


def test_simulated_acceptance_by_budget_env():
    """SGLANG_DDTREE_SIMULATE_ACC_LEN_BY_BUDGET: budget:tau pairs, sorted, kept by for_budget, each
    budget reading its own; it refines SGLang's simulation, so that must be on."""
    from sglang_spec.plugin.config import ENV_SIMULATE_ACC_BY_BUDGET, ENV_SIMULATE_ACC_LEN

    def build(width=32, **env):
        return DDTreeConfig.build(block_size=16, verify_width=width, environ=env)

    on = {ENV_SIMULATE_ACC_LEN: "4"}
    assert build(**on).simulated_accept_by_budget is None
    assert build(**on).simulated_accept_here is None  # SGLang's own draw
    cfg = build(**on, **{ENV_SIMULATE_ACC_BY_BUDGET: " 31:4.01, 7:3.17,15:3"})
    assert cfg.simulated_accept_by_budget == ((7, 3.17), (15, 3.0), (31, 4.01))
    assert cfg.simulated_accept_here == 4.01
    assert cfg.for_budget(7).simulated_accept_here == 3.17
    assert cfg.for_budget(3).simulated_accept_here is None  # refused at start-up (below)
    for bad in ("7", "7:", "x:3", "0:3", "7:0.5", "7:inf", "7:3,7:4", "7:3;15:3"):
        with pytest.raises(DDTreeConfigError) as refused:
            build(**on, **{ENV_SIMULATE_ACC_BY_BUDGET: bad})
        msg = str(refused.value)
        assert msg.startswith(f"{ENV_SIMULATE_ACC_BY_BUDGET}={bad!r}: bad ") and "\n" not in msg
        assert msg.endswith("tau a number >= 1).")
    with pytest.raises(DDTreeConfigError) as refused:
        build(**{ENV_SIMULATE_ACC_BY_BUDGET: "7:3"})
    assert str(refused.value) == (
        f"{ENV_SIMULATE_ACC_BY_BUDGET}='7:3' needs {ENV_SIMULATE_ACC_LEN} > 0 (SGLang's benchmark "
        "simulation, which it refines per budget); valid: set both, or neither."
    )


@pytest.mark.usefixtures("loaded")
def test_simulated_acceptance_by_budget_covers_every_budget_at_start_up(
    models, tmp_path, monkeypatch
):
    """handle_server_args: a tau for every budget the server runs (the width's, or every
    candidate of --speculative-adaptive-config), at most the min(L, B) + 1 tokens its tree
    accepts."""
    from sglang_spec.plugin.config import ENV_SIMULATE_ACC_BY_BUDGET, ENV_SIMULATE_ACC_LEN

    monkeypatch.setenv(ENV_SIMULATE_ACC_LEN, "4")
    path = _budget_file(tmp_path, {"1": {"3": 30, "31": 40}})
    adaptive = ("--speculative-adaptive", "--speculative-adaptive-config", path)
    cases = [
        (
            "3:3.5",
            adaptive,
            r"has no tau for budget\(s\) \[31\]; valid: one for every budget the "
            r"server runs \[3, 31\]\.$",
        ),
        (
            "3:4.5,31:4",
            adaptive,
            r": tau 4.5 for budget 3 exceeds the 4 tokens a step of that tree "
            r"can accept; valid: 1\.\.4\.$",
        ),
        ("3:3", ("--speculative-num-draft-tokens", "16"), r"has no tau for budget\(s\) \[15\]"),
    ]
    for value, extra, msg in cases:
        monkeypatch.setenv(ENV_SIMULATE_ACC_BY_BUDGET, value)
        with pytest.raises(DDTreeConfigError, match=msg):
            _resolve(models, *extra)
    for value, extra in (
        ("3:4,31:8", adaptive),
        ("15:8,3:2", ("--speculative-num-draft-tokens", "16")),
    ):
        monkeypatch.setenv(ENV_SIMULATE_ACC_BY_BUDGET, value)
        cfg, _ = _resolve(models, *extra)  # accepted: at the limit (L = 7 for draft8)
        assert DDTreeConfig.from_spec(cfg).simulated_accept_by_budget is not None


def test_draw_simulated_accept_len_is_sglangs_draw():
    """adapter.draw_simulated_accept_len: SGLang's own host-side draw, in 1..max_len."""
    from sglang_spec.plugin import adapter

    draws = [adapter.draw_simulated_accept_len(2.5, 4) for _ in range(400)]
    assert all(isinstance(d, int) and 1 <= d <= 4 for d in draws)
    assert len(set(draws)) > 1 and 2.2 < sum(draws) / len(draws) < 2.8
    assert {adapter.draw_simulated_accept_len(9.0, 4) for _ in range(20)} == {4}


def test_walk_stage_applies_simulated_acceptance(monkeypatch):
    from sglang_spec.plugin import worker as worker_mod

    calls = []
    worker, _ = _staged_worker(calls)
    del worker.walk_stage  # the real stage, with eagle_sample stubbed
    worker._target_worker = SimpleNamespace(model_runner=SimpleNamespace(watermark_state=None))
    predict = torch.full((10,), 100)
    chain_lens = torch.tensor([3, 3], dtype=torch.int32)
    chain_index = torch.tensor([[0, 1, 2, -1], [5, 6, 7, -1]], dtype=torch.int32)
    monkeypatch.setattr(
        worker_mod, "eagle_sample", lambda *_a, **_k: (predict, chain_lens, chain_index)
    )
    tree = _tree(
        [[-1, 0, 0, 2, 1], [-1, 0, 1, 2, -1]],
        [[0.0, -2.0, -0.5, -1.0, -3.0], [0.0, -0.1, -0.2, -0.3, float("-inf")]],
        horizon=3,
    )
    logits = SimpleNamespace(next_token_logits=torch.zeros(10, 4))
    verified = SimpleNamespace(logits_output=logits, grammar_mask=None)
    batch = SimpleNamespace(sampling_info=SimpleNamespace(is_all_greedy=True))
    walked = worker.walk_stage(batch, tree, "verify_input", verified)
    assert walked.accept_index is chain_index  # off: eagle_sample's result as is
    worker.config = DDTreeConfig(4, 5, 4, 1.0, simulated_accept_len=3.0)
    walked = worker.walk_stage(batch, tree, "verify_input", verified)
    assert walked.predict is predict
    assert walked.accept_lens.tolist() == [3, 3]
    assert walked.accept_index.tolist() == [[0, 2, 3, -1], [5, 6, 7, -1]]
    # per budget: this budget's (4) own draw, from its tau, up to min(L, B) + 1 = 4 tokens
    draws = []
    monkeypatch.setattr(
        worker_mod.adapter, "draw_simulated_accept_len", lambda *a: draws.append(a) or 2
    )
    worker.config = replace(worker.config, simulated_accept_by_budget=((2, 1.5), (4, 2.25)))
    walked = worker.walk_stage(batch, tree, "verify_input", verified)
    assert draws == [(2.25, 4)]
    assert walked.accept_lens.tolist() == [2, 2] and walked.accept_lens.dtype == torch.int32
    assert walked.accept_index.tolist() == [[0, 2, -1, -1], [5, 6, -1, -1]]


# ------------------------------------------- SGLANG_DDTREE_STAGE_TIMES (profiling only)


class _FakeEvent:
    """A CUDA event on a fake GPU clock."""

    gpu_ms = 0.0
    done_ms = float("inf")  # events recorded up to here have completed
    synchronized = 0

    def record(self):
        self.t = _FakeEvent.gpu_ms

    def elapsed_time(self, end):
        return end.t - self.t

    def synchronize(self):
        _FakeEvent.synchronized += 1

    def query(self):  # done once the fake GPU clock has passed it
        return self.t <= _FakeEvent.done_ms


@pytest.mark.usefixtures("loaded")
def test_stage_times_one_line_per_decode_step(tmp_path):
    from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2

    from sglang_spec.plugin.stage_times import STAGES as TIMED
    from sglang_spec.plugin.stage_times import StageTimer

    assert TIMED == STAGES
    host = [0.0]

    def tick(name):  # stage i takes (i + 1) ms of host time and 10 * (i + 1) ms of GPU time
        i = STAGES.index(name)
        host[0] += (i + 1) / 1e3
        _FakeEvent.gpu_ms += 10.0 * (i + 1)

    worker, _ = _staged_worker([], tick)
    path = tmp_path / "stages.jsonl"
    timer = StageTimer(str(path), new_event=_FakeEvent, clock=lambda: host[0])
    timer.instrument(worker)
    worker.stage_timer = timer
    spec_info = DFlashDraftInputV2.create_idle_input(device="cpu")
    _FakeEvent.synchronized, _FakeEvent.done_ms = 0, float("inf")  # each step ends before the next
    worker.forward_batch_generation(_decode_batch(spec_info, bs=2))
    assert path.read_text() == ""  # written once finished, checked when the next step begins
    _FakeEvent.gpu_ms += 7.0  # the scheduler's GPU work between the two decode steps
    # budget by batch size switches the config between steps: the record has the step's width
    worker.config = replace(worker.config, verify_width=3)
    worker.forward_batch_generation(_decode_batch(spec_info, bs=3))
    assert len(path.read_text().splitlines()) == 1 and _FakeEvent.synchronized == 0
    timer.flush()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["bs"], r["width"]) for r in records] == [(2, 5), (3, 3)]
    assert records[0]["gpu_between_ms"] is None  # nothing timed before the first step
    assert records[1]["gpu_between_ms"] == pytest.approx(7.0)
    for r in records:
        assert list(r["host_ms"]) == list(r["gpu_ms"]) == list(STAGES)
        for i, name in enumerate(STAGES):
            assert r["host_ms"][name] == pytest.approx(i + 1)
            assert r["gpu_ms"][name] == pytest.approx(10.0 * (i + 1))
    assert _FakeEvent.synchronized == 1  # only flush waits
    timer.flush()  # nothing pending: no empty line
    assert len(path.read_text().splitlines()) == 2


@pytest.mark.usefixtures("loaded")
def test_stage_times_time_a_ddtree_prefill_as_one_extend_line(tmp_path, monkeypatch):
    """A prefill (DFLASH's extend path, which DDTREE runs unchanged) between two decode steps is
    one ``extend`` line with its new requests and prompt tokens; the decode step after it counts
    its GPU gap from the prefill's end. Untimed, the prefill runs straight through."""
    from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    from sglang_spec.plugin.stage_times import StageTimer

    def prefill(_self, batch, *_args):
        _FakeEvent.gpu_ms += 40.0
        return f"prefilled {len(batch.seq_lens)}"

    monkeypatch.setattr(DFlashWorkerV2, "forward_batch_generation", prefill)
    worker, _ = _staged_worker(
        [], lambda _name: setattr(_FakeEvent, "gpu_ms", _FakeEvent.gpu_ms + 1)
    )
    extend = _extend_batch(bs=3, extend_lens=[512, 512, 100])
    assert worker.forward_batch_generation(extend) == "prefilled 3"  # no timer: not timed
    path = tmp_path / "stages.jsonl"
    timer = StageTimer(str(path), new_event=_FakeEvent, clock=lambda: 0.0)
    timer.instrument(worker)
    worker.stage_timer = timer
    spec_info = DFlashDraftInputV2.create_idle_input(device="cpu")
    _FakeEvent.synchronized, _FakeEvent.done_ms = 0, float("inf")
    worker.forward_batch_generation(_decode_batch(spec_info, bs=2))
    _FakeEvent.gpu_ms += 2.0
    assert worker.forward_batch_generation(extend) == "prefilled 3"
    _FakeEvent.gpu_ms += 5.0
    worker.forward_batch_generation(_decode_batch(spec_info, bs=3))
    timer.flush()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r.get("phase"), r["bs"]) for r in records] == [(None, 2), ("extend", 3), (None, 3)]
    pre = records[1]
    assert pre["tokens"] == 1124 and "width" not in pre
    assert pre["gpu_ms"] == {"extend": pytest.approx(40.0)} and list(pre["host_ms"]) == ["extend"]
    assert pre["gpu_between_ms"] == pytest.approx(2.0)
    assert records[2]["gpu_between_ms"] == pytest.approx(5.0)
    assert list(records[2]["gpu_ms"]) == list(STAGES)


def test_stage_times_keep_fractions_of_a_millisecond_and_skip_an_empty_step(tmp_path):
    """Times are kept to 1e-4 ms (a 0.17 ms stage is not rounded away); a step that recorded no
    stage (begun, then failed) writes no line and does not hold back the steps queued after it."""
    from sglang_spec.plugin.stage_times import StageTimer

    host = [0.0]
    path = tmp_path / "stages.jsonl"
    timer = StageTimer(str(path), new_event=_FakeEvent, clock=lambda: host[0])
    _FakeEvent.synchronized, _FakeEvent.done_ms = 0, -1.0  # nothing finishes before the flush

    def stage():
        host[0] += 0.000123456  # s
        _FakeEvent.gpu_ms += 0.17049

    timer.begin_step(2, 4)
    timer.wrap("verify", stage)()
    timer.begin_step(1, 4)  # no stage ran; queued behind the running step
    _FakeEvent.gpu_ms += 0.3333333
    timer.begin_step(3, 4)
    timer.wrap("verify", stage)()
    assert path.read_text() == ""
    timer.flush()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["bs"] for r in records] == [2, 3]
    assert [r["host_ms"]["verify"] for r in records] == [0.1235, 0.1235]
    assert [r["gpu_ms"]["verify"] for r in records] == [0.1705, 0.1705]
    assert records[1]["gpu_between_ms"] == 0.3333


@pytest.mark.usefixtures("loaded")
def test_stage_times_never_wait_for_a_running_step(tmp_path):
    """Overlap scheduling launches step n + 1 before step n has finished on the device: beginning
    it writes only the steps already finished, without waiting, in launch order."""
    from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2

    from sglang_spec.plugin.stage_times import StageTimer

    worker, _ = _staged_worker(
        [], lambda _name: setattr(_FakeEvent, "gpu_ms", _FakeEvent.gpu_ms + 1)
    )
    path = tmp_path / "stages.jsonl"
    timer = StageTimer(str(path), new_event=_FakeEvent, clock=lambda: 0.0)
    timer.instrument(worker)
    worker.stage_timer = timer
    spec_info = DFlashDraftInputV2.create_idle_input(device="cpu")
    _FakeEvent.synchronized, _FakeEvent.done_ms = 0, -1.0  # nothing finishes
    for bs in (1, 2, 3):
        worker.forward_batch_generation(_decode_batch(spec_info, bs=bs))
    assert path.read_text() == "" and _FakeEvent.synchronized == 0
    _FakeEvent.done_ms = _FakeEvent.gpu_ms - len(STAGES)  # the first two steps have finished
    worker.forward_batch_generation(_decode_batch(spec_info, bs=4))
    assert [json.loads(x)["bs"] for x in path.read_text().splitlines()] == [1, 2]
    assert _FakeEvent.synchronized == 0
    timer.flush()
    assert [json.loads(x)["bs"] for x in path.read_text().splitlines()] == [1, 2, 3, 4]


@pytest.mark.usefixtures("loaded")
def test_dflash_decode_steps_are_timed_as_one_stage(tmp_path, monkeypatch):
    """SGLANG_DDTREE_STAGE_TIMES on a DFLASH server: each decode step of upstream's worker is one
    ``step`` line (GPU time and the gap before it) and each prefill one ``extend`` line, for
    comparison with DDTREE's in one run; idle batches and DDTREE's own worker (a subclass) pass
    through untimed."""
    import sglang.srt.runtime_context as runtime_context
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    from sglang_spec.plugin import stage_times
    from sglang_spec.plugin.worker import DDTreeWorker

    calls = []

    def upstream(_self, batch, *_args):
        calls.append(len(batch.seq_lens))
        _FakeEvent.gpu_ms += 3.0
        return f"result {len(batch.seq_lens)}"

    monkeypatch.setattr(DFlashWorkerV2, "forward_batch_generation", upstream)
    monkeypatch.setattr(stage_times, "_cuda_event", _FakeEvent)
    monkeypatch.setattr(runtime_context, "get_parallel", lambda: SimpleNamespace(tp_rank=0))
    _FakeEvent.synchronized, _FakeEvent.done_ms = 0, float("inf")
    path = tmp_path / "dflash.jsonl"
    stage_times.time_dflash_steps(str(path))
    stage_times.time_dflash_steps(str(path))  # idempotent: wrapped once
    worker = object.__new__(DFlashWorkerV2)
    worker.block_size = 16
    assert worker.forward_batch_generation(_decode_batch(None, bs=2)) == "result 2"
    _FakeEvent.gpu_ms += 5.0
    extend = _extend_batch(bs=9, extend_lens=[100] * 8 + [12])
    idle = _decode_batch(None, bs=8)
    idle.forward_mode = SimpleNamespace(is_extend=lambda: False, is_idle=lambda: True)
    ddtree = object.__new__(DDTreeWorker)
    for who, batch in ((worker, extend), (worker, idle), (ddtree, _decode_batch(None, bs=7))):
        assert (
            DFlashWorkerV2.forward_batch_generation(who, batch) == f"result {len(batch.seq_lens)}"
        )
    assert worker.forward_batch_generation(_decode_batch(None, bs=4)) == "result 4"
    assert calls == [2, 9, 8, 7, 4]
    worker.forward_batch_generation(_decode_batch(None, bs=1))  # writes the finished steps
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["bs"], r.get("width"), list(r["gpu_ms"])) for r in records] == [
        (2, 16, ["step"]),
        (9, None, ["extend"]),
        (4, 16, ["step"]),
    ]
    assert records[1]["phase"] == "extend" and records[1]["tokens"] == 812
    assert "phase" not in records[0] and "phase" not in records[2]
    assert [r["gpu_ms"][next(iter(r["gpu_ms"]))] for r in records] == [pytest.approx(3.0)] * 3
    assert records[1]["gpu_between_ms"] == pytest.approx(5.0)
    # after the prefill: the two untimed calls (3 ms each)
    assert records[2]["gpu_between_ms"] == pytest.approx(6.0)


def test_stage_times_env(tmp_path):
    from sglang_spec.plugin.config import ENV_STAGE_TIMES

    def build(**env):
        return DDTreeConfig.build(block_size=8, verify_width=9, environ=env)

    assert (
        build().stage_times_path is None and build(**{ENV_STAGE_TIMES: ""}).stage_times_path is None
    )
    good = tmp_path / "s.jsonl"
    assert build(**{ENV_STAGE_TIMES: str(good)}).stage_times_path == str(good)
    for bad in (tmp_path / "missing" / "s.jsonl", tmp_path):
        with pytest.raises(DDTreeConfigError) as refused:
            build(**{ENV_STAGE_TIMES: str(bad)})
        assert str(refused.value) == (
            f"SGLANG_DDTREE_STAGE_TIMES={str(bad)!r} cannot be written: valid: a file path in an "
            "existing directory (one JSON line per decode step is appended to it)."
        )


def test_tree_stage_builds_the_path_table_only_for_the_gdn_tree_replayssm():
    """tree_stage runs every decode step: the path table (a gather per depth) is built only when
    the server runs the GDN tree ReplaySSM, whose verify is the only reader."""
    from sglang_spec.plugin.worker import DDTreeWorker
    from sglang_spec.tree import build_ddtree_from_topk, draft_topk

    torch.manual_seed(0)
    worker = object.__new__(DDTreeWorker)
    worker.config = DDTreeConfig(
        block_size=5, verify_width=7, topk_per_depth=3, tree_temperature=1.0
    )
    worker._target_worker = SimpleNamespace(
        model_runner=SimpleNamespace(attn_backend=SimpleNamespace(verify_mask=None))
    )
    batch = SimpleNamespace(seq_lens=torch.tensor([5, 9]), seq_lens_sum=14, seq_lens_cpu=None)
    logq, ids = draft_topk(torch.randn(2, 4, 30), 3)
    tree = build_ddtree_from_topk(logq, ids, 6, torch.tensor([1, 2]))
    for flag in (False, True):
        worker.server_args = SimpleNamespace(enable_linear_replayssm_spec=flag)
        vi = worker.tree_stage(batch, tree)
        if flag:
            assert vi.retrieve_tree_paths.shape == (2, 7, 5)
            assert vi.retrieve_tree_paths[:, :, 0].eq(0).all()  # every path starts at the root
        else:
            assert vi.retrieve_tree_paths is None


@pytest.mark.usefixtures("loaded")
def test_tree_stage_needs_no_host_lengths_under_overlap():
    """SGLang's overlap scheduler leaves batch.seq_lens_sum / seq_lens_cpu unset (the Triton
    backend needs no host copy). tree_stage then writes the mask into the backend's VerifyMask
    buffer when the batch fits it, else into one sized from the reserved upper bound
    (nxt_kv_lens_sum), not from a device-to-host sum. Same mask as with the exact sum. (The CPU
    layout reads the lengths to build the mask; the CUDA kernel does not.)"""
    from sglang.srt.layers.attention.verify_mask import VerifyMask

    from sglang_spec.plugin.worker import DDTreeWorker
    from sglang_spec.tree import TreeMaskMode, build_ddtree_from_topk, draft_topk, sglang_tree_abi

    torch.manual_seed(0)
    worker = object.__new__(DDTreeWorker)
    worker.config = DDTreeConfig(
        block_size=5, verify_width=7, topk_per_depth=3, tree_temperature=1.0
    )
    worker.server_args = SimpleNamespace(enable_linear_replayssm_spec=False)
    logq, ids = draft_topk(torch.randn(2, 4, 30), 3)
    tree = build_ddtree_from_topk(logq, ids, 6, torch.tensor([1, 2]))
    seq_lens = torch.tensor([5, 9])
    exact = SimpleNamespace(seq_lens=seq_lens, seq_lens_sum=14, seq_lens_cpu=None)
    overlap = SimpleNamespace(
        seq_lens=seq_lens,
        seq_lens_sum=None,
        seq_lens_cpu=None,
        spec_info=SimpleNamespace(nxt_kv_lens_sum=14 + 2 * 2 * 7),
    )
    worker._target_worker = SimpleNamespace(
        model_runner=SimpleNamespace(attn_backend=SimpleNamespace(verify_mask=None))
    )
    want = worker.tree_stage(exact, tree)
    assert torch.equal(want.custom_mask, sglang_tree_abi(tree, seq_lens).tree_mask)
    n_mask = want.custom_mask.numel()
    # no buffer: one of the upper bound's size, the mask in its leading entries
    vi = worker.tree_stage(overlap, tree)
    assert vi.custom_mask.numel() == (14 + 28) * 7 + 2 * 49
    assert torch.equal(vi.custom_mask[:n_mask], want.custom_mask)
    # the backend's buffer (uint8, as SGLang's Triton backend keeps it) when the batch fits
    buf = torch.zeros(5000, dtype=torch.uint8)
    vm = VerifyMask(buffer=buf, mode=TreeMaskMode.FULL_MASK, max_bs=2)
    worker._target_worker.model_runner.attn_backend.verify_mask = vm
    vi = worker.tree_stage(overlap, tree)
    assert vi.custom_mask is buf and torch.equal(buf[:n_mask].bool(), want.custom_mask)
    # a batch beyond the buffer's max_bs falls back to the bound, not past the buffer's end
    worker._target_worker.model_runner.attn_backend.verify_mask = VerifyMask(
        buffer=buf, mode=TreeMaskMode.FULL_MASK, max_bs=1
    )
    vi = worker.tree_stage(overlap, tree)
    assert vi.custom_mask is not buf and vi.custom_mask.numel() == (14 + 28) * 7 + 2 * 49


@pytest.mark.usefixtures("loaded")
def test_sync_check_wraps_each_decode_step(monkeypatch):
    """SGLANG_DDTREE_SYNC_CHECK=error: every decode step runs under torch's sync debug mode (the
    stages see it set), which is reset after the step, also when a stage raises."""
    from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2

    modes = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    seen = []
    worker, _ = _staged_worker([], lambda name: seen.append((name, modes[-1] if modes else None)))
    spec_info = DFlashDraftInputV2.create_idle_input(device="cpu")
    worker.forward_batch_generation(_decode_batch(spec_info, bs=2))
    assert modes == [] and all(mode is None for _, mode in seen)  # off: never touched
    worker.config = replace(worker.config, sync_check="error")
    seen.clear()
    worker.forward_batch_generation(_decode_batch(spec_info, bs=2))
    assert [name for name, _ in seen] == list(STAGES)
    assert all(mode == "error" for _, mode in seen) and modes == ["error", 0]

    def boom(*_a):
        raise RuntimeError("synchronizing operation")

    worker.verify_stage = boom
    with pytest.raises(RuntimeError, match="synchronizing operation"):
        worker.forward_batch_generation(_decode_batch(spec_info, bs=2))
    assert modes[-1] == 0


@pytest.mark.usefixtures("loaded")
def test_sync_check_warn_counts_every_sync_of_every_step(monkeypatch):
    """SGLANG_DDTREE_SYNC_CHECK=warn: a sync made at the same code line in two steps, twice in the
    first, is reported as 2 and then 1 (Python's own filter shows one line for all three); other
    warnings pass through."""
    import warnings as w

    from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2

    from sglang_spec.plugin import worker as worker_mod

    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda _: None)
    monkeypatch.setattr(worker_mod, "get_parallel", lambda: SimpleNamespace(tp_rank=0))
    calls = {"n": 2}

    def syncing(name):
        if name == "verify":
            for _ in range(calls["n"]):
                w.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)
            w.warn("something else", DeprecationWarning, stacklevel=1)

    worker, _ = _staged_worker([], syncing)
    worker.config = replace(worker.config, sync_check="warn")
    logged = []
    monkeypatch.setattr(worker_mod.logger, "warning", lambda msg, *a: logged.append(msg % a))
    spec_info = DFlashDraftInputV2.create_idle_input(device="cpu")
    with w.catch_warnings(record=True) as outside:
        w.simplefilter("default")  # Python's own: once per code line
        worker.forward_batch_generation(_decode_batch(spec_info, bs=2))
        calls["n"] = 1
        worker.forward_batch_generation(_decode_batch(spec_info, bs=2))
    assert len(logged) == 2 and worker.sync_steps == 2
    assert "operation 2 time(s)" in logged[0] and "(1 step(s) so far)" in logged[0]
    assert "operation 1 time(s)" in logged[1] and "(2 step(s) so far)" in logged[1]
    assert [str(x.message) for x in outside] == ["something else"] * 2


@pytest.mark.usefixtures("loaded")
def test_worker_starts_in_sglangs_own_scheduler_order(models, monkeypatch):
    """SGLang's own ``Scheduler.init_model_worker`` -- the target worker, then the draft worker
    (ours, through the registered algorithm), then the target's pools, then the draft worker's --
    over stub runners and a stub DFlashWorkerV2 body, up to the attention backends. The DDTREE
    worker must reach for nothing before the scheduler has made it: session 10's KV-move cap read
    the target's allocator in ``__init__`` and crashed every DDTREE server on the H200."""
    from types import MethodType

    from sglang.srt.managers import scheduler as sched_mod
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_spec.plugin import adapter
    from sglang_spec.plugin import worker as worker_mod

    class Stop(Exception):
        pass

    events = []
    kv = object()
    runner = SimpleNamespace(
        memory_pool_config=None,
        req_to_token_pool=None,
        token_to_kv_pool_allocator=None,  # what TpModelWorker's runner has before its pools
        account_preloaded_weights=lambda _bytes: None,
    )

    def target_pools(**_kw):  # TpModelWorker.alloc_memory_pool
        runner.memory_pool_config, runner.req_to_token_pool = "pool config", "req pool"
        runner.token_to_kv_pool_allocator = SimpleNamespace(get_kvcache=lambda: kv)
        events.append("target pools")

    tp_worker = SimpleNamespace(
        model_runner=runner,
        preloaded_weights_bytes=0,
        alloc_memory_pool=target_pools,
        get_memory_pool=lambda: (runner.req_to_token_pool, runner.token_to_kv_pool_allocator),
    )

    def upstream_init(self, server_args, gpu_id, nccl_port, target_worker):  # noqa: ARG001
        self._target_worker = target_worker
        self.model_runner = target_worker.model_runner  # dflash_worker_v2.py:401
        self.device = torch.device("cpu")  # target_worker.device, dflash_worker_v2.py:407
        self.draft_parallel_layout = None
        self.speculative_num_draft_tokens = 32
        events.append("draft worker")

    cfg = DDTreeConfig(block_size=16, verify_width=32, topk_per_depth=4, tree_temperature=0.75)
    monkeypatch.setattr(DFlashWorkerV2, "__init__", upstream_init)
    monkeypatch.setattr(DFlashWorkerV2, "preloaded_weights_bytes", 0)
    monkeypatch.setattr(
        DFlashWorkerV2, "alloc_memory_pool", lambda _self, *_a, **_kw: events.append("draft pools")
    )
    monkeypatch.setattr(DFlashWorkerV2, "init_hicache_draft_plan", lambda _self: None)
    monkeypatch.setattr(worker_mod, "runtime_config", lambda: cfg)
    monkeypatch.setattr(worker_mod, "get_parallel", lambda: SimpleNamespace(tp_rank=1, tp_group=0))
    monkeypatch.setattr(adapter, "resize_draft_block", lambda _w, _b: None)
    monkeypatch.setattr(adapter, "unsupported_drafter_head", lambda _w: None)
    monkeypatch.setattr(adapter, "cap_kv_move_chunks", lambda pool: events.append(("cap", pool)))
    monkeypatch.setattr(
        sched_mod, "get_model", lambda: SimpleNamespace(is_startup_weight_load_overlap=False)
    )
    monkeypatch.setattr(sched_mod, "get_device", lambda: SimpleNamespace(gpu_id=0))
    monkeypatch.setattr(
        sched_mod.kv_cache_builder, "resolve_decode_retraction_backup", lambda **_kw: None
    )

    def init_tp_model_worker(self):
        self.tp_worker = tp_worker
        events.append("target worker")

    def stop(_self):  # the attention backends and graphs need a GPU: the order is checked by now
        raise Stop

    _, server_args = _resolve(models, "--speculative-num-draft-tokens", "32")
    fake = SimpleNamespace(
        spec_algorithm=SpeculativeAlgorithm.from_string("DDTREE"),
        server_args=server_args,
        nccl_port=0,
        enable_unified_memory=False,
    )
    for name in ("maybe_init_draft_worker", "init_memory_pools", "init_target_memory_pool"):
        setattr(fake, name, MethodType(getattr(Scheduler, name), fake))  # SGLang's own
    fake.init_tp_model_worker = MethodType(init_tp_model_worker, fake)
    fake.init_all_attention_backends = MethodType(stop, fake)
    with pytest.raises(Stop):
        Scheduler.init_model_worker(fake)
    assert isinstance(fake.draft_worker, worker_mod.DDTreeWorker)
    assert events == ["target worker", "draft worker", "target pools", "draft pools", ("cap", kv)]


@pytest.mark.parametrize(
    ("raw", "want"), [(None, None), ("", None), ("warn", "warn"), ("error", "error")]
)
def test_sync_check_env(raw, want):
    env = {} if raw is None else {"SGLANG_DDTREE_SYNC_CHECK": raw}
    assert DDTreeConfig.build(block_size=8, verify_width=8, environ=env).sync_check == want


def test_sync_check_env_refuses_other_modes():
    with pytest.raises(
        ValueError,
        match=r"^SGLANG_DDTREE_SYNC_CHECK='on' is not a mode; valid: warn, error \(or unset: off\)\.$",
    ):
        DDTreeConfig.build(block_size=8, verify_width=8, environ={"SGLANG_DDTREE_SYNC_CHECK": "on"})


def test_worker_init_resizes_the_draft_block_and_pool_allocation_caps_the_kv_move(monkeypatch):
    """DDTreeWorker.__init__ over upstream's: the draft block back to the drafter's (upstream took
    the verify width), the verify width as the step's draft tokens. SGLang's KV move is capped at
    rows that do not spill (adapter.cap_kv_move_chunks) when the scheduler hands the worker the
    target's allocator (alloc_memory_pool), not in __init__: the scheduler builds the draft worker
    before any pool, so the target's runner has no allocator then (session 10's cap in __init__
    crashed every DDTREE server on the H200 with AttributeError on None)."""
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    from sglang_spec.plugin import adapter
    from sglang_spec.plugin import worker as worker_mod

    kv = object()
    allocator = SimpleNamespace(get_kvcache=lambda: kv)

    def upstream_init(self, *_args):
        self.model_runner = SimpleNamespace(token_to_kv_pool_allocator=None)  # pools come later
        self.device = torch.device("cpu")
        self.speculative_num_draft_tokens = 32  # the width leak resize_draft_block undoes

    def upstream_alloc(
        _self, memory_pool_config=None, req_to_token_pool=None, token_to_kv_pool_allocator=None
    ):
        calls.append(
            ("draft pools", memory_pool_config, req_to_token_pool, token_to_kv_pool_allocator)
        )

    calls = []
    cfg = DDTreeConfig(block_size=16, verify_width=32, topk_per_depth=4, tree_temperature=0.75)
    monkeypatch.setattr(DFlashWorkerV2, "__init__", upstream_init)
    monkeypatch.setattr(DFlashWorkerV2, "alloc_memory_pool", upstream_alloc)
    monkeypatch.setattr(worker_mod, "runtime_config", lambda: cfg)
    monkeypatch.setattr(worker_mod, "get_parallel", lambda: SimpleNamespace(tp_rank=1, tp_group=0))
    monkeypatch.setattr(adapter, "resize_draft_block", lambda _w, b: calls.append(("block", b)))
    monkeypatch.setattr(adapter, "cap_kv_move_chunks", lambda pool: calls.append(("cap", pool)))
    monkeypatch.setattr(adapter, "unsupported_drafter_head", lambda _w: None)
    w = worker_mod.DDTreeWorker("server_args", 0, 0, "target")
    assert calls == [("block", 16)]
    # the scheduler's init_memory_pools: the target's pools, then the draft worker's, keywords
    w.model_runner.token_to_kv_pool_allocator = allocator
    w.alloc_memory_pool(
        memory_pool_config="cfg", req_to_token_pool="req", token_to_kv_pool_allocator=allocator
    )
    assert calls == [("block", 16), ("draft pools", "cfg", "req", allocator), ("cap", kv)]
    assert w.config is cfg and w.speculative_num_draft_tokens == 32
    assert w.stage_timer is None and w.budgets is None
    # the draft window's columns cover the verify (32) beyond the draft block (16)
    assert torch.equal(w.window_offsets, torch.arange(32))


def test_worker_prewarms_sampling_without_dflashs_dense_rehearsal(monkeypatch):
    """DDTreeWorker.prewarm_sampling is the generic one (BaseSpecWorker's: the target runner's),
    not DFLASH's: DFLASH's rehearses its dense [rows, V] chain sampler, sized by the verify width,
    which DDTREE never runs (a Qwen3.5-4B-shaped DDTREE(63) server ran out of memory in it at
    start-up, session 14)."""
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    from sglang_spec.plugin import worker as worker_mod

    def dflash_rehearsal(_self):
        raise AssertionError("DFLASH's dense-sampler rehearsal ran")

    monkeypatch.setattr(DFlashWorkerV2, "prewarm_sampling", dflash_rehearsal)
    w = worker_mod.DDTreeWorker.__new__(worker_mod.DDTreeWorker)
    generic = object()
    w._target_worker = SimpleNamespace(
        model_runner=SimpleNamespace(prewarm_sampling=lambda: generic)
    )
    assert w.prewarm_sampling() is generic

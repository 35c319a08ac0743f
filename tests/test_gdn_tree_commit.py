"""Patch 0003 (GDN tree ReplaySSM, commit side) on a patched copy of each pin that carries it.

The copy (``patched_sglang.py``) is the installed SGLang 0.5.23 or the 0.5.22 wheel, with the
project's whole series for that release applied by ``sglang_spec.patching.core.apply``.
``gdn_tree_commit_cases.py`` runs in a child process with the copy first on ``sys.path`` and
``TRITON_INTERPRET=1`` (SGLang's fold is a Triton kernel) and returns raw results; the references
are computed here, the same for both pins:

* the fold replays the accepted PATH: ring column ``accept_index[b, t] - b * N`` of the request's
  ring row, equal to ``sglang_spec.gdn.replay_path_state`` (k l2-normalised as the fold does), the
  extra_buffer track slot gets the state after the node it names, a padding row stays untouched;
* a linear chain (``accept_index = b * N + t``) gives the released fold's checkpoint bit for bit;
* ``MambaPool`` allocates, for a GDN tree with the flag, the raw-input window (one column per node)
  and the conv inputs (no per-node conv windows), and neither ``intermediate_ssm`` nor the chain's d/k
  rings and cursors; the patched commit rebuilds each request's conv state (and the track slot's)
  from its conv inputs along the accepted path;
  a KDA tree is refused;
* the pricing at the Qwen3.6-27B shape is docs/gdn-tree-caching.md §3's table;
* ``attention_hook`` (left unpatched) still refuses user-set EAGLE trees with the flag, GDN or KDA,
  and passes chains and trees without it;
* the DDTREE plug-in finds the series applied (what lets it accept the flag).
"""

from __future__ import annotations

import pytest
import torch
from patched_sglang import GDN_TREE_PINS, PATCHES, REPO, gdn_fold, patched_copy, run_cases

from sglang_spec.gdn import replay_path_state
from sglang_spec.patching import core

N = 9  # gdn_tree_commit_cases.N


@pytest.fixture(scope="module", params=GDN_TREE_PINS)
def results(request, tmp_path_factory):
    version = request.param
    root = patched_copy(tmp_path_factory.mktemp(f"patched_sglang_{version}"), version)
    assert "0003-gdn-tree-replayssm-commit.patch" in core.load_patch_set(PATCHES, version).series
    fold = gdn_fold(version)
    saved = run_cases(
        root,
        "gdn_tree_commit_cases.py",
        str(root),
        fold,
        str(root / "pristine" / fold),
        str(REPO),
        timeout=600,
    )
    return {**saved, "version": version}


def expected_fold(case, b: int, path: list[int]) -> torch.Tensor:
    """The state after ``path`` for request ``b``, per layer, in SGLang's ``[Hv, V, K]`` layout."""
    ring, row = case["ring"], int(case["ring_idx"][b])
    slot = int(case["state_idx"][b])
    idx = torch.tensor(path)
    out = []
    for layer in range(case["temporal"].shape[0]):
        k = ring["rawk"][layer, row][:, idx].float().transpose(0, 1)  # [D, Hk, K]
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)  # the fold's division l2-norm
        v = ring["rawv"][layer, row][:, idx].float().transpose(0, 1)
        g = ring["g"][layer, row][:, idx].transpose(0, 1)
        beta = ring["beta"][layer, row][:, idx].transpose(0, 1)
        s0 = case["temporal"][layer, slot].transpose(-1, -2)  # [Hv, K, V]
        d = len(path)
        state = replay_path_state(
            k[None],
            v[None],
            g[None],
            beta[None],
            torch.arange(d)[None],
            s0[None],
        )[0]
        out.append(state.transpose(-1, -2))
    return torch.stack(out)


def test_fold_replays_the_accepted_tree_path(results):
    case = results["tree"]
    out, temporal = case["out"], case["temporal"]
    assert max(len(p) for p in case["paths"]) >= 4  # paths through the tree, not just the root
    for b, path in enumerate(case["paths"]):
        slot = int(case["state_idx"][b])
        if slot < 0:
            continue
        assert path != list(range(len(path)))  # a path a prefix-replay would get wrong
        want = expected_fold(case, b, path)
        assert (out[:, slot] - want).abs().max() <= 1e-5, b
        assert (out[:, slot] - temporal[:, slot]).abs().max() > 1e-2  # it did fold
    # the padding request (state slot -1) wrote nothing: only folded and tracked slots changed
    touched = {int(s) for s in case["state_idx"] if s >= 0}
    touched |= {int(s) for s, t in zip(case["track_slots"], case["track_steps"]) if t >= 0}
    for slot in range(temporal.shape[1]):
        if slot not in touched:
            assert torch.equal(out[:, slot], temporal[:, slot]), slot


def test_commit_rebuilds_conv_states_from_the_conv_inputs(results):
    """The patched commit on a GDN tree pool: each request's checkpoint is the fold of its accepted
    path and its conv state the last 3 columns of (pre-verify state, its path's conv inputs), from
    its request row; the track slot gets the state as of the node it names; other slots keep theirs."""
    case = results["commit"]
    inputs, conv = case["conv_inputs"], case["conv"]
    touched = set()
    for b, path in enumerate(case["paths"]):
        slot = int(case["state_idx"][b])
        touched.add(slot)
        torch.testing.assert_close(
            case["out"][:, slot], expected_fold(case, b, path), rtol=2e-5, atol=2e-5
        )
        cols = ([0, 1, 2] + [3 + node for node in path])[-3:]
        assert torch.equal(case["conv_out"][:, slot], inputs[:, b, cols].transpose(1, 2)), b
    track = int(case["track_slots"][0])
    cols = ([0, 1, 2] + [3 + node for node in case["paths"][0][:2]])[-3:]
    assert torch.equal(case["conv_out"][:, track], inputs[:, 0, cols].transpose(1, 2))
    # slot 0 is SGLang's dummy slot: it absorbs the writes of the requests that track nothing
    others = [s for s in range(1, conv.shape[1]) if s not in touched | {track}]
    assert torch.equal(case["conv_out"][:, others], conv[:, others])


def test_track_slot_gets_the_state_after_the_node_it_names(results):
    case = results["tree"]
    tracked = 0
    for b, path in enumerate(case["paths"]):
        slot, node = int(case["track_slots"][b]), int(case["track_steps"][b])
        if slot < 0 or node < 0 or int(case["state_idx"][b]) < 0:
            continue
        # the node's place on the path is not the node index itself
        assert path.index(node) != node
        want = expected_fold(case, b, path[: path.index(node) + 1])
        assert (case["out"][:, slot] - want).abs().max() <= 1e-5, b
        tracked += 1
    assert tracked == 2


def test_chain_fold_is_the_released_fold_bit_for_bit(results):
    case = results["chain"]
    assert not torch.equal(case["unpatched"], case["temporal"])  # both folded something
    assert torch.equal(case["patched"], case["unpatched"])


def test_pool_allocates_the_tree_window_and_no_intermediate_ssm(results):
    tree, chain = results["pool"]["tree"], results["pool"]["chain"]
    # 3 layers, spec_state_size 4 -> 5 request rows, Hk 2, Hv 6, K 16, V 48, N 9 columns
    assert tree["fold"] is True and tree["cursors"] is False
    assert tree["shapes"] == {
        "replayssm_rawk": (3, 5, 2, N, 16),
        "replayssm_rawv": (3, 5, 6, N, 48),
        "replayssm_g": (3, 5, 6, N),
        "replayssm_beta": (3, 5, 6, N),
        "replayssm_d": None,
        "replayssm_k": None,
        "intermediate_ssm": None,
    }
    assert tree["dtypes"] == {
        "replayssm_rawk": "torch.bfloat16",
        "replayssm_rawv": "torch.bfloat16",
        "replayssm_g": "torch.float32",
    }
    # no per-node conv windows: the conv inputs, 3 pre-verify state columns + N node inputs per
    # request row (conv_dim = 6*48 + 2*2*16 = 352, kernel 4), in the conv dtype
    assert tree["conv_windows"] == []
    assert tree["conv_inputs"] == ((3, 5, 3 + N, 352), "torch.bfloat16")
    # the GDN chain keeps its compact circular ring (unchanged by the patch)
    assert chain["fold"] is False and chain["cursors"] is True
    assert chain["conv_inputs"] is None and len(chain["conv_windows"]) == 1
    assert chain["shapes"]["replayssm_d"] is not None and chain["shapes"]["replayssm_beta"] is None


def test_kda_tree_is_refused(results):
    msg = results["pool"]["kda_tree"]
    assert "supports Gated-DeltaNet models only" in msg and "KDA" in msg


def test_pricing_matches_the_design_table(results):
    p = results["pricing"]
    gb = 1e9
    assert p["conv_numel"] == 10240 * 3
    assert round(p["per_req"] / gb, 3) == 0.154  # the checkpoint, for scale
    # N = 65: raw-input window 0.052 GB + conv inputs (3 state columns + 65 nodes) 0.067 GB
    # (§3 and §7; the per-node conv windows they replace cost 48 * 65 * 10240 * 3 * 2 = 0.192 GB)
    ring65 = 48 * 65 * (16 * 128 * 2 + 48 * 128 * 2 + 2 * 48 * 4)
    assert p["tree65"] == ring65 + 48 * (3 + 65) * 10240 * 2
    assert (round(ring65 / gb, 3), round((p["tree65"] - ring65) / gb, 3)) == (0.052, 0.067)
    # N = 17: 0.014 + 0.020
    ring17 = 48 * 17 * (16 * 128 * 2 + 48 * 128 * 2 + 2 * 48 * 4)
    assert round(ring17 / gb, 3) == 0.014
    assert round((p["tree17"] - ring17) / gb, 3) == 0.020
    # the chain pricing is SGLang's own, unchanged: compact d/k/g + low parts at L = 16
    assert p["chain16"] == 48 * 16 * (2 * (48 * 128 * 2 + 16 * 128 * 2) + 48 * 4)


def test_tree_request_rows_are_priced_for_the_requests_the_slots_admit(results):
    """A GDN tree's request rows (ring + conv inputs) are allocated for min(max_running_requests,
    slots // ratio) + 1 requests, so the solve prices exactly those rows jointly with the slots:
    the priced memory fits the mamba budget, one more request's slots and row would not, the
    remainder goes back to the KV pool, and where --max-running-requests binds the slots are the
    released formula's. A chain keeps the released pricing ((mrr + 1) rows, fixed)."""
    sol = results["solve"]
    p, ratio, gib = sol["slot"], sol["ratio"], 1 << 30
    assert (ratio, sol["width"]) == (4, 64)  # extra_buffer, overlap off; DDTREE(63)
    binding = 0
    for c in sol["cases"]:
        k, b, mrr = c["slots"], c["budget"], c["mrr"]
        released = int(
            (b - (mrr + 1) * (sol["tree_row"] if c["topk"] > 1 else sol["chain_row"]) - p) // p
        )
        if c["topk"] == 1:
            assert k == released, c
            priced = (k + 1) * p + (mrr + 1) * sol["chain_row"]
        else:
            row = sol["tree_row"]
            rows = min(mrr, k // ratio) + 1
            priced = (k + 1) * p + rows * row
            assert priced <= b, c
            if k // ratio < mrr:  # the slots bind: one more request would not fit
                assert (k + ratio + 1) * p + (rows + 1) * row > b, c
            else:  # --max-running-requests binds: the released formula
                assert k == released, c
                binding += 1
            assert k >= released, c
        assert abs(c["after_gib"] - (c["rest_gib"] - priced / gib)) < 1e-9, c
    assert binding == 2  # mrr 8 at both budgets; mrr 64 binds nowhere
    # the session-4 case (rest 57.647 GiB, mrr 64): 158 slots, 39 requests (docs §7's projection;
    # per-node conv windows: 135, 33; SGLang's per-node states: 88, 22)
    s4 = next(c for c in sol["cases"] if (c["topk"], c["mrr"], c["rest_gib"]) == (63, 64, 57.647))
    assert (s4["slots"], s4["slots"] // ratio) == (158, 39)


def test_attention_hook_still_refuses_eagle_trees_with_the_flag(results):
    """0003 leaves attention_hook as released: a user-set EAGLE tree (topk > 1) with the flag is
    refused (its verify input has no per-node path table for 0002's kernel); chains and trees
    without the flag pass. DDTREE sets its tree topk after this hook and is validated by the
    plug-in."""
    hook = results["hook"]
    for case in ("gdn_tree", "kda_tree", "gdn_tree_flashinfer_verify"):
        assert "requires a linear draft chain" in hook[case], case
        assert "--speculative-eagle-topk=4" in hook[case], case
    assert hook["gdn_chain"] == "accepted" and hook["kda_chain"] == "accepted"
    assert hook["gdn_tree_no_flag"] == "accepted"


def test_plugin_sees_the_gdn_tree_patches_applied(results):
    from sglang_spec.plugin.config import GDN_TREE_PATCHES, check_linear_replayssm_spec

    series = tuple(core.load_patch_set(PATCHES, results["version"]).series)
    assert results["applied"] == series
    assert set(GDN_TREE_PATCHES) <= set(series)
    # what the plug-in reads lets it accept --enable-linear-replayssm-spec on this pin
    check_linear_replayssm_spec(True, results["applied"], None, 64)

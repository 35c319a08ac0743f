"""sglang_spec.gdn.tree_conv: the GDN tree verify keeps conv inputs, the commit rebuilds the conv
state.

Oracle: a plain loop per request, the definition of a causal conv's state -- the last ``W - 1``
entries of "the conv state before the verify, then the inputs along the accepted root-first path".
The comparison with SGLang's own conv-window kernels (per-node windows + its commit scatter) is in
tests/test_sglang_gdn_kernels.py (``test_conv_inputs_commit_equals_sglangs_window_scatter``).
"""

from __future__ import annotations

import pytest
import torch

from sglang_spec.gdn.tree_conv import commit_conv_states, conv_inputs_buffer, save_conv_inputs
from sglang_spec.tree import build_ddtree

W = 4  # SGLang's GDN conv kernel; the state keeps W - 1 columns
C = 6
LAYERS = 3
SLOTS = 9


def _trees(bs: int, budget: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(bs, 7, 5, generator=g) * 2
    return build_ddtree(logits, budget, torch.zeros(bs, dtype=torch.long)).parents


def _path(parents_row: torch.Tensor, node: int) -> list[int]:
    path = [node]
    while path[-1] > 0:
        path.append(int(parents_row[path[-1]]))
    return path[::-1]


def _setup(bs: int, budget: int, seed: int, dtype=torch.float32, activations=None, channels=C):
    """Pools (conv dtype ``dtype``), the verify's conv inputs (``activations``, default the same)
    and one random accepted path per request, ``accept_index`` exactly as wide as the longest."""
    g = torch.Generator().manual_seed(seed)
    parents = _trees(bs, budget, seed)
    n = parents.shape[1]
    # laid out as SGLang's pool: channels contiguous
    conv = torch.randn(LAYERS, SLOTS, W - 1, channels, generator=g).to(dtype).transpose(2, 3)
    mixed = torch.randn(LAYERS, bs * n, channels, generator=g).to(activations or dtype)
    slots = torch.randperm(SLOTS - 1, generator=g)[:bs] + 1  # slot 0 is SGLang's dummy
    rows = torch.randperm(bs + 2, generator=g)[:bs]  # any rows, not the batch positions
    paths = []
    for b in range(bs):
        real = int((parents[b] >= 0).sum()) + 1
        paths.append(_path(parents[b], int(torch.randint(real, (1,), generator=g))))
    depth = max(len(p) for p in paths)
    accept_index = torch.full((bs, depth), -1, dtype=torch.int64)
    for b, p in enumerate(paths):
        accept_index[b, : len(p)] = torch.tensor(p) + b * n
    lens = torch.tensor([len(p) for p in paths], dtype=torch.int32)
    return dict(
        n=n,
        conv=conv,
        mixed=mixed,
        slots=slots,
        rows=rows,
        paths=paths,
        index=accept_index,
        lens=lens,
    )


def _verify(s: dict, width: int | None = None) -> torch.Tensor:
    """Every layer's save_conv_inputs into a fresh pool buffer (NaN: unwritten entries show)."""
    bs = s["slots"].shape[0]
    inputs = conv_inputs_buffer(
        tuple(s["conv"].shape[2:]), LAYERS, bs + 2, width or s["n"], s["conv"].dtype, "cpu"
    ).fill_(float("nan"))
    for layer in range(LAYERS):
        save_conv_inputs(inputs[layer], s["conv"][layer], s["slots"], s["rows"], s["mixed"][layer])
    return inputs


def _expected_state(s: dict, layer: int, b: int, path: list[int]) -> torch.Tensor:
    n = s["n"]
    seq = [s["conv"][layer, s["slots"][b], :, j] for j in range(W - 1)]
    seq += [s["mixed"][layer, b * n + node].to(s["conv"].dtype) for node in path]
    return torch.stack(seq[-(W - 1) :], dim=1)  # [C, W - 1], oldest first


def test_buffer_shape_and_dtype():
    buf = conv_inputs_buffer((10240, 3), 48, 37, 65, torch.bfloat16, "meta")  # 2.5 GB if real
    assert buf.shape == (48, 37, 3 + 65, 10240) and buf.dtype == torch.bfloat16
    assert buf.device.type == "meta"


@pytest.mark.parametrize("budget", [6, 20, 40])
@pytest.mark.parametrize(
    "dtype, activations",
    [(torch.float32, None), (torch.bfloat16, None), (torch.float32, torch.bfloat16)],
)
def test_commit_equals_the_accepted_paths_last_inputs(budget, dtype, activations):
    """New conv state = last W - 1 of (pre-verify state, accepted path's inputs), on every layer,
    bit for bit (copies, and a cast where SGLANG_MAMBA_CONV_DTYPE differs from the activations);
    slots no request owns are untouched."""
    s = _setup(bs=4, budget=budget, seed=budget, dtype=dtype, activations=activations)
    inputs = _verify(s)
    conv = s["conv"].clone()
    conv[:, s["slots"]] = 7  # what SGLang's conv kernel leaves behind: garbage, overwritten
    commit_conv_states(conv, inputs, s["slots"], s["rows"], s["index"], s["lens"], s["n"])
    for layer in range(LAYERS):
        for b, path in enumerate(s["paths"]):
            want = _expected_state(s, layer, b, path)
            assert torch.equal(conv[layer, s["slots"][b]], want), (layer, b, path)
    others = torch.ones(SLOTS, dtype=torch.bool)
    others[s["slots"]] = False
    assert torch.equal(conv[:, others], s["conv"][:, others])


def test_short_paths_continue_into_the_pre_verify_state():
    """Root only (1 input) and depth 1 (2 inputs): W - 1 = 3 columns need the old state's tail."""
    s = _setup(bs=2, budget=20, seed=3)
    s["paths"] = [[0], _path(_trees(2, 20, 3)[1], 1)]
    assert len(s["paths"][1]) == 2
    s["index"].fill_(-1)
    for b, p in enumerate(s["paths"]):
        s["index"][b, : len(p)] = torch.tensor(p) + b * s["n"]
    s["lens"] = torch.tensor([1, 2], dtype=torch.int32)
    inputs = _verify(s)
    conv = s["conv"].clone()
    commit_conv_states(conv, inputs, s["slots"], s["rows"], s["index"], s["lens"], s["n"])
    old0 = s["conv"][:, s["slots"][0]]
    assert torch.equal(conv[:, s["slots"][0], :, :2], old0[..., 1:])
    assert torch.equal(conv[:, s["slots"][0], :, 2], s["mixed"][:, 0])
    old1 = s["conv"][:, s["slots"][1]]
    assert torch.equal(conv[:, s["slots"][1], :, 0], old1[..., 2])
    for layer in range(LAYERS):
        assert torch.equal(conv[layer, s["slots"][1]], _expected_state(s, layer, 1, s["paths"][1]))


def test_a_request_that_commits_nothing_writes_only_the_dummy_slot():
    s = _setup(bs=3, budget=20, seed=5)
    s["lens"][1] = 0
    inputs = _verify(s)
    conv = s["conv"].clone()
    commit_conv_states(conv, inputs, s["slots"], s["rows"], s["index"], s["lens"], s["n"])
    assert torch.equal(conv[:, s["slots"][1]], s["conv"][:, s["slots"][1]])
    for b in (0, 2):
        assert torch.equal(conv[0, s["slots"][b]], _expected_state(s, 0, b, s["paths"][b]))
    changed = (conv != s["conv"]).flatten(2).any(-1).any(0)
    assert set(changed.nonzero().flatten().tolist()) <= {0, *s["slots"][[0, 2]].tolist()}


def test_track_snapshot_is_the_state_as_of_the_tracked_node():
    """extra_buffer: the tracked node's conv state goes to the track slot -- a middle node, the
    root; a node off the accepted path, or -1 (request 0, whose padded accept_index columns hold
    -1 too), writes nothing there."""
    s = _setup(bs=4, budget=40, seed=11)
    parents = _trees(4, 40, 11)
    for b in range(4):  # request 0 short (padded), the others at least 3 long
        if b == 0:
            s["paths"][0] = s["paths"][0][:2]
        elif len(s["paths"][b]) < 3:
            deepest = max(range(parents.shape[1]), key=lambda i: len(_path(parents[b], i)))
            s["paths"][b] = _path(parents[b], deepest)
    depth = max(len(p) for p in s["paths"])
    assert len(s["paths"][0]) < depth
    s["index"] = torch.full((4, depth), -1, dtype=torch.int64)
    for b, p in enumerate(s["paths"]):
        s["index"][b, : len(p)] = torch.tensor(p) + b * s["n"]
    s["lens"] = torch.tensor([len(p) for p in s["paths"]], dtype=torch.int32)
    inputs = _verify(s)
    track_slots = torch.tensor([i for i in range(1, SLOTS) if i not in s["slots"].tolist()][:4])
    off_path = next(i for i in range(1, s["n"]) if i not in s["paths"][2])
    track_nodes = torch.tensor([-1, s["paths"][1][1], off_path, 0])
    conv = s["conv"].clone()
    commit_conv_states(
        conv, inputs, s["slots"], s["rows"], s["index"], s["lens"], s["n"], track_slots, track_nodes
    )
    for layer in range(LAYERS):
        assert torch.equal(
            conv[layer, track_slots[1]], _expected_state(s, layer, 1, s["paths"][1][:2])
        )
        assert torch.equal(conv[layer, track_slots[3]], _expected_state(s, layer, 3, [0]))
        for b in range(4):
            want = _expected_state(s, layer, b, s["paths"][b])
            assert torch.equal(conv[layer, s["slots"][b]], want)
    untouched = track_slots[[0, 2]]
    assert torch.equal(conv[:, untouched], s["conv"][:, untouched])


def check_triton_commit_equals_torch(device: str = "cpu") -> None:
    """The Triton commit (one launch) writes what the torch commit writes into every slot but
    SGLang's dummy slot 0 (where the torch form parks the requests that commit nothing): int32
    accept_index and lengths as SGLang passes them, a request that commits nothing, channels
    spanning several blocks, with and without the track snapshot (a middle node, the root, a node
    off the accepted path and -1), float32 and bf16 conv states."""
    from sglang_spec.gdn.triton_tree_conv import BLOCK_C, commit_conv_states_triton

    for dtype in (torch.float32, torch.bfloat16):
        s = _setup(bs=4, budget=40, seed=13, dtype=dtype, channels=BLOCK_C + 40)
        s["lens"][2] = 0
        inputs = _verify(s)
        index = s["index"].to(torch.int32)
        others = [i for i in range(1, SLOTS) if i not in s["slots"].tolist()]
        off_path = next(i for i in range(1, s["n"]) if i not in s["paths"][2])
        mid = s["paths"][1][len(s["paths"][1]) // 2]
        track = (torch.tensor(others[:4]), torch.tensor([-1, mid, off_path, 0]))
        for tracked in (None, track):
            want = s["conv"].clone()
            got = s["conv"].clone().to(device)
            extra = () if tracked is None else tracked
            commit_conv_states(
                want, inputs, s["slots"], s["rows"], index, s["lens"], s["n"], *extra
            )
            commit_conv_states_triton(
                got,
                inputs.to(device),
                s["slots"].to(device),
                s["rows"].to(device),
                index.to(device),
                s["lens"].to(device),
                s["n"],
                *(t.to(device) for t in extra),
            )
            got = got.cpu()
            assert torch.equal(got[:, 1:], want[:, 1:]), (dtype, tracked is not None)
            assert torch.equal(got[:, 0], s["conv"][:, 0])  # nothing parked in the dummy slot


def test_triton_commit_equals_torch_under_interpreter():
    from tree_testing import run_under_triton_interpreter

    run_under_triton_interpreter(
        "test_gdn_tree_conv", "check_triton_commit_equals_torch", "COMMIT_OK"
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled Triton kernels need CUDA")
def test_triton_commit_equals_torch_on_cuda():
    check_triton_commit_equals_torch("cuda")


def test_verify_rows_hold_the_state_then_the_inputs_and_a_narrower_width_fits():
    """The row is [pre-verify columns | node inputs]; a verify narrower than the pool's width (an
    adaptive budget) writes its first columns only."""
    s = _setup(bs=2, budget=20, seed=7)
    inputs = _verify(s, width=s["n"] + 5)
    for b in range(2):
        row = inputs[:, s["rows"][b]]
        assert torch.equal(row[:, : W - 1], s["conv"][:, s["slots"][b]].transpose(1, 2))
        got = row[:, W - 1 : W - 1 + s["n"]]
        assert torch.equal(got, s["mixed"][:, b * s["n"] : (b + 1) * s["n"]])
        assert row[:, W - 1 + s["n"] :].isnan().all()


def check_triton_save_equals_torch(device: str = "cpu") -> None:
    """The Triton save (one launch per layer) writes what the torch save writes, bit for bit: a
    conv state laid out as SGLang's (channels contiguous), a padding request (slot -1: reads the
    dummy slot 0), conv inputs that are a strided view cast to the conv dtype, channels spanning
    several blocks and a verify narrower than the buffer (entries beyond it untouched)."""
    from sglang_spec.gdn.triton_tree_conv import BLOCK_C, save_conv_inputs_triton

    g = torch.Generator().manual_seed(0)
    channels, bs, n, state_len = BLOCK_C + 300, 3, 5, W - 1
    for conv_dtype, act_dtype in ((torch.float32, torch.float32), (torch.float32, torch.bfloat16)):
        states = torch.randn(SLOTS, state_len, channels, generator=g).to(conv_dtype)
        states = states.transpose(1, 2)  # [slots, C, W - 1] with stride(-2) == 1, as SGLang's
        wide = torch.randn(bs * n, channels + 7, generator=g).to(act_dtype)
        mixed = wide[:, 3 : 3 + channels]  # a strided view, as a split of a projection
        slots = torch.tensor([4, -1, 2])
        rows = torch.tensor([2, 0, 4])
        want = torch.full((6, state_len + n + 2, channels), float("nan"), dtype=conv_dtype)
        got = want.clone().to(device)
        save_conv_inputs(want, states, slots, rows, mixed)
        save_conv_inputs_triton(
            got, states.to(device), slots.to(device), rows.to(device), mixed.to(device)
        )
        got = got.cpu()
        assert torch.equal(got.isnan(), want.isnan()), (conv_dtype, act_dtype)
        assert torch.equal(got.nan_to_num(), want.nan_to_num()), (conv_dtype, act_dtype)
        assert torch.equal(want[0, :state_len], states[0].T)  # the padding request's row: slot 0
        assert got[:, state_len + n :].isnan().all()


def test_triton_save_equals_torch_under_interpreter():
    from tree_testing import run_under_triton_interpreter

    run_under_triton_interpreter("test_gdn_tree_conv", "check_triton_save_equals_torch", "SAVE_OK")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled Triton kernels need CUDA")
def test_triton_save_equals_torch_on_cuda():
    check_triton_save_equals_torch("cuda")


def check_triton_tree_conv_equals_torch(device: str = "cpu") -> None:
    """The Triton tree conv (one launch per layer) gives the torch form's outputs: real trees with
    padding slots, a padding request (slot -1: reads the dummy slot 0), channels and nodes spanning
    several blocks, a conv state laid out as SGLang's (channels contiguous), a strided input view,
    with and without a bias; on CUDA also bf16 activations on a float32 conv state (the Triton
    interpreter garbles bf16)."""
    from sglang_spec.gdn import tree_paths
    from sglang_spec.gdn.tree_conv import tree_conv
    from sglang_spec.gdn.triton_tree_conv import (
        TREE_CONV_CHANNELS,
        TREE_CONV_NODES,
        tree_conv_triton,
    )

    g = torch.Generator().manual_seed(1)
    channels, bs = TREE_CONV_CHANNELS + 40, 3
    parents = _trees(bs, TREE_CONV_NODES + 2, 1)
    parents = torch.cat([parents, torch.full((bs, 3), -1)], 1)  # three padding slots
    n = parents.shape[1]
    assert n > TREE_CONV_NODES  # two node blocks
    paths = tree_paths(parents, width=8).to(torch.int32)
    slots = torch.tensor([4, -1, 2], dtype=torch.int32)
    cases = [(torch.float32, torch.float32, True), (torch.float32, torch.float32, False)]
    if device == "cuda":
        cases.append((torch.float32, torch.bfloat16, False))
    for conv_dtype, act_dtype, with_bias in cases:
        states = torch.randn(SLOTS, W - 1, channels, generator=g).to(conv_dtype).transpose(1, 2)
        wide = torch.randn(bs * n, channels + 5, generator=g).to(act_dtype)
        x = wide[:, 2 : 2 + channels]
        weight = torch.randn(channels, W, generator=g).to(act_dtype)
        bias = torch.randn(channels, generator=g).to(act_dtype) if with_bias else None
        want = tree_conv(x, states, weight, bias, True, slots, paths)
        tol = 1e-6 if act_dtype == torch.float32 else 2**-8  # bf16 outputs: one rounding step
        # the launcher's tile, and a sweep's smaller one (benchmarks/gdn_tree_recurrence.py --conv)
        for tile in ({}, dict(block_n=8, block_c=64, num_warps=2)):
            got = tree_conv_triton(
                *(t.to(device) for t in (x, states, weight)),
                None if bias is None else bias.to(device),
                True,
                slots.to(device),
                paths.to(device),
                **tile,
            ).cpu()
            assert got.dtype == act_dtype
            torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="block_c must be a power of two; got 96"):
        tree_conv_triton(x, states, weight, None, True, slots, paths, block_c=96)


def test_triton_tree_conv_equals_torch_under_interpreter():
    from tree_testing import run_under_triton_interpreter

    run_under_triton_interpreter(
        "test_gdn_tree_conv", "check_triton_tree_conv_equals_torch", "CONV_OK"
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled Triton kernels need CUDA")
def test_triton_tree_conv_equals_torch_on_cuda():
    check_triton_tree_conv_equals_torch("cuda")


def test_tree_conv_is_the_causal_conv_along_each_path():
    """Oracle: per node, the definition -- the last W entries of "pre-verify state columns, then the
    inputs along its root-first path", dotted with the weight, plus the bias, SiLU -- on trees
    deeper than the kernel (state columns run out) and shallower (state columns used)."""
    from sglang_spec.gdn import tree_paths
    from sglang_spec.gdn.tree_conv import tree_conv

    g = torch.Generator().manual_seed(2)
    bs = 2
    parents = _trees(bs, 12, 2)
    n = parents.shape[1]
    states = torch.randn(SLOTS, C, W - 1, generator=g, dtype=torch.float64)
    x = torch.randn(bs * n, C, generator=g, dtype=torch.float64)
    weight = torch.randn(C, W, generator=g, dtype=torch.float64)
    bias = torch.randn(C, generator=g, dtype=torch.float64)
    slots = torch.tensor([3, 5])
    got = tree_conv(x, states, weight, bias, True, slots, tree_paths(parents, width=16))
    depths = []
    for b in range(bs):
        for i in range(n):
            if i > 0 and parents[b, i] < 0:
                continue  # a padding slot
            path = _path(parents[b], i)
            depths.append(len(path) - 1)
            seq = torch.cat(
                [states[slots[b]].T, x[b * n + torch.tensor(path)]]
            )  # [W - 1 + D + 1, C]
            pre = (seq[-W:] * weight.T).sum(0) + bias
            torch.testing.assert_close(got[b * n + i], pre * torch.sigmoid(pre))
    assert min(depths) < W - 1 < max(depths)

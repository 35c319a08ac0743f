"""``e2e/kit_norms.py``: the GPU kit's four RMSNorms as one Triton launch each, and its SGLang plugin.

The kernel runs under Triton's interpreter here (CUDA where there is one) against the kit stand-in's
torch arithmetic, written out below; the plugin registers its hooks only when asked and only over
the stand-in; ``e2e.kit.install_kit_norms`` makes SGLang's entry-point discovery find it.
"""

from __future__ import annotations

import importlib.metadata
import sys
import types
from collections import defaultdict

import pytest
import torch

from e2e import kit

KIT_FLAGS = "--attention-backend triton --disable-cuda-graph"


def _stand_in(x, residual, weight, eps, gemma):
    """The kit's sgl_kernel stand-in (shared/sglang-gpu-kit/shim): float32 math, the weight (or
    1 + weight), the input's dtype; with a residual, residual = x + residual (rounded) and the
    float32 sum normalised."""
    s = x.float() if residual is None else x.float() + residual.float()
    w = weight.float() + 1.0 if gemma else weight.float()
    y = s * torch.rsqrt(s.pow(2).mean(dim=-1, keepdim=True) + eps) * w
    return y.to(x.dtype), None if residual is None else s.to(residual.dtype)


def _close(got, want):
    """Equal up to one rounding step of the output dtype (float32 sums in another order)."""
    tol = 1e-5 if got.dtype == torch.float32 else 2.0**-7
    err = (got.float() - want.float()).abs() - tol * want.float().abs() - 1e-6
    return err.max().item() <= 0


def check_norms_match_the_stand_in(device: str = "cpu") -> None:
    from e2e import kit_norms as kn

    g = torch.Generator().manual_seed(5)
    for dtype in (torch.bfloat16, torch.float32):
        for n, eps in ((5120, 1e-6), (100, 0.5)):  # a large eps on small inputs: eps counts
            scale = 0.05 if eps > 0.1 else 1.0
            wide = (torch.randn(6, n + 24, generator=g) * scale).to(dtype)
            x2 = wide[:, :n].to(device)  # rows with a stride wider than n
            x3 = (torch.randn(2, 3, n, generator=g) * scale).to(dtype).to(device)
            res = (torch.randn(6, n, generator=g) * scale).to(dtype).to(device)
            w = (torch.randn(n, generator=g) * 0.3).to(dtype).to(device)
            for gemma in (False, True):
                plain = kn.gemma_rmsnorm if gemma else kn.rmsnorm
                fused = kn.gemma_fused_add_rmsnorm if gemma else kn.fused_add_rmsnorm
                for x in (x2, x3):
                    want, _ = _stand_in(x, None, w, eps, gemma)
                    got = plain(x, w, eps)
                    assert got.shape == x.shape and _close(got, want), (dtype, n, gemma)
                    out = torch.empty_like(x)
                    assert plain(x, w, eps, out=out) is out and _close(out, want)
                xi, ri = x2.clone(), res.clone()
                want, want_res = _stand_in(xi, ri, w, eps, gemma)
                assert fused(xi, ri, w, eps) is None  # in place, as sgl_kernel's
                # exact on the GPU; the interpreter's bf16 cast truncates (one step at most)
                exact = device == "cuda" or dtype == torch.float32
                assert torch.equal(ri, want_res) if exact else _close(ri, want_res), (n, gemma)
                assert _close(xi, want), (dtype, n, gemma)


def test_norms_match_the_stand_in_under_interpreter():
    from tree_testing import run_under_triton_interpreter

    run_under_triton_interpreter("test_kit_norms", "check_norms_match_the_stand_in", "NORMS_OK")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled Triton kernels need CUDA")
def test_norms_match_the_stand_in_on_cuda():
    check_norms_match_the_stand_in("cuda")


def test_bad_inputs_are_refused_and_an_empty_batch_launches_nothing():
    from e2e import kit_norms as kn

    empty = torch.zeros(0, 8)
    assert kn.gemma_rmsnorm(empty, torch.zeros(8)).shape == (0, 8)  # no driver here: no launch
    assert kn.fused_add_rmsnorm(empty, torch.zeros(0, 8), torch.zeros(8)) is None
    x = torch.zeros(4, 8)
    with pytest.raises(ValueError, match="last dim must be contiguous"):
        kn.rmsnorm(x.t(), torch.zeros(4))
    with pytest.raises(ValueError, match=r"weight has shape \(7,\); the rows have 8 columns"):
        kn.gemma_rmsnorm(x, torch.zeros(7))


# ------------------------------------------------------------------------------------ the plugin
@pytest.fixture
def registry(monkeypatch):
    """SGLang's HookRegistry with no hooks (restored afterwards) and a fake ``sgl_kernel``."""
    # the device's system python3, which runs the CUDA check, has no SGLang
    HookRegistry = pytest.importorskip("sglang.srt.plugins.hook_registry").HookRegistry
    monkeypatch.setattr(HookRegistry, "_hooks", defaultdict(list))
    monkeypatch.setattr(HookRegistry, "_patched", set())
    fake = types.ModuleType("sgl_kernel")
    fake.__file__ = "/site/sgl_kernel/__init__.py"
    for name in ("rmsnorm", "fused_add_rmsnorm", "gemma_rmsnorm", "gemma_fused_add_rmsnorm"):
        setattr(fake, name, lambda *a, **k: "torch")  # noqa: ARG005
    importer = types.ModuleType("fake_layernorm")  # a module that did `from sgl_kernel import`
    importer.gemma_rmsnorm = fake.gemma_rmsnorm
    monkeypatch.setitem(sys.modules, "sgl_kernel", fake)
    monkeypatch.setitem(sys.modules, "fake_layernorm", importer)
    return HookRegistry, fake, importer


def test_the_plugin_replaces_the_stand_ins_norms_only_when_asked(registry, monkeypatch, capsys):
    from e2e import kit_norms as kn

    hooks, fake, importer = registry
    monkeypatch.delenv(kn.ENV, raising=False)
    kn.register()
    assert not hooks._hooks  # unset: the stand-in's torch norms stay
    fake.IS_PY_SHIM = True
    monkeypatch.setenv(kn.ENV, "triton")
    kn.register()
    assert sorted(hooks._hooks) == sorted(f"sgl_kernel.{n}" for n in kn.NAMES)
    hooks.apply_hooks()
    for name in kn.NAMES:
        assert getattr(fake, name).__wrapped__ is not None
        assert getattr(fake, name) is not getattr(kn, name)  # SGLang's wrapper calls ours
    # the binding `from sgl_kernel import gemma_rmsnorm` made is replaced too, and it runs ours
    launched = []
    monkeypatch.setattr(kn, "_launch", lambda *_, gemma: launched.append(gemma))
    x, w = torch.ones(2, 4), torch.zeros(4)
    assert importer.gemma_rmsnorm(x, w, 1e-6).shape == (2, 4) and launched == [True]
    assert kn.READY in capsys.readouterr().err


def test_the_plugin_refuses_a_real_sgl_kernel_and_an_unknown_mode(registry, monkeypatch):
    from e2e import kit_norms as kn

    hooks, fake, _ = registry
    monkeypatch.setenv(kn.ENV, "triton")
    with pytest.raises(RuntimeError, match="is the real one, whose norms are fused already"):
        kn.register()  # no IS_PY_SHIM: sglang-kernel's own package
    fake.IS_PY_SHIM = True
    monkeypatch.setenv(kn.ENV, "cuda")
    with pytest.raises(ValueError, match="SGLANG_SPEC_KIT_NORMS='cuda'; valid: triton, or unset"):
        kn.register()
    assert not hooks._hooks


def test_install_kit_norms_makes_sglang_find_the_plugin(monkeypatch, tmp_path):
    monkeypatch.delenv("SGLANG_KIT_FLAGS", raising=False)
    with pytest.raises(kit.HarnessError, match="a stock SGLang install runs sgl-kernel's fused"):
        kit.install_kit_norms()
    monkeypatch.setenv("SGLANG_KIT_FLAGS", KIT_FLAGS)
    monkeypatch.setattr(kit, "sglang_site", lambda: tmp_path)
    assert kit.install_kit_norms().startswith(f"kit_norms installed in {tmp_path} (")
    assert kit.install_kit_norms() == f"kit_norms already installed in {tmp_path}"
    # what SGLang's load_plugins() would find on the kit's path
    (dist,) = importlib.metadata.distributions(path=[str(tmp_path)])
    (ep,) = [e for e in dist.entry_points if e.group == "sglang.srt.plugins"]
    assert (ep.name, ep.value) == ("kit_norms", f"{kit.KIT_NORMS_MODULE}:register")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, kit.KIT_NORMS_MODULE, raising=False)
    assert callable(ep.load())
    # a changed e2e/kit_norms.py is written again
    (tmp_path / f"{kit.KIT_NORMS_MODULE}.py").write_text("# an older copy\n")
    assert kit.install_kit_norms() == (
        f"kit_norms installed in {tmp_path} ({kit.KIT_NORMS_MODULE}.py)"
    )


# ------------------------------------------------------------------------------------ the benchmark
STAND_IN = """
import torch
IS_PY_SHIM = True

def _n(x, r, w, eps, gemma):
    s = x.float() if r is None else x.float() + r.float()
    w = w.float() + {one} if gemma else w.float()
    return (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * w).to(x.dtype), s

def rmsnorm(x, w, eps=1e-6, out=None, enable_pdl=None):
    return _n(x, None, w, eps, False)[0]

def gemma_rmsnorm(x, w, eps=1e-6, out=None, enable_pdl=None):
    return _n(x, None, w, eps, True)[0]

def fused_add_rmsnorm(x, r, w, eps=1e-6, enable_pdl=None):
    y, s = _n(x, r, w, eps, False)
    r.copy_(s.to(r.dtype)); x.copy_(y)

def gemma_fused_add_rmsnorm(x, r, w, eps=1e-6, enable_pdl=None):
    y, s = _n(x, r, w, eps, True)
    r.copy_(s.to(r.dtype)); x.copy_(y)
"""


@pytest.mark.parametrize("one,rc", [("1.0", 0), ("0.0", 1)])
def test_benchmark_checks_the_kernel_against_the_stand_in(tmp_path, one, rc):
    """``benchmarks/kit_norms.py --device cpu`` under the interpreter, with a stand-in written as
    the kit's: every cell passes; a stand-in whose gemma forms drop the ``1 +`` fails the gemma
    cells and the script exits 1."""
    import json
    import os
    import subprocess

    pkg = tmp_path / "shim" / "sgl_kernel"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(STAND_IN.format(one=one))
    out = tmp_path / "rows.json"
    proc = subprocess.run(
        [sys.executable, str(kit.REPO / "benchmarks" / "kit_norms.py"), "--device", "cpu"]
        + ["--json", str(out)],
        env=dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(tmp_path / "shim")),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == rc, proc.stdout + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 4
    assert {r["norm"] for r in rows if not r["ok"]} == (
        set() if rc == 0 else {"gemma_rmsnorm", "gemma_fused_add_rmsnorm"}
    )
    assert all(r["residual_equal"] is not None for r in rows if "fused" in r["norm"])


def test_sglangs_own_plugin_loader_finds_and_applies_the_installed_plugin(tmp_path, monkeypatch):
    """End to end on the CPU: install_kit_norms into a site directory, then in a fresh process
    with that site and a stand-in on its path, SGLang's ``load_plugins()`` (what every server
    process runs) finds ``kit_norms``, which replaces the stand-in's four norms (and says so);
    without SGLANG_SPEC_KIT_NORMS it leaves them alone."""
    import os
    import subprocess

    pytest.importorskip("sglang.srt.plugins")  # absent from the device's system python3
    site, shim = tmp_path / "site", tmp_path / "shim" / "sgl_kernel"
    site.mkdir()
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text(STAND_IN.format(one="1.0"))
    monkeypatch.setenv("SGLANG_KIT_FLAGS", KIT_FLAGS)
    monkeypatch.setattr(kit, "sglang_site", lambda: site)
    kit.install_kit_norms()
    child = (
        "from sglang.srt.plugins import load_plugins; load_plugins(); import sgl_kernel, "
        "sglang_spec_kit_norms as k; "
        "calls = lambda f, g: any(c.cell_contents is g for c in f.__closure__ or ()); "
        "print(sorted(n for n in k.NAMES if calls(getattr(sgl_kernel, n), getattr(k, n))))"
    )
    env = dict(
        os.environ, PYTHONPATH=f"{site}{os.pathsep}{shim.parent}", SGLANG_PLUGINS="kit_norms"
    )
    from e2e.kit_norms import NAMES

    for mode, replaced in (("triton", sorted(NAMES)), (None, [])):
        env.pop("SGLANG_SPEC_KIT_NORMS", None)
        if mode:
            env["SGLANG_SPEC_KIT_NORMS"] = mode
        proc = subprocess.run(
            [sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.strip().splitlines()[-1] == str(replaced)
        assert ("sgl_kernel norms: one Triton launch each" in proc.stderr) == bool(mode)

"""Which SGLang servers may run the tree ReplaySSM (``--enable-linear-replayssm-spec`` with a tree).

One rule, read by both places that validate the flag for a tree: the DDTREE plug-in
(``sglang_spec.plugin.config``), at start-up, and the pool of patch 0003 (``MambaPool``), because
DDTREE sets its tree ``topk`` after SGLang's ``attention_hook`` has run. EAGLE trees stay refused
by that (unpatched) hook: their verify input has no per-node path table for patch 0002's kernel. A tree verify keeps only each node's raw inputs and the commit replays the accepted path
(``sglang_spec.gdn.tree_recurrence``), which is the Gated-DeltaNet recurrence: KDA's fold-every-
commit stays chain-only. The tree verify is the Triton integration kernel, so the linear-attention
verify backend must be Triton (the FlashInfer / CuTe DSL verify kernels are chain-only).
"""

from __future__ import annotations

TREE_VERIFY_BACKENDS = ("triton",)
# The widest tree the GDN tree verify's kernels take (triton_tree_wy.MAX_WY_NODES, which reads it
# here: this module, read by the patched pool and the plug-in's checks, imports no Triton).
MAX_TREE_WIDTH = 256


def tree_replayssm_refusal(
    *, is_kda: bool, verify_backend: str | None, width: int | None = None
) -> str | None:
    """Why a tree verify cannot run with ``--enable-linear-replayssm-spec`` (one line), or None.

    ``verify_backend`` is the resolved ``--linear-attn-verify-backend``; None means SGLang's
    default for a non-FlashInfer decode backend, which is Triton. ``width`` is the verify width
    (tokens per request), when known: the tree kernel's limit (``triton_tree_wy.MAX_WY_NODES``).
    """
    if is_kda:
        return (
            "--enable-linear-replayssm-spec with a draft tree supports Gated-DeltaNet models only: "
            "this model has KDA layers, whose fold-every-commit is chain-only; run the tree without "
            "the flag, or use a linear draft chain."
        )
    if verify_backend is not None and verify_backend not in TREE_VERIFY_BACKENDS:
        return (
            "--enable-linear-replayssm-spec with a draft tree needs the Triton tree verify kernel; "
            f"got --linear-attn-verify-backend={verify_backend!r}; valid: "
            f"{', '.join(TREE_VERIFY_BACKENDS)}."
        )
    if width is not None and width > MAX_TREE_WIDTH:
        return (
            f"--enable-linear-replayssm-spec with a draft tree verifies at most {MAX_TREE_WIDTH} "
            f"tokens per request (the GDN tree kernel's limit); got a verify width of {width}; "
            f"valid: --speculative-num-draft-tokens <= {MAX_TREE_WIDTH} (every budget <= "
            f"{MAX_TREE_WIDTH - 1}), or run without the flag."
        )
    return None

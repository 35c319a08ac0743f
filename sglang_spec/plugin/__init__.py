"""SGLang 0.5.23 plug-in: the ``DDTREE`` speculative algorithm.

DDTree drafting over a DFlash drafter (one block-diffusion pass, top-K per depth, best-first tree
of ``budget`` nodes) verified with SGLang's EAGLE tree verify. Entry point:
``sglang.srt.plugins: ddtree = sglang_spec.plugin:register``.

Modules, by job:

* :mod:`~sglang_spec.plugin.config`: the frozen ``DDTreeConfig``, the flags and environment knobs
  it comes from, and every start-up check (``handle_server_args``);
* :mod:`~sglang_spec.plugin.algorithm`: the ``SpeculativeAlgorithm`` spec class and ``register``;
* :mod:`~sglang_spec.plugin.verify_input`: ``DDTreeVerifyInput`` (EAGLE's tree verify input);
* :mod:`~sglang_spec.plugin.worker`: ``DDTreeWorker``, one method per decode stage;
* :mod:`~sglang_spec.plugin.draft_sampler`: the draft head, per-depth top-K and tree as CUDA graphs
  per candidate budget over the block the drafter's graph stages (``_maybe_build_draft_sampler``)
  and the per-step choice of graph or eager;
* :mod:`~sglang_spec.plugin.context_graphs`: the drafter context append (the accepted rows'
  drafter K/V) as CUDA graphs per verify width and batch size;
* :mod:`~sglang_spec.plugin.hooks`: the HookRegistry hook for the target's CUDA-graph capture;
* :mod:`~sglang_spec.plugin.adapter`: every SGLang internal the plug-in relies on, with the
  expectations a CPU test checks per pinned SGLang version;
* :mod:`~sglang_spec.plugin.simulate` and :mod:`~sglang_spec.plugin.stage_times`: benchmark and
  profiling aids (``SGLANG_SIMULATE_ACC_LEN``, ``SGLANG_DDTREE_STAGE_TIMES``).

Only this package imports sglang, and only lazily (``worker``, ``verify_input`` and the functions
of the others), so the rest of ``sglang_spec`` stays importable without it.
"""

from sglang_spec.plugin.algorithm import register
from sglang_spec.plugin.config import MAX_VERIFY_WIDTH

__all__ = ["MAX_VERIFY_WIDTH", "register"]

"""sglang-spec: DDTree speculative decoding over a DFlash drafter, for SGLang.

Subpackages (only :mod:`sglang_spec.plugin` imports ``sglang``):

- :mod:`sglang_spec.tree` -- DDTree build, tree layout / SGLang tree ABI, greedy and sampling walks.
- :mod:`sglang_spec.dflash` -- the DFlash drafter and its config validation.
- :mod:`sglang_spec.gdn` -- tree-aware Gated-DeltaNet verification state.
- :mod:`sglang_spec.reference` -- the exact standalone engine on HF Transformers (oracle, CPU demo).
- :mod:`sglang_spec.plugin` -- the SGLang plugin that registers ``--speculative-algorithm DDTREE``.
- :mod:`sglang_spec.serving` -- ``sglang-spec serve`` (SGLang from ``server_configs/``) and the CPU
  demo/test server with SGLang's HTTP API.
- :mod:`sglang_spec.patching` -- ``sglang-spec patch``: the patch sets under ``patches/``.
- :mod:`sglang_spec.demo` -- the CPU demo (`sglang-spec demo`).
- ``sglang_spec/fixtures/tiny-pair`` -- the trained tiny targets and drafters.
"""

__version__ = "0.1.0"

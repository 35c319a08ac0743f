"""HookRegistry hooks DDTREE needs in SGLang 0.5.23 (see docs/plugin-design.md).

H1  DecodeCudaGraphRunner.get_spec_info (AROUND): the target runner of a
    DFLASH-family algorithm captures its TARGET_VERIFY graph with a
    DFlashVerifyInput and custom_mask=None (decode_cuda_graph_runner.py:2106),
    i.e. a causal chain.  A DDTREE target must capture with a tree verify input
    (an EagleVerifyInput subclass carrying the graph's custom_mask buffer and
    topk>1) so replay uses the tree mask and refreshes the GDN retrieve_*
    buffers.  The drafter runner keeps upstream's capture.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("sglang_spec.plugin")

GET_SPEC_INFO_TARGET = (
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.get_spec_info"
)

_hooks_registered = False


def is_ddtree(spec_algorithm) -> bool:
    return getattr(spec_algorithm, "name", None) == "DDTREE"


def get_spec_info_around(original, self, num_tokens, *args, **kwargs):
    mr = self.model_runner
    if not is_ddtree(mr.spec_algorithm) or mr.is_draft_worker:
        return original(self, num_tokens, *args, **kwargs)
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.runtime_context import get_spec

    from sglang_spec.plugin.worker import DDTreeVerifyInput

    spec = get_spec()
    return DDTreeVerifyInput(
        draft_token=None,
        custom_mask=self.buffers.custom_mask,
        positions=None,
        retrieve_index=None,
        retrieve_next_token=None,
        retrieve_next_sibling=None,
        retrieve_cum_len=None,
        spec_steps=int(spec.speculative_dflash_block_size) - 1,
        topk=int(spec.speculative_eagle_topk),
        draft_token_num=int(self.captured_req_width),
        capture_hidden_mode=CaptureHiddenMode.FULL,
        seq_lens_sum=None,
        seq_lens_cpu=None,
    )


def register_hooks() -> None:
    global _hooks_registered
    if _hooks_registered:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(GET_SPEC_INFO_TARGET, get_spec_info_around, HookType.AROUND)
    _hooks_registered = True

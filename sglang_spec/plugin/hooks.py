"""HookRegistry hooks DDTREE needs in SGLang 0.5.23 (see docs/plugin-design.md §4).

H1  ``DecodeCudaGraphRunner.get_spec_info`` (AROUND, :data:`adapter.GET_SPEC_INFO_TARGET`): the
    target runner of a DFLASH-family algorithm captures its TARGET_VERIFY graph with a
    DFlashVerifyInput and custom_mask=None (decode_cuda_graph_runner.py:2106), i.e. a causal
    chain. A DDTREE target must capture with a tree verify input (an EagleVerifyInput subclass
    carrying the graph's custom_mask buffer and topk > 1) so replay uses the tree mask and
    refreshes the GDN retrieve_* buffers (and, with patch 0002, ``retrieve_tree_paths``: the
    placeholder carries a valid table of the graph's ``bs = num_tokens / width``). The drafter
    runner keeps upstream's capture.
"""

from __future__ import annotations

import logging

import sglang_spec.plugin.adapter as adapter
from sglang_spec.plugin.config import ALGORITHM_NAME, runtime_config

logger = logging.getLogger("sglang_spec.plugin")

_hooks_registered = False


def is_ddtree(spec_algorithm) -> bool:
    return getattr(spec_algorithm, "name", None) == ALGORITHM_NAME


def get_spec_info_around(original, self, num_tokens, *args, **kwargs):
    mr = self.model_runner
    if not is_ddtree(mr.spec_algorithm) or mr.is_draft_worker:
        return original(self, num_tokens, *args, **kwargs)
    from sglang_spec.plugin.verify_input import DDTreeVerifyInput, placeholder_paths

    width = self.captured_req_width
    mask = self.buffers.custom_mask
    config = runtime_config()
    return DDTreeVerifyInput.create(
        config,
        width=width,
        custom_mask=mask,
        paths=placeholder_paths(config, num_tokens // width, width, mask.device),
    )


def register_hooks() -> None:
    global _hooks_registered
    if _hooks_registered:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(adapter.GET_SPEC_INFO_TARGET, get_spec_info_around, HookType.AROUND)
    _hooks_registered = True

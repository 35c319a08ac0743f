"""Child process of ``test_adapter.py::test_verify_states_capture_the_overridden_batch_sizes``: a
tiny-hybrid DDTREE server's configuration published as ``launch_server`` publishes it (the plug-in
registered, the GPU platform check answered as on CUDA), then the decode CUDA-graph batch sizes the
plug-in reads and what a per-width verify state is built under. Prints one ``RESULT`` JSON line."""

import json
import sys

import sglang.srt.arg_groups.mamba_hook as mamba_hook
from sglang.srt.runtime_context import get_context, get_exec, get_spec
from sglang.srt.server_args import prepare_server_args

from sglang_spec.plugin import adapter
from sglang_spec.plugin.algorithm import register

mamba_hook._platform_supports_mamba_cache_extra_buffer = lambda: True
register()
fixtures = sys.argv[1]
sa = prepare_server_args(
    ["--model-path", f"{fixtures}/hybrid", "--device", "cuda", "--speculative-algorithm", "DDTREE"]
    + ["--speculative-draft-model-path", f"{fixtures}/hybrid-dflash"]
    + ["--speculative-num-draft-tokens", "16", "--attention-backend", "triton", "--page-size", "1"]
    + ["--cuda-graph-max-bs-decode", "4"]
)
sa.resolve_once()
get_context().set_server_args(sa)
graph = get_exec().graph
out = {"graph_bs": adapter.decode_cuda_graph_bs(), "input_leaf": graph.cuda_graph_bs_decode}
with adapter.verify_capture_config(65, [1, 2]):
    out["inside"] = [
        list(get_exec().graph.cuda_graph_config.decode.bs),
        get_spec().speculative_num_draft_tokens,
    ]
with adapter.verify_capture_config(33, []):  # a width that runs eagerly: batch sizes untouched
    out["eager"] = [
        list(get_exec().graph.cuda_graph_config.decode.bs),
        get_spec().speculative_num_draft_tokens,
    ]
out["after"] = [
    list(get_exec().graph.cuda_graph_config.decode.bs),
    get_spec().speculative_num_draft_tokens,
]
print("RESULT" + json.dumps(out))

"""Child process of ``test_adapter.py::test_verify_states_capture_the_overridden_batch_sizes``: a
tiny-hybrid DDTREE server's configuration published as ``launch_server`` publishes it
(``patched_sglang.publish_tiny_ddtree``), then the decode CUDA-graph batch sizes the plug-in reads
and what a per-width verify state is built under. Prints one ``RESULT`` JSON line."""

import json

from patched_sglang import publish_tiny_ddtree
from sglang.srt.runtime_context import get_exec, get_spec

from sglang_spec.plugin import adapter

publish_tiny_ddtree("--speculative-num-draft-tokens", "16", "--cuda-graph-max-bs-decode", "4")
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

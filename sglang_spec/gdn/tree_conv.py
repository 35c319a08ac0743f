"""The conv half of the GDN tree ReplaySSM: each node's conv input, not its conv window.

SGLang's GDN layer runs a causal depthwise conv (kernel ``W``, state = the last ``W - 1`` inputs)
before the recurrence. For a draft tree its verify stores a ``[C, W - 1]`` window per node and the
commit copies the accepted node's window into the conv state (0.19 GB per request at width 65 on
the Qwen3.6-27B shape). The window of a node is the last ``W - 1`` entries of the sequence "the
conv state before the verify, then the inputs along the node's root-first path", so keeping the
``W - 1`` pre-verify state columns and one input column per node (``[W - 1 + N, C]`` per request,
0.067 GB) is enough to rebuild it (docs/gdn-tree-caching.md §7):

* :func:`save_conv_inputs` -- in the verify (patch 0002): a request row ``[pre-verify state
  columns | node inputs]`` (one Triton launch per layer on CUDA);
* :func:`tree_conv` -- in the verify, in place of SGLang's conv kernel: every node's conv output
  from the pre-verify state and its ancestors' inputs, all nodes at once (SGLang's tree-mode kernel
  walks the nodes one after another, about 64 µs per layer at width 64 on the H200);
* :func:`commit_conv_states` -- in the commit (patch 0003): the new conv state of every request
  (and the extra_buffer track snapshot) gathered from those rows along the accepted path, all
  layers in one go (one Triton launch on CUDA).

Both are graph-safe (no host sync): indexing, ``gather``-style advanced indexing, ``where``, and
the save's Triton kernel.
Rows, slots and node numbering are SGLang's: request ``b`` of the batch uses row ``rows[b]``
(``intermediate_state_indices[b]``, the row its ReplaySSM ring uses); ``accept_index[b, t]`` is
``b * N + node`` of the t-th accepted node, root first; pool slot 0 is SGLang's dummy slot
(``MambaSlotAllocator`` never hands it out), which absorbs the writes of requests that commit
nothing.
"""

from __future__ import annotations

import torch


def conv_inputs_buffer(
    conv_shape: tuple[int, int],
    num_layers: int,
    rows: int,
    width: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> torch.Tensor:
    """The pool's ``[layers, rows, W - 1 + width, C]`` conv-input rows for a conv state of shape
    ``conv_shape = (C, W - 1)``."""
    channels, state_len = conv_shape
    return torch.zeros((num_layers, rows, state_len + width, channels), dtype=dtype, device=device)


def save_conv_inputs(
    inputs: torch.Tensor,
    conv_states: torch.Tensor,
    cache_indices: torch.Tensor,
    rows: torch.Tensor,
    mixed_qkv: torch.Tensor,
) -> None:
    """One layer's verify: ``inputs[rows[b]] = [conv_states[cache_indices[b]].T | node inputs]``.

    ``inputs [R, W - 1 + N_max, C]`` and ``conv_states [slots, C, W - 1]`` in the conv dtype (the
    latter read before the conv kernel updates it), ``cache_indices``, ``rows [bs]``,
    ``mixed_qkv [bs * N, C]`` the conv's input, node ``i`` of request ``b`` at ``b * N + i``. A
    padding request (``cache_indices < 0``) reads SGLang's dummy slot 0 and writes its own row,
    which its commit never reads. On CUDA one Triton launch (:mod:`.triton_tree_conv`).
    """
    if inputs.is_cuda:
        from .triton_tree_conv import save_conv_inputs_triton

        save_conv_inputs_triton(inputs, conv_states, cache_indices, rows, mixed_qkv)
        return
    bs = rows.shape[0]
    state_len = conv_states.shape[-1]
    width = mixed_qkv.shape[0] // bs
    inputs[rows, :state_len] = conv_states[cache_indices.clamp(min=0)].transpose(1, 2)
    # the conv dtype (SGLANG_MAMBA_CONV_DTYPE) may differ from the activations'
    inputs[rows, state_len : state_len + width] = mixed_qkv.view(bs, width, -1).to(inputs.dtype)


def tree_conv(
    x: torch.Tensor,
    conv_states: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    silu: bool,
    cache_indices: torch.Tensor,
    paths: torch.Tensor,
) -> torch.Tensor:
    """One layer's conv over the verify's trees, every node at once: ``o [bs * N, C]`` in ``x``'s
    dtype.

    Node ``i``'s window is the last ``W`` entries of "the conv state ``conv_states[cache_indices[b]]``
    (``[slots, C, W - 1]``, read only; ``< 0``: a padding request, which reads SGLang's dummy slot
    0), then the inputs ``x [bs * N, C]`` along its root-first path ``paths [bs, N, P]``" (int32,
    -1 padded; a slot with no path gets finite filler); ``weight [C, W]``, ``bias [C]``. The sums
    are SGLang's tree-mode ``causal_conv1d_update``'s, bit for bit: the float32 accumulator starts
    at the bias and takes ``x * w`` (in the operands' dtype) of the node, its parent, its
    grandparent, ... then SiLU when ``silu``. Unlike SGLang's kernel it leaves the conv state as it
    is: the commit (:func:`commit_conv_states`) writes it from the saved inputs. On CUDA one
    Triton launch (:mod:`.triton_tree_conv`).
    """
    if x.is_cuda:
        from .triton_tree_conv import tree_conv_triton

        return tree_conv_triton(x, conv_states, weight, bias, silu, cache_indices, paths)
    bs, n, _ = paths.shape
    channels, kernel = weight.shape
    state_len = kernel - 1
    states = conv_states[cache_indices.clamp(min=0).long()].transpose(1, 2)  # [bs, W - 1, C]
    nodes = x.view(bs, n, channels)
    paths = paths.long()
    depth = (paths >= 0).sum(-1, keepdim=True) - 1  # [bs, N, 1]
    batch = torch.arange(bs, device=x.device)[:, None]
    acc = torch.zeros(bs, n, channels, dtype=torch.float32, device=x.device)
    if bias is not None:
        acc += bias.float()
    for back in range(kernel):  # 0: the node itself, 1: its parent, ...
        at = depth - back  # its path position, < 0: a pre-verify state column
        node = paths.gather(2, at.clamp(min=0)).squeeze(2)
        from_x = nodes[batch, node.clamp(min=0)]
        column = (state_len + at.squeeze(2)).clamp(min=0, max=state_len - 1)
        from_state = states[batch, column]
        acc += torch.where(
            at >= 0, from_x * weight[:, -1 - back], from_state * weight[:, -1 - back]
        )
    if silu:
        acc = acc / (1 + torch.exp(-acc))
    return acc.to(x.dtype).view(bs * n, channels)


def _window_columns(
    nodes: torch.Tensor, end: torch.Tensor, state_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Columns of a request row holding the conv state after the first ``end[b]`` path nodes.

    ``nodes [bs, A]`` node per path position; the state's column ``j`` is path position
    ``t = end - state_len + j``: input column ``state_len + nodes[b, t]`` when ``t >= 0``, else the
    pre-verify state column ``state_len + t``. Returns ``(columns [bs, state_len], valid [bs])``.
    """
    j = torch.arange(state_len, device=nodes.device)
    t = end[:, None] - state_len + j
    node = nodes.gather(1, t.clamp(min=0))  # t < end <= A
    return torch.where(t >= 0, state_len + node, state_len + t), end > 0


def commit_conv_states(
    conv_states: torch.Tensor,
    inputs: torch.Tensor,
    slots: torch.Tensor,
    rows: torch.Tensor,
    accept_index: torch.Tensor,
    accept_lens: torch.Tensor,
    num_draft: int,
    track_slots: torch.Tensor | None = None,
    track_nodes: torch.Tensor | None = None,
) -> None:
    """All layers' commit: each request's conv state after its accepted path.

    ``conv_states [L, slots, C, W - 1]`` the pool's conv states, ``inputs [L, R, W - 1 + N_max, C]``
    the rows :func:`save_conv_inputs` wrote; ``slots [bs]`` each request's pool slot, ``rows [bs]``
    its row; ``accept_index [bs, A]`` ``b * num_draft + node`` per accepted position (root first,
    padded), ``accept_lens [bs]`` accepted positions (0: nothing to commit). ``track_slots`` /
    ``track_nodes [bs]`` (extra_buffer, optional): also write the conv state as of the accepted node
    ``track_nodes[b]`` into slot ``track_slots[b]`` (skipped where either is negative or the node
    is not on the accepted path), as SGLang's conv-window scatter does with its steps to track.
    On CUDA one Triton launch (:mod:`.triton_tree_conv`; the torch form's gathers and index-puts
    of ``[L, bs, W - 1, C]`` windows took 0.5 ms a step at 16 requests on the 27B shape).
    """
    if conv_states.is_cuda:
        from .triton_tree_conv import commit_conv_states_triton as commit
    else:
        commit = commit_conv_states_torch
    track = (track_slots, track_nodes)
    commit(conv_states, inputs, slots, rows, accept_index, accept_lens, num_draft, *track)


def commit_conv_states_torch(
    conv_states: torch.Tensor,
    inputs: torch.Tensor,
    slots: torch.Tensor,
    rows: torch.Tensor,
    accept_index: torch.Tensor,
    accept_lens: torch.Tensor,
    num_draft: int,
    track_slots: torch.Tensor | None = None,
    track_nodes: torch.Tensor | None = None,
) -> None:
    """:func:`commit_conv_states` in torch ops on any device (the CPU path; the baseline of
    ``benchmarks/draft_step_kernels.py``): a gather of the ``[L, bs, W - 1, C]`` windows and an
    index-put per target; requests that commit nothing write into SGLang's dummy slot 0."""
    state_len = conv_states.shape[-1]
    bs = slots.shape[0]
    batch = torch.arange(bs, device=slots.device)
    nodes = accept_index.long() - batch[:, None] * num_draft
    targets = [(slots.long(), accept_lens.long())]
    if track_slots is not None and track_nodes is not None:
        on_path = nodes == track_nodes.long()[:, None]
        end = torch.where(on_path.any(1) & (track_nodes >= 0), on_path.int().argmax(1) + 1, 0)
        targets.append((track_slots.long(), end))
    for dst, end in targets:
        columns, valid = _window_columns(nodes, end, state_len)
        window = inputs[:, rows.long()[:, None], columns]  # [L, bs, W - 1, C]
        conv_states[:, torch.where(valid & (dst >= 0), dst, 0)] = window.transpose(2, 3)

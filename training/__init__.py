"""Train tiny, *learned* target/drafter fixtures on the Python standard library's own sources.

Run from the repository root: ``python -m training --out DIR [--stage ...] [--tiny] ...``
(``python -m training --help`` lists every flag).

Outputs (``--out DIR``, bf16, < 20 MB in all):

    tokenizer/       byte-level BPE (tokenizer.json, tokenizer_config.json with a ChatML template,
                     special_tokens_map.json); specials <|endoftext|> <|im_start|> <|im_end|> <|MASK|>
    hybrid/          Qwen3_5ForCausalLM (Qwen3.5-text, layer_types [lin,lin,lin,full]*2, tied
                     embeddings) + an MTP head stored as ``mtp.*`` in the same model.safetensors
                     (the layout SGLang 0.5.23's Qwen3_5ForCausalLMMTP loads for NEXTN)
    hybrid-dflash/   DFlash drafter (z-lab layout) trained on the hybrid target's hidden states
    qwen3/           Qwen3ForCausalLM, pure attention, tied embeddings
    qwen3-dflash/    DFlash drafter for qwen3/
    heldout_prompts.jsonl   signature+docstring prompts from the held-out stdlib modules
    othercode_prompts.jsonl the same from a code base the pair never saw (click), written by
                            ``python -m training.prompts --package click`` (training/prompts.py)
    train_config.json       every setting, versions, step counts, losses (merged across stages)

Stages (``--stage a+b+c``; components run in the fixed order below, whatever order is given):
    tokenizer      train the BPE tokenizer, write heldout_prompts.jsonl
    hybrid         train the hybrid target
    mtp            train the MTP head on the (saved, bf16, frozen) hybrid target; add it to hybrid/
    hybrid-dflash  train the DFlash drafter for the hybrid target
    qwen3          train the Qwen3 target
    qwen3-dflash   train the DFlash drafter for the Qwen3 target
    all            everything
Every invocation ends with reload checks of whatever exists in --out and prints the total size.

Recommended H200 split (each < ~8 min): ``tokenizer+hybrid``, ``hybrid-dflash+mtp``,
``qwen3+qwen3-dflash``. The shipped drafters were retrained on the shipped targets with
``bash benchmarks/h200_train_drafters.sh 320 HG:hybrid-dflash: ...`` (several variants side by side,
``--set PATH=JSON`` overrides; benchmarks/results/drafter_variants_h200.md); the defaults below are
the winners. Step counts are fixed (reproducible); each training has a time box and
is shortened only if the steps/s measured after warm-up says it would not fit (recorded as
``shrunk`` in train_config.json). ``--time-budget-s`` rescales the boxes of this invocation.

Objectives
    targets   next-token CE on random 512-token windows of the stdlib stream, AdamW, cosine LR,
              bf16 autocast (fp32 master weights); saved in bf16.
    DFlash    target frozen (bf16, as saved). Per sequence ``anchors`` random anchor positions a;
              block [x_a, MASK*(B-1)] at positions a..a+B-1 attends to the projected target
              features of tokens < a and to its whole block (bidirectional); all blocks of a
              sequence go through one forward via the attention mask. Rows k=1..B-1 are
              distilled on the *target's* next-token distribution at position a+k-1 (soft CE =
              forward KL up to a constant, ``--distill soft``; ``hard`` = CE on the target argmax),
              weighted exp(-(k-1)/gamma). Soft labels keep the draft marginals calibrated, which
              DDTree's best-first tree uses; the argmax agreement (= greedy acceptance) is logged.
              A share ``gen_frac`` of the batches are self-generated: corpus prefixes continued
              by the target's own greedy decoding (anchors in the continuation only), the text a
              drafter meets at inference (the DFlash recipe trains on target-generated answers).
    MTP       row t gets fc([pre_fc_norm_embedding(E x_{t+1}); pre_fc_norm_hidden(h_t)]) with h_t
              the target's final-normed last hidden state (what SGLang passes as
              spec_info.hidden_states), one causal full-attention Qwen3.5 decoder layer at position
              t, mtp.norm, the tied LM head; distilled on the target's distribution for token t+2.
"""

# Modules, one job each (transformers is imported inside functions, after --gdn-kernels applies):
#   config        sizes (FULL / TINY), constants, --stage parsing, --set overrides, run settings
#   runtime       timestamped log, seeding, device sync, bf16 autocast
#   corpus        the stdlib corpus split, token streams and windows, held-out prompts
#   tokenizer     train / load / copy the byte-level BPE tokenizer
#   models        target configs and builders, the MTP head, DFlash drafter configs
#   objectives    LM loss, soft / hard distillation CE, the DFlash training forward and its stats
#   selfgen       corpus prefixes continued by the frozen target's own greedy decoding
#   loop          AdamW, warm-up + cosine LR, metric logs, the time box
#   train_target  the target stages (hybrid, qwen3)
#   train_mtp     the mtp stage
#   train_dflash  the drafter stages (hybrid-dflash, qwen3-dflash)
#   export        bf16 checkpoints, MTP weights into the hybrid's safetensors, SGLang's MTP names
#   checks        reload checks of everything in --out
#   cli           the command line: stage order and seeds, train_config.json, versions record

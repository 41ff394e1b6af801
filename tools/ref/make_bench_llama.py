#!/usr/bin/env python3
"""Writes a random Llama as an F32 GGUF (gguf-py's writer), for benchmarks that need shapes a
real small model does not have: SmolLM2-135M's 576-wide rows are not whole 256-element blocks, so
llama-quantize's K-quant file types fall back to Q5_0 / Q8_0 for most of it; this model's widths
are multiples of 256, so `llama-quantize OUT.gguf Q4_K_M` gives real Q4_K / Q6_K tensors (as a 7B
model's Q4_K_M file has). Weights are seeded N(0, 0.02) (norms 1), the output head N(0, 0.5) so
the logits are as peaked as a trained model's (with flat logits lathe's exact re-computation of the
logits near the top would take every one of them); the text is noise: for speed only.

Run: $LATHE_REF_VENV/bin/python tools/ref/make_bench_llama.py OUT.gguf [--dim 1024 --ffn 2816
     --layers 8 --heads 16 --kv-heads 4 --vocab 32000]
"""
import argparse

import numpy as np
from gguf import GGUFWriter


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=2816)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    hd = a.dim // a.heads

    def mat(rows, cols, std=0.02):
        return (std * rng.standard_normal((rows, cols), dtype=np.float32)).astype(np.float32)

    w = GGUFWriter(a.out, "llama")
    w.add_name("lathe random bench llama")
    w.add_context_length(4096)
    w.add_embedding_length(a.dim)
    w.add_block_count(a.layers)
    w.add_feed_forward_length(a.ffn)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0)
    # A byte-level SentencePiece vocabulary: unk, bos, eos, 256 bytes, then filler pieces.
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    tokens += [f"tok{i}" for i in range(a.vocab - len(tokens))]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * a.vocab)
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * (a.vocab - 259))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    ones = np.ones(a.dim, dtype=np.float32)
    w.add_tensor("token_embd.weight", mat(a.vocab, a.dim))
    for i in range(a.layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        w.add_tensor(f"blk.{i}.attn_q.weight", mat(a.dim, a.dim))
        w.add_tensor(f"blk.{i}.attn_k.weight", mat(a.kv_heads * hd, a.dim))
        w.add_tensor(f"blk.{i}.attn_v.weight", mat(a.kv_heads * hd, a.dim))
        w.add_tensor(f"blk.{i}.attn_output.weight", mat(a.dim, a.dim))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
        w.add_tensor(f"blk.{i}.ffn_gate.weight", mat(a.ffn, a.dim))
        w.add_tensor(f"blk.{i}.ffn_up.weight", mat(a.ffn, a.dim))
        w.add_tensor(f"blk.{i}.ffn_down.weight", mat(a.dim, a.ffn))
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output.weight", mat(a.vocab, a.dim, 0.5))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()

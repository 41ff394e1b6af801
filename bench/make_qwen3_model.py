#!/usr/bin/env python3
"""A Qwen3-0.6B-shaped model for bench/qwen3.sh: transformers' Qwen3ForCausalLM with Qwen3-0.6B's config (28 layers,
hidden 1024, 16 query / 8 KV heads of 128, ffn 3072, vocab 151936, tied head; 596,049,920 parameters), seeded random
bf16 weights (std 0.03, norms 1 + 0.1 N, the final one x 10 for peaked logits), and the real Qwen3 tokenizer from shared/models/qwen3-tokenizer. Writes
OUT_DIR (an HF model dir) and prints transformers' mean NLL (bf16 weights, f32 compute) on the first TinyStories
validation document, the figure `lathe eval` must reproduce on the converted files.

Usage: $LATHE_REF_VENV/bin/python bench/make_qwen3_model.py OUT_DIR [--shared /work/shared]
"""
import argparse
import os
import shutil

import torch
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shared", default=os.environ.get("LATHE_SHARED_DIR", "/work/shared"))
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                      rms_norm_eps=1e-6, max_position_embeddings=40960, bos_token_id=151643, eos_token_id=151645,
                      rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.03 * torch.randn(p.shape, generator=g))
        # A trained model's next-token distribution is peaked; with every weight random the logits would be flat (std
        # ~1 over 151936 tokens), most of the vocabulary within lathe's exact-logit margin of the top, and each decode
        # step would recompute ~all of the head exactly, which no real model asks. The final norm at ~10 gives the
        # logits std ~10: ~15 tokens within 6 nats of the top.
        model.model.norm.weight.mul_(10.0)
    model.save_pretrained(args.out)
    for f in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(os.path.join(args.shared, "models/qwen3-tokenizer", f), os.path.join(args.out, f))
    text = open(os.path.join(args.shared, "data/tinystories/validation_100.txt")).read()
    doc = text.split("<|endoftext|>")[0].strip()
    with open(os.path.join(args.out, "..", "doc.txt"), "w") as f:
        f.write(doc)
    ids = AutoTokenizer.from_pretrained(args.out)(doc)["input_ids"][:512]
    # Reloaded in f32 from the saved dir: the in-memory model's .to(bfloat16) rounded its rotary inv_freq buffer too,
    # which from_pretrained rebuilds in f32 (that rounding alone moves the NLL by ~5e-4).
    reloaded = Qwen3ForCausalLM.from_pretrained(args.out, dtype=torch.float32).eval()
    with torch.no_grad():
        loss = reloaded(input_ids=torch.tensor([ids]), labels=torch.tensor([ids])).loss.item()
    print(f"params {sum(p.numel() for p in model.parameters())} tokens {len(ids)} transformers_nll {loss:.6f}")


if __name__ == "__main__":
    main()

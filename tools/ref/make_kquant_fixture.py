#!/usr/bin/env python3
"""GGUF files in llama.cpp's other block types (Q5_0, Q5_1, Q2_K .. Q6_K) and their reference values.

What it makes, under tests/golden/fixtures/ggml_quant/ (paths relative to the repo root):
  blocks.safetensors  per type: `<type>.blocks` (u8, random block bytes with finite f16 factors) and
                      `<type>.values` (f32, gguf-py's dequantize of them): the decoder's golden values
  model.gguf          a 1-layer random Llama (vocab 256, hidden 256, 4 heads / 2 kv heads of 64,
                      SwiGLU ffn 512, tied=False) written as F32 by gguf-py's GGUFWriter, then
                      quantized by llama.cpp's own llama-quantize with one block type per tensor:
                      attn_q q2_k, attn_k q3_k, attn_v q4_k, attn_output q5_k, ffn_gate q6_k,
                      ffn_up q5_0, ffn_down q5_1, token_embd q4_k, output q6_k
  expected.safetensors  input_ids (32) and transformers' logits for them, transformers having loaded
                      model.gguf itself (GGUF -> f32 through gguf-py, Q/K un-permuted by transformers)

llama-quantize comes from bench/fetch-llamacpp.sh's llama.cpp (the PyPI sdist of llama-cpp-python,
built into the cache); pass its bin dir with --llamacpp-bin or let the script build the target.

Run (~1 min, once llama.cpp is built):
  $LATHE_REF_VENV/bin/python tools/ref/make_kquant_fixture.py [--llamacpp-bin DIR]
"""
import argparse
import os
import subprocess
import tempfile

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize
from safetensors.numpy import save_file
from transformers import LlamaConfig, LlamaForCausalLM

import fixture_util as fu

GENERATOR = "tools/ref/make_kquant_fixture.py"
OUT = os.path.join(fu.FIXTURES_DIR, "ggml_quant")
VOCAB, DIM, FFN, HEADS, KV_HEADS, LAYERS = 256, 256, 512, 4, 2, 1
SEQ = 32
SEED = 2001
# tensor (llama.cpp name) -> type given to llama-quantize
MIX = {
    "attn_q": "q2_k", "attn_k": "q3_k", "attn_v": "q4_k", "attn_output": "q5_k",
    "ffn_gate": "q6_k", "ffn_up": "q5_0", "ffn_down": "q5_1",
}
EMBD_TYPE, OUTPUT_TYPE = "q4_k", "q6_k"

# Byte offsets of each block's f16 factors (ggml's block layouts), for the random decoder blocks.
BLOCKS = {  # name: (type, block bytes, {offset: (scale, signed)})
    "q5_0": (GGMLQuantizationType.Q5_0, 22, {0: 0.005}),
    "q5_1": (GGMLQuantizationType.Q5_1, 24, {0: 0.004, 2: -0.06}),
    "q2_k": (GGMLQuantizationType.Q2_K, 84, {80: 0.005, 82: 0.008}),
    "q3_k": (GGMLQuantizationType.Q3_K, 110, {108: 0.001}),
    "q4_k": (GGMLQuantizationType.Q4_K, 144, {0: 0.0002, 2: 0.0015}),
    "q5_k": (GGMLQuantizationType.Q5_K, 176, {0: 0.0001, 2: 0.0015}),
    "q6_k": (GGMLQuantizationType.Q6_K, 210, {208: 0.00003}),
}
N_BLOCKS = 12


def random_blocks(rng, nbytes, factors):
    b = rng.integers(0, 256, size=(N_BLOCKS, nbytes), dtype=np.uint8)
    for off, scale in factors.items():
        f = (scale * rng.uniform(0.5, 1.0, size=N_BLOCKS)).astype(np.float16)
        b[:, off:off + 2] = f.view(np.uint8).reshape(N_BLOCKS, 2)
    # A few special cases every decoder must get right: zero factors, a negative d.
    b[0, :] = 0
    return b


def make_blocks():
    rng = np.random.default_rng(SEED)
    out = {}
    for name, (qt, nbytes, factors) in BLOCKS.items():
        blocks = random_blocks(rng, nbytes, factors)
        values = dequantize(blocks.reshape(-1), qt).astype(np.float32).reshape(-1)
        assert np.all(np.isfinite(values)), name
        out[f"{name}.blocks"] = blocks.reshape(-1)
        out[f"{name}.values"] = values
    return out


def permute(w, n_head):
    """HF q/k rows -> llama.cpp's interleaved RoPE order (convert_hf_to_gguf's LlamaModel.permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_f32_gguf(model, path):
    cfg = model.config
    w = GGUFWriter(path, "llama")
    w.add_name("lathe kquant fixture")
    w.add_context_length(256)
    w.add_embedding_length(DIM)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(DIM // HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_file_type(0)
    # A byte-level SentencePiece vocabulary of 256 (unk, bos, eos, 253 byte tokens).
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(VOCAB - 3)]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * VOCAB)
    w.add_token_types([2, 3, 3] + [6] * (VOCAB - 3))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w.add_tensor(f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"])
        w.add_tensor(f"blk.{i}.attn_q.weight", permute(sd[p + "self_attn.q_proj.weight"], HEADS))
        w.add_tensor(f"blk.{i}.attn_k.weight", permute(sd[p + "self_attn.k_proj.weight"], KV_HEADS))
        w.add_tensor(f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        w.add_tensor(f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        w.add_tensor(f"blk.{i}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llamacpp_bin(arg):
    if arg:
        return arg
    bin_dir = subprocess.check_output(["bash", os.path.join(fu.REPO_ROOT, "bench", "fetch-llamacpp.sh")],
                                      text=True).strip()
    build = os.path.dirname(bin_dir)
    subprocess.check_call(["cmake", "--build", build, "--target", "llama-quantize", "-j2"],
                          stdout=subprocess.DEVNULL)
    return bin_dir


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llamacpp-bin", help="directory with llama-quantize")
    args = ap.parse_args()
    fu.setup_torch()
    os.makedirs(OUT, exist_ok=True)

    blocks = make_blocks()
    save_file(blocks, os.path.join(OUT, "blocks.safetensors"))

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=DIM, intermediate_size=FFN, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, hidden_act="silu",
                      rms_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=False,
                      bos_token_id=1, eos_token_id=2, attention_dropout=0.0, use_cache=False,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))

    qbin = os.path.join(llamacpp_bin(args.llamacpp_bin), "llama-quantize")
    gguf_path = os.path.join(OUT, "model.gguf")
    with tempfile.TemporaryDirectory() as tmp:
        f32 = os.path.join(tmp, "model-f32.gguf")
        write_f32_gguf(model, f32)
        cmd = [qbin, "--token-embedding-type", EMBD_TYPE, "--output-tensor-type", OUTPUT_TYPE]
        for name, t in MIX.items():
            cmd += ["--tensor-type", f"{name}={t}"]
        cmd += [f32, gguf_path, "Q4_K_M"]
        subprocess.check_call(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    # transformers reads the quantized file itself (dequantized to f32 by gguf-py).
    qmodel = LlamaForCausalLM.from_pretrained(OUT, gguf_file="model.gguf", torch_dtype=torch.float32).eval()
    ids = torch.randint(3, VOCAB, (SEQ,), generator=torch.Generator().manual_seed(SEED + 1))
    ids[0] = 1
    with torch.no_grad():
        logits = qmodel(input_ids=ids[None], use_cache=False).logits[0].float()
    expected = {"input_ids": ids.to(torch.int64), "logits": logits}
    fu.save_expected(OUT, expected)

    from gguf import GGUFReader
    types = {t.name: t.tensor_type.name for t in GGUFReader(gguf_path).tensors}
    fu.log("tensor types:", types)
    fu.update_manifest({"ggml_quant": {
        "covers": "GGUF block types Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K: decoding (blocks.safetensors: "
                  "random blocks and gguf-py's dequantized values) and a model quantized by llama.cpp's "
                  "llama-quantize with one type per tensor, its logits from transformers reading the file",
        "model_gguf": fu.rel(gguf_path),
        "tensor_types": types,
        "blocks": fu.rel(os.path.join(OUT, "blocks.safetensors")),
        "expected": fu.rel(os.path.join(OUT, "expected.safetensors")),
        "tensors": fu.describe(expected, {
            "input_ids": "token ids (BOS then seeded random ids), one sequence",
            "logits": "transformers logits (seq, vocab) of the model read from model.gguf (f32 weights "
                      "dequantized by gguf-py)"}),
        "tolerances": {
            "f32_activations": {"logits_atol": 2e-4, "why": "the same dequantized weights in f32; only "
                                "summation order differs"},
            "int8_activations": {"logits_atol": 0.1, "normalized": 0.03, "top1_min_agree": SEQ - 2,
                                 "why": "decode rows quantize activations to int8 per 32 (as llama.cpp's "
                                 "vec_dot quantizes to Q8_K / Q8_0 blocks): ~1% relative error per matmul, "
                                 "measured 0.052 max / 1.6% normalized over the 8 matmuls of this 1-layer "
                                 "model (logit rms 0.79)"},
        },
    }}, GENERATOR)
    fu.log("wrote", fu.rel(OUT), fu.dir_size(OUT), "bytes")


if __name__ == "__main__":
    main()

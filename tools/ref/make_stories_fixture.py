#!/usr/bin/env python3
"""Makes the stories260K golden fixture from the llama2.c .bin, and proves the Q/K permutation.

stories260K is a real pretrained Llama-2-architecture model (dim 64, 5 layers, 8 heads / 4 kv
heads, ffn 172, vocab 512, tied) stored in Meta layout: wq/wk rows are ordered for RoPE over
*interleaved* pairs (2i, 2i+1). transformers' Llama rotates *half-split* pairs (i, i + hd/2), so
the .bin's wq/wk rows must be permuted per head (the permute of transformers'
convert_llama_weights_to_hf.py):
    hf_q = wq.reshape(n_heads, hd // 2, 2, dim).transpose(1, 2).reshape(n_heads * hd, dim)
    hf_k = wk.reshape(n_kv_heads, hd // 2, 2, dim).transpose(1, 2).reshape(n_kv_heads * hd, dim)
i.e. within each head, HF row j < hd/2 is Meta row 2j and HF row hd/2 + j is Meta row 2j + 1.
The script builds a LlamaConfig, copies the .bin weights (Q/K permuted as above) into
LlamaForCausalLM, and checks:
  * the result against the independent float64 numpy reference
    /work/shared/models/stories260K/reference/stories260K_reference.json (top-5 ids and logits
    and the logit sum at each of 16 positions; greedy ids from BOS and for 3 prompts);
  * that the same weights WITHOUT the permutation do not match (so the check has teeth);
  * that stories260K.gguf holds the .bin tensors bit-identically (attn_q/attn_k unpermuted, i.e.
    Meta layout), and that transformers' own GGUF loader yields exactly the permuted HF weights.
What it makes: tests/golden/fixtures/stories260k/expected.safetensors (+ MANIFEST.json entry): the
reference sentence's ids, the f32 logits at every position, hidden states, and the transformers
greedy ids. No model dir is committed (the model is in /work/shared/models, 1 MB); pass
--hf-out DIR to also write the converted HF model (config.json + model.safetensors) there.

Run (~15 s on one core):
  $LATHE_REF_VENV/bin/python tools/ref/make_stories_fixture.py \
      [--models /work/shared/models/stories260K] [--hf-out /tmp/stories260K-hf]
"""
import argparse
import json
import os
import shutil

import numpy as np
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import fixture_util as fu

GENERATOR = "tools/ref/make_stories_fixture.py"
NAME = "stories260k"
GREEDY_FROM_BOS = 200


def read_llama2c(path):
    """llama2.c checkpoint: 7 int32 header, then f32 tensors in run.c's order."""
    raw = np.fromfile(path, dtype=np.float32)
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = (int(x) for x in raw[:7].view(np.int32))
    shared = vocab > 0
    vocab = abs(vocab)
    hd = dim // n_heads
    off = 7
    out = {}

    def take(name, *shape):
        nonlocal off
        n = int(np.prod(shape))
        out[name] = raw[off:off + n].reshape(shape).copy()
        off += n

    take("tok_embeddings", vocab, dim)
    take("attention_norm", n_layers, dim)
    take("wq", n_layers, n_heads * hd, dim)
    take("wk", n_layers, n_kv * hd, dim)
    take("wv", n_layers, n_kv * hd, dim)
    take("wo", n_layers, dim, n_heads * hd)
    take("ffn_norm", n_layers, dim)
    take("w1", n_layers, hidden, dim)
    take("w2", n_layers, dim, hidden)
    take("w3", n_layers, hidden, dim)
    take("norm", dim)
    off += seq_len * hd // 2 * 2  # freq_cis_real, freq_cis_imag (unused: recomputed)
    if not shared:
        take("output", vocab, dim)
    assert off == raw.size, f"{path}: {raw.size - off} floats left over"
    cfg = dict(dim=dim, hidden=hidden, n_layers=n_layers, n_heads=n_heads, n_kv=n_kv,
               vocab=vocab, seq_len=seq_len, shared=shared)
    return cfg, out


def meta_to_hf(w, n_heads):
    """Interleaved-pair (Meta/llama2.c/GGUF) rows -> half-split (HF) rows, per head."""
    out, inp = w.shape
    return w.reshape(n_heads, out // n_heads // 2, 2, inp).transpose(0, 2, 1, 3).reshape(out, inp)


def hf_to_meta(w, n_heads):
    """Inverse of meta_to_hf: llama.cpp convert_hf_to_gguf.py's LlamaModel.permute."""
    out, inp = w.shape
    return w.reshape(n_heads, 2, out // n_heads // 2, inp).transpose(0, 2, 1, 3).reshape(out, inp)


def build_hf(c, w, permute=True):
    cfg = LlamaConfig(vocab_size=c["vocab"], hidden_size=c["dim"], intermediate_size=c["hidden"],
                      num_hidden_layers=c["n_layers"], num_attention_heads=c["n_heads"],
                      num_key_value_heads=c["n_kv"], max_position_embeddings=c["seq_len"],
                      rms_norm_eps=1e-5, hidden_act="silu", tie_word_embeddings=c["shared"],
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                      bos_token_id=1, eos_token_id=2, pad_token_id=None, use_cache=True)
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg).eval()
    qk = meta_to_hf if permute else (lambda x, n: x)
    sd = {"model.embed_tokens.weight": w["tok_embeddings"], "model.norm.weight": w["norm"]}
    for i in range(c["n_layers"]):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = w["attention_norm"][i]
        sd[p + "post_attention_layernorm.weight"] = w["ffn_norm"][i]
        sd[p + "self_attn.q_proj.weight"] = qk(w["wq"][i], c["n_heads"])
        sd[p + "self_attn.k_proj.weight"] = qk(w["wk"][i], c["n_kv"])
        sd[p + "self_attn.v_proj.weight"] = w["wv"][i]
        sd[p + "self_attn.o_proj.weight"] = w["wo"][i]
        sd[p + "mlp.gate_proj.weight"] = w["w1"][i]
        sd[p + "mlp.down_proj.weight"] = w["w2"][i]
        sd[p + "mlp.up_proj.weight"] = w["w3"][i]
    if not c["shared"]:
        sd["lm_head.weight"] = w["output"]
    missing, unexpected = model.load_state_dict(
        {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}, strict=False)
    assert not unexpected and all(k == "lm_head.weight" for k in missing), (missing, unexpected)
    if c["shared"]:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


def check_gguf(gguf_path, c, w, model):
    """GGUF tensors == .bin tensors (Meta layout); transformers' GGUF load == our HF model."""
    from gguf import GGUFReader

    r = GGUFReader(gguf_path)
    g = {t.name: np.asarray(t.data).reshape(tuple(int(x) for x in t.shape[::-1])) for t in r.tensors}
    pairs = [("token_embd.weight", w["tok_embeddings"]), ("output_norm.weight", w["norm"]),
             ("output.weight", w["tok_embeddings"])]
    for i in range(c["n_layers"]):
        pairs += [(f"blk.{i}.attn_q.weight", w["wq"][i]), (f"blk.{i}.attn_k.weight", w["wk"][i]),
                  (f"blk.{i}.attn_v.weight", w["wv"][i]), (f"blk.{i}.attn_output.weight", w["wo"][i]),
                  (f"blk.{i}.attn_norm.weight", w["attention_norm"][i]),
                  (f"blk.{i}.ffn_norm.weight", w["ffn_norm"][i]),
                  (f"blk.{i}.ffn_gate.weight", w["w1"][i]), (f"blk.{i}.ffn_down.weight", w["w2"][i]),
                  (f"blk.{i}.ffn_up.weight", w["w3"][i])]
    for name, ref in pairs:
        assert np.array_equal(g[name], ref), f"gguf {name} != .bin"
    # and hf_to_meta(meta_to_hf(x)) is the identity (the two permutes are inverses)
    for i in range(c["n_layers"]):
        assert np.array_equal(hf_to_meta(meta_to_hf(w["wq"][i], c["n_heads"]), c["n_heads"]),
                              w["wq"][i])
    d, f = os.path.split(os.path.abspath(gguf_path))
    try:
        # The GGUF's padding_token_id is 0xFFFFFFFF (uint32 "none"), which transformers would
        # pass to nn.Embedding(padding_idx=...) and fail on; override it.
        gm = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32,
                                                  pad_token_id=None)
    except Exception as e:  # not fatal: the .bin path is the reference
        return {"bin_equals_gguf_tensors": len(pairs), "transformers_gguf_load": f"failed: {e}"}
    ours = model.state_dict()
    theirs = gm.state_dict()
    assert set(ours) <= set(theirs), set(ours) - set(theirs)
    same = all(torch.equal(ours[k], theirs[k]) for k in theirs)  # incl. the untied lm_head copy
    assert same, "transformers' GGUF load differs from the permuted .bin weights"
    return {"bin_equals_gguf_tensors": len(pairs),
            "transformers_gguf_load_equals_permuted_bin": bool(same),
            "transformers_gguf_note": "the GGUF stores output.weight as a copy of token_embd "
                                      "(so transformers loads it untied, ctx 2048 from GGUF "
                                      "metadata vs 512 in the .bin); padding_token_id is "
                                      "0xFFFFFFFF and must be read as 'none'",
            "transformers_gguf_config": {"max_position_embeddings":
                                         gm.config.max_position_embeddings,
                                         "rms_norm_eps": gm.config.rms_norm_eps,
                                         "tie_word_embeddings": gm.config.tie_word_embeddings}}


@torch.no_grad()
def forward(model, ids):
    out = model(input_ids=ids[None], output_hidden_states=True, use_cache=False)
    return out.logits[0].float(), torch.stack([h[0].float() for h in out.hidden_states])


@torch.no_grad()
def greedy(model, ids, n):
    out = model.generate(input_ids=ids[None], attention_mask=torch.ones_like(ids)[None],
                         do_sample=False, max_new_tokens=n, min_new_tokens=n, eos_token_id=None,
                         pad_token_id=0, use_cache=True)
    return out[0]


def compare_reference(logits, ref):
    """Max |ours - reference| over the reference's top-5 logits and logit sums; top-5 ids equal."""
    worst, worst_sum, ids_ok = 0.0, 0.0, True
    for pp in ref["logits_check"]["per_position"]:
        row = logits[pp["pos"]].double()
        _, idx = fu.top_k(row, 5)
        ids_ok &= idx.tolist() == pp["top5_ids"]
        worst = max(worst, (row[pp["top5_ids"]] - torch.tensor(pp["top5_logits"])).abs().max().item())
        worst_sum = max(worst_sum, abs(row.sum().item() - pp["logit_sum"]))
    return ids_ok, worst, worst_sum


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="/work/shared/models/stories260K",
                    help="dir with stories260K.bin, stories260K.gguf, tok512.model, reference/")
    ap.add_argument("--hf-out", help="also save the converted HF model here (not committed)")
    args = ap.parse_args()
    fu.setup_torch()
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=os.path.join(args.models, "tok512.model"))
    with open(os.path.join(args.models, "reference", "stories260K_reference.json")) as f:
        ref = json.load(f)
    c, w = read_llama2c(os.path.join(args.models, "stories260K.bin"))
    fu.log(f"stories260K.bin: {c}")
    model = build_hf(c, w, permute=True)

    ids = torch.tensor(ref["logits_check"]["input_ids"], dtype=torch.int64)
    sentence = sp.decode(ids.tolist())
    logits, hidden = forward(model, ids)
    ids_ok, worst, worst_sum = compare_reference(logits, ref)
    fu.log(f"permuted: top5 ids equal {ids_ok}, max |top5 logit diff| {worst:.2e}, "
           f"max |logit sum diff| {worst_sum:.2e}")
    assert ids_ok and worst < 1e-3 and worst_sum < 1e-2, "stories260K does not match the reference"

    bad = build_hf(c, w, permute=False)
    b_ok, b_worst, _ = compare_reference(forward(bad, ids)[0], ref)
    fu.log(f"UNpermuted (wrong): top5 ids equal {b_ok}, max |top5 logit diff| {b_worst:.2e}")
    assert not b_ok and b_worst > 0.1, "the unpermuted model should not match"

    logits64, _ = forward(build_hf(c, w, permute=True).double(), ids)
    err64 = (logits.double() - logits64).abs().max().item()
    _, worst64, worst_sum64 = compare_reference(logits64, ref)

    bos = torch.tensor([1], dtype=torch.int64)
    g_bos = greedy(model, bos, GREEDY_FROM_BOS)
    bos_ok = g_bos.tolist() == ref["greedy_from_bos"]["tokens"]
    n_agree = int((g_bos == torch.tensor(ref["greedy_from_bos"]["tokens"])).long().cumprod(0).sum())
    fu.log(f"greedy from BOS ({GREEDY_FROM_BOS}): equal to reference {bos_ok} ({n_agree} agree)")
    prompts_ok = {}
    for gp in ref["greedy_prompts"]:
        p_ids = torch.tensor(gp["prompt_ids_with_bos"], dtype=torch.int64)
        assert [1] + sp.encode(gp["prompt"]) == gp["prompt_ids_with_bos"]
        out = greedy(model, p_ids, len(gp["tokens"]) - len(p_ids))
        prompts_ok[gp["prompt"]] = out.tolist() == gp["tokens"]
    fu.log(f"greedy prompts equal to reference: {prompts_ok}")
    assert bos_ok and all(prompts_ok.values())
    gguf_facts = check_gguf(os.path.join(args.models, "stories260K.gguf"), c, w, model)
    fu.log(f"gguf: {gguf_facts}")

    if args.hf_out:
        model.save_pretrained(args.hf_out, safe_serialization=True)
        fu.log(f"HF model written to {args.hf_out}")

    fdir = os.path.join(fu.FIXTURES_DIR, NAME)
    shutil.rmtree(fdir, ignore_errors=True)
    expected = {"input_ids": ids, "logits": logits, "hidden_states": hidden,
                "greedy_from_bos_ids": g_bos}
    fu.save_expected(fdir, expected)
    desc = {
        "input_ids": f"BOS + sp.encode({sentence!r}) with tok512.model (the reference JSON's "
                     f"logits_check ids), (T,)",
        "logits": "transformers LlamaForCausalLM f32 logits at every position (T, 512), model "
                  "built from stories260K.bin with wq/wk permuted to HF layout",
        "hidden_states": "output_hidden_states (L+1, T, 64): [0] embeddings, [i] after layer i, "
                         "[L] after the final RMSNorm",
        "greedy_from_bos_ids": f"generate from [BOS] greedily, {GREEDY_FROM_BOS} new tokens, no "
                               f"EOS stop (201,) -- equal to the reference JSON's greedy_from_bos",
    }
    entry = {
        "what": "stories260K (real pretrained TinyStories Llama-2 model, Meta/llama2.c layout) "
                "converted to transformers; logits for one sentence; cross-checked against the "
                "independent float64 numpy reference in /work/shared/models/stories260K/reference",
        "model_file": "/work/shared/models/stories260K/stories260K.bin (and the bit-identical "
                      "stories260K.gguf); no model dir committed, use --hf-out to make one",
        "expected": fu.rel(os.path.join(fdir, "expected.safetensors")),
        "seed": None,
        "sentence": sentence,
        "tensors": fu.describe(expected, desc),
        "qk_permutation": {
            "meta_to_hf": "hf = w.reshape(n_heads, head_dim // 2, 2, in).transpose(1, 2)"
                          ".reshape(n_heads * head_dim, in)   # transformers "
                          "convert_llama_weights_to_hf.py permute()",
            "hf_to_meta": "w = hf.reshape(n_heads, 2, head_dim // 2, in).transpose(1, 2)"
                          ".reshape(n_heads * head_dim, in)   # llama.cpp convert_hf_to_gguf.py "
                          "LlamaModel.permute(); GGUF 'llama' attn_q/attn_k are in this layout",
            "index_form": "within each head h (rows h*hd .. h*hd+hd-1): HF row j = Meta row 2j and "
                          "HF row hd/2 + j = Meta row 2j + 1, for j < hd/2. Meta pair (2j, 2j+1) "
                          "rotated by angle pos*theta^(-2j/hd) == HF pair (j, j + hd/2) by the same "
                          "angle, so q.k is unchanged; only q/k rows move (k with n_kv_heads). v, o, "
                          "norms, ffn and embeddings are identical in both layouts.",
            "applies_to": "wq with n_heads (8 here), wk with n_kv_heads (4 here); head_dim 8",
            "proof": f"with the permutation: reference top-5 ids equal at all 16 positions, top-5 "
                     f"logits within {worst:.1e}, greedy 200 from BOS and all 3 prompts identical; "
                     f"without it: top-5 ids differ, logits off by {b_worst:.2f}",
            "gguf": gguf_facts,
            "for_lathe": "a GGUF 'llama' (and llama2.c .bin) q/k is already in interleaved layout: "
                         "either run interleaved RoPE on it, or apply meta_to_hf at load and run "
                         "half-split RoPE (what transformers does). HF safetensors -> GGUF needs "
                         "hf_to_meta; GGUF qwen2 is NOT permuted (NEOX/half-split RoPE).",
        },
        "tolerances": {
            "float32": {
                "logits_atol": 1e-4, "logits_rtol": 1e-4,
                "top1": "all positions; greedy_from_bos_ids exactly",
                "why": f"transformers f32 vs the same model in float64: {err64:.1e} max-abs "
                       f"(logits up to ~20); 1e-4 leaves ~10x headroom for other summation orders.",
            },
        },
        "measured": {
            "max_abs_f32_vs_f64_logits": float(f"{err64:.3g}"),
            "max_abs_top5_vs_reference_json_f32": float(f"{worst:.3g}"),
            "max_abs_top5_vs_reference_json_f64": float(f"{worst64:.3g}"),
            "max_abs_logit_sum_vs_reference_json_f64": float(f"{worst_sum64:.3g}"),
            "unpermuted_max_abs_top5_vs_reference_json": float(f"{b_worst:.3g}"),
            "greedy_from_bos_equals_reference": bos_ok,
            "greedy_prompts_equal_reference": prompts_ok,
            "min_top1_margin": round((fu.top_k(logits, 2)[0][:, 0]
                                      - fu.top_k(logits, 2)[0][:, 1]).min().item(), 4),
        },
    }
    entry["fixture_bytes"] = fu.dir_size(fdir)
    fu.update_manifest({NAME: entry}, GENERATOR)
    fu.log(f"{fu.rel(fdir)}: {entry['fixture_bytes'] / 1024:.0f} KiB")


if __name__ == "__main__":
    main()

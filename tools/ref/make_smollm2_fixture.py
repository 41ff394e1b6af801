#!/usr/bin/env python3
"""Makes the SmolLM2-135M-Instruct golden fixture: chat-prompt ids, logits and greedy generation.

What it makes: tests/golden/fixtures/smollm2_135m_chat/expected.safetensors and a MANIFEST.json
entry (no model dir: the model is the GGUF from scripts/fetch-models.sh, sha256 pinned there).
Two one-turn chat prompts, `capital` ("What is the capital of France?", answer ends in EOS) and
`story` (32 tokens without EOS); tensor names are prefixed with the prompt key:
  <key>.input_ids     the chat prompt rendered with the GGUF's own chat template and tokenized
  capital.last_logits full logits at the last prompt position (vocab 49152), f32
  <key>.top20_logits / <key>.top20_ids   top-20 logits and token ids at every prompt position
  <key>.greedy_ids    transformers generate(do_sample=False, max_new_tokens=32) new tokens
  <key>.greedy_top2_logits  top-2 logits at each greedy step (margins: how safe each step is)
How: transformers loads the GGUF with `gguf_file=` and dequantizes Q4_1 / Q8_0 to f32 (it also
undoes llama.cpp's Q/K row permutation, checked here against gguf-py's own dequantizer); the
forward runs in f32 with eager attention on one thread. The script also measures the error
budgets behind the recommended tolerances: f32 vs float64, and f32 vs the same model with every
Linear input fake-quantized to int8 in blocks of 32 (what llama.cpp-style Q4_1 x Q8_1 and
Q8_0 x Q8_0 kernels do to activations).

Run (~3 min on one core, ~3 GB RAM):
  GGUF=$(scripts/fetch-models.sh)
  $LATHE_REF_VENV/bin/python tools/ref/make_smollm2_fixture.py "$GGUF" [--skip-f64]
"""
import argparse
import copy
import hashlib
import os
import shutil

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import fixture_util as fu

GENERATOR = "tools/ref/make_smollm2_fixture.py"
NAME = "smollm2_135m_chat"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
PROMPTS = [("capital", "What is the capital of France?"),
           ("story", "Write a short story about a robot who learns to paint.")]
TOPK = 20
NEW_TOKENS = 32
QBLOCK = 32


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def llamacpp_permute(w, n_head):
    """HF (half-split RoPE) rows -> GGUF/Meta (interleaved pairs) rows, as convert_hf_to_gguf.py."""
    out, inp = w.shape
    return w.reshape(n_head, 2, out // n_head // 2, inp).swapaxes(1, 2).reshape(out, inp)


def check_dequant_and_permutation(gguf_path, model):
    """HF weights must equal gguf-py dequant; q/k must equal it after undoing llama.cpp's permute."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    cfg = model.config
    r = GGUFReader(gguf_path)
    by_name = {t.name: t for t in r.tensors}
    sd = model.state_dict()
    checked = 0
    for i in range(cfg.num_hidden_layers):
        for g, h, nh in (("attn_q", "q_proj", cfg.num_attention_heads),
                         ("attn_k", "k_proj", cfg.num_key_value_heads),
                         ("attn_v", "v_proj", None), ("attn_output", "o_proj", None)):
            t = by_name[f"blk.{i}.{g}.weight"]
            w = dequantize(t.data, t.tensor_type).reshape(tuple(int(x) for x in t.shape[::-1]))
            hf = sd[f"model.layers.{i}.self_attn.{h}.weight"].numpy()
            if nh is not None:
                # The GGUF rows are the HF rows permuted; and not the HF rows themselves.
                assert np.array_equal(llamacpp_permute(hf, nh), w), f"layer {i} {g}: permute"
                assert not np.array_equal(hf, w), f"layer {i} {g}: unexpectedly unpermuted"
            else:
                assert np.array_equal(hf, w), f"layer {i} {g}: dequant"
            checked += 1
    t = by_name["token_embd.weight"]
    w = dequantize(t.data, t.tensor_type).reshape(tuple(int(x) for x in t.shape[::-1]))
    assert np.array_equal(sd["model.embed_tokens.weight"].numpy(), w), "token_embd dequant"
    return checked + 1


def fake_quant_q8(x):
    """Symmetric int8 in blocks of 32 along the last dim, d = amax/127 (Q8_0/Q8_1 activations)."""
    shp = x.shape
    xb = x.reshape(-1, shp[-1] // QBLOCK, QBLOCK)
    d = xb.abs().amax(-1, keepdim=True) / 127.0
    d = d.to(torch.float16).to(torch.float32)  # ggml stores the block scale as f16
    q = torch.where(d > 0, torch.round(xb / torch.where(d > 0, d, torch.ones_like(d))),
                    torch.zeros_like(xb)).clamp(-127, 127)
    return (q * d).reshape(shp)


def add_act_quant_hooks(model):
    hooks = []
    for _, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear):
            hooks.append(mod.register_forward_pre_hook(lambda m, args: (fake_quant_q8(args[0]),)))
    return hooks


@torch.no_grad()
def prompt_logits(model, ids):
    return model(input_ids=ids[None], use_cache=False).logits[0].float()


@torch.no_grad()
def greedy(model, ids, eos_id):
    out = model.generate(input_ids=ids[None], attention_mask=torch.ones_like(ids)[None],
                         do_sample=False, max_new_tokens=NEW_TOKENS,
                         eos_token_id=eos_id, pad_token_id=eos_id, output_scores=True,
                         return_dict_in_generate=True, use_cache=True)
    new = out.sequences[0, len(ids):]
    top2 = torch.stack([torch.sort(s[0].float(), descending=True).values[:2] for s in out.scores])
    return new, top2


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gguf", help="path to SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--skip-f64", action="store_true", help="skip the float64 noise measurement")
    args = ap.parse_args()
    fu.setup_torch()
    got = sha256(args.gguf)
    assert got == SHA256, f"{args.gguf}: sha256 {got} != pinned {SHA256}"
    d, f = os.path.split(os.path.abspath(args.gguf))

    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    n_checked = check_dequant_and_permutation(args.gguf, model)
    fu.log(f"dequant + Q/K permutation verified on {n_checked} tensors")

    eos = tok.convert_tokens_to_ids("<|im_end|>")
    assert eos == 2, eos
    fdir = os.path.join(fu.FIXTURES_DIR, NAME)
    shutil.rmtree(fdir, ignore_errors=True)
    m64 = None if args.skip_f64 else copy.deepcopy(model).double()
    expected, desc, prompts, measured = {}, {}, {}, {}
    for key, content in PROMPTS:
        messages = [{"role": "user", "content": content}]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = torch.tensor(tok(text, add_special_tokens=False).input_ids, dtype=torch.int64)
        ids2 = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                       return_dict=False)
        ids2 = ids2["input_ids"] if isinstance(ids2, dict) else ids2
        assert list(ids2) == ids.tolist(), (ids2, ids.tolist())
        fu.log(f"{key}: prompt {len(ids)} tokens: {ids.tolist()}")

        logits = prompt_logits(model, ids)
        top_v, top_i = fu.top_k(logits, TOPK)
        new_ids, g_top2 = greedy(model, ids, eos)
        greedy_text = tok.decode(new_ids, skip_special_tokens=False)
        fu.log(f"{key}: greedy {len(new_ids)} tokens: {greedy_text!r}")

        # Error budgets.
        me = {}
        if m64 is not None:
            l64 = prompt_logits(m64, ids).double()
            me["max_abs_f32_vs_f64_logits_all_positions"] = float(
                f"{(logits.double() - l64).abs().max().item():.3g}")
            me["max_abs_f32_vs_f64_last_logits"] = float(
                f"{(logits[-1].double() - l64[-1]).abs().max().item():.3g}")
        hooks = add_act_quant_hooks(model)
        lq = prompt_logits(model, ids)
        q_new, _ = greedy(model, ids, eos)
        for h in hooks:
            h.remove()
        me["int8_act_max_abs_last_logits"] = float(f"{(lq[-1] - logits[-1]).abs().max():.3g}")
        me["int8_act_max_abs_all_positions"] = float(f"{(lq - logits).abs().max():.3g}")
        me["int8_act_top1_agreement_prompt_positions"] = round(
            (lq.argmax(-1) == logits.argmax(-1)).float().mean().item(), 4)
        _, qi = fu.top_k(lq, 5)
        me["int8_act_min_top5_overlap"] = min(
            len(set(qi[t].tolist()) & set(top_i[t, :5].tolist())) for t in range(len(ids)))
        n = min(len(q_new), len(new_ids))
        me["int8_act_greedy_tokens_agreeing_before_first_difference"] = int(
            (q_new[:n] == new_ids[:n]).long().cumprod(0).sum().item())
        me["int8_act_greedy_text"] = tok.decode(q_new, skip_special_tokens=False)
        me["prompt_top1_margin_min"] = round((top_v[:, 0] - top_v[:, 1]).min().item(), 4)
        me["greedy_top1_margin_min"] = round((g_top2[:, 0] - g_top2[:, 1]).min().item(), 4)
        me["last_logits_std"] = round(logits[-1].std().item(), 4)
        me["last_top5"] = [[int(i), round(float(v), 4)] for v, i in zip(top_v[-1, :5], top_i[-1, :5])]
        fu.log(f"{key}: measured {me}")
        measured[key] = me

        expected.update({
            f"{key}.input_ids": ids,
            f"{key}.top20_logits": top_v,
            f"{key}.top20_ids": top_i,
            f"{key}.greedy_ids": new_ids.to(torch.int64),
            f"{key}.greedy_top2_logits": g_top2.float(),
        })
        desc.update({
            f"{key}.input_ids": "chat prompt ids (T,): apply_chat_template(add_generation_prompt="
                                "True) text tokenized with add_special_tokens=False (the GGUF says "
                                "add_bos_token=false; the template starts with <|im_start|> = 1)",
            f"{key}.top20_logits": "top-20 logits at every prompt position (T, 20), descending",
            f"{key}.top20_ids": "token ids of top20_logits (T, 20); ties broken by lower id",
            f"{key}.greedy_ids": f"generate(do_sample=False, max_new_tokens={NEW_TOKENS}) new ids "
                                 f"only, stopping after EOS <|im_end|>={eos} if it comes first "
                                 f"(then the last id is {eos})",
            f"{key}.greedy_top2_logits": "best and second-best logit at each generate step "
                                         "(N, 2): a step whose margin is below the tolerance may "
                                         "legitimately flip",
        })
        if key == "capital":
            expected[f"{key}.last_logits"] = logits[-1].contiguous()
            desc[f"{key}.last_logits"] = "logits at position T-1 over the whole vocab (49152,)"
        prompts[key] = {"messages": messages, "rendered_prompt": text, "input_ids": ids.tolist(),
                        "greedy_ids": new_ids.tolist(), "greedy_text": greedy_text}
    del m64
    fu.save_expected(fdir, expected)
    f64 = [m.get("max_abs_f32_vs_f64_logits_all_positions", 1e-4) for m in measured.values()]
    i8 = [m["int8_act_max_abs_all_positions"] for m in measured.values()]
    tol_f32 = max(1e-3, 10 * max(f64))
    entry = {
        "what": "SmolLM2-135M-Instruct (real model, GGUF Q4_1 + Q8_0 tied embedding + F32 norms) "
                "on two one-turn chat prompts: `capital` (answer ends with EOS after 8 tokens) "
                "and `story` (32 tokens, no EOS); weights dequantized to f32 by transformers",
        "model_file": "SmolLM2-135M-Instruct.Q4_1.gguf (scripts/fetch-models.sh)",
        "model_sha256": SHA256,
        "expected": fu.rel(os.path.join(fdir, "expected.safetensors")),
        "seed": None,
        "deterministic": "no randomness: greedy decoding, eval mode, 1 thread",
        "prompts": prompts,
        "tensors": fu.describe(expected, desc),
        "model_facts": {
            "config": "llama, 30 layers, hidden 576, 9 heads / 3 kv heads, head_dim 64, ffn 1536, "
                      "vocab 49152, tied, rope theta 100000 (no scaling), rms eps "
                      "9.999999747378752e-06 (1e-5 as f32 in the GGUF)",
            "tokens": "<|im_start|>=1 (also bos), <|im_end|>=2 (eos, pad), <|endoftext|>=0 (unk); "
                      "the chat template adds a default system turn when none is given",
            "qk_layout": f"verified on {n_checked} tensors: the GGUF attn_q/attn_k rows are the HF "
                         f"q_proj/k_proj rows permuted by llama.cpp's permute (see the stories260K "
                         f"entry), i.e. laid out for interleaved-pair RoPE; transformers un-permutes "
                         f"them when it loads the GGUF, then applies half-split RoPE. attn_v, "
                         f"attn_output and token_embd dequantize bit-exactly as gguf-py does.",
        },
        "tolerances": {
            "f32_activations": {
                "applies_to": "lathe computing with f32 activations (quantized weights dequantized "
                              "exactly, on the fly or not)",
                "logits_atol": round(tol_f32, 4),
                "top1": "every prompt position and every greedy step",
                "why": "the weights are then exactly transformers' weights; f32 summation order "
                       "over 30 layers moves logits by the measured f32-vs-f64 amount, so allow "
                       "~10x that (floor 1e-3). Greedy ids must match exactly: the smallest "
                       "greedy margin (measured) is far above this tolerance.",
            },
            "int8_activations": {
                "applies_to": "lathe quantizing matmul inputs to int8 blocks of 32 (Q8_0/Q8_1 "
                              "style, as llama.cpp does for Q4_1/Q8_0 weights)",
                "logits_atol": round(max(0.25, 2 * max(i8)), 2),
                "top1": "top-5 overlap >= 3 of 5 at every prompt position; NO top-1 or greedy "
                        "requirement for `capital` (see why); `story` greedy ids as a soft check",
                "why": "fake-quantizing every Linear input here (int8, block 32, f16 scale) moved "
                       "the prompt logits by int8_act_max_abs_all_positions (measured; logit std "
                       "is ~3.5, so a few percent); real kernels differ in rounding details, so "
                       "allow ~2x. `capital`'s first answer token is a near tie ('The' 25.325 vs "
                       "'L' 25.243, margin 0.08 < the int8 noise): with int8 activations the "
                       "greedy answer became \"L'Etoile, la Marseillaise, ...\" instead of \"The "
                       "capital of France is Paris.\" (int8_act_greedy_text). `story` kept all "
                       "32 greedy tokens under int8 but its smallest margin is 0.0135. Golden "
                       "greedy tests should run the f32-activation path.",
            },
        },
        "measured": measured,
    }
    entry["fixture_bytes"] = fu.dir_size(fdir)
    fu.update_manifest({NAME: entry}, GENERATOR)
    fu.log(f"{fu.rel(fdir)}: {entry['fixture_bytes'] / 1024:.0f} KiB")


if __name__ == "__main__":
    main()

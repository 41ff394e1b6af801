#!/usr/bin/env python3
"""Makes small seeded random Llama-family models and their transformers logits (golden fixtures).

What it makes, under tests/golden/fixtures/ (paths relative to the repo root):
  llama_gqa_tied/       llama, 4 heads / 2 kv heads, tied head                         (f32)
  llama_gqa_tied_bf16/  the same weights cast with model.to(torch.bfloat16), bf16 logits (bf16)
  llama_gqa4_untied/    llama, 8 heads / 2 kv heads (GQA ratio 4), untied head         (f32)
  qwen2_bias/           qwen2: q/k/v bias, untied, 4/2 heads, rope theta 1e6           (f32)
  llama3_rope/          llama with llama3 rope scaling (factor 8, orig ctx 32), 64 positions,
                        config.json in the *legacy Hub layout* (rope_theta + rope_scaling)  (f32)
  mistral/              mistral, 4 heads / 1 kv head (MQA), head_dim 32 != dim/heads   (f32)
  mistral_swa/          mistral with sliding_window 8 over 32 positions                (f32)
  qwen2_swa/            qwen2 with use_sliding_window, window 6, max_window_layers 1 (layer 1
                        slides, layer 0 does not); config.json without layer_types, as the
                        Qwen2/2.5 Hub configs are                                       (f32)
  qwen3_yarn/           qwen3 with YaRN rope scaling (factor 4 over an original context of 32), 64 positions (f32)
  llama_attn_bias/      llama with attention_bias: q/k/v and o_proj biases, 4/2 heads, untied       (f32)
  qwen3/                qwen3: per-head q/k RMSNorm (q_norm, k_norm) before RoPE, no biases, 4/2 heads,
                        head_dim 32 != dim/heads, tied, rope theta 1e6; plus model.gguf, the same
                        weights written with gguf-py's llama.cpp tensor names and qwen3.* keys (f32);
                        model/tokenizer.json: a 256-byte BPE without BOS (HF tokenizers), and eval_ids /
                        eval_mean_nll: transformers' loss on EVAL_TEXT, for lathe eval without a BOS
Each fixture dir holds model/ (config.json, generation_config.json, model.safetensors exactly as
save_pretrained writes them, except llama3_rope's config.json, see above) and expected.safetensors
(input_ids, logits, hidden_states, rope_inv_freq; see MANIFEST.json for each tensor). Entries are
merged into tests/golden/fixtures/MANIFEST.json.

All models: vocab 256, hidden 64, 2 layers, SwiGLU ffn 96, eager attention, eval mode, one
sequence (no padding, no batch). Weights are drawn from a seeded torch.Generator (std 0.1 for
matrices and embeddings, 1 + 0.1*N for RMSNorm weights, 0.1*N for biases) so every parameter
matters and logits are non-trivial. Fully deterministic: same versions -> same bytes.

Run (from anywhere; ~20 s on one core):
  $LATHE_REF_VENV/bin/python tools/ref/make_random_models.py [--only NAME ...]
"""
import argparse
import copy
import json
import os
import shutil

import torch
import gguf
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

import fixture_util as fu

GENERATOR = "tools/ref/make_random_models.py"
VOCAB = 256
DIM = 64
LAYERS = 2
FFN = 96
WEIGHT_STD = 0.1

COMMON = dict(vocab_size=VOCAB, hidden_size=DIM, intermediate_size=FFN, num_hidden_layers=LAYERS,
              hidden_act="silu", attention_dropout=0.0, bos_token_id=1, eos_token_id=2,
              pad_token_id=None, use_cache=False)

SPECS = [
    dict(name="llama_gqa_tied", seed=1001, seq_len=32, cls=LlamaForCausalLM, cfg=LlamaConfig,
         kw=dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                 rms_norm_eps=1e-5, max_position_embeddings=256,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
         bf16_copy=True,
         covers="llama, GQA 4q/2kv (head_dim 16), tied lm_head (no lm_head.weight in the file), "
                "eps 1e-5, rope theta 1e4"),
    dict(name="llama_gqa4_untied", seed=1002, seq_len=40, cls=LlamaForCausalLM, cfg=LlamaConfig,
         kw=dict(num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=False,
                 rms_norm_eps=1e-6, max_position_embeddings=256,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
         covers="llama, GQA ratio 4 (8q/2kv, head_dim 8), untied lm_head, eps 1e-6"),
    dict(name="qwen2_bias", seed=1003, seq_len=32, cls=Qwen2ForCausalLM, cfg=Qwen2Config,
         kw=dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                 rms_norm_eps=1e-6, max_position_embeddings=256, use_sliding_window=False,
                 rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
         covers="qwen2: bias on q/k/v (not on o), untied, GQA 4q/2kv, eps 1e-6, rope theta 1e6"),
    dict(name="llama3_rope", seed=1004, seq_len=64, cls=LlamaForCausalLM, cfg=LlamaConfig,
         kw=dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                 rms_norm_eps=1e-5, max_position_embeddings=128,
                 rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 32}),
         legacy_config=True,
         covers="llama3 rope scaling (factor 8, low 1, high 4, original ctx 32; with head_dim 16 "
                "and theta 1e4 the 8 frequencies hit all three branches: wavelength < 8 kept, "
                "8..32 smoothed, > 32 divided by 8), 64 positions, tied; config.json in the legacy "
                "Hub layout (top-level rope_theta + rope_scaling), as real Llama-3 checkpoints have"),
    dict(name="mistral", seed=1005, seq_len=32, cls=MistralForCausalLM, cfg=MistralConfig,
         kw=dict(num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                 tie_word_embeddings=False, rms_norm_eps=1e-5, max_position_embeddings=256,
                 sliding_window=None,
                 rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
         covers="mistral, MQA (4q/1kv), explicit head_dim 32 so q_dim 128 != hidden 64 "
                "(o_proj is 64x128), untied, rope theta 1e6, sliding_window null"),
    dict(name="mistral_swa", seed=1006, seq_len=32, cls=MistralForCausalLM, cfg=MistralConfig,
         kw=dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                 rms_norm_eps=1e-5, max_position_embeddings=256, sliding_window=8,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
         covers="mistral sliding-window attention, window 8 over 32 positions (key s is visible "
                "from query t iff t - 8 < s <= t, in every layer), GQA 4q/2kv, untied"),
    dict(name="qwen2_swa", seed=1007, seq_len=32, cls=Qwen2ForCausalLM, cfg=Qwen2Config,
         kw=dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                 rms_norm_eps=1e-6, max_position_embeddings=256, use_sliding_window=True,
                 sliding_window=6, max_window_layers=1,
                 rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
         drop_layer_types=True,
         covers="qwen2 with use_sliding_window: window 6 in the layers from max_window_layers = 1 "
                "on (layer 1 slides, layer 0 sees everything), q/k/v bias, tied; config.json "
                "without layer_types (as the Qwen2/2.5 Hub configs), so the layers come from "
                "max_window_layers"),
    dict(name="qwen3_yarn", seed=1010, seq_len=64, cls=Qwen3ForCausalLM, cfg=Qwen3Config,
         kw=dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True,
                 rms_norm_eps=1e-6, max_position_embeddings=256, attention_bias=False, use_sliding_window=False,
                 rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                  "original_max_position_embeddings": 32}),
         gguf_copy=True,
         covers="qwen3 with YaRN rope scaling (factor 4, original context 32, beta 32 / 1, theta 1e4: pairs 0-2 "
                "ramp from extrapolated to interpolated frequencies, cos / sin scaled by 1 + 0.1 ln 4), 64 "
                "positions, as Qwen's long-context config writes it; model.gguf with qwen3.rope.scaling.* as convert_hf_to_gguf "
                "writes them"),
    dict(name="llama_attn_bias", seed=1009, seq_len=32, cls=LlamaForCausalLM, cfg=LlamaConfig,
         kw=dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False, attention_bias=True,
                 rms_norm_eps=1e-5, max_position_embeddings=256,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
         covers="llama with attention_bias: biases on q, k, v AND o_proj (transformers' LlamaAttention), "
                "GQA 4q/2kv, untied"),
    dict(name="qwen3", seed=1008, seq_len=32, cls=Qwen3ForCausalLM, cfg=Qwen3Config,
         kw=dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True,
                 rms_norm_eps=1e-6, max_position_embeddings=256, attention_bias=False,
                 use_sliding_window=False,
                 rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
         gguf_copy=True, byte_tokenizer=True,
         covers="qwen3: q_norm / k_norm (RMSNorm over head_dim, one weight shared by the heads) on q and k "
                "after the projections and before RoPE; no q/k/v bias; GQA 4q/2kv with head_dim 32 so "
                "q_dim 128 != hidden 64; tied; eps 1e-6; rope theta 1e6. model.gguf: the same f32 "
                "weights under llama.cpp's names (gguf-py's tensor map for MODEL_ARCH.QWEN3) and "
                "qwen3.* metadata, as convert_hf_to_gguf.py writes a Qwen3 (NEOX rope: no q/k permutation)"),
]


EVAL_TEXT = "Once upon a time, a small robot found a red ball in the park. It rolled the ball to a dog."


def write_byte_tokenizer(model_dir):
    """A byte-level BPE tokenizer.json over the 256 bytes (token id = byte value), no merges and no BOS token,
    made by HF's tokenizers library, as Qwen's vocabularies have no BOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.save(os.path.join(model_dir, "tokenizer.json"))
    return tok


def write_gguf(model, path):
    """The model's f32 weights as a GGUF, named by gguf-py's map for its architecture (llama.cpp's own)."""
    cfg = model.config
    arch = gguf.MODEL_ARCH.QWEN3
    w = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[arch])
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    rp = cfg.rope_parameters
    w.add_rope_freq_base(rp["rope_theta"])
    if rp.get("rope_type") == "yarn":  # as convert_hf_to_gguf.py writes a Qwen rope_scaling
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rp["factor"])
        w.add_rope_scaling_orig_ctx_len(rp["original_max_position_embeddings"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    names = gguf.get_tensor_name_map(arch, cfg.num_hidden_layers)
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert new, name
        w.add_tensor(new, t.detach().float().contiguous().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def init_weights(model, seed):
    """Overwrites every parameter from a seeded generator, in name order."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(WEIGHT_STD * torch.randn(p.shape, generator=g))


@torch.no_grad()
def forward(model, ids):
    out = model(input_ids=ids[None], output_hidden_states=True, use_cache=False)
    logits = out.logits[0].float()
    hidden = torch.stack([h[0].float() for h in out.hidden_states])
    return logits, hidden


def write_legacy_config(model_dir):
    """Rewrites config.json from transformers 5's rope_parameters to the v4/Hub layout."""
    path = os.path.join(model_dir, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    rp = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rp.pop("rope_theta")
    cfg["rope_scaling"] = rp
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def drop_layer_types(model_dir):
    """Removes layer_types from config.json: the layers then follow max_window_layers."""
    path = os.path.join(model_dir, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg.pop("layer_types", None)
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def _heads_rows(w, n, order):
    """Reorders the head blocks of the rows of w (n heads) by order."""
    return w.reshape(n, -1, *w.shape[1:])[order].reshape(w.shape)


@torch.no_grad()
def bug_sensitivity(model, ids, logits):
    """Max |logits change| for plausible implementation bugs: shows 1e-4 is far below them."""
    cfg = model.config
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // nh
    out = {}

    def run(mutate):
        m = copy.deepcopy(model)
        mutate(m)
        return round((forward(m, ids)[0] - logits).abs().max().item(), 4)

    def rope_pairs(m):  # q/k rows in the other RoPE layout (interleaved vs half-split mix-up)
        for layer in m.model.layers:
            for proj, n in ((layer.self_attn.q_proj, nh), (layer.self_attn.k_proj, nkv)):
                for t in [proj.weight] + ([proj.bias] if proj.bias is not None else []):
                    v = t.reshape(n, 2, hd // 2, *t.shape[1:]).transpose(1, 2)
                    t.copy_(v.reshape(t.shape))
    out["rope_pairing_wrong"] = run(rope_pairs)

    def eps10(m):
        for mod in m.modules():
            if hasattr(mod, "variance_epsilon"):
                mod.variance_epsilon *= 10
    out["rms_eps_x10"] = run(eps10)

    if 1 < nkv < nh:
        g = nh // nkv
        # query head h reads kv head h % nkv instead of h // g (tile instead of repeat_interleave)
        order = [(p % nkv) * g + p // nkv for p in range(nh)]

        def tiled(m):
            for layer in m.model.layers:
                a = layer.self_attn
                a.q_proj.weight.copy_(_heads_rows(a.q_proj.weight, nh, order))
                if a.q_proj.bias is not None:
                    a.q_proj.bias.copy_(_heads_rows(a.q_proj.bias, nh, order))
                a.o_proj.weight.copy_(_heads_rows(a.o_proj.weight.T, nh, order).T)
        out["gqa_kv_head_mapping_tiled"] = run(tiled)

    if getattr(model.model.layers[0].self_attn.q_proj, "bias", None) is not None:
        def nobias(m):
            for layer in m.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.zero_()
        out["qkv_bias_dropped"] = run(nobias)

    if getattr(model.model.layers[0].self_attn.o_proj, "bias", None) is not None:
        def no_o_bias(m):
            for layer in m.model.layers:
                layer.self_attn.o_proj.bias.zero_()
        out["o_bias_dropped"] = run(no_o_bias)

    if getattr(cfg, "sliding_window", None) and "sliding_attention" in (getattr(cfg, "layer_types", None) or
                                                                        ["sliding_attention"]):
        def no_window(m):  # every layer attends to all earlier positions
            m.config.sliding_window = None
            if getattr(m.config, "layer_types", None):
                m.config.layer_types = ["full_attention"] * len(m.config.layer_types)
                m.model.has_sliding_layers = False
            for layer in m.model.layers:
                layer.self_attn.sliding_window = None
        out["sliding_window_ignored"] = run(no_window)

    if getattr(model.model.layers[0].self_attn, "q_norm", None) is not None:
        def no_qk_norm(m):  # the per-head q / k norms left out
            for layer in m.model.layers:
                layer.self_attn.q_norm = torch.nn.Identity()
                layer.self_attn.k_norm = torch.nn.Identity()
        out["qk_norm_dropped"] = run(no_qk_norm)

        def qk_norm_over_all_heads(m):  # one RMS over all of q's (k's) heads instead of each head's
            for layer in m.model.layers:
                a = layer.self_attn
                for name in ("q_norm", "k_norm"):
                    norm = getattr(a, name)

                    class Whole(torch.nn.Module):
                        def __init__(self, inner):
                            super().__init__()
                            self.inner = inner

                        def forward(self, x):  # x: (B, T, heads, head_dim)
                            v = x.float().pow(2).mean((-2, -1), keepdim=True)
                            return self.inner.weight * (x.float() * torch.rsqrt(v + self.inner.variance_epsilon))
                    setattr(a, name, Whole(norm))
        out["qk_norm_over_all_heads"] = run(qk_norm_over_all_heads)

    rp = cfg.rope_parameters
    if rp.get("rope_type") == "yarn":
        def no_attention_factor(m):  # the ramp's frequencies, cos / sin unscaled
            m.model.rotary_emb.attention_scaling = 1.0
        out["yarn_attention_factor_ignored"] = run(no_attention_factor)
    if rp.get("rope_type") == "llama3":
        def unscaled(m):
            base = rp["rope_theta"]
            m.model.rotary_emb.inv_freq = 1.0 / (
                base ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
        out["llama3_scaling_ignored"] = run(unscaled)
    return out


def stats(logits):
    p = torch.softmax(logits.double(), -1)
    v = torch.sort(logits, -1, descending=True).values
    return {
        "logits_std": round(logits.std().item(), 4),
        "logits_absmax": round(logits.abs().max().item(), 4),
        "mean_top1_prob": round(p.max(-1).values.mean().item(), 4),
        # Smallest top-1 minus top-2 logit over positions: top-1 agreement is only a meaningful
        # check when this is well above the logits tolerance.
        "min_top1_margin": round((v[:, 0] - v[:, 1]).min().item(), 4),
    }


def f32_tolerances(err64, bugs):
    return {
        "float32": {
            "logits_atol": 1e-4, "logits_rtol": 1e-4,
            "hidden_states_atol": 1e-4, "hidden_states_rtol": 1e-4,
            "why": f"transformers' f32 logits differ from the same model run in float64 by "
                   f"{err64:.1e} max-abs (logits are O(1)), so that is the size of honest f32 "
                   f"summation-order noise; 1e-4 leaves ~50x headroom for a different "
                   f"accumulation order/FMA/SIMD reductions, while the simulated bugs in "
                   f"measured.bug_sensitivity (wrong RoPE pairing, eps x10, GQA mapping, ...) "
                   f"move logits by at least {min(bugs.values()):.2g}.",
        },
        "top1_agreement": "all positions (argmax of lathe logits == argmax of expected)",
    }


def make_one(spec):
    name = spec["name"]
    fdir = os.path.join(fu.FIXTURES_DIR, name)
    mdir = os.path.join(fdir, "model")
    shutil.rmtree(fdir, ignore_errors=True)
    cfg = spec["cfg"](**COMMON, **spec["kw"])
    cfg._attn_implementation = "eager"
    torch.manual_seed(spec["seed"])
    model = spec["cls"](cfg).eval()
    init_weights(model, spec["seed"])
    g = torch.Generator().manual_seed(spec["seed"] + 77)
    ids = torch.randint(0, VOCAB, (spec["seq_len"],), generator=g, dtype=torch.int64)

    logits, hidden = forward(model, ids)
    logits64, _ = forward(copy.deepcopy(model).double(), ids)
    err64 = (logits.double() - logits64).abs().max().item()
    bugs = bug_sensitivity(model, ids, logits)
    inv_freq = model.model.rotary_emb.inv_freq.float().clone()
    attn_scaling = float(model.model.rotary_emb.attention_scaling)

    model.save_pretrained(mdir, safe_serialization=True)
    if spec.get("legacy_config"):
        write_legacy_config(mdir)
    if spec.get("drop_layer_types"):
        drop_layer_types(mdir)
    # The saved model must reload (from the config as written) to bit-identical logits.
    reloaded = AutoModelForCausalLM.from_pretrained(mdir, attn_implementation="eager").eval()
    re_logits, _ = forward(reloaded, ids)
    assert torch.equal(re_logits, logits), f"{name}: reload changed logits"
    assert torch.equal(reloaded.model.rotary_emb.inv_freq.float(), inv_freq), f"{name}: inv_freq"

    expected = {"input_ids": ids, "logits": logits, "hidden_states": hidden,
                "rope_inv_freq": inv_freq}
    fu.save_expected(fdir, expected)
    if spec.get("gguf_copy"):
        write_gguf(model, os.path.join(fdir, "model.gguf"))
    eval_entry = {}
    if spec.get("byte_tokenizer"):
        tok = write_byte_tokenizer(mdir)
        eval_ids = torch.tensor(tok.encode(EVAL_TEXT).ids, dtype=torch.int64)
        with torch.no_grad():  # transformers' loss: mean NLL of tokens 1.. given their prefix
            nll = model(input_ids=eval_ids[None], labels=eval_ids[None]).loss.item()
        expected["eval_ids"] = eval_ids
        expected["eval_mean_nll"] = torch.tensor([nll], dtype=torch.float64)
        fu.save_expected(fdir, expected)
        eval_entry = {"eval_text": EVAL_TEXT}
    desc = {
        "input_ids": "the token ids fed as one sequence, positions 0..T-1 (no BOS added)",
        "logits": "model(input_ids).logits[0] in f32: (T, vocab), causal, every position",
        "hidden_states": "output_hidden_states: [0] = token embeddings, [i] = residual stream after "
                         "decoder layer i (1..L-1), [L] = after the FINAL RMSNorm (transformers puts "
                         "norm(h) last, so logits = hidden_states[L] @ lm_head^T)",
        "rope_inv_freq": "rotary inv_freq per pair (head_dim/2), after rope scaling; attention_scaling "
                         f"= {attn_scaling}",
        "eval_ids": "model/tokenizer.json's ids of eval_text (no BOS)",
        "eval_mean_nll": "transformers' loss (labels = eval_ids): mean NLL of eval_ids[1:] given their prefix",
    }
    entries = {name: {
        "what": spec["covers"],
        "model_dir": fu.rel(mdir),
        "expected": fu.rel(os.path.join(fdir, "expected.safetensors")),
        "model_class": spec["cls"].__name__,
        "seed": spec["seed"],
        "input_ids_seed": spec["seed"] + 77,
        "weights_dtype": "float32",
        "tensors": fu.describe(expected, desc),
        **({"gguf": fu.rel(os.path.join(fdir, "model.gguf"))} if spec.get("gguf_copy") else {}),
        **eval_entry,
        "tolerances": f32_tolerances(err64, bugs),
        "measured": {"max_abs_f32_vs_f64_logits": float(f"{err64:.3g}"), **stats(logits),
                     "bug_sensitivity": bugs},
    }}
    fu.log(f"{name}: T={len(ids)} f32-vs-f64 {err64:.2e} {stats(logits)} bugs {bugs}")

    if spec.get("bf16_copy"):
        bname = name + "_bf16"
        bdir = os.path.join(fu.FIXTURES_DIR, bname)
        bmdir = os.path.join(bdir, "model")
        shutil.rmtree(bdir, ignore_errors=True)
        # Save the bf16 copy, then compute from the model *as loaded from that checkpoint*:
        # model.to(torch.bfloat16) also casts the rotary inv_freq buffer to bf16 (a torch artifact
        # that moves these logits by ~5e-2), whereas from_pretrained rebuilds inv_freq in f32.
        copy.deepcopy(model).to(torch.bfloat16).save_pretrained(bmdir, safe_serialization=True)
        mb = AutoModelForCausalLM.from_pretrained(bmdir, attn_implementation="eager").eval()
        assert mb.dtype == torch.bfloat16, mb.dtype
        assert mb.model.rotary_emb.inv_freq.dtype == torch.float32
        logits_bf, _ = forward(mb, ids)
        logits_up, _ = forward(copy.deepcopy(mb).float(), ids)  # bf16 weights, f32 math
        logits_up64, _ = forward(copy.deepcopy(mb).double(), ids)
        e_bf = (logits_bf.double() - logits_up64).abs().max().item()
        e_up = (logits_up.double() - logits_up64).abs().max().item()
        e_w = (logits_up.double() - logits.double()).abs().max().item()
        top1_bf = (logits_bf.argmax(-1) == logits_up.argmax(-1)).float().mean().item()
        bexp = {"input_ids": ids, "logits": logits_bf, "logits_f32_compute": logits_up}
        fu.save_expected(bdir, bexp)
        entries[bname] = {
            "what": f"{name} weights cast to bf16 with model.to(torch.bfloat16) (all tensors bf16, "
                    f"norms included) and saved; logits from that bf16 model computed by transformers",
            "model_dir": fu.rel(bmdir),
            "expected": fu.rel(os.path.join(bdir, "expected.safetensors")),
            "model_class": spec["cls"].__name__,
            "seed": spec["seed"],
            "input_ids_seed": spec["seed"] + 77,
            "weights_dtype": "bfloat16",
            "tensors": fu.describe(bexp, {
                "input_ids": f"same ids as {name}",
                "logits": "transformers bf16 forward of the model loaded with from_pretrained from "
                          "model/ (activations rounded to bf16 after every op by torch CPU bf16 "
                          "kernels; rotary inv_freq and cos/sin in f32), upcast to f32: (T, vocab)",
                "logits_f32_compute": "the same bf16 weights upcast to f32 and run in f32: what a "
                                      "kernel that reads bf16 weights but accumulates and keeps "
                                      "activations in f32 should produce",
            }),
            "tolerances": {
                "bf16_weights_f32_compute": {
                    "compare_to": "logits_f32_compute", "logits_atol": 1e-4, "logits_rtol": 1e-4,
                    "why": f"f32 math on exactly the bf16 weights: same f32 noise as the f32 "
                           f"fixtures (measured {e_up:.1e} vs float64).",
                },
                "bf16_compute": {
                    "compare_to": "logits", "logits_atol": round(max(4 * e_bf, 0.05), 3),
                    "logits_rtol": 0.0,
                    "why": f"torch's bf16 CPU forward rounds activations to bf16 (8 bits mantissa) "
                           f"after each op; it is {e_bf:.2e} max-abs from the exact (float64) result "
                           f"for these weights. A lathe path that keeps any activation in f32 lands "
                           f"in between, so allow ~4x that. Top-1 agreed with f32-compute on "
                           f"{top1_bf:.0%} of positions.",
                },
            },
            "measured": {
                "max_abs_torch_bf16_vs_f64": float(f"{e_bf:.3g}"),
                "max_abs_f32_compute_vs_f64": float(f"{e_up:.3g}"),
                "max_abs_bf16_weights_vs_f32_weights_logits": float(f"{e_w:.3g}"),
                "top1_agreement_bf16_compute_vs_f32_compute": round(top1_bf, 4),
                **stats(logits_bf),
            },
        }
        fu.log(f"{bname}: bf16-vs-f64 {e_bf:.2e}, f32compute-vs-f64 {e_up:.2e}, weights effect "
               f"{e_w:.2e}, top1 {top1_bf:.3f}")
    for n in entries:
        entries[n]["fixture_bytes"] = fu.dir_size(os.path.join(fu.FIXTURES_DIR, n))
    return entries


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", help="fixture names to (re)make; default all")
    args = ap.parse_args()
    fu.setup_torch()
    entries = {}
    for spec in SPECS:
        if args.only and spec["name"] not in args.only:
            continue
        entries.update(make_one(spec))
    fu.update_manifest(entries, GENERATOR)
    for n, e in entries.items():
        fu.log(f"  {e['model_dir']}: {e['fixture_bytes'] / 1024:.0f} KiB")


if __name__ == "__main__":
    main()

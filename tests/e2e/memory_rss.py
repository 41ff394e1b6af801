#!/usr/bin/env python3
"""Measured peak RSS of `lathe train` against the run's memory plan (tests/e2e/memory_test.sh).

One child process per setting: its peak RSS comes from this process's getrusage(RUSAGE_CHILDREN)
(ru_maxrss, the same figure the kernel keeps for the child), and the plan total from the run's
log line "memory: ... plan X (N B)". Each must agree within 10%. Models: the real stories260K
GGUF, and a SmolLM2-135M-shaped HF dir (its exact layer shapes, vocab and tied head; fewer
layers, bf16 weights from a seeded pattern) written here with the standard library only.
Usage: memory_rss.py LATHE SHARED TMPDIR [--table]
"""
import json, os, random, re, resource, struct, subprocess, sys

LATHE, SHARED, TMP = sys.argv[1], sys.argv[2], sys.argv[3]
TABLE = "--table" in sys.argv
TOL = 0.10


def write_smollm2_shaped(d, layers=2):
    os.makedirs(d, exist_ok=True)
    dim, heads, kv, ffn, vocab = 576, 9, 3, 1536, 49152
    hd = dim // heads
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": dim,
           "intermediate_size": ffn, "num_attention_heads": heads, "num_key_value_heads": kv,
           "num_hidden_layers": layers, "vocab_size": vocab, "max_position_embeddings": 8192,
           "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "tie_word_embeddings": True,
           "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu"}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    rng = random.Random(1234)
    pool = b"".join(struct.pack("<f", rng.gauss(0.0, 0.02))[2:] for _ in range(4099))  # bf16 = high half
    one = struct.pack("<f", 1.0)[2:]
    tensors = [("model.embed_tokens.weight", [vocab, dim]), ("model.norm.weight", [dim])]
    for l in range(layers):
        p = f"model.layers.{l}."
        tensors += [(p + "input_layernorm.weight", [dim]), (p + "post_attention_layernorm.weight", [dim]),
                    (p + "self_attn.q_proj.weight", [heads * hd, dim]), (p + "self_attn.k_proj.weight", [kv * hd, dim]),
                    (p + "self_attn.v_proj.weight", [kv * hd, dim]), (p + "self_attn.o_proj.weight", [dim, heads * hd]),
                    (p + "mlp.gate_proj.weight", [ffn, dim]), (p + "mlp.up_proj.weight", [ffn, dim]),
                    (p + "mlp.down_proj.weight", [dim, ffn])]
    header, blobs, off = {}, [], 0
    for name, shape in tensors:
        n = 1
        for s in shape:
            n *= s
        if name.endswith("norm.weight"):
            data = one * n
        else:
            reps = (2 * n) // len(pool) + 1
            data = (pool * reps)[: 2 * n]
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def yaml(path, model, out, **kv):
    base = {"model_name_or_path": model, "stage": "sft", "finetuning_type": "lora", "lora_rank": 8,
            "lora_target": "all", "dataset": "alpaca_en_demo", "dataset_dir": os.path.join(SHARED, "data/llamafactory"),
            "template": "alpaca", "cutoff_len": 128, "max_samples": 32, "output_dir": out,
            "overwrite_output_dir": "true", "logging_steps": 1, "save_steps": 1000, "per_device_train_batch_size": 4,
            "learning_rate": 1.0e-3, "max_steps": 4, "report_to": "none"}
    base.update(kv)
    with open(path, "w") as f:
        for k, v in base.items():
            f.write(f"{k}: {v}\n")


def run(name, cfg, extra):
    """Runs one setting in a fresh child (this script is itself started once per setting)."""
    cmd = [LATHE, "train", cfg, "-t", "2"] + extra
    p = subprocess.run(cmd, capture_output=True, text=True)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    if p.returncode != 0:
        print(f"FAIL: {name}: lathe train exited {p.returncode}:\n{p.stderr[-2000:]}")
        return None
    m = re.search(r"memory: peak RSS .* plan .* \((\d+) B\)", p.stderr)
    if not m:
        print(f"FAIL: {name}: no memory plan line in the log:\n{p.stderr[-2000:]}")
        return None
    plan = int(m.group(1))
    base = re.search(r"baseline\s+(\S+ \S+)", p.stderr)
    return peak, plan, base.group(1) if base else "?"


def settings():
    stories = os.path.join(SHARED, "models/stories260K/stories260K.gguf")
    smol = os.path.join(TMP, "smollm2-shaped")
    tok = os.path.join(SHARED, "models/llama2-tokenizer/tokenizer.model")
    s = [("stories260K lora r8 b4 s128", stories, {}, []),
         ("stories260K lora bf16 ckpt b8 s128", stories, {"bf16": "true", "gradient_checkpointing": "true",
                                                           "per_device_train_batch_size": 8}, []),
         ("stories260K full fp32 b4 s128", stories, {"finetuning_type": "full"}, []),
         ("stories260K full bf16 b16 s256", stories, {"finetuning_type": "full", "bf16": "true", "cutoff_len": 256,
                                                      "per_device_train_batch_size": 16}, []),
         ("smollm2-shaped(2L) lora r16 b2 s128", smol, {"lora_rank": 16, "per_device_train_batch_size": 2}, ["--tokenizer", tok]),
         ("smollm2-shaped(2L) lora bf16 ckpt b4 s256", smol, {"bf16": "true", "gradient_checkpointing": "true",
                                                            "cutoff_len": 256}, ["--tokenizer", tok]),
         ("smollm2-shaped(2L) full fp32 b2 s64", smol, {"finetuning_type": "full", "cutoff_len": 64,
                                                       "per_device_train_batch_size": 2, "max_steps": 2}, ["--tokenizer", tok]),
         # Accumulated micro-batches: gradients stay resident (zeroed in place), no activation overlap.
         ("smollm2-shaped(2L) full fp32 b2 s64 accum 2", smol, {"finetuning_type": "full", "cutoff_len": 64,
                                                               "per_device_train_batch_size": 2, "max_steps": 2,
                                                               "gradient_accumulation_steps": 2}, ["--tokenizer", tok]),
         ("smollm2-shaped(2L) full bf16 ckpt b4 s128", smol, {"finetuning_type": "full", "bf16": "true",
                                                             "gradient_checkpointing": "true", "max_steps": 2},
          ["--tokenizer", tok]),
         # QLoRA: the base packed on load (no head copy, the loss over the head as stored).
         ("stories260K qlora nf4 bf16 b4 s128", stories, {"bf16": "true", "quantization_bit": 4}, []),
         ("smollm2-shaped(2L) qlora nf4 bf16 b4 s128", smol, {"bf16": "true", "quantization_bit": 4, "max_steps": 2},
          ["--tokenizer", tok])]
    return s


def main():
    if len(sys.argv) > 4 and sys.argv[4].startswith("--one="):
        i = int(sys.argv[4][6:])
        name, model, kv, extra = settings()[i]
        cfg = os.path.join(TMP, f"s{i}.yaml")
        yaml(cfg, model, os.path.join(TMP, f"out{i}"), **kv)
        r = run(name, cfg, extra)
        print(json.dumps(r))
        return 0 if r else 1
    write_smollm2_shaped(os.path.join(TMP, "smollm2-shaped"))
    fails = 0
    rows = []
    for i, (name, *_rest) in enumerate(settings()):
        p = subprocess.run([sys.executable, __file__, LATHE, SHARED, TMP, f"--one={i}"], capture_output=True, text=True)
        if p.returncode != 0:
            print(p.stdout, p.stderr)
            fails += 1
            continue
        peak, plan, base = json.loads(p.stdout.strip().splitlines()[-1])
        ratio = peak / plan
        ok = abs(ratio - 1) <= TOL
        fails += not ok
        rows.append((name, peak, plan, base, ratio))
        print(f"{'ok  ' if ok else 'FAIL'} {name:45s} measured {peak / 2**20:8.1f} MiB  plan {plan / 2**20:8.1f} MiB"
              f"  (baseline {base})  measured/plan {ratio:.3f}")
    if TABLE:
        print("\n| setting | measured peak RSS | plan | measured/plan |\n|---|---|---|---|")
        for name, peak, plan, base, ratio in rows:
            print(f"| {name} | {peak / 2**20:.1f} MiB | {plan / 2**20:.1f} MiB | {ratio:.3f} |")
    print(f"{len(rows) - (fails - (len(settings()) - len(rows)))} ok, {fails} failed (tolerance {TOL:.0%})")
    return 1 if fails else 0


sys.exit(main())

# PyTorch + PEFT baseline for `lathe bench train`: the same rows (LoRA r16 all linear, full AdamW; fp32
# and bf16 autocast) on transformers' LlamaForCausalLM with SmolLM2-135M's config and random weights.
# Each row runs in its own subprocess so peak RSS (ru_maxrss) does not mix; prints one line per row and
# a "RESULT row threads tokens_per_s step_s rss_mb" line that bench/train.sh parses.
import argparse
import os
import resource
import subprocess
import sys
import time

ROWS = ["lora-f32", "lora-bf16", "full-f32", "full-bf16"]


def child(row, threads, seq, batch, steps):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                      rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True,
                      attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg)
    lora = row.startswith("lora")
    if lora:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=[
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.0)
    g = torch.Generator().manual_seed(12345)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g)
    bf16 = row.endswith("bf16")
    best = 1e30
    best_cpu = 1e30  # user + sys CPU seconds of this process per step (the box is shared)
    for i in range(steps + 1):  # first step is warmup
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        t = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        if i > 0:
            best = min(best, t)
            best_cpu = min(best_cpu, r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"RESULT {row} {threads} {batch * seq / best:.3f} {best:.4f} {rss_mb:.0f} torch={torch.__version__} "
          f"loss={out.loss.item():.4f} cpu_tps={batch * seq / best_cpu:.3f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads-list", default="1,2")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--child", default=None)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.threads, a.seq, a.batch, a.steps)
        return
    for row in a.rows.split(","):
        if row not in ROWS:
            sys.exit(f"train_torch.py: --rows: unknown row '{row}' (expected {', '.join(ROWS)})")
        for t in [int(x) for x in a.threads_list.split(",")]:
            cmd = [sys.executable, __file__, "--child", row, "--threads", str(t), "--seq", str(a.seq),
                   "--batch", str(a.batch), "--steps", str(a.steps)]
            r = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
            lines = [l for l in r.stdout.splitlines() if l.startswith("RESULT")]
            if r.returncode != 0 or not lines:
                sys.exit(f"train_torch.py: row {row} threads {t} failed:\n{r.stderr[-3000:]}")
            print(lines[-1], flush=True)


if __name__ == "__main__":
    main()

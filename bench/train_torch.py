# PyTorch + PEFT baseline for `lathe bench train`: the same rows (LoRA r16 all linear, full AdamW; fp32
# and bf16 autocast; the memory-saving rows with bitsandbytes: bf16 base, QLoRA NF4+DQ base
# (Linear4bit), LLM.int8 base (Linear8bitLt), AdamW8bit / PagedAdamW8bit) on transformers'
# LlamaForCausalLM with SmolLM2-135M's config and random weights. Each row runs in its own subprocess
# so peak RSS does not mix; prints one line per row and a "RESULT row threads tokens_per_s step_s
# rss_mb" line that bench/train.sh parses, or "NA row threads reason" for a row that cannot run here.
# Memory rows' peak RSS is the training peak (VmHWM reset after the model is built and quantized, as
# from_pretrained would quantize tensor by tensor); the whole-process ru_maxrss is printed beside it.
import argparse
import os
import resource
import subprocess
import sys
import time

ROWS = ["lora-f32", "lora-bf16", "full-f32", "full-bf16", "lora-bf16w", "qlora-nf4", "lora-int8", "lora-adamw8bit",
        "lora-paged8bit", "qlora-nf4-paged8bit"]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Memory rows: (base storage, optimizer); bf16 compute (autocast) like lathe's rows.
MEMORY_ROWS = {"lora-bf16w": ("bf16", "adamw"), "qlora-nf4": ("nf4", "adamw"), "lora-int8": ("int8", "adamw"),
               "lora-adamw8bit": ("bf16", "adamw8bit"), "lora-paged8bit": ("bf16", "paged_adamw8bit"),
               "qlora-nf4-paged8bit": ("nf4", "paged_adamw8bit")}


def quantize_linears(model, kind):
    """Replaces every decoder linear by a bitsandbytes Linear4bit (NF4, double quant, bf16 compute) or
    Linear8bitLt (LLM.int8, threshold 6.0), quantized on CPU; the bf16 source is dropped."""
    import torch
    import bitsandbytes as bnb
    for mod in list(model.modules()):
        for name, child in list(mod.named_children()):
            if name not in TARGETS or not isinstance(child, torch.nn.Linear):
                continue
            w = child.weight.data
            if kind == "nf4":
                q = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=False, compute_dtype=torch.bfloat16,
                                      quant_type="nf4", compress_statistics=True)
                q.weight = bnb.nn.Params4bit(w, requires_grad=False, quant_type="nf4",
                                             compress_statistics=True)._quantize("cpu")
                assert q.weight.dtype == torch.uint8 and q.weight.quant_state is not None
            else:
                q = bnb.nn.Linear8bitLt(child.in_features, child.out_features, bias=False, has_fp16_weights=False,
                                        threshold=6.0)
                q.weight = bnb.nn.Int8Params(w, requires_grad=False, has_fp16_weights=False)._quantize("cpu")
                assert q.weight.dtype == torch.int8
            setattr(mod, name, q)
            del w, child


def release_free_memory():
    """Hands freed heap pages back to the OS (tcmalloc when preloaded, else glibc), so the dropped
    bf16 sources of quantized weights do not stay in RSS as allocator cache."""
    import ctypes
    lib = ctypes.CDLL(None)
    for fn in ("MallocExtension_ReleaseFreeMemory", "malloc_trim"):
        if hasattr(lib, fn):
            getattr(lib, fn)(*([0] if fn == "malloc_trim" else []))


def vm_hwm_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def child(row, threads, seq, batch, steps):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    base, optim = MEMORY_ROWS.get(row, ("f32", "adamw"))
    if base != "f32":
        torch.set_default_dtype(torch.bfloat16)  # build the random model in bf16 (a bf16 checkpoint)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                      rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True,
                      attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    if base in ("nf4", "int8"):
        quantize_linears(model, base)
    lora = "lora" in row
    if lora:
        from peft import LoraConfig, get_peft_model
        # PEFT keeps the adapters in f32 on a bf16 base (autocast_adapter_dtype), as lathe does.
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    if optim == "adamw":
        opt = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.0)
    else:
        import warnings
        import bitsandbytes as bnb
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cls = bnb.optim.AdamW8bit if optim == "adamw8bit" else bnb.optim.PagedAdamW8bit
            opt = cls(params, lr=1e-5, weight_decay=0.0)
    import gc
    gc.collect()
    if base != "f32":
        release_free_memory()
        with open("/proc/self/clear_refs", "w") as f:  # training peak from here (VmHWM)
            f.write("5")
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
        if optim != "adamw":
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                out.loss.backward()
                opt.step()
                caught += w
        else:
            out.loss.backward()
            opt.step()
        t = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        if i > 0:
            best = min(best, t)
            best_cpu = min(best_cpu, r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    extra = ""
    if base != "f32":
        import bitsandbytes as bnb
        extra = f" bitsandbytes={bnb.__version__} process_maxrss_mb={rss_mb:.0f}"
        rss_mb = vm_hwm_mb()
        if optim == "paged_adamw8bit":
            paged = [str(w.message) for w in caught if "Paged" in str(w.message)]
            extra += " note=" + ("'" + paged[0].replace(" ", "_") + "'" if paged else "paged")
    print(f"RESULT {row} {threads} {batch * seq / best:.3f} {best:.4f} {rss_mb:.0f} torch={torch.__version__} "
          f"loss={out.loss.item():.4f} cpu_tps={batch * seq / best_cpu:.3f}{extra}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads-list", default="1,2")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--optim-resident-mb", type=int, default=0,
                    help="lathe's paged-state cap; ignored here (bitsandbytes does not page on CPU)")
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
            if (r.returncode != 0 or not lines) and row in MEMORY_ROWS:
                # bitsandbytes on this CPU may refuse a configuration: say so for that cell, go on.
                reason = (r.stderr.strip().splitlines() or ["no output"])[-1][:200]
                print(f"NA {row} {t} n/a: {reason}", flush=True)
                continue
            if r.returncode != 0 or not lines:
                sys.exit(f"train_torch.py: row {row} threads {t} failed:\n{r.stderr[-3000:]}")
            print(lines[-1], flush=True)


if __name__ == "__main__":
    main()

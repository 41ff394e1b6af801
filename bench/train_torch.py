# PyTorch + PEFT baseline for `lathe bench train`: the same rows (LoRA r16 all linear, full AdamW; fp32
# and bf16 autocast; the memory-saving rows with bitsandbytes: bf16 base, QLoRA NF4+DQ base
# (Linear4bit), LLM.int8 base (Linear8bitLt), AdamW8bit / PagedAdamW8bit) on transformers'
# LlamaForCausalLM with SmolLM2-135M's config and random weights. Each row runs in its own subprocess
# so peak RSS does not mix; prints one line per row and a "RESULT row threads tokens_per_s step_s
# rss_mb" line that bench/train.sh parses, or "NA row threads reason" for a row that cannot run here.
# --model compact: the same model written in plain PyTorch (manual causal attention, LoRA as two extra
# matmuls per target, as ../shared/PEERS.md's "best PyTorch" figures were taken), which runs on Debian's
# python3-torch 1.13 where transformers and PEFT do not; the four main rows only.
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


# SmolLM2-135M's shapes (random weights), for both models.
SMOLLM2 = dict(vocab=49152, dim=576, ffn=1536, layers=30, heads=9, kv_heads=3, theta=100000.0, eps=1e-5)


def hf_config():
    from transformers import LlamaConfig
    m = SMOLLM2
    return LlamaConfig(vocab_size=m["vocab"], hidden_size=m["dim"], intermediate_size=m["ffn"],
                       num_hidden_layers=m["layers"], num_attention_heads=m["heads"], num_key_value_heads=m["kv_heads"],
                       max_position_embeddings=8192, rms_norm_eps=m["eps"], rope_theta=m["theta"],
                       tie_word_embeddings=True, attn_implementation="sdpa")


def compact_llama(lora_rank, lora_alpha=32, vocab=SMOLLM2["vocab"], dim=SMOLLM2["dim"], ffn=SMOLLM2["ffn"],
                  layers=SMOLLM2["layers"], heads=SMOLLM2["heads"], kv_heads=SMOLLM2["kv_heads"],
                  theta=SMOLLM2["theta"], eps=SMOLLM2["eps"]):
    """SmolLM2-135M's architecture in plain PyTorch (1.13 and later): RMSNorm, half-split RoPE, grouped-query
    causal attention through an explicit T x T softmax (1.13 has no fused attention), SwiGLU MLP, tied head;
    with lora_rank > 0 every decoder linear frozen and two f32 factors per target (B zero, A Kaiming-uniform,
    as PEFT initializes them)."""
    import math
    import torch
    import torch.nn.functional as F

    class Lin(torch.nn.Module):
        def __init__(self, n_in, n_out):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(n_out, n_in) * 0.02)
            self.lora_a = self.lora_b = None
            if lora_rank > 0:
                self.weight.requires_grad_(False)
                self.lora_a = torch.nn.Parameter(torch.empty(lora_rank, n_in))
                torch.nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
                self.lora_b = torch.nn.Parameter(torch.zeros(n_out, lora_rank))

        def forward(self, x):
            y = F.linear(x, self.weight)
            if self.lora_a is not None:
                y = y + F.linear(F.linear(x, self.lora_a), self.lora_b) * (lora_alpha / lora_rank)
            return y

    class Norm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(dim))
            if lora_rank > 0:
                self.weight.requires_grad_(False)

        def forward(self, x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * self.weight

    hd = dim // heads

    def rope(x, cos, sin):
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = Norm(), Norm()
            self.q, self.k, self.v, self.o = Lin(dim, dim), Lin(dim, kv_heads * hd), Lin(dim, kv_heads * hd), Lin(dim, dim)
            self.gate, self.up, self.down = Lin(dim, ffn), Lin(dim, ffn), Lin(ffn, dim)

        def forward(self, x, cos, sin, mask):
            B, T, _ = x.shape
            h = self.n1(x)
            q = self.q(h).view(B, T, heads, hd).transpose(1, 2)
            k = self.k(h).view(B, T, kv_heads, hd).transpose(1, 2)
            v = self.v(h).view(B, T, kv_heads, hd).transpose(1, 2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            k = k.repeat_interleave(heads // kv_heads, dim=1)
            v = v.repeat_interleave(heads // kv_heads, dim=1)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd)) + mask
            att = torch.softmax(att.float(), dim=-1).to(q.dtype)
            x = x + self.o((att @ v).transpose(1, 2).reshape(B, T, dim))
            h = self.n2(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Parameter(torch.randn(vocab, dim) * 0.02)
            if lora_rank > 0:
                self.embed.requires_grad_(False)
            self.blocks = torch.nn.ModuleList(Block() for _ in range(layers))
            self.norm = Norm()

        def forward(self, ids):
            T = ids.shape[1]
            inv = 1.0 / (theta ** (torch.arange(0, hd, 2).float() / hd))
            f = torch.outer(torch.arange(T).float(), inv)
            cos, sin = torch.cat((f, f), -1).cos(), torch.cat((f, f), -1).sin()
            mask = torch.full((T, T), float("-inf")).triu(1)
            x = F.embedding(ids, self.embed)
            for b in self.blocks:
                x = b(x, cos, sin, mask)
            logits = F.linear(self.norm(x), self.embed)  # tied head
            return F.cross_entropy(logits[:, :-1].reshape(-1, vocab).float(), ids[:, 1:].reshape(-1))

    return Model()


def check_compact():
    """--check-compact (needs transformers): the compact model, given LlamaForCausalLM's random weights, gives its
    loss (2 x 48 random tokens) to 1e-4; exits 1 otherwise."""
    import torch
    from transformers import LlamaForCausalLM
    torch.manual_seed(0)
    hf = LlamaForCausalLM(hf_config()).eval()
    c = compact_llama(lora_rank=0).eval()
    sd = hf.state_dict()
    names = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
             "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}
    with torch.no_grad():
        c.embed.copy_(sd["model.embed_tokens.weight"])
        c.norm.weight.copy_(sd["model.norm.weight"])
        for i, b in enumerate(c.blocks):
            p = f"model.layers.{i}."
            b.n1.weight.copy_(sd[p + "input_layernorm.weight"])
            b.n2.weight.copy_(sd[p + "post_attention_layernorm.weight"])
            for n, k in names.items():
                getattr(b, n).weight.copy_(sd[p + k + ".weight"])
        ids = torch.randint(0, SMOLLM2["vocab"], (2, 48), generator=torch.Generator().manual_seed(1))
        a, b = hf(input_ids=ids, labels=ids).loss.item(), c(ids).item()
    print(f"check-compact: LlamaForCausalLM loss {a:.6f}, compact {b:.6f}, |diff| {abs(a - b):.2e}")
    sys.exit(0 if abs(a - b) <= 1e-4 else 1)


def child(row, threads, seq, batch, steps, compact=False):
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    base, optim = MEMORY_ROWS.get(row, ("f32", "adamw"))
    lora = "lora" in row
    if compact:
        if row in MEMORY_ROWS:
            print(f"NA {row} {threads} n/a: --model compact runs the four main rows only", flush=True)
            return
        model = compact_llama(lora_rank=16 if lora else 0)
        run_rows(model, row, threads, seq, batch, steps, base, optim, SMOLLM2["vocab"], model, [])
        return
    from transformers import LlamaForCausalLM
    if base != "f32":
        torch.set_default_dtype(torch.bfloat16)  # build the random model in bf16 (a bf16 checkpoint)
    cfg = hf_config()
    model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    if base in ("nf4", "int8"):
        quantize_linears(model, base)
    if lora:
        from peft import LoraConfig, get_peft_model
        # PEFT keeps the adapters in f32 on a bf16 base (autocast_adapter_dtype), as lathe does.
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS))
    caught = []
    run_rows(model, row, threads, seq, batch, steps, base, optim, cfg.vocab_size,
             lambda ids: model(input_ids=ids, labels=ids).loss, caught)


def run_rows(model, row, threads, seq, batch, steps, base, optim, vocab, loss_of, caught):
    """Times steps + 1 training steps of model (the first a warmup) and prints the row's RESULT line."""
    import torch
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    if optim == "adamw":
        opt = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.0)
    else:
        import warnings
        import bitsandbytes as bnb
        with warnings.catch_warnings(record=True) as made:
            warnings.simplefilter("always")
            cls = bnb.optim.AdamW8bit if optim == "adamw8bit" else bnb.optim.PagedAdamW8bit
            opt = cls(params, lr=1e-5, weight_decay=0.0)
        caught += made
    import gc
    gc.collect()
    if base != "f32":
        release_free_memory()
        with open("/proc/self/clear_refs", "w") as f:  # training peak from here (VmHWM)
            f.write("5")
    g = torch.Generator().manual_seed(12345)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    bf16 = row.endswith("bf16")
    best = 1e30
    best_cpu = 1e30  # user + sys CPU seconds of this process per step (the box is shared)
    for i in range(steps + 1):  # first step is warmup
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_of(ids)
        if optim != "adamw":
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                loss.backward()
                opt.step()
                caught += w
        else:
            loss.backward()
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
          f"loss={loss.item():.4f} cpu_tps={batch * seq / best_cpu:.3f}{extra}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads-list", default="1,2")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--optim-resident-mb", type=int, default=0,
                    help="lathe's paged-state cap; ignored here (bitsandbytes does not page on CPU)")
    ap.add_argument("--model", choices=["hf", "compact"], default="hf",
                    help="hf: transformers' LlamaForCausalLM + PEFT; compact: the same model in plain PyTorch (1.13+)")
    ap.add_argument("--check-compact", action="store_true",
                    help="compare --model compact's loss with LlamaForCausalLM's on the same weights, then exit")
    ap.add_argument("--child", default=None)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    if a.check_compact:
        check_compact()
    if a.child:
        child(a.child, a.threads, a.seq, a.batch, a.steps, a.model == "compact")
        return
    for row in a.rows.split(","):
        if row not in ROWS:
            sys.exit(f"train_torch.py: --rows: unknown row '{row}' (expected {', '.join(ROWS)})")
        for t in [int(x) for x in a.threads_list.split(",")]:
            cmd = [sys.executable, __file__, "--child", row, "--threads", str(t), "--seq", str(a.seq),
                   "--batch", str(a.batch), "--steps", str(a.steps), "--model", a.model]
            r = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
            lines = [l for l in r.stdout.splitlines() if l.startswith("RESULT")]
            na = [l for l in r.stdout.splitlines() if l.startswith("NA")]
            if r.returncode == 0 and na and not lines:
                print(na[-1], flush=True)
                continue
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

#!/usr/bin/env python3
"""`lathe merge` read by the tools people load merged models with: transformers and llama.cpp.

For each case, `lathe merge` folds a PEFT adapter into a base; then
  * transformers loads the merged model (an HF folder with from_pretrained, a GGUF with gguf_file=, which
    dequantizes it and un-permutes GGUF's Q/K rows) and its logits must equal PEFT's: PeftModel over the same
    base (loaded the same way) with the adapter, on seeded input ids;
  * with --llamacpp-bin, llama.cpp's llama-server loads each merged GGUF and its greedy continuation of a
    prompt must equal `lathe generate --adapter` on the unmerged base (token ids).
Cases: the committed random llama fixture with the committed PEFT adapters (plain and rsLoRA), f32 and bf16
outputs; SmolLM2-135M-Instruct's Q4_1 GGUF (Meta's interleaved Q/K rows) with a seeded PEFT adapter, the default
(f16) and q8_0 outputs; for llama.cpp, stories260K's GGUF with an adapter `lathe train` makes in a temp dir
(examples/stories260k_lora_alpaca.yaml, 20 steps).

Run:  $LATHE_REF_VENV/bin/python tools/ref/check_merge_interop.py --lathe build/lathe \
          [--llamacpp-bin ~/.cache/lathe/llamacpp-0.3.36/build/bin]
Writes nothing in the repo; exits non-zero on the first mismatch.
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

import fixture_util as fu

os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF loading progress bars

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.environ.get("LATHE_SHARED", os.path.join(os.path.dirname(REPO), "shared"))
STORIES = os.path.join(SHARED, "models", "stories260K", "stories260K.gguf")


def load(path, dtype=torch.float32):
    if path.endswith(".gguf"):
        return AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                    dtype=dtype).eval()
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits[0].float()


def merge(lathe, base, adapter, out, dtype=None):
    cmd = [lathe, "merge", "-m", base, "--adapter", adapter, "-o", out] + (["--dtype", dtype] if dtype else [])
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def check_transformers(lathe, base, adapter, tmp, dtype, tol):
    """tol: for f32 outputs the bound on |merged - PEFT| (f32 both). Lossy outputs are compared with PEFT's f32 logits
    and may be off by at most twice what the rounding alone costs: an HF bf16 output twice PEFT's own bf16 run's
    error, a GGUF type (tol None) twice the error of the base alone converted to that type."""
    out = os.path.join(tmp, "merged" + (".gguf" if base.endswith(".gguf") else ""))
    merge(lathe, base, adapter, out, dtype)
    vocab = load(base).config.vocab_size
    ids = torch.randint(3, vocab, (1, 24), generator=torch.Generator().manual_seed(11))
    want = logits(PeftModel.from_pretrained(load(base), adapter).eval(), ids)
    bf16 = dtype == "bf16"
    got = logits(load(out, torch.bfloat16 if bf16 else torch.float32), ids)
    err = (got - want).abs().max().item()
    if bf16:
        peft16 = logits(PeftModel.from_pretrained(load(base, torch.bfloat16), adapter).eval(), ids)
        tol = 2 * (peft16 - want).abs().max().item()
    elif tol is None:
        # A lossy GGUF type: at most twice what converting the base alone to it moves the logits.
        conv = os.path.join(tmp, "base_converted.gguf")
        subprocess.run([lathe, "convert", base, "--dtype", dtype or "f16", "-o", conv], check=True,
                       stdout=subprocess.DEVNULL)
        tol = 2 * (logits(load(conv), ids) - logits(load(base), ids)).abs().max().item()
    print(f"  transformers: {os.path.basename(base)} + {os.path.relpath(adapter, REPO)} -> --dtype {dtype or '(default)'}:"
          f" max |logits - PEFT's f32| = {err:.3g} (largest logit {want.abs().max().item():.3g}, bound {tol:.3g})")
    assert err <= tol, "merged logits differ from PEFT's"
    return out


def peft_adapter_for(base, out):
    torch.manual_seed(3)
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                         "up_proj", "down_proj"], task_type="CAUSAL_LM")
    pm = get_peft_model(load(base), cfg)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_A" in n or "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    pm.save_pretrained(out)
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llamacpp_greedy(bin_dir, gguf, prompt_ids, n):
    port = free_port()
    srv = subprocess.Popen([os.path.join(bin_dir, "llama-server"), "-m", gguf, "--port", str(port), "-t", "1",
                            "-c", "256", "--no-warmup"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except Exception:
                time.sleep(0.1)
        body = json.dumps({"prompt": prompt_ids, "n_predict": n, "temperature": 0, "top_k": 1,
                           "return_tokens": True, "cache_prompt": False}).encode()
        req = urllib.request.Request(url + "/completion", body, {"Content-Type": "application/json"})
        return json.loads(urllib.request.urlopen(req, timeout=60).read())["tokens"]
    finally:
        srv.send_signal(signal.SIGTERM)
        srv.wait()


def check_llamacpp(lathe, bin_dir, base, adapter, merged, label):
    res = subprocess.run([lathe, "generate", "-m", base, "--adapter", adapter, "-p", "Once upon a time", "-n", "24",
                          "--temp", "0", "--ignore-eos", "--json"], check=True, capture_output=True, text=True)
    ref = json.loads(res.stdout)
    got = llamacpp_greedy(bin_dir, merged, ref["prompt_ids"], 24)
    print(f"  llama.cpp: {label}: greedy ids {'equal' if got == ref['ids'] else 'DIFFER'} to lathe's with the adapter")
    assert got == ref["ids"], (got, ref["ids"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lathe", required=True)
    ap.add_argument("--llamacpp-bin", default=None)
    ap.add_argument("--smollm2", default=os.path.expanduser("~/.cache/lathe/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
                    help="scripts/fetch-models.sh's SmolLM2-135M-Instruct Q4_1 GGUF")
    a = ap.parse_args()
    fu.setup_torch()
    lathe = os.path.abspath(a.lathe)
    fx = fu.FIXTURES_DIR
    base = os.path.join(fx, "llama_gqa_tied", "model")
    with tempfile.TemporaryDirectory() as tmp:
        for name in ["lora_llama_gqa_tied", "rslora_llama_gqa_tied"]:
            for dtype, tol in [(None, 2e-5), ("bf16", None)]:
                d = tempfile.mkdtemp(dir=tmp)
                check_transformers(lathe, base, os.path.join(fx, name, "adapter"), d, dtype, tol)
        # A GGUF base transformers reads: SmolLM2-135M-Instruct Q4_1, with a seeded PEFT adapter made here (r 4, all
        # seven modules, B not zero) over transformers' own load of it (HF Q/K rows; lathe permutes B to GGUF's).
        sm = peft_adapter_for(a.smollm2, os.path.join(tmp, "smollm2_adapter"))
        # f32: the merge itself (30 layers, logits up to ~32); the default f16 and q8_0 add their rounding.
        for dtype, tol in [("f32", 2e-3), (None, None), ("q8_0", None)]:
            check_transformers(lathe, a.smollm2, sm, tempfile.mkdtemp(dir=tmp), dtype, tol)
        if a.llamacpp_bin:
            # stories260K's GGUF (transformers cannot read its vocabulary) with an adapter `lathe train` makes.
            adapter = os.path.join(tmp, "stories_adapter")
            subprocess.run([lathe, "train", os.path.join(REPO, "examples", "stories260k_lora_alpaca.yaml"),
                            "--model_name_or_path", STORIES, "--dataset_dir",
                            os.path.join(SHARED, "data", "llamafactory"), "--output_dir", adapter, "--max_steps", "20",
                            "--report_to", "none"], check=True, stdout=subprocess.DEVNULL, cwd=REPO)
            merged = os.path.join(tmp, "stories_merged.gguf")
            merge(lathe, STORIES, adapter, merged)
            check_llamacpp(lathe, a.llamacpp_bin, STORIES, adapter, merged, "stories260K + a trained adapter, f32")
    print("ok")


if __name__ == "__main__":
    main()

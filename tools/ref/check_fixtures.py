#!/usr/bin/env python3
"""Checks the committed fixtures without regenerating them: fast, writes nothing.

For every MANIFEST.json entry: the expected.safetensors exists and holds exactly the tensors the
manifest lists, with the listed dtype and shape. For fixtures with a committed model dir: the
model loads with transformers and reproduces `logits` bit-exactly (same versions as the manifest)
or within the f32 tolerance (other versions).

Run: $LATHE_REF_VENV/bin/python tools/ref/check_fixtures.py
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import fixture_util as fu


def main():
    fu.setup_torch()
    with open(fu.MANIFEST_PATH) as f:
        manifest = json.load(f)
    vers = fu.versions()
    bad = 0
    for name, e in manifest["fixtures"].items():
        exp = load_file(os.path.join(fu.REPO_ROOT, e["expected"]))
        listed = {k: (v["dtype"], v["shape"]) for k, v in e["tensors"].items()}
        got = {k: (str(t.dtype).replace("torch.", ""), list(t.shape)) for k, t in exp.items()}
        msg = "tensors match manifest" if listed == got else f"MISMATCH {listed} vs {got}"
        bad += listed != got
        if "model_dir" in e:
            m = AutoModelForCausalLM.from_pretrained(os.path.join(fu.REPO_ROOT, e["model_dir"]),
                                                     attn_implementation="eager").eval()
            with torch.no_grad():
                logits = m(input_ids=exp["input_ids"][None]).logits[0].float()
            err = (logits - exp["logits"]).abs().max().item()
            same_versions = all(vers.get(k) == v for k, v in e["versions"].items())
            limit = 0.0 if same_versions else (
                e["tolerances"].get("float32", {}).get("logits_atol")
                or e["tolerances"]["bf16_compute"]["logits_atol"])
            ok = err <= limit
            bad += not ok
            msg += f"; logits max-abs {err:.2e} (limit {limit:g}) {'ok' if ok else 'FAIL'}"
        print(f"{name}: {msg}")
    print("FAILED" if bad else "all fixtures OK")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

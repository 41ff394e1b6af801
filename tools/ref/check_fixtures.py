#!/usr/bin/env python3
"""Checks the committed fixtures without regenerating them: fast, writes nothing.

For every MANIFEST.json entry: the expected.safetensors exists and holds exactly the tensors the
manifest lists, with the listed dtype and shape (entries that list no tensors, like the training and
optimizer fixtures, name one or more files in "expected", `<name>` standing for a sub-folder: each
must exist and load, with at least one tensor, none of them holding NaN). For fixtures with a committed model dir: the
model loads with transformers and reproduces `logits` bit-exactly (same versions as the manifest)
or within the f32 tolerance (other versions).

Run: $LATHE_REF_VENV/bin/python tools/ref/check_fixtures.py
"""
import glob
import json
import os
import re
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import fixture_util as fu


def check_listed_files(name, expected):
    """The files an entry without a tensor list names; returns 1 when one is missing or bad."""
    patterns = re.findall(r"tests/golden/fixtures/\S+?\.safetensors", expected)
    files = sorted(f for p in patterns
                   for f in glob.glob(os.path.join(fu.REPO_ROOT, p.replace("<name>", "*"))))
    problems = [] if files else [f"no file matches {patterns or expected!r}"]
    n_tensors = 0
    for f in files:
        t = load_file(f)
        n_tensors += len(t)
        if not t:
            problems.append(f"{os.path.relpath(f, fu.REPO_ROOT)} holds no tensor")
        problems += [f"{os.path.relpath(f, fu.REPO_ROOT)}: {k} has NaN" for k, v in t.items()
                     if v.is_floating_point() and torch.isnan(v).any()]
    msg = "; ".join(problems) if problems else f"{len(files)} file(s), {n_tensors} tensors load"
    print(f"{name}: {msg}")
    return 1 if problems else 0


def main():
    fu.setup_torch()
    with open(fu.MANIFEST_PATH) as f:
        manifest = json.load(f)
    vers = fu.versions()
    bad = 0
    for name, e in manifest["fixtures"].items():
        if "tensors" not in e:
            bad += check_listed_files(name, e["expected"])
            continue
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

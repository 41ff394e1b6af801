#!/usr/bin/env python3
"""PEFT / transformers interop of what lathe's TrainModel writes (tests/golden/train_save_test.cc).

Step 1 (C++): the PeftInterop test, run with LATHE_TRAIN_INTEROP_OUT=DIR, writes for each base
(qwen2_bias and qwen3 = committed random HF models, stories260k = the llama2.c .bin, Meta interleaved
q/k) DIR/<name>/adapter (TrainModel::SavePeftAdapter of a deterministic LoRA: r=4, alpha=8, all 7
modules, A from seed 7, B from a fixed formula) and DIR/<name>/hf (TrainModel::SaveHfModel of the
untouched full model, f32).
Step 2 (this script), for each base:
  * PeftModel.from_pretrained(base, DIR/<name>/adapter) must load every tensor of the file (checked
    tensor by tensor against the file: a key PEFT did not recognise would leave its init value);
    PEFT's own save_pretrained of the loaded model must produce a byte-identical
    adapter_model.safetensors; the adapter must change the logits.
  * AutoModelForCausalLM.from_pretrained(DIR/<name>/hf) must load with no missing/unexpected keys and
    give the base model's logits (for stories260k: the transformers model built from the .bin with
    q/k permuted to HF layout, i.e. lathe's saved q/k rows are in HF order).
  * writes tests/golden/fixtures/train_interop/<name>/adapter/ (a copy of lathe's adapter) and
    expected.safetensors: input_ids (T=20, seeded), base_logits and peft_logits (f32).
The C++ test then re-creates the adapter, checks its bytes equal the committed copy, and checks
lathe's inference logits with it against peft_logits.

Run:  LATHE_TRAIN_INTEROP_OUT=/tmp/interop ./build/lathe_golden_tests --gtest_filter='*PeftInterop*'
      $LATHE_REF_VENV/bin/python tools/ref/check_peft_interop.py --from /tmp/interop
"""
import argparse
import copy
import filecmp
import os
import shutil
import tempfile

import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import fixture_util as fu
from make_train_fixture import load_base

GENERATOR = "tools/ref/check_peft_interop.py"
NAMES = ["qwen2_bias", "stories260k", "qwen3", "llama_attn_bias"]
T = 20


def check(name, src):
    base = load_base(name).float().eval()
    vocab = base.config.vocab_size
    g = torch.Generator().manual_seed(99)
    ids = torch.randint(3, vocab, (1, T), generator=g)
    with torch.no_grad():
        base_logits = base(input_ids=ids).logits[0].float()

    adir = os.path.join(src, name, "adapter")
    pm = PeftModel.from_pretrained(copy.deepcopy(base), adir).eval()
    file = load_file(os.path.join(adir, "adapter_model.safetensors"))
    params = {n.replace(".default", ""): p for n, p in pm.named_parameters() if "lora_" in n}
    assert set(params) == set(file), (set(params) ^ set(file))
    for k, v in file.items():
        assert torch.equal(params[k].detach(), v), f"{k}: PEFT did not load lathe's value"
    with torch.no_grad():
        peft_logits = pm(input_ids=ids).logits[0].float()
    effect = (peft_logits - base_logits).abs().max().item()
    assert effect > 1e-2, f"adapter has no effect ({effect})"
    with tempfile.TemporaryDirectory() as tmp:
        pm.save_pretrained(tmp)
        same_bytes = filecmp.cmp(os.path.join(tmp, "adapter_model.safetensors"),
                                 os.path.join(adir, "adapter_model.safetensors"), shallow=False)
    assert same_bytes, "PEFT's re-save differs from lathe's adapter_model.safetensors"

    hf, info = AutoModelForCausalLM.from_pretrained(os.path.join(src, name, "hf"), dtype=torch.float32,
                                                    attn_implementation="eager", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    with torch.no_grad():
        hf_logits = hf.eval()(input_ids=ids).logits[0].float()
    hf_err = (hf_logits - base_logits).abs().max().item()
    assert hf_err < 1e-5, f"transformers' load of lathe's HF dir differs by {hf_err}"

    d = os.path.join(fu.FIXTURES_DIR, "train_interop", name)
    shutil.rmtree(os.path.join(d, "adapter"), ignore_errors=True)
    shutil.copytree(adir, os.path.join(d, "adapter"))
    fu.save_expected(d, {"input_ids": ids[0], "base_logits": base_logits, "peft_logits": peft_logits})
    fu.log(f"{name}: PEFT loaded all {len(file)} tensors, re-save byte-identical, adapter effect {effect:.3g}; "
           f"transformers load of lathe's HF dir: max |logit diff| {hf_err:.3g}")
    return {"adapter_effect_max_abs_logit": float(f"{effect:.3g}"),
            "peft_resave_byte_identical": bool(same_bytes),
            "hf_dir_transformers_max_abs_logit_diff": float(f"{hf_err:.3g}"),
            "n_tensors": len(file)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--from", dest="src", required=True, help="LATHE_TRAIN_INTEROP_OUT of the C++ run")
    args = ap.parse_args()
    fu.setup_torch()
    measured = {name: check(name, args.src) for name in NAMES}
    fu.update_manifest({"train_interop": {
        "what": "adapters written by lathe's TrainModel::SavePeftAdapter (deterministic: A seed 7, B fixed formula; "
                "qwen2_bias, qwen3 and stories260K with Meta-interleaved q/k) loaded by PEFT: every tensor loaded, PEFT's "
                "re-save byte-identical; PEFT's logits on 20 seeded ids. Also lathe's SaveHfModel dirs loaded by "
                "transformers (no missing/unexpected keys, base logits).",
        "expected": "tests/golden/fixtures/train_interop/<name>/expected.safetensors (+ adapter/)",
        "flow": "LATHE_TRAIN_INTEROP_OUT=DIR lathe_golden_tests --gtest_filter='*PeftInterop*'; then "
                "check_peft_interop.py --from DIR",
        "measured": measured,
        "tolerances": {"logits_atol": 1e-4, "why": "f32 forward in both; same tolerance as the lora fixtures"},
    }}, GENERATOR)


if __name__ == "__main__":
    main()

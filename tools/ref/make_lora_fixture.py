"""A PEFT LoRA adapter and the logits PEFT computes with it, for tests/golden/lora_test.cc.

Loads the random llama fixture (tests/golden/fixtures/llama_gqa_tied/model), wraps it with
peft.LoraConfig(r=4, lora_alpha=8, all seven linear modules), gives lora_B seeded non-zero values
(PEFT initializes B to zero, which would make the adapter a no-op), saves the adapter with
save_pretrained (adapter_config.json + adapter_model.safetensors, exactly PEFT's layout) and the
logits of the fixture's input_ids with the adapter active; the same for an rsLoRA adapter. Then
PEFT's merge_and_unload() folds the adapter into the base: its merged linear weights go to
merged.safetensors (for `lathe merge`, tests/golden/merge_test.cc), with the merged model's logits.

Run: tools/ref/setup.sh, then  $VENV/bin/python tools/ref/make_lora_fixture.py
"""
import json
import os

import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

import fixture_util as fu

SEED = 77
BASE = os.path.join(fu.FIXTURES_DIR, "llama_gqa_tied")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make(name, rslora):
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_pretrained(os.path.join(BASE, "model"), torch_dtype=torch.float32)
    model.eval()
    cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS, use_rslora=rslora,
                     task_type="CAUSAL_LM")
    pm = get_peft_model(model, cfg)
    g = torch.Generator().manual_seed(SEED + (1 if rslora else 0))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n or "lora_A" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    ids = load_file(os.path.join(BASE, "expected.safetensors"))["input_ids"]
    with torch.no_grad():
        logits = pm(ids[None, :]).logits[0].float()
    d = os.path.join(fu.FIXTURES_DIR, name)
    adir = os.path.join(d, "adapter")
    pm.save_pretrained(adir)
    # Keep the committed fixture free of this machine's paths and of PEFT's generated model card.
    cfg_path = os.path.join(adir, "adapter_config.json")
    with open(cfg_path) as f:
        cfg_json = json.load(f)
    cfg_json["base_model_name_or_path"] = "tests/golden/fixtures/llama_gqa_tied/model"
    with open(cfg_path, "w") as f:
        json.dump(cfg_json, f, indent=2, sort_keys=True)
        f.write("\n")
    os.remove(os.path.join(adir, "README.md"))
    fu.save_expected(d, {"input_ids": ids, "logits": logits})
    # PEFT's own merge: W + scale * B @ A in place of each adapted linear (merge_and_unload), saved with
    # the HF names the base uses; its logits must equal the adapter's (a cross-check, not saved).
    merged = pm.merge_and_unload()
    with torch.no_grad():
        merged_logits = merged(ids[None, :]).logits[0].float()
    err = (merged_logits - logits).abs().max().item()
    assert err < 1e-4, f"PEFT's merged model gives other logits than its adapter ({err})"
    sd = {k: v.detach().contiguous() for k, v in merged.state_dict().items()
          if any(f".{t}.weight" in k for t in TARGETS)}
    assert len(sd) == 7 * model.config.num_hidden_layers, sorted(sd)
    save_file({k: sd[k] for k in sorted(sd)}, os.path.join(d, "merged.safetensors"), metadata={"format": "pt"})
    return {
        "what": f"PEFT LoRA r=4 alpha=8 on all 7 linear modules{' with rsLoRA (alpha/sqrt(r))' if rslora else ''} "
                "over tests/golden/fixtures/llama_gqa_tied/model; A and B seeded N(0, 0.05^2); logits of that "
                "fixture's input_ids with the adapter active",
        "base_model_dir": "tests/golden/fixtures/llama_gqa_tied/model",
        "adapter_dir": f"tests/golden/fixtures/{name}/adapter",
        "expected": f"tests/golden/fixtures/{name}/expected.safetensors",
        "merged": f"tests/golden/fixtures/{name}/merged.safetensors: PEFT merge_and_unload()'s linear weights "
                  "(HF names and layout, f32); the merged model's logits equal the adapter's within 1e-4",
        "seed": SEED,
        "tolerances": {"logits_atol": 1e-4, "why": "f32 throughout, as the base fixtures (f32 vs f64 ~2e-6)"},
    }


def main():
    fu.setup_torch()
    fu.update_manifest({"lora_llama_gqa_tied": make("lora_llama_gqa_tied", False),
                        "rslora_llama_gqa_tied": make("rslora_llama_gqa_tied", True)},
                       "tools/ref/make_lora_fixture.py")


if __name__ == "__main__":
    main()

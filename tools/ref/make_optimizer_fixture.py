"""Reference optimizer steps for tests/golden/optimizer_test.cc.

Makes tests/golden/fixtures/optimizer/expected.safetensors: three parameter tensors and 10 steps
of seeded random gradients, then what torch.optim.AdamW (decoupled weight decay on two of the
three tensors, as HF excludes biases) does to them under transformers' cosine schedule with
warmup and torch.nn.utils.clip_grad_norm_(1.0) before each step; the same for torch.optim.SGD
with weight decay; and the linear / constant_with_warmup / cosine learning rates per step.

Run: tools/ref/setup.sh, then  $VENV/bin/python tools/ref/make_optimizer_fixture.py
"""
import os

import torch
from transformers import get_scheduler

import fixture_util as fu

SEED = 2024
STEPS = 10
BASE_LR = 1e-2
WARMUP = 3


def main():
    fu.setup_torch()
    g = torch.Generator().manual_seed(SEED)
    shapes = [(4, 5), (7,), (3, 3)]
    decay = [True, False, True]
    p0 = [torch.randn(s, generator=g) for s in shapes]
    # Gradients of varying size so clipping is active on some steps and not on others.
    grads = [[torch.randn(s, generator=g) * (0.2 if step % 2 else 1.5) for s in shapes] for step in range(STEPS)]
    out = {}
    for i, p in enumerate(p0):
        out[f"p0_{i}"] = p.clone()
    for s in range(STEPS):
        for i in range(3):
            out[f"grad_{s}_{i}"] = grads[s][i].clone()

    params = [torch.nn.Parameter(p.clone()) for p in p0]
    opt = torch.optim.AdamW([{"params": [params[0], params[2]], "weight_decay": 0.1},
                             {"params": [params[1]], "weight_decay": 0.0}], lr=BASE_LR)
    sched = get_scheduler("cosine", opt, num_warmup_steps=WARMUP, num_training_steps=STEPS)
    lrs, norms = [], []
    for s in range(STEPS):
        for i, p in enumerate(params):
            p.grad = grads[s][i].clone()
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, 1.0)))
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
        for i, p in enumerate(params):
            out[f"adamw_{s}_{i}"] = p.detach().clone()
    out["adamw_lr"] = torch.tensor(lrs, dtype=torch.float64)
    out["adamw_grad_norm"] = torch.tensor(norms, dtype=torch.float64)

    params = [torch.nn.Parameter(p.clone()) for p in p0]
    opt = torch.optim.SGD([{"params": [params[0], params[2]], "weight_decay": 0.05},
                           {"params": [params[1]], "weight_decay": 0.0}], lr=0.1)
    for s in range(STEPS):
        for i, p in enumerate(params):
            p.grad = grads[s][i].clone()
        opt.step()
    for i, p in enumerate(params):
        out[f"sgd_final_{i}"] = p.detach().clone()

    for name in ["linear", "cosine", "constant_with_warmup", "constant"]:
        o = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=BASE_LR)
        sch = get_scheduler(name, o, num_warmup_steps=WARMUP if name != "constant" else None,
                            num_training_steps=12)
        vals = []
        for _ in range(12):
            vals.append(o.param_groups[0]["lr"])
            o.step()
            sch.step()
        out[f"lr_{name}"] = torch.tensor(vals, dtype=torch.float64)

    fu.save_expected(os.path.join(fu.FIXTURES_DIR, "optimizer"), out)
    fu.update_manifest({"optimizer": {
        "what": "AdamW (wd 0.1 on tensors 0 and 2, none on 1) with cosine schedule (base 1e-2, warmup 3 of 10) and "
                "clip_grad_norm_(1.0) before each step; SGD (lr 0.1, wd 0.05 on 0 and 2); lr of each "
                "transformers schedule for 12 steps (warmup 3)",
        "expected": "tests/golden/fixtures/optimizer/expected.safetensors",
        "seed": SEED,
        "tolerances": {"params_rel": 1e-6, "lr_abs": 1e-12,
                       "why": "the same f32 operations in the same order as torch's single-tensor AdamW; only "
                              "libm sqrt/pow rounding can differ"},
    }}, "tools/ref/make_optimizer_fixture.py")


if __name__ == "__main__":
    main()

"""Reference quantized weights and 8-bit optimizer steps made with bitsandbytes' CPU path, for
tests/golden/quant_test.cc.

Makes tests/golden/fixtures/quant/expected.safetensors:
  - w (72 x 256 f32, odd statistics: rows scaled by 1e-3..30, a zero 64-block, a few +-50
    outliers) and w_bf16 (a bf16 copy) quantized with bnb.functional.quantize_4bit (blocksize 64,
    nf4/fp4, compress_statistics False/True) and dequantized with dequantize_4bit;
  - int8: bnb.functional.int8_vectorwise_quant(w) (what Int8Params stores: CB, SCB) and the
    LLM.int8 product of x (4 x 256, two outlier columns) with it through
    torch.ops.bitsandbytes.int8_mixed_scaled_mm-equivalent steps (bnb's own ops);
  - adamw8bit: bnb.optim.AdamW8bit (blockwise, CPU kernel) for 8 steps on two tensors
    (4608 and 4100 elements, over min_8bit_size 4096) with rolled seeded gradients; params after
    the first and last step and the final quantized states; and bnb.optim.PagedAdamW (32-bit
    state, unpaged on CPU) on the same steps.

Run: $PY tools/ref/make_quant_fixture.py   (needs bitsandbytes, pinned in requirements.txt)
"""
import os

import bitsandbytes
import bitsandbytes.functional as F
import torch

import fixture_util as fu

SEED = 4040
OPT_STEPS = 8
ROWS = 72  # 288 blocks of 64: two double-quant blocks of 256, the second partial


def make_weight(g):
    w = torch.randn(ROWS, 256, generator=g)
    scales = torch.logspace(-3, 1.5, ROWS)[torch.randperm(ROWS, generator=g)]
    w = w * scales.view(-1, 1)
    w[5, 64:128] = 0.0  # an all-zero block (absmax 0)
    w[9, 3] = 50.0
    w[67, 200] = -50.0
    w[40, 0:64] = 1e-30  # tiny values
    return w


def describe_name(k):
    """What each fixture tensor is (MANIFEST `tensors`)."""
    if k == "w":
        return "the source weight (72, 256) f32"
    if k == "w_bf16":
        return "w cast to bf16 (a second source dtype)"
    for suffix, what in [("_codes", "quantize_4bit packed codes, flattened (2 per byte, element 2i in the high nibble)"),
                         ("_absmax2", "state2.absmax: f32 absmax per 256 first-level blocks (double quant)"),
                         ("_absmax", "absmax per 64-block: f32, or u8 codes of (absmax - offset) with double quant"),
                         ("_offset", "QuantState.offset: mean of the first-level absmax (double quant)"),
                         ("_deq", "dequantize_4bit(codes, state) in f32, flattened to (72, 256)")]:
        if k.endswith(suffix) and k.split("_")[0] in ("nf4", "fp4"):
            return f"{k[:-len(suffix)]}: {what}"
    fixed = {
        "int8_cb": "int8_vectorwise_quant(w) CB: round(w * 127 / row absmax), int8 (72, 256)",
        "int8_scb": "int8_vectorwise_quant(w) SCB: f32 row absmax",
        "int8_x": "activations (4, 256) with outliers at (1, 17) = 9 and (3, 130) = -7.5",
        "int8_outlier_cols": "columns of int8_x with any |x| >= 6 (int8_vectorwise_quant(x, threshold=6))",
        "int8_y": "LLM.int8 product: int8_scaled_mm(CA, CB, SCA, SCB) + x[:, cols] @ dequant(CB[:, cols])^T",
        "adam_qmap1": "AdamW8bit qmap1: create_dynamic_map(signed=True)",
        "adam_qmap2": "AdamW8bit qmap2: create_dynamic_map(signed=False)",
    }
    if k in fixed:
        return fixed[k]
    for prefix, what in [("adam_p0_", "AdamW8bit initial parameter"),
                         ("adam_grad_base_", "base gradient; step k uses it rolled by -97 k, x 0.05 when k % 3 == 0"),
                         ("adam_p_", "AdamW8bit parameter after step (index after adam_p_), tensor (last index)"),
                         ("adam_state1_", "AdamW8bit final m codes (signed dynamic map)"),
                         ("adam_state2_", "AdamW8bit final v codes (unsigned dynamic map)"),
                         ("adam_absmax1_", "AdamW8bit final m absmax per 256"),
                         ("adam_absmax2_", "AdamW8bit final v absmax per 256"),
                         ("adam32_p_7_", "PagedAdamW (32-bit) parameter after 8 steps")]:
        if k.startswith(prefix):
            return what
    raise KeyError(k)


def main():
    fu.setup_torch()
    torch.use_deterministic_algorithms(False)  # bnb's ops are deterministic but not flagged
    g = torch.Generator().manual_seed(SEED)
    out = {}
    w = make_weight(g)
    out["w"] = w.clone()
    w_bf16 = w.to(torch.bfloat16)
    out["w_bf16"] = w_bf16.clone()
    for src_name, src in [("f32", w), ("bf16", w_bf16)]:
        for qt in ["nf4", "fp4"]:
            for dq in [False, True]:
                key = f"{qt}{'_dq' if dq else ''}_{src_name}"
                q, st = F.quantize_4bit(src.clone(), blocksize=64, quant_type=qt, compress_statistics=dq)
                out[f"{key}_codes"] = q.view(-1).clone()
                out[f"{key}_absmax"] = st.absmax.clone()
                if dq:
                    out[f"{key}_absmax2"] = st.state2.absmax.clone()
                    out[f"{key}_offset"] = st.offset.reshape(1).float().clone()
                if src_name == "f32" and (dq or qt == "nf4"):  # (the rest follows from codes + absmax)
                    out[f"{key}_deq"] = F.dequantize_4bit(q, st).float().clone()
    # Int8Params: row-wise absmax int8 (threshold 0: every value quantized).
    cb, scb, _ = F.int8_vectorwise_quant(w.clone())
    out["int8_cb"] = cb.clone()
    out["int8_scb"] = scb.clone()
    # LLM.int8 forward with threshold 6: x's outlier columns through f32 against dequantized
    # weight columns, the rest int8 x int8 (bnb's ops, f32 activations instead of its fp16 cast).
    x = torch.randn(4, 256, generator=g)
    x[1, 17] = 9.0
    x[3, 130] = -7.5
    out["int8_x"] = x.clone()
    ca, sca, outlier_cols = F.int8_vectorwise_quant(x.clone(), threshold=6.0)
    y = torch.ops.bitsandbytes.int8_scaled_mm(ca, cb, sca, scb, dtype=torch.float32)
    sub_b = (cb[:, outlier_cols].float() * scb.view(-1, 1) / 127.0)
    y = y + x[:, outlier_cols] @ sub_b.t()
    out["int8_outlier_cols"] = outlier_cols.to(torch.int64).clone()
    out["int8_y"] = y.clone()

    # 8-bit AdamW on CPU.
    # Gradient of step k: the base gradient rolled by 97 k, times 0.05 on every third step (so the
    # C++ test rebuilds it from the base alone and the fixture stays small).
    shapes = [(48, 96), (4100,)]
    p0 = [torch.randn(s, generator=g) * 0.5 for s in shapes]
    base = [torch.randn(s, generator=g) for s in shapes]
    for i, b in enumerate(base):
        out[f"adam_grad_base_{i}"] = b.clone()
    grads = [[torch.roll(b.reshape(-1), -97 * k).reshape(b.shape) * (0.05 if k % 3 == 0 else 1.0) for b in base]
             for k in range(OPT_STEPS)]
    params = [torch.nn.Parameter(p.clone()) for p in p0]
    opt = bitsandbytes.optim.AdamW8bit(params, lr=1e-2, betas=(0.9, 0.995), eps=1e-8, weight_decay=0.1)
    for i, p in enumerate(p0):
        out[f"adam_p0_{i}"] = p.clone()
    for k in range(OPT_STEPS):
        for i, p in enumerate(params):
            p.grad = grads[k][i].clone()
        opt.step()
        if k in (0, OPT_STEPS - 1):
            for i, p in enumerate(params):
                out[f"adam_p_{k}_{i}"] = p.detach().clone()
    for i, p in enumerate(params):
        st = opt.state[p]
        for name in ["state1", "state2", "absmax1", "absmax2"]:
            out[f"adam_{name}_{i}"] = st[name].clone().reshape(-1)
    # PagedAdamW (32-bit state; on CPU bitsandbytes runs it unpaged, same math) on the same steps.
    params32 = [torch.nn.Parameter(p.clone()) for p in p0]
    opt32 = bitsandbytes.optim.PagedAdamW(params32, lr=1e-2, betas=(0.9, 0.995), eps=1e-8, weight_decay=0.1)
    for k in range(OPT_STEPS):
        for i, p in enumerate(params32):
            p.grad = grads[k][i].clone()
        opt32.step()
    for i, p in enumerate(params32):
        out[f"adam32_p_7_{i}"] = p.detach().clone()
    out["adam_qmap1"] = opt.state[params[0]]["qmap1"].clone()
    out["adam_qmap2"] = opt.state[params[0]]["qmap2"].clone()

    fu.save_expected(os.path.join(fu.FIXTURES_DIR, "quant"), out)
    fu.update_manifest({"quant": {
        "what": "bitsandbytes CPU path: quantize_4bit/dequantize_4bit (blocksize 64, nf4/fp4, with and without "
                "compress_statistics) of a 72x256 weight with odd statistics from f32 and bf16; "
                "int8_vectorwise_quant (Int8Params CB/SCB) and an LLM.int8 threshold-6 product; AdamW8bit "
                "(lr 1e-2, betas 0.9/0.995, wd 0.1, blockwise 256) and PagedAdamW (32-bit) over 8 steps",
        "expected": "tests/golden/fixtures/quant/expected.safetensors",
        "generator_library": f"bitsandbytes {bitsandbytes.__version__} (CPU backend; not a reimplementation)",
        "seed": SEED,
        "tensors": fu.describe(out, {k: describe_name(k) for k in out}),
        "tolerances": {
            "codes_absmax": "bit-identical (same f32 operations); DQ offset within 1 ulp (torch's mean sums in "
                            "a different order than lathe's double sum)",
            "dequantized": "bit-identical",
            "int8_y_rel": 3e-5,
            "int8_why": "bnb's int8_mm_dequant scales by the literal 6.200124e-05 (1/127^2 is 6.2000124e-05, "
                        "1.8e-5 relative); lathe uses 1/127^2",
            "adam_params_abs": 1e-6,
            "adam32_params_abs": 1e-6,
            "adam_codes": "identical (up to 4 allowed: an f32 moment 1 ulp off may cross a lookup-table cell)",
            "why": "lathe reproduces bnb's f32 arithmetic and its CPU 8-bit lookup table; measured after 8 steps: "
                   "codes identical, params within 1.2e-7",
        },
    }}, "tools/ref/make_quant_fixture.py")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""What llama.cpp's llama-quantize writes, for `lathe convert` to be checked against.

What it makes, under tests/golden/fixtures/ggml_quantize/ (paths relative to the repo root):
  rows.safetensors   `input` (f32, ROWS x 512): rows of many shapes of distribution (small and large
                     gaussians, heavy tails, one-signed, constant, zero, sparse, tiny, ties on the
                     rounding grid, ...), and per block type T in q5_0 q5_1 q2_k q3_k q4_k q5_k q6_k
                     (and q8_0 q4_0 q4_1) `T` (u8): the bytes llama-quantize wrote for those rows
  mixes.json         per model layout: its hparams, its tensors ([name, row length], 0 for 1-D) and, per
                     llama-quantize file type (q2_k .. q6_k, q4_0 .. q8_0, f16, bf16), the types
                     llama-quantize chose for them (space-separated, in that order): its per-tensor rules
                     (attn_v / ffn_down of some layers in more bits, the output head in q6_k, ...) and
                     its fallbacks for rows that are not whole blocks

How: the rows go into a GGUF (arch "llama", F32) as one tensor per type, each quantized with
`--tensor-type NAME=TYPE`; gguf-py reads the result back. For the mixes, two layouts (a SmolLM2-like
one with 576-wide rows, 3 query heads per KV head and a tied head; a Llama-like one with
256-multiple rows, 4 query heads per KV head, an untied head), 16 layers each, every tensor with its
real row length but only 2 rows (llama-quantize picks types from names, row lengths and hparams only).

Needs numpy, gguf, safetensors (no torch), and llama-quantize from bench/fetch-llamacpp.sh (pass its
bin dir with --llamacpp-bin or let the script build it). Run (~10 s once llama.cpp is built):
  $LATHE_REF_VENV/bin/python tools/ref/make_quantize_fixture.py [--llamacpp-bin DIR]
"""
import argparse
import json
import os
import subprocess
import tempfile

import numpy as np
from gguf import GGUFReader, GGUFWriter
from safetensors.numpy import save_file

import fixture_util as fu

GENERATOR = "tools/ref/make_quantize_fixture.py"
OUT = os.path.join(fu.FIXTURES_DIR, "ggml_quantize")
SEED = 2002
WIDTH = 512
ROW_TYPES = ["q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q8_0", "q4_0", "q4_1"]
FILE_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S",
              "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "F16", "BF16"]
LAYOUTS = {
    # name: (n_layer, dim, n_head, n_head_kv, ffn, vocab, tied)
    "smollm2_like": (16, 576, 9, 3, 1536, 512, True),
    "llama_like": (16, 512, 8, 2, 1024, 512, False),
}


def make_rows(rng):
    w = WIDTH
    rows = [
        0.02 * rng.standard_normal(w),                     # typical weight scale
        rng.standard_normal(w),
        0.05 * rng.standard_t(2, w),                       # heavy tails
        np.abs(0.03 * rng.standard_normal(w)) + 0.01,      # all positive (min > 0)
        -np.abs(0.03 * rng.standard_normal(w)),            # all negative
        np.zeros(w),
        np.full(w, 0.125),                                  # constant
        np.where(rng.random(w) < 0.05, rng.standard_normal(w), 0.0),  # sparse: many all-zero sub-blocks
        1e-7 * rng.standard_normal(w),                     # tiny
        300.0 * rng.standard_normal(w),                    # large
        np.round(rng.standard_normal(w) * 8) / 8,          # on a rounding grid: ties
        rng.uniform(-1, 1, w),
        0.02 * rng.standard_normal(w) + np.where(np.arange(w) % 97 == 0, 2.0, 0.0),  # outliers
        np.concatenate([np.zeros(w // 2), 0.1 * rng.standard_normal(w // 2)]),     # half zero
        np.linspace(-1, 1, w),
        0.02 * rng.standard_normal(w) * np.repeat(rng.uniform(0.01, 3, w // 16), 16),  # scales vary per 16
    ]
    for _ in range(8):  # more of the usual kind, with scales varying per 32
        rows.append(0.03 * rng.standard_normal(w) * np.repeat(rng.uniform(0.2, 2, w // 32), 32))
    return np.stack(rows).astype(np.float32)


def base_writer(path, n_layer, dim, n_head, n_head_kv, ffn, vocab):
    w = GGUFWriter(path, "llama")
    w.add_name("lathe quantize fixture")
    w.add_context_length(256)
    w.add_embedding_length(dim)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(ffn)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(dim // n_head)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(vocab - 3)]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * vocab)
    w.add_token_types([2, 3, 3] + [6] * (vocab - 3))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    return w


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def quantize(qbin, src, dst, ftype, overrides=()):
    cmd = [qbin]
    for name, t in overrides:
        cmd += ["--tensor-type", f"{name}={t}"]
    cmd += [src, dst, ftype]
    subprocess.check_call(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def rows_fixture(qbin, tmp, rows):
    src = os.path.join(tmp, "rows-f32.gguf")
    w = base_writer(src, 1, WIDTH, 4, 4, WIDTH, 256)
    for t in ROW_TYPES:
        w.add_tensor(f"rows_{t}.weight", rows)
    finish(w)
    dst = os.path.join(tmp, "rows-q.gguf")
    quantize(qbin, src, dst, "Q8_0", [(f"rows_{t}", t) for t in ROW_TYPES])
    out = {"input": rows}
    for t in GGUFReader(dst).tensors:
        if t.name.startswith("rows_"):
            typ = t.name[len("rows_"):-len(".weight")]
            assert t.tensor_type.name.lower() == typ, (t.name, t.tensor_type.name)
            out[typ] = np.ascontiguousarray(t.data).view(np.uint8).reshape(-1)
    assert sorted(out) == sorted(ROW_TYPES + ["input"]), sorted(out)
    return out


def layout_tensors(n_layer, dim, ffn, tied):
    """(name, row length) of every tensor, llama.cpp names; 1-D tensors as (name, None)."""
    ts = [("token_embd.weight", dim), ("output_norm.weight", None)]
    if not tied:
        ts.append(("output.weight", dim))
    for i in range(n_layer):
        p = f"blk.{i}."
        ts += [(p + "attn_norm.weight", None), (p + "attn_q.weight", dim), (p + "attn_k.weight", dim),
               (p + "attn_v.weight", dim), (p + "attn_output.weight", dim), (p + "ffn_norm.weight", None),
               (p + "ffn_gate.weight", dim), (p + "ffn_up.weight", dim), (p + "ffn_down.weight", ffn)]
    return ts


def mixes_fixture(qbin, tmp, rng):
    out = {}
    for lname, (n_layer, dim, n_head, n_head_kv, ffn, vocab, tied) in LAYOUTS.items():
        src = os.path.join(tmp, f"{lname}-f32.gguf")
        w = base_writer(src, n_layer, dim, n_head, n_head_kv, ffn, vocab)
        tensors = layout_tensors(n_layer, dim, ffn, tied)
        for name, k in tensors:
            shape = (dim,) if k is None else (2, k)  # 2 rows: the choice depends on the row length only
            w.add_tensor(name, (0.02 * rng.standard_normal(shape)).astype(np.float32))
        finish(w)
        types = {}
        for ft in FILE_TYPES:
            dst = os.path.join(tmp, f"{lname}-{ft}.gguf")
            quantize(qbin, src, dst, ft)
            got = {t.name: t.tensor_type.name.lower() for t in GGUFReader(dst).tensors}
            types[ft.lower()] = " ".join(got[name] for name, _ in tensors)
            os.remove(dst)
        out[lname] = {
            "hparams": {"arch": "llama", "n_layer": n_layer, "n_head": n_head, "n_head_kv": n_head_kv},
            "tensors": [[name, k if k is not None else 0] for name, k in tensors],
            "types": types,
        }
    return out


def llamacpp_bin(arg):
    if arg:
        return arg
    bin_dir = subprocess.check_output(["bash", os.path.join(fu.REPO_ROOT, "bench", "fetch-llamacpp.sh")],
                                      text=True).strip()
    return bin_dir


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llamacpp-bin", help="directory with llama-quantize")
    args = ap.parse_args()
    qbin = os.path.join(llamacpp_bin(args.llamacpp_bin), "llama-quantize")
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(SEED)
    rows = make_rows(rng)
    with tempfile.TemporaryDirectory() as tmp:
        row_bytes = rows_fixture(qbin, tmp, rows)
        mixes = mixes_fixture(qbin, tmp, rng)
    save_file(row_bytes, os.path.join(OUT, "rows.safetensors"))
    with open(os.path.join(OUT, "mixes.json"), "w") as f:
        json.dump(mixes, f, indent=1, separators=(",", ":"))
        f.write("\n")
    fu.update_manifest({"ggml_quantize": {
        "covers": "llama.cpp's quantizers (llama-quantize without an importance matrix) byte for byte on "
                  "rows of many distributions, for Q5_0, Q5_1, Q2_K .. Q6_K, Q8_0, Q4_0, Q4_1; and the "
                  "type llama-quantize chooses per tensor for each file type on two model layouts",
        "rows": fu.rel(os.path.join(OUT, "rows.safetensors")),
        "mixes": fu.rel(os.path.join(OUT, "mixes.json")),
        "tensors": fu.describe(row_bytes, {k: ("input rows (f32), %d x %d" % rows.shape) if k == "input" else
                                           f"llama-quantize's {k} bytes of the input rows (row-major blocks)"
                                           for k in row_bytes}),
        "tolerances": {"rows": "exact bytes", "mixes": "exact types"},
    }}, GENERATOR)
    fu.log("wrote", fu.rel(OUT), fu.dir_size(OUT), "bytes")


if __name__ == "__main__":
    main()

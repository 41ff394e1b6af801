# Makes the small fixtures under tests/unit/fixtures/formats/ used by the safetensors and HF
# loader tests: tiny random HF model folders and a safetensors file written by the Python library.
# Run: /opt/refenv/bin/python tools/ref/make_format_fixtures.py
import json
import os
import shutil

import numpy as np
import torch
import transformers
import safetensors
from safetensors.numpy import save_file

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "unit", "fixtures", "formats")


def first_values(t, n=4):
    return [float(x) for x in t.detach().to(torch.float32).flatten()[:n]]


def llama():
    d = os.path.join(OUT, "tiny_llama_hf")
    shutil.rmtree(d, ignore_errors=True)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=32, max_position_embeddings=256, rms_norm_eps=1e-5,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 128,
                      "rope_theta": 500000.0})
    m = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():  # norms are ones at init; make them distinguishable
        for n, p in m.named_parameters():
            if p.ndim == 1:
                p.copy_(torch.randn_like(p))
    m.save_pretrained(d)
    gen = {"bos_token_id": 1, "eos_token_id": [2, 7], "do_sample": True, "temperature": 0.6, "top_p": 0.9}
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    sd = m.state_dict()
    return {
        "q_proj_1": first_values(sd["model.layers.1.self_attn.q_proj.weight"]),
        "input_layernorm_0": first_values(sd["model.layers.0.input_layernorm.weight"]),
        "norm": first_values(sd["model.norm.weight"]),
        "lm_head": first_values(sd["lm_head.weight"]),
    }


def qwen2():
    d = os.path.join(OUT, "tiny_qwen2_hf_sharded")
    shutil.rmtree(d, ignore_errors=True)
    torch.manual_seed(1)
    cfg = transformers.Qwen2Config(
        hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=32, max_position_embeddings=256, rms_norm_eps=1e-6,
        tie_word_embeddings=True, rope_theta=1000000.0)
    m = transformers.Qwen2ForCausalLM(cfg).to(torch.float16)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if p.ndim == 1:
                p.copy_(torch.randn_like(p))
    m.save_pretrained(d, max_shard_size="4KB")
    sd = m.state_dict()
    return {
        "k_bias_1": first_values(sd["model.layers.1.self_attn.k_proj.bias"]),
        "embed": first_values(sd["model.embed_tokens.weight"]),
        "down_proj_0": first_values(sd["model.layers.0.mlp.down_proj.weight"]),
    }


def python_written():
    # Every dtype the writer supports, in deliberately unsorted insertion order.
    rng = np.random.default_rng(0)
    tensors = {
        "zeta.f32": rng.standard_normal((2, 3)).astype(np.float32),
        "alpha.f16": rng.standard_normal((3,)).astype(np.float16),
        "b.i64": np.arange(5, dtype=np.int64),
        "c.f64": np.array([[1.5, -2.25]], dtype=np.float64),
        "d.i32": np.array([-1, 2, 3], dtype=np.int32),
        "e.i16": np.array([7, -8], dtype=np.int16),
        "f.i8": np.array([-3, 4, 5], dtype=np.int8),
        "g.u8": np.array([250, 1], dtype=np.uint8),
        "h.bool": np.array([True, False, True]),
        "scalar.f32": np.array(3.25, dtype=np.float32),
        "empty.f32": np.zeros((0, 4), dtype=np.float32),
    }
    save_file(tensors, os.path.join(OUT, "python_written.safetensors"), metadata={"format": "pt"})
    st = {"bf16": [1.0, -2.5, 3.140625]}
    t = torch.tensor(st["bf16"], dtype=torch.bfloat16)
    from safetensors.torch import save_file as save_torch
    save_torch({"w.bf16": t, "v.f32": torch.tensor([0.5])}, os.path.join(OUT, "python_written_bf16.safetensors"))


def python_written_gguf():
    # Every metadata value type and a few tensor types, written by the gguf package; the C++
    # writer must reproduce these bytes exactly (tests/unit/gguf_writer_test.cc).
    import gguf
    path = os.path.join(OUT, "python_written.gguf")
    w = gguf.GGUFWriter(path, "llama")
    T = gguf.GGUFValueType
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_uint64("t.u64", 18000000000000000000)
    w.add_int64("t.i64", -9000000000000000000)
    w.add_float32("t.f32", 0.1)
    w.add_float64("t.f64", 0.1)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo")
    w.add_array("t.arr_str", ["a", "", "ünï"])
    w.add_array("t.arr_i32", [1, -2, 3])
    w.add_array("t.arr_f32", [0.5, -1.25])
    w.add_key_value("t.arr_u8", [1, 255], T.ARRAY, sub_type=T.UINT8)
    w.add_key_value("t.arr_i64", [-1, 2**40], T.ARRAY, sub_type=T.INT64)
    w.add_key_value("t.arr_f64", [1e-300, 2.5], T.ARRAY, sub_type=T.FLOAT64)
    w.add_key_value("t.arr_bool", [True, False], T.ARRAY, sub_type=T.BOOL)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((2, 3)).astype(np.float32)
    b = rng.standard_normal((5,)).astype(np.float16)
    q = gguf.quants.quantize(rng.standard_normal((2, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    c = rng.standard_normal((2, 1, 2, 3)).astype(np.float32)
    w.add_tensor("a.f32", a)
    w.add_tensor("b.f16", b)
    w.add_tensor("q.q8_0", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("c.4d", c)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    expected = {"llama": llama(), "qwen2": qwen2(),
                "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                             "safetensors": safetensors.__version__}}
    python_written()
    python_written_gguf()
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)

# Makes the seed inputs of the tokenizer, dataset and model fuzz targets (tests/fuzz/corpus/tokenizer,
# tests/fuzz/corpus/dataset, tests/fuzz/corpus/model): small files written by the libraries that define the formats
# (HF tokenizers' tokenizer.json, a SentencePiece model trained by sentencepiece, a llama2.c tokenizer.bin as
# llama2.c's tokenizer.py exports it, both vocabularies as vocab-only GGUFs by llama.cpp's gguf-py; tiny Llama models
# as GGUF by gguf-py, as llama2.c .bin in run.c's layout and as HF directories by the safetensors package) and
# LLaMA-Factory-style data files, each behind the fuzz target's selector byte(s).
# Run: ~/.cache/lathe/refenv/bin/python tools/ref/make_fuzz_seeds.py
import io
import json
import os
import struct
import tempfile

import gguf
import numpy as np
import sentencepiece as spm
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fuzz", "corpus")
TEXT = ["the cat sat on the mat", "Hello world! 123 4567", "café naïve 日本語 emoji 🙂",
        "a b c d e f g", "<|im_start|>user\nhi<|im_end|>"] * 20


def write(sub, name, data):
    d = os.path.join(ROOT, sub)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def vocab_gguf(model, tokens, scores, types, merges=None, bos=None, eos=None, unk=None):
    # A GGUF holding only tokenizer metadata (llama.cpp's ggml-vocab-*.gguf files are the same kind).
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "v.gguf")
        w = gguf.GGUFWriter(path, "llama")
        w.add_tokenizer_model(model)
        w.add_token_list(tokens)
        if scores is not None:
            w.add_token_scores(scores)
        w.add_token_types(types)
        if merges is not None:
            w.add_token_merges(merges)
        for key, v in (("bos", bos), ("eos", eos), ("unk", unk)):
            if v is not None and v >= 0:
                getattr(w, f"add_{key}_token_id")(v)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.close()
        with open(path, "rb") as f:
            return f.read()


def tokenizer_json():
    # Byte-level BPE (GPT-2 / Llama 3 / Qwen style) with special tokens and an NFC normalizer.
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(pattern=r"\p{N}{1,3}", behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXT, trainer)
    write("tokenizer", "bytelevel.json", b"\x00\x00" + tok.to_str().encode())
    # The same vocabulary as a vocab-only GGUF (tokenizer.ggml.model "gpt2"), as convert_hf_to_gguf.py writes it.
    spec = json.loads(tok.to_str())
    vocab = sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])
    special = {t["content"] for t in spec["added_tokens"] if t["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    write("tokenizer", "gpt2_vocab.gguf", b"\x03\x00" + vocab_gguf(
        "gpt2", [t for t, _ in vocab], None, [3 if t in special else 1 for t, _ in vocab], merges=merges,
        bos=spec["model"]["vocab"]["<|im_start|>"], eos=spec["model"]["vocab"]["<|im_end|>"]))
    # SentencePiece-style BPE with byte fallback (Llama 2 / Mistral tokenizer.json).
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"] +
                                  [f"<0x{b:02X}>" for b in range(256)])
    tok.train_from_iterator(TEXT, trainer)
    write("tokenizer", "metaspace.json", b"\x03\x00" + tok.to_str().encode())


def sentencepiece_model():
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "t.txt"), "w") as f:
            f.write("\n".join(TEXT))
        spm.SentencePieceTrainer.train(input=os.path.join(d, "t.txt"), model_prefix=os.path.join(d, "m"),
                                       model_type="bpe", vocab_size=340, byte_fallback=True,
                                       character_coverage=1.0, normalization_rule_name="identity", minloglevel=2)
        data = open(os.path.join(d, "m.model"), "rb").read()
    write("tokenizer", "sentencepiece.model", b"\x01\x00" + data)
    sp = spm.SentencePieceProcessor(model_proto=data)
    # The same model as a vocab-only GGUF (tokenizer.ggml.model "llama": pieces, scores, token types).
    n_sp = sp.get_piece_size()
    types = [2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1 for i in range(n_sp)]
    write("tokenizer", "llama_vocab.gguf", b"\x03\x00" + vocab_gguf(
        "llama", [sp.id_to_piece(i) for i in range(n_sp)], [sp.get_score(i) for i in range(n_sp)], types,
        bos=sp.bos_id(), eos=sp.eos_id(), unk=sp.unk_id()))
    # llama2.c's tokenizer.py export: max_token_length, then per token score (f32), length, bytes,
    # with U+2581 written as a space and <s> / </s> as "\n<s>\n" / "\n</s>\n".
    n = min(sp.get_piece_size(), 64)
    toks = []
    for i in range(n):
        t = sp.id_to_piece(i)
        if i == sp.bos_id():
            t = "\n<s>\n"
        elif i == sp.eos_id():
            t = "\n</s>\n"
        toks.append((t.replace("▁", " ").encode(), sp.get_score(i)))
    out = io.BytesIO()
    out.write(struct.pack("I", max(len(b) for b, _ in toks)))
    for b, s in toks:
        out.write(struct.pack("fI", s, len(b)))
        out.write(b)
    write("tokenizer", "llama2c.bin", bytes([2, n - 1]) + out.getvalue())


def datasets():
    # Selector byte: bits 0-2 pick the registry entry (mod 5), bits 3-5 the cutoff and template,
    # 0x40 train_on_prompt, 0x20 mask_history, 0x80 max_samples 3 (tests/fuzz/dataset_fuzz.cc).
    alpaca = [{"instruction": "Say hi", "input": "", "output": "hi", "system": "Be brief.",
               "history": [["first", "answer"]]},
              {"instruction": "Add", "input": "1 + 2", "output": "3"}]
    write("dataset", "alpaca.json", bytes([0 | 0x18]) + json.dumps(alpaca).encode())
    write("dataset", "alpaca.jsonl", bytes([1 | 0x28 | 0x40]) +
          "\n".join(json.dumps(r) for r in alpaca).encode())
    sharegpt = [{"conversations": [{"from": "human", "value": "Hello"}, {"from": "gpt", "value": "Hi!"},
                                   {"from": "human", "value": "Bye"}, {"from": "gpt", "value": "Bye."}],
                 "system": "You are kind."}]
    write("dataset", "sharegpt.json", bytes([2 | 0x08 | 0x20]) + json.dumps(sharegpt).encode())
    # Tool turns (LLaMA-Factory's glaive_toolcall shape): chatml (Hermes) and mistral-v3 (call ids) renderings.
    tools = [{"conversations": [{"from": "human", "value": "Weather?"},
                                {"from": "function_call", "value": json.dumps({"name": "w", "arguments": {"c": "P"}})},
                                {"from": "observation", "value": "sun"}, {"from": "gpt", "value": "Sunny."}],
              "tools": json.dumps([{"name": "w", "description": "d",
                                    "parameters": {"type": "object", "properties": {"c": {"type": "string"}}}}])}]
    write("dataset", "sharegpt_tools.json", bytes([2 | 0x30]) + json.dumps(tools).encode())
    write("dataset", "sharegpt_tools_mistral.json", bytes([2 | 0x28]) + json.dumps(tools).encode())
    openai = [{"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q?"},
                            {"role": "assistant", "content": "A."}]}]
    write("dataset", "openai.jsonl", bytes([3 | 0x30]) + "\n".join(json.dumps(r) for r in openai).encode())
    write("dataset", "text.txt", bytes([4 | 0x10]) + "\n".join(TEXT[:5]).encode())


def llama2c_model(dim, hidden, layers, heads, kv, vocab, seq, rng):
    # run.c's checkpoint: 7 int32 (a negative vocab_size: an untied classifier stored last), then the f32 arrays.
    hd = dim // heads
    n = (abs(vocab) * dim + layers * dim + layers * dim * dim + 2 * layers * kv * hd * dim + layers * dim * dim
         + layers * dim + 3 * layers * dim * hidden + dim + (abs(vocab) * dim if vocab < 0 else 0))
    return struct.pack("<7i", dim, hidden, layers, heads, kv, vocab, seq) + rng.uniform(-1, 1, n).astype("<f4").tobytes()


def gguf_model(dim, hidden, layers, heads, kv, vocab, tied, qtype, rng):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.gguf")
        w = gguf.GGUFWriter(path, "llama")
        w.add_block_count(layers)
        w.add_embedding_length(dim)
        w.add_feed_forward_length(hidden)
        w.add_head_count(heads)
        w.add_head_count_kv(kv)
        w.add_context_length(16)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_rope_freq_base(10000.0)
        hd = dim // heads

        def add(name, shape, quant=True):
            a = rng.uniform(-1, 1, shape).astype(np.float32)
            if quant and qtype != gguf.GGMLQuantizationType.F32:
                w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
            else:
                w.add_tensor(name, a)

        add("token_embd.weight", (vocab, dim))
        for i in range(layers):
            add(f"blk.{i}.attn_norm.weight", (dim,), False)
            add(f"blk.{i}.attn_q.weight", (dim, dim))
            add(f"blk.{i}.attn_k.weight", (kv * hd, dim))
            add(f"blk.{i}.attn_v.weight", (kv * hd, dim))
            add(f"blk.{i}.attn_output.weight", (dim, dim))
            add(f"blk.{i}.ffn_norm.weight", (dim,), False)
            add(f"blk.{i}.ffn_gate.weight", (hidden, dim))
            add(f"blk.{i}.ffn_up.weight", (hidden, dim))
            add(f"blk.{i}.ffn_down.weight", (dim, hidden))
        add("output_norm.weight", (dim,), False)
        if not tied:
            add("output.weight", (vocab, dim))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with open(path, "rb") as f:
            return f.read()


def hf_model(arch, dim, hidden, layers, heads, kv, vocab, tied, dtype, rng):
    # config.json, a 0 byte, then model.safetensors written by the safetensors package (transformers' names).
    from safetensors.numpy import save
    cfg = {"architectures": [arch + "ForCausalLM"], "model_type": arch.lower(), "hidden_size": dim,
           "intermediate_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
           "num_key_value_heads": kv, "vocab_size": vocab, "max_position_embeddings": 16, "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0, "tie_word_embeddings": tied, "hidden_act": "silu"}
    hd = dim // heads
    t = {}

    def add(name, shape):
        t[name] = rng.uniform(-1, 1, shape).astype(dtype)

    add("model.embed_tokens.weight", (vocab, dim))
    for i in range(layers):
        p = f"model.layers.{i}."
        add(p + "input_layernorm.weight", (dim,))
        add(p + "self_attn.q_proj.weight", (dim, dim))
        add(p + "self_attn.k_proj.weight", (kv * hd, dim))
        add(p + "self_attn.v_proj.weight", (kv * hd, dim))
        if arch == "Qwen2":
            add(p + "self_attn.q_proj.bias", (dim,))
            add(p + "self_attn.k_proj.bias", (kv * hd,))
            add(p + "self_attn.v_proj.bias", (kv * hd,))
        add(p + "self_attn.o_proj.weight", (dim, dim))
        add(p + "post_attention_layernorm.weight", (dim,))
        add(p + "mlp.gate_proj.weight", (hidden, dim))
        add(p + "mlp.up_proj.weight", (hidden, dim))
        add(p + "mlp.down_proj.weight", (dim, hidden))
    add("model.norm.weight", (dim,))
    if not tied:
        add("lm_head.weight", (vocab, dim))
    return json.dumps(cfg).encode() + b"\x00" + save(t)


def model_files():
    # model_fuzz's selector byte: 0 = GGUF, 1 = llama2.c, 2 = HF directory.
    rng = np.random.default_rng(7)
    write("model", "llama2c_tied.bin", b"\x01" + llama2c_model(8, 8, 1, 2, 1, 8, 8, rng))
    write("model", "llama2c_untied_gqa.bin", b"\x01" + llama2c_model(8, 12, 2, 2, 1, -6, 4, rng))
    write("model", "gguf_f32_tied.gguf", b"\x00" + gguf_model(8, 8, 1, 2, 1, 8, True, gguf.GGMLQuantizationType.F32, rng))
    write("model", "gguf_q8_0_untied.gguf",
          b"\x00" + gguf_model(32, 32, 1, 2, 1, 4, False, gguf.GGMLQuantizationType.Q8_0, rng))
    write("model", "hf_llama_f32_tied", b"\x02" + hf_model("Llama", 8, 8, 1, 2, 1, 8, True, np.float32, rng))
    write("model", "hf_qwen2_f16_untied", b"\x02" + hf_model("Qwen2", 8, 12, 2, 2, 1, 6, False, np.float16, rng))


if __name__ == "__main__":
    tokenizer_json()
    sentencepiece_model()
    datasets()
    model_files()

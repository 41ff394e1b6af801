# Makes the seed inputs of the tokenizer and dataset fuzz targets (tests/fuzz/corpus/tokenizer,
# tests/fuzz/corpus/dataset): small files written by the libraries that define the formats
# (HF tokenizers' tokenizer.json, a SentencePiece model trained by sentencepiece, a llama2.c
# tokenizer.bin as llama2.c's tokenizer.py exports it) and LLaMA-Factory-style data files, each
# behind the fuzz target's selector byte(s).
# Run: ~/.cache/lathe/refenv/bin/python tools/ref/make_fuzz_seeds.py
import io
import json
import os
import struct
import tempfile

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
    openai = [{"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q?"},
                            {"role": "assistant", "content": "A."}]}]
    write("dataset", "openai.jsonl", bytes([3 | 0x30]) + "\n".join(json.dumps(r) for r in openai).encode())
    write("dataset", "text.txt", bytes([4 | 0x10]) + "\n".join(TEXT[:5]).encode())


if __name__ == "__main__":
    tokenizer_json()
    sentencepiece_model()
    datasets()

#!/usr/bin/env python3
# Writes tests/golden/fixtures/tokenizer/smollm2_gguf.json: the ids transformers' tokenizer for the
# SmolLM2-135M-Instruct GGUF gives for a set of strings (the C++ tokenizer must match them), and
# tests/golden/fixtures/tokenizer/stories260K_hf/: the HF tokenizer.json transformers builds from
# stories260K.gguf's SentencePiece vocab (BPE + byte_fallback + Metaspace) with the ids HF
# `tokenizers` gives for a few strings and stories.
# Usage: /opt/refenv/bin/python tools/ref/gen_tokenizer_fixtures.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf]
import json
import os
import sys

import tokenizers
import transformers
from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(ROOT, "tests/golden/fixtures/tokenizer/smollm2_gguf.json")

TEXTS = [
    "Hello world",
    " Hello, world! How are you?",
    "The quick brown fox jumps over the lazy dog.",
    "I've been 'told' he's there; we'll see, they'd say.",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < 10; ++i) { x += a[i] * b[i]; }",
    "12345 678 3.14159 1,000,000 2024-11-22",
    "Emoji: 🦙🚀😁 ✅ 😶‍🌫️",
    "中文测试：我想在apple工作1314151天～",
    "нещо на Български, Führer, Cửa Việt",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n",
    "  leading spaces and trailing spaces   ",
    "\n\n\ttabs\tand\nnewlines\r\n",
    "<|endoftext|>after end",
    "",
]


SPM_TEXTS = [
    "Once upon a time", " Hello", "Hello  world \U0001F999", "  two", "<s>Hello", "a <s> b", "x</s>",
    "Tim said, \"Let's go!\"\nThey went.", "\u00fcber caf\u00e9 \u4e2d\u6587", "",
]


def stories260k_hf():
    from gguf import GGUFReader
    from tokenizers import Tokenizer
    from transformers.integrations.gguf.gguf_tokenizer_mapping import add_gguf_special_tokens, sentencepiece_tokenizer

    shared = os.environ.get("LATHE_SHARED", os.path.join(ROOT, "..", "shared"))
    r = GGUFReader(os.path.join(shared, "models/stories260K/stories260K.gguf"))

    def arr(key):
        f = r.fields[key]
        return [f.parts[i] for i in f.data]

    d = {"tokenizer_type": "llama", "tokens": [bytes(x).decode() for x in arr("tokenizer.ggml.tokens")],
         "scores": [float(x[0]) for x in arr("tokenizer.ggml.scores")],
         "token_type": [int(x[0]) for x in arr("tokenizer.ggml.token_type")]}
    # (AutoTokenizer cannot load this GGUF: its padding id is UINT32_MAX; build the same way by hand.)
    tok = add_gguf_special_tokens(sentencepiece_tokenizer(d), d)
    out_dir = os.path.join(ROOT, "tests/golden/fixtures/tokenizer/stories260K_hf")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "tokenizer.json")
    tok.backend_tokenizer.save(path)
    hf = Tokenizer.from_file(path)
    with open(os.path.join(shared, "data/tinystories/validation_100.txt"), encoding="utf-8") as f:
        stories = [s.strip() for s in f.read().split("<|endoftext|>") if s.strip()][:5]
    cases = [{"text": t, "ids": hf.encode(t, add_special_tokens=False).ids} for t in SPM_TEXTS + stories]
    with open(os.path.join(out_dir, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({"source": "tokenizers.Tokenizer.from_file(tokenizer.json).encode(text, add_special_tokens=False)",
                   "cases": cases}, f, ensure_ascii=False)
        f.write("\n")
    print("wrote", out_dir, len(cases), "cases")


def main():
    stories260k_hf()
    gguf = sys.argv[1] if len(sys.argv) > 1 else os.environ.get(
        "LATHE_SMOLLM2", os.path.expanduser("~/.cache/lathe/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    tok = AutoTokenizer.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf))
    cases = []
    for t in TEXTS:
        ids = tok.encode(t, add_special_tokens=False)
        cases.append({"text": t, "ids": ids, "decoded": tok.decode(ids)})
    out = {
        "source": "transformers AutoTokenizer.from_pretrained(dir, gguf_file=SmolLM2-135M-Instruct.Q4_1.gguf)",
        "versions": {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__},
        "bos_token": tok.bos_token, "eos_token": tok.eos_token,
        "cases": cases,
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", OUT, len(cases), "cases")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
# Writes tests/golden/fixtures/tokenizer/smollm2_gguf.json: the ids transformers' tokenizer for the
# SmolLM2-135M-Instruct GGUF gives for a set of strings (the C++ tokenizer must match them).
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


def main():
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

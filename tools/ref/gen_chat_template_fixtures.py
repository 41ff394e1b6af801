#!/usr/bin/env python3
# Writes tests/golden/fixtures/chat_templates/renderings.json: prompts rendered by transformers'
# chat-template renderer (the one apply_chat_template uses) from each model family's jinja, for a
# few conversations. The C++ ChatTemplate must Detect() the family from the jinja and render the
# same text. Jinja sources: SmolLM2's GGUF, the shared Llama-3 and Qwen3 tokenizer_config.json,
# and the published Llama-2-chat / Mistral-Instruct templates (copied below); alpaca has no
# official jinja, so the one below states the format lathe uses.
# Usage: /opt/refenv/bin/python tools/ref/gen_chat_template_fixtures.py [SmolLM2.gguf]
import json
import os
import sys

import transformers
from gguf import GGUFReader
from transformers.utils.chat_template_utils import render_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SHARED = os.environ.get("LATHE_SHARED", os.path.join(ROOT, "..", "shared"))
OUT = os.path.join(ROOT, "tests/golden/fixtures/chat_templates/renderings.json")

LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}"
    "{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)
# Mistral-7B-Instruct-v0.1's template, with a system message folded into the first user turn as
# later Mistral templates do (v0.1 itself rejects system messages).
MISTRAL = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}"
    "{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{{ bos_token }}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{% if loop.index0 == 0 and system_message != false %}{% set content = system_message + '\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}"
    "{{ '[INST] ' + content + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% endif %}{% endfor %}"
)
ALPACA = (
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\\n\\n' }}{% set loop_messages = messages[1:] %}"
    "{% else %}{{ 'Below is an instruction that describes a task. Write a response that appropriately completes the request.\\n\\n' }}{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}{% if message['role'] == 'user' %}{{ '### Instruction:\\n' + message['content'] + '\\n\\n' }}"
    "{% elif message['role'] == 'assistant' %}{{ '### Response:\\n' + message['content'] + '\\n\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '### Response:\\n' }}{% endif %}"
)

U1 = {"role": "user", "content": "What is the capital of France?"}
A1 = {"role": "assistant", "content": " The capital of France is Paris.\n"}
U2 = {"role": "user", "content": "And of Germany?\nAnswer briefly."}
SYS = {"role": "system", "content": "You are a terse geography tutor."}
A_THINK = {"role": "assistant", "content": "<think>\nrecall\n</think>\n\nBerlin."}

CONVERSATIONS = [
    ([U1], True),
    ([SYS, U1], True),
    ([U1, A1, U2], True),
    ([SYS, U1, A1], False),
    ([U1, A1], False),
    ([SYS, U1, A1, U2], True),
    ([U1, A1, U2, A_THINK], False),
]


def smollm2_jinja(gguf_path):
    r = GGUFReader(gguf_path)
    f = r.fields["tokenizer.chat_template"]
    return bytes(f.parts[f.data[0]]).decode("utf-8")


def config_jinja(name):
    with open(os.path.join(SHARED, "models", name, "tokenizer_config.json"), encoding="utf-8") as f:
        return json.load(f)["chat_template"]


def main():
    gguf = sys.argv[1] if len(sys.argv) > 1 else os.environ.get(
        "LATHE_SMOLLM2", os.path.expanduser("~/.cache/lathe/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    families = [
        ("smollm2", smollm2_jinja(gguf), "chatml", "<|im_start|>", "<|im_end|>", True),
        ("qwen3", config_jinja("qwen3-tokenizer"), "chatml", "", "<|im_end|>", True),
        # This Llama-3 jinja always ends with the assistant header, so only generation prompts.
        ("llama3", config_jinja("llama3-tokenizer"), "llama3", "<|begin_of_text|>", "<|eot_id|>", False),
        ("llama2", LLAMA2, "llama2", "<s>", "</s>", True),
        ("mistral", MISTRAL, "mistral", "<s>", "</s>", True),
        ("alpaca", ALPACA, "alpaca", "", "", True),
    ]
    out = {"renderer": "transformers.utils.chat_template_utils.render_jinja_template",
           "versions": {"transformers": transformers.__version__}, "templates": []}
    for name, jinja, family, bos, eos, any_gen in families:
        cases = []
        for messages, gen in CONVERSATIONS:
            if not gen and not any_gen:
                continue
            if family in ("llama2", "mistral") and any(m is A_THINK for m in messages):
                continue
            text = render_jinja_template([messages], chat_template=jinja, add_generation_prompt=gen,
                                         bos_token=bos, eos_token=eos)
            if isinstance(text, tuple):
                text = text[0]
            if isinstance(text, list):
                text = text[0]
            cases.append({"messages": messages, "add_generation_prompt": gen, "text": text})
        out["templates"].append({"name": name, "family": family, "jinja": jinja, "cases": cases})
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", OUT, sum(len(t["cases"]) for t in out["templates"]), "renderings")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""LLaMA-Factory's own tokens and labels for its `template:` names that lathe renders (golden fixture).

For each (template, tokenizer, enable_thinking) and each sharegpt record below, LLaMA-Factory 0.9.5's
SupervisedDatasetProcessor (the code `llamafactory-cli train` runs for stage sft) encodes the conversation:
input_ids, and labels with -100 on the prompt tokens (train_on_prompt false, mask_history false, cutoff_len
4096: nothing is cut). tests/golden/llamafactory_template_test.cc reads the same records with lathe's sharegpt
loader and checks train::EncodeConversation with ChatTemplate::ByName(template) gives the same ids and labels.

Writes tests/golden/fixtures/llamafactory_templates.json.

Environment: LLaMA-Factory's package imports datasets, trl and more that tools/ref/requirements.txt does not pin,
so it runs in a venv layered on the refenv:
  python3 -m venv /tmp/lfenv
  echo "$LATHE_REF_VENV/lib/python3.11/site-packages" > /tmp/lfenv/lib/python3.11/site-packages/refenv.pth
  /tmp/lfenv/bin/pip install --no-deps llamafactory==0.9.5 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 \
      pyarrow==26.0.1 xxhash==4.1.0 pandas==3.1.2 python-dateutil==4.0.0 pytz==2026.6 tzdata==2026.6 \
      omegaconf==2.4.0 antlr4-python3-runtime==4.13.2 fire==0.7.1 termcolor==3.3.0 trl==1.16.0 torchaudio==2.11.1
  DISABLE_VERSION_CHECK=1 /tmp/lfenv/bin/python tools/ref/make_llamafactory_template_fixture.py
(its transformers pin, <= 5.6.0, predates the refenv's 5.23.0; only the tokenizer is used from it)
"""
import json
import os

from transformers import AutoTokenizer
from llamafactory.data.processor.supervised import SupervisedDatasetProcessor
from llamafactory.data.template import get_template_and_fix_tokenizer
from llamafactory.hparams import DataArguments

import fixture_util as fu

SHARED = os.environ.get("LATHE_SHARED_DIR", "/work/shared")
OUT = os.path.join(fu.FIXTURES_DIR, "llamafactory_templates.json")

RECORDS = [
    {"conversations": [{"from": "human", "value": "Hi there"}, {"from": "gpt", "value": "Hello! How can I help?"}]},
    {"system": "You answer in one word.",
     "conversations": [{"from": "human", "value": "Name a color."}, {"from": "gpt", "value": "Blue."},
                       {"from": "human", "value": "And a fruit?"}, {"from": "gpt", "value": "Apple."}]},
    # Replies that already think: kept (thinking on) or stripped (off); the later reply has none.
    {"conversations": [{"from": "human", "value": "What is 2 + 3?"},
                       {"from": "gpt", "value": "<think>\nAdd them: 5.\n</think>\n\nIt is 5."},
                       {"from": "human", "value": "Times 2?"}, {"from": "gpt", "value": "10."}]},
]

CASES = [  # template, tokenizer dir under shared/models, enable_thinking
    ("qwen", "qwen3-tokenizer", True),
    ("qwen3", "qwen3-tokenizer", True),
    ("qwen3", "qwen3-tokenizer", False),
    ("qwen3_nothink", "qwen3-tokenizer", True),
    ("smollm", "qwen3-tokenizer", True),
    ("smollm2", "qwen3-tokenizer", True),
    ("chatml", "qwen3-tokenizer", True),
    ("llama3", "llama3-tokenizer", True),
]


def to_lf(record):
    """LLaMA-Factory's aligned form of a sharegpt record: prompt messages, the response, the system text."""
    roles = {"human": "user", "gpt": "assistant"}
    msgs = [{"role": roles[m["from"]], "content": m["value"]} for m in record["conversations"]]
    return msgs[:-1], msgs[-1:], record.get("system", "")


def main():
    cases = []
    for name, tok_dir, thinking in CASES:
        tok = AutoTokenizer.from_pretrained(os.path.join(SHARED, "models", tok_dir))
        args = DataArguments(template=name, cutoff_len=4096, enable_thinking=thinking)
        template = get_template_and_fix_tokenizer(tok, args)
        proc = SupervisedDatasetProcessor(template=template, tokenizer=tok, processor=None, data_args=args)
        for i, record in enumerate(RECORDS):
            prompt, response, system = to_lf(record)
            ids, labels = proc._encode_data_example(prompt=prompt, response=response, system=system, tools="",
                                                    images=[], videos=[], audios=[])
            cases.append({"template": name, "tokenizer": f"models/{tok_dir}/tokenizer.json",
                          "enable_thinking": thinking, "record": record, "input_ids": ids, "labels": labels,
                          "text": tok.decode(ids)})
            fu.log(f"{name} thinking={thinking} #{i}: {len(ids)} tokens, {sum(l != -100 for l in labels)} labelled")
    with open(OUT, "w") as f:
        json.dump({"generator": "tools/ref/make_llamafactory_template_fixture.py",
                   "reference": "llamafactory 0.9.5 SupervisedDatasetProcessor._encode_data_example",
                   "cases": cases}, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
# Writes tests/golden/fixtures/mistral_v3/cases.json: OpenAI chat requests (messages, tools) and the token ids
# mistral_common (Mistral's own request encoder, PyPI) gives them with the v3 instruct tokenizer it ships
# (mistral_instruct_tokenizer_240323.model.v3: Mistral-7B-Instruct-v0.3's). The C++ test
# (tests/golden/mistral_v3_test.cc) parses each request as `lathe serve` does (ToolFormat::kMistral), renders it
# with the mistral-v3 chat template and tokenizes it with the same tokenizer file: the ids must be equal.
#
#   $PY tools/ref/make_mistral_fixture.py      (needs mistral-common and sentencepiece from PyPI; seconds)
import importlib.metadata
import json
import os

import mistral_common
from mistral_common.protocol.instruct.request import ChatCompletionRequest
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests/golden/fixtures/mistral_v3/cases.json")
TOKENIZER = "mistral_instruct_tokenizer_240323.model.v3"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                   "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city"]}}}
# No description (mistral_common writes "" for it); parameters whose keys are not in sorted order.
CLOCK = {"type": "function", "function": {
    "name": "time_in", "parameters": {"type": "object", "properties": {"zone": {"type": "string"},
                                                                       "as_24h": {"type": "boolean"}}}}}


def call(id_, name, args):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}


CASES = [
    ("plain", [{"role": "user", "content": "Hello!"}], None),
    ("system", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?"}], None),
    ("multi_turn", [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello. "}, {"role": "user", "content": "Name a colour."}], None),
    ("merged_users", [{"role": "user", "content": "First part."}, {"role": "user", "content": "Second part."}], None),
    ("non_ascii", [{"role": "user", "content": "Caf\u00e9 \u20ac5 \u2014 \u65e5\u672c\n\ttab"}], None),
    ("tools", [{"role": "user", "content": "What is the weather in Paris?"}], [WEATHER, CLOCK]),
    ("tools_system", [{"role": "system", "content": "Use tools when they help."},
                      {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                      {"role": "user", "content": "Weather in Oslo?"}], [WEATHER]),
    ("call_round_trip", [{"role": "user", "content": "Weather in Paris?"},
                         {"role": "assistant", "content": None,
                          "tool_calls": [call("abcDEF123", "get_weather", "{\"city\": \"Paris\", \"unit\": \"c\"}")]},
                         {"role": "tool", "tool_call_id": "abcDEF123", "content": "{\"temp\": 21.5, \"sky\": \"clear\"}"},
                         {"role": "assistant", "content": "It is 21.5 C and clear."},
                         {"role": "user", "content": "And the time there?"}], [WEATHER, CLOCK]),
    ("parallel_calls", [{"role": "user", "content": "Weather in Rome and the time in Tokyo?"},
                        {"role": "assistant", "content": "",
                         "tool_calls": [call("Rome00001", "get_weather", "{\"city\":\"Rome\"}"),
                                        call("Tokyo0002", "time_in", "{\"zone\":\"Asia/Tokyo\",\"as_24h\":true}")]},
                        {"role": "tool", "tool_call_id": "Rome00001", "content": "sunny, 25 degrees"},
                        {"role": "tool", "tool_call_id": "Tokyo0002", "content": "{\"time\": \"21:04\"}"}],
     [WEATHER, CLOCK]),
    ("empty_args", [{"role": "user", "content": "Time?"},
                    {"role": "assistant", "tool_calls": [call("x1y2z3w4v", "time_in", "")]},
                    {"role": "tool", "tool_call_id": "x1y2z3w4v", "content": ""}], [CLOCK]),
    ("assistant_first", [{"role": "assistant", "content": "How can I help?"},
                         {"role": "user", "content": "Tell me a joke."}], None),
]


def main():
    path = os.path.join(os.path.dirname(mistral_common.__file__), "data", TOKENIZER)
    tok = MistralTokenizer.from_file(path)
    cases = []
    for name, messages, tools in CASES:
        req = ChatCompletionRequest.from_openai(messages=messages, tools=tools)
        enc = tok.encode_chat_completion(req)
        body = {"messages": messages}
        if tools:
            body["tools"] = tools
        cases.append({"name": name, "request": body, "tokens": enc.tokens, "text": enc.text})
    out = {"generator": "tools/ref/make_mistral_fixture.py",
           "mistral_common": importlib.metadata.version("mistral_common"), "tokenizer": TOKENIZER,
           "cases": cases}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"{OUT}: {len(cases)} requests")


if __name__ == "__main__":
    main()

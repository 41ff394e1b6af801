#!/usr/bin/env python3
# Writes tests/golden/fixtures/mistral_v3/cases.json: OpenAI chat requests (messages, tools) and the token ids
# mistral_common (Mistral's own request encoder, PyPI) gives them with the v3 instruct tokenizer it ships
# (mistral_instruct_tokenizer_240323.model.v3: Mistral-7B-Instruct-v0.3's). The C++ test
# (tests/golden/mistral_v3_test.cc) parses each request as `lathe serve` does (ToolFormat::kMistral), renders it
# with the mistral-v3 chat template and tokenizes it with the same tokenizer file: the ids must be equal.
# "training": LLaMA-Factory sharegpt records (function_call / observation turns, tools) and the ids mistral_common
# gives the same conversation in its fine-tuning mode (ValidationMode.finetuning: it ends with the assistant's reply,
# and every call and result needs an id; the ids are the ones `lathe train` derives, call_id() below).
#
#   $PY tools/ref/make_mistral_fixture.py      (needs mistral-common and sentencepiece from PyPI; seconds)
import importlib.metadata
import json
import os

import mistral_common
from mistral_common.protocol.instruct.request import ChatCompletionRequest
from mistral_common.protocol.instruct.validator import ValidationMode
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


def call_id(call_text, k):
    # lathe's train::CallId: FNV-1a 64 of the function_call message's text + "#k", MurmurHash3's finalizer, as 9
    # base-62 digits.
    alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    h = 14695981039346656037
    for b in (call_text + "#" + str(k)).encode("utf-8"):
        h = ((h ^ b) * 1099511628211) % (1 << 64)
    m = (1 << 64) - 1
    h ^= h >> 33
    h = (h * 0xff51afd7ed558ccd) & m
    h ^= h >> 33
    h = (h * 0xc4ceb9fe1a85ec53) & m
    h ^= h >> 33
    out = ""
    for _ in range(9):
        out += alnum[h % 62]
        h //= 62
    return out


def sharegpt_to_openai(record):
    # The OpenAI messages of a sharegpt record, with lathe's call ids; results answer the last call turn's calls in
    # order.
    messages = [{"role": "system", "content": record["system"]}] if record.get("system") else []
    ids, answered = [], 0
    for turn in record["conversations"]:
        kind, value = turn["from"], turn["value"]
        if kind == "human":
            messages.append({"role": "user", "content": value})
        elif kind == "gpt":
            messages.append({"role": "assistant", "content": value})
        elif kind == "function_call":
            calls = json.loads(value)
            calls = calls if isinstance(calls, list) else [calls]
            ids = [call_id(value, k) for k in range(len(calls))]
            answered = 0
            messages.append({"role": "assistant", "content": None, "tool_calls": [
                call(ids[k], c["name"], json.dumps(c["arguments"], ensure_ascii=False)) for k, c in enumerate(calls)]})
        elif kind == "observation":
            messages.append({"role": "tool", "tool_call_id": ids[answered], "content": value})
            answered += 1
    return messages


def sharegpt_tool(t):
    return t["function"]


def fc(value):
    return {"from": "function_call", "value": json.dumps(value, ensure_ascii=False)}


TRAINING = [
    ("glaive_like", {"conversations": [
        {"from": "human", "value": "What is the weather in Paris?"},
        fc({"name": "get_weather", "arguments": {"unit": "c", "city": "Paris"}}),
        {"from": "observation", "value": "{\"temp\": 21.5, \"sky\": \"clear\"}"},
        {"from": "gpt", "value": "It is 21.5 \u00b0C and clear in Paris."}],
        "tools": json.dumps([sharegpt_tool(WEATHER), sharegpt_tool(CLOCK)], ensure_ascii=False)}),
    # The system prompt and the tools go before the last user message, after earlier turns.
    ("system_two_rounds", {"conversations": [
        {"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello! How can I help?"},
        {"from": "human", "value": "Time in Tokyo?"},
        fc({"name": "time_in", "arguments": {"zone": "Asia/Tokyo"}}),
        {"from": "observation", "value": "21:04"},
        {"from": "gpt", "value": "It is 21:04 in Tokyo."}],
        "system": "You are a concise assistant.", "tools": json.dumps([sharegpt_tool(CLOCK)])}),
    ("parallel", {"conversations": [
        {"from": "human", "value": "Weather in Rome and Oslo?"},
        fc([{"name": "get_weather", "arguments": {"city": "Rome"}}, {"name": "get_weather", "arguments": {"city": "Oslo"}}]),
        {"from": "observation", "value": "Rome: sunny"},
        {"from": "observation", "value": "Oslo: snow"},
        {"from": "gpt", "value": "Rome is sunny, Oslo has snow."}],
        "tools": json.dumps([sharegpt_tool(WEATHER)])}),
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
    ft = MistralTokenizer.from_file(path, mode=ValidationMode.finetuning)
    training = []
    for name, record in TRAINING:
        messages = sharegpt_to_openai(record)
        tools = [{"type": "function", "function": t} for t in json.loads(record["tools"])]
        enc = ft.encode_chat_completion(ChatCompletionRequest.from_openai(messages=messages, tools=tools))
        training.append({"name": name, "record": record, "tokens": enc.tokens, "text": enc.text})
    out = {"generator": "tools/ref/make_mistral_fixture.py",
           "mistral_common": importlib.metadata.version("mistral_common"), "tokenizer": TOKENIZER,
           "cases": cases, "training": training}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"{OUT}: {len(cases)} requests, {len(training)} training conversations")


if __name__ == "__main__":
    main()

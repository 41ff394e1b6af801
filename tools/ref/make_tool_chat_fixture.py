#!/usr/bin/env python3
# Writes tests/golden/fixtures/chat_templates/tool_renderings.json: chat requests with tools, tool calls and tool
# results, rendered by transformers' chat-template renderer (the one apply_chat_template and vLLM use) from each
# model family's own jinja. The jinja files are the published ones llama.cpp keeps in models/templates/, read from
# the llama-cpp-python source distribution on PyPI (pinned below; fetched once with pip download).
#
# Two kinds of case per template:
# - "requests": OpenAI /v1/chat/completions bodies (tool_calls arguments as JSON strings, as the wire has them)
#   and the prompt (add_generation_prompt). As vLLM does before rendering, each call's arguments string is
#   parsed into a dict for the jinja. The C++ test parses the body as `lathe serve` does and renders it.
# - "training": LLaMA-Factory sharegpt records (human / gpt / function_call / observation turns and a "tools"
#   string) and the whole conversation rendered (no generation prompt) from the equivalent OpenAI messages. The
#   C++ test loads the records with the dataset loader and renders what `lathe train` trains on.
#
#   $PY tools/ref/make_tool_chat_fixture.py      (needs transformers and jinja2, no torch; pip download once)
import glob
import json
import os
import subprocess
import sys
import tarfile
import tempfile

import transformers
from transformers.utils.chat_template_utils import render_jinja_template

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests/golden/fixtures/chat_templates/tool_renderings.json")
SDIST = "llama-cpp-python==0.3.36"
CACHE = os.path.expanduser(os.environ.get("LATHE_CACHE", "~/.cache/lathe"))

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city (\u00b0C by default)",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "e.g. Z\u00fcrich"},
                                                   "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city"]}}}
CLOCK = {"type": "function", "function": {
    "name": "time_in", "description": "Local time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}, "as_24h": {"type": "boolean"}},
                   "required": ["zone"]}}}


def call(id_, name, args):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}


U_PARIS = {"role": "user", "content": "What is the weather in Paris?"}
CALL_PARIS = {"role": "assistant", "content": None,
              "tool_calls": [call("c1", "get_weather", "{\"unit\": \"c\", \"city\": \"Paris\"}")]}
RES_PARIS = {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21.5, \"sky\": \"clear\"}"}
A_PARIS = {"role": "assistant", "content": "It is 21.5 \u00b0C and clear in Paris."}

# (name, messages, tools, families or template names it applies to: "all" or a set[, chat_template_kwargs])
REQUESTS = [
    ("no_tools", [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Name a colour."}], None,
     "all"),
    ("tools", [U_PARIS], [WEATHER, CLOCK], "all"),
    ("tools_system", [{"role": "system", "content": "Use tools when they help."}, U_PARIS], [WEATHER], "all"),
    ("call_round_trip", [U_PARIS, CALL_PARIS, RES_PARIS, A_PARIS,
                         {"role": "user", "content": "And in Z\u00fcrich?"}], [WEATHER, CLOCK], "all"),
    ("result_pending", [U_PARIS, CALL_PARIS, RES_PARIS], [WEATHER], "all"),
    ("content_and_call", [U_PARIS,
                          {"role": "assistant", "content": "Let me check.",
                           "tool_calls": [call("c2", "get_weather", "{\"city\": \"Paris\"}")]},
                          {"role": "tool", "tool_call_id": "c2", "content": "rain, 12 degrees"}],
     [WEATHER], "all"),  # Llama 3.1's jinja drops the content of a turn with a call
    # chat_template_kwargs (vLLM passes them to the jinja): Qwen3's thinking switch.
    ("no_thinking", [{"role": "user", "content": "Hi"}], None, {"qwen3", "qwen3.5"}, {"enable_thinking": False}),
    # An earlier reply's reasoning (vLLM passes reasoning_content to the jinja): dropped before the last query.
    ("reasoning_history", [{"role": "user", "content": "2+2?"},
                           {"role": "assistant", "content": "4", "reasoning_content": "Two plus two is four."},
                           {"role": "user", "content": "And 3+3?"}], None, {"qwen3", "qwen3.5", "deepseek-r1"}),
    # A reply's think block left in its content: DeepSeek-R1's jinja keeps the text after the last </think>.
    ("think_in_content", [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Sky?"},
                          {"role": "assistant", "content": "<think>\nBlue, by day.\n</think>\n\nBlue."},
                          {"role": "user", "content": "Grass?"}], None, {"deepseek-r1"}),
    ("parallel_calls", [{"role": "user", "content": "Weather in Rome and the time in Tokyo?"},
                        {"role": "assistant", "content": "",
                         "tool_calls": [call("r1", "get_weather", "{\"city\":\"Rome\"}"),
                                        call("t1", "time_in", "{\"zone\":\"Asia/Tokyo\",\"as_24h\":true}")]},
                        {"role": "tool", "tool_call_id": "r1", "content": "sunny, 25 degrees"},
                        {"role": "tool", "tool_call_id": "t1", "content": "{\"time\": \"21:04\"}"}],
     [WEATHER, CLOCK], {"hermes", "qwen3_coder"}),
    # Arguments of every JSON type: Qwen3.5's XML calls write strings as is, objects and lists as JSON, the rest as
    # Python's str() (True, 1.5, 2.0, None).
    ("typed_arguments", [{"role": "user", "content": "Time in UTC?"},
                         {"role": "assistant", "content": "Checking.",
                          "tool_calls": [call("u1", "time_in", "{\"zone\": \"UTC\", \"as_24h\": false, \"offset\": 1.5, "
                                                               "\"days\": 2.0, \"n\": 3, \"tz\": null, "
                                                               "\"opts\": {\"a\": [1, \"x\"]}}")]},
                         {"role": "tool", "tool_call_id": "u1", "content": "  12:00  "}],
     [CLOCK], {"hermes", "qwen3_coder"}),
]


def sharegpt_tool(t):  # LLaMA-Factory's tool lists hold the function objects themselves
    return t["function"]


def fc(name, args):
    return {"from": "function_call", "value": json.dumps({"name": name, "arguments": args}, ensure_ascii=False)}


# (name, sharegpt record, equivalent OpenAI messages, tools, families)
TRAINING = [
    ("glaive_like",
     {"conversations": [{"from": "human", "value": "What is the weather in Paris?"},
                        fc("get_weather", {"unit": "c", "city": "Paris"}),
                        {"from": "observation", "value": "{\"temp\": 21.5, \"sky\": \"clear\"}"},
                        {"from": "gpt", "value": "It is 21.5 \u00b0C and clear in Paris."}],
      "tools": json.dumps([sharegpt_tool(WEATHER), sharegpt_tool(CLOCK)], ensure_ascii=False)},
     [U_PARIS, {"role": "assistant", "content": None,
                "tool_calls": [call("x", "get_weather", {"unit": "c", "city": "Paris"})]},
      {"role": "tool", "content": "{\"temp\": 21.5, \"sky\": \"clear\"}"}, A_PARIS],
     [WEATHER, CLOCK], "all"),
    ("system_two_rounds",
     {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello! How can I help?"},
                        {"from": "human", "value": "Time in Tokyo?"},
                        fc("time_in", {"zone": "Asia/Tokyo"}),
                        {"from": "observation", "value": "21:04"},
                        {"from": "gpt", "value": "It is 21:04 in Tokyo."}],
      "system": "You are a concise assistant.",
      "tools": json.dumps([sharegpt_tool(CLOCK)], ensure_ascii=False)},
     [{"role": "system", "content": "You are a concise assistant."}, {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Time in Tokyo?"},
      {"role": "assistant", "content": None, "tool_calls": [call("x", "time_in", {"zone": "Asia/Tokyo"})]},
      {"role": "tool", "content": "21:04"}, {"role": "assistant", "content": "It is 21:04 in Tokyo."}],
     [CLOCK], "all"),
    ("parallel",
     {"conversations": [{"from": "human", "value": "Weather in Rome and Oslo?"},
                        {"from": "function_call", "value": json.dumps(
                            [{"name": "get_weather", "arguments": {"city": "Rome"}},
                             {"name": "get_weather", "arguments": {"city": "Oslo"}}])},
                        {"from": "observation", "value": "Rome: sunny"},
                        {"from": "gpt", "value": "Rome is sunny."}],
      "tools": json.dumps([sharegpt_tool(WEATHER)])},
     [{"role": "user", "content": "Weather in Rome and Oslo?"},
      {"role": "assistant", "content": None,
       "tool_calls": [call("x", "get_weather", {"city": "Rome"}), call("y", "get_weather", {"city": "Oslo"})]},
      {"role": "tool", "content": "Rome: sunny"}, {"role": "assistant", "content": "Rome is sunny."}],
     [WEATHER], {"hermes", "qwen3_coder"}),
]

# (fixture name, jinja file in llama.cpp's models/templates, tool family, bos token, date_string or None)
# Llama 3.2's jinja writes today's date (strftime_now); the fixture passes a fixed one, which the C++ test pins.
TEMPLATES = [
    ("qwen2.5", "Qwen-Qwen2.5-7B-Instruct.jinja", "hermes", "", None),
    ("qwen3", "Qwen-Qwen3-0.6B.jinja", "hermes", "", None),
    ("llama3.1", "meta-llama-Llama-3.1-8B-Instruct.jinja", "llama3", "<|begin_of_text|>", None),
    ("llama3.2", "meta-llama-Llama-3.2-3B-Instruct.jinja", "llama3", "<|begin_of_text|>", "07 Dec 2026"),
    # Qwen3.5's generation prompt opens the think block ("<think>\n"); its tool calls are XML <function=...> blocks
    # (vLLM's qwen3_coder tool parser).
    ("qwen3.5", "Qwen3.5-4B.jinja", "qwen3_coder", "", None),
    # The DeepSeek-R1 distills (Llama and Qwen): the prompt opens the think block; their tool format is not lathe's.
    ("deepseek-r1", "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", "plain", "<\uff5cbegin\u2581of\u2581sentence\uff5c>",
     None),
]


def templates_dir():
    dest = os.path.join(CACHE, "ref", SDIST.replace("==", "-"))
    found = glob.glob(os.path.join(dest, "*", "vendor", "llama.cpp", "models", "templates"))
    if found:
        return found[0]
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", SDIST,
                        "-d", tmp], check=True)
        (sdist,) = glob.glob(os.path.join(tmp, "*.tar.gz"))
        os.makedirs(dest, exist_ok=True)
        with tarfile.open(sdist) as tf:
            members = [m for m in tf.getmembers() if "/models/templates/" in m.name and m.isfile()]
            tf.extractall(dest, members=members)
    return glob.glob(os.path.join(dest, "*", "vendor", "llama.cpp", "models", "templates"))[0]


def for_jinja(messages):
    # vLLM's _postprocess_messages: each call's arguments string becomes the dict it holds.
    out = []
    for m in messages:
        m = json.loads(json.dumps(m))
        for c in m.get("tool_calls") or []:
            if isinstance(c["function"]["arguments"], str):
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
        if m.get("content") is None:
            m["content"] = ""
        out.append(m)
    return out


def render(jinja, messages, tools, gen, bos, date, kwargs=None):
    extra = dict(kwargs or {})
    if date:
        extra["date_string"] = date
    text = render_jinja_template([for_jinja(messages)], tools=tools, chat_template=jinja, add_generation_prompt=gen,
                                 bos_token=bos, eos_token="", **extra)
    while isinstance(text, (tuple, list)):
        text = text[0]
    return text


def main():
    tdir = templates_dir()
    out = {"renderer": "transformers.utils.chat_template_utils.render_jinja_template",
           "versions": {"transformers": transformers.__version__, "templates_from": SDIST}, "templates": []}
    for name, fname, family, bos, date in TEMPLATES:
        with open(os.path.join(tdir, fname), encoding="utf-8") as f:
            jinja = f.read()
        entry = {"name": name, "file": fname, "family": family, "jinja": jinja, "date": date or "",
                 "requests": [], "training": []}
        for cname, messages, tools, fams, *kwargs in REQUESTS:
            if fams != "all" and family not in fams and name not in fams:
                continue
            if family == "plain" and tools:
                continue
            kwargs = kwargs[0] if kwargs else {}
            body = {"model": "m", "messages": messages}
            if tools:
                body["tools"] = tools
            if kwargs:
                body["chat_template_kwargs"] = kwargs
            entry["requests"].append({"name": cname, "body": body,
                                      "text": render(jinja, messages, tools, True, bos, date, kwargs)})
        for cname, record, messages, tools, fams in TRAINING:
            if family == "plain" or (fams != "all" and family not in fams):
                continue
            entry["training"].append({"name": cname, "record": record,
                                      "text": render(jinja, messages, tools, False, bos, date)})
        out["templates"].append(entry)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", OUT, sum(len(t["requests"]) + len(t["training"]) for t in out["templates"]), "renderings")


if __name__ == "__main__":
    main()

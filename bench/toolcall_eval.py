#!/usr/bin/env python3
# Tool-calling accuracy of a model and of a LoRA adapter trained for it, through `lathe serve` and the official
# `openai` client: each held-out LLaMA-Factory glaive_toolcall conversation is cut at every assistant turn that
# follows a user message, sent as an OpenAI chat request with the record's tools (tool_choice "auto", greedy), and
# the reply is scored against the record's own turn:
#   - call turns (the record calls a tool there): did the model call, the same function, with the same arguments?
#   - answer turns (the record answers in text): did the model answer without calling?
# Usage (after `lathe train examples/smollm2_lora_toolcall.yaml`, which leaves records 260-299 unseen):
#   ~/.cache/lathe/e2e-venv/bin/python bench/toolcall_eval.py --adapter out/smollm2-toolcall
# Options: --lathe build/lathe, -m MODEL (SmolLM2-135M-Instruct Q4_1), --data FILE, --first 260, --last 300,
# --concurrency 8 (requests in flight; greedy replies do not depend on the batch).
import argparse
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import openai

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cases(records):
    # (messages, tools, expected: None for a text answer, else (name, arguments)) at every assistant turn after a
    # user message.
    out = []
    for r in records:
        tools = [{"type": "function", "function": t} for t in json.loads(r.get("tools") or "[]")]
        if not tools:
            continue
        messages, n_calls = [], 0
        turns = r["conversations"]
        for i, t in enumerate(turns):
            kind, value = t["from"], t["value"]
            if kind in ("gpt", "function_call") and i > 0 and turns[i - 1]["from"] == "human":
                want = None
                if kind == "function_call":
                    c = json.loads(value)
                    c = c[0] if isinstance(c, list) else c
                    want = (c["name"], c.get("arguments", {}))
                out.append((list(messages), tools, want))
            if kind == "human":
                messages.append({"role": "user", "content": value})
            elif kind == "gpt":
                messages.append({"role": "assistant", "content": value})
            elif kind == "function_call":
                c = json.loads(value)
                calls = c if isinstance(c, list) else [c]
                messages.append({"role": "assistant", "content": None, "tool_calls": [
                    {"id": f"call_{n_calls + k}", "type": "function",
                     "function": {"name": x["name"], "arguments": json.dumps(x.get("arguments", {}))}}
                    for k, x in enumerate(calls)]})
                n_calls += len(calls)
            elif kind == "observation":
                messages.append({"role": "tool", "tool_call_id": f"call_{n_calls - 1}", "content": value})
    return out


def score(client, model, all_cases, concurrency):
    s = {"call_turns": 0, "called": 0, "name_ok": 0, "args_ok": 0, "answer_turns": 0, "answered": 0}

    def ask(case):
        messages, tools, _ = case
        resp = client.chat.completions.create(model=model, messages=messages, tools=tools, temperature=0,
                                              max_tokens=200)
        return resp.choices[0].message.tool_calls or []

    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:  # the server batches them
        replies = list(pool.map(ask, all_cases))
    for (messages, tools, want), calls in zip(all_cases, replies):
        if want is None:
            s["answer_turns"] += 1
            s["answered"] += not calls
            continue
        s["call_turns"] += 1
        if calls:
            s["called"] += 1
            if calls[0].function.name == want[0]:
                s["name_ok"] += 1
                try:
                    s["args_ok"] += json.loads(calls[0].function.arguments) == want[1]
                except json.JSONDecodeError:
                    pass
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lathe", default=os.path.join(ROOT, "build", "lathe"))
    ap.add_argument("-m", "--model", default=os.path.expanduser("~/.cache/lathe/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--data", default=os.path.join(ROOT, "..", "shared", "data", "llamafactory",
                                                   "glaive_toolcall_en_demo.json"))
    ap.add_argument("--first", type=int, default=260)
    ap.add_argument("--last", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=8)
    a = ap.parse_args()
    with open(a.data, encoding="utf-8") as f:
        records = json.load(f)[a.first:a.last]
    all_cases = cases(records)
    port = free_port()
    server = subprocess.Popen([a.lathe, "serve", "-m", a.model, "--port", str(port), "--lora", "tools=" + a.adapter],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        base = client.models.list().data[0].id
        print(f"records {a.first}-{a.last - 1} of {os.path.basename(a.data)}: {len(all_cases)} turns")
        print(f"{'model':>10} {'called':>12} {'same name':>12} {'same args':>12} {'answered':>12}")
        for label, model in (("base", base), ("adapter", "tools")):
            t0 = time.time()
            s = score(client, model, all_cases, a.concurrency)
            c, n = s["call_turns"], s["answer_turns"]
            print(f"{label:>10} {s['called']:>5}/{c:<3} {100 * s['called'] / max(c, 1):3.0f}% "
                  f"{s['name_ok']:>5}/{c:<3} {s['args_ok']:>5}/{c:<3}   {s['answered']:>4}/{n:<3} "
                  f"({time.time() - t0:.0f} s)", flush=True)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    sys.exit(main())

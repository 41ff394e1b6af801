"""Checks a running `lathe serve` with the official openai client (see serve_test.sh).

serve_test.py make-adapters DIR LATHE MODEL   writes two random PEFT adapters (q_proj, o_proj)
serve_test.py run URL LATHE MODEL DIR         runs every check against the server at URL
"""
import json
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

KEY = "sk-e2e"
fails = []


def check(cond, what):
    if not cond:
        fails.append(what)
        print("FAIL:", what, flush=True)


def model_dim(lathe, model):
    out = subprocess.run([lathe, "info", model], capture_output=True, text=True, check=True).stdout
    m = re.search(r"dim (\d+)", out)
    assert m, out
    return int(m.group(1)), int(re.search(r"(\d+) layers", out).group(1))


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, (shape, values) in tensors.items():
        data = struct.pack("<%df" % len(values), *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def make_adapters(root, lathe, model):
    import random
    dim, layers = model_dim(lathe, model)
    r = 4
    for k, name in enumerate(["ad1", "ad2"]):
        rng = random.Random(100 + k)
        d = os.path.join(root, name)
        os.makedirs(d, exist_ok=True)
        json.dump({"peft_type": "LORA", "r": r, "lora_alpha": 8, "target_modules": ["q_proj", "o_proj"],
                   "bias": "none"}, open(os.path.join(d, "adapter_config.json"), "w"))
        t = {}
        for l in range(layers):
            for mod in ["q_proj", "o_proj"]:
                p = "base_model.model.model.layers.%d.self_attn.%s." % (l, mod)
                t[p + "lora_A.weight"] = ([r, dim], [rng.gauss(0, 0.15) for _ in range(r * dim)])
                t[p + "lora_B.weight"] = ([dim, r], [rng.gauss(0, 0.15) for _ in range(r * dim)])
        write_safetensors(os.path.join(d, "adapter_model.safetensors"), t)


def http(url, body=None, key=KEY, method=None):
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"))
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metric(base, name):
    _, text = http(base + "/metrics", key=None)
    total = None
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total = (total or 0) + float(line.rsplit(" ", 1)[1])
    return total


def generate_cli(lathe, model, prompt, n, adapter=None):
    cmd = [lathe, "generate", "-m", model, "-p", prompt, "-n", str(n), "--temp", "0", "--ignore-eos", "--json", "-t", "1"]
    if adapter:
        cmd += ["--adapter", adapter]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)["text"]


def run(base, lathe, model, root):
    import openai
    from openai import OpenAI
    client = OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=60)
    greedy = dict(temperature=0, extra_body={"ignore_eos": True})

    # Models: the base and both adapters.
    ids = sorted(m.id for m in client.models.list().data)
    check(ids == ["ad1", "ad2", "stories"], "models list: %s" % ids)
    check(http(base + "/health", key=None)[0] == 200, "/health")

    # Completions: greedy equals `lathe generate` (an independent, one-at-a-time code path).
    prompt = "Once upon a time"
    c = client.completions.create(model="stories", prompt=prompt, max_tokens=24, **greedy)
    want = generate_cli(lathe, model, prompt, 24)
    check(c.choices[0].text == want, "completion %r != generate %r" % (c.choices[0].text, want))
    check(c.choices[0].finish_reason == "length", "finish_reason %s" % c.choices[0].finish_reason)
    check(c.usage.completion_tokens == 24 and c.usage.prompt_tokens > 1, "usage %s" % c.usage)
    check(c.object == "text_completion" and c.model == "stories", "completion object/model")

    e = client.completions.create(model="stories", prompt=prompt, max_tokens=24, echo=True, **greedy)
    check(e.choices[0].text == prompt + want, "echo: %r" % e.choices[0].text)

    # Loglikelihood the way lm-eval's local-completions asks for it: a token-id prompt (context +
    # continuation), echo, logprobs 1, max_tokens 1, then token_logprobs[len(context):-1].
    g = json.loads(subprocess.run([lathe, "generate", "-m", model, "-p", prompt, "-n", "8", "--temp", "0",
                                   "--ignore-eos", "--json", "-t", "1"], capture_output=True, text=True,
                                  check=True).stdout)
    ctx, cont = g["prompt_ids"], g["ids"]
    ll = client.completions.create(model="stories", prompt=ctx + cont, max_tokens=1, echo=True, logprobs=1,
                                   temperature=0).choices[0].logprobs
    check(ll.token_logprobs[0] is None and ll.top_logprobs[0] is None, "echo logprobs: the first token has none")
    check(len(ll.token_logprobs) == len(ctx) + len(cont) + 1 and len(ll.tokens) == len(ll.token_logprobs),
          "echo logprobs: one per prompt token + 1, got %d" % len(ll.token_logprobs))
    cont_lps = ll.token_logprobs[len(ctx):-1]
    greedy_ok = all(len(t) == 1 and list(t)[0] == tok
                    for t, tok in zip(ll.top_logprobs[len(ctx):-1], ll.tokens[len(ctx):-1]))
    check(greedy_ok, "echo logprobs: a greedy continuation is the top token at every position (lm-eval is_greedy)")
    gen = client.completions.create(model="stories", prompt=ctx, max_tokens=8, logprobs=0,
                                    **greedy).choices[0].logprobs.token_logprobs
    check(len(gen) == 8 and max(abs(a - b) for a, b in zip(cont_lps, gen)) < 1e-3,
          "echo logprobs %s != the generation's own %s" % (cont_lps, gen))
    z = client.completions.create(model="stories", prompt=ctx + cont, max_tokens=0, echo=True, logprobs=0)
    zl = z.choices[0].logprobs.token_logprobs
    check(z.usage.completion_tokens == 0 and len(zl) == len(ctx) + len(cont) and
          max(abs(a - b) for a, b in zip(zl[len(ctx):], cont_lps)) < 1e-5,
          "max_tokens 0 + echo: the prompt's logprobs only (%s, %d logprobs)" % (z.usage, len(zl)))

    # A batch of prompts in one request (texts, or token-id lists as lm-eval sends them): prompt
    # i's n choices get indices i*n .., each equal to that prompt's own greedy completion.
    other = "The little dog"
    want_other = generate_cli(lathe, model, other, 6)
    b = client.completions.create(model="stories", prompt=[prompt, other], max_tokens=6, n=2, **greedy)
    texts = {ch.index: ch.text for ch in b.choices}
    check(sorted(texts) == [0, 1, 2, 3], "batch choice indices %s" % sorted(texts))
    check(texts.get(0) == texts.get(1) == want[:len(texts.get(0) or "")] and texts.get(2) == texts.get(3) == want_other,
          "batch texts %s (want %r / %r)" % (texts, want, want_other))
    check(b.usage.prompt_tokens == c.usage.prompt_tokens + len(json.loads(subprocess.run(
        [lathe, "tokenize", "-m", model, "--json", other], capture_output=True, text=True, check=True).stdout)["ids"]),
        "batch usage.prompt_tokens %d" % b.usage.prompt_tokens)
    bl = client.completions.create(model="stories", prompt=[ctx + cont, ctx], max_tokens=1, echo=True, logprobs=1,
                                   temperature=0)
    by = {ch.index: ch.logprobs.token_logprobs for ch in bl.choices}
    check(len(by.get(0, [])) == len(ctx) + len(cont) + 1 and len(by.get(1, [])) == len(ctx) + 1 and
          max(abs(a - b) for a, b in zip(by[0][len(ctx):-1], cont_lps)) < 1e-5,
          "batched token-id prompts with echo + logprobs")

    # Chat completions.
    ch = client.chat.completions.create(model="stories", messages=[{"role": "system", "content": "Be kind."},
                                                                    {"role": "user", "content": "Tell me a story."}],
                                        max_tokens=16, temperature=0)
    check(ch.choices[0].message.role == "assistant" and len(ch.choices[0].message.content) > 0, "chat message")
    check(ch.usage.completion_tokens >= 1 and ch.object == "chat.completion", "chat usage/object")

    # Streaming with include_usage: the deltas add up to the non-streamed text; a final usage chunk.
    chunks = list(client.completions.create(model="stories", prompt=prompt, max_tokens=24, stream=True,
                                            stream_options={"include_usage": True}, **greedy))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    check(text == want, "stream text %r != %r" % (text, want))
    check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 24 and not chunks[-1].choices,
          "stream usage chunk")
    chat_chunks = list(client.chat.completions.create(model="stories", messages=[{"role": "user", "content": "Hi"}],
                                                      max_tokens=12, stream=True, temperature=0,
                                                      stream_options={"include_usage": True}))
    check(chat_chunks[0].choices[0].delta.role == "assistant", "chat stream role delta")
    check(chat_chunks[-1].usage is not None, "chat stream usage")
    st, raw = http(base + "/v1/completions", {"prompt": prompt, "max_tokens": 4, "stream": True})
    check(st == 200 and raw.endswith("data: [DONE]\n\n") and raw.startswith("data: {"), "raw SSE ends with [DONE]")

    # n > 1 with a seed: distinct choice indexes; the same seed reproduces, another seed differs.
    def sampled(seed, n=1, max_tokens=24):
        r = client.completions.create(model="stories", prompt=prompt, max_tokens=max_tokens, n=n, temperature=1.0,
                                      seed=seed)
        return [x.text for x in sorted(r.choices, key=lambda x: x.index)], r
    a, r = sampled(7, n=3)
    check(sorted(x.index for x in r.choices) == [0, 1, 2], "n=3 indexes")
    check(len(set(a)) > 1, "n=3 choices all equal: %s" % a)
    b, _ = sampled(7, n=3)
    check(a == b, "seeded n=3 not reproducible")
    check(sampled(7)[0] == sampled(7)[0], "seed reproducibility")
    check(sampled(7)[0] != sampled(8)[0], "seeds 7 and 8 gave the same text")

    # Logprobs (completions: top alternatives; chat: content list).
    lp = client.completions.create(model="stories", prompt=prompt, max_tokens=8, logprobs=3, **greedy).choices[0].logprobs
    check(len(lp.tokens) == 8 and len(lp.token_logprobs) == 8, "logprobs length")
    check(all(len(t) <= 3 and len(t) >= 1 for t in lp.top_logprobs), "top_logprobs sizes")
    check(all(v <= 1e-6 for v in lp.token_logprobs), "logprobs <= 0")
    check(all(abs(max(t.values()) - v) < 1e-4 for t, v in zip(lp.top_logprobs, lp.token_logprobs)),
          "greedy token is the top logprob")
    clp = client.chat.completions.create(model="stories", messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
                                         temperature=0, logprobs=True, top_logprobs=2).choices[0].logprobs
    check(clp is not None and len(clp.content) >= 1 and all(len(t.top_logprobs) <= 2 for t in clp.content),
          "chat logprobs")

    # logit_bias: +100 on one token makes every greedy step pick it; -100 on the greedy first token
    # changes the first step; logprobs stay the model's own (the forced token's is below the top).
    forced = 50
    fb = client.completions.create(model="stories", prompt=prompt, max_tokens=5, logprobs=1, temperature=0,
                                   logit_bias={str(forced): 100})
    check(fb.choices[0].logprobs is not None and fb.usage.completion_tokens == 5, "logit_bias completion")
    st, dt = http(base + "/detokenize", {"tokens": [forced] * 5})
    check(st == 200 and json.loads(dt)["prompt"] == fb.choices[0].text,
          "logit_bias +100 did not force token %d: %r vs %s" % (forced, fb.choices[0].text, dt[:200]))
    check(any(v < max(t.values()) - 1e-6 for t, v in zip(fb.choices[0].logprobs.top_logprobs,
                                                           fb.choices[0].logprobs.token_logprobs)),
          "logit_bias: the reported logprobs are the model's (the forced token is never its top token)")
    first = client.completions.create(model="stories", prompt=prompt, max_tokens=1, logprobs=0, **greedy)
    # The first token's id: the prompt and prompt + that token tokenized, the first id after the
    # prompt's (checked by detokenizing it back to the generated text).
    toks = [json.loads(http(base + "/tokenize", {"prompt": t})[1])["tokens"]
            for t in (prompt, prompt + first.choices[0].text)]
    banned = toks[1][len(toks[0])] if toks[1][:len(toks[0])] == toks[0] and len(toks[1]) > len(toks[0]) else -1
    st, dt = http(base + "/detokenize", {"tokens": [banned]})
    check(banned >= 0 and json.loads(dt)["prompt"] == first.choices[0].text,
          "greedy first token %r: id not found from %s" % (first.choices[0].text, toks))
    nb = client.completions.create(model="stories", prompt=prompt, max_tokens=1, temperature=0,
                                   logit_bias={str(banned): -100})
    check(nb.choices[0].text != first.choices[0].text,
          "logit_bias -100 on token %d (%r) did not change the greedy choice" % (banned, first.choices[0].text))

    # Adapters by model name, requested concurrently (they batch in the engine): each equals
    # `lathe generate --adapter` alone.
    expect = {"stories": want, "ad1": generate_cli(lathe, model, prompt, 24, root + "/ad1"),
              "ad2": generate_cli(lathe, model, prompt, 24, root + "/ad2")}
    check(len(set(expect.values())) == 3, "adapters do not change the output: %s" % expect)
    got = {}

    def adapter_req(name):
        got[name] = client.completions.create(model=name, prompt=prompt, max_tokens=24, **greedy).choices[0].text
    threads = [threading.Thread(target=adapter_req, args=(m,)) for m in ["ad1", "ad2", "stories"] * 1]
    [t.start() for t in threads]
    [t.join() for t in threads]
    check(got == expect, "adapter outputs %s != %s" % (got, expect))
    print("adapters: %s" % json.dumps(got)[:300], flush=True)

    # 64 concurrent streaming clients (8 prompts x base/ad1 x 4): each equals its request run alone.
    prompts = ["Lily and Ben went to the park", "The dog was happy", "One day a little girl",
               "Tom had a red ball", "The sun was shining and", "Once there was a big cat",
               "Mom said to Tim", "The bird sang a song"]
    def job(i):
        return ("stories" if (i // 8) % 2 == 0 else "ad1"), prompts[i % 8]
    alone = {}
    for i in range(16):
        m, p = job(i)
        alone[(m, p)] = client.completions.create(model=m, prompt=p, max_tokens=32, **greedy).choices[0].text
    results = [None] * 64

    def streamer(i):
        try:
            m, p = job(i)
            s = client.completions.create(model=m, prompt=p, max_tokens=32, stream=True, **greedy)
            results[i] = "".join(ch.choices[0].text for ch in s if ch.choices)
        except Exception as e:  # noqa: BLE001 - reported as a failure below
            results[i] = "ERROR %r" % e
    t0 = time.time()
    threads = [threading.Thread(target=streamer, args=(i,)) for i in range(64)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    bad = [i for i in range(64) if results[i] != alone[job(i)]]
    check(not bad, "concurrent streams differ from alone: %s" % [(i, results[i]) for i in bad[:3]])
    print("64 concurrent streams (base + ad1): %.2f s" % (time.time() - t0), flush=True)

    # A client that disconnects mid-stream: its request is cancelled, its blocks freed.
    gen0 = metric(base, "lathe_generation_tokens_total")
    cancelled0 = metric(base, "lathe_requests_cancelled_total")
    s = client.completions.create(model="stories", prompt=prompt, max_tokens=3800, stream=True, **greedy)
    for i, _ in enumerate(s):
        if i == 3:
            break
    s.close()
    deadline = time.time() + 60
    while time.time() < deadline:
        if metric(base, "lathe_kv_blocks_used") == 0 and metric(base, "lathe_num_requests_running") == 0:
            break
        time.sleep(0.05)
    check(metric(base, "lathe_kv_blocks_used") == 0, "KV blocks still used after a disconnect")
    check(metric(base, "lathe_requests_cancelled_total") == cancelled0 + 1, "disconnect not counted as cancelled")
    gen = metric(base, "lathe_generation_tokens_total") - gen0
    check(gen < 3800, "the disconnected request ran to the end (%d tokens)" % gen)
    print("disconnect after 4 chunks: the engine generated %d of 3800 tokens" % gen, flush=True)

    # A non-streamed request whose client disconnects: cancelled too (the server probes the
    # connection with JSON whitespace while it waits), its blocks freed.
    gen0 = metric(base, "lathe_generation_tokens_total")
    cancelled0 = metric(base, "lathe_requests_cancelled_total")
    host, port = base.split("//")[1].split(":")
    body = json.dumps({"model": "stories", "prompt": prompt, "max_tokens": 3800, "temperature": 0,
                       "ignore_eos": True}).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                  "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (KEY, len(body))).encode()
                 + body)
    deadline = time.time() + 60
    while time.time() < deadline and metric(base, "lathe_num_requests_running") == 0:
        time.sleep(0.05)
    sock.close()
    deadline = time.time() + 60
    while time.time() < deadline:
        if metric(base, "lathe_kv_blocks_used") == 0 and metric(base, "lathe_num_requests_running") == 0:
            break
        time.sleep(0.05)
    check(metric(base, "lathe_kv_blocks_used") == 0, "KV blocks still used after a non-streamed disconnect")
    check(metric(base, "lathe_requests_cancelled_total") == cancelled0 + 1,
          "non-streamed disconnect not counted as cancelled")
    gen = metric(base, "lathe_generation_tokens_total") - gen0
    check(gen < 3800, "the disconnected non-streamed request ran to the end (%d tokens)" % gen)
    print("non-streamed disconnect: the engine generated %d of 3800 tokens" % gen, flush=True)

    # Structured outputs: what the server generates under a JSON schema parses, and the `jsonschema` package
    # (the reference validator) accepts it: greedy, sampled (n > 1) and streamed; members come in the schema's
    # order. Strings and arrays are bounded so stories260K, which knows no JSON, must close them.
    import jsonschema
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 16},
            "age": {"type": "integer"},
            "mood": {"enum": ["happy", "sad", None]},
            "friends": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
            "pet": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"kind": {"type": "string",
                    "maxLength": 8}, "legs": {"type": "integer"}}, "required": ["kind"]}]},
            "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
            "score": {"type": "integer", "minimum": -5, "maximum": 250},
            "born": {"type": "string", "format": "date"},
        },
        "required": ["name", "age", "friends", "code", "score", "born"],
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}
    messages = [{"role": "user", "content": "Tell me about Lily as JSON."}]

    def validated(text, finish, what):
        check(finish == "stop", "%s: finish_reason %s for %r" % (what, finish, text))
        try:
            obj = json.loads(text)
            jsonschema.validate(obj, schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
            order = [k for k in schema["properties"] if k in obj]
            check(list(obj) == order, "%s: members out of order: %r" % (what, text))
        except Exception as e:  # noqa: BLE001 (any failure is the check's)
            check(False, "%s: %r is not valid: %s" % (what, text, e))
    g = client.chat.completions.create(model="stories", messages=messages, max_tokens=400, temperature=0,
                                       response_format=fmt)
    validated(g.choices[0].message.content, g.choices[0].finish_reason, "json_schema greedy")
    sampled_json = client.chat.completions.create(model="stories", messages=messages, max_tokens=400,
                                                  temperature=1.0, n=4, seed=11, response_format=fmt)
    for c in sampled_json.choices:
        validated(c.message.content, c.finish_reason, "json_schema sampled #%d" % c.index)
    check(len({c.message.content for c in sampled_json.choices}) > 1, "json_schema n=4 all equal")
    stream = list(client.chat.completions.create(model="stories", messages=messages, max_tokens=400, temperature=0,
                                                 response_format=fmt, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    check(streamed == g.choices[0].message.content, "json_schema stream %r != %r" % (streamed, g.choices[0].message.content))
    # vLLM's fields, through the client's extra_body: guided_json on completions, guided_choice.
    gj = client.completions.create(model="stories", prompt=prompt, max_tokens=400, temperature=0,
                                   extra_body={"guided_json": schema})
    validated(gj.choices[0].text, gj.choices[0].finish_reason, "guided_json")
    gc = client.chat.completions.create(model="stories", messages=messages, max_tokens=10, temperature=0.7, seed=3,
                                        extra_body={"guided_choice": ["yes", "no", "maybe not"]})
    check(gc.choices[0].message.content in ("yes", "no", "maybe not") and gc.choices[0].finish_reason == "stop",
          "guided_choice: %r" % gc.choices[0].message.content)
    # guided_regex: the whole output is one match (Python's re agrees).
    regex = r"(red|green|blue) [0-9]{1,3}(\.[0-9])?"
    gr = client.completions.create(model="stories", prompt=prompt, max_tokens=30, temperature=1.0, n=4, seed=5,
                                   extra_body={"guided_regex": regex})
    for c in gr.choices:
        check(c.finish_reason == "stop" and re.fullmatch(regex, c.text) is not None,
              "guided_regex #%d: %r (%s)" % (c.index, c.text, c.finish_reason))
    # --reasoning-parser qwen3: a reply that opens with a think block (forced here by a regex) comes back with the
    # block in message.reasoning_content (and .reasoning) and the rest as content; streamed the same.
    think = r"<think>[a-z ]{1,12}</think>\n\n[a-z ]{1,12}"
    th = client.chat.completions.create(model="stories", messages=messages, max_tokens=40, temperature=0,
                                        extra_body={"guided_regex": think,
                                                    "chat_template_kwargs": {"enable_thinking": True}})
    tm = th.choices[0].message
    whole = "<think>%s</think>%s" % (getattr(tm, "reasoning_content", None), tm.content)
    check(th.choices[0].finish_reason == "stop" and re.fullmatch(think, whole) is not None and
          getattr(tm, "reasoning", None) == tm.reasoning_content, "reasoning split: %r / %r" % (tm, whole))
    ts = list(client.chat.completions.create(model="stories", messages=messages, max_tokens=40, temperature=0,
                                             stream=True, extra_body={"guided_regex": think}))
    sr = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in ts if c.choices)
    sc = "".join(c.choices[0].delta.content or "" for c in ts if c.choices)
    check(sr == tm.reasoning_content and sc == tm.content, "streamed reasoning %r / %r" % (sr, sc))
    # JSON mode: an object (the text may run out of tokens first; when it ends, it parses).
    jo = client.chat.completions.create(model="stories", messages=messages, max_tokens=200, temperature=0,
                                        response_format={"type": "json_object"})
    jt = jo.choices[0].message.content
    check(jt.startswith("{"), "json_object: %r" % jt)
    if jo.choices[0].finish_reason == "stop":
        try:
            check(isinstance(json.loads(jt), dict), "json_object: not an object: %r" % jt)
        except ValueError as e:
            check(False, "json_object: %r does not parse: %s" % (jt, e))

    # Tool calling, forced: a named function (the output is its arguments) and "required" (one or more calls; exactly
    # one with parallel_tool_calls false).
    # The arguments validate against the tool's parameters; streamed, the deltas carry the same call; a history with
    # an assistant tool call and the tool's result is accepted.
    weather = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                 "unit": {"enum": ["celsius", "fahrenheit"]}},
               "required": ["city", "unit"]}
    params = {"get_weather": weather, "ping": {"type": "object", "properties": {}}}
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": weather}},
             {"type": "function", "function": {"name": "ping", "parameters": params["ping"]}}]
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]

    def valid_call(call, what, name=None):
        try:
            check(call.type == "function" and call.id and (name is None or call.function.name == name),
                  "%s: call %s" % (what, call))
            jsonschema.validate(json.loads(call.function.arguments), params[call.function.name])
        except Exception as e:  # noqa: BLE001
            check(False, "%s: %r is not a valid call: %s" % (what, call, e))
    named = client.chat.completions.create(model="stories", messages=ask, max_tokens=200, temperature=0, tools=tools,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
    nm = named.choices[0]
    check(nm.finish_reason == "tool_calls" and nm.message.content is None and len(nm.message.tool_calls or []) == 1,
          "named tool call: %s" % nm)
    if nm.message.tool_calls:
        valid_call(nm.message.tool_calls[0], "named tool call", "get_weather")
    required = client.chat.completions.create(model="stories", messages=ask, max_tokens=200, temperature=1.0, n=4,
                                              seed=2, tools=tools, tool_choice="required")
    for c in required.choices:
        # This small model may go on listing calls until max_tokens: the calls that closed come back then, and the
        # one it cut with the arguments it had (as OpenAI's), which need not be valid JSON.
        calls = c.message.tool_calls or []
        check(c.finish_reason in ("tool_calls", "length") and len(calls) >= 1, "required tool call: %s" % c)
        for k, call in enumerate(calls[:-1] if c.finish_reason == "length" else calls):
            valid_call(call, "required tool call #%d.%d" % (c.index, k))
        check(len({call.id for call in c.message.tool_calls or []}) == len(c.message.tool_calls or []),
              "required: call ids not distinct: %s" % c)
    one = client.chat.completions.create(model="stories", messages=ask, max_tokens=200, temperature=1.0, n=4, seed=2,
                                         tools=tools, tool_choice="required", parallel_tool_calls=False)
    for c in one.choices:
        check(c.finish_reason == "tool_calls" and len(c.message.tool_calls or []) == 1,
              "required, parallel_tool_calls false: %s" % c)
    chunks = list(client.chat.completions.create(model="stories", messages=ask, max_tokens=200, temperature=0,
                                                 tools=tools, stream=True,
                                                 tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    streamed_args = "".join(d.function.arguments or "" for d in deltas)
    # The arguments stream as they come: the first delta has the id and name, the rest pieces of the arguments.
    check(len(deltas) > 1 and deltas[0].function.name == "get_weather" and nm.message.tool_calls and
          deltas[0].id and all(d.id is None and d.function.name is None for d in deltas[1:]) and
          streamed_args == nm.message.tool_calls[0].function.arguments and
          [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls",
          "streamed tool call %r" % streamed_args)
    history = ask + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                           "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"}]
    after = client.chat.completions.create(model="stories", messages=history, max_tokens=8, temperature=0)
    check(after.choices[0].message.content is not None and after.usage.prompt_tokens > 20, "answer after a tool turn")

    # Metrics families.
    _, text = http(base + "/metrics", key=None)
    for name in ["lathe_requests_total", "lathe_prompt_tokens_total", "lathe_generation_tokens_total",
                 "lathe_time_to_first_token_seconds_bucket", "lathe_inter_token_latency_seconds_bucket",
                 "lathe_num_requests_running", "lathe_num_requests_waiting", "lathe_kv_blocks_used",
                 "lathe_kv_blocks_total", "lathe_prefix_cache_hit_rate", "lathe_preemptions_total"]:
        check(name in text, "metric %s missing" % name)
    check(metric(base, "lathe_prefix_cache_hit_rate") > 0, "no prefix-cache hits after repeated prompts")
    # Structured outputs above: 9 constrained requests; the repeated schema found masks in its cache.
    check((metric(base, "lathe_structured_requests_total") or 0) >= 9, "lathe_structured_requests_total")
    check((metric(base, "lathe_grammar_mask_walks_total") or 0) > 0 and
          (metric(base, "lathe_grammar_mask_cache_hits_total") or 0) > 0,
          "grammar mask metrics: walks %s, hits %s" % (metric(base, "lathe_grammar_mask_walks_total"),
                                                      metric(base, "lathe_grammar_mask_cache_hits_total")))

    # 4xx errors name the field; the server survives all of them.
    def err(body, status, param=None, path="/v1/completions"):
        st, txt = http(base + path, body)
        try:
            e = json.loads(txt)["error"]
        except Exception:  # noqa: BLE001
            e = None
        check(st == status and e is not None and (param is None or e.get("param") == param),
              "%s %s -> %s %s" % (path, str(body)[:60], st, txt[:200]))
    err(b"{not json", 400)
    err(b"[1, 2]", 400)
    err({"prompt": prompt, "max_tokens": "ten"}, 400, "max_tokens")
    err({"prompt": prompt, "temperature": 9}, 400, "temperature")
    err({"prompt": prompt, "n": 0}, 400, "n")
    err({"prompt": 5}, 400, "prompt")
    err({"prompt": "hello " * 5000}, 400, "prompt")
    err({"prompt": prompt, "max_tokens": 100000}, 400, "max_tokens")
    err({"prompt": [1, 99999]}, 400, "prompt")
    err({"prompt": prompt, "logit_bias": {"99999": 5}}, 400, "logit_bias")
    err({"prompt": prompt, "logit_bias": {"3": 500}}, 400, "logit_bias")
    err({"prompt": prompt, "model": "nope"}, 404, "model")
    err({"messages": "hi"}, 400, "messages", "/v1/chat/completions")
    err({"messages": [{"role": "user", "content": [{"type": 1}]}]}, 400, "messages[0].content", "/v1/chat/completions")
    err({"prompt": prompt}, 404, None, "/v1/nothing")
    try:
        client.completions.create(model="stories", prompt=prompt, max_tokens=100000)
        check(False, "openai client: max_tokens too large accepted")
    except openai.BadRequestError as e:
        check(e.body is not None and e.body.get("param") == "max_tokens", "BadRequestError param: %s" % e.body)

    for kw, param in ((dict(response_format={"type": "json_schema", "json_schema": {
                          "name": "x", "schema": {"type": "string", "pattern": "(a)\\1"}}}), "response_format.json_schema.schema"),
                      (dict(extra_body={"guided_grammar": "root ::= undefined_rule\n"}), "guided_grammar"),
                      (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}], tool_choice="sometimes"), "tool_choice")):
        try:
            client.chat.completions.create(model="stories", messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=4, **kw)
            check(False, "openai client: unsupported %s accepted" % param)
        except openai.BadRequestError as e:
            check(e.body is not None and e.body.get("param") == param, "BadRequestError param: %s" % e.body)

    # API key.
    bad = OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0)
    try:
        bad.models.list()
        check(False, "wrong API key accepted")
    except openai.AuthenticationError:
        pass
    check(http(base + "/v1/completions", {"prompt": "x"}, key=None)[0] == 401, "no API key accepted")

    # Tokenize / detokenize round trip.
    st, tk = http(base + "/tokenize", {"prompt": prompt})
    toks = json.loads(tk)["tokens"]
    st2, dt = http(base + "/detokenize", {"tokens": toks})
    check(st == 200 and st2 == 200 and prompt in json.loads(dt)["prompt"], "tokenize round trip")

    # Still serving after everything above.
    again = client.completions.create(model="stories", prompt=prompt, max_tokens=24, **greedy).choices[0].text
    check(again == want, "server state changed the output")
    # The engine frees a finished request's blocks after handing over its last token, so the
    # response can reach the client first: wait for it (a leak stays).
    deadline = time.time() + 60
    while time.time() < deadline and metric(base, "lathe_kv_blocks_used") != 0:
        time.sleep(0.05)
    check(metric(base, "lathe_kv_blocks_used") == 0, "blocks leaked at the end")
    return 1 if fails else 0


def tools_auto(url, template):
    """tool_choice "auto" on SmolLM2 (a real chat model): free text stays content; calls become tool_calls held to
    the tools' schemas. chatml (SmolLM2's own template): Hermes <tool_call> blocks; logit_bias on the tokens of
    "<tool_call>" makes the model open a call (a 135M model seldom calls on its own), and from the tag on the lazy
    grammar writes a valid call. llama3 (the server run with --chat-template llama3): a reply that begins with "{"
    is a call, {"name", "parameters"}; logit_bias on "{" begins one. qwen3.5 (Qwen3.5's jinja as a file): XML calls
    after "<tool_call>", read back as JSON arguments."""
    import jsonschema
    import openai
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
    weather = {"type": "object", "properties": {"city": {"enum": ["Paris", "Tokyo"]},
                                                 "unit": {"enum": ["celsius", "fahrenheit"]}},
               "required": ["city"]}
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": weather}},
             {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}]
    params = {"get_weather": weather, "ping": tools[1]["function"]["parameters"]}
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    opener = "{" if template == "llama3" else "<tool_call>"
    _, tk = http(url + "/tokenize", {"prompt": opener, "add_special_tokens": False}, key=None)
    bias = {str(t): 100 for t in json.loads(tk)["tokens"]}

    def valid(call, what):
        try:
            check(call.type == "function" and call.id and call.function.name in params, "%s: call %s" % (what, call))
            jsonschema.validate(json.loads(call.function.arguments), params[call.function.name])
        except Exception as e:  # noqa: BLE001
            check(False, "%s: %r is not a valid call: %s" % (what, call, e))

    # No call: the answer is content, as without tools.
    plain = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Write one sentence about cats."}],
                                           max_tokens=40, temperature=0, tools=tools).choices[0]
    if template == "llama3":  # SmolLM2 does not know Llama's prompt: it may answer with a call; either is well formed
        for c in plain.message.tool_calls or []:
            valid(c, "llama3 auto, unbiased")
        check(plain.message.content or plain.message.tool_calls, "llama3 auto, unbiased: %s" % plain)
    else:
        check(plain.finish_reason in ("stop", "length") and plain.message.content and not plain.message.tool_calls,
              "auto, no call: %s" % plain)
    # One call (parallel_tool_calls false: the text ends after it).
    one = client.chat.completions.create(model="m", messages=ask, max_tokens=60, temperature=0, tools=tools,
                                         logit_bias=bias, parallel_tool_calls=False).choices[0]
    check(one.finish_reason == "tool_calls" and len(one.message.tool_calls or []) == 1 and one.message.content is None,
          "auto, one call: %s" % one)
    for c in one.message.tool_calls or []:
        valid(c, "auto call")
    chunks = list(client.chat.completions.create(model="m", messages=ask, max_tokens=60, temperature=0, tools=tools,
                                                 logit_bias=bias, parallel_tool_calls=False, stream=True))
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    # The call's first delta has its id and name, the next ones the pieces of its arguments, which join to the
    # non-streamed reply's.
    check(len(deltas) > 1 and one.message.tool_calls and deltas[0].function.name == one.message.tool_calls[0].function.name
          and deltas[0].id and all(d.index == 0 for d in deltas)
          and all(d.id is None and d.function.name is None for d in deltas[1:])
          and "".join(d.function.arguments or "" for d in deltas) == one.message.tool_calls[0].function.arguments
          and content == "" and [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls",
          "auto, streamed call: %s" % deltas)
    if template == "llama3":
        return 1 if fails else 0
    # Parallel calls: the bias keeps opening new ones until max_tokens; every complete one is a valid call.
    many = client.chat.completions.create(model="m", messages=ask, max_tokens=120, temperature=0, tools=tools,
                                          logit_bias=bias).choices[0]
    check(len(many.message.tool_calls or []) >= 2, "auto, parallel calls: %s" % many)
    calls = many.message.tool_calls or []
    if many.finish_reason == "length" and calls:  # the call max_tokens cut keeps its arguments' start, as OpenAI's
        check(calls[-1].function.arguments.startswith("{"), "cut call: %s" % calls[-1])
        calls = calls[:-1]
    for c in calls:
        valid(c, "parallel call")
    check(len({c.id for c in many.message.tool_calls or []}) == len(many.message.tool_calls or []), "call ids repeat")
    return 1 if fails else 0


if __name__ == "__main__":
    if sys.argv[1] == "tools-auto":
        sys.exit(tools_auto(sys.argv[2], sys.argv[3]))
    if sys.argv[1] == "make-adapters":
        make_adapters(sys.argv[2], sys.argv[3], sys.argv[4])
        sys.exit(0)
    sys.exit(run(*sys.argv[2:6]))

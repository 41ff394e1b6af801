#!/usr/bin/env bash
# End-to-end test of `lathe serve` with the official `openai` Python client (pinned, installed
# from PyPI into a cached venv): completions, chat, streaming, n > 1, logprobs, seeds, LoRA
# adapters, structured outputs (validated by `jsonschema`), 64 concurrent streams, disconnects, 4xx
# errors, API key, graceful shutdown.
# Exits 77 (ctest SKIP) only when PyPI cannot be reached to install the client.
set -uo pipefail
LATHE="${LATHE_BIN:?}"
SHARED="${LATHE_SHARED:?}"
HERE="$(cd "$(dirname "$0")" && pwd)"
MODEL="$SHARED/models/stories260K/stories260K.gguf"
OPENAI_VERSION=3.51.0
JSONSCHEMA_VERSION=4.26.0
VENV="${XDG_CACHE_HOME:-$HOME/.cache}/lathe/e2e-venv"

if [ ! -f "$MODEL" ]; then echo "FAIL: $MODEL not found"; exit 1; fi
. "$HERE/../pip_venv.sh"
lathe_pip_venv "$VENV" "import openai, sys; sys.exit(openai.__version__ != '$OPENAI_VERSION')" "openai==$OPENAI_VERSION"
# The reference validator for structured outputs.
lathe_pip_venv "$VENV" "import importlib.metadata as m, sys; sys.exit(m.version('jsonschema') != '$JSONSCHEMA_VERSION')" \
  "jsonschema==$JSONSCHEMA_VERSION"

tmp=$(mktemp -d)
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

# Two random PEFT adapters for stories260K (written by the test script, no torch needed).
"$VENV/bin/python" "$HERE/serve_test.py" make-adapters "$tmp" "$LATHE" "$MODEL" || { echo "FAIL: make adapters"; exit 1; }

"$LATHE" serve -m "$MODEL" --host 127.0.0.1 --port 0 --api-key sk-e2e --served-model-name stories \
  --lora ad1="$tmp/ad1" --lora ad2="$tmp/ad2" --max-model-len 4096 --kv-cache-memory 64M \
  --chat-template chatml --reasoning-parser qwen3 -t 2 > "$tmp/server.out" 2> "$tmp/server.err" &
server_pid=$!
url=
# Up to 60 s: under ASan, with the other e2e tests on the same cores, start-up is slow.
for _ in $(seq 1 1200); do
  url=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$tmp/server.out" | head -1)
  [ -n "$url" ] && break
  if ! kill -0 "$server_pid" 2>/dev/null; then echo "FAIL: server exited"; cat "$tmp/server.err"; exit 1; fi
  sleep 0.05
done
if [ -z "$url" ]; then echo "FAIL: server did not print its address"; cat "$tmp/server.out" "$tmp/server.err"; exit 1; fi
echo "server: $url"

"$VENV/bin/python" "$HERE/serve_test.py" run "$url" "$LATHE" "$MODEL" "$tmp"
rc=$?
if [ "$rc" -ne 0 ]; then echo "FAIL: serve_test.py (rc $rc); the server's stderr ends:"; tail -20 "$tmp/server.err"; fi

# The listening socket queues up to 1024 connections (capped by net.core.somaxconn): cpp-httplib's
# own backlog of 5 made bursts of 64 clients fail with "HTTP error Read" under load.
port=${url##*:}
want=$(( $(cat /proc/sys/net/core/somaxconn) < 1024 ? $(cat /proc/sys/net/core/somaxconn) : 1024 ))
backlog=$(ss -ltnH "sport = :$port" 2>/dev/null | awk '{print $3}' | head -1)
if [ -z "$backlog" ] || [ "$backlog" -lt "$want" ]; then
  echo "FAIL: listen backlog of port $port is '${backlog}', want >= $want"; rc=1
fi

# `lathe bench serve --url`: the same workload against this running server (as bench/llamacpp.sh
# drives llama-server), with its API key and served model name; every request completes with
# exactly max_tokens tokens (bench serve fails a request otherwise).
"$LATHE" bench serve -m "$MODEL" --url "$url/" --api-key sk-e2e --served-model stories --concurrency 1,2 \
  --requests 2 --prompt-tokens 8,16 --output-tokens 4,8 --data "$SHARED/data/tinystories/validation_100.txt" \
  --system-prompt-tokens 16 > "$tmp/bench_url.out" 2> "$tmp/bench_url.err" || { echo "FAIL: bench serve --url"; cat "$tmp/bench_url.out" "$tmp/bench_url.err"; rc=1; }
python3 - "$tmp/bench_url.out" "$url" <<'PY' || { echo "FAIL: bench serve --url output"; cat "$tmp/bench_url.out"; rc=1; }
import re, sys
text, url = open(sys.argv[1]).read(), sys.argv[2]
assert "external server" in text and "streamed over " + url in text, text
assert "FAILED" not in text and "engine:" not in text, text
rows = re.findall(r"^\| (\d+) \| ([0-9.]+) \| ([0-9.]+)x \|", text, re.M)
assert [int(r[0]) for r in rows] == [1, 2] and all(float(r[1]) > 0 for r in rows), rows
assert re.search(r"shared 16-token system prompt \+ 16 distinct tokens: TTFT [0-9.]+ ms", text), text
PY
# A wrong key is refused by the server: the warm-up fails and the error names --url.
out=$("$LATHE" bench serve -m "$MODEL" --url "$url" --api-key wrong --concurrency 1 \
  --data "$SHARED/data/tinystories/validation_100.txt" 2>&1); [ $? -ne 0 ] \
  && echo "$out" | grep -q -- "--url $url: the warm-up completion failed: status 401" \
  || { echo "FAIL: bench serve --url with a wrong key: $out"; rc=1; }

# Graceful shutdown on SIGTERM: exit status 0, promptly (0.3 s under ASan here; 20 s allowed for a
# loaded CI machine, where LeakSanitizer's exit scan also takes its time).
kill -TERM "$server_pid"
for _ in $(seq 1 400); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.05; done
if kill -0 "$server_pid" 2>/dev/null; then echo "FAIL: server still running 20 s after SIGTERM"; rc=1; fi
wait "$server_pid"
st=$?
server_pid=
if [ "$st" -ne 0 ]; then echo "FAIL: server exit status $st after SIGTERM"; cat "$tmp/server.err"; rc=1; fi

# Starts `lathe serve` with these arguments (on a free port, served as "m"), its output in $tmp/side.{out,err}; sets
# server_pid and url (empty when it did not start within 60 s).
start_side_server() {
  "$LATHE" serve --host 127.0.0.1 --port 0 --served-model-name m --kv-cache-memory 64M -t 2 "$@" \
    > "$tmp/side.out" 2> "$tmp/side.err" &
  server_pid=$!
  url=
  for _ in $(seq 1 1200); do
    url=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$tmp/side.out" | head -1)
    [ -n "$url" ] && break
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.05
  done
}
stop_side_server() {
  kill -TERM "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null
  server_pid=
}

# tool_choice "auto" on a real chat model (SmolLM2, when the test has it): content, and calls read back, in its own
# template's Hermes format, in Llama 3's JSON format (the llama3 template) and in Qwen3.5's XML calls (its jinja given
# as a file). With a reasoning parser, as a Qwen3 would be served: the replies open no think block, so the tool
# grammars run as without one.
if [ -n "${LATHE_SMOLLM2:-}" ] && [ -f "$LATHE_SMOLLM2" ]; then
  # Qwen3.5's jinja (from the golden fixture) as a file: its XML calls (vLLM's qwen3_coder format).
  python3 -c 'import json, sys; t = json.load(open(sys.argv[1]))["templates"]; sys.stdout.write([x for x in t if x["name"] == "qwen3.5"][0]["jinja"])' \
    "$LATHE_SOURCE/tests/golden/fixtures/chat_templates/tool_renderings.json" > "$tmp/qwen3.5.jinja"
  for template in chatml llama3 qwen3.5; do
    if [ "$template" = qwen3.5 ]; then
      start_side_server -m "$LATHE_SMOLLM2" --max-model-len 1024 --chat-template "$tmp/qwen3.5.jinja"
    else
      start_side_server -m "$LATHE_SMOLLM2" --max-model-len 1024 --chat-template "$template" --reasoning-parser qwen3
    fi
    if [ -z "$url" ]; then
      echo "FAIL: the SmolLM2 server ($template) did not start"; cat "$tmp/side.err"; rc=1
    elif ! "$VENV/bin/python" "$HERE/serve_test.py" tools-auto "$url" "$template"; then
      echo "FAIL: tool calls on SmolLM2 ($template); the server's stderr ends:"; tail -20 "$tmp/side.err"; rc=1
    fi
    stop_side_server
  done
fi

# Bad flags are errors naming the flag, not crashes.
out=$("$LATHE" serve -m "$MODEL" --kv-cache-memory 12X 2>&1); [ $? -ne 0 ] && echo "$out" | grep -q "kv-cache-memory" \
  || { echo "FAIL: bad --kv-cache-memory: $out"; rc=1; }
out=$("$LATHE" serve -m "$MODEL" --lora nodir 2>&1); [ $? -ne 0 ] && echo "$out" | grep -q "NAME=DIR" \
  || { echo "FAIL: bad --lora: $out"; rc=1; }
out=$("$LATHE" serve -m "$MODEL" --reasoning-parser deepseek 2>&1); [ $? -ne 0 ] \
  && echo "$out" | grep -q -- "--reasoning-parser: unknown reasoning parser 'deepseek'; lathe has: qwen3" \
  || { echo "FAIL: bad --reasoning-parser: $out"; rc=1; }

out=$("$LATHE" serve -m "$MODEL" --structured-outputs-in-reasoning 2>&1); [ $? -ne 0 ] \
  && echo "$out" | grep -q -- "--structured-outputs-in-reasoning: it applies with --reasoning-parser" \
  || { echo "FAIL: --structured-outputs-in-reasoning alone: $out"; rc=1; }
out=$("$LATHE" serve -m "$MODEL" --kv-cache-dtype int8 2>&1); [ $? -ne 0 ] \
  && echo "$out" | grep -q -- "--kv-cache-dtype 'int8': expected auto, f32, f16 or bf16" \
  || { echo "FAIL: bad --kv-cache-dtype: $out"; rc=1; }

# `lathe bench serve`: a tiny workload through its in-process server at two concurrency levels,
# with the block size it was given, a bf16 KV cache, sampling at temperature 0.8; every level completes
# and reports sane figures; --profile writes the last level's ops as a Chrome trace and a table.
"$LATHE" bench serve -m "$MODEL" -t 2 --concurrency 1,2 --requests 2 --prompt-tokens 8,16 --output-tokens 4,8 \
  --data "$SHARED/data/tinystories/validation_100.txt" --system-prompt-tokens 0 --block-size 8 --temperature 0.8 \
  --kv-cache-dtype bf16 --profile "$tmp/bench_prof.json" > "$tmp/bench.out" 2> "$tmp/bench.err" \
  || { echo "FAIL: bench serve"; rc=1; }
python3 - "$tmp/bench.out" "$tmp/bench_prof.json" <<'PY' || { echo "FAIL: bench serve output"; cat "$tmp/bench.out" "$tmp/bench.err"; rc=1; }
import json, re, sys
text = open(sys.argv[1]).read()
assert re.search(r"engine: \d+ KV blocks x 8 tokens \(bf16\)", text), text
# --prefill-tokens-per-decode-row auto: an f32 model's prompt rows run on FMAs on every CPU, so 2.
assert "prefill-tokens-per-decode-row 2;" in text, text
assert re.search(r"profile of the last level \(concurrency 2\)", text), text
assert re.search(r"^attention +\d+", text, re.M) and re.search(r"^matmul_", text, re.M), text
trace = json.load(open(sys.argv[2]))
events = trace["traceEvents"] if isinstance(trace, dict) else trace
assert any(e.get("name") == "attention" for e in events), len(events)
assert "temperature 0.8, ignore_eos" in text, text
# KV utilization is sampled while requests run: "-" when a level finished before any sample.
rows = re.findall(r"^\| (\d+) \| ([0-9.]+) \| ([0-9.]+)x \|.*\| ([0-9.]+%|-) \|$", text, re.M)
assert [int(r[0]) for r in rows] == [1, 2], rows
for c, tps, ratio, kv in rows:
    assert float(tps) > 0 and float(ratio) > 0, (c, tps, ratio)
    assert kv == "-" or 0 < float(kv[:-1]) <= 100, (c, kv)
assert float(rows[0][2]) == 1.0, rows  # the first level is the one-at-a-time baseline
# Every level on a fresh engine: level 2 runs the prompts of level 1 again (the same 4 requests) and
# must compute them, not find them in the prefix cache (their ratio was inflated that way).
hits = re.findall(r"^concurrency +\d+:.*\| prefix cache hits (\d+)", text, re.M)
assert hits == ["0", "0"], hits
PY
# A --url nothing listens on, or one that is not http://HOST:PORT, is an error naming it.
out=$("$LATHE" bench serve -m "$MODEL" --url http://127.0.0.1:1 --concurrency 1 \
  --data "$SHARED/data/tinystories/validation_100.txt" 2>&1); [ $? -ne 0 ] \
  && echo "$out" | grep -q -- "--url http://127.0.0.1:1: the warm-up completion failed" \
  || { echo "FAIL: bench serve --url to a closed port: $out"; rc=1; }
out=$("$LATHE" bench serve -m "$MODEL" --url 127.0.0.1:8080 2>&1); [ $? -ne 0 ] \
  && echo "$out" | grep -q -- "--url 127.0.0.1:8080: expected http://HOST:PORT" \
  || { echo "FAIL: bench serve malformed --url: $out"; rc=1; }
out=$("$LATHE" bench serve -m "$MODEL" --block-size 0 2>&1); [ $? -ne 0 ] && echo "$out" | grep -q "block-size" \
  || { echo "FAIL: bad bench serve --block-size: $out"; rc=1; }
# A sweep of prefill caps (--max-prefill-tokens-with-decode LIST): every level once per value, on
# fresh engines, each row labelled with its round and cap and compared with c=1 at the same cap.
"$LATHE" bench serve -m "$MODEL" -t 2 --concurrency 1,2 --requests 2 --prompt-tokens 8,16 --output-tokens 4,8 \
  --data "$SHARED/data/tinystories/validation_100.txt" --system-prompt-tokens 0 \
  --max-prefill-tokens-with-decode 0,4 > "$tmp/sweep.out" 2> "$tmp/sweep.err" || { echo "FAIL: bench serve sweep"; rc=1; }
python3 - "$tmp/sweep.out" <<'PY' || { echo "FAIL: bench serve sweep output"; cat "$tmp/sweep.out" "$tmp/sweep.err"; rc=1; }
import re, sys
text = open(sys.argv[1]).read()
assert "max-prefill-tokens-with-decode 0,4" in text, text
rows = re.findall(r"^\| (\d+) \| (\d+) \| (\d+) \| ([0-9.]+) \| ([0-9.]+)x \|", text, re.M)
assert [(int(r[1]), int(r[2])) for r in rows] == [(0, 1), (4, 1), (0, 2), (4, 2)], rows
assert all(r[0] == "1" and float(r[3]) > 0 for r in rows), rows
assert [float(r[4]) for r in rows[:2]] == [1.0, 1.0], rows  # each cap's own one-at-a-time baseline
PY
out=$("$LATHE" bench serve -m "$MODEL" --max-prefill-tokens-with-decode 64,x 2>&1); [ $? -ne 0 ] \
  && echo "$out" | grep -q -- "--max-prefill-tokens-with-decode: expected non-negative integers" \
  || { echo "FAIL: bad bench serve --max-prefill-tokens-with-decode: $out"; rc=1; }
out=$("$LATHE" serve -m "$MODEL" --prefill-tokens-per-decode-row x 2>&1); [ $? -ne 0 ] \
  && echo "$out" | grep -q -- "--prefill-tokens-per-decode-row must be" \
  || { echo "FAIL: bad serve --prefill-tokens-per-decode-row: $out"; rc=1; }
out=$("$LATHE" serve -m "$MODEL" --max-prefill-tokens-with-decode -1 2>&1); [ $? -ne 0 ] \
  && echo "$out" | grep -q -- "--max-prefill-tokens-with-decode must be" \
  || { echo "FAIL: bad serve --max-prefill-tokens-with-decode: $out"; rc=1; }

[ "$rc" -eq 0 ] && echo "PASS: serve e2e"
exit "$rc"

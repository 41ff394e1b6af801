#!/usr/bin/env bash
# `lathe train --profile FILE --monitor`: the Chrome trace parses back as JSON with the training
# ops (name, shape, duration, FLOPs, bytes) and one track per pool thread; the top-ops table is
# printed; --monitor prints per-category memory; every JSONL log line carries the memory
# categories (current <= peak, the weights > 0); bad flag values are named. `lathe serve --profile`
# writes the forward ops of the requests it served, with the same table, at shutdown.
set -uo pipefail
LATHE="${LATHE_BIN:?}"
SHARED="${LATHE_SHARED:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

cat > "$tmp/lora.yaml" <<YAML
model_name_or_path: $SHARED/models/stories260K/stories260K.gguf
stage: sft
finetuning_type: lora
lora_target: all
dataset: alpaca_en_demo
dataset_dir: $SHARED/data/llamafactory
template: alpaca
cutoff_len: 64
max_samples: 16
output_dir: $tmp/out
logging_steps: 1
save_steps: 1000
per_device_train_batch_size: 4
max_steps: 2
report_to: none
YAML
if ! "$LATHE" train "$tmp/lora.yaml" -t 3 --monitor --profile "$tmp/trace.json" > "$tmp/stdout" 2> "$tmp/log"; then
  fail "lathe train --profile exited non-zero"; cat "$tmp/log"; exit 1
fi
grep -q "^op .*calls .*share .*GFLOP/s .*GB/s" "$tmp/log" || fail "no top-ops table in the log"
grep -q "^linear_fwd " "$tmp/log" || fail "top-ops table lacks linear_fwd"
grep -q "^memory: weights .* (peak .*) | lora .* | rss " "$tmp/log" || fail "--monitor printed no memory line"
grep -q "^memory plan: " "$tmp/log" || fail "no memory plan logged at start"
python3 - "$tmp/trace.json" "$tmp/out/trainer_log.jsonl" <<'PY' || fails=$((fails + 1))
import json, sys
t = json.load(open(sys.argv[1]))
ev = [e for e in t["traceEvents"] if e.get("ph") == "X"]
names = {e["name"] for e in ev}
need = {"linear_fwd", "linear_bwd", "attention_fwd", "cross_entropy_fwd_bwd", "pool_chunk"}
assert need <= names, f"trace lacks {need - names}"
lin = [e for e in ev if e["name"] == "linear_fwd"]
assert all(e["dur"] >= 0 and e["args"]["flops"] > 0 and e["args"]["bytes"] > 0 for e in lin), "linear_fwd without flops/bytes"
assert all(e["args"]["shape"].startswith("[") for e in lin), "linear_fwd without a shape"
# 7 LoRA'd linears x 5 layers x 2 steps forward.
# 7 linears x 5 layers x 2 steps x 2 row groups (4 rows of <= 64 tokens: at most half the rows per group)
assert len(lin) == 7 * 5 * 2 * 2, f"{len(lin)} linear_fwd events, expected 140"
# The loss over a frozen (LoRA) head: logits and dx only, 4 flops per token x dim x vocab (no head gradient). Its
# bytes (2 x the f32 head + 8 per token x dim) give the tokens: stories260K is dim 64, vocab 512.
for e in [e for e in ev if e["name"] == "cross_entropy_fwd_bwd"]:
    n = (e["args"]["bytes"] - 2 * 512 * 64 * 4) / (8 * 64)
    assert n >= 1 and e["args"]["flops"] == 4 * n * 64 * 512, ("cross_entropy_fwd_bwd", n, e["args"])
tracks = {e["tid"] for e in ev if e["name"] == "pool_chunk"}
# A track per thread that ran chunks: the pool lets a worker that lost its core (2 cores, -t 3, a
# loaded machine) run none, so only "several tracks, all of them pool threads" is guaranteed.
assert len(tracks) >= 2 and tracks <= {0, 1, 2}, f"pool_chunk tracks {sorted(tracks)}, expected 2-3 of -t 3's"
meta = {e["tid"] for e in t["traceEvents"] if e.get("ph") == "M" and e["name"] == "thread_name"}
assert tracks <= meta, "a track without a thread_name"
lines = [json.loads(l) for l in open(sys.argv[2]) if '"loss"' in l]
assert len(lines) == 2, f"{len(lines)} train log lines"
for l in lines:
    m = l["memory"]
    for cat in ["weights", "lora", "gradients", "optimizer", "activations", "temporary", "total", "rss"]:
        assert 0 <= m[cat]["current"] <= m[cat]["peak"] or cat == "rss", (cat, m[cat])
    assert m["weights"]["current"] > 1_000_000 and m["lora"]["current"] > 0 and m["activations"]["current"] > 0
    # AdamW: 8 B per trainable param (lora: its 4 B masters; gradients: one set per row-group worker)
    assert m["optimizer"]["current"] == 8 * m["lora"]["current"] // 4, m
print("trace and JSONL ok:", len(ev), "events,", len(tracks), "tracks")
PY
"$LATHE" train "$tmp/lora.yaml" --profile > /dev/null 2> "$tmp/err" && fail "--profile without a file accepted"
grep -q -- "--profile: expected an output FILE" "$tmp/err" || fail "--profile error not named: $(cat "$tmp/err")"
"$LATHE" train "$tmp/lora.yaml" --monitor=maybe > /dev/null 2> "$tmp/err" && fail "--monitor=maybe accepted"
grep -q -- "--monitor: expected" "$tmp/err" || fail "--monitor error not named: $(cat "$tmp/err")"
# `lathe serve --profile FILE`: a request's forward ops land in the trace written at shutdown. The
# prompt is long enough (~100 tokens) that its prefill matmuls go to the pool's workers (jobs under
# ThreadPool::kMinParallelWork run inline and leave no pool_chunk span).
"$LATHE" serve -m "$SHARED/models/stories260K/stories260K.gguf" --port 0 -t 2 --kv-cache-memory 16M \
  --profile "$tmp/serve_trace.json" > "$tmp/serve_out" 2> "$tmp/serve_err" &
spid=$!
port=""
for _ in $(seq 100); do
  port=$(sed -n 's|.*http://127.0.0.1:\([0-9]*\)/v1.*|\1|p' "$tmp/serve_out")
  [ -n "$port" ] && break
  sleep 0.1
done
if [ -z "$port" ]; then
  fail "lathe serve --profile did not start: $(cat "$tmp/serve_err")"
else
  python3 - "$port" <<'PY' || fail "completion request to the profiled server"
import json, sys, urllib.request
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/completions",
                             data=json.dumps({"prompt": "Once upon a time, " * 20, "max_tokens": 8, "temperature": 0}).encode(),
                             headers={"Content-Type": "application/json"})
r = json.load(urllib.request.urlopen(req, timeout=30))
assert r["usage"]["completion_tokens"] == 8, r
PY
fi
kill -INT "$spid" 2> /dev/null
wait "$spid" || fail "lathe serve --profile exited non-zero after SIGINT: $(cat "$tmp/serve_err")"
grep -q "^op .*calls .*share .*GFLOP/s .*GB/s" "$tmp/serve_err" || fail "serve printed no top-ops table"
python3 - "$tmp/serve_trace.json" <<'PY' || fails=$((fails + 1))
import json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X"]
names = {e["name"] for e in ev}
assert "pool_chunk" in names and len(names) >= 4, f"serve trace ops: {sorted(names)}"
assert any(e["args"].get("flops", 0) > 0 for e in ev), "no op with FLOPs in the serve trace"
print("serve trace ok:", len(ev), "events:", ", ".join(sorted(names)[:8]))
PY
[ "$fails" -eq 0 ] && echo "profile_test: all passed" || { echo "profile_test: $fails failed"; exit 1; }

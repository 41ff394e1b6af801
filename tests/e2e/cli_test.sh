#!/usr/bin/env bash
# End-to-end tests of the lathe CLI as a user runs it: generate/tokenize/info/eval/chat on
# stories260K (against the llama2.c reference) and SmolLM2, and clear errors on bad input.
set -uo pipefail
LATHE="${LATHE_BIN:?}"
SHARED="${LATHE_SHARED:?}"
STORIES="$SHARED/models/stories260K"
REF="$STORIES/reference/stories260K_reference.json"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
pass=0
check() {  # check NAME COMMAND...
  local name="$1"; shift
  if "$@"; then pass=$((pass + 1)); else echo "FAIL: $name"; fails=$((fails + 1)); fi
}

# 1. Greedy 200 tokens from BOS equal the llama2.c reference, from both the .bin and the .gguf.
for model in "$STORIES/stories260K.bin" "$STORIES/stories260K.gguf"; do
  "$LATHE" generate -m "$model" -p "" -n 200 --temp 0 --ignore-eos --json > "$tmp/gen.json" 2>"$tmp/err"
  check "generate exit ($model)" test $? -eq 0
  check "greedy ids+text ($model)" python3 - "$tmp/gen.json" "$REF" <<'PY'
import json, sys
out = json.loads(open(sys.argv[1]).read())
ref = json.load(open(sys.argv[2]))["greedy_from_bos"]
assert out["prompt_ids"] == [1], out["prompt_ids"]
assert out["ids"] == ref["tokens"][1:], (out["ids"][:20], ref["tokens"][1:21])
assert out["text"] == ref["text"], (out["text"][:80], ref["text"][:80])
PY
done

# 2. A prompt continues as in the reference.
"$LATHE" generate -m "$STORIES/stories260K.gguf" -p "Once upon a time" -n 48 --temp 0 --ignore-eos --json > "$tmp/p.json"
check "prompt continuation" python3 - "$tmp/p.json" "$REF" <<'PY'
import json, sys
out = json.loads(open(sys.argv[1]).read())
ref = [p for p in json.load(open(sys.argv[2]))["greedy_prompts"] if p["prompt"] == "Once upon a time"][0]
assert out["prompt_ids"] == ref["prompt_ids_with_bos"], out["prompt_ids"]
assert out["prompt_ids"] + out["ids"] == ref["tokens"], (out["ids"], ref["tokens"])
PY

# 3. tokenize --json, with and without BOS.
check "tokenize" test "$("$LATHE" tokenize --tokenizer "$STORIES/tok512.model" --json "Once upon a time")" = '{"ids": [1, 403, 407, 261, 378]}'
check "tokenize --no-bos" test "$("$LATHE" tokenize -m "$STORIES/stories260K.gguf" --no-bos --json "Once upon a time")" = '{"ids": [403, 407, 261, 378]}'

# 4. eval reproduces the reference NLL.
"$LATHE" eval -m "$STORIES/stories260K.gguf" --text "$SHARED/data/tinystories/validation_100.txt" --json > "$tmp/eval.json"
check "eval nll" python3 -c "
import json; r = json.load(open('$tmp/eval.json')); assert abs(r['mean_nll'] - 1.3196398797561912) < 5e-4, r"
# A bf16 KV cache scores the same documents a little worse than the exact one, not differently by much.
"$LATHE" eval -m "$STORIES/stories260K.gguf" --text "$SHARED/data/tinystories/validation_100.txt" --max-docs 20 \
  --json > "$tmp/eval20.json"
"$LATHE" eval -m "$STORIES/stories260K.gguf" --text "$SHARED/data/tinystories/validation_100.txt" --max-docs 20 \
  --kv-cache-dtype bf16 --json > "$tmp/eval20-bf16.json"
check "eval bf16 kv" python3 -c "
import json; a, b = (json.load(open(f)) for f in ('$tmp/eval20.json', '$tmp/eval20-bf16.json'))
assert a['tokens'] == b['tokens'] and a['mean_nll'] != b['mean_nll'] and abs(a['mean_nll'] - b['mean_nll']) < 0.01, (a, b)"
"$LATHE" eval -m "$STORIES/stories260K.gguf" --text "$SHARED/data/tinystories/validation_100.txt" \
  --kv-cache-dtype fp8 > /dev/null 2> "$tmp/err"; rc=$?
check "eval bad kv dtype" bash -c "[ $rc -eq 1 ] && grep -q -- \"--kv-cache-dtype 'fp8': expected auto, f32, f16 or bf16\" '$tmp/err'"

# 4b. --profile writes a Chrome trace Perfetto can open (JSON with X events, shapes, FLOPs).
"$LATHE" generate -m "$STORIES/stories260K.gguf" -p "Once" -n 8 --temp 0 --profile "$tmp/trace.json" > /dev/null 2> "$tmp/prof.txt"
check "profile trace" python3 - "$tmp/trace.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))["traceEvents"]
names = {e["name"] for e in t if e["ph"] == "X"}
assert {"matmul_q", "attention", "matmul_head", "rmsnorm"} <= names, names
q = [e for e in t if e["name"] == "matmul_q"][0]
assert q["args"]["flops"] > 0 and "x [64, 64] f32" in q["args"]["shape"], q
PY
check "profile table" grep -q "GFLOP/s" "$tmp/prof.txt"

# 5. info names the architecture.
check "info" bash -c "'$LATHE' info '$STORIES/stories260K.gguf' | grep -q 'llama: 5 layers, dim 64, heads 8/4'"

# 5b. estimate: the familiar figures, JSON for machines, and a config read from a model file.
"$LATHE" estimate --params 7B --inference --dtype f16 --kv-tokens 1 --json > "$tmp/est.json"
check "estimate 7B f16 = 14 GB" python3 -c "
import json; r = json.load(open('$tmp/est.json'))
w = [l for l in r['lines'] if l['category'] == 'weights'][0]['bytes']; assert abs(w - 14e9) < 1e7, w"
# The KV cache as the commands take it by default (auto: f16 for f16 weights, bf16 for bf16): 7B = 32 layers x
# 2 x 4096 x 2 bytes per token.
check "estimate KV auto" python3 -c "
import json; r = json.load(open('$tmp/est.json'))
kv = [l for l in r['lines'] if l['category'] == 'kv_cache'][0]['bytes']; assert kv == 32 * 2 * 4096 * 2, kv"
check "estimate from gguf" bash -c "'$LATHE' estimate '$STORIES/stories260K.gguf' --method full --precision fp32 | grep -q 'total'"
"$LATHE" estimate --arch llama-7b --optim adam > /dev/null 2>"$tmp/err"; rc=$?
check "estimate bad optimizer" bash -c "[ $rc -eq 1 ] && grep -q \"did you mean 'adamw'\" '$tmp/err'"

# 5c. estimate --lathe from a model file plans what `lathe train` plans for the same run (the weights as stored:
# dtypes and bytes; a QLoRA base packed on load), given train's measured baseline.
for method in lora qlora; do
  cat > "$tmp/est_$method.yaml" <<EOF
model_name_or_path: $STORIES/stories260K.gguf
stage: sft
finetuning_type: lora
lora_rank: 8
dataset: alpaca_en_demo
dataset_dir: $SHARED/data/llamafactory
template: alpaca
cutoff_len: 32
max_samples: 16
per_device_train_batch_size: 4
max_steps: 1
bf16: true
output_dir: $tmp/est_out_$method
save_steps: 1000
report_to: none
EOF
  [ "$method" = qlora ] && echo "quantization_bit: 4" >> "$tmp/est_$method.yaml"
  "$LATHE" train "$tmp/est_$method.yaml" -t 2 > /dev/null 2>"$tmp/est_train.log"
  plan=$(grep -o 'plan [0-9.]* MiB ([0-9]* B)' "$tmp/est_train.log" | grep -o '([0-9]*' | tr -d '(')
  base=$(grep -m1 'baseline .*measured' "$tmp/est_train.log" | awk '{print $2}')
  LATHE_THREADS=2 "$LATHE" estimate "$STORIES/stories260K.gguf" --lathe --method $method --precision bf16 --batch 4 \
    --seq 32 --lora-rank 8 --baseline-mb "$base" --json > "$tmp/est_l.json" 2>"$tmp/err"
  check "estimate --lathe = train's plan ($method)" python3 -c "
import json, sys; est = json.load(open('$tmp/est_l.json'))['total_device_bytes']; plan = float('${plan:-0}')
ok = plan > 0 and abs(est / plan - 1) < 0.02
print('estimate', est, 'plan', plan) if not ok else None; sys.exit(0 if ok else 1)"
done

# Structured output from the CLI: a JSON schema (stories260K writes stories, not JSON: the grammar alone makes this
# an object with the schema's members, which Python's json reads) and a GBNF file; bad schemas are refused by name.
"$LATHE" generate -m "$STORIES/stories260K.gguf" -p "Once upon a time" -n 200 --temp 0.8 --seed 3 --json \
  --json-schema '{"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"},
  "happy": {"type": "boolean"}}, "required": ["name", "age", "happy"]}' > "$tmp/schema.json" 2> "$tmp/err"
check "generate --json-schema" python3 -c "
import json; r = json.load(open('$tmp/schema.json')); o = json.loads(r['text'])
assert r['finish_reason'] == 'stop' and list(o) == ['name', 'age', 'happy'], r
assert isinstance(o['name'], str) and len(o['name']) <= 12 and isinstance(o['age'], int) and isinstance(o['happy'], bool), o"
printf 'root ::= ("yes" | "no") "!" [0-9]{2}\n' > "$tmp/yn.gbnf"
"$LATHE" generate -m "$STORIES/stories260K.gguf" -p "Once" -n 20 --temp 1 --seed 5 --grammar-file "$tmp/yn.gbnf" --json > "$tmp/yn.json"
check "generate --grammar-file" python3 -c "
import json, re; r = json.load(open('$tmp/yn.json')); assert re.fullmatch(r'(yes|no)![0-9]{2}', r['text']), r"
"$LATHE" generate -m "$STORIES/stories260K.gguf" -p "x" --json-schema '{"type": "integer", "multipleOf": 2}' > /dev/null 2>"$tmp/err"; rc=$?
check "unsupported schema keyword" bash -c "[ $rc -eq 1 ] && grep -qF -e \"--json-schema: JSON schema \\$: 'multipleOf' is not supported\" '$tmp/err'"
"$LATHE" generate -m "$STORIES/stories260K.gguf" -p "Once" -n 30 --temp 1 --seed 7 --json-schema '{"type": "integer", "minimum": -40, "maximum": 120}' --json > "$tmp/int.json"
check "generate --json-schema integer bounds" python3 -c "
import json; r = json.load(open('$tmp/int.json')); assert -40 <= json.loads(r['text']) <= 120, r"
"$LATHE" generate -m "$STORIES/stories260K.gguf" -p "Once" -n 30 --temp 1 --seed 8 --regex '(red|blue) [0-9]{2}' --json > "$tmp/re.json"
check "generate --regex" python3 -c "
import json, re; r = json.load(open('$tmp/re.json')); assert re.fullmatch(r'(red|blue) [0-9]{2}', r['text']), r"
"$LATHE" generate -m "$STORIES/stories260K.gguf" -p "x" --regex '(a)\1' > /dev/null 2>"$tmp/err"; rc=$?
check "--regex backreference refused" bash -c "[ $rc -eq 1 ] && grep -qF -e '--regex: regex at offset 3: backreferences are not supported' '$tmp/err'"
printf 'root ::= missing\n' > "$tmp/bad.gbnf"
"$LATHE" generate -m "$STORIES/stories260K.gguf" -p "x" --grammar-file "$tmp/bad.gbnf" > /dev/null 2>"$tmp/err"; rc=$?
check "bad grammar file" bash -c "[ $rc -eq 1 ] && grep -q \"bad.gbnf: grammar: rule 'missing' is used (line 1, column 10) but not defined\" '$tmp/err'"

# 6. Errors are clear and name the culprit; nothing crashes.
"$LATHE" generate -m /nonexistent.gguf -p hi > /dev/null 2>"$tmp/err"; rc=$?
check "missing model rc" test $rc -eq 1
check "missing model message" grep -q "/nonexistent.gguf" "$tmp/err"
head -c 3000 "$STORIES/stories260K.gguf" > "$tmp/trunc.gguf"
"$LATHE" info "$tmp/trunc.gguf" > /dev/null 2>"$tmp/err"; rc=$?
check "truncated gguf rc" test $rc -eq 1
check "truncated gguf message" grep -q "trunc.gguf.*offset" "$tmp/err"
"$LATHE" generate -m "$STORIES/stories260K.gguf" --temperature 0 > /dev/null 2>"$tmp/err"; rc=$?
check "unknown flag rc" test $rc -eq 1
check "unknown flag suggestion" grep -q "did you mean '--temp'" "$tmp/err"
"$LATHE" generate -m "$STORIES/stories260K.gguf" --top-p 0 > /dev/null 2>"$tmp/err"; rc=$?
check "bad value" grep -q "top_p" "$tmp/err"
"$LATHE" generate -m "$STORIES/stories260K.gguf" --kv-cache-dtype q8_0 > /dev/null 2>"$tmp/err"; rc=$?
check "bad kv cache dtype" bash -c "[ $rc -eq 1 ] && grep -q -- \"--kv-cache-dtype 'q8_0': expected auto, f32, f16 or bf16\" '$tmp/err'"
# The KV cache's default element type (auto): f32 for an f32 model, f16 for a quantized one; a flag overrides.
"$LATHE" convert "$STORIES/stories260K.gguf" --dtype q8_0 -o "$tmp/stories-q8.gguf" > /dev/null
"$LATHE" bench -m "$STORIES/stories260K.gguf" -m "$tmp/stories-q8.gguf" --prompt-tokens 8 --gen-tokens 4 \
  --threads-list 1 -r 1 > "$tmp/bench.out" 2>&1
check "bench kv auto f32" grep -q "stories260K.gguf (f32 KV) | 1 |" "$tmp/bench.out"
check "bench kv auto f16" grep -q "stories-q8.gguf (f16 KV) | 1 |" "$tmp/bench.out"
"$LATHE" bench -m "$tmp/stories-q8.gguf" --prompt-tokens 8 --gen-tokens 4 --threads-list 1 -r 1 \
  --kv-cache-dtype bf16 > "$tmp/bench.out" 2>&1
check "bench kv flag" grep -q "stories-q8.gguf (bf16 KV) | 1 |" "$tmp/bench.out"
# --int8-prompt: the prompt rows of the quantized model on int8 activations score the documents differently,
# by int8's rounding only.
for f in "" --int8-prompt; do
  "$LATHE" eval -m "$tmp/stories-q8.gguf" --text "$SHARED/data/tinystories/validation_100.txt" --max-docs 20 $f \
    --json > "$tmp/eval-q8$f.json"
done
check "eval int8 prompt" python3 -c "
import json; a, b = (json.load(open(f)) for f in ('$tmp/eval-q8.json', '$tmp/eval-q8--int8-prompt.json'))
assert a['tokens'] == b['tokens'] and a['mean_nll'] != b['mean_nll'] and abs(a['mean_nll'] - b['mean_nll']) < 0.005, (a, b)"

# 7. SmolLM2 answers a question (greedy), and chat keeps history across turns.
if [ -n "${LATHE_SMOLLM2:-}" ] && [ -f "$LATHE_SMOLLM2" ]; then
  "$LATHE" generate -m "$LATHE_SMOLLM2" --chat -p "What is the capital of France?" -n 48 --temp 0 --json > "$tmp/smol.json"
  check "smollm2 answers" python3 -c "
import json; r = json.load(open('$tmp/smol.json')); assert 'Paris' in r['text'], r['text']; assert r['finish_reason'] == 'stop', r"
  # With a 16-bit KV cache (half the cache's memory) the answer holds.
  for kv in f16 bf16; do
    "$LATHE" generate -m "$LATHE_SMOLLM2" --chat -p "What is the capital of France?" -n 48 --temp 0 --kv-cache-dtype $kv --json > "$tmp/smol-$kv.json"
    check "smollm2 answers ($kv KV cache)" python3 -c "
import json; r = json.load(open('$tmp/smol-$kv.json')); assert 'Paris' in r['text'], r['text']"
  done
  printf 'What is the capital of France?\nAnd what is the capital of Germany?\n' |
    "$LATHE" chat -m "$LATHE_SMOLLM2" --temp 0 -n 40 --verbose > "$tmp/chat.txt" 2> "$tmp/chat.err"
  check "chat answers both turns" bash -c "head -1 '$tmp/chat.txt' | grep -q Paris && sed -n 2p '$tmp/chat.txt' | grep -q Berlin"
  # Turn 2's prompt holds turn 1 (history) and reuses its cached tokens.
  check "chat keeps history" python3 - "$tmp/chat.err" <<'PY'
import re, sys
turns = [tuple(map(int, m)) for m in re.findall(r"prompt (\d+) tokens, (\d+) reused", open(sys.argv[1]).read())]
assert len(turns) == 2, turns
(p1, r1), (p2, r2) = turns
assert r1 == 0 and p2 > p1 + 10 and r2 >= p1, turns
PY
  # 7b. quantize as llama-quantize does: it refuses to re-quantize the shipped 4-bit weights (the
  # output is not written), and a Q5_K_M made from an f16 copy still answers (its Q6_K answers
  # "L'Étoile", exactly as llama-quantize's Q6_K of that copy: the 135M model is that fragile). Checked
  # with --exact-activations: this is the quantizer's check, and the first token is a near tie ("The" /
  # "La") that bf16 prompt rows (avx512_bf16 CPUs) flip here although they move the mean NLL on 40
  # TinyStories documents by 6e-5 nats (Q5_K_M's own cost vs f16: 0.076; bench/RESULTS.md).
  "$LATHE" convert "$LATHE_SMOLLM2" --dtype f16 -o "$tmp/smol-f16.gguf" > /dev/null
  "$LATHE" quantize "$LATHE_SMOLLM2" "$tmp/requant.gguf" q4_k_m > /dev/null 2> "$tmp/requant.err"
  rc=$?
  check "quantize refuses requantizing" bash -c "[ $rc -ne 0 ] && grep -q -- --allow-requantize '$tmp/requant.err' && [ ! -e '$tmp/requant.gguf' ]"
  "$LATHE" quantize "$tmp/smol-f16.gguf" "$tmp/smol-q5km.gguf" Q5_K_M 2 > /dev/null
  check "quantize q5_k_m" test $? -eq 0
  "$LATHE" generate -m "$tmp/smol-q5km.gguf" --chat -p "What is the capital of France?" -n 24 --temp 0 --exact-activations --json > "$tmp/q5km.json"
  check "q5_k_m answers" python3 -c "
import json; r = json.load(open('$tmp/q5km.json')); assert 'Paris' in r['text'], r['text']"
elif [ "${LATHE_REQUIRE_ALL:-0}" = 1 ]; then
  echo "FAIL: LATHE_SMOLLM2 not set or missing"; fails=$((fails + 1))
fi

echo "cli e2e: $pass passed, $fails failed"
[ "$fails" -eq 0 ]

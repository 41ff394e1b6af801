#!/usr/bin/env bash
# End-to-end tests of `lathe train` as a user runs it: a stories260K LoRA run lowers the eval loss
# and writes a PEFT adapter `lathe generate --adapter` applies, with HF's trainer_state.json,
# checkpoint rotation, the JSONL log and TensorBoard events; a full fine-tune writes an HF model
# dir `lathe generate -m DIR` loads (tokenizer copied in); bad keys and values are named.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/train_e2e_lib.sh"

cat > "$tmp/lora.yaml" <<YAML
model_name_or_path: $STORIES/stories260K.gguf
stage: sft
finetuning_type: lora
lora_rank: 8
lora_target: all
dataset: alpaca_en_demo
dataset_dir: $DATA
template: alpaca
cutoff_len: 128
max_samples: 136
val_size: 16
output_dir: $tmp/lora
logging_steps: 5
save_steps: 15
save_total_limit: 1
report_to: tensorboard
per_device_train_batch_size: 4
gradient_accumulation_steps: 2
learning_rate: 1.0e-2
max_steps: 30
lr_scheduler_type: cosine
warmup_steps: 3
per_device_eval_batch_size: 8
eval_strategy: steps
eval_steps: 10
YAML

# 1. LoRA on stories260K: eval loss falls, outputs in HF/LLaMA-Factory shapes.
start=$(date +%s)
"$LATHE" train "$tmp/lora.yaml" -t 2 2> "$tmp/lora.log"
check "lora train exit" test $? -eq 0
echo "lora run: $(( $(date +%s) - start )) s"
check "no carriage returns when stderr is not a terminal" bash -c "! grep -q $'\r' '$tmp/lora.log'"
check "lora outputs" python3 - "$tmp/lora" <<'PY'
import json, os, sys
d = sys.argv[1]
for f in ["adapter_config.json", "adapter_model.safetensors", "trainer_state.json", "all_results.json",
          "train_results.json", "eval_results.json", "trainer_log.jsonl"]:
    assert os.path.isfile(os.path.join(d, f)), f
# save_steps 15, limit 1: checkpoint-15 rotated away, checkpoint-30 complete, no temp dirs left.
names = sorted(os.listdir(d))
assert "checkpoint-30" in names and "checkpoint-15" not in names, names
assert not [n for n in names if n.startswith(".checkpoint")], names
for f in ["adapter_config.json", "adapter_model.safetensors", "trainer_state.json"]:
    assert os.path.isfile(os.path.join(d, "checkpoint-30", f)), f
cfg = json.load(open(os.path.join(d, "adapter_config.json")))
assert cfg["peft_type"] == "LORA" and cfg["r"] == 8 and cfg["lora_alpha"] == 16, cfg
st = json.load(open(os.path.join(d, "trainer_state.json")))
assert st["global_step"] == 30 and st["max_steps"] == 30 and st["logging_steps"] == 5, st
assert st["train_batch_size"] == 4 and st["best_metric"] is None and st["total_flos"] > 0, st
train = [e for e in st["log_history"] if "loss" in e]
evals = [e for e in st["log_history"] if "eval_loss" in e]
assert [e["step"] for e in train] == [5, 10, 15, 20, 25, 30], train
assert all({"epoch", "learning_rate", "grad_norm"} <= e.keys() for e in train), train
assert [e["step"] for e in evals] == [10, 20, 30], evals
first, last = evals[0]["eval_loss"], evals[-1]["eval_loss"]
assert last < first - 0.05, (first, last)
assert "train_loss" in st["log_history"][-1], st["log_history"][-1]
res = json.load(open(os.path.join(d, "all_results.json")))
assert abs(res["eval_loss"] - last) < 1e-12 and res["train_runtime"] > 0 and "train_samples_per_second" in res, res
lines = [json.loads(l) for l in open(os.path.join(d, "trainer_log.jsonl"))]
tl = [l for l in lines if "loss" in l]
assert len(tl) == 6 and all({"step", "epoch", "lr", "grad_norm", "tokens_per_s", "rss_bytes"} <= l.keys() for l in tl), tl
assert all(l["tokens_per_s"] > 0 and l["rss_bytes"] > 0 for l in tl), tl
print(f"lora eval_loss {first:.4f} -> {last:.4f}")
PY
# TensorBoard events under runs/<date>_<host>/ with HF's tag names.
ev=$(find "$tmp/lora/runs" -name 'events.out.tfevents.*' | head -1)
check "tensorboard events" test -n "$ev"
for tag in train/loss train/learning_rate train/grad_norm eval/loss; do
  check "tensorboard tag $tag" grep -qa "$tag" "$ev"
done

# TensorBoard's own reader sees the scalars (tensorboard from PyPI in a cached venv; this check
# is skipped, with a message, only when PyPI cannot be reached).
tbvenv="${XDG_CACHE_HOME:-$HOME/.cache}/lathe/tb-venv"
. "$(dirname "${BASH_SOURCE[0]}")/../pip_venv.sh"
tb_check="import sys, tensorboard; sys.exit(tensorboard.__version__ != '2.18.0')"
if lathe_pip_venv_install "$tbvenv" "$tb_check" tensorboard==2.18.0 > "$tmp/pip.log" 2>&1; then
  check "tensorboard reads the run" "$tbvenv/bin/python" - "$tmp/lora/runs" <<'PY'
import glob, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
runs = glob.glob(sys.argv[1] + "/*")
assert len(runs) == 1, runs
acc = EventAccumulator(runs[0])
acc.Reload()
tags = set(acc.Tags()["scalars"])
assert {"train/loss", "train/learning_rate", "train/grad_norm", "eval/loss"} <= tags, tags
assert [s.step for s in acc.Scalars("train/loss")] == [5, 10, 15, 20, 25, 30]
ev = acc.Scalars("eval/loss")
assert [s.step for s in ev] == [10, 20, 30] and ev[-1].value < ev[0].value, ev
mem = {c: acc.Scalars("memory/" + c) for c in
       ["weights", "lora", "gradients", "optimizer", "activations", "temporary", "rss", "peak_rss"]}
assert all([s.step for s in v] == [5, 10, 15, 20, 25, 30] for v in mem.values()), mem
assert mem["weights"][0].value > 1e6 and mem["optimizer"][-1].value == 2 * mem["lora"][-1].value, mem
assert all(s.value >= r.value * 0.9 for s, r in zip(mem["peak_rss"], mem["rss"])), mem
PY
else
  echo "SKIP: tensorboard reader check (could not install tensorboard from PyPI: $(tail -1 "$tmp/pip.log"))"
fi

# 2. The adapter loads into generate and changes its output.
"$LATHE" generate -m "$STORIES/stories260K.gguf" -p "Once upon a time" -n 24 --temp 0 --json > "$tmp/base.json"
"$LATHE" generate -m "$STORIES/stories260K.gguf" --adapter "$tmp/lora" -p "Once upon a time" -n 24 --temp 0 --json \
  > "$tmp/adapted.json" 2> "$tmp/gen.err"
check "generate --adapter exit" test $? -eq 0
check "adapter changes the output" python3 -c "
import json; a = json.load(open('$tmp/base.json')); b = json.load(open('$tmp/adapted.json'))
assert a['ids'] != b['ids'], (a['ids'], b['ids'])"

# 2b. `lathe merge` folds the adapter into the GGUF: the merged file alone continues as the base with the adapter.
"$LATHE" merge -m "$STORIES/stories260K.gguf" --adapter "$tmp/lora" -o "$tmp/merged.gguf" > "$tmp/merge.out" 2>&1
check "merge exit" test $? -eq 0
check "merge reports the merged weights" grep -q "35 linear weights merged" "$tmp/merge.out"
"$LATHE" generate -m "$tmp/merged.gguf" -p "Once upon a time" -n 24 --temp 0 --json > "$tmp/merged.json"
check "merged GGUF generates as base + adapter" cmp -s "$tmp/merged.json" "$tmp/adapted.json"
# The same through LLaMA-Factory's export config (examples/stories260k_lora_export.yaml, paths overridden).
"$LATHE" export "${LATHE_SOURCE:?}/examples/stories260k_lora_export.yaml" --model_name_or_path "$STORIES/stories260K.gguf" \
  --adapter_name_or_path "$tmp/lora" --export_dir "$tmp/exported" > /dev/null 2> "$tmp/export.err"
check "export exit" test $? -eq 0
"$LATHE" generate -m "$tmp/exported/model.gguf" -p "Once upon a time" -n 24 --temp 0 --json > "$tmp/exported.json"
check "exported GGUF generates as base + adapter" cmp -s "$tmp/exported.json" "$tmp/adapted.json"
expect_error "export names a misspelt key" "did you mean 'export_size'" "$LATHE" export \
  "${LATHE_SOURCE:?}/examples/stories260k_lora_export.yaml" --export_sise 2

# 2c. adapter_name_or_path continues that adapter with its own rank and modules (lora_rank 4 here is overridden by
# the adapter's 8): with learning_rate 0 one step leaves it as it was, so the saved adapter is the same file.
"$LATHE" train "$tmp/lora.yaml" --adapter_name_or_path "$tmp/lora" --lora_rank 4 --learning_rate 0 --max_steps 1 \
  --output_dir "$tmp/continued" --save_steps 100 --report_to none > /dev/null 2> "$tmp/continued.log"
check "continue an adapter exit" test $? -eq 0
check "continuing is logged with the adapter's rank" grep -q "adapter: continuing .* (r 8, alpha" "$tmp/continued.log"
check "an unchanged continued adapter is the same file" cmp -s "$tmp/continued/adapter_model.safetensors" \
  "$tmp/lora/adapter_model.safetensors"
expect_error "continuing needs finetuning_type lora" "continuing an adapter is LoRA training" "$LATHE" train \
  "$tmp/lora.yaml" --adapter_name_or_path "$tmp/lora" --finetuning_type full --output_dir "$tmp/x"

# 3. Full fine-tuning (pt) writes an HF model dir with the tokenizer given by --tokenizer.
cat > "$tmp/full.yaml" <<YAML
model_name_or_path: $STORIES/stories260K.gguf
stage: pt
finetuning_type: full
dataset: c4_demo
dataset_dir: $DATA
cutoff_len: 64
max_samples: 12
output_dir: $tmp/full
logging_steps: 2
save_steps: 100
per_device_train_batch_size: 4
learning_rate: 1.0e-3
max_steps: 6
YAML
"$LATHE" train "$tmp/full.yaml" -t 2 --tokenizer "$STORIES/tok512.model" 2> "$tmp/full.log"
check "full train exit" test $? -eq 0
for f in config.json generation_config.json model.safetensors tokenizer.model trainer_state.json; do
  check "full output $f" test -f "$tmp/full/$f"
done
"$LATHE" generate -m "$tmp/full" -p "Once upon a time" -n 16 --temp 0 --json > "$tmp/full_gen.json" 2> "$tmp/full_gen.err"
check "generate -m full-FT dir" test $? -eq 0
check "full-FT dir generates tokens" python3 -c "
import json; r = json.load(open('$tmp/full_gen.json')); assert len(r['ids']) > 0 and r['prompt_ids'][0] == 1, r"

# 3b. An HF directory as the source (the full-FT output above): LoRA on it, evaluated on a separate
# eval_dataset, copies its tokenizer files beside the adapter, and the adapter loads on that base.
"$LATHE" train "$tmp/full.yaml" -t 2 --model_name_or_path "$tmp/full" --output_dir "$tmp/hf_lora" \
  --finetuning_type lora --max_steps 4 --eval_dataset c4_demo --max_samples 8 2> "$tmp/hf_lora.log"
check "lora on an HF dir exit" test $? -eq 0
check "tokenizer copied from the HF source" test -f "$tmp/hf_lora/tokenizer.model"
check "eval_dataset evaluated" grep -q '"eval_loss"' "$tmp/hf_lora/all_results.json"
"$LATHE" generate -m "$tmp/full" --adapter "$tmp/hf_lora" -p "Once" -n 4 --temp 0 > /dev/null 2> "$tmp/hf_gen.err"
check "generate with the adapter on the HF base" test $? -eq 0
# The same adapter merged into that HF dir: a folder with the tokenizer, generating as base + adapter.
"$LATHE" generate -m "$tmp/full" --adapter "$tmp/hf_lora" -p "Once upon a time" -n 16 --temp 0 --json \
  > "$tmp/hf_adapted.json" 2> /dev/null
"$LATHE" merge -m "$tmp/full" --adapter "$tmp/hf_lora" -o "$tmp/hf_merged" > /dev/null 2> "$tmp/hf_merge.err"
check "merge into an HF dir exit" test $? -eq 0
check "merged HF dir has the tokenizer" test -f "$tmp/hf_merged/tokenizer.model"
"$LATHE" generate -m "$tmp/hf_merged" -p "Once upon a time" -n 16 --temp 0 --json > "$tmp/hf_merged.json"
check "merged HF dir generates as base + adapter" cmp -s "$tmp/hf_merged.json" "$tmp/hf_adapted.json"

# 3c. Qwen3 (q/k norms) as a LLaMA-Factory user configures it: `template: qwen3` and `enable_thinking` on the
# committed random Qwen3 HF dir (its tokenizer.json: 256 bytes, no BOS). The adapter changes generate's output and
# merges into an HF dir that generates as base + adapter; eval scores the dir without a BOS.
QWEN3="${LATHE_SOURCE:?}/tests/golden/fixtures/qwen3/model"
"$LATHE" train "$tmp/lora.yaml" -t 2 --model_name_or_path "$QWEN3" --template qwen3 --enable_thinking false \
  --dataset identity --max_samples 16 --val_size 0 --eval_strategy no --max_steps 6 --save_steps 100 \
  --report_to none --learning_rate 5.0e-2 --logging_steps 1 --output_dir "$tmp/qwen3_lora" 2> "$tmp/qwen3.log"
check "qwen3 lora exit" test $? -eq 0
check "qwen3 lora loss falls" python3 - "$tmp/qwen3_lora/trainer_state.json" <<'PY'
import json, sys
losses = [e["loss"] for e in json.load(open(sys.argv[1]))["log_history"] if "loss" in e]
assert len(losses) == 6 and sum(losses[-3:]) / 3 < losses[0], losses  # one sample a step: compare a mean
PY
"$LATHE" generate -m "$QWEN3" -p "Hello" -n 12 --temp 0 --json > "$tmp/q3_base.json" 2> /dev/null
"$LATHE" generate -m "$QWEN3" --adapter "$tmp/qwen3_lora" -p "Hello" -n 12 --temp 0 --json > "$tmp/q3_adapted.json" \
  2> "$tmp/q3_gen.err"
check "qwen3 generate --adapter exit" test $? -eq 0
check "qwen3 adapter changes the output" bash -c "! cmp -s '$tmp/q3_base.json' '$tmp/q3_adapted.json'"
"$LATHE" merge -m "$QWEN3" --adapter "$tmp/qwen3_lora" -o "$tmp/q3_merged" > /dev/null 2> "$tmp/q3_merge.err"
check "qwen3 merge exit" test $? -eq 0
"$LATHE" generate -m "$tmp/q3_merged" -p "Hello" -n 12 --temp 0 --json > "$tmp/q3_merged.json" 2> /dev/null
check "qwen3 merged dir generates as base + adapter" cmp -s "$tmp/q3_merged.json" "$tmp/q3_adapted.json"
printf 'Once upon a time there was a cat.' > "$tmp/q3_doc.txt"
check "qwen3 eval without BOS" "$LATHE" eval -m "$QWEN3" --text "$tmp/q3_doc.txt"
expect_error "an unknown LLaMA-Factory template is named with the list" "qwen3_nothink" "$LATHE" train \
  "$tmp/lora.yaml" --template qwen2_vl --output_dir "$tmp/o11"

# 4. Errors name the key (and a nearby valid one), before any work.
expect_error "unknown key on the command line" "lerning_rate" "$LATHE" train "$tmp/full.yaml" --lerning_rate 1e-3
expect_error "suggestion" "did you mean 'learning_rate'" "$LATHE" train "$tmp/full.yaml" --lerning_rate 1e-3
printf 'model_name_or_path: x\nper_device_train_batchsize: 2\n' > "$tmp/bad.yaml"
expect_error "unknown key in YAML" "per_device_train_batchsize" "$LATHE" train "$tmp/bad.yaml"
expect_error "bad value" "key 'max_steps'" "$LATHE" train "$tmp/full.yaml" --max_steps many
expect_error "unknown optimizer" "key 'optim': 'adamw_9bit' is not one of" \
  "$LATHE" train "$tmp/full.yaml" --optim adamw_9bit --output_dir "$tmp/o8"
"$LATHE" train "$tmp/lora.yaml" -t 2 --optim paged_adamw_8bit --optim_resident_mb 0 --max_steps 4 \
  --eval_strategy no --val_size 0 --report_to none --output_dir "$tmp/paged8" 2> "$tmp/paged8.log"
check "paged 8-bit AdamW run" test -s "$tmp/paged8/adapter_model.safetensors"
expect_error "non-empty output_dir" "overwrite_output_dir" "$LATHE" train "$tmp/full.yaml"
expect_error "lora_target" "key 'lora_target'" "$LATHE" train "$tmp/lora.yaml" --lora_target q_proj,qkv_proj \
  --output_dir "$tmp/o9"
expect_error "missing model" "key 'model_name_or_path'" "$LATHE" train "$tmp/full.yaml" \
  --model_name_or_path "$tmp/nope.gguf" --output_dir "$tmp/o10"
"$LATHE" train --help > "$tmp/help.txt"
check "help lists keys" grep -q "gradient_accumulation_steps" "$tmp/help.txt"

echo "train e2e: $pass passed, $fails failed"
test $fails -eq 0

#!/usr/bin/env bash
# QLoRA accuracy on a real model: SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized per weight and
# re-packed to NF4+DQ / int8 on load) fine-tuned with LoRA r16 on all linears, bf16 LoRA vs QLoRA,
# same data, seed and steps; prints each run's eval loss on a held-out split and the gap.
# Takes minutes per run (not a CI test; results in bench/RESULTS.md).
# Usage: bench/qlora_accuracy.sh [--steps 30] [--threads 2] [--runs lora,nf4,int8] [--parallel]
# Env: LATHE (default build/lathe), MODEL (default: scripts/fetch-models.sh's cached GGUF).
set -euo pipefail
cd "$(dirname "$0")/.."
LATHE=${LATHE:-build/lathe}
steps=30 threads=2 runs=lora,nf4 parallel=0
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --parallel) parallel=1; shift ;;
    *) echo "qlora_accuracy.sh: unknown argument '$1' (expected --steps N, --threads N, --runs lora,nf4,int8, --parallel)" >&2; exit 2 ;;
  esac
done
MODEL=${MODEL:-$(bash scripts/fetch-models.sh)}
DATA=${DATA:-$(cd .. && pwd)/shared/data/llamafactory}
[ -f "$DATA/alpaca_en_demo.json" ] || { echo "qlora_accuracy.sh: $DATA/alpaca_en_demo.json not found (set DATA)" >&2; exit 2; }
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
cat > "$out/run.yaml" <<YAML
model_name_or_path: $MODEL
stage: sft
finetuning_type: lora
lora_rank: 16
lora_alpha: 32
lora_target: all
dataset: alpaca_en_demo
dataset_dir: $DATA
template: chatml
cutoff_len: 128
max_samples: 256
val_size: 16
logging_steps: 5
save_steps: 100000
per_device_train_batch_size: 2
gradient_accumulation_steps: 2
learning_rate: 2.0e-4
max_steps: $steps
lr_scheduler_type: cosine
warmup_steps: 3
per_device_eval_batch_size: 8
bf16: true
seed: 42
YAML
echo "== $LATHE train (model $MODEL, $steps steps of 2 x 2 samples, cutoff_len 128, 16 eval samples), out $out"
run() {  # name, extra flags
  local name=$1; shift
  /usr/bin/time -f "%e s wall, %M KB peak RSS" "$LATHE" train "$out/run.yaml" --output_dir "$out/$name" \
    -t "$threads" "$@" > /dev/null 2> "$out/$name.log" || { echo "run $name failed:"; tail -5 "$out/$name.log"; exit 1; }
}
declare -A flags=([lora]="" [nf4]="--quantization_bit 4 --quantization_type nf4 --double_quantization true"
                  [int8]="--quantization_bit 8")
for r in ${runs//,/ }; do
  [ -n "${flags[$r]+x}" ] || { echo "qlora_accuracy.sh: --runs: unknown run '$r' (expected lora, nf4, int8)" >&2; exit 2; }
  if [ $parallel = 1 ]; then run "$r" ${flags[$r]} & else run "$r" ${flags[$r]}; fi
done
wait
for r in ${runs//,/ }; do
  python3 - "$out" "$r" <<'PY'
import json, sys, re
out, r = sys.argv[1], sys.argv[2]
ev = json.load(open(f"{out}/lora/eval_results.json"))["eval_loss"] if r != "lora" else None
e = json.load(open(f"{out}/{r}/eval_results.json"))["eval_loss"]
log = open(f"{out}/{r}.log").read()
peak = re.findall(r"([0-9.]+ s wall, [0-9]+ KB peak RSS)", log)
q = re.findall(r"quantized base: .*", log)
gap = f", gap vs bf16 LoRA {100 * (e - ev) / ev:+.2f}%" if ev else ""
print(f"{r}: eval_loss {e:.4f}{gap}; {peak[-1] if peak else ''}" + (f"; {q[0]}" if q else ""))
PY
done

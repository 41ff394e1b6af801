#!/usr/bin/env bash
# End-to-end tests of `lathe train` with a quantized base (quantization_bit): QLoRA-NF4+DQ and an
# LLM.int8 base on stories260K train, land near the bf16 LoRA run's eval loss, log what was packed
# (and what stayed, with its shape), and the adapter applies to the unquantized base in generate;
# a quantized base with full fine-tuning is refused naming the key.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/train_e2e_lib.sh"

cat > "$tmp/q.yaml" <<YAML
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
logging_steps: 5
save_steps: 1000
per_device_train_batch_size: 4
gradient_accumulation_steps: 2
learning_rate: 3.0e-3
max_steps: 15
lr_scheduler_type: cosine
warmup_steps: 3
per_device_eval_batch_size: 8
bf16: true
YAML

eval_loss() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['eval_loss'])" "$1/eval_results.json"; }

"$LATHE" train "$tmp/q.yaml" --output_dir "$tmp/bf16" -t 2 2> "$tmp/bf16.log"
check "bf16 lora exit" test $? -eq 0
"$LATHE" train "$tmp/q.yaml" --output_dir "$tmp/nf4" --quantization_bit 4 --quantization_type nf4 \
  --double_quantization true -t 2 2> "$tmp/nf4.log"
check "qlora nf4 exit" test $? -eq 0
"$LATHE" train "$tmp/q.yaml" --output_dir "$tmp/int8" --quantization_bit 8 -t 2 2> "$tmp/int8.log"
check "int8 base exit" test $? -eq 0
# stories260K: 5 layers x 7 linear weights; down_proj has in_features 172 (not a multiple of the
# 4-bit block of 64), so NF4 packs 30 and keeps 5 (named with their shape); int8 packs all 35.
check "nf4 log: packed count and dtype" grep -q "quantized base: 30 linear weights -> nf4_dq" "$tmp/nf4.log"
check "nf4 log: kept down_proj named" grep -q "kept model.layers.4.down_proj.weight (64 x 172, f32)" "$tmp/nf4.log"
check "nf4 log: bytes/param" grep -q "bytes/param" "$tmp/nf4.log"
check "int8 log: packed count" grep -q "quantized base: 35 linear weights -> i8_row" "$tmp/int8.log"
b=$(eval_loss "$tmp/bf16"); n=$(eval_loss "$tmp/nf4"); i=$(eval_loss "$tmp/int8")
echo "eval_loss after 15 steps: bf16 LoRA $b, QLoRA nf4+dq $n, int8 base $i"
# Measured eval loss (bf16 LoRA / QLoRA nf4+dq, gap), rank 8; compute in f32 instead of bf16 moves
# the gap by < 0.1 point, so the gap is the base's 4-bit error (untrained NF4 base: 4.0251 vs
# 3.9198, +2.7%, on this 64-wide model), not the matmul precision:
#   lr 1e-2: 15 steps 3.1971 / 3.2783 +2.54%, 30: +2.69%, 60: 3.0305 / 3.1103 +2.64%, 120: +2.86%
#   lr 3e-3: 15 steps 3.2551 / 3.3015 +1.42%, 60: 3.0165 / 3.0728 +1.87% (rank 32: +1.25%)
# At lr 1e-2 (too high for 4-bit: the LoRA chases the quantization noise) the gap stays ~2.6%;
# at 3e-3, which also gives the better bf16 loss after 60 steps, it is within the issue's 2%.
# int8 at 3e-3: 3.2566 (+0.05%). The NF4 run must also differ from bf16 (the base really is
# quantized) and have learned (untrained: 4.03).
check "qlora nf4 within 2% of bf16 lora" python3 -c "
b, n = $b, $n
assert abs(n - b) / b < 0.02 and abs(n - b) / b > 1e-3, (b, n)
assert n < 3.6, n  # untrained: 4.03"
check "int8 base within 0.5% of bf16 lora" python3 -c "
b, i = $b, $i
assert abs(i - b) / b < 0.005, (b, i)"

# The adapter applies to the unquantized base, as PEFT's does.
"$LATHE" generate -m "$STORIES/stories260K.gguf" -p "Once upon a time" -n 24 --temp 0 --json > "$tmp/base.json"
"$LATHE" generate -m "$STORIES/stories260K.gguf" --adapter "$tmp/nf4" -p "Once upon a time" -n 24 --temp 0 \
  --json > "$tmp/adapted.json" 2> "$tmp/gen.err"
check "generate --adapter (qlora) exit" test $? -eq 0
check "qlora adapter changes the output" python3 -c "
import json; a = json.load(open('$tmp/base.json')); b = json.load(open('$tmp/adapted.json'))
assert a['ids'] != b['ids'], (a['ids'], b['ids'])"

# Full fine-tuning of a quantized base is refused, naming the key.
"$LATHE" train "$tmp/q.yaml" --output_dir "$tmp/full" --finetuning_type full --quantization_bit 4 \
  -t 2 > /dev/null 2> "$tmp/full.err"
check "full + quantization_bit fails" test $? -ne 0
check "error names quantization_bit" grep -q "key 'quantization_bit'" "$tmp/full.err"
# freeze: only the frozen layers are packed (freeze_trainable_layers 2 of 5 -> 3 layers).
"$LATHE" train "$tmp/q.yaml" --output_dir "$tmp/freeze" --finetuning_type freeze --quantization_bit 8 \
  --max_steps 2 -t 2 2> "$tmp/freeze.log"
check "freeze + int8 exit" test $? -eq 0
check "freeze packs only frozen layers" grep -q "quantized base: 21 linear weights -> i8_row" "$tmp/freeze.log"

# A GGUF quant type (q8_0) is dequantized weight by weight, then packed.
"$LATHE" convert "$STORIES/stories260K.gguf" --dtype q8_0 -o "$tmp/q8.gguf" 2> /dev/null
"$LATHE" train "$tmp/q.yaml" --model_name_or_path "$tmp/q8.gguf" --output_dir "$tmp/from_q8" \
  --quantization_bit 4 --max_steps 3 -t 2 2> "$tmp/from_q8.log"
check "q8_0 gguf -> nf4 exit" test $? -eq 0
check "q8_0 gguf -> nf4 packs 30" grep -q "quantized base: 30 linear weights -> nf4_dq" "$tmp/from_q8.log"

echo "qlora e2e: $pass passed, $fails failed"
test $fails -eq 0

#!/usr/bin/env bash
# End-to-end tests of checkpoints and resume_from_checkpoint on stories260K (LoRA with dropout and
# gradient accumulation): a run resumed from a checkpoint inside an epoch logs the same per-step
# losses, bit for bit, as the uninterrupted run (adamw_torch and adamw_8bit); a damaged checkpoint
# is refused naming the bad file; SIGKILLs at random moments during (slowed) saves never leave the
# newest complete checkpoint damaged, and `resume_from_checkpoint: last` always carries on to the
# same losses.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/train_e2e_lib.sh"

cat > "$tmp/r.yaml" <<YAML
model_name_or_path: $STORIES/stories260K.gguf
stage: sft
finetuning_type: lora
lora_rank: 32
lora_dropout: 0.1
lora_target: all
dataset: alpaca_en_demo
dataset_dir: $DATA
template: alpaca
cutoff_len: 64
max_samples: 56
val_size: 8
logging_steps: 1
save_steps: 4
per_device_train_batch_size: 4
gradient_accumulation_steps: 2
learning_rate: 1.0e-2
max_steps: 12
lr_scheduler_type: cosine
warmup_steps: 2
eval_strategy: steps
eval_steps: 5
per_device_eval_batch_size: 8
YAML

# trainer_log.jsonl lines without the wall-clock fields, as text.
cat > "$tmp/cmp.py" <<'PY'
import json, sys
def load(p):
    out = []
    for l in open(p):
        j = json.loads(l)
        for k in ["elapsed_time", "remaining_time", "throughput", "tokens_per_s", "rss_bytes", "percentage"]:
            j.pop(k, None)
        # Memory depends on history (RSS; scratch grown by an earlier eval batch), not on the math.
        j.pop("memory", None)
        out.append(json.dumps(j, sort_keys=True))
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
if a != b or len(a) < 12:
    for x, y in zip(a, b):
        if x != y:
            print("uninterrupted:", x); print("resumed:      ", y); break
    print(len(a), "vs", len(b), "lines"); sys.exit(1)
PY
# Verifies every sealed checkpoint's files against its manifest (crc32c computed independently).
cat > "$tmp/verify.py" <<'PY'
import json, os, sys
T = []
for i in range(256):
    c = i
    for _ in range(8): c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    T.append(c)
def crc32c(b):
    c = 0xFFFFFFFF
    for x in b: c = T[(c ^ x) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF
assert crc32c(b"123456789") == 0xE3069283
d = sys.argv[1]
sealed = []
for n in sorted(os.listdir(d)):
    m = os.path.join(d, n, "lathe_checkpoint.json")
    if not n.startswith("checkpoint-") or not os.path.isfile(m): continue
    man = json.load(open(m))
    for f, e in man["files"].items():
        b = open(os.path.join(d, n, f), "rb").read()
        assert len(b) == e["bytes"] and "%08x" % crc32c(b) == e["crc32c"], (n, f)
    sealed.append(int(n[11:]))
print(max(sealed) if sealed else 0)
PY

for optim in adamw_torch adamw_8bit; do
  "$LATHE" train "$tmp/r.yaml" --optim $optim --output_dir "$tmp/a_$optim" -t 2 2> "$tmp/a.log"
  check "$optim: uninterrupted run" test $? -eq 0
  # An interrupted run: only checkpoint-4 (step 4 ends micro-batch 8 of 12 in epoch 0) and the log
  # lines written by then survive; checkpoint-8 (inside epoch 1) and checkpoint-12 (the last step:
  # only the final eval remains, and the log written after the save is cut back) too.
  for cp in 4 8 12; do
    b="$tmp/b_${optim}_$cp"
    mkdir -p "$b"
    cp -r "$tmp/a_$optim/checkpoint-$cp" "$b/"
    python3 -c "
import json, sys
for l in open(sys.argv[1]):
    if json.loads(l)['current_steps'] <= $cp: sys.stdout.write(l)" "$tmp/a_$optim/trainer_log.jsonl" \
      > "$b/trainer_log.jsonl"
    "$LATHE" train "$tmp/r.yaml" --optim $optim --output_dir "$b" --resume_from_checkpoint last -t 2 \
      2> "$tmp/b.log"
    check "$optim: resume from checkpoint-$cp exit" test $? -eq 0
    check "$optim: resume log names checkpoint-$cp" grep -q "resumed from .*checkpoint-$cp at step $cp" "$tmp/b.log"
    check "$optim: resumed losses bit-identical (from step $cp)" \
      python3 "$tmp/cmp.py" "$tmp/a_$optim/trainer_log.jsonl" "$b/trainer_log.jsonl"
  done
done
# adamw_8bit really keeps 8-bit state here (lora_rank 32: 172 x 32 tensors > min_8bit_size 4096).
check "8-bit state in the checkpoint" python3 -c "
d = open('$tmp/a_adamw_8bit/checkpoint-4/training_state.bin', 'rb').read()
assert b'm_codes' in d, 'no 8-bit codes'"

# Another thread count resumes too, with a warning (LoRA sums its gradients per thread).
# from_checkpoint4 RUN DIR: DIR holds RUN's checkpoint-4 and its log up to step 4, as the run was then.
from_checkpoint4() {
  mkdir -p "$2"
  cp -r "$1/checkpoint-4" "$2/"
  python3 -c "
import json, sys
for l in open(sys.argv[1]):
    if json.loads(l)['current_steps'] <= 4: sys.stdout.write(l)" "$1/trainer_log.jsonl" > "$2/trainer_log.jsonl"
}
b="$tmp/threads"
from_checkpoint4 "$tmp/a_adamw_torch" "$b"
"$LATHE" train "$tmp/r.yaml" --output_dir "$b" --resume_from_checkpoint last -t 1 > /dev/null 2> "$tmp/t.log"
check "resume on 1 thread exit" test $? -eq 0
check "resume on 1 thread warns" grep -q \
  "warning: resuming with 1 LoRA row-group worker(s) (1 thread(s)), the checkpointed run used 2 (2 thread(s))" \
  "$tmp/t.log"
# The row_group_workers key reaches the model: 2 threads, one worker.
b="$tmp/one_worker"
from_checkpoint4 "$tmp/a_adamw_torch" "$b"
"$LATHE" train "$tmp/r.yaml" --output_dir "$b" --resume_from_checkpoint last --row_group_workers 1 -t 2 > /dev/null \
  2> "$tmp/w.log"
check "row_group_workers 1 on 2 threads warns" grep -q \
  "warning: resuming with 1 LoRA row-group worker(s) (2 thread(s)), the checkpointed run used 2 (2 thread(s))" \
  "$tmp/w.log"

# Full fine-tuning's row-group workers add into the gradients in group order: a run checkpointed on
# 2 threads (2 workers) resumes on 1 without a warning, to the same losses bit for bit.
sed -e 's/^finetuning_type: lora/finetuning_type: full/' -e '/^lora_/d' -e 's/^learning_rate: .*/learning_rate: 1.0e-3/' \
  "$tmp/r.yaml" > "$tmp/full.yaml"
"$LATHE" train "$tmp/full.yaml" --output_dir "$tmp/full_a" -t 2 > /dev/null 2> "$tmp/fa.log"
check "full: uninterrupted run exit" test $? -eq 0
f="$tmp/full_b"
from_checkpoint4 "$tmp/full_a" "$f"
"$LATHE" train "$tmp/full.yaml" --output_dir "$f" --resume_from_checkpoint last -t 1 > /dev/null 2> "$tmp/fb.log"
check "full: resume on 1 thread exit" test $? -eq 0
check "full: resume on 1 thread does not warn" bash -c "! grep -q 'warning: resuming' '$tmp/fb.log'"
check "full: resumed on 1 thread, losses bit-identical" python3 "$tmp/cmp.py" "$tmp/full_a/trainer_log.jsonl" \
  "$f/trainer_log.jsonl"

# Damaged checkpoints are refused, naming the file.
d="$tmp/damaged"
cp -r "$tmp/a_adamw_torch" "$d"
python3 -c "
p = '$d/checkpoint-12/training_state.bin'; b = bytearray(open(p, 'rb').read()); b[len(b) // 2] ^= 1
open(p, 'wb').write(b)"
"$LATHE" train "$tmp/r.yaml" --output_dir "$d" --resume_from_checkpoint last -t 2 > /dev/null 2> "$tmp/d.err"
check "flipped bit refused" test $? -ne 0
check "flipped bit names the file" grep -q "checkpoint-12/training_state.bin' is damaged" "$tmp/d.err"
truncate -s 100 "$d/checkpoint-4/adapter_model.safetensors"
"$LATHE" train "$tmp/r.yaml" --output_dir "$d" --resume_from_checkpoint "$d/checkpoint-4" -t 2 > /dev/null \
  2> "$tmp/d.err"
check "truncated file refused" test $? -ne 0
check "truncated file named" grep -q "checkpoint-4/adapter_model.safetensors' is damaged" "$tmp/d.err"
"$LATHE" train "$tmp/r.yaml" --output_dir "$tmp/none" --resume_from_checkpoint last -t 2 > /dev/null \
  2> "$tmp/d.err"
check "last without checkpoints refused" grep -q "found no complete checkpoint-N" "$tmp/d.err"

# Kill loop: SIGKILL at random moments while saves are slowed (LATHE_TEST_SAVE_DELAY_MS per file),
# with save_total_limit 2 rotating; after each kill every sealed checkpoint verifies and never goes
# backwards, and `last` resumes. The finished run's losses equal the uninterrupted run's.
k="$tmp/kill"
mkdir -p "$k"
RANDOM=7
prev=0
for i in 1 2 3 4 5; do
  resume=()
  [ "$prev" -gt 0 ] && resume=(--resume_from_checkpoint last)
  LATHE_TEST_SAVE_DELAY_MS=120 "$LATHE" train "$tmp/r.yaml" --output_dir "$k" --overwrite_output_dir true \
    --save_total_limit 2 "${resume[@]}" -t 2 > /dev/null 2> "$tmp/k.log" &
  pid=$!
  sleep "$(( RANDOM % 2 )).$(( 3 + RANDOM % 7 ))"
  kill -KILL $pid 2> /dev/null
  wait $pid 2> /dev/null
  newest=$(python3 "$tmp/verify.py" "$k")
  check "kill $i: sealed checkpoints intact" test -n "$newest"
  check "kill $i: newest complete checkpoint did not go back ($prev -> $newest)" test "${newest:-0}" -ge "$prev"
  echo "kill $i: newest complete checkpoint $newest, temp dirs: $(ls -a "$k" | grep -c "^.checkpoint") "
  prev=${newest:-0}
done
resume=()
[ "$prev" -gt 0 ] && resume=(--resume_from_checkpoint last)
"$LATHE" train "$tmp/r.yaml" --output_dir "$k" --overwrite_output_dir true --save_total_limit 2 "${resume[@]}" \
  -t 2 2> "$tmp/k.log"
check "after kills: resume last completes" test $? -eq 0
check "after kills: losses bit-identical" python3 "$tmp/cmp.py" "$tmp/a_adamw_torch/trainer_log.jsonl" \
  "$k/trainer_log.jsonl"
echo "kill loop: newest checkpoint before the last resume: $prev"

echo "resume e2e: $pass passed, $fails failed"
test $fails -eq 0

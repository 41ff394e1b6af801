#!/usr/bin/env bash
# lm-eval (EleutherAI's harness, PyPI lm-eval) scores a small multiple-choice task twice: through
# `lathe serve` with its `local-completions` client (echo + logprobs loglikelihood requests over
# the OpenAI API), and with its own `hf` backend (transformers + torch on the same weights,
# dequantized to f32). The per-choice loglikelihoods must agree: lathe's serving path, prompt
# logprobs included, against a reference nobody here wrote.
# Usage: tools/ref/lm_eval_serve/run.sh [MODEL.gguf] [LATHE]   (default: the fetched SmolLM2, build/lathe)
# Needs the reference env (tools/ref/setup.sh) plus tools/ref/lm_eval_serve/requirements.txt
# (lm-eval[api]==0.4.13, kept apart: it pulls datasets, scikit-learn, ...). Offline: the task is local.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
model=${1:-$(bash "$root/scripts/fetch-models.sh")}
lathe=${2:-$root/build/lathe}
py=${LATHE_REFENV:-$HOME/.cache/lathe/refenv}/bin/python
tol=${LATHE_LMEVAL_TOL:-1e-3}  # measured 7.3e-5 (SmolLM2 Q4_1, 2 threads)
"$py" -c "import lm_eval" 2>/dev/null || { echo "lm-eval missing: $py -m pip install -r $here/requirements.txt" >&2; exit 2; }
work=$(mktemp -d /tmp/lathe-lmeval.XXXXXX)
srv=""
trap 'kill $srv 2>/dev/null || true; [ -n "${LATHE_KEEP:-}" ] || rm -rf "$work"' EXIT
export HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

# The same weights for the hf backend: transformers dequantizes the GGUF to f32.
"$py" - "$model" "$work/hf" 2> "$work/convert.log" <<'PY'
import os, sys
from transformers import AutoModelForCausalLM, AutoTokenizer
d, f = os.path.split(os.path.abspath(sys.argv[1]))
AutoTokenizer.from_pretrained(d, gguf_file=f).save_pretrained(sys.argv[2])
m = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype="float32")
# A GGUF-loaded model refuses save_pretrained; copy its (dequantized) weights into a plain one.
cfg = m.config
if hasattr(cfg, "quantization_config"):
    del cfg.quantization_config
plain = AutoModelForCausalLM.from_config(cfg, dtype="float32")
plain.load_state_dict(m.state_dict())
plain.save_pretrained(sys.argv[2])
PY
mkdir -p "$work/task"
sed "s#@DATA@#$here/questions.jsonl#" "$here/task.yaml.in" > "$work/task/lathe_mc_sanity.yaml"

"$lathe" serve -m "$model" --port 0 --served-model-name m -t 2 > "$work/serve.log" 2>&1 &
srv=$!
port=""
for _ in $(seq 1 300); do
  port=$(grep -o 'http://127.0.0.1:[0-9]*' "$work/serve.log" | head -1 | sed 's/.*://') || true
  [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
  kill -0 $srv 2>/dev/null || { cat "$work/serve.log" >&2; exit 1; }
  sleep 0.2
done
[ -n "$port" ] || { echo "lathe serve did not start" >&2; cat "$work/serve.log" >&2; exit 1; }

common=(--include_path "$work/task" --tasks lathe_mc_sanity --log_samples --seed 0)
"$py" -m lm_eval --model local-completions \
  --model_args "model=m,base_url=http://127.0.0.1:$port/v1/completions,tokenizer=$work/hf,tokenized_requests=True,num_concurrent=4,max_retries=1" \
  --output_path "$work/served" "${common[@]}" > "$work/served.log" 2>&1 || { tail -30 "$work/served.log" >&2; exit 1; }
grep -E "^\|" "$work/served.log" || true
"$py" -m lm_eval --model hf --model_args "pretrained=$work/hf,dtype=float32" --device cpu --batch_size 8 \
  --output_path "$work/hf_out" "${common[@]}" > "$work/hf.log" 2>&1 || { tail -30 "$work/hf.log" >&2; exit 1; }
grep -E "^\|" "$work/hf.log" || true
"$py" "$here/compare.py" "$work/served" "$work/hf_out" "$tol"

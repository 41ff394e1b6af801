#!/usr/bin/env bash
# Inference benchmark of issue "Foundation": SmolLM2-135M in Q4_1 (as shipped), Q8_0, BF16 and
# F32 (made with `lathe convert`), prefill 512 tokens and decode 128, with 1 and 2 threads, and
# decode bandwidth as a fraction of the read bandwidth measured in the same run.
# Usage: bench/inference.sh [BUILD_DIR]   (prints a markdown table; llama.cpp's figures are in
# ../shared/PEERS.md, measured on a Zen 5 machine).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
lathe="$build/lathe"
model="$(bash scripts/fetch-models.sh)"
dir="${LATHE_CACHE:-$HOME/.cache/lathe}/bench"
mkdir -p "$dir"
models=("$model")
for d in q8_0 bf16 f32; do
  out="$dir/SmolLM2-135M-Instruct.$d.gguf"
  [ -f "$out" ] || "$lathe" convert "$model" --dtype "$d" -o "$out" >&2
  models+=("$out")
done
args=()
for m in "${models[@]}"; do args+=(-m "$m"); done
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; commit $(git rev-parse --short HEAD)"
"$lathe" bench "${args[@]}" --threads-list 1,2 -r 3

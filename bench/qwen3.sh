#!/usr/bin/env bash
# Qwen3 against llama.cpp on this machine, same run: a Qwen3-0.6B-shaped model (bench/make_qwen3_model.py: its
# config, seeded random weights, the real Qwen3 tokenizer; made with transformers in the refenv) converted by
# llama.cpp's own convert_hf_to_gguf.py to BF16 and quantized by llama-quantize to Q8_0 and Q4_K_M. First each
# file's mean NLL from `lathe eval` next to transformers' (BF16 must agree; the quantized files show their loss),
# then llama-bench vs `lathe bench` (pp512 / tg128, 1 and 2 threads) interleaved, as bench/llamacpp.sh does for SmolLM2.
# Usage: bench/qwen3.sh [BUILD_DIR]   LATHE_BENCH_ROUNDS=N: rounds per side, the best kept (default 1)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/llamacpp_lib.sh
build="${1:-build}"
lathe="$build/lathe"
rounds="${LATHE_BENCH_ROUNDS:-1}"
[ -x "$lathe" ] || { echo "qwen3.sh: $lathe not found (build the lathe target first)" >&2; exit 1; }
bin="${LATHE_LLAMACPP_BIN:-$(bash bench/fetch-llamacpp.sh)}"
src="$(dirname "$(dirname "$bin")")/src"  # the sdist's llama.cpp tree: convert_hf_to_gguf.py, gguf-py
py="${LATHE_REF_VENV:-$HOME/.cache/lathe/refenv}/bin/python"
dir="${LATHE_CACHE:-$HOME/.cache/lathe}/bench/qwen3"
mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ ! -f "$dir/hf/model.safetensors" ]; then
  "$py" bench/make_qwen3_model.py "$dir/hf" > "$dir/transformers.txt"
fi
bf16="$dir/qwen3-0.6b-shape.bf16.gguf"
[ -f "$bf16" ] || PYTHONPATH="$src/gguf-py" "$py" "$src/convert_hf_to_gguf.py" "$dir/hf" --outtype bf16 \
  --outfile "$bf16" > "$tmp/convert.log" 2>&1
names=(BF16)
files=("$bf16")
for t in Q8_0 Q4_K_M; do
  out="$dir/qwen3-0.6b-shape.${t,,}.gguf"
  [ -f "$out" ] || "$bin/llama-quantize" "$bf16" "$out" "$t" > "$tmp/quantize.log" 2>&1
  names+=("$t")
  files+=("$out")
done

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores;" \
  "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -xE "avx2|fma|avx512f|avx512_vnni|avx512_bf16|amx_tile" | xargs)"
echo "lathe commit $(git rev-parse --short HEAD); llama.cpp: llama-cpp-python 0.3.36's vendored copy; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "$(cat "$dir/transformers.txt")"
echo
echo "| file | lathe eval mean NLL (first TinyStories document, no BOS) |"
echo "|---|---:|"
for i in "${!files[@]}"; do
  nll=$("$lathe" eval -m "${files[$i]}" --text "$dir/doc.txt" --json | python3 -c "import json,sys; print(f\"{json.load(sys.stdin)['mean_nll']:.6f}\")")
  echo "| ${names[$i]} | $nll |"
done
measure_inference

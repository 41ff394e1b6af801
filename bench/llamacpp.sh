#!/usr/bin/env bash
# llama.cpp measured on this machine in the same run as lathe (issues "Foundation" and "Serving
# engine"): llama-bench vs `lathe bench` (pp512 / tg128, 1 and 2 threads) on SmolLM2-135M in Q4_1
# (as shipped), Q8_0, BF16 and F32 (made by `lathe convert`, so llama.cpp also reads lathe's GGUF
# output), Q4_K_M (made by llama.cpp's llama-quantize, so lathe reads llama.cpp's K-quants) and
# stories260K; then llama-server vs `lathe serve` under `lathe bench serve` (the same
# seeded token-id workload) at concurrency 1, 8 and 32 on the Q8_0 file, a fresh server per level. llama.cpp comes from the
# PyPI sdist llama-cpp-python==0.3.36 (bench/fetch-llamacpp.sh; built into the cache, never CI).
# Usage: bench/llamacpp.sh [BUILD_DIR]
#   LATHE_BENCH_ROUNDS=N  interleaved rounds per side, the best of each kept (default 1; use 2-3
#                         on a loaded machine)
#   LATHE_BENCH_PARTS=inference,serve  which halves to run (default both)
#   LATHE_LLAMACPP_BIN=DIR  llama-bench / llama-server from DIR instead of bench/fetch-llamacpp.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/llamacpp_lib.sh
build="${1:-build}"
lathe="$build/lathe"
rounds="${LATHE_BENCH_ROUNDS:-1}"
parts="${LATHE_BENCH_PARTS:-inference,serve}"
[ -x "$lathe" ] || { echo "llamacpp.sh: $lathe not found (build the lathe target first)" >&2; exit 1; }
bin="${LATHE_LLAMACPP_BIN:-$(bash bench/fetch-llamacpp.sh)}"  # or a directory with llama-bench/llama-server
model="$(bash scripts/fetch-models.sh)"
dir="${LATHE_CACHE:-$HOME/.cache/lathe}/bench"
mkdir -p "$dir"
tmp=$(mktemp -d)
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores;" \
  "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -xE "avx|avx2|fma|f16c|avx512f|avx512bw|avx512_vnni|avx512_bf16|avx_vnni|amx_tile" | xargs)"
echo "lathe commit $(git rev-parse --short HEAD); llama.cpp: llama-cpp-python 0.3.36's vendored copy" \
  "(ggml-org/llama.cpp@0c1e57098 per its CHANGELOG; ggml 0.25.3), CPU backend built with GGML_NATIVE=ON"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg); rounds per side: $rounds (best kept)"

if [[ ",$parts," == *,inference,* ]]; then
  names=(Q4_1)
  files=("$model")
  for d in q8_0 bf16 f32; do
    out="$dir/SmolLM2-135M-Instruct.$d.gguf"
    [ -f "$out" ] || "$lathe" convert "$model" --dtype "$d" -o "$out" >&2
    names+=("${d^^}")
    files+=("$out")
  done
  # Q4_K_M, the file type most GGUFs on the Hub are: made by llama.cpp's own llama-quantize from the
  # F32 file (SmolLM2's 576-wide rows are not whole 256-blocks, so most of it falls back to Q5_0;
  # ffn_down is Q4_K / Q6_K, the embedding Q8_0).
  kq="$dir/SmolLM2-135M-Instruct.q4_k_m.gguf"
  [ -f "$kq" ] || "$bin/llama-quantize" "$dir/SmolLM2-135M-Instruct.f32.gguf" "$kq" Q4_K_M > "$tmp/quantize.log" 2>&1
  names+=("Q4_K_M")
  files+=("$kq")
  # stories260K through lathe's writer (an SPM vocab; the shared file was written by llama.cpp's
  # converter).
  st="$dir/stories260K.lathe.f32.gguf"
  [ -f "$st" ] || "$lathe" convert ../shared/models/stories260K/stories260K.gguf --dtype f32 -o "$st" >&2
  names+=("stories260K F32")
  files+=("$st")

  measure_inference
fi

if [[ ",$parts," == *,serve,* ]]; then
  q8="$dir/SmolLM2-135M-Instruct.q8_0.gguf"
  [ -f "$q8" ] || "$lathe" convert "$model" --dtype q8_0 -o "$q8" >&2
  levels=1,8,32
  # 32 slots x (prompt <= 161 + output <= 96, or the 384+16-token shared-prefix requests) fit in
  # 512 tokens each.
  ctx=$((32 * 512))
  serve_args=(-m "$q8" -t 2 --concurrency "$levels")
  # A fresh llama-server for every level: its slots keep their last prompts and reuse them, and the
  # levels' workloads share their first requests, so a server carried over from the level before
  # would find part of each prompt cached (c=32 after 1 and 8: 230 vs 139 tok/s fresh, measured).
  # lathe's in-process levels each start on a fresh engine for the same reason.
  for ((round = 1; round <= rounds; round++)); do
    : > "$tmp/serve.llama.$round.out"
    for level in ${levels//,/ }; do
      sys=0
      [ "$level" = "${levels##*,}" ] && sys=384  # the shared-prefix measurement once, after the last level
      port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
      "$bin/llama-server" -m "$q8" -t 2 -tb 2 --parallel 32 -c "$ctx" --cont-batching --host 127.0.0.1 \
        --port "$port" > "$tmp/llama-server.log" 2>&1 &
      server_pid=$!
      for _ in $(seq 1 600); do
        curl -sf "http://127.0.0.1:$port/health" > /dev/null 2>&1 && break
        kill -0 "$server_pid" 2>/dev/null || { echo "llama-server exited:" >&2; tail -20 "$tmp/llama-server.log" >&2; exit 1; }
        sleep 0.2
      done
      "$lathe" bench serve -m "$q8" -t 2 --concurrency "$level" --system-prompt-tokens "$sys" \
        --url "http://127.0.0.1:$port" >> "$tmp/serve.llama.$round.out"
      kill "$server_pid"; wait "$server_pid" 2>/dev/null || true
      server_pid=
    done
    "$lathe" bench serve "${serve_args[@]}" > "$tmp/serve.lathe.$round.out"
    echo "serve round $round done (load $(cut -d' ' -f1 /proc/loadavg))" >&2
  done
  echo
  echo "### Serving: SmolLM2-135M Q8_0, 2 threads, the same seeded token-id workload (lathe bench serve) at concurrency $levels"
  echo "llama-server: -t 2 -tb 2 --parallel 32 -c $ctx --cont-batching; lathe: lathe bench serve -m Q8_0 -t 2 (in-process lathe serve, default engine settings)"
  for side in llama lathe; do
    echo
    echo "#### ${side/llama/llama-server} (round 1 of $rounds)"
    grep -m1 -A1 '^| concurrency' "$tmp/serve.$side.1.out"  # one header (llama-server's levels are separate runs)
    grep '^| [0-9]' "$tmp/serve.$side.1.out"
    echo
    grep '^shared ' "$tmp/serve.$side.1.out"
    grep -h 'FAILED' "$tmp"/serve.$side.*.out || true
  done
  python3 - "$tmp" "$rounds" <<'PY'
import re, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
best = {}
for side in ("llama", "lathe"):
    for r in range(1, rounds + 1):
        for c, tps in re.findall(r"^\| (\d+) \| ([0-9.]+) \|", open(f"{tmp}/serve.{side}.{r}.out").read(), re.M):
            k = (side, int(c))
            best[k] = max(best.get(k, 0.0), float(tps))
print()
print(f"| concurrency | llama-server output tok/s | lathe output tok/s | lathe / llama-server | (best of {rounds} round(s)) |")
print("|---:|---:|---:|---:|---|")
for c in sorted({c for _, c in best}):
    l, m = best.get(("llama", c), 0), best.get(("lathe", c), 0)
    print(f"| {c} | {l:.1f} | {m:.1f} | {m / l:.2f}x | |" if l else f"| {c} | - | {m:.1f} | - | |")
l32, m32, l1, m1 = (best.get(k, 0) for k in (("llama", 32), ("lathe", 32), ("llama", 1), ("lathe", 1)))
if l32 and m32 and l1 and m1:
    print()
    print(f"c=32: lathe {m32:.1f} tok/s vs llama-server {l32:.1f} tok/s = {m32 / l32:.2f}x "
          f"({'above' if m32 > l32 else 'NOT above'} llama-server, the issue 3 goal); "
          f"c=32 vs own c=1: lathe {m32 / m1:.2f}x, llama-server {l32 / l1:.2f}x")
PY
fi
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

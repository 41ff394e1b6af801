#!/usr/bin/env bash
# Training speed, lathe vs PyTorch + PEFT in the same run: `lathe bench train` and bench/train_torch.py
# over the same rows, shapes and thread counts, then ours / theirs per row (tokens/s and peak RSS; a
# torch cell that bitsandbytes cannot run on this CPU shows n/a with its reason below the table).
# Usage: bench/train.sh [--seq 512] [--batch 4] [--steps 2] [--threads-list 1,2] [--rows ...]
# Env: LATHE (binary, default build/lathe), PY (default the refenv's python), TCMALLOC (preloaded for
# torch when present: PEERS.md's best setting), ROUNDS (default 1: lathe's rows, then torch's, this
# many times over, alternating; each speed cell keeps its best round and each RSS cell its highest, so
# on a noisy shared host both sides get the same chances at a quiet minute), TORCH_MODEL (hf, the default:
# transformers' LlamaForCausalLM + PEFT on the refenv's torch; compact: the same model in plain PyTorch, for
# ../shared/PEERS.md's "best PyTorch", Debian's python3-torch 1.13, on which transformers and PEFT do not run:
#   apt-get install python3-torch libopenblas0-pthread libopenblas0-openmp   # else torch 1.13 gets netlib's BLAS
#   PY=/usr/bin/python3 TORCH_MODEL=compact OPENBLAS_CORETYPE=SkylakeX bash bench/train.sh --rows full-f32,...
# with LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp for PEERS.md's other variant; SkylakeX keeps
# Debian's OpenBLAS 0.3.21 from taking AMD's AVX-512 cores for Haswell).
set -euo pipefail
cd "$(dirname "$0")/.."
LATHE=${LATHE:-build/lathe}
PY=${PY:-/root/.cache/lathe/refenv/bin/python}
TCMALLOC=${TCMALLOC:-/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
ROUNDS=${ROUNDS:-1}
TORCH_MODEL=${TORCH_MODEL:-hf}
pre=""
[ -f "$TCMALLOC" ] && pre="$TCMALLOC"
for round in $(seq "$ROUNDS"); do
  echo "== round $round/$ROUNDS, lathe ($(git rev-parse --short HEAD 2>/dev/null || echo unknown)): $LATHE bench train $*" |
    tee -a "$out/lathe.txt"
  "$LATHE" bench train "$@" | tee -a "$out/lathe.txt"
  echo "== round $round/$ROUNDS, torch: LD_PRELOAD=$pre $PY bench/train_torch.py --model $TORCH_MODEL $*"
  LD_PRELOAD="$pre" "$PY" bench/train_torch.py --model "$TORCH_MODEL" "$@" | tee -a "$out/torch.txt"
done
echo
# tok/CPU-s: tokens per CPU-second (user + sys of the process over its fastest step): with 1 thread
# this is the throughput on an idle core, much less noisy than wall time on a shared machine.
echo "| row | threads | lathe tok/s | torch tok/s | tok/s ratio | lathe tok/CPU-s | torch tok/CPU-s | CPU ratio | lathe RSS MB | torch RSS MB | RSS ratio |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
awk '
  FNR == NR && /^memory by category/ { lmem = 1 }
  FNR == NR && !lmem && /^\| (q?lora|full)-/ { split($0, f, "|"); gsub(/ /, "", f[2]); gsub(/ /, "", f[3]);
    k = f[2] " " f[3]; if (!(k in ltps)) order[n++] = k
    # best round per cell: the highest tokens/s (wall and CPU); peak RSS: the highest of the rounds
    if (f[4] + 0 > ltps[k]) ltps[k] = f[4] + 0
    if (f[9] + 0 > lcpu[k]) lcpu[k] = f[9] + 0
    if (f[6] + 0 > lrss[k]) lrss[k] = f[6] + 0
    next }
  FNR == NR && /^== round/ { lmem = 0 }
  FNR != NR && /^RESULT/ { k = $2 " " $3; if ($4 + 0 > ttps[k]) ttps[k] = $4 + 0
    if ($6 + 0 > trss[k]) trss[k] = $6 + 0
    for (i = 7; i <= NF; i++) if ($i ~ /^cpu_tps=/) { sub(/^cpu_tps=/, "", $i); if ($i + 0 > tcpu[k]) tcpu[k] = $i + 0 } }
  FNR != NR && /^NA/ { k = $2 " " $3; na[k] = 1 }
  END { for (i = 0; i < n; i++) { k = order[i]; split(k, p, " ");
      if (k in ttps) {
        cpu_ratio = tcpu[k] > 0 ? lcpu[k] / tcpu[k] : 0  # not inside printf: there ">" redirects
        printf "| %s | %s | %.1f | %.1f | %.2fx | %.1f | %.1f | %.2fx | %.0f | %.0f | %.0f%% |\n", p[1], p[2],
          ltps[k], ttps[k], ltps[k] / ttps[k], lcpu[k], tcpu[k], cpu_ratio, lrss[k], trss[k], 100 * lrss[k] / trss[k]
      } else if (k in na) {
        printf "| %s | %s | %.1f | n/a | | %.1f | n/a | | %.0f | n/a | |\n", p[1], p[2], ltps[k], lcpu[k], lrss[k]
      } } }' \
  "$out/lathe.txt" "$out/torch.txt"
grep -h "^NA" "$out/torch.txt" || true

#!/usr/bin/env bash
# Runs a test command on the AVX2 tier (LATHE_ISA=avx2) where the CPU's best tier is AVX-512, so CI on
# an AVX-512 machine also takes the paths that pick the AVX2 tables themselves (the trainer, the memory
# plan, the engine), release and ASan/UBSan alike. Three failures of those paths sat unseen for ~20
# sessions of AVX-512 CI (the fortieth session found them on an AVX2-only CPU). The tier-parameterized op
# tests (Tiers/*) run every tier anyway. Exits 77 (skipped) where the CPU has no AVX-512 tier: there the
# discovered tests already run AVX2.
# Usage: tests/isa/avx2_leg.sh COMMAND [ARGS...]
set -euo pipefail
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
for f in avx512f avx512bw avx512vl avx512dq avx512_vnni; do
  [[ " $flags " == *" $f "* ]] || { echo "avx2_leg: no $f on this CPU: the discovered tests run the AVX2 tier already"; exit 77; }
done
export LATHE_ISA=avx2
exec "$@"

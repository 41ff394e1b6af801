#!/usr/bin/env bash
# Installs the Debian packages lathe needs to build and test (Debian 12, run as root).
set -euo pipefail
pkgs=(
  build-essential cmake ninja-build git ca-certificates
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libpcre2-dev libicu-dev libyaml-cpp-dev libdnnl-dev
  libprotobuf-dev protobuf-compiler libcpp-httplib-dev
  clang-14 libclang-rt-14-dev
  python3 python3-pip python3-venv unzip
  libtcmalloc-minimal4
  iproute2
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

#!/usr/bin/env bash
# Installs dependencies, builds lathe and runs every test suite: the release build (unit, op,
# golden, e2e), the same tests under ASan/UBSan, and each fuzz target briefly. Used by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
bash scripts/install-deps.sh
export LATHE_SMOLLM2="$(bash scripts/fetch-models.sh --tests)"
export LATHE_REQUIRE_ALL=1

# ctest with the given filters; when tests fail, they run again one at a time with their output, so
# the end of the log says why (a pass there means a flaky test); the script fails either way.
ctest_or_report() {
  if ctest --output-on-failure -j "$jobs" "$@"; then return 0; fi
  echo "== the failed tests again, one at a time (a pass here means flaky; the run still fails):"
  ctest --rerun-failed --output-on-failure -j 1 "$@" || true
  return 1
}

echo "== release build"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs"
(cd build && ctest_or_report)

# The sanitizer build compiles at -O1 with line tables only (-g1): UBSan's checks made -O2 -g compile
# 2.3x slower; the reports keep file:line. One clang build serves both the sanitizer tests and the
# fuzz targets: LATHE_FUZZ instruments all of lathe_lib with ASan/UBSan (plus libFuzzer's coverage
# counters outside the kernels, which the test binaries carry unused), so the library is compiled
# once, not twice.
sanitize_flags="-O1 -g1 -DNDEBUG"
echo "== ASan/UBSan build (clang; also the fuzz targets)"
CC=clang-14 CXX=clang++-14 cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLATHE_FUZZ=ON \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$sanitize_flags" -DCMAKE_C_FLAGS_RELWITHDEBINFO="$sanitize_flags" >/dev/null
cmake --build build-asan -j "$jobs"
# Left out under ASan (they ran in the release build above): pure arithmetic at full model shapes,
# whose code paths the smaller shapes of the same suites already take under ASan (Stories260KNll 96 s,
# ModelShapes scalar/avx2 58 + 38 s, the scalar BackwardInput 56 s, the 200-step 8-bit AdamW curve 48 s).
asan_skip='^(Stories260KNll[.]|Tiers/MatMulTier[.]ModelShapes/|TiersThreads/TrainMatMul[.]BackwardInputMatchesReference/scalar|BnbAdamW[.]EightBitLossCurve)'
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest_or_report -LE slow -E "$asan_skip")

# Each libFuzzer run is single-threaded: $jobs targets at a time, each its full time; a target that
# fails (a crash, a leak, a sanitizer report) fails the script with the end of its log.
if [ -d tests/fuzz ] && ls tests/fuzz/*_fuzz.cc >/dev/null 2>&1; then
  echo "== fuzz targets (brief, $jobs at a time)"
  targets=()
  for src in tests/fuzz/*_fuzz.cc; do targets+=("$(basename "$src" .cc)"); done
  for ((i = 0; i < ${#targets[@]}; i += jobs)); do
    pids=()
    for name in "${targets[@]:i:jobs}"; do
      corpus=tests/fuzz/corpus/${name%_fuzz}
      mkdir -p "build-asan/corpus-$name"
      ./build-asan/"$name" -max_total_time="${LATHE_FUZZ_SECONDS:-20}" -rss_limit_mb=2048 \
        "build-asan/corpus-$name" $( [ -d "$corpus" ] && echo "$corpus" ) >"build-asan/$name.log" 2>&1 &
      pids+=($!)
    done
    for j in "${!pids[@]}"; do
      name=${targets[i + j]}
      if wait "${pids[j]}"; then
        echo "$name:"; tail -3 "build-asan/$name.log"
      else
        echo "$name FAILED:"; tail -60 "build-asan/$name.log"; exit 1
      fi
    done
  done
fi

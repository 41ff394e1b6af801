# Shared set-up of the `lathe train` e2e scripts (sourced, not a test): the binary and shared data
# from ctest's environment, a temp dir removed at exit, and pass/fail counters with check() and
# expect_error().
LATHE="${LATHE_BIN:?}"
SHARED="${LATHE_SHARED:?}"
STORIES="$SHARED/models/stories260K"
DATA="$SHARED/data/llamafactory"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
pass=0
check() {  # check NAME COMMAND...
  local name="$1"; shift
  if "$@"; then pass=$((pass + 1)); else echo "FAIL: $name"; fails=$((fails + 1)); fi
}
expect_error() {  # expect_error NAME PATTERN COMMAND...: fails with PATTERN in stderr
  local name="$1" pattern="$2"; shift 2
  if "$@" > "$tmp/out" 2> "$tmp/err"; then
    echo "FAIL: $name (exit 0)"; fails=$((fails + 1)); return
  fi
  if grep -q -- "$pattern" "$tmp/err"; then pass=$((pass + 1)); else
    echo "FAIL: $name: stderr lacks '$pattern':"; cat "$tmp/err"; fails=$((fails + 1)); fi
}

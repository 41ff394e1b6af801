# Sourced by the test scripts that need a package from PyPI in a cached venv.
# lathe_pip_venv_install VENV CHECK SPEC: unless CHECK (Python code) exits 0 in VENV, makes VENV and
# pip-installs SPEC (two tries: a transient network error should not fail a test run). Returns 0 when
# CHECK passes, 77 when PyPI cannot be reached at all, else 1. The check and the install run under an
# exclusive lock on VENV.lock: ctest runs test scripts in parallel (the ISA variants of one script share
# its venv), and an import that succeeds while another test is still installing into the same venv
# sees a half-written package (seen: tensorboard's event_file_loader without its classes).
# lathe_pip_venv VENV CHECK SPEC: the same, but exits the calling script on failure: 77 (ctest SKIP) if
# PyPI cannot be reached, else 1.
lathe_pip_venv_install_locked() {
  local venv=$1 check=$2 spec=$3
  local name=${spec%%==*}
  "$venv/bin/python" -c "$check" 2>/dev/null && return 0
  python3 -m venv "$venv" || { echo "FAIL: python3 -m venv $venv"; return 1; }
  local try
  for try in 1 2; do
    timeout 300 "$venv/bin/pip" install -q --disable-pip-version-check "$spec" &&
      "$venv/bin/python" -c "$check" && return 0
  done
  if ! python3 -c "import urllib.request; urllib.request.urlopen('https://pypi.org/simple/$name/', timeout=10)" 2>/dev/null; then
    echo "SKIP: PyPI is not reachable, cannot install $spec into $venv"
    return 77
  fi
  echo "FAIL: pip install $spec failed twice although PyPI is reachable"
  return 1
}

lathe_pip_venv_install() {
  local venv=$1 rc=0 lock_fd
  mkdir -p "$(dirname "$venv")"
  exec {lock_fd}>"$venv.lock"
  flock "$lock_fd"
  lathe_pip_venv_install_locked "$@" || rc=$?
  flock -u "$lock_fd"
  exec {lock_fd}>&-
  return "$rc"
}

lathe_pip_venv() {
  local rc=0
  lathe_pip_venv_install "$@" || rc=$?
  [ "$rc" -eq 0 ] || exit "$rc"
}

# Sourced by the test scripts that need a package from PyPI in a cached venv.
# lathe_pip_venv VENV CHECK SPEC: unless CHECK (Python code) exits 0 in VENV, makes VENV and pip-installs
# SPEC (two tries: a transient network error should not fail a test run). When that fails, exits the
# calling script: 77 (ctest SKIP) if PyPI cannot be reached at all, else 1.
lathe_pip_venv() {
  local venv=$1 check=$2 spec=$3
  local name=${spec%%==*}
  "$venv/bin/python" -c "$check" 2>/dev/null && return 0
  python3 -m venv "$venv" || { echo "FAIL: python3 -m venv $venv"; exit 1; }
  local try
  for try in 1 2; do
    timeout 300 "$venv/bin/pip" install -q --disable-pip-version-check "$spec" && return 0
  done
  if ! python3 -c "import urllib.request; urllib.request.urlopen('https://pypi.org/simple/$name/', timeout=10)" 2>/dev/null; then
    echo "SKIP: PyPI is not reachable, cannot install $spec into $venv"
    exit 77
  fi
  echo "FAIL: pip install $spec failed twice although PyPI is reachable"
  exit 1
}

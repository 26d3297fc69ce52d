#!/usr/bin/env bash
# The venvs behind the Makefile's commands (`make help` lists those): run by make, not by hand.
#   setup   create .venv (a Python >= 3.12, the newest Django) with the app + dev group;
#           again only when pyproject.toml changed since
#   test    the test suite: the fast tests beside the slow ones in two shares (options
#           that pick tests, -m/-k/paths, run pytest as given); pytest options may follow
#   matrix  the fast tests (-m "not slow"), on Django 5.2 + django-tasks
#           and on Django 6.0,
#           each in its own venv (.venv-dj52, .venv-dj60); pytest options may follow
#   matrix-setup  only create (or update) those two venvs
#   dist    build the sdist and wheel into dist/, check them (twine check, contents), and
#           install the wheel into fresh venvs (Django 6.1; Django 5.2 + django-tasks)
# PYTHON=/path/to/python picks the interpreter of a new venv (else one on PATH or pyenv).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "[dev] $*" >&2; }

is_312() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; }

# Print the path of a Python >= 3.12 (preferring $PYTHON, then the given versions).
find_python() {
  local candidates=()
  [ -n "${PYTHON:-}" ] && candidates+=("$PYTHON")
  candidates+=("$@" python3.14 python3.13 python3.12)
  if command -v pyenv >/dev/null 2>&1; then
    local root; root=$(pyenv root)
    for v in "$@" python3.14 python3.13 python3.12; do
      candidates+=("$root"/versions/"${v#python}"*/bin/python3)
    done
  fi
  candidates+=(/usr/local/bin/python3 /usr/bin/python3 python3)
  for py in "${candidates[@]}"; do
    if command -v "$py" >/dev/null 2>&1 && is_312 "$py"; then
      echo "$py"; return 0
    fi
  done
  cat >&2 <<'EOF'
[dev] No Python >= 3.12 found (Django 6 needs it; this project supports 3.12 and 3.13).
[dev] Get one, then run this command again:
[dev]   Debian/Ubuntu: sudo apt-get install python3.12 python3.12-venv
[dev]                  (older releases: the deadsnakes PPA, or pyenv)
[dev]   macOS:         brew install python@3.12
[dev]   any system:    uv python install 3.12   or   pyenv install 3.12
[dev] or point PYTHON at one: make setup PYTHON=/path/to/python3.12
EOF
  return 1
}

# pip_in VENV ARGS...: pip install ARGS into VENV, naming each package as it comes; the
# whole output is kept in VENV/pip.log and shown if pip fails.
pip_in() {
  local venv=$1; shift
  if ! "$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar off "$@" \
      2>&1 | tee "$venv/pip.log" | awk '
        /^Collecting /{print "[dev]   getting " $2; fflush()}
        /^Obtaining file:/{print "[dev]   building this checkout (editable)"; fflush()}
        /^Installing collected packages: /{
          n = split(substr($0, 32), names, ", ")
          print "[dev]   installing " n " package" (n == 1 ? "" : "s"); fflush()}' >&2; then
    cat "$venv/pip.log" >&2
    say "pip failed in $venv (its output is above and in $venv/pip.log)"
    exit 1
  fi
}

# make_venv DIR [PYTHON_PREFERENCES...] -- PIP_ARGS...: create DIR with a Python >= 3.12
# (the preferred versions first) and install PIP_ARGS into it; again only when
# pyproject.toml changed since.
make_venv() {
  local dir=$1; shift
  local prefs=()
  while [ "$1" != "--" ]; do prefs+=("$1"); shift; done
  shift
  if ! is_312 "$dir/bin/python"; then
    local py
    py=$(find_python ${prefs[@]+"${prefs[@]}"}) || exit 1
    say "creating $dir with $py ($("$py" --version 2>&1))"
    rm -rf "$dir"
    "$py" -m venv "$dir"
  fi
  local stamp=$dir/.pgqueue-installed
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    say "installing into $dir: $* (first time: a minute or two)"
    pip_in "$dir" -U "pip>=25.1"
    # The distribution was called django-pgqueue before; drop an old editable install.
    "$dir/bin/python" -m pip uninstall -q -y django-pgqueue >/dev/null 2>&1 || true
    pip_in "$dir" "$@"
    say "$dir ready: Django $("$dir/bin/python" -c 'import django; print(django.get_version())')"
    touch "$stamp"
  fi
}

setup() { make_venv .venv python3.12 -- -e . --group dev; }

# The Django 5.2 LTS venv (with the django-tasks backport) and the Django 6.0 one (on
# Python 3.13 when there is one, so CI covers both Python versions we claim).
setup_matrix() {
  make_venv .venv-dj52 python3.12 -- -e ".[django52]" --group test
  make_venv .venv-dj60 python3.13 -- -e . "Django>=6.0,<6.1" --group test
}

# Build, check, and install the wheel alone into fresh venvs under build/ (no source tree
# on the path), once with the newest Django and once with the django52 extra.
dist() {
  setup
  say "building the sdist and wheel into dist/"
  rm -rf dist
  mkdir -p build
  if ! .venv/bin/python -m build --outdir dist . >build/build.log 2>&1; then
    cat build/build.log >&2; exit 1
  fi
  .venv/bin/twine check --strict dist/*
  .venv/bin/python .ci/check_dist.py
  local wheel; wheel=$(ls dist/*.whl)
  local py; py=$(find_python python3.12) || exit 1
  for variant in latest django52; do
    local venv=build/venv-wheel-$variant extra=""
    [ "$variant" = django52 ] && extra="[django52]"
    say "installing $(basename "$wheel")$extra into a fresh $venv"
    rm -rf "$venv"
    "$py" -m venv "$venv"
    pip_in "$venv" "$wheel$extra"
    (cd build && "../$venv/bin/python" -I ../.ci/smoke_wheel.py)
  done
}

# The test suite (make test): with options that pick tests (-m, -k, a path, a test id),
# pytest as given; otherwise three pytest runs side by side, each on test databases of
# its own: the fast tests, and the slow ones (manage.py subprocesses, which mostly wait
# on them) in two interleaved shares (--shard, tests/conftest.py). One after another
# they take over twenty minutes on a 2-core VM; side by side, the cores stay busy.
run_tests() {
  local arg
  for arg in "$@"; do
    case "$arg" in
      -m|-k|-m*|-k*|tests*|*::*|*.py) exec .venv/bin/python -m pytest "$@" ;;
    esac
  done
  local base=${PGQUEUE_TEST_DB:-test_pgqueue}
  mkdir -p build
  say "tests in three runs side by side: the fast ones here, the slow ones in two shares (output in build/test-slow-0.log, build/test-slow-1.log, shown at the end)"
  local pids=() i
  for i in 0 1; do
    PGQUEUE_TEST_DB="${base}_slow$i" .venv/bin/python -m pytest -m slow --shard "$i/2" "$@" \
      >"build/test-slow-$i.log" 2>&1 &
    pids+=($!)
  done
  local failed=0
  PGQUEUE_TEST_DB="${base}_fast" .venv/bin/python -m pytest -m "not slow" "$@" || failed=1
  for i in 0 1; do
    wait "${pids[$i]}" || failed=1
  done
  for i in 0 1; do
    say "the slow tests, share $i of 2 (build/test-slow-$i.log):"
    cat "build/test-slow-$i.log"
  done
  [ "$failed" -eq 0 ] && say "all three runs passed" || say "a run failed: see above"
  return "$failed"
}

cmd=${1:-}
shift || true
case "$cmd" in
  setup) setup ;;
  test) run_tests "$@" ;;
  matrix-setup) setup_matrix ;;
  matrix)
    setup_matrix
    # The whole fast suite on each older Django (issue 28: CI runs it on every Django the
    # README promises); the slow process tests run on the newest only, in make test.
    failed=0  # both run, whatever the first gives
    for venv in .venv-dj52 .venv-dj60; do
      say "fast tests on $("$venv/bin/python" -c 'import django, sys; print(f"Django {django.get_version()}, Python {sys.version.split()[0]}")') ($venv)"
      "$venv/bin/python" -m pytest -m "not slow" "$@" || failed=1
    done
    exit "$failed"
    ;;
  dist) dist ;;
  *) sed -n '2,13p' "$0" >&2; exit 2 ;;
esac

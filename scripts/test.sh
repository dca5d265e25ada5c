#!/usr/bin/env bash
# The whole test suite, from nothing: set up .venv, then run pytest (the slow campaigns in a second call).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
. .venv/bin/activate
# Four workers (pytest-xdist): the suite waits on servers and child processes far more than it computes. A test
# file's tests stay on one worker (its module fixtures are built once); tests/conftest.py says how tests are grouped.
python -m pytest -q -m "not slow" -n 4 --dist loadgroup "$@"
# Exit 5 means no test is marked slow (or none was selected): nothing failed.
python -m pytest -q -m slow "$@" || { status=$?; [ "$status" -eq 5 ] || exit "$status"; }

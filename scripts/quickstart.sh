#!/usr/bin/env bash
# The quick-start, from nothing: preprocess a corpus, train a small GPT, kill it, resume, compare.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh examples
. .venv/bin/activate
python examples/quickstart/run_all.py "$@"

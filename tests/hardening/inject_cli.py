"""Run the ``guideloom`` command with a SIGKILL injected at the k-th call of a system function.

    python inject_cli.py NAME K WHEN ARGS...     e.g.  os.fsync 3 after tokenize IN OUT --tokenizer T
    python inject_cli.py count 0 - ARGS...       run normally, print the call counts as JSON on stderr

NAME is one of kill_harness.CALL_POINTS (``os.fsync``, ``os.link``, ``open``, ...), WHEN ``before``
or ``after`` the real call. Only this process is patched (spawned workers are not).
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kill_harness import _install_call_points


def main() -> int:
    name, k, when, *arguments = sys.argv[1:]
    counts: Counter[str] = Counter()
    report = sys.stderr.fileno()
    _install_call_points(report, None if name == "count" else (name, int(k), when), counts)
    from guideloom._cli import main as cli

    status = cli(arguments)
    if name == "count":
        os.write(report, ("\nCOUNTS " + json.dumps(dict(counts)) + "\n").encode())
    return status


if __name__ == "__main__":
    raise SystemExit(main())

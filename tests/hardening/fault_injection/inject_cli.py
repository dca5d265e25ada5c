"""Run the ``guideloom`` command with a SIGKILL injected at the k-th call of a system function.

    python -m tests.hardening.fault_injection.inject_cli NAME K WHEN ARGS...  e.g.  os.fsync 3 after tokenize IN OUT
    python -m tests.hardening.fault_injection.inject_cli count 0 - ARGS...    run normally, print the call counts

NAME is one of ``harness.CALL_POINTS`` (``os.fsync``, ``os.link``, ``open``, ...), WHEN ``before``
or ``after`` the real call. Only this process is patched (spawned workers are not).
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter

from tests.hardening.fault_injection.harness import _install_call_points


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

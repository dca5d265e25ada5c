"""Write install_status.json: for each peer distribution, "ok" or why it is unusable.

Called by benchmarks/install_peers.sh (``python -m benchmarks.peers.check_install``) with the pip
outcome of each peer as ``dist=result`` arguments; a peer that pip installed is then imported through
its adapter, so a library that installs but fails to import is caught too.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.peers import PEERS, PeerUnavailable, load_peer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("pip_results", nargs="*", help="dist=result pairs from the install script")
    args = ap.parse_args()
    pip_results = dict(a.split("=", 1) for a in args.pip_results)

    status: dict[str, str] = {}
    for key, info in PEERS.items():
        if info.dist is None:
            continue
        result = pip_results.get(info.dist, "not attempted by the install script")
        if result == "ok":
            try:
                mod = load_peer(key, use_recorded=False)
                print(f"{key:10s} {info.dist} {mod.version()}: ok", file=sys.stderr)
            except PeerUnavailable as exc:
                result = f"installed but unusable: {exc}"
        status[info.dist] = result
    for dist, result in pip_results.items():  # distributions no adapter wraps
        status.setdefault(dist, result)
    args.out.write_text(json.dumps(status, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()

"""Smoke test for the peer adapters on a small synthetic dataset.

Run in the benchmark venv::

    .venv-bench/bin/python -m benchmarks.peers.smoke [--peers naive,torchdata] [--num-workers 0]

Each peer runs in its own subprocess (so a crash, hang or leaked state in one
library cannot take the others down). For each it writes the token documents
and the records, reads one full shuffled epoch of each and checks it (every
token row is a window of the original stream, no window twice, the expected
count; every record exactly once with its tokens intact), and measures
resuming from the middle of the token epoch. Prints a table at the end.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.harness import REPOSITORY, child_environment, module_command
from benchmarks.peers import PEERS, PeerUnavailable, load_peer, resume_first_batch

VOCAB = 50_257


def make_documents(n_tokens: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    docs, total = [], 0
    while total < n_tokens:
        n = int(rng.integers(100, 4001))
        docs.append(rng.integers(0, VOCAB, size=n, dtype=np.uint32))
        total += n
    return docs


def make_records(n_records: int, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed + 1)
    return [
        {"document_id": 1000 + i, "tokens": rng.integers(0, VOCAB, size=int(rng.integers(50, 501))).tolist()}
        for i in range(n_records)
    ]


def check_token_epoch(mod: Any, out: Path, stream: np.ndarray, a: argparse.Namespace) -> dict[str, Any]:
    seq, bs = a.sequence_length, a.batch_size
    expected_batches = (len(stream) // seq) // bs
    # Positions of every token value, to find where a returned row sits in the stream.
    order = np.argsort(stream, kind="stable")
    sorted_values = stream[order]

    def locate(row: np.ndarray) -> int | None:
        lo = np.searchsorted(sorted_values, row[0], side="left")
        hi = np.searchsorted(sorted_values, row[0], side="right")
        for p in order[lo:hi]:
            if p + seq <= len(stream) and np.array_equal(stream[p : p + seq], row):
                return int(p)
        return None

    t0 = time.perf_counter()
    seen: list[int] = []
    n_batches = 0
    bad = None
    for batch in mod.token_batches(out, sequence_length=seq, batch_size=bs, seed=a.seed, num_workers=a.num_workers):
        if n_batches == 0:
            t_first = time.perf_counter() - t0
        if not isinstance(batch, torch.Tensor) or batch.dtype != torch.int64 or tuple(batch.shape) != (bs, seq):
            got = f"{type(batch).__name__} {getattr(batch, 'dtype', '')} {tuple(getattr(batch, 'shape', ()))}"
            bad = f"batch {n_batches}: {got}"
            break
        for row in batch.numpy():
            p = locate(row)
            if p is None:
                bad = f"batch {n_batches}: a row is not a window of the written stream"
                break
            seen.append(p)
        if bad:
            break
        n_batches += 1
    seconds = time.perf_counter() - t0
    if bad is None and n_batches != expected_batches:
        bad = f"{n_batches} batches, expected {expected_batches}"
    if bad is None and len(set(seen)) != len(seen):
        bad = f"{len(seen) - len(set(seen))} windows repeated within the epoch"
    if bad is None and seen == sorted(seen):
        bad = "windows came out in stream order (not shuffled)"
    return {
        "ok": bad is None,
        "problem": bad,
        "batches": n_batches,
        "seconds": round(seconds, 3),
        "first_batch_s": round(t_first, 3) if n_batches else None,
        "aligned": all(p % seq == 0 for p in seen),
    }


def check_document_epoch(mod: Any, out: Path, records: list[dict[str, Any]], a: argparse.Namespace):
    by_id = {r["document_id"]: r["tokens"] for r in records}
    t0 = time.perf_counter()
    seen: list[int] = []
    bad = None
    n = 0
    for batch in mod.document_batches(out, batch_size=a.doc_batch_size, seed=a.seed, num_workers=a.num_workers):
        ids = batch["document_id"].tolist()
        for j, doc_id in enumerate(ids):
            length = int(batch["lengths"][j])
            if batch["tokens"][j, :length].tolist() != by_id.get(doc_id):
                bad = f"document {doc_id} came back with different tokens"
                break
        if bad:
            break
        seen.extend(ids)
        n += 1
    seconds = time.perf_counter() - t0
    if bad is None and sorted(seen) != sorted(by_id):
        bad = f"{len(seen)} documents seen, {len(set(seen))} distinct, expected {len(by_id)}"
    if bad is None and seen == sorted(seen):
        bad = "documents came out in write order (not shuffled)"
    return {"ok": bad is None, "problem": bad, "batches": n, "seconds": round(seconds, 3)}


def run_one(key: str, a: argparse.Namespace) -> dict[str, Any]:
    res: dict[str, Any] = {"peer": key}
    try:
        mod = load_peer(key)
    except PeerUnavailable as exc:
        return {**res, "status": "unavailable", "reason": str(exc)}
    res.update(name=mod.NAME, version=mod.version())
    docs = make_documents(a.tokens, a.seed)
    stream = np.concatenate(docs)
    records = make_records(a.records, a.seed)

    def step(name: str, fn: Any) -> Any:
        t0 = time.perf_counter()
        try:
            out = fn()
            res[name] = out if isinstance(out, dict) else {"ok": True}
        except Exception as exc:
            res[name] = {"ok": False, "problem": f"{type(exc).__name__}: {exc}"[:300]}
            if a.verbose:
                traceback.print_exc()
        res[name]["step_s"] = round(time.perf_counter() - t0, 3)
        return res[name]["ok"]

    with tempfile.TemporaryDirectory(prefix=f"peer-smoke-{key}-") as tmp:
        tok_dir, doc_dir = Path(tmp) / "tokens", Path(tmp) / "docs"
        if step("write_tokens", lambda: mod.write_tokens(iter(docs), tok_dir, sequence_length=a.sequence_length)):
            if step("token_epoch", lambda: check_token_epoch(mod, tok_dir, stream, a)):
                step("resume", lambda: _resume(mod, tok_dir, a))
        if step("write_documents", lambda: mod.write_documents(iter(records), doc_dir)):
            step("document_epoch", lambda: check_document_epoch(mod, doc_dir, records, a))
    res["status"] = "done"
    return res


def _resume(mod: Any, out: Path, a: argparse.Namespace) -> dict[str, Any]:
    r = resume_first_batch(
        mod,
        out,
        0.5,
        sequence_length=a.sequence_length,
        batch_size=a.batch_size,
        seed=a.seed,
        num_workers=a.num_workers,
    )
    return {"ok": True, **{k: v for k, v in vars(r).items() if v is not None}}


def fmt(step: dict[str, Any] | None, kind: str) -> str:
    if step is None:
        return "-"
    if not step.get("ok"):
        return "FAIL"
    if kind == "resume":
        if not step.get("supported"):
            return "unsupported"
        return f"{step['seconds'] * 1000:.0f}ms {'same' if step['matches'] else 'DIFFERENT'}"
    if kind == "epoch":
        return f"ok {step['batches']}b {step['seconds']:.1f}s"
    return f"ok {step['step_s']:.1f}s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", default=",".join(PEERS), help="comma-separated keys (default: all)")
    ap.add_argument("--tokens", type=int, default=2_000_000)
    ap.add_argument("--records", type=int, default=2_000)
    ap.add_argument("--sequence-length", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--doc-batch-size", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=240, help="seconds per peer")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()

    if a.one:
        print("SMOKE-RESULT " + json.dumps(run_one(a.one, a)), flush=True)
        return

    passthrough = [
        f"--tokens={a.tokens}", f"--records={a.records}", f"--sequence-length={a.sequence_length}",
        f"--batch-size={a.batch_size}", f"--doc-batch-size={a.doc_batch_size}", f"--seed={a.seed}",
        f"--num-workers={a.num_workers}",
    ] + (["--verbose"] if a.verbose else [])  # fmt: skip
    results = []
    for key in a.peers.split(","):
        t0 = time.perf_counter()
        print(f"--- {key}", file=sys.stderr, flush=True)
        try:
            proc = subprocess.run(
                module_command("benchmarks.peers.smoke", "--one", key, *passthrough),
                capture_output=True, text=True, timeout=a.timeout, cwd=REPOSITORY, env=child_environment(),
            )  # fmt: skip
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("SMOKE-RESULT ")]
            if lines:
                r = json.loads(lines[-1].removeprefix("SMOKE-RESULT "))
            else:
                tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                r = {"peer": key, "status": "crashed", "reason": f"exit {proc.returncode}: {tail}"}
            if a.verbose or not lines:
                sys.stderr.write(proc.stderr[-4000:])
        except subprocess.TimeoutExpired:
            r = {"peer": key, "status": "timeout", "reason": f"no result within {a.timeout:.0f}s"}
        r["wall_s"] = round(time.perf_counter() - t0, 1)
        results.append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)

    if a.json:
        a.json.write_text(json.dumps(results, indent=2))
    cols = ["peer", "version", "write tok", "token epoch", "resume @50%", "write docs", "doc epoch", "wall"]
    rows = []
    for r in results:
        if r["status"] != "done":
            rows.append([r["peer"], r.get("version", "-"), r["status"].upper(), "", "", "", "", f"{r['wall_s']}s"])
            continue
        rows.append([
            r["peer"], r["version"], fmt(r.get("write_tokens"), "write"), fmt(r.get("token_epoch"), "epoch"),
            fmt(r.get("resume"), "resume"), fmt(r.get("write_documents"), "write"),
            fmt(r.get("document_epoch"), "epoch"), f"{r['wall_s']}s",
        ])  # fmt: skip
    widths = [max(len(str(x)) for x in col) for col in zip(cols, *rows, strict=True)]
    line = lambda xs: "| " + " | ".join(str(x).ljust(w) for x, w in zip(xs, widths, strict=True)) + " |"  # noqa: E731
    print(f"{a.tokens:,} tokens, {a.records:,} records, num_workers={a.num_workers}. Times include this test's")
    print("own checking of every row and are not benchmark numbers.")
    print(line(cols))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print(line(row))
    print()
    for r in results:
        notes = []
        if r["status"] != "done":
            notes.append(r.get("reason", ""))
        for k in ("write_tokens", "token_epoch", "resume", "write_documents", "document_epoch"):
            s = r.get(k) or {}
            if s.get("problem"):
                notes.append(f"{k}: {s['problem']}")
            if k == "resume" and s.get("reason"):
                notes.append(f"resume: {s['reason']}")
            if k == "token_epoch" and s.get("ok") and not s.get("aligned"):
                notes.append("token windows not aligned to multiples of sequence_length")
        if notes:
            print(f"{r['peer']}: " + "; ".join(notes))


if __name__ == "__main__":
    main()

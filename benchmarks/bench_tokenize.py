"""Tokenize benchmark: one JSONL corpus, three ways, in one run.

1. ``guideloom tokenize --workers 2`` (the command, in a fresh process);
2. ``guideloom tokenize --ray=ADDRESS`` on a local 2-CPU Ray cluster that is already running, and
   ``guideloom tokenize --ray`` starting its own local cluster (cluster start-up included);
3. Hugging Face ``datasets``: ``load_dataset("json")`` + ``map(batched=True, num_proc=2)`` with the
   same ``tokenizers`` tokenizer (ids + end-of-text id, as guideloom writes them) + ``save_to_disk``.

Every way runs as its own subprocess and is timed from outside (wall time, interpreter start-up and
imports included), on the same files, with the same byte-level BPE tokenizer (trained here on a
sample). Token counts are checked to agree. ``datasets`` may live in another interpreter
(``--hf-python``, default: ``.venv-bench/bin/python`` when this interpreter lacks it).
Prints a Markdown table and writes JSON (default ``benchmarks/results/tokenize.json``).

    python -m benchmarks.bench_tokenize                  # 8 files of 2 MiB
    python -m benchmarks.bench_tokenize --files 4 --mib 1   # a quick run
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    REPOSITORY,
    RESULTS,
    argument_parser,
    child_environment,
    machine,
    run_child,
    write_results,
)

WORDS = (
    "the of and to in is was for on that with as by at from his her which data model train token "
    "loader shard storage python batch epoch resume window document stream checkpoint gradient "
    "learning rate layer attention transformer sequence encode decode vocabulary merge byte"
).split()

HF_SCRIPT = """
import json, sys, time
started = time.perf_counter()
from datasets import load_dataset
from tokenizers import Tokenizer
files, tokenizer_path, output, cache = json.loads(sys.argv[1])
tokenizer = Tokenizer.from_file(tokenizer_path)
eos = tokenizer.token_to_id("<|endoftext|>")

def encode(batch):
    encoded = tokenizer.encode_batch(batch["text"], add_special_tokens=False)
    return {"input_ids": [item.ids + [eos] for item in encoded]}

dataset = load_dataset("json", data_files=files, split="train", cache_dir=cache)
tokenized = dataset.map(encode, batched=True, num_proc=2, remove_columns=["text"])
tokenized.save_to_disk(output)
tokens = sum(len(ids) for ids in tokenized["input_ids"])
print(json.dumps({"tokens": tokens, "documents": len(tokenized), "inner_seconds": time.perf_counter() - started}))
"""


def make_corpus(directory: Path, files: int, mib: float, seed: int = 0) -> list[Path]:
    """``files`` JSONL files of about ``mib`` MiB each: documents of 20-400 random words."""
    generator = random.Random(seed)
    directory.mkdir(parents=True)
    paths = []
    for part in range(files):
        path = directory / f"part-{part:03d}.jsonl"
        with open(path, "w", encoding="utf-8") as file:
            while file.tell() < mib * 2**20:
                words = generator.choices(WORDS, k=generator.randint(20, 400))
                file.write(json.dumps({"text": " ".join(words) + "."}) + "\n")
        paths.append(path)
    return paths


def storage_tokens(path: Path) -> int:
    from guideloom import TokenStorage

    with TokenStorage(path).sync_reader() as reader:
        return int(reader.token_count)


def default_hf_python() -> str:
    if importlib.util.find_spec("datasets") is not None:
        return sys.executable
    return str(REPOSITORY / ".venv-bench" / "bin" / "python")


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--mib", type=float, default=2.0, help="MiB of JSONL per file")
    parser.add_argument("--hf-python", default=None, help="an interpreter with datasets and tokenizers")
    parser.add_argument("--dir", default=None, help="where to put the corpus and outputs (default: a temp dir)")
    parser.add_argument("--out", default=str(RESULTS / "tokenize.json"))
    options = parser.parse_args()

    import ray

    from guideloom.tokenize import train_tokenizer

    work = Path(tempfile.mkdtemp(prefix="bench-tokenize-", dir=options.dir))
    try:
        inputs = make_corpus(work / "corpus", options.files, options.mib)
        corpus_bytes = sum(path.stat().st_size for path in inputs)
        tokenizer = train_tokenizer([inputs[0]], 8000, work / "tokenizer.json")
        command = [sys.executable, "-m", "guideloom", "tokenize", *map(str, inputs)]
        env = child_environment()
        rows: list[dict[str, Any]] = []

        def record(name: str, seconds: float, tokens: int) -> None:
            rows.append(
                {"way": name, "seconds": seconds, "tokens": tokens, "mib_per_s": corpus_bytes / 2**20 / seconds}
            )
            print(f"{name}: {seconds:.1f} s", file=sys.stderr)

        out = work / "workers"
        seconds, _ = run_child(
            [*command, str(out), "--tokenizer", str(tokenizer), "--workers", "2", "--quiet"], env=env
        )
        record("guideloom tokenize --workers 2", seconds, storage_tokens(out))

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            address = ray.get_runtime_context().gcs_address
            out = work / "ray-running"
            ray_env = {**os.environ, "PYTHONPATH": env["PYTHONPATH"]}  # with the cluster's authentication mode
            arguments = [str(out), "--tokenizer", str(tokenizer), f"--ray={address}", "--quiet"]
            seconds, _ = run_child([*command, *arguments], env=ray_env)
            record("guideloom tokenize --ray (cluster running)", seconds, storage_tokens(out))
        finally:
            ray.shutdown()

        out = work / "ray-start"
        ray_env = {**env, "RAY_ADDRESS": ""}
        seconds, _ = run_child([*command, str(out), "--tokenizer", str(tokenizer), "--ray", "--quiet"], env=ray_env)
        record("guideloom tokenize --ray (starts its cluster)", seconds, storage_tokens(out))

        hf_arguments = json.dumps([[str(p) for p in inputs], str(tokenizer), str(work / "hf"), str(work / "hf-cache")])
        hf_python = options.hf_python or default_hf_python()
        seconds, printed = run_child([hf_python, "-c", HF_SCRIPT, hf_arguments])
        record(
            "datasets map(num_proc=2) + save_to_disk", seconds, json.loads(printed.strip().splitlines()[-1])["tokens"]
        )

        counts = {row["tokens"] for row in rows}
        assert len(counts) == 1, f"the ways wrote different token counts: {rows}"
        result = {
            "corpus": {"files": options.files, "bytes": corpus_bytes, "tokens": counts.pop()},
            "machine": {**machine(), "ray": ray.__version__},
            "rows": rows,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_results("tokenize", result, to=Path(options.out))
    tokens = result["corpus"]["tokens"]
    print(f"{options.files} JSONL files, {corpus_bytes / 2**20:.1f} MiB, {tokens:,} tokens; wall time per way\n")
    print("| way | seconds | MiB/s | tokens/s |")
    print("|---|---:|---:|---:|")
    for row in rows:
        print(f"| {row['way']} | {row['seconds']:.1f} | {row['mib_per_s']:.2f} | {tokens / row['seconds']:,.0f} |")


if __name__ == "__main__":
    main()

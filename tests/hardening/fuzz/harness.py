"""Fuzz everything guideloom reads from disk, with Hypothesis, in this (expendable) process.

    python -m tests.hardening.fuzz.harness --targets header,footer,index,size,bytes,layout --examples 300 --seed 1 \
        [--no-loader]

Each case copies a pristine storage (raw-bytes documents or uint16 tokens, three shards with empty
records and padding), damages it as drawn, then opens it, reads every record (one by one, in one
``read_many``, the token stream and document starts), computes the fingerprint, runs ``verify()``,
the ``guideloom verify`` and ``guideloom inspect --shards`` commands, and iterates one epoch of a
``StatefulDataLoader``. The properties:

* the only exceptions are ``CorruptStorageError`` and ``FormatMismatchError`` (and
  ``StorageNotFoundError`` when the header was removed); the commands return 0, 1 or 2, never raise;
* nothing hangs (a 10 s alarm per case) and nothing crashes this process (the caller checks it
  exits normally; a segfault in a mapping or ``np.frombuffer`` would kill it);
* no allocation exceeds the storage's size: tracemalloc's peak over a case, minus what was allocated
  before, stays below the bytes on disk plus 1 MiB;
* damage is never silent: a shard file whose bytes changed (its checksums not recomputed) is an
  error or a ``verify()`` problem; a case that passes everything reads exactly the pristine records
  (for damage that cannot be detected by design, such as a footer rewritten with a valid checksum,
  only the first three properties are required).

Prints ``CASES <target> <n>`` per target, then ``OK`` or the falsifying example and ``FAILED``.
Exit status 0 when every property held.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import functools
import io
import json
import os
import re
import shutil
import signal
import stat
import struct
import tempfile
import traceback
import tracemalloc
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import guideloom._cli
from guideloom import CorruptStorageError, FormatMismatchError, StorageNotFoundError
from guideloom._cli import main as cli
from guideloom._shards.layout import FOOTER
from tests.helpers.batches import comparable
from tests.helpers.shard_files import CRAFTED_SHARD_NAMES, FOOTER_FIELDS, shard_file, with_footer
from tests.helpers.storages import open_storage

KINDS = ("documents", "tokens")
SHARDS = (0, 1, 2)
SLACK = 1 << 20
ALARM_SECONDS = 10
VALID_NAME = re.compile(r"[0-9]{12}\.shard")


class Hang(BaseException):
    """Raised by the alarm: a case ran too long (a BaseException, so no ``except OSError`` swallows it)."""


def _alarm(signum: int, frame: Any) -> None:
    raise Hang(f"no answer within {ALARM_SECONDS} s")


# ----------------------------------------------------------------------------- pristine storages


def make_pristine(path: Path, kind: str) -> None:
    rng = np.random.default_rng(KINDS.index(kind))
    storage = open_storage(path, kind)
    with storage.sync_writer() as writer:
        for shard, count in zip(SHARDS, (3, 7, 1), strict=True):
            for record in range(count):
                size = 0 if record == 1 else int(rng.integers(1, 40))
                if kind == "tokens":
                    writer.append(shard, rng.integers(0, 2**16, size, dtype=np.uint16))
                else:
                    writer.append(shard, rng.bytes(size))


def read_all(path: Path, kind: str) -> list[Any]:
    with open_storage(path, kind).sync_reader() as reader:
        return [comparable(record) for record in reader]


# ----------------------------------------------------------------------------- damage


def _footer(data: bytes) -> list[Any]:
    return list(FOOTER.unpack(data[-FOOTER.size :]))


def apply(path: Path, mutation: dict[str, Any]) -> None:
    """Damage the storage at ``path`` as ``mutation`` says."""
    op = mutation["op"]
    header = path / "guideloom.json"
    file = shard_file(path, mutation.get("shard", 0))
    if op == "header-bytes":
        header.write_bytes(mutation["data"])
    elif op == "header-json":
        header.write_bytes(json.dumps(mutation["value"]).encode())
    elif op == "header-edit":
        data = bytearray(header.read_bytes())
        for position, value in mutation["edits"]:  # set, delete (None) or insert (negative position)
            if position < 0 and value is not None:
                data.insert(-position % (len(data) + 1), value)
            elif data and value is None:
                del data[position % len(data)]
            elif data:
                data[position % len(data)] = value
        header.write_bytes(bytes(data[: mutation["keep"]]))
    elif op == "header-nest":
        opening, closing = mutation["brackets"]
        header.write_bytes(opening.encode() * mutation["depth"] + closing.encode() * mutation["closed"])
    elif op == "header-special":
        what = mutation["what"]
        header.unlink()
        if what == "directory":
            header.mkdir()
        elif what == "fifo":
            os.mkfifo(header)
        elif what == "dangling-symlink":
            header.symlink_to(path / "nowhere")
        elif what == "symlink-loop":
            header.symlink_to(header)
        elif what == "huge-sparse":
            with open(header, "wb") as handle:
                handle.truncate(1 << 32)
        elif what == "empty":
            header.write_bytes(b"")
    elif op == "footer-fields":
        data = file.read_bytes()
        fields = _footer(data)
        for name, value in mutation["fields"].items():
            fields[FOOTER_FIELDS.index(name)] = value
        if mutation["fix_crc"]:
            data = with_footer(data, fields)
        else:
            body = FOOTER.pack(*fields)[: FOOTER.size - 12]
            data = data[: -FOOTER.size] + body + data[-12:]
        file.write_bytes(data)
    elif op in ("footer-bytes", "bytes"):
        data = bytearray(file.read_bytes())
        base = len(data) - FOOTER.size if op == "footer-bytes" else 0
        for position, value in mutation["edits"]:
            data[(base + position) % len(data)] = value
        file.write_bytes(bytes(data))
    elif op == "index-set":
        data = bytearray(file.read_bytes())
        fields = _footer(bytes(data))
        record_count, data_size = fields[4], fields[5]
        start = (data_size + 7) // 8 * 8
        for position, value in mutation["entries"]:
            struct.pack_into("<Q", data, start + 8 * (position % (record_count + 1)), value)
        if mutation["fix_crc"]:
            fields[7] = zlib.crc32(bytes(data[start : start + 8 * (record_count + 1)]))
            data = bytearray(with_footer(bytes(data), fields))
        file.write_bytes(bytes(data))
    elif op == "truncate":
        size = file.stat().st_size
        os.truncate(file, mutation["size"] % (size + 1))
    elif op == "splice":
        data = file.read_bytes()
        start = mutation["start"] % (len(data) + 1)
        stop = min(len(data), start + mutation["remove"])
        file.write_bytes(data[:start] + mutation["insert"] + data[stop:])
    elif op == "crafted-name":
        name = mutation["name"]  # str, or bytes that need not be UTF-8
        target = os.path.join(os.fsencode(path / "shards"), name if isinstance(name, bytes) else os.fsencode(name))
        if mutation["content"] == "symlink":
            os.symlink(shard_file(path, 1), target)
        else:
            with open(target, "wb") as handle:
                content = mutation["content"]
                handle.write(shard_file(path, 1).read_bytes() if content == "copy" else content)
    elif op == "replace-shard":
        what = mutation["what"]
        file.unlink()
        if what == "directory":
            file.mkdir()
        elif what == "fifo":
            os.mkfifo(file)
        elif what == "symlink":
            file.symlink_to(shard_file(path, 2))
        elif what == "dangling-symlink":
            file.symlink_to(path / "nowhere")
        elif what == "empty":
            file.write_bytes(b"")
        elif what == "socket":
            import socket

            with socket.socket(socket.AF_UNIX) as server:
                with contextlib.chdir(file.parent):
                    server.bind(file.name)
    elif op == "replace-shards-dir":
        what = mutation["what"]
        shutil.rmtree(path / "shards")
        if what == "file":
            (path / "shards").write_bytes(b"not a directory")
        elif what == "fifo":
            os.mkfifo(path / "shards")
        elif what == "dangling-symlink":
            (path / "shards").symlink_to(path / "nowhere")
        elif what == "symlink-loop":
            (path / "shards").symlink_to(path / "shards")
    else:
        raise AssertionError(f"unknown mutation {op}")


# ----------------------------------------------------------------------------- strategies

_u64 = st.one_of(
    st.sampled_from([0, 1, 2, 3, 7, 8, 9, 63, 64, 65, 2**31, 2**32 - 1, 2**32, 2**60, 2**63 - 1, 2**63, 2**64 - 1]),
    st.integers(0, 2**64 - 1),
    st.integers(0, 300),
)
_u32 = st.one_of(st.sampled_from([0, 1, 2, 2**31, 2**32 - 1]), st.integers(0, 2**32 - 1))
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)
_header_values = {
    "layout_version": st.one_of(st.sampled_from([1, 0, 2, 1.0, True, "1", None, -1, 2**70]), _json),
    "kind": st.one_of(st.sampled_from(["documents", "tokens", "Documents", "", None, 1]), _json),
    "format": st.one_of(st.sampled_from(["raw-bytes", "json", "pickle", "", None]), _json),
    "dtype": st.one_of(st.sampled_from(["uint16", "uint32", "float32", "<u2", "object", "", None]), _json),
}
_header_dict = st.fixed_dictionaries({}, optional=_header_values).flatmap(
    lambda fields: st.dictionaries(st.text(max_size=8), _json, max_size=2).map(lambda extra: {**extra, **fields})
)
_byte = st.integers(0, 255)

MUTATIONS: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "header": st.one_of(
        st.builds(lambda data: {"op": "header-bytes", "data": data}, st.binary(max_size=300)),
        st.builds(lambda value: {"op": "header-json", "value": value}, _header_dict | _json),
        st.builds(
            lambda edits, keep: {"op": "header-edit", "edits": edits, "keep": keep},
            st.lists(st.tuples(st.integers(-100, 100), st.none() | _byte), min_size=1, max_size=4),
            st.integers(0, 200),
        ),
        st.builds(
            lambda brackets, depth, closed: {
                "op": "header-nest",
                "brackets": brackets,
                "depth": depth,
                "closed": closed,
            },
            st.sampled_from([("[", "]"), ("{", "}"), ('["', "]"), ('{"a":', "}")]),
            st.integers(1, 70000),
            st.integers(0, 10),
        ),
        st.builds(
            lambda what: {"op": "header-special", "what": what},
            st.sampled_from(
                ["delete", "directory", "fifo", "dangling-symlink", "symlink-loop", "huge-sparse", "empty"]
            ),
        ),
    ),
    "footer": st.one_of(
        st.builds(
            lambda shard, fields, fix: {"op": "footer-fields", "shard": shard, "fields": fields, "fix_crc": fix},
            st.sampled_from(SHARDS),
            st.fixed_dictionaries(
                {},
                optional={
                    "magic": st.binary(min_size=8, max_size=8),
                    "version": _u32,
                    "flags": _u32,
                    "shard": _u64,
                    "record_count": _u64,
                    "data_size": _u64,
                    "data_crc": _u32,
                    "index_crc": _u32,
                    "header_crc": _u32,
                },
            ).filter(bool),
            st.booleans(),
        ),
        st.builds(
            lambda shard, edits: {"op": "footer-bytes", "shard": shard, "edits": edits},
            st.sampled_from(SHARDS),
            st.lists(st.tuples(st.integers(0, FOOTER.size - 1), _byte), min_size=1, max_size=6),
        ),
    ),
    "index": st.builds(
        lambda shard, entries, fix: {"op": "index-set", "shard": shard, "entries": entries, "fix_crc": fix},
        st.sampled_from(SHARDS),
        st.lists(st.tuples(st.integers(0, 7), _u64), min_size=1, max_size=4),
        st.booleans(),
    ),
    "size": st.one_of(
        st.builds(
            lambda shard, size: {"op": "truncate", "shard": shard, "size": size},
            st.sampled_from(SHARDS),
            st.integers(0, 500),
        ),
        st.builds(
            lambda shard, start, remove, insert: {
                "op": "splice",
                "shard": shard,
                "start": start,
                "remove": remove,
                "insert": insert,
            },
            st.sampled_from(SHARDS),
            st.integers(0, 400),
            st.integers(0, 70),
            st.binary(max_size=70),
        ),
    ),
    "bytes": st.builds(
        lambda shard, edits: {"op": "bytes", "shard": shard, "edits": edits},
        st.sampled_from(SHARDS),
        st.lists(st.tuples(st.integers(0, 400), _byte), min_size=1, max_size=8),
    ),
    "layout": st.one_of(
        st.builds(
            lambda name, content: {"op": "crafted-name", "name": name, "content": content},
            st.one_of(
                st.sampled_from([*CRAFTED_SHARD_NAMES, "000000000005.shard"]),  # the last: a new shard, valid
                st.text(
                    st.characters(exclude_characters="/\x00", exclude_categories=("Cs",)), min_size=1, max_size=24
                ).filter(lambda name: name not in (".", "..")),
                st.binary(min_size=1, max_size=24).filter(
                    lambda name: b"/" not in name and b"\x00" not in name and name not in (b".", b"..")
                ),
            ),
            st.sampled_from(["copy", "symlink", b"", b"junk" * 20]),
        ),
        st.builds(
            lambda shard, what: {"op": "replace-shard", "shard": shard, "what": what},
            st.sampled_from(SHARDS),
            st.sampled_from(["directory", "fifo", "symlink", "dangling-symlink", "empty", "socket"]),
        ),
        st.builds(
            lambda what: {"op": "replace-shards-dir", "what": what},
            st.sampled_from(["file", "fifo", "dangling-symlink", "symlink-loop", "missing"]),
        ),
    ),
}
ALLOWED = (CorruptStorageError, FormatMismatchError)
guideloom._cli._parser = functools.cache(guideloom._cli._parser)  # type: ignore[method-assign]  # build it once


# ----------------------------------------------------------------------------- one case


class Fuzzer:
    def __init__(self, root: Path, loader: bool) -> None:
        self.root = root
        self.loader = loader
        self.pristine: dict[str, Path] = {}
        self.records: dict[str, list[Any]] = {}
        self.counts: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()
        self.peak = 0
        for kind in KINDS:
            self.pristine[kind] = root / f"pristine-{kind}"
            make_pristine(self.pristine[kind], kind)
            self.records[kind] = read_all(self.pristine[kind], kind)
        if loader:
            from guideloom import StatefulDataLoader

            self.loader_class = StatefulDataLoader
        signal.signal(signal.SIGALRM, _alarm)
        for kind in KINDS:  # warm up: first calls import modules and build caches, not measured
            assert self._probe(self.pristine[kind], kind) == ("ok", self.records[kind])

    def run(self, target: str, kind: str, mutation: dict[str, Any]) -> None:
        self.counts[target] += 1
        path = self.root / "case"
        if path.exists() or path.is_symlink():
            shutil.rmtree(path)
        shutil.copytree(self.pristine[kind], path, symlinks=True)
        (self.root / "last-case.json").write_text(repr((target, kind, mutation)))
        before = {name: (path / "shards" / name).read_bytes() for name in os.listdir(path / "shards")}
        apply(path, mutation)
        changed = self._changed(path, before)
        on_disk = _bytes_on_disk(path)
        tracemalloc.start()  # traced only while probing: Hypothesis itself runs at full speed
        signal.setitimer(signal.ITIMER_REAL, ALARM_SECONDS)
        try:
            outcome, records = self._probe(path, kind)
        except Hang as hang:
            raise AssertionError(f"hang: {hang}") from None
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            grown = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        self.peak = max(self.peak, grown)
        assert grown <= on_disk + SLACK, f"allocated {grown} bytes for a storage of {on_disk} bytes"
        self.outcomes[outcome.split(":")[0]] += 1
        removed_header = (
            mutation.get("what") in ("delete", "dangling-symlink", "symlink-loop")
            and mutation["op"] == "header-special"
        )
        if outcome.startswith("StorageNotFoundError"):
            assert removed_header, f"StorageNotFoundError for a storage whose header is there: {outcome}"
        if (
            outcome == "ok"
            and mutation["op"] == "replace-shards-dir"
            and mutation["what"] in ("missing", "dangling-symlink")
        ):
            # a storage without shards/ reads as empty (the loader refuses it as empty): not garbage, but
            # not reported as damage either; see the report in docs/reliability.md
            assert records == [], "records read from a storage without shards/"
            return
        if outcome == "ok":
            undetectable = mutation.get("fix_crc") or mutation["op"] in ("header-json", "header-edit", "header-bytes")
            if changed and not mutation.get("fix_crc"):
                raise AssertionError(f"damaged shard files read and verified without complaint: {changed}")
            if not undetectable:
                assert records == self.records[kind], "records differ from the pristine ones, silently"
            if mutation["op"].startswith("header"):
                assert records == self.records[kind], "a header change altered the records read"

    def _changed(self, path: Path, before: dict[str, bytes]) -> list[str]:
        """Shard files (valid names) whose bytes differ from the pristine ones, or that are no longer files."""
        changed = []
        for name, data in before.items():
            file = path / "shards" / name
            try:
                if file.is_symlink() or not file.is_file() or file.read_bytes() != data:
                    changed.append(name)
            except OSError:
                changed.append(name)
        if (path / "shards").is_dir() and not (path / "shards").is_symlink():
            for name in os.listdir(path / "shards"):
                if name not in before and VALID_NAME.fullmatch(name):
                    changed.append(name)
        return changed

    def _probe(self, path: Path, kind: str) -> tuple[str, list[Any]]:
        """Open, read everything, verify, run the commands and a loader epoch; the outcome and records."""
        records: list[Any] = []
        try:
            storage = open_storage(path, kind)
            with storage.sync_reader() as reader:
                records = [comparable(reader.read(index)) for index in range(len(reader))]
                _ = reader.fingerprint
                if kind == "tokens":
                    stream = reader.read_tokens(0, reader.token_count)
                    starts = reader.document_starts(0, reader.token_count)
                    assert len(stream) == reader.token_count and len(starts) <= len(reader)
                    reader.window_count(3)
                else:
                    assert [bytes(r) for r in reader.read_many(np.arange(len(reader), dtype=np.int64))] == records
            problems = storage.verify()
            outcome = "verify" if problems else "ok"
        except ALLOWED as error:
            outcome = f"{type(error).__name__}: {error}"
        except StorageNotFoundError as error:
            outcome = f"StorageNotFoundError: {error}"
        for command in (["verify", "--quiet", str(path)], ["inspect", "--shards", str(path)]):
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                status = cli(command)
            assert status in (0, 1, 2), f"guideloom {command[0]} returned {status!r}"
            if command[0] == "verify":
                assert (status == 0) == (outcome == "ok"), f"guideloom verify returned {status} for outcome {outcome}"
        if self.loader and outcome in ("ok", "verify"):
            self._loader_epoch(path, kind, records)
        return outcome, records

    def _loader_epoch(self, path: Path, kind: str, records: list[Any]) -> None:
        storage = open_storage(path, kind)
        options: dict[str, Any] = {"sequence_length": 3} if kind == "tokens" else {}
        if not records:
            return
        try:
            loader = self.loader_class.from_storage(storage, device="cpu", local_batch_size=4, **options)
        except ValueError as error:  # a storage of fewer tokens than one window
            assert kind == "tokens" and "no samples" in str(error), error
            return
        with loader:
            batches = list(loader)
        if kind == "documents":
            assert [record for batch in batches for record in batch] == records


def _bytes_on_disk(path: Path) -> int:
    """Bytes the storage's regular files occupy (a sparse file counts what it really holds)."""
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                status = os.lstat(os.path.join(directory, name))
                if stat.S_ISREG(status.st_mode):
                    total += min(status.st_size, status.st_blocks * 512)
    return total


# ----------------------------------------------------------------------------- main


def run_target(fuzzer: Fuzzer, target: str, examples: int, seed_value: int) -> None:
    @seed(seed_value)
    @settings(
        max_examples=examples,
        database=None,
        deadline=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )
    @given(kind=st.sampled_from(KINDS), mutation=MUTATIONS[target])
    def case(kind: str, mutation: dict[str, Any]) -> None:
        fuzzer.run(target, kind, mutation)

    case()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", default=",".join(MUTATIONS))
    parser.add_argument("--examples", type=int, default=200, help="examples per target")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-loader", action="store_true", help="skip the loader epoch (no torch import)")
    parser.add_argument("--root", type=Path, default=None)
    arguments = parser.parse_args(argv)
    faulthandler.enable()
    root = arguments.root or Path(tempfile.mkdtemp(prefix="guideloom-fuzz-"))
    root.mkdir(parents=True, exist_ok=True)
    fuzzer = Fuzzer(root, loader=not arguments.no_loader)
    failed = False
    for target in arguments.targets.split(","):
        try:
            run_target(fuzzer, target, arguments.examples, arguments.seed)
        except BaseException as error:  # the falsifying example was printed by Hypothesis
            print(f"FAILURE {target}: {type(error).__name__}: {error}", flush=True)
            print("".join(traceback.format_exception(error))[-20000:], flush=True)
            failed = True
        print(f"CASES {target} {fuzzer.counts[target]}", flush=True)
    print(f"OUTCOMES {json.dumps(dict(fuzzer.outcomes))}", flush=True)
    print(f"PEAK {fuzzer.peak}", flush=True)
    if arguments.root is None:
        shutil.rmtree(root, ignore_errors=True)
    print("FAILED" if failed else "OK", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""StorageDatasink on a real local Ray cluster: exact contents, retried, killed and re-run writes."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from signal import SIGKILL
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import ray

from guideloom import DocumentJsonFormat, DocumentStorage, TokenStorage
from guideloom._cli import main as cli
from guideloom._core.errors import TokenizeInputError, UnfinishedWriteError
from guideloom.ray import StorageDatasink
from guideloom.tokenize import tokenize_files, train_tokenizer
from guideloom.types import DocumentStorageFormat

ROWS = 100_000
BLOCKS = 16
RETRY = {"max_retries": 3, "retry_exceptions": True}


def token_rows(batch: pa.Table) -> pa.Table:
    """Row ``i`` becomes a document of ``i % 7`` tokens, each ``i``: lengths vary, 0 included."""
    ids = batch["id"].to_numpy()
    lengths = ids % 7
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return pa.table({"id": ids, "tokens": pa.LargeListArray.from_arrays(offsets, np.repeat(ids, lengths))})


def token_dataset(rows: int = ROWS) -> ray.data.Dataset:
    return ray.data.range(rows, override_num_blocks=BLOCKS).map_batches(
        token_rows, batch_format="pyarrow", batch_size=None
    )


def expected_document(i: int) -> np.ndarray:
    return np.full(i % 7, i, dtype=np.uint32)


def read_documents(path: Path) -> list[list[int]]:
    with TokenStorage(path).sync_reader() as reader:
        return [reader.read(i).tolist() for i in range(len(reader))]


def assert_exact(path: Path, rows: int = ROWS, before: int = 0) -> None:
    documents = read_documents(path)[before:]
    assert len(documents) == rows
    for i, document in enumerate(documents):
        assert document == expected_document(i).tolist(), f"document {i}"


def committed(path: Path) -> list[str]:
    return sorted(os.listdir(path / "shards"))


def leftovers(path: Path) -> list[str]:
    return sorted(name for name in os.listdir(path / "incomplete") if not name.startswith("guideloom.json"))


class IdFormat(DocumentStorageFormat[int, int]):
    """Row ids as 8 bytes; the record ``trigger`` runs ``action`` the first time any attempt packs it."""

    def __init__(self, markers: Path | None = None, trigger: int = -1, action: str = "") -> None:
        self.markers, self.trigger, self.action = markers, trigger, action

    def pack(self, data: int) -> bytes:
        if data == self.trigger and self.markers is not None:
            self.first_time(self.markers / "triggered")
        return struct.pack("<q", data)

    def unpack(self, encoded_data: memoryview, shard: int) -> int:
        return int(struct.unpack("<q", encoded_data)[0])

    def first_time(self, marker: Path) -> None:
        try:
            descriptor = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return  # a later attempt: carry on
        os.write(descriptor, str(os.getpid()).encode())
        os.close(descriptor)
        if self.action == "raise":
            raise RuntimeError("injected failure of a first attempt")
        time.sleep(60)  # "hang": the test kills this worker


def read_ids(path: Path) -> list[int]:
    with DocumentStorage(path, IdFormat()).sync_reader() as reader:
        return list(reader)


def test_rows_land_in_block_order_after_the_existing_shards(ray_cluster: str, storage_path: Path) -> None:
    with TokenStorage(storage_path).sync_writer() as writer:
        for shard in range(3):
            writer.append(shard, [shard, shard])
    sink = StorageDatasink(TokenStorage(storage_path), column="tokens")
    token_dataset().write_datasink(sink)
    assert sink.shards == list(range(3, 3 + BLOCKS))
    assert sink.records == ROWS
    assert read_documents(storage_path)[:3] == [[0, 0], [1, 1], [2, 2]]
    assert_exact(storage_path, before=3)


def test_document_rows_whole_or_one_column(ray_cluster: str, tmp_path: Path) -> None:
    items = [{"id": i, "text": f"row {i}"} for i in range(50)]
    whole = DocumentStorage(tmp_path / "whole", DocumentJsonFormat())
    ray.data.from_items(items, override_num_blocks=4).write_datasink(StorageDatasink(whole))
    texts = DocumentStorage(tmp_path / "texts", DocumentJsonFormat())
    ray.data.from_items(items, override_num_blocks=4).write_datasink(StorageDatasink(texts, column="text"))
    with whole.sync_reader() as rows, texts.sync_reader() as column:
        assert list(rows) == items
        assert list(column) == [item["text"] for item in items]


def test_failed_first_attempt_is_retried_without_duplicates(
    ray_cluster: str, storage_path: Path, tmp_path: Path
) -> None:
    storage = DocumentStorage(storage_path, IdFormat(tmp_path, trigger=ROWS // 2 + 10, action="raise"))
    ray.data.range(ROWS, override_num_blocks=BLOCKS).write_datasink(
        StorageDatasink(storage, column="id"), ray_remote_args=RETRY
    )
    assert (tmp_path / "triggered").exists()
    assert read_ids(storage_path) == list(range(ROWS))
    assert leftovers(storage_path) == []


class FailAfterCommit(StorageDatasink):
    """Fails task 5 once after it committed its shard, as a worker lost before reporting back would."""

    def __init__(self, *args: Any, markers: Path, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.markers = markers

    def write(self, blocks: Any, ctx: Any) -> dict[str, int]:
        result = super().write(blocks, ctx)
        if ctx.task_idx == 5:
            IdFormat(self.markers, action="raise").first_time(self.markers / "failed")
        return result


def test_a_formats_record_lengths_are_recorded(ray_cluster: str, tmp_path: Path) -> None:
    items = [{"id": i, "text": "x" * (i % 7)} for i in range(50)]
    storage = DocumentStorage(tmp_path / "measured", DocumentJsonFormat(length=lambda item: len(item["text"])))
    sink = FailAfterCommit(storage, markers=tmp_path)  # its retry compares the committed shard, lengths and all
    ray.data.from_items(items, override_num_blocks=BLOCKS).write_datasink(sink, ray_remote_args=RETRY)
    assert (tmp_path / "failed").exists()
    with storage.sync_reader() as reader:
        assert list(reader) == items
        assert [reader.length(index) for index in range(len(reader))] == [index % 7 for index in range(50)]
    assert storage.verify() == []


def test_retry_of_a_committed_shard_checks_it_and_skips_it(
    ray_cluster: str, storage_path: Path, tmp_path: Path
) -> None:
    sink = FailAfterCommit(TokenStorage(storage_path), column="tokens", markers=tmp_path)
    token_dataset().write_datasink(sink, ray_remote_args=RETRY)
    assert (tmp_path / "failed").exists()
    assert sink.shards == list(range(BLOCKS))
    assert_exact(storage_path)


def test_worker_killed_mid_write(ray_cluster: str, storage_path: Path, tmp_path: Path) -> None:
    storage = DocumentStorage(storage_path, IdFormat(tmp_path, trigger=ROWS // 3, action="hang"))
    killed: list[str] = []  # the killed attempt's file in progress, seen right after the kill

    def kill_the_hanging_worker() -> None:
        deadline = time.monotonic() + 120
        while not (tmp_path / "triggered").exists() or not (tmp_path / "triggered").read_text():
            if time.monotonic() > deadline:
                return  # the write hangs no longer than the sleep; the checks below fail
            time.sleep(0.05)
        pid = (tmp_path / "triggered").read_text()
        os.kill(int(pid), SIGKILL)
        killed.extend(name for name in leftovers(storage_path) if f".{pid}." in name)

    killer = threading.Thread(target=kill_the_hanging_worker)
    killer.start()
    ray.data.range(ROWS, override_num_blocks=BLOCKS).write_datasink(
        StorageDatasink(storage, column="id"), ray_remote_args=RETRY
    )
    killer.join()
    assert len(killed) == 1
    assert read_ids(storage_path) == list(range(ROWS))
    assert leftovers(storage_path) == []


DRIVER = """
    import sys, time
    from pathlib import Path
    import numpy as np, pyarrow as pa, ray
    from guideloom import TokenStorage
    from guideloom.ray import StorageDatasink

    address, storage_path, markers = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    ray.init(address=address, log_to_driver=False, logging_level="ERROR")

    def token_rows(batch):
        ids = batch["id"].to_numpy()
        if ids[0] == 10 * {rows_per_block}:  # block 10 hangs until the test kills this driver
            (markers / "driver-waits").touch()
            time.sleep(60)
        lengths = ids % 7
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        return pa.table({{"tokens": pa.LargeListArray.from_arrays(offsets, np.repeat(ids, lengths))}})

    dataset = ray.data.range({rows}, override_num_blocks={blocks})
    dataset = dataset.map_batches(token_rows, batch_format="pyarrow", batch_size=None)
    dataset.write_datasink(StorageDatasink(TokenStorage(storage_path), column="tokens", write_id="corpus-v1"))
"""


def test_rerun_after_the_driver_died_finishes_the_write(ray_cluster: str, storage_path: Path, tmp_path: Path) -> None:
    with TokenStorage(storage_path).sync_writer() as writer:
        writer.append(7, [1, 2, 3])  # an existing shard: the write's first shard is 8
    script = textwrap.dedent(DRIVER).format(rows=ROWS, blocks=BLOCKS, rows_per_block=ROWS // BLOCKS)
    driver = subprocess.Popen([sys.executable, "-c", script, ray_cluster, str(storage_path), str(tmp_path)])
    try:
        while not (tmp_path / "driver-waits").exists():
            assert driver.poll() is None, "the driver ended before it reached block 10"
            time.sleep(0.05)
    finally:
        driver.kill()
        driver.wait()
    partly = committed(storage_path)
    assert 1 < len(partly) < 1 + BLOCKS  # shard 7 and some of the write's shards

    with pytest.raises(UnfinishedWriteError, match="corpus-v1"):
        token_dataset(10).write_datasink(StorageDatasink(TokenStorage(storage_path), column="tokens"))

    sink = StorageDatasink(TokenStorage(storage_path), column="tokens", write_id="corpus-v1")
    token_dataset().write_datasink(sink)
    assert sink.first_shard == 8
    assert sink.shards == list(range(8, 8 + BLOCKS))
    assert_exact(storage_path, before=1)
    assert leftovers(storage_path) == []


def test_a_finished_named_write_run_again_changes_nothing(ray_cluster: str, storage_path: Path) -> None:
    runs = []
    for _ in range(2):
        sink = StorageDatasink(TokenStorage(storage_path), column="tokens", write_id="small")
        token_dataset(1000).write_datasink(sink)
        runs.append((sink.shards, sink.records, committed(storage_path)))
    assert runs[0] == runs[1]
    assert runs[0][1] == 1000
    assert_exact(storage_path, rows=1000)


def test_a_named_write_run_again_on_other_data_is_refused(ray_cluster: str, storage_path: Path) -> None:
    token_dataset(1000).write_datasink(StorageDatasink(TokenStorage(storage_path), column="tokens", write_id="w"))
    other = token_dataset(1000).map_batches(lambda batch: {"tokens": [tokens + 1 for tokens in batch["tokens"]]})
    with pytest.raises(Exception, match="committed with other data"):
        other.write_datasink(StorageDatasink(TokenStorage(storage_path), column="tokens", write_id="w"))
    assert_exact(storage_path, rows=1000)


# --- guideloom tokenize --ray ---------------------------------------------------------------------------

TEXTS = ["The quick brown fox jumps over the lazy dog.", "def add(a, b):\n    return a + b\n", "naïve café, 東京 🦊"]


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    return train_tokenizer(TEXTS * 20, 300, path)


def text_inputs(directory: Path, files: int = 5) -> list[Path]:
    directory.mkdir()
    paths = []
    for part in range(files):
        path = directory / f"part-{part}.jsonl"
        path.write_text("".join(json.dumps({"text": f"{text} {part}.{i}"}) + "\n" for i in range(40) for text in TEXTS))
        paths.append(path)
    return paths


def test_tokenize_with_ray_writes_what_worker_processes_write(
    ray_cluster: str, tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs = [str(path) for path in text_inputs(tmp_path / "inputs")]
    options = ["--tokenizer", str(tokenizer_path), "--quiet", "--shard-size", "4KiB"]  # a group per file
    assert cli(["tokenize", *inputs, str(tmp_path / "ray"), *options, "--ray"]) == 0
    printed = capsys.readouterr().out
    assert "600 documents" in printed and "(5 Ray tasks)" in printed
    reference = tokenize_files(
        inputs, tmp_path / "processes", tokenizer_path, workers=2, progress=False, shard_size="4KiB"
    )
    assert reference.groups == 5 and reference.processes == 2
    assert TokenStorage(tmp_path / "ray").committed_shards() == list(reference.shards)
    assert read_documents(tmp_path / "ray") == read_documents(tmp_path / "processes")
    assert leftovers(tmp_path / "ray") == []


def test_tokenize_conversations_with_ray(ray_cluster: str, tmp_path: Path) -> None:
    from tests.helpers.chat_tokenizers import PLAIN_TEMPLATE, conversation, make_chat_tokenizer

    tokenizer = make_chat_tokenizer(tmp_path / "chat-tokenizer", PLAIN_TEMPLATE)
    inputs = []
    for part in range(2):
        inputs.append(tmp_path / f"chats-{part}.jsonl")
        inputs[-1].write_text("".join(json.dumps({"messages": conversation(part * 10 + i)}) + "\n" for i in range(10)))
    size = min(path.stat().st_size for path in inputs)  # each file a group of its own: one Ray task each
    summary = tokenize_files(inputs, tmp_path / "ray", tokenizer, chat=True, ray=True, progress=False, shard_size=size)
    assert summary.ray_tasks == 2 and summary.groups == 2 and summary.documents == 20
    here_summary = tokenize_files(
        inputs, tmp_path / "here", tokenizer, chat=True, workers=1, progress=False, shard_size=size
    )
    assert here_summary.shards == summary.shards and {shard // 10**6 for shard in summary.shards} == {0, 1}
    with (
        TokenStorage(tmp_path / "ray").sync_reader() as ray_written,
        TokenStorage(tmp_path / "here").sync_reader() as here,
    ):
        assert len(ray_written) == len(here) == 20
        for index in range(20):
            assert ray_written.read(index).tolist() == here.read(index).tolist()
            assert ray_written.loss_mask(index).tolist() == here.loss_mask(index).tolist()


def test_tokenize_with_ray_reports_a_bad_file(ray_cluster: str, tmp_path: Path, tokenizer_path: Path) -> None:
    inputs = text_inputs(tmp_path / "inputs", files=2)
    inputs[1].write_text('{"text": "fine"}\n{"body": "no text field"}\n')
    with pytest.raises(TokenizeInputError, match=r"part-1\.jsonl:2: no field 'text'"):
        tokenize_files(inputs, tmp_path / "out", tokenizer_path, ray=True, progress=False, shard_size="4KiB")
    assert 10**6 not in TokenStorage(tmp_path / "out").committed_shards()  # the failed group's shard


def test_tokenize_without_ray_never_imports_it(tmp_path: Path, tokenizer_path: Path) -> None:
    inputs = [str(path) for path in text_inputs(tmp_path / "inputs", files=2)]
    arguments = ["tokenize", *inputs, str(tmp_path / "out"), "--tokenizer", str(tokenizer_path), "--quiet"]
    code = f"""
import sys
from guideloom._cli import main
assert main({arguments!r}) == 0
assert "ray" not in sys.modules, "ray was imported"
"""
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert completed.returncode == 0, completed.stderr


def test_order_after_an_all_to_all_operation_with_preserve_order(ray_cluster: str, storage_path: Path) -> None:
    context = ray.data.DataContext.get_current()
    saved = context.execution_options.preserve_order
    context.execution_options.preserve_order = True
    try:
        dataset = (
            ray.data.range(ROWS, override_num_blocks=BLOCKS)
            .repartition(5)
            .map_batches(token_rows, batch_format="pyarrow", batch_size=None)
        )
        sink = StorageDatasink(TokenStorage(storage_path), column="tokens")
        dataset.write_datasink(sink)
    finally:
        context.execution_options.preserve_order = saved
    assert sink.shards == list(range(5))
    assert_exact(storage_path)


def test_the_same_shards_whatever_the_write_concurrency(ray_cluster: str, tmp_path: Path) -> None:
    contents = []
    for concurrency in (1, 2):
        path = tmp_path / f"concurrency-{concurrency}"
        token_dataset(10_000).write_datasink(
            StorageDatasink(TokenStorage(path), column="tokens"), concurrency=concurrency
        )
        contents.append({name: (path / "shards" / name).read_bytes() for name in committed(path)})
    assert contents[0] == contents[1]
    assert len(contents[0]) == BLOCKS


def test_argument_mistakes_are_named(storage_path: Path) -> None:
    with pytest.raises(TypeError, match="storage must be a TokenStorage or DocumentStorage"):
        StorageDatasink(str(storage_path))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="column must be a str"):
        StorageDatasink(TokenStorage(storage_path), column=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="write_id must be"):
        StorageDatasink(TokenStorage(storage_path), write_id="../elsewhere")


def test_a_missing_column_is_named(ray_cluster: str, storage_path: Path) -> None:
    with pytest.raises(Exception, match=r"column 'text' is not in the rows, whose columns are \['id', 'tokens'\]"):
        token_dataset(100).write_datasink(StorageDatasink(TokenStorage(storage_path), column="text"))
    assert committed(storage_path) == []


def masked_rows(batch: pa.Table) -> pa.Table:
    """Row ``i``'s document as in :func:`token_rows`, with a mask counting its odd positions."""
    table = token_rows(batch)
    lengths = batch["id"].to_numpy() % 7
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    positions = np.arange(int(offsets[-1])) - np.repeat(offsets[:-1], lengths)
    return table.append_column("mask", pa.LargeListArray.from_arrays(offsets, positions % 2 == 1))


def test_a_masked_storage_takes_its_masks_from_a_column(ray_cluster: str, storage_path: Path) -> None:
    storage = TokenStorage(storage_path, loss_mask=True)
    dataset = ray.data.range(2_000, override_num_blocks=4).map_batches(masked_rows, batch_format="pyarrow")
    dataset.write_datasink(StorageDatasink(storage, column="tokens", loss_mask_column="mask", write_id="sft"))
    assert_exact(storage_path, rows=2_000)
    with TokenStorage(storage_path).sync_reader() as reader:
        assert [reader.loss_mask(i).tolist() for i in range(len(reader))] == [
            [position % 2 == 1 for position in range(i % 7)] for i in range(2_000)
        ]
    assert storage.verify() == []
    before = committed(storage_path)  # the same named write again checks the shards, masks included
    dataset.write_datasink(StorageDatasink(storage, column="tokens", loss_mask_column="mask", write_id="sft"))
    assert committed(storage_path) == before


def test_mask_columns_are_refused_where_they_do_not_apply(storage_path: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="loss_mask_column"):
        StorageDatasink(TokenStorage(tmp_path / "masked", loss_mask=True), column="tokens")
    with pytest.raises(ValueError, match="loss_mask_column applies"):
        StorageDatasink(TokenStorage(storage_path), column="tokens", loss_mask_column="mask")

"""The benchmark's preference format decodes a batch at once into the records it wrote."""

from __future__ import annotations

import numpy as np

from benchmarks.documents_data import FIELDS, PreferenceFormat


def test_a_batch_decodes_to_the_records_written() -> None:
    rng = np.random.default_rng(0)
    sizes = [(3, 0, 5), (0, 0, 0), (20, 600, 1)]
    records = [
        {"id": number, **{name: rng.integers(0, 50_000, size) for name, size in zip(FIELDS, shape, strict=True)}}
        for number, shape in enumerate(sizes)
    ]
    encoded = [PreferenceFormat().pack(record) for record in records]
    packed = memoryview(b"".join(encoded))
    ends = np.cumsum([len(data) for data in encoded]).tolist()
    views = [packed[end - len(data) : end] for data, end in zip(encoded, ends, strict=True)]
    decoded = PreferenceFormat().unpack_many(views, [0] * len(views))
    assert [record["id"] for record in decoded] == [0, 1, 2]
    for written, read in zip(records, decoded, strict=True):
        assert {name: read[name].tolist() for name in FIELDS} == {name: written[name].tolist() for name in FIELDS}

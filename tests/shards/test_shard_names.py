"""One shard-name pattern: a listing parsed as whole arrays names exactly the shards that names parsed one by one do."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from guideloom._shards.shard_names import shard_file_name, shard_id_of, shard_ids_among, unfinished_shard_id

shard_ids = st.integers(min_value=0, max_value=10**12 - 1)
other_names = st.text(alphabet="0123456789.shardx٣", min_size=0, max_size=20)
names = st.lists(st.one_of(shard_ids.map(shard_file_name), other_names), max_size=30, unique=True)


@given(names)
def test_a_listing_parsed_as_arrays_finds_the_shards_that_names_one_by_one_do(listed: list[str]) -> None:
    one_by_one = sorted(shard for name in listed if (shard := shard_id_of(name)) is not None)
    assert shard_ids_among(listed).tolist() == one_by_one


def test_only_a_whole_shard_name_of_ascii_digits_names_a_shard() -> None:
    assert shard_id_of("000000000042.shard") == 42
    assert shard_id_of("000000000042.shard\n") is None
    assert shard_id_of("٣00000000042.shard") is None  # another script's digit
    assert shard_id_of("000000000042.shard.tmp") is None


def test_a_writers_unfinished_file_names_its_shard() -> None:
    assert unfinished_shard_id("000000000042.shard.3f2a") == 42
    assert unfinished_shard_id("000000000042.shard") is None
    assert shard_ids_among([]).dtype == np.int64

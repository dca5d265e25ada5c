"""Shards on disk: the layout and header, record formats, token ids, shard sets, readers and writers."""

"""Storages on object stores: the store's objects through fsspec, the local shard cache, remote shard sets."""

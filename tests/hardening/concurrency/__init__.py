"""Concurrency campaign: writers racing for one shard or one storage; readers taking snapshots meanwhile."""

"""Small helpers for the words of messages and reports."""


def plural(count: int, noun: str, plural_noun: str | None = None) -> str:
    """``1 file``, ``2 files``, ``1,000 shards``: the count with its noun in the right number."""
    word = noun if count == 1 else plural_noun or f"{noun}s"
    return f"{count:,} {word}"

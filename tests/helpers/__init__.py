"""Code the tests share, one module per concern; a test imports a name from its module.

- ``batches``: reading a loader's batches as a training loop does, comparing sequences of them, exact resume.
- ``storages``: storages to read (random tokens, JSON records, a raw-bytes format), committed shards.
- ``shard_files``: a committed shard file's bytes (its footer, its record offsets, names a storage never reads).
- ``processes``: fresh interpreters that import ``tests.*``, process groups, free local ports.
- ``loaders``: loaders many tests build alike (the framework tests' loader, small windows).
- ``provenance``: storages whose every token says where it lives, and the check that an explained batch is read.
- ``chat_tokenizers``: tiny Hugging Face tokenizer directories with chat templates.
"""

from __future__ import annotations

# Where each name of the former single module ``tests/helpers.py`` lives now; importing one from the package
# says where, so that a test written against the former layout is fixed in one line.
MOVED = {
    **dict.fromkeys(("comparable", "take", "assert_resumes_exactly"), "batches"),
    **dict.fromkeys(
        ("RawFormat", "make_token_storage", "make_document_storage", "open_storage", "committed_shards"),
        "storages",
    ),
    **dict.fromkeys(
        ("FOOTER_FIELDS", "CRAFTED_SHARD_NAMES", "shard_file", "footer_fields", "with_footer", "rewrite_footer"),
        "shard_files",
    ),
    "set_offset": "shard_files",
    **dict.fromkeys(
        ("ROOT", "module_command", "run_harness", "child_environment", "gather_to_file", "free_port"), "processes"
    ),
}


def __getattr__(name: str) -> object:
    if name in MOVED:
        raise ImportError(f"tests.helpers.{name} moved: import it from tests.helpers.{MOVED[name]}")
    raise AttributeError(f"module 'tests.helpers' has no attribute {name!r}")

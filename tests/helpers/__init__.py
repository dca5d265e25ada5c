"""Code the tests share, one module per concern; a test imports a name from its module.

- ``batches``: reading a loader's batches as a training loop does, comparing sequences of them, exact resume.
- ``storages``: storages to read (random tokens, JSON records, a raw-bytes format), committed shards.
- ``shard_files``: a committed shard file's bytes (its footer, its record offsets, names a storage never reads).
- ``processes``: fresh interpreters that import ``tests.*``, process groups, free local ports.
- ``loaders``: loaders many tests build alike (the framework tests' loader, small windows).
- ``provenance``: storages whose every token says where it lives, and the check that an explained batch is read.
- ``chat_tokenizers``: tiny Hugging Face tokenizer directories with chat templates.
"""

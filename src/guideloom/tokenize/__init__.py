"""Tokenize text files into a TokenStorage, in parallel, one shard per input file.

This is the engine behind ``guideloom tokenize`` and ``examples/quickstart/preprocess.py``; it needs the
``tokenize`` extra (``pip install 'guideloom[tokenize]'``).

Inputs
    * ``.jsonl``: one JSON object per line; the document is the string in field ``text_field``
      (default ``"text"``). Blank lines are skipped. A line that is not JSON, is not an object, lacks
      the field or holds a non-string there is a :class:`TokenizeInputError` naming the file and line.
    * ``.parquet``: the string column ``text_field``, one document per row (needs ``pyarrow``;
      compressed columns, such as zstd, are read as they are). A missing column or a null value is a
      :class:`TokenizeInputError` naming the file (and the row).
    * anything else (``.txt``, ``.md``, ``.py``, ...): UTF-8 text, **one document per file** (an empty
      file holds none). Paragraph splitting is deliberately not done: it would cut source code and
      Markdown apart; put one document per record in a JSONL file instead.
    * gzip, zstd, bz2 and xz files (``.jsonl.gz``, ``.jsonl.zst``, ``.txt.bz2``, ``.txt.xz``, ...) are
      decompressed as they are read, recognised by their suffix and by their first bytes; damaged or
      truncated data is a :class:`TokenizeInputError`. JSON documents (``.json``, ``.json.gz``), Arrow
      IPC files and zip archives are refused.
    * A directory stands for its ``.txt``, ``.jsonl`` and ``.parquet`` files (compressed ``.txt`` and
      ``.jsonl`` too), recursively.

Shards
    The inputs are sorted (by path) and input ``i`` becomes shard ``i``, so the storage's document order
    is the sorted input order, records in file order, no matter how many workers ran. An input with no
    documents writes no shard.

Tokens
    Each document is encoded without the tokenizer's own special tokens (``add_special_tokens=False``),
    then the end-of-text id is appended, so document boundaries stay visible inside the concatenated
    token stream. With ``eos_token="auto"`` the first of ``<|endoftext|>``, ``<|end_of_text|>``,
    ``</s>``, ``<eos>``, ``[EOS]`` that the tokenizer knows is used (none found: no id is appended); pass
    a token string to choose it or ``None`` to append nothing. The dtype is ``uint16`` when every id of
    the vocabulary fits, else ``uint32``.

Conversations (``chat=True``, ``guideloom tokenize --chat``; the ``chat`` extra)
    Rows of ``.jsonl`` / ``.parquet`` inputs hold a conversation in their ``messages`` field (a list of
    ``{"role", "content"}``). ``tokenizer_path`` is then a Hugging Face tokenizer directory; each
    conversation is rendered with its chat template, stored as one document holding exactly the
    template's tokens (no end-of-text id), in a masked storage whose loss mask marks the assistant's
    turns (``train_on="assistant"``: what the template's generation blocks mark, or, without them, what
    rendering growing prefixes of the conversation tells apart) or every token (``train_on="all"``).
    A malformed row or one the template cannot split into turns is a :class:`TokenizeInputError`
    naming the file and the row (counted from 1).

Failures
    Everything that can be checked up front is checked before anything is written: missing or
    unreadable inputs, refused kinds, a Parquet file without the column, the tokenizer file, the output
    (an existing storage must hold tokens and must not already hold the shards to be written, a
    :class:`~guideloom.ShardExistsError`, unless ``skip_existing``). Each file is written by its own
    writer, so a file that fails mid-way commits nothing; the first failure stops the other workers
    (their files in progress are not committed either), files already finished stay committed, and the
    original exception is raised with a note listing them; a worker process that dies is a
    :class:`TokenizeWorkerDied`. After fixing the input, ``skip_existing=True`` (``--skip-existing``)
    writes only the shards still missing. An input without a single document anywhere is a
    ``ValueError`` and nothing is written.

Modules: ``_inputs`` (reading the inputs) and ``_compression``, ``_tokenizer`` (load, train, end-of-text
id), ``_chat`` (conversations as documents) and ``_chat_template`` (their tokens and loss masks),
``_plan`` (the checks and the shard of each file), ``_shard`` (one file into one shard: the unit of
work any executor runs), ``_pool`` (worker processes), ``_run`` (running a plan, the summary) and
``_command`` (the ``guideloom tokenize`` command).
"""

from guideloom._core.errors import TokenizeInputError, TokenizeWorkerDied
from guideloom.tokenize._inputs import iter_documents
from guideloom.tokenize._run import TokenizeSummary, tokenize_files
from guideloom.tokenize._tokenizer import find_eos_id, load_tokenizer, train_tokenizer

__all__ = [
    "TokenizeInputError",
    "TokenizeSummary",
    "TokenizeWorkerDied",
    "find_eos_id",
    "iter_documents",
    "load_tokenizer",
    "tokenize_files",
    "train_tokenizer",
]

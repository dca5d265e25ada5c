"""Tokenize text files into a TokenStorage, in parallel, in shards of a target size.

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
    ``shard_size`` (``--shard-size``, default 256 MiB) is the bytes of token ids a shard holds. The
    inputs are sorted (by path) and cut into groups of consecutive files of at least ``shard_size``
    input bytes; group ``g`` writes its documents in order into shards ``g * 10**6 + k``, each committed
    once it holds ``shard_size`` bytes of tokens (documents are never cut), the last when the group
    ends. So the storage's document order is the sorted input order, records in file order, and the
    shards are the same no matter how many workers ran. A group with no documents writes no shard.

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
    The files are grouped into shards as text files are (see Shards), and resumed the same way.
    A malformed row or one the template cannot split into turns is a :class:`TokenizeInputError`
    naming the file and the row (counted from 1).

Failures
    Everything that can be checked up front is checked before anything is written: missing or
    unreadable inputs, refused kinds, a Parquet file without the column, the tokenizer file, the output
    (an existing storage must hold tokens and must not already hold the shards to be written, a
    :class:`~guideloom.ShardExistsError`, unless ``skip_existing``). A file that fails mid-way commits
    nothing more of its group (the shard in progress is not committed); the first failure stops the
    other workers (their shards in progress are not committed either), shards already finished stay
    committed, and the original exception is raised with a note counting them; a worker process that
    dies is a :class:`TokenizeWorkerDied`. After fixing the input, ``skip_existing=True``
    (``--skip-existing``, same inputs and options) skips the finished groups and resumes the others
    after the documents their committed shards hold. An input without a single document anywhere is a
    ``ValueError`` and nothing is written.

Modules: ``_inputs`` (reading the inputs) and ``_compression``, ``_tokenizer`` (load, train, end-of-text
id), ``_chat`` (conversations as documents) and ``_chat_template`` (their tokens and loss masks),
``_groups`` (files into groups, a group's shard ids, what is committed of it), ``_plan`` (the
checks and the groups to write), ``_shard`` (one group into its shards: the unit of work any executor
runs), ``_work`` (a group as ``guideloom._jobs``' executors run it: this process, worker processes,
Ray tasks), ``_run`` (running a plan, the summary) and ``_command`` (the ``guideloom tokenize`` command).
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

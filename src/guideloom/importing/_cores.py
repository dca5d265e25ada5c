"""Whether this process has cores to spare: it imports alone (in the calling process), or it is one of fewer
worker processes than the machine has cores (``ImportWork.start`` says which).

With cores to spare, pyarrow decodes a Parquet batch's columns in its threads (about 20% faster), and a columnar
input's next batch is read in a thread while this one is packed and written. Worker processes that already keep
every core busy do neither: the threads would only take turns with the other workers. Nor do small pieces: 10,000
Parquet files of 1 KiB took 12.0 s with threads and 7.9 s without.
"""

from __future__ import annotations

THREADS_MIN_BYTES = 4 * 1024 * 1024  # pieces smaller than this are read without threads

spare = True


def have_spare_cores(spare_cores: bool) -> None:
    """Say whether this process has cores to spare (see the module's docstring)."""
    global spare
    spare = spare_cores


def threads_for(piece_size: int) -> bool:
    """Whether a piece of ``piece_size`` input bytes is read with threads (see the module's docstring)."""
    return spare and piece_size >= THREADS_MIN_BYTES

"""Whether this process has cores to spare: it imports alone (in the calling process), or it is one of fewer
worker processes than the machine has cores (``ImportWork.start`` says which).

With cores to spare, pyarrow decodes a Parquet batch's columns in its threads (about 20% faster), and a columnar
input's next batch is read in a thread while this one is packed and written. Worker processes that already keep
every core busy do neither: the threads would only take turns with the other workers.
"""

from __future__ import annotations

spare = True


def have_spare_cores(spare_cores: bool) -> None:
    """Say whether this process has cores to spare (see the module's docstring)."""
    global spare
    spare = spare_cores

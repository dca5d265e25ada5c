"""``guideloom inspect PATH --lengths``: a histogram of document lengths, read from the shards' offsets.

A record's length is the difference of two offsets in its shard's index, or the length its format
recorded where the storage records lengths, so the histogram never reads a token or a record's
bytes: one pass over each shard's index (or lengths), one shard mapped at a time. Buckets
are powers of two (``0``, ``1``, ``2-3``, ``4-7``, ...), counted per shard, so memory stays flat
however many documents there are.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

BUCKETS = 65  # bucket b >= 1 holds lengths in [2**(b-1), 2**b); bucket 0 the empty records
BAR = 40  # characters of the longest bar


@dataclass
class Lengths:
    """Counts of records per power-of-two length bucket, the elements in them, and the extremes."""

    unit: str  # what a length counts: tokens, a document storage's bytes, or its format's recorded length
    records: str  # what a record is called: documents or records
    counts: np.ndarray
    totals: np.ndarray
    shortest: int | None = None
    longest: int = 0

    @classmethod
    def of(cls, reader: Any, tokens: bool) -> Lengths:
        unit = "tokens" if tokens else "length" if reader.header.record_lengths else "bytes"
        found = cls(unit, "documents" if tokens else "records", *np.zeros((2, BUCKETS)))
        for position in range(len(reader.infos)):
            found.add(reader.shard_lengths(position))  # the index only (an object store's: its tail)
        return found

    def add(self, lengths: np.ndarray) -> None:
        if not len(lengths):
            return
        buckets = np.frexp(lengths.astype(np.float64))[1]  # 0 for 0, else the bit length
        self.counts += np.bincount(buckets, minlength=BUCKETS)
        self.totals += np.bincount(buckets, weights=lengths, minlength=BUCKETS)
        shortest, longest = int(lengths.min()), int(lengths.max())
        self.shortest = shortest if self.shortest is None else min(self.shortest, shortest)
        self.longest = max(self.longest, longest)

    def rows(self) -> list[tuple[str, int, int]]:
        """``(bucket label, records, elements)`` from the shortest bucket in use to the longest."""
        used = np.flatnonzero(self.counts)
        if not len(used):
            return []
        return [
            (_label(bucket), int(self.counts[bucket]), int(self.totals[bucket]))
            for bucket in range(int(used[0]), int(used[-1]) + 1)
        ]

    def lines(self) -> list[str]:
        """The histogram in text: a line of figures, then a table with a bar per bucket."""
        count, total = int(self.counts.sum()), int(self.totals.sum())
        if count == 0:
            return [f"lengths:    no {self.records}"]
        mean = total / count
        lines = [
            f"lengths:    {self.unit} per {self.records[:-1]}: {count:,} {self.records} "
            f"({int(self.counts[0]):,} empty), min {self.shortest:,}, mean {mean:,.1f}, max {self.longest:,}"
        ]
        rows = self.rows()
        widest = max(records for _, records, _ in rows)
        header = (self.unit, self.records, "share", f"of {self.unit}")
        table = [
            (
                label,
                f"{records:,}",
                f"{100 * records / count:.1f}%",
                f"{100 * elements / total:.1f}%" if total else "-",
                "#" * -(-BAR * records // widest),
            )
            for label, records, elements in rows
        ]
        widths = [max(len(row[column]) for row in [header, *table]) for column in range(4)]
        for row in [header, *table]:
            lines.append("  " + "  ".join(value.rjust(width) for value, width in zip(row, widths, strict=False)))
            if len(row) > 4:
                lines[-1] = f"{lines[-1]}  {row[4]}".rstrip()
        return lines

    def plot(self, path: Path, title: str) -> None:
        """A bar per bucket: how many records, and (a second axis) their share of all elements."""
        from guideloom._cli.plots import pyplot, save

        rows = self.rows()
        figure, axis = pyplot().subplots(figsize=(max(6.0, 0.55 * len(rows) + 2), 4.5))
        places = np.arange(len(rows))
        axis.bar(places, [records for _, records, _ in rows], color="#4C72B0", label=self.records)
        axis.set_xticks(places, [label for label, _, _ in rows], rotation=45, ha="right")
        axis.set_xlabel(f"{self.unit} per {self.records[:-1]}")
        axis.set_ylabel(self.records)
        share = axis.twinx()
        total = max(float(self.totals.sum()), 1.0)
        share.plot(places, [100 * elements / total for _, _, elements in rows], "o-", color="#DD8452")
        share.set_ylabel(f"% of all {self.unit}", color="#DD8452")
        share.set_ylim(bottom=0)
        axis.set_title(title)
        save(figure, path)


def _label(bucket: int) -> str:
    if bucket == 0:
        return "0"
    low, high = 1 << (bucket - 1), (1 << bucket) - 1
    return f"{low:,}" if low == high else f"{low:,}-{high:,}"

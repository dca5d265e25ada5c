"""Reading ahead: the next items of an iterator made in a thread while the caller works on the last one.

The thread holds at most ``depth`` items; an exception of the iterator is raised to the caller where the item it
failed to make would have come. A caller that stops early (an error of its own, a cancelled job) stops the
thread, which leaves once the item it is making is made.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")

_END = object()


def read_ahead(items: Iterator[T], depth: int = 2) -> Iterator[T]:
    """``items``, made ``depth`` ahead in a thread of their own."""
    made: queue.Queue[tuple[object, BaseException | None]] = queue.Queue(depth)
    stop = threading.Event()

    def make() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        made.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            made.put((_END, None))
        except BaseException as error:  # given to the caller, in order
            made.put((_END, error))

    thread = threading.Thread(target=make, name="guideloom-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item, error = made.get()
            if error is not None:
                raise error
            if item is _END:
                return
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        while thread.is_alive():  # empty the queue, so that a thread waiting to put sees the stop
            try:
                made.get(timeout=0.1)
            except queue.Empty:
                pass
        thread.join()

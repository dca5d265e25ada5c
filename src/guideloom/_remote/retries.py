"""Retries of requests to an object store: transient failures are tried again, bounded in count and time.

Transient: throttling and server errors by HTTP status (429, 500, 502, 503, 504, whatever the error
code says), connection resets and refusals, timeouts, and bodies cut short. How a service's client
says these (the status inside its errors, its classes for a broken connection) is the service's
backend's to read (``ServiceErrors``); the rules here are the same for every service. Each retry waits an
exponential backoff with full jitter (a uniform draw below ``0.1 s * 2**retry``, at most 10 s), is
logged (logger ``guideloom``, level WARNING) and counted; when the attempts or the deadline run out,
the caller turns the last error into a ``ConnectionError`` naming the object. Everything else (403,
404, 412, a local disk error) is permanent and raised at once.

The clients' own retries are switched off for S3 (botocore's and s3fs's) and Azure (the Azure SDK's), so
these are the only ones and the bounds hold as stated (see ``s3_backend`` and ``azure_backend``); only
aiohttp, under s3fs, still resends an idempotent request (GET, HEAD, PUT, DELETE) once when its connection
drops before the answer, which is neither logged nor counted, and the Azure SDK's download reads a body cut
short again (counted). gcsfs retries on its own (``gcs_backend``); these come on top.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from guideloom._core.metrics import count

LOGGER = logging.getLogger("guideloom")
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
DEFAULT_ATTEMPTS = 6
DEFAULT_DEADLINE_S = 60.0
BASE_DELAY_S = 0.1
MAX_DELAY_S = 10.0
ATTEMPTS_OPTION = "request_attempts"
DEADLINE_OPTION = "request_deadline_s"

T = TypeVar("T")


class ShortBody(ConnectionError):
    """A response whose body ended before the length its headers promised."""


class ServiceErrors(Protocol):
    """How one service's client reports a failed request (each object-store backend is one)."""

    def status(self, error: BaseException) -> int | None:
        """The HTTP status the service answered, read from one error of its client; None if it holds none."""
        ...

    def broken_connection(self, error: BaseException) -> bool:
        """Whether one error of its client means the connection failed or the response came incomplete."""
        ...


def http_status(error: BaseException, errors: ServiceErrors) -> int | None:
    """The HTTP status of a failed request, from the error or what it was raised from; None if there is none."""
    for link in chain(error):
        status = errors.status(link)
        if status is not None:
            return status
    return None


def is_transient(error: BaseException, errors: ServiceErrors) -> bool:
    """Whether trying the same request again may succeed."""
    status = http_status(error, errors)
    if status is not None:
        return status in TRANSIENT_STATUSES
    for link in chain(error):
        if isinstance(link, PermissionError | FileNotFoundError | FileExistsError):
            return False
        if isinstance(link, ConnectionError | TimeoutError):
            return True
        if errors.broken_connection(link):
            return True
    return False


def describe(error: BaseException, errors: ServiceErrors) -> str:
    """A short account of an error: its status where it has one, its type and message."""
    status = http_status(error, errors)
    text = str(error) or type(error).__name__
    if status is not None and re.search(rf"\b{status}\b", text) is None:  # (not one inside a bucket's name)
        return f"HTTP {status}: {text}"
    return f"{type(error).__name__}: {text}"


def chain(error: BaseException) -> list[BaseException]:
    """The error and those it was raised from or during (at most 8)."""
    links: list[BaseException] = []
    link: BaseException | None = error
    while link is not None and len(links) < 8 and link not in links:
        links.append(link)
        link = link.__cause__ or link.__context__
    return links


@dataclass(frozen=True)
class RetryPolicy:
    """At most ``attempts`` tries of one request, none started after ``deadline_s`` seconds."""

    attempts: int = DEFAULT_ATTEMPTS
    deadline_s: float = DEFAULT_DEADLINE_S

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> tuple[RetryPolicy, dict[str, Any]]:
        """The policy given by guideloom's own ``storage_options`` keys, and the options left for fsspec."""
        rest = dict(options)
        attempts = rest.pop(ATTEMPTS_OPTION, DEFAULT_ATTEMPTS)
        deadline = rest.pop(DEADLINE_OPTION, DEFAULT_DEADLINE_S)
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise ValueError(f"storage_options[{ATTEMPTS_OPTION!r}] must be an int of 1 or more, got {attempts!r}")
        if isinstance(deadline, bool) or not isinstance(deadline, int | float) or not deadline > 0:
            raise ValueError(f"storage_options[{DEADLINE_OPTION!r}] must be a positive number, got {deadline!r}")
        return cls(attempts, float(deadline)), rest


class RetriesExhausted(Exception):
    """A transient failure that outlasted the policy: ``last`` is the last attempt's error."""

    def __init__(self, last: BaseException, attempts: int, elapsed: float, errors: ServiceErrors) -> None:
        account = describe(last, errors)
        super().__init__(f"after {attempts} attempt{'s' * (attempts > 1)} in {elapsed:.1f} s: {account}")
        self.last = last
        self.attempts = attempts


class Retrying:
    """Runs requests under a policy and counts the retries it made (shared by threads; per process).

    ``errors`` reads the failures of the service's client (its backend; picklable, as it is sent along). The
    retries are counted for the storage at ``location`` (``_core.metrics``), and so is each attempt as one request
    unless ``counts_requests`` is False (a client that counts the HTTP requests it sends itself).
    """

    def __init__(
        self, policy: RetryPolicy, errors: ServiceErrors, location: str = "", counts_requests: bool = True
    ) -> None:
        self.policy = policy
        self.errors = errors
        self.location = location
        self.counts_requests = counts_requests
        self.count = 0
        self._lock = threading.Lock()
        self._random = random.Random()

    def __getstate__(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "errors": self.errors,
            "location": self.location,
            "counts_requests": self.counts_requests,
            "count": 0,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["policy"], state["errors"], state.get("location", ""), state.get("counts_requests", True)
        )

    def call(self, what: str, request: Callable[[int], T]) -> T:
        """``request(attempt)`` (attempt 1, 2, ...) until it succeeds, fails permanently, or the policy ends.

        Raises RetriesExhausted (from the last error) when a transient failure outlasts the policy.
        """
        start = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            if self.counts_requests:
                count("requests", 1, self.location)
            try:
                return request(attempt)
            except Exception as error:
                delay = self._retry_after(what, error, attempt, start)
            time.sleep(delay)

    async def call_async(self, what: str, request: Callable[[int], Awaitable[T]]) -> T:
        """``call`` for a coroutine on an event loop: the same policy, log and counter; the waits do not block the
        loop (the ranged parts of one download are retried each on its own, side by side)."""
        start = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            if self.counts_requests:
                count("requests", 1, self.location)
            try:
                return await request(attempt)
            except Exception as error:
                delay = self._retry_after(what, error, attempt, start)
            await asyncio.sleep(delay)

    def _retry_after(self, what: str, error: Exception, attempt: int, start: float) -> float:
        """The wait before the next attempt, logged and counted; raises when ``error`` is not to be retried."""
        if not is_transient(error, self.errors):
            raise error
        elapsed = time.monotonic() - start
        with self._lock:
            delay = self._random.uniform(0, min(MAX_DELAY_S, BASE_DELAY_S * 2 ** (attempt - 1)))
        if attempt >= self.policy.attempts or elapsed + delay >= self.policy.deadline_s:
            raise RetriesExhausted(error, attempt, elapsed, self.errors) from error
        with self._lock:
            self.count += 1
        count("retries", 1, self.location)
        LOGGER.warning(
            "%s: attempt %d of %d failed (%s); retrying in %.2f s",
            what,
            attempt,
            self.policy.attempts,
            describe(error, self.errors),
            delay,
        )
        return delay

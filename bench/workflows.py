"""Workflow benchmark: chains and groups against plain jobs, what the release costs a
completion, and workflows under SIGKILLs.

    python -m bench.workflows [--only hotpath,chains,group,chaos] [--rounds 3]
    make bench NAME=workflows ARGS='--only chaos --groups 2000'

Sections (``--only`` picks some):

* ``hotpath``: what the release costs the batched completion of jobs that have no
  dependants. ``--hot-batches`` batches of 50 claimed jobs are completed alternately
  with ``sql.JOB_COMPLETE_MANY`` and with the same statement without its resolution
  part (``sql._RESOLVE``), both prepared; the median time per batch of each, and the
  difference per job.
* ``chains``: 1,000 chains of 10 steps (``--chains``, ``--chain-length``), one
  ``enqueue()`` per chain in one transaction, against as many plain jobs: enqueue rate
  (client clock) against ``Job.objects.enqueue()`` once per job in one transaction and
  against ``bulk_enqueue``, and drain rate (jobs / (last completion - the enqueue's
  commit), database clock) by ``--workers`` worker processes against the bulk jobs'.
* ``group``: one group of 100,000 members and a callback (``--group-size``) against as
  many plain jobs from ``bulk_enqueue``: enqueue rate, drain rate, and that the callback
  ran once, after every member, with every result in order.
* ``chaos``: ``--groups`` groups of ``--group-members`` members (``ledger_member``, at
  least once) with a transactional callback (``ledger_sum``: its ledger row commits with
  its completion), run by ``--chaos-workers`` worker processes and a sweeper while a
  seeded killer SIGKILLs a random worker every ~``--kill-every`` seconds (and starts a
  replacement) until every callback finished. Judged: every callback done with exactly
  one ledger row and the sum of its members' results in their order, nothing waiting
  or unfinished, every counter of unfinished parents equal to its unresolved edges.
  One summary line, exit 1 on a violation.

Each round of ``chains`` and ``group`` runs both sides; the medians of ``--rounds`` are
printed with the ratio. Database: ``pgqueue_bench_workflows`` on the embedded server,
or ``DATABASE_URL`` (its jobs tables are truncated: use a database of its own).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import wait_until

REPO = Path(__file__).resolve().parent.parent
MANAGE = REPO / "testproject" / "manage.py"
PLAIN = "testproject.demo.tasks.add"
SECTIONS = ("hotpath", "chains", "group", "chaos")


def prepare() -> None:
    sys.path.insert(0, str(REPO))
    if not os.environ.get("DATABASE_URL"):
        from testproject.pgserver import embedded_server, ensure_database

        os.environ["DATABASE_URL"] = ensure_database(embedded_server(), "pgqueue_bench_workflows")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def truncate() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE pgqueue_job, pgqueue_step, pgqueue_job_dependency, demo_execution"
        )


def scalar(query: str, params: Any = None) -> Any:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchone()[0]


# --- workers ---------------------------------------------------------------------------


def start(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(MANAGE), *args, "-v", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def worker(args: argparse.Namespace, *extra: str) -> subprocess.Popen[bytes]:
    return start(
        "pgqueue_worker",
        "--concurrency", str(args.concurrency),
        "--batch-size", str(args.batch_size),
        "--poll-interval", "0.5",
        *extra,
    )  # fmt: skip


def stop(procs: list[subprocess.Popen[bytes]]) -> list[int]:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(60))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(proc.wait(10))
    return codes


def drained() -> bool:
    from django_pgqueue.models import Job

    return not Job.objects.exclude(status__in=("done", "dead", "cancelled")).exists()


def database_now() -> Any:
    return scalar("SELECT clock_timestamp()")


def drain_rate(jobs: int, committed: Any, timeout: float) -> float:
    """Jobs per second from the enqueue's commit (``committed``, read from the
    database clock right after it) to the last job's completion, once none is left."""
    wait_until(drained, timeout, "the drain", poll=0.05)
    seconds = scalar(
        "SELECT extract(epoch FROM max(finished_at) - %s) FROM pgqueue_job", [committed]
    )
    return jobs / float(seconds)


# --- hotpath ---------------------------------------------------------------------------


def hotpath(args: argparse.Namespace) -> None:
    """What workflows cost the batched completion of jobs without dependants: the
    statement as it was before them (``JOB_COMPLETE_MANY`` without its ``dependants``
    column), as it is with no workflow in flight, and as it is while one is (an
    unresolved edge elsewhere: one index probe per job), for batches of 1 and 50. The
    same claimed jobs are completed again and again (put back to running in between),
    with asynchronous commit (the figure is the statement's, not the disk's flush), the
    three alternated, prepared as the worker prepares them (generic plans after five);
    medians of ``--hot-batches`` each."""
    from django_pgqueue import db, sql
    from django_pgqueue.conf import settings
    from django_pgqueue.models import Job, JobDependency

    now = sql.JOB_COMPLETE_MANY
    returning = "RETURNING owned.ord, j.status"
    before = now[: now.index(returning)] + returning + "\n"
    for size in (1, 50):
        truncate()
        Job.objects.bulk_enqueue({"task": PLAIN, "args": [i, i]} for i in range(size))
        jobs = Job.objects.claim("bench", limit=size)
        expires = jobs[0].lease_expires_at
        params = {
            "worker_id": "bench",
            "ids": [j.id for j in jobs],
            "attempts": [j.attempts for j in jobs],
            "claimed_at": [j.last_attempted_at for j in jobs],
            "results": ["3"] * len(jobs),
            "channel": settings.NOTIFY_CHANNEL,
            "now": None,
        }
        times: dict[str, list[float]] = {"before": [], "now": [], "in flight": []}
        # Commits not waiting for the disk: the figure is the statement's. Each round
        # puts the jobs back to running, as claimed, for the next.
        scalar("SELECT set_config('synchronous_commit', 'off', false)")
        for n in range(args.hot_batches * 3):
            name = ("before", "now", "in flight")[n % 3]
            statement = before if name == "before" else now
            if name == "in flight":  # an unresolved edge of a job elsewhere
                JobDependency.objects.create(job_id=0, position=0, parent_id=0)
            started = time.perf_counter()
            done = db.rows("default", statement, params, prepare=True)
            times[name].append(time.perf_counter() - started)
            assert len(done) == len(jobs)
            JobDependency.objects.all().delete()
            Job.objects.filter(pk__in=params["ids"]).update(
                status="running", finished_at=None, result=None, lease_expires_at=expires
            )
        scalar("SELECT set_config('synchronous_commit', 'on', false)")
        # The first few of each plan and prepare: leave them out.
        median = {k: statistics.median(v[5:]) * 1e6 for k, v in times.items()}
        print(
            f"hotpath: completing {size} job(s) without dependants (medians of "
            f"{args.hot_batches - 5}): {median['before']:,.0f} us before workflows, "
            f"{median['now']:,.0f} us now ({(median['now'] - median['before']) / size:+.1f} "
            f"us per job), {median['in flight']:,.0f} us while a workflow is in flight "
            f"({(median['in flight'] - median['before']) / size:+.1f} us per job)",
            flush=True,
        )


# --- chains and group ------------------------------------------------------------------


def chains_round(args: argparse.Namespace) -> dict[str, float]:
    from django.db import transaction

    from django_pgqueue import chain, step
    from django_pgqueue.models import Job

    figures: dict[str, float] = {}
    total = args.chains * args.chain_length
    truncate()
    steps = [step("tests.tasks.double")] * (args.chain_length - 1)
    started = time.perf_counter()
    with transaction.atomic():  # the drain starts at the commit, as for bulk_enqueue
        for n in range(args.chains):
            chain(step(PLAIN, n, 1), *steps).enqueue()
    figures["chains enqueue"] = total / (time.perf_counter() - started)
    figures["chains drain"] = drain_rate(total, database_now(), 600)
    last = Job.objects.filter(parent_results="value").order_by("-id").first()
    assert last is not None and last.result == (args.chains - 1 + 1) * 2 ** (
        args.chain_length - 1
    ), last
    truncate()
    started = time.perf_counter()
    with transaction.atomic():
        for i in range(total):
            Job.objects.enqueue(PLAIN, [i, 1])
    figures["enqueue() loop"] = total / (time.perf_counter() - started)
    truncate()
    started = time.perf_counter()
    Job.objects.bulk_enqueue({"task": PLAIN, "args": [i, 1]} for i in range(total))
    figures["plain enqueue"] = total / (time.perf_counter() - started)
    figures["plain drain"] = drain_rate(total, database_now(), 600)
    return figures


def group_round(args: argparse.Namespace) -> dict[str, float]:
    from django_pgqueue import group, step
    from django_pgqueue.models import Job

    size = args.group_size
    figures: dict[str, float] = {}
    truncate()
    steps = [step(PLAIN, i, 1) for i in range(size)]
    started = time.perf_counter()
    jobs = group(*steps, then=step("tests.tasks.total")).enqueue()
    figures["group enqueue"] = (size + 1) / (time.perf_counter() - started)
    figures["group drain"] = drain_rate(size + 1, database_now(), 900)
    callback = Job.objects.get(pk=jobs[-1].id)
    assert callback.status == "done" and callback.args == [[i + 1 for i in range(size)]]
    assert callback.result == sum(i + 1 for i in range(size))
    last_member = scalar("SELECT max(finished_at) FROM pgqueue_job WHERE id <> %s", [callback.id])
    assert callback.started_at > last_member
    truncate()
    started = time.perf_counter()
    Job.objects.bulk_enqueue({"task": PLAIN, "args": [i, 1]} for i in range(size + 1))
    figures["plain enqueue"] = (size + 1) / (time.perf_counter() - started)
    figures["plain drain"] = drain_rate(size + 1, database_now(), 900)
    return figures


def compare(name: str, rounds: list[dict[str, float]], pairs: list[tuple[str, str]]) -> None:
    for mine, plain in pairs:
        a = statistics.median(r[mine] for r in rounds)
        b = statistics.median(r[plain] for r in rounds)
        spread = ", ".join(f"{r[mine]:,.0f}" for r in rounds)
        print(
            f"{name}: {mine} {a:,.0f} jobs/s ({spread}) vs {plain} {b:,.0f} jobs/s: {a / b:.2f}x"
        )


# --- chaos -----------------------------------------------------------------------------


def chaos(
    *,
    groups: int,
    members: int,
    workers: int,
    kill_every: float,
    seed: int,
    work_ms: float = 2.0,
    timeout: float = 600.0,
) -> dict[str, int]:
    """Run the groups under SIGKILLs (see the module docstring); return the verdict's
    figures, every name in ``MUST_BE_ZERO`` zero when all is well."""
    from django_pgqueue import group, step

    rng = random.Random(seed)
    truncate()
    callbacks = []
    for g in range(groups):
        jobs = group(
            *[
                step("testproject.demo.fault_tasks.ledger_member", g * members + i, work_ms)
                for i in range(members)
            ],
            then=step("testproject.demo.fault_tasks.ledger_sum"),
        ).enqueue()
        callbacks.append(jobs[-1].id)
    lease = ("--lease-seconds", "2", "--concurrency", "4", "--batch-size", "10")
    fleet = [start("pgqueue_worker", *lease, "--poll-interval", "0.2") for _ in range(workers)]
    sweeper = start("pgqueue_sweep", "--loop", "--interval", "0.2")
    kills = 0
    deadline = time.monotonic() + timeout
    unfinished = (
        "SELECT count(*) FROM pgqueue_job WHERE id = ANY(%s)"
        " AND status NOT IN ('done', 'dead', 'cancelled')"
    )
    try:
        next_kill = time.monotonic() + rng.uniform(0.5, 1.5) * kill_every
        while scalar(unfinished, [callbacks]):
            if time.monotonic() > deadline:
                break
            if time.monotonic() >= next_kill:
                victim = rng.randrange(len(fleet))
                fleet[victim].send_signal(signal.SIGKILL)
                fleet[victim].wait(10)
                kills += 1
                fleet[victim] = start("pgqueue_worker", *lease, "--poll-interval", "0.2")
                next_kill = time.monotonic() + rng.uniform(0.5, 1.5) * kill_every
            time.sleep(0.05)
        wait_until(drained, max(5.0, deadline - time.monotonic()), "the drain")
    except SystemExit:
        pass
    finally:
        # A worker SIGTERMed before its handlers are in dies of the signal: let the
        # last replacements register (their pid in the workers table) first.
        try:
            wait_until(
                lambda: (
                    {p.pid for p in fleet}
                    <= {r[0] for r in rows("SELECT pid FROM pgqueue_worker")}
                ),
                30,
                "the workers to start",
            )
        except SystemExit:
            pass
        codes = stop([*fleet, sweeper])
        unclean = sum(code != 0 for code in codes)
        if unclean:
            print(f"chaos: exit codes of the workers, then the sweeper: {codes}", flush=True)
    return judge(callbacks, members, kills=kills, unclean=unclean)


#: Figures of the chaos verdict that must be zero.
MUST_BE_ZERO = (
    "callbacks_not_done",
    "callbacks_run_twice",
    "callbacks_never_ran",
    "wrong_results",
    "left_waiting",
    "left_unfinished",
    "members_not_done",
    "bad_counters",
    "unclean_exits",
)


def judge(callbacks: list[int], members: int, *, kills: int, unclean: int) -> dict[str, int]:
    from django_pgqueue.models import Job

    runs = dict(
        rows(
            "SELECT job_id, count(*) FROM demo_execution WHERE kind = 'tx'"
            " AND job_id = ANY(%s) GROUP BY job_id",
            [callbacks],
        )
    )
    done = Job.objects.filter(pk__in=callbacks)
    wrong = 0
    for callback in done:
        first = callback.args[0] if callback.args else None
        expected = list(range(first[0], first[0] + members)) if first else None
        if callback.status == "done" and (first != expected or callback.result != sum(first)):
            wrong += 1
    return {
        "groups": len(callbacks),
        "kills": kills,
        "callbacks_not_done": done.exclude(status="done").count(),
        "callbacks_run_twice": sum(1 for n in runs.values() if n > 1),
        "callbacks_never_ran": sum(1 for c in callbacks if c not in runs),
        "wrong_results": wrong,
        "left_waiting": Job.objects.filter(status="waiting").count(),
        "left_unfinished": Job.objects.exclude(status__in=("done", "dead", "cancelled")).count(),
        "members_not_done": Job.objects.exclude(pk__in=callbacks).exclude(status="done").count(),
        "member_reruns": scalar(
            "SELECT count(*) - count(DISTINCT job_id) FROM demo_execution WHERE kind = 'plain'"
        ),
        "bad_counters": scalar(
            """SELECT count(*) FROM (
                   SELECT j.id FROM pgqueue_job AS j
                   JOIN pgqueue_job_dependency AS e ON e.job_id = j.id
                   GROUP BY j.id, j.parents_left
                   HAVING j.parents_left <> count(*) FILTER (WHERE e.state IS NULL)) AS bad"""
        ),
        "unclean_exits": unclean,
    }


def rows(query: str, params: Any = None) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchall()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add(
        "--only",
        default=",".join(SECTIONS),
        help="sections, comma-separated (default: %(default)r)",
    )
    add("--rounds", type=int, default=3, help="rounds of chains and group (default: %(default)r)")
    add("--workers", type=int, default=2, help="worker processes (default: %(default)r)")
    add("--concurrency", type=int, default=4, help="threads per worker (default: %(default)r)")
    add("--batch-size", type=int, default=50, help="worker claim batch (default: %(default)r)")
    add("--hot-batches", type=int, default=400, help="hotpath batches (default: %(default)r)")
    add("--chains", type=int, default=1000, help="(default: %(default)r)")
    add("--chain-length", type=int, default=10, help="(default: %(default)r)")
    add("--group-size", type=int, default=100_000, help="(default: %(default)r)")
    add("--groups", type=int, default=2000, help="chaos groups (default: %(default)r)")
    add("--group-members", type=int, default=10, help="chaos members (default: %(default)r)")
    add("--chaos-workers", type=int, default=3, help="(default: %(default)r)")
    add("--kill-every", type=float, default=1.0, help="seconds (default: %(default)r)")
    add("--seed", type=int, default=1, help="(default: %(default)r)")
    args = parser.parse_args()
    sections = args.only.split(",")
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown section {', '.join(sorted(unknown))}: use {', '.join(SECTIONS)}")
    prepare()
    from django.db import connection

    print(f"PostgreSQL {connection.pg_version // 10000}, {os.cpu_count()} cores", flush=True)
    if "hotpath" in sections:
        hotpath(args)
    if "chains" in sections or "group" in sections:
        fleet = [worker(args) for _ in range(args.workers)]
        try:
            time.sleep(3)  # the workers' start-up, not part of any figure
            if "chains" in sections:
                rounds = [chains_round(args) for _ in range(args.rounds)]
                label = f"{args.chains:,} chains of {args.chain_length}"
                compare(
                    label,
                    rounds,
                    [
                        ("chains enqueue", "enqueue() loop"),
                        ("chains enqueue", "plain enqueue"),
                        ("chains drain", "plain drain"),
                    ],
                )
            if "group" in sections:
                rounds = [group_round(args) for _ in range(args.rounds)]
                compare(
                    f"a group of {args.group_size:,}",
                    rounds,
                    [("group enqueue", "plain enqueue"), ("group drain", "plain drain")],
                )
        finally:
            stop(fleet)
    if "chaos" in sections:
        started = time.monotonic()
        verdict = chaos(
            groups=args.groups,
            members=args.group_members,
            workers=args.chaos_workers,
            kill_every=args.kill_every,
            seed=args.seed,
        )
        failed = [name for name in MUST_BE_ZERO if verdict[name]]
        print(
            "chaos: "
            + " ".join(f"{k}={v}" for k, v in verdict.items())
            + f" seconds={time.monotonic() - started:.0f}"
            + (f" FAILED: {', '.join(failed)}" if failed else " ok"),
            flush=True,
        )
        if failed:
            raise SystemExit(1)


if __name__ == "__main__":
    main()

"""The chaos suite, CI length: about a minute of SIGKILLs, SIGSTOPs, terminated
backends, leaking tasks and two PostgreSQL restarts on the suite's own server; nothing
may be lost. And the oracle's own tests: planted faults must each fail a run.

The full run (20,000 jobs) is ``python -m bench.chaos``; see docs/reliability.md.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.utils import timezone

from bench import chaos as chaos_bench
from testkit import oracle, procs
from testkit.private_bouncer import pgbouncer_binary

from .conftest import REPO, wait_for


def chaos(*args: str, timeout: float = 240) -> tuple[int, dict[str, str], str, str]:
    """Run ``bench.chaos``; return its exit code, summary counts, summary line and
    stderr. A failed run keeps its logs: removed here once read."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.chaos", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("jobs=")]
    assert lines, f"no summary line; stderr:\n{proc.stderr[-4000:]}"
    kept = re.search(r"worker logs in (\S+)/logs", proc.stderr)
    if kept and "pgqueue-chaos-" in kept.group(1):
        shutil.rmtree(Path(kept.group(1)), ignore_errors=True)
    return proc.returncode, dict(re.findall(r"(\w+)=(\S+)", lines[-1])), lines[-1], proc.stderr


@pytest.mark.slow
def test_chaos__nothing_lost_stuck_or_duplicated_transactionally() -> None:
    code, summary, line, stderr = chaos(
        "--jobs", "2000", "--duration", "30", "--drain-seconds", "60", "--seed", "7",
    )  # fmt: skip
    assert code == 0, f"{line}\n{stderr[-4000:]}"
    for name in (*oracle.MUST_BE_ZERO, *oracle.Sampler.NAMES, "oom_kills", "crashes"):
        assert summary[name] == "0", (name, line)
    assert summary["unclean_exits"] == summary["deadlocks"] == "0", line
    for name in (*chaos_bench.CANCEL_CHECKS, *chaos_bench.PERIODIC_CHECKS, "orphans"):
        assert summary[name] == "0", (name, line)
    assert summary["pg_restarts"] == "2"
    assert int(summary["kills"]) > 0
    assert int(summary["terminated"]) > 0
    assert int(summary["samples"]) > 20  # the invariants were watched during the faults
    assert int(summary["coroutine_done"]) > 0, line  # coroutine jobs ran beside the others
    # Keys of the run's limit did run at their limit while over_limit (above) stayed 0.
    assert int(summary["limit_peak"]) == oracle.KEY_CONCURRENCY, line
    # The new surfaces were exercised: cancels, sweepers and supervisors killed.
    assert int(summary["cancelled"]) > 0 and int(summary["cancel_calls"]) > 0, line
    assert int(summary["sweeper_kills"]) > 0, line
    assert int(summary["supervisor_kills"]) + int(summary["early_kills"]) > 0, line
    finished = sum(int(summary[name]) for name in ("done", "dead", "cancelled"))
    assert finished == 2000 + int(summary["periodic_ticks"]), line
    # Exactly the pills and the leaking tasks died; each pill ran at most its attempts.
    assert int(summary["dead"]) == 10 + int(summary["leak_jobs"])
    assert int(summary["leak_jobs"]) > 0
    assert int(summary["poison_runs"]) <= int(summary["pill_attempts"]) == 30


@pytest.mark.slow
@pytest.mark.skipif(
    pgbouncer_binary() is None,
    reason="pgbouncer is not installed (bash .ci/install-pgbouncer installs Debian's)",
)
def test_chaos__through_pgbouncer_in_transaction_mode() -> None:
    """A shorter run with the fleet behind a PgBouncer in transaction mode: kills,
    cancellations, sweepers and a supervisor SIGKILLed, one PostgreSQL restart."""
    code, summary, line, stderr = chaos(
        "--jobs", "400", "--duration", "8", "--drain-seconds", "60", "--seed", "11",
        "--pg-restarts", "1", "--bouncer",
    )  # fmt: skip
    assert code == 0, f"{line}\n{stderr[-4000:]}"
    assert "through pgbouncer" in stderr
    finished = sum(int(summary[name]) for name in ("done", "dead", "cancelled"))
    assert finished == 400 + int(summary["periodic_ticks"]), line


@pytest.mark.slow
def test_chaos__each_planted_fault_fails_the_run() -> None:
    """The oracle is tested against the harness itself: a deleted job, a duplicated
    job, a duplicated transactional effect, a row left running while locked (released
    before the end, so only the sampling sees it), a worker that aborts and one that
    dies of a SIGKILL nobody sent; and of the new surfaces: a cancelled job put back to
    pending (it runs after its cancel returned and ends done), a cancelled job logged
    done, a periodic tick enqueued twice, a worker process whose parent is gone, a key
    with more jobs running than its limit. Each is named in the verdict."""
    code, summary, line, stderr = chaos(
        "--jobs", "200", "--duration", "8", "--calm", "--poison", "0", "--leaks", "0",
        "--work-ms", "5", "--drain-seconds", "40",
        "--plant", ",".join(p for p in chaos_bench.PLANTS if p != "hoard"),  # (its own test)
    )  # fmt: skip
    assert code == 1, line
    failed = re.search(r"FAILED: ([\w, ]+);", stderr)
    assert failed, stderr[-4000:]
    assert set(failed.group(1).split(", ")) >= {
        "lost",
        "dup_jobs",
        "dup_tx",
        "late_leases",
        "crashes",
        "oom_kills",
        "cancel_ignored",
        "run_after_cancel",
        "cancelled_as_done",
        "dup_ticks",
        "orphans",
        "over_limit",
    }, line
    assert (summary["lost"], summary["oom_kills"], summary["crashes"]) == ("1", "1", "1")
    assert (summary["run_after_cancel"], summary["dup_ticks"], summary["orphans"]) == (
        "1",
        "1",
        "1",
    ), line
    assert summary["stuck"] == "0", line  # released in time: the final check alone passes


@pytest.mark.django_db(transaction=True)
def test_oracle__detects_each_violation() -> None:
    """The chaos oracle is only as good as its checks: seed one violation of each kind
    and see every counter move, judged by job identity (a deleted job and a duplicated
    one leave the totals unchanged)."""
    from django_pgqueue.models import Job
    from testproject.demo.models import Execution

    from .conftest import test_database_url

    expected: dict[int, str] = {}

    def make(kind: str, status: str, rows: int, **fields: object) -> Job:
        task = {"tx": "ledger_tx", "plain": "ledger_plain", "poison": "poison"}.get(kind, kind)
        job = Job.objects.enqueue(f"testproject.demo.fault_tasks.{task}")
        Job.objects.filter(pk=job.id).update(status=status, **fields)
        expected[job.id] = "leak" if kind == "leak" else kind
        for attempt in range(rows):
            Execution.objects.create(job_id=job.id, attempt=attempt + 1, kind=kind, worker_id="w")
        return job

    make("tx", "done", 1)  # correct
    make("plain", "done", 1)  # correct
    make("tx", "done", 2)  # dup_tx, i5
    make("tx", "scheduled", 1)  # i5 (effect without completion), stuck
    make("plain", "done", 0)  # lost effect
    make("plain", "done", 3)  # two plain duplicates
    make("plain", "done", 1, attempts=9, max_attempts=2)  # i2
    make("plain", "done", 1, lease_expires_at=timezone.now())  # i4
    make("plain", "dead", 1)  # dead_unexpected
    deleted = make("plain", "done", 1)
    copied = make("plain", "done", 1)
    Job.objects.filter(pk=deleted.id).delete()  # lost, by identity ...
    Job.objects.enqueue("testproject.demo.fault_tasks.ledger_plain")  # ... dup_jobs
    Execution.objects.create(job_id=copied.id + 10_000, attempt=1, kind="tx", worker_id="w")
    pill = make("poison", "dead", 4, attempts=3, max_attempts=3)  # 4 runs > 3 attempts
    make("leak", "done", 0)  # leak_undetected
    make("leak", "dead", 1)  # a write inside a leaked transaction committed
    Execution.objects.filter(job_id=max(expected), kind="leak").update(kind="leaked")
    result = oracle.check(test_database_url(), expected=expected, lease_seconds=2)
    assert {name: result[name] for name in oracle.MUST_BE_ZERO} == {
        "lost": 2,  # the deleted job + one done without its effect
        "dup_jobs": 2,  # a job nobody enqueued + effects of an id nobody enqueued
        "stuck": 1,
        "dup_tx": 1,
        "i1": 0,
        "i2": 1,
        "i4": 1,
        "i5": 2,
        "dead_unexpected": 1,
        "leak_undetected": 1,
        "leaked_rows": 1,
        "poison_overrun": 1,
        "cancel_ignored": 0,
        "run_after_cancel": 0,
        "cancelled_unasked": 0,
    }
    assert result["dup_plain"] == 2
    assert result["expected"] == len(expected) and pill.id in expected


@pytest.mark.django_db(transaction=True)
def test_oracle__sample_sees_a_late_lease_and_a_finished_job_still_leased() -> None:
    """The invariants sampled during faults, one violation each (and a key of the run's
    limit with one job more running than it allows)."""
    import psycopg

    from django_pgqueue.models import Job

    from .conftest import test_database_url

    late = Job.objects.enqueue("testproject.demo.fault_tasks.ledger_plain")
    leased = Job.objects.enqueue("testproject.demo.fault_tasks.ledger_plain")
    Job.objects.filter(pk=late.id).update(
        status="running",
        lease_owner="w",
        attempts=1,
        lease_expires_at=timezone.now() - timezone.timedelta(seconds=30),
    )
    Job.objects.filter(pk=leased.id).update(status="done", lease_expires_at=timezone.now())
    key = f"{oracle.KEY_PREFIX}1"
    for _ in range(oracle.KEY_CONCURRENCY + 1):
        over = Job.objects.enqueue(
            "testproject.demo.fault_tasks.ledger_plain", concurrency_key=key
        )
        Job.objects.filter(pk=over.id).update(
            status="running",
            lease_owner="w",
            attempts=1,
            lease_expires_at=timezone.now() + timezone.timedelta(seconds=30),
        )
    sampler = oracle.Sampler(lateness=10)
    with psycopg.connect(test_database_url(), autocommit=True) as conn:
        sampler.sample(conn.execute(oracle.SAMPLE, chaos_bench.sample_params(sampler)).fetchall())
        sampler.sample(None)  # a sample that could not run (server restarting)
        later = oracle.Sampler(lateness=60)
        assert conn.execute(oracle.SAMPLE, chaos_bench.sample_params(later)).fetchone()[0] == 0
    assert sampler.worst == {
        "late_leases": 1,
        "finished_leased": 1,
        "over_attempts": 0,
        "over_limit": 1,
        "hoarded": 0,  # four jobs leased to "w": its four threads' worth
    }
    assert sampler.key_peak == oracle.KEY_CONCURRENCY + 1
    assert (sampler.samples, sampler.skipped) == (1, 1)


@pytest.mark.django_db(transaction=True)
def test_oracle__sample_sees_a_worker_holding_more_than_its_room() -> None:
    """``hoarded``: per worker, ledger jobs leased whose attempt has no ledger row yet
    (not started): plain ones beyond its threads plus one, coroutine ones beyond its
    loop slots plus one; a started job (its row written) does not count."""
    import psycopg

    from django_pgqueue.models import Job
    from testproject.demo.models import Execution

    from .conftest import test_database_url

    def lease(task: str, owner: str, count: int) -> list[int]:
        ids = [
            Job.objects.enqueue(f"testproject.demo.fault_tasks.{task}").id for _ in range(count)
        ]
        Job.objects.filter(pk__in=ids).update(
            status="running",
            lease_owner=owner,
            attempts=1,
            lease_expires_at=timezone.now() + timezone.timedelta(seconds=30),
        )
        return ids

    def worst(threads: int, loop_slots: int) -> int:
        sampler = oracle.Sampler(lateness=10, threads=threads, loop_slots=loop_slots)
        with psycopg.connect(test_database_url(), autocommit=True) as conn:
            sampler.sample(
                conn.execute(oracle.SAMPLE, chaos_bench.sample_params(sampler)).fetchall()
            )
        return sampler.worst["hoarded"]

    started = lease("ledger_plain", "a", 3)
    lease("ledger_tx", "a", 4)  # (a transactional job's row commits with it)
    lease("ledger_async", "b", 5)
    lease("ledger_plain", "planted", 9)  # the over_limit plant's: not a worker
    for job_id in started:
        Execution.objects.create(job_id=job_id, attempt=1, kind="plain", worker_id="a")
    assert worst(threads=4, loop_slots=100) == 0  # a: 4 waiting <= 4 + 1
    assert worst(threads=2, loop_slots=100) == 1  # a: 4 > 2 + 1
    assert worst(threads=4, loop_slots=3) == 1  # b: 5 > 3 + 1
    Execution.objects.filter(job_id__in=started).update(attempt=0)  # an earlier attempt's
    assert worst(threads=4, loop_slots=100) == 2  # a: 7 > 4 + 1


@pytest.mark.slow
def test_chaos__a_worker_that_hoards_fails_the_run() -> None:
    """The planted fault ``hoard``: the claim sizing of before issue 28 (bench/
    chaos_hoard.py) in every worker of a calm run whose jobs start with a run of
    coroutine jobs. The first claims set the share of coroutine jobs to 1, and the next
    ones lease plain jobs for the loop's room: the sampled ``hoarded`` catches it (the
    runs of tests above, without the plant, keep it at 0)."""
    code, summary, line, stderr = chaos(
        "--jobs", "400", "--duration", "8", "--calm", "--poison", "0", "--leaks", "0",
        "--work-ms", "100", "--drain-seconds", "40", "--plant", "hoard",
    )  # fmt: skip
    assert code == 1, line
    failed = re.search(r"FAILED: ([\w, ]+);", stderr)
    assert failed and failed.group(1) == "hoarded", stderr[-4000:]
    assert int(summary["hoarded"]) > 1, line
    assert int(summary["coroutine_done"]) > 0, line


@pytest.mark.django_db(transaction=True)
def test_oracle__judges_cancellations_against_their_acknowledgement() -> None:
    """Crafted rows, one verdict each: a job claimed again after its cancel returned
    (in the database's clock), one acknowledged that ended done, one cancelled that
    nobody cancelled; and the rows that are right: a running job cancelled that finished
    its run, an uncertain cancel that found the job done."""
    from django_pgqueue.models import Job

    from .conftest import test_database_url

    now = timezone.now()
    before, after = now - timezone.timedelta(seconds=5), now + timezone.timedelta(seconds=5)
    expected: dict[int, str] = {}
    cancels: dict[int, oracle.Cancel] = {}

    def make(status: str, claimed: object, ack: object = None, sure: bool = True) -> None:
        job = Job.objects.enqueue("testproject.demo.fault_tasks.slow_plain")
        Job.objects.filter(pk=job.id).update(status=status, last_attempted_at=claimed)
        expected[job.id] = "cancel"
        if ack is not None:
            cancels[job.id] = oracle.Cancel(ack, sure=sure)  # type: ignore[arg-type]

    make("cancelled", before, ack=now)  # claimed before the ack, then cancelled: right
    make("cancelled", None, ack=now)  # cancelled while pending: right
    make("cancelled", after, ack=now)  # run_after_cancel
    make("done", after, ack=now)  # run_after_cancel + cancel_ignored
    make("done", before, ack=now)  # cancel_ignored
    make("done", after, ack=now, sure=False)  # uncertain, and it was done: right
    make("cancelled", after, ack=now, sure=False)  # uncertain, cancelled: run_after_cancel
    make("cancelled", before)  # cancelled_unasked
    result = oracle.check(test_database_url(), expected=expected, lease_seconds=2, cancels=cancels)
    assert (result["run_after_cancel"], result["cancel_ignored"]) == (3, 2)
    assert (result["cancelled_unasked"], result["cancelled"], result["stuck"]) == (1, 5, 0)


def test_oracle__periodic_ticks_enqueued_twice_or_missed_while_a_sweeper_lived() -> None:
    """A duplicated key, a missing minute while a sweeper was alive (a hole), and one
    missing while none was (no hole), a key of no entry; judged without a database."""
    t0 = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.UTC)

    def key(name: str, minute: int) -> str:
        return f"periodic:{name}:{(t0 + dt.timedelta(minutes=minute)).isoformat()}"

    minute = dt.timedelta(minutes=1)
    # Sweepers alive over minutes 0-4 and 6-9 (minute 5 uncovered: its sweeper died).
    alive = [(t0 - dt.timedelta(seconds=30), t0 + 4 * minute + dt.timedelta(seconds=30)),
             (t0 + 6 * minute - dt.timedelta(seconds=1), t0 + 10 * minute)]  # fmt: skip
    keys = [(key("a", m), 1) for m in (0, 1, 2, 4, 6, 7, 8, 9)]  # 3 missing, 5 uncovered
    keys += [(key("b", m), 2 if m == 7 else 1) for m in range(10)]
    keys.append((key("gone", 3), 1))
    crons = {"a": "* * * * *", "b": "* * * * *"}
    result = oracle.judge_periodic(keys, crons=crons, alive=alive, cover=20)
    assert result == {"periodic_ticks": 18, "dup_ticks": 1, "tick_holes": 1, "stray_ticks": 1}
    full = [(key("a", m), 1) for m in range(10)] + [(key("b", m), 1) for m in range(10)]
    assert oracle.judge_periodic(full, crons=crons, alive=alive, cover=20)["tick_holes"] == 0
    # A window ends cover seconds before its sweeper died: a tick after that need not
    # have its job (minute 10 is not expected).
    assert oracle.cover_windows(alive, 20)[-1][1] == t0 + 10 * minute - dt.timedelta(seconds=20)


def test_oracle__a_cancelled_job_logged_done_and_a_counter_that_disagrees() -> None:
    """The workers' logs: a job that ended cancelled but was logged (counted) done, and
    a single-process worker whose done= counter is not its done lines."""
    done = "2030-01-01 INFO django_pgqueue.worker.outcomes job {} t.x done in 0.1s (attempt 1)\n"
    stop = "2030-01-01 INFO django_pgqueue.worker.loop worker w stopped: done={} failed=0\n"
    logs = {
        "worker-1.log": done.format(1) + done.format(2) + stop.format(2),  # right
        "worker-2.log": done.format(3) + stop.format(2),  # counts one it did not log
        "worker-3.log": done.format(4),  # SIGKILLed: no exit line, not judged
        "supervisor-4.log": "worker process 0 started (pid 9)\n" + stop.format(7),
    }
    result = oracle.judge_logs(logs, cancelled={2, 4, 5})
    assert result == {"cancelled_as_done": 2, "counter_mismatch": 1}


def test_procs__a_worker_whose_parent_is_gone_is_an_orphan() -> None:
    """A run's worker process (by its marker) re-parented when its shell exits is an
    orphan; one whose parent is the harness is not; another run's is not seen."""
    token = secrets.token_hex(4)
    env = {**os.environ, procs.MARKER: token}
    # Stand-ins for workers: they wait for a signal (killed in the finally below).
    sleeper = [sys.executable, "-c", "import signal; signal.pause()", "pgqueue_worker"]
    child = subprocess.Popen(sleeper, env=env)
    other = subprocess.Popen(sleeper, env={**env, procs.MARKER: token + "x"})
    shell = subprocess.run(
        ["sh", "-c", " ".join(sleeper[:2]) + ' "import signal; signal.pause()" pgqueue_worker'
         " >/dev/null 2>&1 & echo $!"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    orphan = int(shell.stdout.split()[-1])
    try:
        # Seen once each has exec'd its command line.
        wait_for(lambda: procs.run_workers(token).keys() == {child.pid, orphan})
        assert procs.orphans(token, {os.getpid()}) == {orphan}
        adopter = int(procs.status(orphan)["PPid"])  # init, or a subreaper
        assert adopter != os.getpid()
        assert procs.orphans(token, {os.getpid(), adopter}) == set()
    finally:
        procs.kill([child.pid, other.pid, orphan], signal.SIGKILL)
        child.wait()
        other.wait()


@pytest.mark.django_db(transaction=True)
def test_oracle__a_leak_whose_session_a_fault_ended_is_not_undetected() -> None:
    """A leaking task's attempt that ran on a backend the harness then terminated (or a
    restart ended) may end done: nothing of its session is left to reach a later job.
    The same done leak on a backend no fault touched is an undetected leak."""
    from django_pgqueue.models import Job
    from testproject.demo.models import Execution

    from .conftest import test_database_url

    expected: dict[int, str] = {}
    for pid in (4242, 4343):
        job = Job.objects.enqueue("testproject.demo.fault_tasks.leak", ["set_role"])
        Job.objects.filter(pk=job.id).update(status="done", attempts=2)
        expected[job.id] = "leak"
        # Attempt 1 on another backend; the attempt that ended done ran on ``pid``.
        Execution.objects.create(
            job_id=job.id, attempt=1, kind="plain", worker_id="w", backend_pid=pid + 1
        )
        Execution.objects.create(
            job_id=job.id, attempt=2, kind="plain", worker_id="w", backend_pid=pid
        )
    url = test_database_url()
    judged = oracle.check(url, expected=expected, lease_seconds=2, ended_pids=[4242])
    assert (judged["leak_undetected"], judged["leak_session_ended"]) == (1, 1)
    # A fault on an earlier attempt's backend excuses nothing.
    judged = oracle.check(url, expected=expected, lease_seconds=2, ended_pids=[4243, 4344])
    assert (judged["leak_undetected"], judged["leak_session_ended"]) == (2, 0)

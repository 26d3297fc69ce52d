"""manage.py pgqueue_worker and pgqueue_sweep: argument checking and what they print."""

from __future__ import annotations

import datetime as dt
import re
from importlib import import_module
from io import StringIO

import pytest
from django.core.management import BaseCommand, CommandError, call_command
from django.db import connection

from django_pgqueue.models import Job

S = dt.timedelta(seconds=1)

BAD_ARGUMENTS = {
    "concurrency_zero": (
        "pgqueue_worker",
        ["--concurrency", "0"],
        "argument --concurrency: '0' is out of range: use an integer from 1 to 1000",
    ),
    "concurrency_word": (
        "pgqueue_worker",
        ["--concurrency", "many"],
        "argument --concurrency: 'many' is not an integer: use an integer from 1 to 1000",
    ),
    "processes_zero": (
        "pgqueue_worker",
        ["--processes", "0"],
        "argument --processes: '0' is out of range: use an integer from 1 to 256",
    ),
    "lease_negative": (
        "pgqueue_worker",
        ["--lease-seconds", "-1"],
        "argument --lease-seconds: '-1' is out of range: use a number of seconds from 1 to 86400",
    ),
    "lease_zero": (
        "pgqueue_worker",
        ["--lease-seconds", "0"],
        "argument --lease-seconds: '0' is out of range",
    ),
    "lease_nan": (
        "pgqueue_worker",
        ["--lease-seconds", "nan"],
        "argument --lease-seconds: 'nan' is not a finite number",
    ),
    "lease_infinite": (
        "pgqueue_worker",
        ["--lease-seconds", "inf"],
        "argument --lease-seconds: 'inf' is not a finite number",
    ),
    "queue_space": (
        "pgqueue_worker",
        ["--queue", "two words"],
        "argument --queue: 'two words' is not a valid queue name",
    ),
    "queue_sql": (
        "pgqueue_worker",
        ["--queue", "x'; drop table pgqueue_job; --"],
        "is not a valid queue name",
    ),
    "queue_65_chars": ("pgqueue_worker", ["--queue", "q" * 65], "is not a valid queue name"),
    "queue_empty": ("pgqueue_worker", ["--queue", ""], "'' is not a valid queue name"),
    "batch_size_zero": (
        "pgqueue_worker",
        ["--batch-size", "0"],
        "argument --batch-size: '0' is out of range: use an integer from 1 to 10000",
    ),
    "max_jobs_negative": (
        "pgqueue_worker",
        ["--max-jobs", "-3"],
        "argument --max-jobs: '-3' is out of range: use an integer from 1 to 1000000000",
    ),
    "poll_interval_zero": (
        "pgqueue_worker",
        ["--poll-interval", "0"],
        "argument --poll-interval: '0' is out of range: use a number of seconds from 0.01 to 3600",
    ),
    "worker_id_too_long": (
        "pgqueue_worker",
        ["--worker-id", "w" * 256],
        "is not a valid worker id (1-255 printable characters)",
    ),
    "worker_id_control_char": (
        "pgqueue_worker",
        ["--worker-id", "w\n1"],
        "is not a valid worker id",
    ),
    # Each of these crashed or wedged a worker before it was bounded.
    "lease_huge": (
        "pgqueue_worker",
        ["--lease-seconds", "1e300"],
        "argument --lease-seconds: '1e300' is out of range: use a number of seconds from 1",
    ),
    "lease_tiny": ("pgqueue_worker", ["--lease-seconds", "1e-9"], "'1e-9' is out of range"),
    "concurrency_huge": (
        "pgqueue_worker",
        ["--concurrency", "99999999999"],
        "argument --concurrency: '99999999999' is out of range: use an integer from 1 to 1000",
    ),
    "concurrency_float": ("pgqueue_worker", ["--concurrency", "2.5"], "'2.5' is not an integer"),
    "concurrency_digits": ("pgqueue_worker", ["--concurrency", "9" * 5000], "is not an integer"),
    "poll_interval_tiny": (
        "pgqueue_worker",
        ["--poll-interval", "1e-9"],
        "argument --poll-interval: '1e-9' is out of range: use a number of seconds from 0.01",
    ),
    "poll_interval_nan": ("pgqueue_worker", ["--poll-interval", "nan"], "is not a finite"),
    "batch_size_huge": ("pgqueue_worker", ["--batch-size", "10001"], "'10001' is out of range"),
    "max_jobs_huge": ("pgqueue_worker", ["--max-jobs", "1e9"], "'1e9' is not an integer"),
    "grace_negative": (
        "pgqueue_worker",
        ["--grace-seconds", "-1"],
        "argument --grace-seconds: '-1' is out of range: use a number of seconds from 0 to",
    ),
    "grace_infinite": ("pgqueue_worker", ["--grace-seconds", "inf"], "'inf' is not a finite"),
    "sweep_interval_nan": ("pgqueue_sweep", ["--interval", "nan"], "'nan' is not a finite"),
    "sweep_interval_huge": ("pgqueue_sweep", ["--interval", "1e300"], "'1e300' is out of range"),
    "sweep_interval_zero": (
        "pgqueue_sweep",
        ["--loop", "--interval", "0"],
        "argument --interval: '0' is out of range: use a number of seconds from 0.1 to 86400",
    ),
}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("command", "args", "message"), BAD_ARGUMENTS.values(), ids=BAD_ARGUMENTS.keys()
)
def test_commands__reject_bad_arguments(command, args, message):
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command(command, *args)
    assert Job.objects.count() == 0


#: One bad value per numeric flag, run as a real manage.py would be: exit 2 and the range.
FLAG_PROCESSES = {
    "--lease-seconds 1e300": ("pgqueue_worker", "from 1 to 86400"),
    "--lease-seconds 1e-9": ("pgqueue_worker", "from 1 to 86400"),
    "--concurrency 99999999999": ("pgqueue_worker", "an integer from 1 to 1000"),
    "--batch-size 0": ("pgqueue_worker", "an integer from 1 to 10000"),
    "--poll-interval 1e-9": ("pgqueue_worker", "from 0.01 to 3600"),
    "--max-jobs 2000000000": ("pgqueue_worker", "an integer from 1 to 1000000000"),
    "--grace-seconds nan": ("pgqueue_worker", "from 0 to 86400"),
    "--interval inf": ("pgqueue_sweep", "from 0.1 to 86400"),
}


@pytest.mark.slow
def test_commands__out_of_range_flag_exits_2_naming_the_range(manage):
    """Started together (they only parse their arguments), then each is checked."""
    started = {
        flag: manage(command, *(["--loop"] if command == "pgqueue_sweep" else []), *flag.split())
        for flag, (command, _) in FLAG_PROCESSES.items()
    }
    for flag, proc in started.items():
        option, value = flag.split()
        assert proc.wait(60) == 2, proc.output()
        expected = f"error: argument {option}: '{value}' is "
        assert expected in proc.output(), proc.output()
        assert FLAG_PROCESSES[flag][1] in proc.output(), proc.output()


@pytest.mark.parametrize("name", ["pgqueue_worker", "pgqueue_sweep"])
def test_commands__help_states_every_default(name):
    """Each of our options says its default in --help."""
    module = import_module(f"django_pgqueue.management.commands.{name}")
    base = {a.dest for a in BaseCommand().create_parser("manage.py", "base")._actions}
    parser = module.Command().create_parser("manage.py", name)
    ours = [a for a in parser._actions if a.dest not in base]
    assert ours
    for action in ours:
        assert action.help.endswith(")") and "(default: " in action.help, action.dest


def db_clock() -> dt.datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


@pytest.mark.django_db
def test_pgqueue_sweep__prints_its_counts(job_factory):
    past = db_clock() - dt.timedelta(days=30)
    # Expired leases: one goes back to pending, one (last attempt) to dead.
    for max_attempts in (3, 1):
        job_factory(max_attempts=max_attempts, now=past)
        Job.objects.claim("w1", limit=1, lease_seconds=60, now=past)
    # Two delayed jobs that are due by now.
    for _ in range(2):
        job_factory(run_at=past + S, now=past)
    # Three done jobs far past the default retention of 7 days.
    for _ in range(3):
        job_factory(now=past)
        (job,) = Job.objects.claim("w1", limit=1, now=past)
        Job.objects.complete(job, "w1", now=past)

    out = StringIO()
    call_command("pgqueue_sweep", stdout=out)
    assert out.getvalue().strip() == (
        "recovered=1 dead=1 promoted=2 pruned=3 periodic=0 cancelled=0 lost_workers=0"
    )
    out = StringIO()
    call_command("pgqueue_sweep", stdout=out)
    assert out.getvalue().strip() == (
        "recovered=0 dead=0 promoted=0 pruned=0 periodic=0 cancelled=0 lost_workers=0"
    )


@pytest.mark.django_db(transaction=True)
def test_pgqueue_worker__burst_runs_the_selected_queues(job_factory):
    a = job_factory(queue="a")
    b = job_factory(queue="b")
    call_command("pgqueue_worker", "--burst", "--poll-interval", "0.1", "--queue", "a")
    assert Job.objects.get(pk=a.pk).status == "done"
    assert Job.objects.get(pk=b.pk).status == "pending"


@pytest.mark.django_db(transaction=True)
def test_pgqueue_worker__max_jobs_and_worker_id(job_factory):
    jobs = [job_factory() for _ in range(3)]
    call_command(
        "pgqueue_worker", "--max-jobs", "2", "--worker-id", "cmd-1", "--poll-interval", "0.1"
    )
    rows = [Job.objects.get(pk=j.pk) for j in jobs]
    assert [(r.status, r.lease_owner) for r in rows] == [
        ("done", "cmd-1"),
        ("done", "cmd-1"),
        ("pending", None),
    ]

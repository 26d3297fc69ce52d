"""``manage.py demo``: the main job, end to end, with a crash in the middle.

Enqueues a few thousand jobs, starts worker processes and a sweeper, SIGKILLs one
worker while it holds running jobs, and waits until every job has finished: the killed
worker's jobs come back through lease expiry and are done by the others. The workers'
logs go to ``<repo>/demo-logs/`` (replaced by each run).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.db.models import Count, Q

from django_pgqueue import enqueue_many
from django_pgqueue.models import Job
from testproject.demo.models import Delivery
from testproject.demo.tasks import flaky, send_notification, slow

MANAGE = Path(__file__).resolve().parents[3] / "manage.py"
LOGS = MANAGE.parent.parent / "demo-logs"


class Command(BaseCommand):
    help = "Enqueue jobs, run workers and a sweeper, kill a worker, show nothing is lost."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--jobs", type=int, default=3000, help="(default: %(default)r)")
        parser.add_argument("--workers", type=int, default=3, help="(default: %(default)r)")
        parser.add_argument(
            "--lease-seconds", type=float, default=3.0, help="(default: %(default)r)"
        )
        parser.add_argument("--timeout", type=float, default=180.0, help="(default: %(default)r)")

    def handle(
        self, *, jobs: int, workers: int, lease_seconds: float, timeout: float, **opts: Any
    ) -> None:
        if workers < 2:
            raise CommandError("--workers must be at least 2 (one of them gets killed)")
        out = self.stdout.write
        call_command("migrate", verbosity=0)  # a fresh machine starts with an empty server
        Job.objects.all().delete()
        Delivery.objects.all().delete()

        started = time.monotonic()
        n_slow = 4
        n_flaky = jobs // 10
        n_notify = jobs - n_slow - n_flaky
        with transaction.atomic():  # one commit: workers wake up once, all jobs visible
            # Bulk, through COPY; then a few one by one, with their own options.
            enqueue_many(
                send_notification, (((f"user{i}@example.com",), {}) for i in range(n_notify))
            )
            for _ in range(n_flaky):
                Job.objects.enqueue(flaky, [0.3], max_attempts=10)
            for _ in range(n_slow):
                Job.objects.enqueue(slow.using(priority=10), [1.0])
        out(
            f"enqueued {jobs} jobs ({n_notify} notifications, {n_flaky} flaky, {n_slow} slow)"
            f" in {time.monotonic() - started:.2f}s"
        )

        env = {**os.environ, "PGQUEUE_RETRY_BACKOFF_BASE": "0.2", "PGQUEUE_RETRY_BACKOFF_MAX": "1"}
        shutil.rmtree(LOGS, ignore_errors=True)
        LOGS.mkdir()
        logs = LOGS
        procs: list[subprocess.Popen[bytes]] = []

        def spawn(*args: str) -> subprocess.Popen[bytes]:
            log = (logs / f"{args[0]}-{len(procs)}.log").open("wb")
            proc = subprocess.Popen(
                [sys.executable, str(MANAGE), *args], env=env, stdout=log, stderr=log
            )
            procs.append(proc)
            return proc

        work_started = time.monotonic()
        try:

            def worker(n: int) -> subprocess.Popen[bytes]:
                return spawn(
                    "pgqueue_worker", "--concurrency", "4", "--worker-id", f"demo-w{n}",
                    "--lease-seconds", str(lease_seconds), "--poll-interval", "0.2",
                )  # fmt: skip

            spawn("pgqueue_sweep", "--loop", "--interval", "0.5")
            # The victim starts first, so it surely holds slow (top-priority) jobs when
            # it is killed; the rest of the fleet starts right after.
            victim = worker(1)
            held = self._wait_until_holding(victim, "demo-w1", timeout)
            for n in range(2, workers + 1):
                worker(n)
            out(f"started {workers} workers (4 threads each) and 1 sweeper; logs in {logs}")
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait()
            out(f"SIGKILLed worker demo-w1 while it held {held} running slow job(s)")

            self._wait_until_finished(jobs, timeout, started=work_started)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
        self._report(jobs, time.monotonic() - work_started)

    def _wait_until_holding(
        self, proc: subprocess.Popen[bytes], owner: str, timeout: float
    ) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            held = Job.objects.filter(
                status="running", lease_owner=owner, task=slow.module_path
            ).count()
            if held:
                return held
            if proc.poll() is not None:
                raise CommandError(f"worker {owner} exited early with code {proc.returncode}")
            time.sleep(0.02)
        raise CommandError(f"worker {owner} never claimed a job")

    def _wait_until_finished(self, jobs: int, timeout: float, *, started: float) -> None:
        deadline = time.monotonic() + timeout
        last = -1
        while time.monotonic() < deadline:
            finished = Job.objects.filter(status__in=["done", "dead"]).count()
            if finished != last:
                rate = finished / max(time.monotonic() - started, 1e-9)
                self.stdout.write(f"  {finished}/{jobs} finished ({rate:,.0f} jobs/s)")
                if last < 0.9 * jobs <= finished:
                    # The rate while the queue was full, before the tail of retries
                    # (backoff) and of the killed worker's jobs (lease expiry).
                    self.rate_90 = finished / (time.monotonic() - started)
                last = finished
            if finished >= jobs:
                return
            time.sleep(0.5)
        raise CommandError(f"only {last}/{jobs} jobs finished within {timeout}s")

    def _report(self, jobs: int, elapsed: float) -> None:
        counts = dict(Job.objects.values_list("status").annotate(n=Count("id")))
        done, dead = counts.get("done", 0), counts.get("dead", 0)
        recovered = Job.objects.filter(
            errors__contains=[{"exception_class_path": "django_pgqueue.exceptions.LeaseExpired"}]
        ).count()
        retried = Job.objects.filter(Q(attempts__gt=1)).count()
        deliveries = Delivery.objects.count()
        repeated = Delivery.objects.filter(executions__gt=1).count()
        unfinished = jobs - done - dead
        rate_90 = getattr(self, "rate_90", 0.0)
        rows = [
            ("enqueued", f"{jobs:,}", "jobs put in the queue"),
            ("done", f"{done:,}", "jobs that ran to success"),
            ("dead", f"{dead:,}", "out of attempts, left for an operator (expect 0)"),
            ("unfinished", f"{unfinished:,}", "neither done nor dead (must be 0)"),
            (
                "recovered",
                f"{recovered:,}",
                "held by the killed worker: back after lease expiry, done by another "
                "(must be 1 or more)",
            ),
            (
                "retried",
                f"{retried:,}",
                "took more than one attempt (flaky jobs fail 30% of runs; the recovered)",
            ),
            (
                "notifications",
                f"{deliveries:,}",
                "delivery rows: one per notification job, however often it ran",
            ),
            (
                "ran twice",
                f"{repeated:,}",
                "notifications run again after the kill, one delivery each (any number is ok)",
            ),
            ("time", f"{elapsed:.1f} s", "from the first worker's start to the last job"),
            (
                "throughput",
                f"{jobs / elapsed:,.0f}/s",
                f"overall; {rate_90:,.0f}/s until 90% were finished (then retries wait out "
                "backoff, and the killed worker's jobs their lease)",
            ),
        ]
        out = self.stdout.write
        out("")
        out("Summary")
        for name, figure, meaning in rows:
            out(f"  {name:<14}{figure:>10}   {meaning}")
        out(
            "A good run: unfinished 0, dead 0, recovered at least 1, and done + dead equal "
            "to enqueued: the crash lost no job."
        )
        if unfinished or recovered == 0:
            raise CommandError(f"demo failed: unfinished={unfinished} recovered={recovered}")
        self.stdout.write(self.style.SUCCESS("every job finished; none was lost"))

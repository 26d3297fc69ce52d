"""Example tasks: an idempotent database effect, a flaky one, and a slow one."""

from __future__ import annotations

import asyncio
import random
import time

from django.db.models import F

from django_pgqueue.taskapi import TaskContext, task

from .models import Delivery


@task(takes_context=True)
def send_notification(context: TaskContext, recipient: str) -> int:
    """Record a delivery once per job, however many times the job runs."""
    job_id = int(context.task_result.id)
    delivery, created = Delivery.objects.get_or_create(
        job_id=job_id, defaults={"recipient": recipient}
    )
    if not created:
        Delivery.objects.filter(pk=delivery.pk).update(executions=F("executions") + 1)
    return job_id


@task()
def flaky(fail_rate: float = 0.3) -> str:
    """Fails some of the time; retries with backoff until it succeeds or dies."""
    if random.random() < fail_rate:
        raise RuntimeError("flaky task failed, will be retried")
    return "ok"


@task()
def slow(seconds: float = 1.0) -> float:
    """Sleeps: stands in for real work that outlives a worker crash."""
    time.sleep(seconds)
    return seconds


@task()
def add(a: int, b: int) -> int:
    return a + b


@task()
def always_fails(message: str = "boom") -> None:
    raise ValueError(message)


def not_a_task() -> None:
    """A plain function: the worker must refuse to run it."""


@task()
async def nap(seconds: float = 0.1) -> None:
    """A coroutine that waits, as one waiting on a remote service would: many of them
    share a worker's event loop (``bench.async_jobs``)."""
    await asyncio.sleep(seconds)


@task()
def work(seconds: float = 0.001, payload: str = "") -> None:
    """Sleeps ``seconds``: an I/O-bound job of ``bench.steady`` (``payload``: the size of
    the job's arguments)."""
    time.sleep(seconds)


@task()
async def await_work(seconds: float = 0.001, payload: str = "") -> None:
    """``work`` as a coroutine (``bench.steady --async-concurrency``)."""
    await asyncio.sleep(seconds)

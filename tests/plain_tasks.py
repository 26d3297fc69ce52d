"""Tasks that need no app but django_pgqueue (tests.settings_only_the_app runs them)."""

from __future__ import annotations

from django_pgqueue.taskapi import task


@task()
def add(a: int, b: int) -> int:
    return a + b


@task()
async def add_async(a: int, b: int) -> int:
    return a + b

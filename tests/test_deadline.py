"""deadline.py: a group of statements bound, all together, to one time limit."""

from __future__ import annotations

import time

import pytest
from django.db import DataError, connection

from django_pgqueue import deadline
from django_pgqueue.exceptions import DeadlineExceeded
from django_pgqueue.models import Job

pytestmark = pytest.mark.django_db(transaction=True)


def test_within__a_locked_table_raises_after_the_limit(other_connection):
    locker = other_connection()
    locker.execute("LOCK TABLE pgqueue_job IN ACCESS EXCLUSIVE MODE")
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded, match="'default' did not answer within 0.5 s"):
        with deadline.within("default", 0.5):
            Job.objects.count()
    assert time.monotonic() - started < 5
    locker.rollback()


def test_within__the_limit_covers_every_statement_together():
    """Each statement gets what is left, so three of 0.4 s overrun a limit of 1 s."""
    with pytest.raises(DeadlineExceeded):
        with deadline.within("default", 1.0), connection.cursor() as cursor:
            for _ in range(3):
                cursor.execute("SELECT pg_sleep(0.4)")


def test_within__other_errors_pass_through_and_nothing_is_left_set():
    with connection.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        before = cursor.fetchone()
    with pytest.raises(DataError, match="division by zero"):
        with deadline.within("default", 5), connection.cursor() as cursor:
            cursor.execute("SELECT 1 / 0")
    with deadline.within("default", 5), connection.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        assert cursor.fetchone() != before  # bound inside
    with connection.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        assert cursor.fetchone() == before

"""The chaos suite's planted fault ``hoard`` (``bench.chaos --plant hoard``): the claim
sizing of before issue 28, put back into the fleet's workers so that the oracle's
``hoarded`` sample must catch it.

That policy sized each claim by the share of coroutine jobs among those claimed
lately, a share the first claim set outright: a worker whose first claim held only
coroutine jobs then claimed as many jobs as its loop had room for, and leased dozens of
plain jobs for its few threads. When :data:`ENV` is set (the harness sets it for this
plant only), ``bench/chaos_settings.py`` installs :class:`HoardPlant`, whose ``ready()``
plants it in the fleet's processes (the worker package imports the models, so not from
the settings module itself).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from django.apps import AppConfig

if TYPE_CHECKING:
    from django_pgqueue.worker.claimer import ClaimSizer

#: Set (to anything) in the environment of the fleet's processes: plant the fault.
ENV = "PGQUEUE_CHAOS_PLANT_HOARD"
#: The old estimate's memory: how much of the share each claimed job keeps.
SHARE_KEEP = 0.98


def hoarding_size(self: ClaimSizer, thread_free: int, loop_free: int, *, waiting: int) -> int:
    """The old ``Worker._claim_total``, as it was (the loop's in-flight count read from
    its free slots)."""
    threads = self.thread_claim(thread_free, waiting)
    if not self.async_concurrency:
        return threads
    capacity = self.async_concurrency
    limit = self.batch_size if self.batch_size > self.concurrency else self.concurrency + capacity
    room = max(0, loop_free)
    if room < max(1, min(limit, capacity) // 4) and loop_free < capacity:
        room = 0
    share = getattr(self, "_share", None) or 0.0
    if share <= 0.0:
        wanted = threads
    elif share >= 1.0:
        wanted = room
    else:
        fill_threads = min(threads / (1 - share), (room + capacity) / share)
        fill_loop = min(room / share, (threads + 1) / (1 - share))
        wanted = int(max(fill_threads, fill_loop))
    return max(0, min(wanted, limit))


def hoarding_split(
    self: ClaimSizer, thread_free: int, loop_free: int, *, waiting: int, loop_waiting: int = 0
) -> tuple[int, int]:
    """The old size as both sides' numbers: one claim of that many, of any kind (the
    worker claims by kind only when the loop's number is the larger)."""
    size = hoarding_size(self, thread_free, loop_free, waiting=waiting)
    return size, size


def hoarding_claimed(self: ClaimSizer, plain: int, coroutine: int) -> None:
    """The old share update: set outright by the first claim, then decaying."""
    total = plain + coroutine
    if not total:
        return
    share = coroutine / total
    old = getattr(self, "_share", None)
    if old is None:
        self._share = share  # type: ignore[attr-defined]
    else:
        self._share = old + (1 - SHARE_KEEP**total) * (share - old)  # type: ignore[attr-defined]


def plant() -> None:
    """Give every ClaimSizer of this process the old policy, if :data:`ENV` is set."""
    from django_pgqueue.worker.claimer import ClaimSizer

    if os.environ.get(ENV):
        ClaimSizer.size = hoarding_size  # type: ignore[method-assign]
        ClaimSizer.split = hoarding_split  # type: ignore[method-assign]
        ClaimSizer.claimed = hoarding_claimed  # type: ignore[method-assign]


class HoardPlant(AppConfig):
    """Installed by bench/chaos_settings.py for ``--plant hoard`` only."""

    name = "bench"
    label = "chaos_hoard_plant"

    def ready(self) -> None:
        plant()

"""Prometheus metrics: a Django view to add to a project's URLconf.

::

    from django_pgqueue import metrics

    urlpatterns = [..., path("metrics/pgqueue", metrics.view)]

It needs the ``prometheus`` extra (``prometheus-client``). A scrape reads the same
bounded queries as ``pgqueue_status`` (``monitoring.py``), built fresh per request, so
any web process can answer it and nothing is kept between scrapes. It is protected: a
request with ``Authorization: Bearer <PGQUEUE_METRICS_TOKEN>`` or from a logged-in
staff user gets the metrics; one without credentials gets 401, one with wrong
credentials (or a non-staff session) 403.

Every name starts with ``pgqueue_``; per-queue metrics carry a ``queue`` label: the
``PGQUEUE_METRICS_MAX_QUEUES`` largest queues by name, the rest summed under
``queue="_other"`` (a real queue of that name among them), so the number of series
stays bounded however many queues there are. The job counters are the workers' own
running totals (``worker`` label), kept in the workers table by their heartbeats:
``sum(rate(pgqueue_jobs_finished_total[5m]))`` is the fleet's throughput, across
restarts.
"""

from __future__ import annotations

import dataclasses
import hmac
import time
from collections.abc import Iterable, Iterator
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse

from . import monitoring
from .conf import settings

try:
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImproperlyConfigured(
        "django_pgqueue.metrics needs prometheus-client: "
        "pip install 'django-tasks-pgqueue[prometheus]'"
    ) from exc

#: Per-queue gauges: (metric name, QueueStats attribute, help).
QUEUE_GAUGES = (
    ("pgqueue_jobs_pending", "pending", "Jobs waiting to run now."),
    (
        "pgqueue_jobs_scheduled",
        "scheduled",
        "Jobs waiting for their run_at (delayed or retrying).",
    ),
    ("pgqueue_jobs_waiting", "waiting", "Jobs waiting for the jobs they depend on."),
    ("pgqueue_jobs_running", "running", "Jobs leased to a worker."),
    ("pgqueue_jobs_dead", "dead", "Dead letters: jobs that used up their attempts."),
    ("pgqueue_jobs_done_recent", "done_5m", "Jobs done in the last 5 minutes."),
    ("pgqueue_jobs_failed_recent", "failed_5m", "Jobs dead-lettered in the last 5 minutes."),
    ("pgqueue_jobs_cancelled_recent", "cancelled_5m", "Jobs cancelled in the last 5 minutes."),
    (
        "pgqueue_jobs_finished_per_second",
        "finished_per_second",
        "Jobs done per second over the last minute.",
    ),
)


#: The ``queue`` label of the queues beyond ``PGQUEUE_METRICS_MAX_QUEUES``, summed.
OTHER = "_other"


def _size(queue: monitoring.QueueStats) -> tuple[int, int, str]:
    """Largest first: jobs held, then recent throughput; the name breaks ties."""
    held = queue.pending + queue.scheduled + queue.waiting + queue.running + queue.dead
    return (-held, -queue.done_5m, queue.queue)


def capped(
    queues: Iterable[monitoring.QueueStats], limit: int
) -> tuple[list[monitoring.QueueStats], int]:
    """The ``limit`` largest queues, then one ``OTHER`` entry summing the rest (the
    longest wait for its oldest pending age); and how many queues that entry sums."""
    every = list(queues)
    ranked = sorted((q for q in every if q.queue != OTHER), key=_size)
    rest = [q for q in every if q.queue == OTHER] + ranked[limit:]
    if not rest:
        return ranked, 0
    totals: dict[str, Any] = {"queue": OTHER}
    for f in dataclasses.fields(monitoring.QueueStats):
        values = [getattr(q, f.name) for q in rest]
        if f.name in ("estimated", "lower_bound"):
            totals[f.name] = frozenset().union(*values)
        elif f.name == "oldest_pending_age":
            ages = [v for v in values if v is not None]
            totals[f.name] = max(ages) if ages else None
        elif f.name == "paused":
            totals[f.name] = any(values)
        elif f.name != "queue":
            totals[f.name] = sum(values)
    return [*ranked[:limit], monitoring.QueueStats(**totals)], len(rest)


class QueueCollector(Collector):
    """Turns one ``monitoring.snapshot()`` into metric families."""

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        snap = monitoring.snapshot()
        queues, folded = capped(snap.queues.values(), settings.METRICS_MAX_QUEUES)
        for name, attribute, text in QUEUE_GAUGES:
            family = GaugeMetricFamily(name, text, labels=["queue"])
            for queue in queues:
                family.add_metric([queue.queue], float(getattr(queue, attribute)))
            yield family
        oldest = GaugeMetricFamily(
            "pgqueue_oldest_pending_age_seconds",
            "How long the oldest pending job has waited (the queue's latency); 0 if none.",
            labels=["queue"],
        )
        estimated = GaugeMetricFamily(
            "pgqueue_estimated",
            "1 where a queue's figure is an estimate (a status over the sampling cap).",
            labels=["queue", "figure"],
        )
        for queue in queues:
            oldest.add_metric([queue.queue], queue.oldest_pending_age or 0.0)
            for figure in sorted(queue.estimated):
                estimated.add_metric([queue.queue, figure], 1.0)
        yield oldest
        yield estimated
        paused = GaugeMetricFamily(
            "pgqueue_queue_paused",
            "1 for a paused queue (Job.objects.pause_queue): no worker claims from it.",
            labels=["queue"],
        )
        for queue in queues:
            paused.add_metric([queue.queue], 1.0 if queue.paused else 0.0)
        yield paused
        yield from budget_families(snap.budgets)
        other = GaugeMetricFamily(
            "pgqueue_queues_other",
            f'Queues summed under queue="{OTHER}" (beyond PGQUEUE_METRICS_MAX_QUEUES).',
        )
        other.add_metric([], float(folded))
        yield other
        workers = GaugeMetricFamily(
            "pgqueue_workers",
            "Registered workers: live, or lost (not seen for longer than their lease).",
            labels=["state"],
        )
        live = len(snap.live_workers)
        workers.add_metric(["live"], float(live))
        workers.add_metric(["lost"], float(len(snap.workers) - live))
        yield workers
        held = GaugeMetricFamily(
            "pgqueue_worker_jobs_held", "Jobs each worker holds now.", labels=["worker"]
        )
        done = CounterMetricFamily(
            "pgqueue_jobs_finished",
            "Jobs each worker has finished successfully since it started.",
            labels=["worker"],
        )
        failed = CounterMetricFamily(
            "pgqueue_jobs_failed",
            "Failed attempts each worker has recorded since it started.",
            labels=["worker"],
        )
        for worker in snap.workers:
            held.add_metric([worker.id], float(worker.jobs_held))
            done.add_metric([worker.id], float(worker.jobs_done))
            failed.add_metric([worker.id], float(worker.jobs_failed))
        yield held
        yield done
        yield failed
        duration = GaugeMetricFamily(
            "pgqueue_scrape_duration_seconds", "How long reading these figures took."
        )
        duration.add_metric([], time.perf_counter() - started)
        yield duration


#: Per-budget gauges of flow control: (metric name, what it reads, help).
BUDGET_GAUGES = (
    ("pgqueue_limit_running", "running", "Jobs of the budget running now."),
    (
        "pgqueue_limit_concurrency",
        "concurrency",
        "The budget's concurrency limit (absent: none).",
    ),
    ("pgqueue_limit_pending", "pending", "Pending jobs of the budget (capped per level)."),
    ("pgqueue_limit_waiting", "waiting", "Pending jobs the full budget holds back now."),
    ("pgqueue_limit_rate_started", "started", "Starts in the budget's rate window now."),
    ("pgqueue_limit_rate", "rate", "The budget's rate: starts allowed per window (absent: none)."),
)


def budget_families(found: Iterable[monitoring.BudgetStats]) -> Iterator[Metric]:
    """The flow control gauges, labelled by limit (its key as declared, ``queue:NAME``
    for a queue's) and key (the budget's concurrency key, or the queue)."""
    found = list(found)
    for name, attribute, text in BUDGET_GAUGES:
        family = GaugeMetricFamily(name, text, labels=["limit", "key"])
        for budget in found:
            value = getattr(budget, attribute)
            if attribute == "rate":
                value = None if value is None else value[0]
            if value is not None:
                family.add_metric([budget.limit, budget.subject], float(value))
        yield family


def _authorized(request: HttpRequest) -> int | None:
    """None if allowed, else the status to answer (401: no credentials; 403: wrong)."""
    header = request.headers.get("Authorization", "")
    token = settings.METRICS_TOKEN
    if header:
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return 403
        # Constant time: the comparison must not tell how much of a guess was right.
        if hmac.compare_digest(given.strip().encode(), str(token).encode()):
            return None
        return 403
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return 401
    # The dashboard's gate: a staff user who may view jobs (not any staff user).
    allowed = user.is_active and user.is_staff and user.has_perm("django_pgqueue.view_job")
    return None if allowed else 403


def view(request: HttpRequest) -> HttpResponse:
    """The Prometheus text exposition of the queue's figures (see the module docstring)."""
    status = _authorized(request)
    if status is not None:
        response = HttpResponse(
            "Authorization: Bearer <PGQUEUE_METRICS_TOKEN> or a staff session with the "
            "django_pgqueue.view_job permission needed.\n",
            status=status,
            content_type="text/plain",
        )
        if status == 401:
            response["WWW-Authenticate"] = 'Bearer realm="pgqueue metrics"'
        return response
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)

"""OpenTelemetry, when ``opentelemetry-api`` is installed: one span per job run, linked
to the trace that enqueued the job.

At enqueue, the active trace context (W3C ``traceparent``/``tracestate``, through the
configured propagator) is stored with the job in ``Job.trace_context``. The worker
starts a ``CONSUMER`` span for each run, named ``process <queue>``, with a link to
that context (a job may run long after, and more than once, so it starts a trace of
its own rather than growing the request's), and the attributes ``messaging.system``,
``messaging.destination.name`` (the queue), ``messaging.message.id`` (the job id),
``pgqueue.task``, ``pgqueue.attempt`` and ``pgqueue.outcome`` (``succeeded``,
``failed``, ``lost``).

Without the package nothing is imported and every function here is a constant no-op:
enqueue stores NULL and a run costs one empty context manager. With the package but no
SDK (no tracer provider set: the API's proxy provider, whose spans record nothing), a
run costs the same: building a span and its attributes per job only to drop them was a
twentieth of a no-op job's cost in the worker.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Protocol


class Job(Protocol):
    """What a span reads of a job (a ``models.Job``; typed here without importing the
    models, which import this module through the manager)."""

    id: int
    task: str
    queue: str
    attempts: int
    trace_context: Any


try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Link, SpanKind, StatusCode
except ImportError:  # the optional dependency is absent: tracing is off
    trace = None  # type: ignore[assignment]

#: True when ``opentelemetry-api`` is importable.
ENABLED = trace is not None

#: How long the answer "is a tracer provider set?" is kept, in seconds.
RECHECK_SECONDS = 1.0

#: What a run ended in (``pgqueue.outcome``).
SUCCEEDED, FAILED, LOST = "succeeded", "failed", "lost"


if ENABLED:
    _tracer_name = "django_pgqueue"

    def carrier() -> dict[str, str] | None:
        """The active trace context as headers to store with a job (None: no trace)."""
        headers: dict[str, str] = {}
        propagate.inject(headers)
        return headers or None

    @contextmanager
    def _job_span(job: Job) -> Iterator[Any]:
        links = []
        if isinstance(job.trace_context, dict):
            parent = trace.get_current_span(propagate.extract(job.trace_context))
            context = parent.get_span_context()
            if context.is_valid:
                links.append(Link(context))
        tracer = trace.get_tracer(_tracer_name)
        with tracer.start_as_current_span(
            f"process {job.queue}",
            kind=SpanKind.CONSUMER,
            links=links,
            # A new trace: the enqueuing one is linked, not continued.
            context=trace.set_span_in_context(trace.INVALID_SPAN),
            attributes={
                "messaging.system": "pgqueue",
                "messaging.operation.type": "process",
                "messaging.destination.name": job.queue,
                "messaging.message.id": str(job.id),
                "pgqueue.task": job.task,
                "pgqueue.attempt": job.attempts,
            },
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            yield span

    _NULL_SPAN: AbstractContextManager[None] = nullcontext()

    #: (answer of _recording, monotonic time until which it holds).
    _recording_until: list[Any] = [False, 0.0]

    def _recording() -> bool:
        """Whether a tracer provider is set (the proxy provider's spans record nothing).
        Asked again every RECHECK_SECONDS (the API reads the environment each time no
        provider is set), so a provider set after the worker started is used soon."""
        now = time.monotonic()
        if now >= _recording_until[1]:
            provider = trace.get_tracer_provider()
            _recording_until[:] = [
                not isinstance(provider, trace.ProxyTracerProvider),
                now + RECHECK_SECONDS,
            ]
        return bool(_recording_until[0])

    def recheck() -> None:
        """Look for a tracer provider at the next run, not up to RECHECK_SECONDS later
        (for code that sets one while workers run: tests, a late SDK set-up)."""
        _recording_until[1] = 0.0

    def job_span(job: Job) -> AbstractContextManager[Any]:
        """The span of one run of ``job`` (current while the task runs)."""
        return _job_span(job) if _recording() else _NULL_SPAN

    def outcome(name: str, error: BaseException | None = None) -> None:
        """Record how the current run ended on its span (an error marks it failed)."""
        if not _recording():
            return
        span = trace.get_current_span()
        span.set_attribute("pgqueue.outcome", name)
        if error is not None:
            span.record_exception(error)
            span.set_status(StatusCode.ERROR, f"{type(error).__name__}: {error}"[:200])

else:

    def carrier() -> dict[str, str] | None:
        return None

    _NULL: AbstractContextManager[None] = nullcontext()

    def recheck() -> None:
        return None

    def job_span(job: Job) -> AbstractContextManager[Any]:
        return _NULL

    def outcome(name: str, error: BaseException | None = None) -> None:
        return None

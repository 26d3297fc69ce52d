"""OpenTelemetry: the enqueuer's trace context is stored with the job, and each run is
one CONSUMER span linked to it, recorded by the SDK's in-memory exporter; without the
package nothing is imported and enqueue stores NULL."""

from __future__ import annotations

import subprocess
import sys

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from django_pgqueue import tracing
from django_pgqueue.models import Job
from testproject.demo import tasks
from tests.conftest import REPO

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    # The global provider can be set once per process: the first test sets it.
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    tracing.recheck()  # an earlier test's worker may have found no provider
    _EXPORTER.clear()
    return _EXPORTER


def runs(exporter: InMemorySpanExporter) -> list:
    return [s for s in exporter.get_finished_spans() if s.name.startswith("process ")]


def test_tracing__a_run_is_one_span_linked_to_the_enqueuing_trace(exporter, run_worker):
    with trace.get_tracer("app").start_as_current_span("POST /signup") as request_span:
        result = tasks.add.using(queue_name="mail").enqueue(2, 3)
    job = Job.objects.get(pk=int(result.id))
    assert job.trace_context["traceparent"].split("-")[1] == format(
        request_span.get_span_context().trace_id, "032x"
    )
    run_worker()
    (span,) = runs(exporter)
    assert span.name == "process mail" and span.kind == SpanKind.CONSUMER
    assert span.attributes["messaging.destination.name"] == "mail"
    assert span.attributes["messaging.message.id"] == str(job.id)
    assert span.attributes["pgqueue.task"] == "testproject.demo.tasks.add"
    assert span.attributes["pgqueue.attempt"] == 1
    assert span.attributes["pgqueue.outcome"] == "succeeded"
    (link,) = span.links
    assert link.context.span_id == request_span.get_span_context().span_id
    assert link.context.trace_id == request_span.get_span_context().trace_id
    assert span.context.trace_id != request_span.get_span_context().trace_id  # its own


def test_tracing__a_failed_run_is_an_error_span_with_the_exception(exporter, run_worker):
    tasks.always_fails.enqueue("kaboom")  # no active trace: no link
    run_worker(max_jobs=1)
    (span,) = runs(exporter)
    assert span.attributes["pgqueue.outcome"] == "failed"
    assert span.status.status_code == StatusCode.ERROR
    assert span.links == ()
    assert [e.name for e in span.events] == ["exception"]
    assert "kaboom" in span.events[0].attributes["exception.message"]


@pytest.mark.django_db
def test_tracing__no_active_trace_stores_null(exporter):
    job = Job.objects.enqueue(tasks.add, [1, 1])
    assert job.trace_context is None


def test_tracing__without_opentelemetry_nothing_is_imported():
    # A fresh interpreter in which the package cannot be imported at all.
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "from django_pgqueue import tracing\n"
        "assert not tracing.ENABLED and tracing.carrier() is None\n"
        "with tracing.job_span(None): tracing.outcome('failed', ValueError())\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry') and sys.modules[m]]\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert out.stdout.strip() == "ok", out.stderr
    assert tracing.ENABLED  # here, with the package installed

import pytest

from django_pgqueue.models import Job


@pytest.mark.django_db
def test_enqueue__stores_a_pending_job(job_factory):
    job = job_factory()
    assert Job.objects.get(pk=job.pk).status == "pending"

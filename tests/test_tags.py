"""A job's tags: every way to enqueue stores them (the task's first, then the call's),
bad ones are refused naming what is wrong with nothing saved, and the GIN index
answers "every job with tag X"."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from django_pgqueue import (
    InvalidJob,
    chain,
    enqueue_many,
    group,
    monitoring,
    sql,
    step,
    validation,
)
from django_pgqueue.models import Job
from django_pgqueue.taskapi import InvalidTask, task
from testproject.demo import tasks as demo
from tests.tasks import tagged

ADD = "testproject.demo.tasks.add"


def stored(job_id: int) -> list[str]:
    return Job.objects.values_list("tags", flat=True).get(pk=job_id)


@pytest.mark.django_db
def test_enqueue__stores_the_call_tags_and_returns_them():
    job = Job.objects.enqueue(ADD, [1, 2], tags=["customer:42", "import", "customer:42"])
    assert job.tags == ["customer:42", "import"]
    assert stored(job.pk) == ["customer:42", "import"]
    assert stored(Job.objects.enqueue(ADD, [1, 2]).pk) == []


@pytest.mark.django_db
def test_enqueue__task_tags_come_first_then_the_call_tags():
    job = Job.objects.enqueue(tagged, [1], tags=["customer:7", "billing"])
    assert stored(job.pk) == ["billing", "nightly", "customer:7"]
    assert stored(Job.objects.enqueue(tagged, [1]).pk) == ["billing", "nightly"]


@pytest.mark.django_db
def test_task_enqueue__stores_the_task_option_tags():
    result = tagged.enqueue(3)
    assert stored(int(result.id)) == ["billing", "nightly"]


@pytest.mark.django_db
def test_enqueue__keyed_and_debounced_jobs_keep_their_tags():
    unique = Job.objects.enqueue(ADD, [1], idempotency_key="k1", unique_for=60, tags=["a"])
    assert stored(unique.pk) == ["a"]
    first = Job.objects.enqueue(ADD, [1], idempotency_key="k2", debounce=60, tags=["old"])
    again = Job.objects.enqueue(ADD, [2], idempotency_key="k2", debounce=60, tags=["new"])
    assert again.pk == first.pk and stored(first.pk) == ["new"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("tags", "message"),
    [
        ("customer:42", "tags must be a list of str"),
        ([42], "each tag must be a non-empty str"),
        ([""], "each tag must be a non-empty str"),
        (["x" * 65], "at most 64 characters"),
        (["has space"], "may hold only letters, digits"),
        (["a,b"], "may hold only letters, digits"),
        (['q"uote'], "may hold only letters, digits"),
        (["nul\x00"], "may hold only letters, digits"),
        (["-leading"], "starting with a letter or a digit"),
        (["é"], "may hold only letters, digits"),
        ([f"t{i}" for i in range(17)], "at most 16 tags per job, not 17"),
    ],
)
def test_enqueue__bad_tags_are_refused_naming_them_and_nothing_is_saved(tags, message):
    with pytest.raises(InvalidJob, match="tags") as caught:
        Job.objects.enqueue(ADD, [1], tags=tags)
    assert message in str(caught.value)
    with pytest.raises(InvalidJob, match="tags"):
        Job.objects.bulk_enqueue([{"task": ADD, "tags": ["ok"]}, {"task": ADD, "tags": tags}])
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_enqueue__task_and_call_tags_together_are_bounded():
    with pytest.raises(InvalidJob, match="the task's and the call's together"):
        Job.objects.enqueue(tagged, [1], tags=[f"t{i}" for i in range(15)])
    assert not Job.objects.exists()


def test_task_option__bad_tags_are_refused_at_definition():
    with pytest.raises(InvalidTask, match="may hold only letters"):
        task(tags=["no spaces"])(demo.add.func)
    with pytest.raises(InvalidTask, match="tags must be a list of str"):
        task(tags="billing")(demo.add.func)


@pytest.mark.django_db
def test_bulk_enqueue__copy_and_dedupe_paths_store_tags(now):
    created = Job.objects.bulk_enqueue(
        [
            {"task": ADD, "args": [1]},
            {"task": ADD, "args": [2], "tags": ["copy", "NULL"]},
            {"task": tagged, "args": [3], "tags": ["extra"]},
        ],
        now=now,
    )
    assert created == 3
    keyed = Job.objects.bulk_enqueue(
        [{"task": ADD, "args": [4], "idempotency_key": "x", "tags": ["dedupe"]}], now=now
    )
    assert keyed == 1
    rows = list(Job.objects.order_by("id").values_list("tags", flat=True))
    assert rows == [[], ["copy", "NULL"], ["billing", "nightly", "extra"], ["dedupe"]]


@pytest.mark.django_db
def test_enqueue_many__options_may_carry_tags():
    assert enqueue_many(tagged, [([1], {}), ([2], {}, {"tags": ["customer:9"]})]) == 2
    assert list(Job.objects.order_by("id").values_list("tags", flat=True)) == [
        ["billing", "nightly"],
        ["billing", "nightly", "customer:9"],
    ]


@pytest.mark.django_db
def test_workflows__chain_group_and_dependant_carry_tags():
    jobs = chain(step(ADD, 1, 2), step(tagged), tags=["flow:1"]).enqueue()
    assert [stored(j.pk) for j in jobs] == [["flow:1"], ["billing", "nightly", "flow:1"]]
    assert [j.tags for j in jobs] == [["flow:1"], ["billing", "nightly", "flow:1"]]
    members = group(step(ADD, 1, 2), step(ADD, 3, 4), then=step(tagged), tags=["g"]).enqueue()
    assert [stored(j.pk) for j in members] == [["g"], ["g"], ["billing", "nightly", "g"]]
    child = Job.objects.enqueue(ADD, [5], depends_on=[jobs[0]], tags=["child"])
    assert child.tags == ["child"] and stored(child.pk) == ["child"]
    with pytest.raises(InvalidJob, match="may hold only letters"):
        chain(step(ADD, 1, 2), tags=["bad tag"])


@pytest.mark.django_db
def test_workflows__a_big_group_goes_through_copy_with_tags(settings):
    from django_pgqueue import bulk

    size = bulk.DEFAULT_BATCH_SIZE + 1
    jobs = group(*[step(ADD, i, i) for i in range(size)], tags=["big"]).enqueue()
    assert len(jobs) == size
    assert Job.objects.filter(tags__contains=["big"]).count() == size


def test_validation__tags_keep_order_and_sort_a_set():
    assert validation.tags(("b", "a", "b")) == ["b", "a"]
    assert validation.tags({"b", "a"}) == ["a", "b"]
    assert validation.tags(None) == []


@pytest.mark.django_db
def test_tags__the_gin_index_serves_every_job_with_tag_x_and_the_lease_index_the_running():
    from django.db.models import Q

    from django_pgqueue.admin.search import searched

    Job.objects.bulk_enqueue(
        {"task": ADD, "args": [i], "tags": [f"c:{i % 50}"]} for i in range(2000)
    )
    # Two of tag c:7 running: the search index leaves them out, the lease index has them.
    running = list(Job.objects.filter(tags__contains=["c:7"]).order_by("id")[:2])
    Job.objects.filter(pk__in=[job.pk for job in running]).update(
        status="running", lease_owner="w", lease_expires_at=timezone.now()
    )
    tagged = Job.objects.filter(searched(Q(tags__contains=["c:7"])))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgqueue_job")
        cursor.execute("SET LOCAL enable_seqscan = off")
        plan = tagged.explain()
        cursor.execute(sql.JOB_COUNT_TAG, {"tag": "c:7", "cap": 1000})
        counted = {row[0]: row[2] for row in cursor.fetchall()}
        cursor.execute(f"EXPLAIN {sql.JOB_COUNT_TAG}", {"tag": "c:7", "cap": 1000})
        count_plan = "\n".join(row[0] for row in cursor.fetchall())
    for shown in (plan, count_plan):
        assert "pgqueue_job_tags_search_idx" in shown
        assert "pgqueue_job_lease_idx" in shown
        assert "Seq Scan" not in shown
    assert tagged.count() == 40
    assert tagged.filter(status="running").count() == 2
    assert counted == {"pending": 38, "running": 2}


def status(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = 0
    try:
        call_command("pgqueue_status", *args, stdout=out, stderr=err)
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.django_db
def test_status_tag__counts_the_tagged_jobs_by_status_and_queue():
    for queue in ("mail", "mail", "web"):
        Job.objects.enqueue(ADD, [1], queue=queue, tags=["customer:42"])
    Job.objects.enqueue(ADD, [1], queue="web", tags=["customer:43"])
    code, out, _ = status("--tag", "customer:42")
    assert code == 0
    assert out.splitlines()[0] == "tag customer:42: 3 jobs"
    assert [line.split() for line in out.splitlines()[2:]] == [
        ["mail", "pending", "2"],
        ["web", "pending", "1"],
    ]
    code, out, _ = status("--tag", "customer:42", "--json")
    assert json.loads(out) == {
        "tag": "customer:42",
        "capped": False,
        "jobs": [
            {"status": "pending", "queue": "mail", "jobs": 2},
            {"status": "pending", "queue": "web", "jobs": 1},
        ],
    }
    assert status("--tag", "nobody")[1].strip() == "tag nobody: 0 jobs"


@pytest.mark.django_db
def test_status_tag__a_bad_tag_or_flag_mix_exits_2_naming_it():
    code, _, err = status("--tag", "has space")
    assert code == 2 and "--tag: tag 'has space' may hold only" in err
    code, _, err = status("--tag", "x", "--check")
    assert code == 2 and "--tag goes with neither --check nor --watch" in err


@pytest.mark.django_db
def test_common_tags__small_table_exact_big_table_from_statistics():
    Job.objects.enqueue(ADD, [1], tags=["b", "a"])
    Job.objects.enqueue(ADD, [1], tags=["c"])
    assert monitoring.common_tags("default") == ["a", "b", "c"]

"""A job's tags in the admin: the column of the job list and dead letters, and the
filter ("every job with tag X", through ``pgqueue_job_tags_search_idx``)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils.html import format_html_join

from .. import validation
from ..models import Job
from ..monitoring import common_tags
from .base import admin_database
from .search import searched


class TagFilter(admin.SimpleListFilter):
    """One choice per tag in use (a small table) or per common tag (the planner's
    statistics of a big one: no scan); the tag in the URL is always offered. A value
    that is no valid tag matches nothing rather than raising."""

    title = "tag"
    parameter_name = "tag"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        tags = common_tags(admin_database(request))
        current = self.value()
        if current and current not in tags:
            tags = [current, *tags]
        return [(tag, tag) for tag in tags]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if not value:
            return queryset
        if not validation.TAG_RE.fullmatch(value) or len(value) > validation.MAX_TAG_LENGTH:
            return queryset.none()
        return queryset.filter(searched(Q(tags__contains=[value])))


class TagsColumn:
    """The ``tags_display`` column: each tag a link to the list filtered by it."""

    @admin.display(description="tags")
    def tags_display(self, obj: Job) -> str:
        return format_html_join(
            " ",
            '<a class="pgqueue-tag" href="?tag={}">{}</a>',
            ((tag, tag) for tag in obj.tags or ()),
        )

"""A paginator that never counts a big table.

Django's admin asks its paginator for ``count`` on every list page; on a jobs table with
millions of rows ``SELECT COUNT(*)`` reads the whole table each time. This paginator
asks the planner first (``EXPLAIN``, which plans but runs nothing) and only counts when
the estimate is small, and even then under a ``LIMIT``, so a page costs the same at
ten rows and at ten million.
"""

from __future__ import annotations

import json
import logging
from functools import cached_property
from typing import TYPE_CHECKING, Any, cast

from django.core.paginator import Paginator
from django.db import DatabaseError, transaction

if TYPE_CHECKING:
    from django.db.models import QuerySet

logger = logging.getLogger(__name__)


class EstimatedCountPaginator(Paginator):
    """``count`` is exact up to ``exact_up_to`` rows and a planner estimate above it.

    ``is_estimate`` tells templates to say "about". An estimate can be off (statistics
    are refreshed by autovacuum's ANALYZE); a page past the real end is then empty,
    which the admin handles like any out-of-range page.
    """

    #: Above this many rows an estimate is good enough ("about 12,345 jobs"); below it
    #: operators want the exact number, and counting that many rows is cheap.
    exact_up_to = 1_000

    def __init__(self, object_list: Any, per_page: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(object_list, per_page, *args, **kwargs)
        self.is_estimate = False

    @cached_property
    def count(self) -> int:
        # The admin pages a QuerySet (Paginator's type allows any sequence).
        queryset = cast("QuerySet[Any]", self.object_list).order_by()
        estimate = self.planner_estimate(queryset)
        if estimate is None or estimate <= self.exact_up_to:
            # Bounded count: SELECT COUNT(*) FROM (... LIMIT n+1) reads at most n+1 rows.
            exact = queryset[: self.exact_up_to + 1].count()
            if exact <= self.exact_up_to:
                return exact
            estimate = max(estimate or 0, exact)
        self.is_estimate = True
        return estimate

    @staticmethod
    def planner_estimate(queryset: Any) -> int | None:
        """The planner's row estimate for ``queryset`` (None if it cannot be had)."""
        try:
            # A savepoint: in a transaction (the change list's) a failed EXPLAIN would
            # otherwise abort it, and the count below with it.
            with transaction.atomic(using=queryset.db):
                plan = json.loads(queryset.explain(format="json"))
            return int(plan[0]["Plan"]["Plan Rows"])
        except (DatabaseError, ValueError, KeyError, IndexError, TypeError):
            logger.warning("no row estimate for the admin list; counting", exc_info=True)
            return None

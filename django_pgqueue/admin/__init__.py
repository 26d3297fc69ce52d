"""The admin: every job read-only, dead letters with requeue and discard, the periodic
schedules, the workers, a queue dashboard, and flow control (queues paused and resumed,
limits set at run time), one module each.

Rules the package keeps (docs/admin.md explains them to operators):

* No job is added or edited by hand: no add, no change, so no one can point a job at
  another callable or touch a running job that a worker holds a lease on. (Queues are
  paused and limits set by hand: flow control is the operator's, through the manager.)
* Every state change is one guarded statement of ``sql/`` through the manager
  (``requeue_dead``, ``discard_dead``): a stale page or a second operator changes
  zero rows, and the message says how many rows changed.
* Every action has its own permission (requeue: ``django_pgqueue.requeue_job``;
  discard: the dead letter's delete permission), is POST only and CSRF-protected
  (Django's admin), and is logged with the user's name.
* Job data is shown through ``format_html`` or plain strings only, so it is escaped.
* List pages stay fast on millions of rows: no ``COUNT(*)`` (estimate paginator),
  sorting only by indexed ``id``, filter choices from planner statistics, no facets.

Django's autodiscovery imports this package; importing the modules below registers
their pages. Imports only look down: each page module imports ``base`` (and the shared
``filters``, ``read_only_jobs``), never another page.
"""

from . import dashboard, database_schedules, dead_letters, flow, jobs, schedules, workers

__all__ = [
    "dashboard",
    "database_schedules",
    "dead_letters",
    "flow",
    "jobs",
    "schedules",
    "workers",
]

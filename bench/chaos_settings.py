"""Settings of the chaos suite's processes: the test project's, with short retry backoff.

Retries after a PostgreSQL restart should come back within the run, not after the
default exponential backoff, and ordinary jobs get more attempts than the kills may
charge them (poison pills keep their own ``max_attempts=3``). A third of the jobs have
a concurrency key ``chaos:0`` .. ``chaos:7``, each limited to ``oracle.KEY_CONCURRENCY``
running at once: the oracle samples that no key ever runs more (``over_limit``).
"""

import os

from testkit.oracle import KEY_CONCURRENCY, KEY_PREFIX
from testproject import settings as _base

globals().update({name: getattr(_base, name) for name in dir(_base) if name.isupper()})

PGQUEUE_RETRY_BACKOFF_BASE = 0.2
PGQUEUE_RETRY_BACKOFF_MAX = 2.0
PGQUEUE_MAX_ATTEMPTS = 12

# The run's flow control: every chaos:N key is a budget of its own (testkit/oracle.py).
PGQUEUE_LIMITS = {f"{KEY_PREFIX}*": {"concurrency": KEY_CONCURRENCY}}

# The planted fault "hoard" (bench.chaos --plant hoard only): the old claim sizing,
# planted once the apps are ready (bench/chaos_hoard.py).
if os.environ.get("PGQUEUE_CHAOS_PLANT_HOARD"):
    INSTALLED_APPS = [*INSTALLED_APPS, "bench.chaos_hoard.HoardPlant"]  # noqa: F821

"""Settings of the chaos suite's processes: the test project's, with short retry backoff.

Retries after a PostgreSQL restart should come back within the run, not after the
default exponential backoff, and ordinary jobs get more attempts than the kills may
charge them (poison pills keep their own ``max_attempts=3``).
"""

from testproject import settings as _base

globals().update({name: getattr(_base, name) for name in dir(_base) if name.isupper()})

PGQUEUE_RETRY_BACKOFF_BASE = 0.2
PGQUEUE_RETRY_BACKOFF_MAX = 2.0
PGQUEUE_MAX_ATTEMPTS = 12

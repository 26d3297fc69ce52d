"""Settings of ``bench.compare``'s "stock" configuration: the test project's, with the
logging most projects have, a console handler on the root logger at INFO and nothing
else (Django's own defaults below it), and ``DEBUG`` from the environment as in the
test project. The worker runs at its default verbosity with its output in a file.
"""

from testproject import settings as _base

globals().update({name: getattr(_base, name) for name in dir(_base) if name.isupper()})

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": "INFO"},
}

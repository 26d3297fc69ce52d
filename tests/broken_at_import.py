"""A task module that raises SystemExit when imported (a broken deploy): the worker must
record the error on the job and keep its runner thread."""

raise SystemExit("broken at import")

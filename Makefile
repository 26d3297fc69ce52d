# Every developer command, from a fresh clone: `make` lists them. Each creates .venv/ (a
# Python >= 3.12, the newest Django) on first use and again when pyproject.toml changes
# (scripts/dev.sh). With no DATABASE_URL an embedded PostgreSQL is started in .pgdata/
# and keeps running after the command, for the next one: `make stop` stops it.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-print-directory

#: Passed on to the command: pytest options for test and matrix, options of the bench.
ARGS ?=
#: The bench module to run: make bench NAME=throughput (bench/throughput.py).
NAME ?=
#: make setup MATRIX=1 also creates the Django 5.2 and 6.0 venvs of make matrix.
MATRIX ?=
DEV := bash scripts/dev.sh
PY := .venv/bin/python
# Not benches: the package, their shared helpers, the chaos runs' settings, bench.compare's PgQueuer side.
BENCHES := $(filter-out __init__ common chaos_settings stock_settings pgqueuer_side,$(basename $(notdir $(wildcard bench/*.py))))

.PHONY: help setup demo test lint sql docs dist matrix bench stop ci

help: ## list these commands (the default)
	@echo "make TARGET [ARGS='...'], from a fresh clone:"
	@awk -F':.*## ' '/^[a-z]+:.*## / {printf "  %-7s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo "DATABASE_URL=postgres://... uses that server instead of the embedded one."

setup: ## create .venv with the app (editable) and the dev group; again when pyproject.toml changes; MATRIX=1: the matrix venvs too
	@$(DEV) setup
	@if [ -n "$(MATRIX)" ]; then $(DEV) matrix-setup; fi

demo: setup ## the main job: enqueue 3,000 jobs, run 3 workers + a sweeper, SIGKILL one, all finish
	@$(PY) testproject/manage.py demo $(ARGS)

test: setup ## the test suite (pytest) on real PostgreSQL, in three runs side by side; ARGS='-m "not slow"' passes pytest options
	@$(DEV) test $(ARGS)

# mypy's Django plugin loads the settings, and so does Sphinx's autodoc: a placeholder
# URL keeps them from starting the embedded server (nothing connects).
lint: setup ## ruff check, ruff format --check, mypy, makemigrations --check, make sql --check
	@.venv/bin/ruff check .
	@.venv/bin/ruff format --check .
	@DATABASE_URL=$${DATABASE_URL:-postgres://localhost/mypy} .venv/bin/mypy
	@$(PY) testproject/manage.py makemigrations --check --dry-run
	@$(PY) scripts/render_sql.py --check

sql: setup ## write django_pgqueue/sql/rendered.sql and the docs' state diagram from the SQL modules
	@$(PY) scripts/render_sql.py

docs: setup ## build the documentation site into docs/_build/html (warnings are errors)
	@DATABASE_URL=$${DATABASE_URL:-postgres://localhost/docs} \
	  $(PY) -m sphinx -W --keep-going -q -b html docs docs/_build/html $(ARGS)
	@echo "[dev] docs built: docs/_build/html/index.html" >&2

dist: ## build and check the sdist and wheel, install the wheel into fresh venvs
	@$(DEV) dist

matrix: ## the fast tests on Django 5.2 + django-tasks and on Django 6.0 (.venv-dj52, .venv-dj60)
	@$(DEV) matrix $(ARGS)

bench: setup ## run bench/NAME.py: make bench NAME=throughput ARGS='--jobs 1000'
	@if [ "$(words $(NAME))" != 1 ] || [ "$(filter $(NAME),$(BENCHES))" != "$(NAME)" ]; then \
	  echo "[dev] no bench named '$(NAME)': make bench NAME=<$(subst $() ,|,$(BENCHES))> [ARGS='...']" >&2; \
	  exit 2; \
	fi
	@$(PY) -m bench.$(NAME) $(ARGS)

stop: ## stop the embedded PostgreSQL that demo and test leave running in .pgdata/
	@if [ -x $(PY) ]; then $(PY) testproject/pgserver.py stop; \
	else echo "[dev] no .venv: nothing was started" >&2; fi

# .ci/run calls make for each step: without this make's flags and variables (ARGS=...).
ci: ## what CI runs on a clean clone (.ci/run): setup, lint, docs, dist, test, matrix
	@env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL bash .ci/run

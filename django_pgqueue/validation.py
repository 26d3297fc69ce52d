"""Checks an enqueue runs before anything is written.

Each check raises :class:`~django_pgqueue.exceptions.InvalidJob` with a message that
names the bad value, so a rejected enqueue leaves no row and says why.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.conf import settings as django_settings
from django.utils.module_loading import import_string

from .bounds import MIN_RESULT_BYTES
from .conf import settings
from .databases import QueueBackend
from .exceptions import InvalidJob, InvalidResult
from .taskapi import FRAMEWORK, TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, Task, normalize_json

QUEUE_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MAX_KEY_LENGTH = 255
#: Longest concurrency key (the column's length).
MAX_CONCURRENCY_KEY_LENGTH = 255
#: What starts a queue limit's key (``"queue:emails"``): no concurrency key may.
QUEUE_LIMIT_PREFIX = "queue:"
#: Most tags one job may carry, and the longest tag: a job's tags are labels to find it
#: by (``tags=["customer:42"]``), not a payload.
MAX_TAGS = 16
MAX_TAG_LENGTH = 64
#: A tag's characters: letters, digits and ``_ . : / @ = + -``, starting with a letter or
#: a digit (no spaces, commas, quotes or braces, which the admin's filter and search and
#: PostgreSQL's array text would have to escape).
TAG_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/@=+-]*")
#: Largest value of an ``integer`` column (max_attempts).
MAX_INT4 = 2**31 - 1
#: Longest ``backend`` alias the column holds.
MAX_BACKEND_LENGTH = 64
#: Most digits an integer in a payload may have when Python itself sets no limit
#: (``sys.set_int_max_str_digits(0)``): jsonb stores numbers as ``numeric``, which
#: holds at most 131072 digits before the decimal point.
MAX_NUMERIC_DIGITS = 131072
#: Integers up to this many bits (at most 1205 digits) are under every digit limit.
_SMALL_INT_BITS = 4000


def show(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for an error message. Never raises:
    the repr of an int beyond Python's int-to-str digit limit (``10**5000``) raises
    ValueError, which would replace the clear error with a confusing one."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value.bit_length() > _SMALL_INT_BITS and _int_digits(value) is None:
            return f"an int of {value.bit_length()} bits"
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not hide the real error
        text = f"<{type(value).__name__} object>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _int_digits(value: int) -> int | None:
    """Decimal digits of ``value``, or None if Python refuses to write it as text."""
    try:
        return len(str(abs(value)))
    except ValueError:
        return None


def _int_digit_limit() -> int:
    """Most digits a payload integer may have: Python's int-to-str limit, and jsonb's."""
    python = sys.get_int_max_str_digits()
    return min(python, MAX_NUMERIC_DIGITS) if python else MAX_NUMERIC_DIGITS


def _check_int(value: int, path: str) -> None:
    if value.bit_length() <= _SMALL_INT_BITS:
        return
    limit = _int_digit_limit()
    digits = _int_digits(value)
    if digits is None or digits > limit:
        raise InvalidJob(
            f"{path} is an int of more than {limit} digits: too large to store as JSON "
            "(pass it as a str)"
        )


def task_path(task: Any) -> str:
    """Return the dotted path of a Django ``Task`` given as an object or a path (see
    :func:`task_object`)."""
    return task_object(task).module_path


def task_object(task: Any) -> Task:
    """The Django ``Task`` given as an object or a dotted path, as a worker will load it.

    A path must import to a ``Task`` now, so a typo fails at enqueue, not in a worker.
    So must a ``Task``'s own path, which is how a worker loads it: a Task assigned to
    another name than its function's (``job = task()(_job)``) would never run.
    """
    path = task.module_path if isinstance(task, Task) else task
    if isinstance(path, str):
        try:
            obj = import_string(path)
        except ImportError as exc:
            raise InvalidJob(f"task {path!r} does not import: {exc}") from exc
        if not isinstance(obj, Task):
            raise InvalidJob(
                f"task {path!r} is a {type(obj).__name__}, not a {FRAMEWORK}.Task "
                "(decorate the function with @task)"
            )
        return task if isinstance(task, Task) else obj
    raise InvalidJob(
        f"task must be a {FRAMEWORK}.Task or its dotted path, not {type(task).__name__}"
    )


def queue_name(queue: Any) -> str:
    if not isinstance(queue, str) or not QUEUE_NAME_RE.fullmatch(queue):
        raise InvalidJob(f"queue name {show(queue)} is invalid: use 1 to 64 of A-Z a-z 0-9 _ . -")
    return queue


def priority(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidJob(f"priority must be an int, not {show(value)}")
    if not TASK_MIN_PRIORITY <= value <= TASK_MAX_PRIORITY:
        raise InvalidJob(
            f"priority {show(value)} is out of range {TASK_MIN_PRIORITY}..{TASK_MAX_PRIORITY}"
        )
    return value


def max_attempts(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidJob(f"max_attempts must be an int >= 1, not {show(value)}")
    if value > MAX_INT4:
        raise InvalidJob(f"max_attempts {show(value)} is over the largest allowed, {MAX_INT4}")
    return value


def run_at(value: Any) -> dt.datetime | None:
    if value is None:
        return None
    if not isinstance(value, dt.datetime):
        raise InvalidJob(f"run_at must be a datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
        raise InvalidJob(f"run_at {value.isoformat()} is naive: give it a timezone")
    return value


def backend_alias(value: Any) -> str:
    """A ``TASKS`` alias whose ``BACKEND`` is a ``PgQueueBackend``: the alias a job's
    ``TaskResult`` is read back through, so an unknown one is refused at enqueue."""
    if not isinstance(value, str):
        raise InvalidJob(
            f"backend must be a str naming a TASKS alias, not {type(value).__name__} {show(value)}"
        )
    if not 1 <= len(value) <= MAX_BACKEND_LENGTH:
        raise InvalidJob(
            f"backend {show(value)} is {len(value)} characters: a TASKS alias of 1 to "
            f"{MAX_BACKEND_LENGTH} characters is needed"
        )
    if "\x00" in value:
        raise InvalidJob("backend contains a NUL character (\\u0000)")
    _check_unicode(value, "backend")
    tasks = getattr(django_settings, "TASKS", None) or {}
    config = tasks.get(value)
    if not isinstance(config, dict):
        configured = ", ".join(sorted(map(repr, tasks))) or "none"
        raise InvalidJob(
            f"backend {value!r} is not an alias in settings.TASKS (configured: {configured})"
        )
    path = config.get("BACKEND")
    if not isinstance(path, str) or not is_pgqueue_backend(path):
        raise InvalidJob(
            f"backend {value!r} is {show(path)} in settings.TASKS, not "
            "django_pgqueue.backend.PgQueueBackend: its jobs could not be read back"
        )
    return value


@functools.lru_cache(maxsize=64)
def is_pgqueue_backend(path: str) -> bool:
    """Whether a ``TASKS[...]["BACKEND"]`` path imports to a ``PgQueueBackend``."""
    try:
        cls = import_string(path)
    except ImportError:
        return False
    return isinstance(cls, type) and issubclass(cls, QueueBackend)


def idempotency_key(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_KEY_LENGTH:
        raise InvalidJob(
            f"idempotency_key must be a non-empty str of at most {MAX_KEY_LENGTH} "
            f"characters, not {show(value)}"
        )
    if "\x00" in value:
        raise InvalidJob("idempotency_key contains a NUL character (\\u0000)")
    _check_unicode(value, "idempotency_key")
    return value


#: The longest time limit accepted (30 days, as PGQUEUE_JOB_TIMEOUT_SECONDS).
MAX_TIME_LIMIT = 30 * 86400.0


def time_limit(value: Any, name: str) -> float | None:
    """A job's time limit in seconds, checked (None: none): a finite number from 0.1
    to 30 days."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0.1 <= value <= MAX_TIME_LIMIT
    ):
        raise InvalidJob(
            f"{name} must be a number of seconds from 0.1 to {MAX_TIME_LIMIT:g}, not {show(value)}"
        )
    return float(value)


def concurrency_key(value: Any, *, source: str = "concurrency_key") -> str:
    """A job's concurrency key, checked ("" for None: no key). ``source`` names where it
    came from in the error (the argument, or the callable that made it)."""
    if value is None:
        return ""
    if not isinstance(value, str) or not value or len(value) > MAX_CONCURRENCY_KEY_LENGTH:
        raise InvalidJob(
            f"{source} must be a non-empty str of at most {MAX_CONCURRENCY_KEY_LENGTH} "
            f"characters, not {show(value)}"
        )
    if value.startswith(QUEUE_LIMIT_PREFIX):
        raise InvalidJob(
            f"{source} {show(value)} starts with {QUEUE_LIMIT_PREFIX!r}, which names a "
            "queue's limit in PGQUEUE_LIMITS: choose another key"
        )
    if value.endswith("*"):
        raise InvalidJob(
            f"{source} {show(value)} ends with '*', which in PGQUEUE_LIMITS means every key "
            "with that prefix: choose another key"
        )
    if "\x00" in value:
        raise InvalidJob(f"{source} contains a NUL character (\\u0000)")
    _check_unicode(value, source)
    return value


def tag(value: Any, *, source: str = "tags") -> str:
    """One tag, checked: a str of 1 to ``MAX_TAG_LENGTH`` characters of ``TAG_RE``;
    ``InvalidJob`` naming ``source`` and the tag otherwise."""
    if not isinstance(value, str) or not value or len(value) > MAX_TAG_LENGTH:
        raise InvalidJob(
            f"{source}: each tag must be a non-empty str of at most {MAX_TAG_LENGTH} "
            f"characters, not {show(value)}"
        )
    if not TAG_RE.fullmatch(value):
        raise InvalidJob(
            f"{source}: tag {show(value)} may hold only letters, digits and _ . : / @ = + - "
            "(starting with a letter or a digit)"
        )
    return value


def tags(value: Any, *, source: str = "tags") -> list[str]:
    """A job's tags, checked: a list (or tuple, set) of at most ``MAX_TAGS`` tags
    (:func:`tag`), in the order given, repeats dropped; None is no tag. A bare str is
    refused (it would be taken as a list of characters)."""
    if value is None:
        return []
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple | set | frozenset):
        raise InvalidJob(f"{source} must be a list of str, not {show(value)}")
    items = [tag(item, source=source) for item in value]
    checked = list(dict.fromkeys(sorted(items) if isinstance(value, set | frozenset) else items))
    if len(checked) > MAX_TAGS:
        raise InvalidJob(f"{source}: at most {MAX_TAGS} tags per job, not {len(checked)}")
    return checked


def merged_tags(own: Sequence[str], given: Sequence[str]) -> list[str]:
    """A task's tags then the call's, repeats dropped, within ``MAX_TAGS``."""
    merged = list(dict.fromkeys([*own, *given]))
    if len(merged) > MAX_TAGS:
        raise InvalidJob(
            f"tags: at most {MAX_TAGS} tags per job, not {len(merged)} (the task's and "
            "the call's together)"
        )
    return merged


def _check_unicode(text: str, path: str) -> None:
    """Refuse lone surrogates: json writes them as ``\\udXXX`` escapes, which jsonb
    rejects with a DataError (aborting the caller's transaction) instead of a clear error."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidJob(
                f"{path} contains a lone surrogate {text[exc.start]!r}: not valid Unicode"
            ) from None


def storable_text(text: str) -> str:
    """``text`` with what jsonb cannot store (NUL, lone surrogates) backslash-escaped.
    For text we must keep whatever it holds, such as an error's traceback."""
    text = text.replace("\x00", "\\x00")
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


#: Deepest nesting a payload or a result may have; deeper (or cyclic) ones are refused.
MAX_DEPTH = 500


def _maybe_deep(text: str) -> bool:
    """Whether JSON ``text`` could be nested more than ``MAX_DEPTH`` levels: only with
    more opening brackets than that (brackets inside strings only add to the count),
    so short text never is and needs no walk."""
    return len(text) > 2 * MAX_DEPTH and text.count("[") + text.count("{") > MAX_DEPTH


def _check_json(value: Any, where: str) -> None:
    """Walk a payload: only JSON types, str keys, finite floats, no NUL characters
    (PostgreSQL's jsonb rejects \\u0000; the stdlib would write NaN as bare ``NaN``)."""
    stack: list[tuple[Any, str, int]] = [(value, where, 0)]
    while stack:
        item, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            # Also ends the walk of a payload that contains itself (a cycle).
            raise InvalidJob(
                f"{where} is nested more than {MAX_DEPTH} levels deep, or contains itself"
            )
        if item is None or isinstance(item, bool):
            continue
        if isinstance(item, int):
            _check_int(item, path)
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise InvalidJob(f"{path} is {item!r}: JSON has no NaN or Infinity")
        elif isinstance(item, str):
            if "\x00" in item:
                raise InvalidJob(f"{path} contains a NUL character (\\u0000)")
            _check_unicode(item, path)
        elif isinstance(item, list | tuple):
            stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(item))
        elif isinstance(item, dict):
            for key, v in item.items():
                if not isinstance(key, str):
                    raise InvalidJob(
                        f"{path} has a non-string key {show(key)}: JSON keys are strings"
                    )
                if "\x00" in key:
                    raise InvalidJob(f"{path} has a key with a NUL character")
                _check_unicode(key, f"{path} key {key!r}")
                stack.append((v, f"{path}[{key!r}]", depth + 1))
        else:
            raise InvalidJob(f"{path} is a {type(item).__name__}, which is not JSON-serialisable")


#: Compact, ASCII-only (so len() is the byte size), NaN refused. Built once: json.dumps
#: with options builds a new encoder on every call, which bulk enqueue would feel.
_ENCODE = json.JSONEncoder(allow_nan=False, separators=(",", ":")).encode


def _make_fast_encode() -> Callable[[Any], str]:
    """``_ENCODE`` without its per-call setup: the stdlib's C encoder, built once.

    ``JSONEncoder.encode`` builds a new C encoder on every call, which costs three
    quarters of its time on a small payload. Built without circular-reference markers
    (a shared markers dict could keep stale entries after an error), so a cycle raises
    RecursionError. Falls back to ``_ENCODE`` unless it gives identical text."""
    try:
        from _json import encode_basestring_ascii
        from _json import make_encoder as c_make_encoder

        chunks = c_make_encoder(
            None, json.JSONEncoder().default, encode_basestring_ascii, None,
            ":", ",", False, False, False,
        )  # fmt: skip

        def encode(value: Any) -> str:
            return "".join(chunks(value, 0))

        sample = [1, -2.5, '\u00e9\x01"', True, None, {"k": [{}, []]}, (3,)]
        if encode(sample) == _ENCODE(sample):
            return encode
    except Exception:  # noqa: S110 - no C accelerator: the plain encoder works
        pass
    return _ENCODE


_FAST_ENCODE = _make_fast_encode()


def _to_json(value: list[Any] | tuple[Any, ...] | dict[str, Any], where: str) -> str:
    """JSON text of a payload part, checked as strictly as ``_check_json`` demands.

    Fast path: the C encoder already refuses non-JSON types and NaN/Infinity. What it
    lets through are non-string keys (it converts them) and NUL characters (it writes
    ``\\u0000``, which jsonb refuses). Text without ``\\u0000`` whose only ``{`` is
    a top-level dict with str keys can hide neither; anything else is walked, so the
    error message is always ``_check_json``'s."""
    try:
        text = _FAST_ENCODE(value)
    except (TypeError, ValueError, RecursionError):
        pass
    else:
        # Lone surrogates are written as \\udXXX escapes: walk those too (pairs pass);
        # and text that may be nested too deep (the encoder allows about 1,500 levels).
        if ("\\u" not in text or ("\\u0000" not in text and "\\ud" not in text)) and not (
            _maybe_deep(text)
        ):
            braces = text.count("{")
            if braces == 0:
                return text
            if braces == 1 and type(value) is dict:
                for key in value:
                    if type(key) is not str:
                        break
                else:
                    return text
    _check_json(value, where)
    return _ENCODE(value)


def returned(value: Any) -> tuple[Any, str]:
    """A task's return value as Django's ``TaskResult`` keeps it (``normalize_json``)
    and its JSON text for the result column (see :func:`result_json`). Raises
    :class:`InvalidResult` saying what is wrong and where in the value. None, a bool
    and an int of at most 15 digits (most tasks' values) are what they are."""
    if value is None:
        return None, "null"
    kind = type(value)
    if kind is bool:
        return value, "true" if value else "false"
    if kind is int and -SMALL_INT < value < SMALL_INT:
        return value, str(value)
    try:
        normal = normalize_json(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise invalid_result(value, exc) from None
    return normal, result_json(normal)


#: Ints below this (in size) are their own JSON text, whatever the digit limits.
SMALL_INT = 10**15


def result_json(
    value: Any, *, max_bytes: int | None = None, what: str = "the task's return value"
) -> str:
    """JSON text of a task's return value (already ``normalize_json``-ed: keys become
    strings as ``json`` makes them), checked against what jsonb stores: JSON types,
    finite floats, at most ``MAX_DEPTH`` levels, no NUL or lone surrogate, integers
    within numeric's digits, at most ``max_bytes`` (``PGQUEUE_MAX_RESULT_BYTES``, whose
    bound keeps strings and containers under jsonb's own limits). Raises
    :class:`InvalidResult` naming the problem, so the worker fails the job with that
    reason instead of its completion hitting a database error. A small value is
    encoded once and looked at no further. ``what`` names the value in the errors (the
    progress of ``set_progress`` is checked alike)."""
    try:
        text = _FAST_ENCODE(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise invalid_result(value, exc, what) from None
    limit = max_bytes
    if limit is None:
        # No setting may be below MIN_RESULT_BYTES, so shorter text needs no settings
        # lookup, which costs several times the encoding of a small value.
        limit = settings.MAX_RESULT_BYTES if len(text) > MIN_RESULT_BYTES else MIN_RESULT_BYTES
    if len(text) > limit:
        raise InvalidResult(
            f"the task's return value is {len(text)} bytes as JSON, over the limit of "
            f"{limit} (PGQUEUE_MAX_RESULT_BYTES): store large results elsewhere and "
            "return a key"
        )
    if (
        ("\\u" in text and ("\\u0000" in text or "\\ud" in text))
        or _maybe_deep(text)
        or (len(text) > MAX_NUMERIC_DIGITS and _int_digit_limit() == MAX_NUMERIC_DIGITS)
    ):
        try:
            _check_json(json.loads(text), what.removeprefix("the task's "))
        except InvalidJob as exc:
            raise InvalidResult(f"{what} cannot be stored: {exc}") from None
    return text


def invalid_result(
    value: Any, error: BaseException, what: str = "the task's return value"
) -> InvalidResult:
    """The error of a return value that ``normalize_json`` or the JSON encoder refused
    (``error``): what is wrong and where in ``value``."""
    problem = _result_problem(value, what.removeprefix("the task's "))
    if problem is None:  # not found by the walk: say what the encoder said
        return InvalidResult(
            f"{what} must be JSON-serialisable: {type(error).__name__}: {str(error)[:200]}"
        )
    return InvalidResult(f"{what} must be JSON-serialisable: {problem}")


def _type_name(value: Any) -> str:
    cls = type(value)
    name = cls.__qualname__
    return name if cls.__module__ == "builtins" else f"{cls.__module__}.{name}"


def _result_problem(value: Any, root: str = "return value") -> str | None:
    """Where and why a return value is not JSON by ``normalize_json``'s rules (mappings,
    sequences, UTF-8 bytes, str, int, float, bool, None) and the encoder's (keys of
    those scalar types, finite floats, ints within the digit limit). Walked with a
    stack, never recursion, so a value nested too deep (or containing itself) is
    named instead of overflowing."""
    stack: list[tuple[Any, str, int]] = [(value, root, 0)]
    while stack:
        item, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"{path} is nested more than {MAX_DEPTH} levels deep, or contains itself"
        if item is None or isinstance(item, str | bool):
            continue
        if isinstance(item, int):
            try:
                _check_int(item, path)
            except InvalidJob as exc:
                return str(exc)
        elif isinstance(item, float):
            if not math.isfinite(item):
                return f"{path} is {item!r}: JSON has no NaN or Infinity"
        elif isinstance(item, bytes):
            try:
                item.decode("utf-8")
            except UnicodeDecodeError:
                return f"{path} is bytes that are not UTF-8 text"
        elif isinstance(item, Mapping):
            for key, v in item.items():
                if not (key is None or isinstance(key, str | int | float | bytes)):
                    return (
                        f"{path} has a key {show(key)} of type {_type_name(key)}: JSON keys "
                        "are strings"
                    )
                stack.append((v, f"{path}[{show(key, 40)}]", depth + 1))
        elif isinstance(item, Sequence):
            stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(item))
        else:
            return f"{path} is of type {_type_name(item)}, which JSON cannot hold"
    return None


def payload(args: Any, kwargs: Any, *, max_bytes: int) -> tuple[str, str]:
    """Validate args and kwargs; return them as JSON text ready for ``::jsonb``."""
    # type() first: the common case skips the slower isinstance() of a union.
    if type(args) is not list and not isinstance(args, list | tuple):
        raise InvalidJob(f"args must be a list or tuple, not {type(args).__name__}")
    if kwargs is not None and type(kwargs) is not dict and not isinstance(kwargs, dict):
        raise InvalidJob(f"kwargs must be a dict, not {type(kwargs).__name__}")
    # (A tuple, or a list or tuple subclass, is written as a JSON array.)
    args_json = _to_json(args, "args") if args else "[]"
    kwargs_json = _to_json(kwargs, "kwargs") if kwargs else "{}"
    size = len(args_json) + len(kwargs_json)  # ASCII-only text: characters are bytes
    if size > max_bytes:
        raise InvalidJob(
            f"payload is {size} bytes, over the limit of {max_bytes} "
            "(PGQUEUE_MAX_PAYLOAD_BYTES): store large data elsewhere and pass a key"
        )
    return args_json, kwargs_json

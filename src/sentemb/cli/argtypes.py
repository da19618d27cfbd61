"""Argument types of the command line: a size, count or seed out of its range is refused by argparse
naming the option (``argument --chunk-size: 0 is not a positive integer``), before any work and
before any output is opened, instead of a traceback, an empty output or a silent no-op later."""

from __future__ import annotations

import argparse

from ..config.settings import SEED_MAX  # the config's seeds have the same range


def _integer(value: str | int) -> int:
    """The command line's text, or a ``--spec`` file's JSON value (an int; not a bool, not 8.5)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    raise argparse.ArgumentTypeError(f"{value!r} is not an integer")


def _ranged(name: str, low: int, high: int | None, words: str, doc: str):
    """An argument type taking integers from ``low`` to ``high`` (None: no bound), refusing others with
    ``words`` (``{n}``: the value given)."""
    def check(value: str | int) -> int:
        n = _integer(value)
        if n < low or (high is not None and n > high):
            raise argparse.ArgumentTypeError(words.format(n=n))
        return n

    check.__name__, check.__doc__ = name, doc
    return check


positive_int = _ranged("positive_int", 1, None, "{n} is not a positive integer", "A size or count: 1 or more.")
fold_count = _ranged("fold_count", 2, None, "{n} folds: k-fold needs at least 2",
                     "The k of k-fold cross-validation: 2 or more (one fold leaves nothing to validate on).")
non_negative_int = _ranged("non_negative_int", 0, None, "{n} is negative",
                           "An index or a number of warm-up steps: 0 or more.")
seed_int = _ranged("seed_int", 0, SEED_MAX, f"{{n}} is not a seed (0 to {SEED_MAX})",
                   "A random seed: 0 to 2**32 - 1 (numpy's and torch's range).")
port_int = _ranged("port_int", 1, 65535, "{n} is not a TCP port (1 to 65535)", "A TCP port: 1 to 65535.")


def _real(value: str | float) -> float:
    """A finite number from the command line's text (or a JSON number): not nan, not inf."""
    import math

    try:
        x = float(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        x = None
    if x is None or not math.isfinite(x):
        raise argparse.ArgumentTypeError(f"{value!r} is not a finite number")
    return x


def positive_float(value: str | float) -> float:
    """A rate, a peak or a radius: a finite number above 0."""
    x = _real(value)
    if x <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not above 0")
    return x


def non_negative_float(value: str | float) -> float:
    """A tolerance: a finite number, 0 or more."""
    x = _real(value)
    if x < 0:
        raise argparse.ArgumentTypeError(f"{value!r} is negative")
    return x


def share(value: str | float) -> float:
    """A share of a whole (a model-FLOPs utilisation): above 0, at most 1."""
    x = _real(value)
    if not 0 < x <= 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a share (above 0, at most 1)")
    return x


def non_empty(value: str) -> str:
    """A name (an MLflow experiment): not empty, not only spaces."""
    if not value.strip():
        raise argparse.ArgumentTypeError(f"{value!r} is empty")
    return value


def key_value(value: str) -> tuple[str, str]:
    """``KEY=VALUE`` (a tag, an input, run metadata) as a pair; the value may hold '=' itself."""
    key, sep, val = value.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{value!r} is not KEY=VALUE")
    return key.strip(), val


def run_meta(value: str) -> tuple[str, str | int]:
    """A ``--run-meta`` pair for the tables (name, method, backbone, seed): ``seed`` must be a seed."""
    key, val = key_value(value)
    return (key, seed_int(val)) if key == "seed" else (key, val)

"""Argument types of the command line: a size, count or seed out of its range is refused by argparse
naming the option (``argument --chunk-size: 0 is not a positive integer``), before any work and
before any output is opened, instead of a traceback, an empty output or a silent no-op later."""

from __future__ import annotations

import argparse

#: numpy's and torch's seeds are unsigned 32-bit integers
SEED_MAX = 2**32 - 1


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


def positive_int(value: str) -> int:
    """A size or count: 1 or more."""
    n = _integer(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is not a positive integer")
    return n


def fold_count(value: str) -> int:
    """The k of k-fold cross-validation: 2 or more (one fold leaves nothing to validate on)."""
    n = _integer(value)
    if n < 2:
        raise argparse.ArgumentTypeError(f"{n} folds: k-fold needs at least 2")
    return n


def non_negative_int(value: str) -> int:
    """An index or a number of warm-up steps: 0 or more."""
    n = _integer(value)
    if n < 0:
        raise argparse.ArgumentTypeError(f"{n} is negative")
    return n


def seed_int(value: str) -> int:
    """A random seed: 0 to 2**32 - 1 (numpy's and torch's range)."""
    n = _integer(value)
    if not 0 <= n <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"{n} is not a seed (0 to {SEED_MAX})")
    return n


def port_int(value: str) -> int:
    """A TCP port: 1 to 65535."""
    n = _integer(value)
    if not 1 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"{n} is not a TCP port (1 to 65535)")
    return n


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

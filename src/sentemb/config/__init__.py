"""The configuration: typed settings declared once, loaded and validated into one tree.

* :mod:`.fields` — ``arg()``: a setting's default, type, allowed values and meaning, declared once.
* :mod:`.settings` — every section as a typed class (``Config``) and the weight fingerprint.
* :mod:`.load` — YAML in, defaults filled, errors naming the key; the job enumeration
  (``jobs``, ``tested``, ``transfer_runs``, ``baselines``) and each job's resolved spec.
* :mod:`.studies` — a study block expanded into runs.
* :mod:`.paths` — where every file of the pipeline lives.
* :mod:`.reference` — ``sentemb config-keys``: the keys as markdown (``config/README.md``).

The public names (``from sentemb.config import load_config, jobs, Config``) are looked up when first
used, so that a method module can import :mod:`.fields` without loading the validation, which
imports every method.
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    **dict.fromkeys(("load_config", "validate_config", "load_schema", "jobs", "tested", "transfer_runs",
                     "baselines", "baseline_transfer", "eval_spec", "resolve_run", "find_run", "Job"), "load"),
    **dict.fromkeys(("Config", "fingerprint"), "settings"),
}


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])

"""``sentemb plan-check``: ``sentemb plan``'s step estimate against steps measured on a GPU (issue 37:
the plan "within 25 % of the measured step on every row gpu-check measures").

A measured row (``Measured``) names a step as the loop ran it: the method, the model (a backbone of
the configuration), the batch, ``max_len``, the train settings over the benchmark's
(``sentemb.ops.benchmark._bench_run``: seed 0, no dev evaluation), the method's arguments, the
optimizer steps timed and the milliseconds per step. ``sentemb gpu-check --rows-json FILE`` writes the
rows it measures in this form; ``docs/gpu/*.rows.json`` hold the rows of earlier lends, transcribed
from their tables.

Each row is priced as ``sentemb plan`` prices a training job (``plan.width_profile``,
``plan.job_measures``, ``plan.step_time``), on the lengths of the corpus it was measured on, its width
profile cut to the very steps that were timed: the loop's batch schedule of seed 0 on those lines
(``width_profile(steps=...)``), so that a length-sampled ArcCSE row is priced at the widths and
triplets its timed steps had, not at an epoch's mean.

A row is ``steady`` when its timed steps measure what the plan prices: steps after the warm-up, every
shape met before (no capture, no compilation, no first kernel plan of a width). A first-steps row
whose window met a new shape is reported, and left out of the verdict.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .. import SentembError

log = logging.getLogger(__name__)

#: the target: |plan − measured| ≤ this × measured (issue 37)
TOLERANCE = 0.25
#: the corpus name the checked rows' lengths are read under (no token cache or prepared corpus has it)
CHECK_CORPUS = "sentemb-plan-check"


@dataclass
class Measured:
    """One measured step (see the module docstring). ``steps``: the optimizer steps timed, [a, b);
    ``only_steps``: where ``ms`` is the mean of some of them only (a first-steps row's steps that met
    no new shape), those."""

    what: str
    method: str
    model: str
    batch: int
    max_len: int
    ms: float
    steps: tuple[int, int]
    train: dict = field(default_factory=dict)
    method_args: dict = field(default_factory=dict)
    precision: str = "bf16"
    steady: bool = True
    note: str = ""
    only_steps: list | None = None
    #: of ``ms``, building the batches in line (``prefetch: false``); the plan prices the step without it
    build_ms: float | None = None
    #: ``train``: an optimizer step; ``dev_eval``: one STS-B dev evaluation of the model (``ms`` per
    #: evaluation, ``batch`` the evaluation's, ``precision`` its ``train.eval_precision``), against the
    #: plan's ``DEV_EVAL_SECONDS`` scaled to the encoder
    kind: str = "train"

    def step_ms(self) -> float:
        """What the plan's step is compared with: ``ms`` less the in-line batch building."""
        return self.ms - (self.build_ms or 0.0)

    def timed(self) -> list[int]:
        """The optimizer steps ``ms`` is the mean of."""
        return list(self.only_steps) if self.only_steps else list(range(*self.steps))


REQUIRED = ("what", "method", "model", "batch", "max_len", "ms", "steps")

#: what a measured row times (``Measured.kind``)
KINDS = ("train", "dev_eval")
#: the rows measured in this process, in the file's form (``record``; ``sentemb gpu-check --rows-json``)
RECORDED: list[dict] = []
#: (file, header) that ``RECORDED`` is written to after every row (``record_to``), or None
_RECORD_TO: "tuple[Path, dict] | None" = None


def record_to(path: str | Path, header: dict) -> None:
    """Write ``RECORDED`` (and ``header``'s keys) to ``path`` now and after every row recorded from now
    on, so that a run stopped by a time limit leaves the rows it measured. The header says
    ``"complete": false`` until ``record_complete`` (the command ended normally): ``plan-check`` then
    says that the file holds the rows of a run that stopped early."""
    global _RECORD_TO
    _RECORD_TO = (Path(path), {**header, "complete": False})
    _flush()


def record_complete() -> None:
    """Mark the rows file complete (the command that measured its rows ended without an error)."""
    if _RECORD_TO is not None:
        _RECORD_TO[1]["complete"] = True
        _flush()


def _flush() -> None:
    if _RECORD_TO is None:
        return
    path, header = _RECORD_TO
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps({**header, "rows": RECORDED}, indent=1) + "\n", "utf-8")
    tmp.replace(path)


def record(*args, **kwargs) -> None:
    """Append ``measured_record(*args, **kwargs)`` to ``RECORDED``; the model is kept by its directory's
    name (``gpu-check --model bert-base-uncased`` writes it as ``.../bert-base-uncased``: a backbone name)."""
    row = measured_record(*args, **kwargs)
    row["model"] = Path(row["model"]).name
    add_recorded([row])


def add_recorded(rows: list[dict]) -> None:
    """Rows recorded elsewhere (a row's own process, ``hostcheck._isolated``), in the file's form."""
    RECORDED.extend(rows)
    _flush()


def measured_record(what: str, method: str, model: str, batch: int, max_len: int, seconds: float,
                    steps: tuple[int, int], train: dict | None = None, method_args: dict | None = None,
                    precision: str = "bf16", steady: bool = True, note: str = "",
                    only_steps: list[int] | None = None, build_s: float | None = None, kind: str = "train") -> dict:
    """A measured row in the file's form (``Measured`` as a mapping; ``seconds`` per step, ``build_s``
    of them building the batches in line)."""
    out = dataclasses.asdict(Measured(what, method, str(model), int(batch), int(max_len), round(1000 * seconds, 3),
                                      (int(steps[0]), int(steps[1])), _plain(train or {}), _plain(method_args or {}),
                                      precision, bool(steady), note,
                                      [int(x) for x in only_steps] if only_steps else None,
                                      round(1000 * build_s, 3) if build_s is not None else None, kind))
    return {k: v for k, v in out.items()
            if not ((k in ("only_steps", "build_ms") and v is None) or (k == "kind" and v == "train"))}


def _plain(d: dict) -> dict:
    """``d`` as JSON has it (tuples as lists)."""
    return json.loads(json.dumps(d, default=str))


def load_measured(path: str | Path) -> tuple[dict, list[Measured]]:
    """(the file's header: ``gpu``, ``corpus``, ``source`` ..., its rows) of a measured-rows file:
    ``{"gpu": "H200", "corpus": "data/wiki1m_head.txt", ..., "rows": [{...}, ...]}``. A missing or
    malformed key is an error naming the file, the row and the key."""
    p = Path(path)
    try:
        data = json.loads(p.read_text("utf-8"))
    except (OSError, ValueError) as e:  # ValueError: json's decode error, and bytes that are not UTF-8
        raise SentembError(f"{p}: not a readable JSON file ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise SentembError(f"{p}: expected an object with a 'rows' list")
    rows = []
    names = {f.name for f in dataclasses.fields(Measured)}
    defaults = {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                for f in dataclasses.fields(Measured) if f.name not in REQUIRED}  # Measured's, written once
    for i, given in enumerate(data["rows"]):
        where = f"{p}: rows[{i}]"
        if not isinstance(given, dict):
            raise SentembError(f"{where}: expected an object")
        missing = [k for k in REQUIRED if k not in given]
        if missing:
            raise SentembError(f"{where}: missing {', '.join(missing)}")
        unknown = sorted(set(given) - names)
        if unknown:
            raise SentembError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(names))})")
        r = {**defaults, **given}
        steps = r["steps"]
        if not (isinstance(steps, list | tuple) and len(steps) == 2 and all(_is_int(x) for x in steps)
                and 0 <= steps[0] < steps[1]):
            raise SentembError(f"{where}.steps: {steps!r} is not [first, end) optimizer steps (0 <= first < end)")
        for k in ("batch", "max_len"):
            if not _is_int(r[k]) or r[k] < 1:
                raise SentembError(f"{where}.{k}: {r[k]!r} is not a positive integer")
        if not _is_number(r["ms"]) or r["ms"] <= 0:
            raise SentembError(f"{where}.ms: {r['ms']!r} is not a positive number")
        build = r["build_ms"]
        if build is not None and not (_is_number(build) and 0 <= build < r["ms"]):
            raise SentembError(f"{where}.build_ms: {build!r} is not a number from 0 to ms ({r['ms']})")
        only = r["only_steps"]
        if only is not None and not (isinstance(only, list) and only and all(_is_int(x) for x in only)
                                     and all(steps[0] <= x < steps[1] for x in only)):
            raise SentembError(f"{where}.only_steps: {only!r} is not a non-empty list of steps within {steps}")
        if not isinstance(r["steady"], bool):  # "no" would read as true
            raise SentembError(f"{where}.steady: {r['steady']!r} is not true or false")
        for k in ("train", "method_args"):
            if not isinstance(r[k], dict):
                raise SentembError(f"{where}.{k}: expected an object")
        if r["kind"] not in KINDS:
            raise SentembError(f"{where}.kind: {r['kind']!r} is not one of {', '.join(KINDS)}")
        if r["kind"] == "dev_eval" and r["precision"] not in ("fp32", "bf16"):
            raise SentembError(f"{where}.precision: {r['precision']!r} is not fp32 or bf16 (a dev evaluation's)")
        for k in ("batch_size", "max_len"):
            if k in r["train"]:
                raise SentembError(f"{where}.train.{k}: give it as the row's {'batch' if k == 'batch_size' else k}")
        from ..config.settings import TrainSettings

        TrainSettings.from_dict({**r["train"], "batch_size": r["batch"], "max_len": r["max_len"],
                                 "precision": r["precision"]}, f"{where}.train").check(where)
        rows.append(Measured(**{**r, "steps": (int(steps[0]), int(steps[1]))}))
    return {k: v for k, v in data.items() if k != "rows"}, rows


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    """A finite JSON number (json reads NaN and Infinity into floats; neither is a measurement)."""
    import math

    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def corpus_identity(path: str | Path) -> dict:
    """``corpus_lines`` (non-empty lines, what the loop trains on) and ``corpus_sha256`` of a corpus
    file: written in a measured-rows file's header, checked against the file ``plan-check`` finds."""
    import hashlib

    h, n = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for line in f:
            h.update(line)
            n += bool(line.strip())
    return {"corpus_lines": n, "corpus_sha256": h.hexdigest()}


def resolve_corpus(given: str | Path | None, header: dict, path: Path) -> Path:
    """The corpus the rows were measured on: ``given`` (``--corpus``), else the header's ``corpus`` as
    it is, or its file name under ``data/`` of the mirror and the ``shared/`` folders (a lend's path
    is the device's)."""
    import os

    from .shapes import shared_dirs

    if given:
        p = Path(given)
        if not p.is_file():
            raise SentembError(f"--corpus: {p} is not a file")
        return p
    name = header.get("corpus")
    if not name:
        raise SentembError(f"{path}: no 'corpus' in its header; give --corpus")
    if not isinstance(name, str):
        raise SentembError(f"{path}: its header's corpus {name!r} is not a path; give --corpus")
    roots = [Path(os.environ["SENTEMB_MIRROR"])] if os.environ.get("SENTEMB_MIRROR") else []
    candidates = [Path(name)] + [r / name for r in roots + list(shared_dirs())] + \
        [r / "data" / Path(name).name for r in roots + list(shared_dirs())]
    for c in candidates:
        if c.is_file():
            want = {k: header[k] for k in ("corpus_lines", "corpus_sha256") if k in header}
            got = corpus_identity(c) if want else {}
            if any(got[k] != v for k, v in want.items()):
                raise SentembError(f"{path}: its corpus {name} is not {c} ({want} measured, {got} here); give --corpus")
            return c
    raise SentembError(f"{path}: its corpus {name} is not found here (looked in the mirror and shared/); give --corpus")


def backbone_for(config, model: str, what: str = "") -> str:
    """The configured backbone a row's ``model`` names: a backbone of that name, else the one whose
    model directory (``mirror_path``, or the last part of its ``hub_id``) has that name (gpu-check keeps
    a model by its directory's name: the mirror's ``all-MiniLM-L6-v2`` is the demo's ``minilm``)."""
    from ..config.settings import Config

    cfg = Config.of(config)
    if model in cfg.backbones:
        return model
    for name, spec in cfg.backbones.items():
        dirs = {Path(spec.mirror_path).name if spec.mirror_path else None, str(spec.hub_id).rstrip("/").split("/")[-1]}
        if model in dirs:
            return name
    raise SentembError(f"row {what!r}: model {model} is not a backbone of the configuration, nor the model directory "
                       f"of one (known: {', '.join(sorted(cfg.backbones))}); give --config with it")


def measured_run(row: Measured, corpus: Path):
    """The run ``row`` measured (``_bench_run``'s, with its train settings and method arguments), under
    the backbone name ``row.model`` and the corpus name ``CHECK_CORPUS``."""
    from .benchmark import _bench_run

    try:
        run = _bench_run(row.model, corpus, row.batch, "cuda", row.max_len, row.precision, row.method, 10**9,
                         row.method_args, {}, **row.train)
    except (TypeError, ValueError) as e:
        raise SentembError(f"row {row.what!r}: its train settings or method arguments do not make a run: {e}") from None
    return dataclasses.replace(run, backbone=row.model, corpus=CHECK_CORPUS)


def price_measured(rows: list[Measured], config, corpus: Path, gpu: str) -> list[tuple[Measured, "float | str", dict]]:
    """Each row with the plan's seconds per step for it on ``gpu`` and the profile it was priced at
    (``width_profile`` of the timed steps), on the lengths of every line of ``corpus`` (the batch
    schedule's indices are the loop's lines). A row that cannot be priced gets the reason instead of
    the seconds, and the others are priced."""
    import torch

    from ..config.settings import Config
    from .plan import DEV_EVAL_REFERENCE, DEV_EVAL_SECONDS, Counter, _frozen_imports, job_measures, step_time, width_profile
    from .shapes import backbone_architecture

    cfg = Config.of(config)
    out = []
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="sentemb-plan-check-") as tmp, _frozen_imports():
        counter = Counter(cfg, Path(tmp), corpus, sample=None)
        for row in rows:
            try:
                if row.kind == "dev_eval":  # the plan's price of one evaluation (plan._priced_row's dev_eval_s)
                    arch = backbone_architecture(cfg, backbone_for(cfg, row.model, row.what))
                    seconds = DEV_EVAL_SECONDS[row.precision] * counter.encode(arch)[0] / \
                        counter.encode(DEV_EVAL_REFERENCE)[0]
                    out.append((row, seconds, {}))
                    continue
                run = measured_run(dataclasses.replace(row, model=backbone_for(cfg, row.model, row.what)), corpus)
                arch = backbone_architecture(cfg, run.backbone)
                lengths = counter.lengths(run.corpus, run.backbone)
                if lengths.tokens is None:
                    raise SentembError(f"no lengths of {corpus} ({lengths.source})")
                profile = width_profile(run, arch, lengths, steps=row.timed())
                measures = job_measures(counter, run, profile)
                seconds, _ = step_time(run, arch, measures, profile["count"], gpu)
            except (SentembError, KeyError, ValueError, TypeError) as e:
                log.warning("plan-check: row %r not priced: %s", row.what, e)
                out.append((row, f"{type(e).__name__}: {e}", {}))
                continue
            out.append((row, seconds, profile))
    return out


def verdict(measured_ms: float, plan_ms: float, tolerance: float = TOLERANCE) -> tuple[float, bool]:
    """(the plan's relative error against the measured step, whether it is within ``tolerance``)."""
    err = (plan_ms - measured_ms) / measured_ms
    return err, abs(err) <= tolerance + 1e-12


def format_check(priced: list[tuple[Measured, float, dict]], gpu: str, header: dict, corpus: Path,
                 tolerance: float = TOLERANCE) -> str:
    """The table ``sentemb plan-check`` prints, and its verdict over the steady rows."""
    lines = [f"sentemb plan vs steps (and dev evaluations) measured on {header.get('device') or header.get('gpu') or '?'}"
             f" ({header.get('source', '')}; priced for {gpu}; lengths of {corpus})", "",
             "(ms per optimizer step; per evaluation for a dev evaluation)", "",
             "| what | measured ms | plan ms | plan vs measured | |", "| --- | ---: | ---: | ---: | --- |"]
    steady = within = failed = 0
    for row, seconds, profile in priced:
        if isinstance(seconds, str):
            failed += 1
            lines.append(f"| {row.what} | {row.ms:.1f} | | | not priced: {seconds} |")
            continue
        plan_ms = 1000 * seconds
        err, ok = verdict(row.step_ms(), plan_ms, tolerance)
        widths = ", ".join(f"{w}: {100 * f:.0f}%" for w, f in sorted(profile.get("count", {}).items()))
        if row.steady:
            steady += 1
            within += ok
            mark = "within" if ok else f"OFF by more than {100 * tolerance:.0f}%"
        else:
            mark = "not steady (see its note), left out of the count"
        which = (f"{len(row.only_steps)} of steps {row.steps[0]}-{row.steps[1] - 1}" if row.only_steps
                 else f"steps {row.steps[0]}-{row.steps[1] - 1}")
        where = (f"{which} at widths {widths}" if row.kind == "train" else
                 f"one evaluation ({row.precision}), against DEV_EVAL_SECONDS scaled to the encoder")
        note = f"{mark}; {where}" + (f"; {row.note}" if row.note else "")
        measured = f"{row.ms:.1f}" + (f" ({row.step_ms():.1f} without building the batches in line)"
                                      if row.build_ms else "")
        lines.append(f"| {row.what} | {measured} | {plan_ms:.1f} | {100 * err:+.0f}% | {note} |")
    unsteady = len(priced) - steady - failed
    lines += ["", f"{within} of {steady} steady rows within {100 * tolerance:.0f}% of the measured time"
              + (f" ({unsteady} not steady, left out)" if unsteady else "")
              + (f" ({failed} not priced)" if failed else "")]
    return "\n".join(lines)

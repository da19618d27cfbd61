"""Every table and figure the five seed papers print, row by row (issue 29 §3): ``config/paper_tables.yaml``.

Each printed row is either *attached* to the published entry of ``config/paper_results.yaml`` that
carries its numbers (a ``results`` row, or a point of a ``studies`` entry) or *omitted* with a named
reason. ``audit_references`` (no paper text needed) and ``audit_text`` (the seed papers) return the
problems found; ``tests/test_paper_rows.py`` keeps both empty:

(a) every "Table N" / "Figure N" a paper's text mentions has an item (none is forgotten);
(b) each item's rows are in the paper: its ``region`` (two strings bounding the table's text) is
    found, every row label and cell lies inside it, and every data line of a table's region (a line
    with two or more decimal numbers) is claimed by some row (``covers``: no printed row is left out);
(c) every row is attached to entries that exist, or omitted for a reason of the ``reasons`` list
    (a row with both is partly reproduced; its ``why`` says which cells are not);
(d) every ``results`` entry and every study point of ``paper_results.yaml`` is attached to a row;
(e) an attached entry's numbers are printed on its row (``audit_paper``: a misattached row fails),
    unless the row lists it under ``differs`` with a ``note`` (the paper prints it differently).

References (``attached``):

* ``results:<run>@<backbone>/<table>`` — ``<run>`` is the entry's ``name`` (default its method) or
  ``baseline.<pooler>``; ``<table>`` is sts, transfer, dev or geometry;
* ``studies:<study>/<key>=<value>[,<key>=<value>]`` — one published point (keys as in its ``at``);
  ``studies:<study>/reference/seed=<s>`` — a seeds study's reference value; ``studies:<study>`` —
  the study as a whole (e.g. a printed mean over its points).

Text is compared after ``normalise`` (HTML tags, LaTeX commands and ``$ _ { } ^ | *`` dropped,
whitespace collapsed), so a label can be copied from the paper as printed.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from .. import SentembError

KINDS = ("table", "figure", "text")
_DECIMAL = re.compile(r"(?<![\w.])[-−]?\d*\.\d+")
_MENTION = {"table": re.compile(r"\bTable\s+([A-Z]?\d+)\b"), "figure": re.compile(r"\bFig(?:ure|\.)\s*(\d+)\b")}


def normalise(text: str) -> str:
    """The comparable form of paper text and of inventory labels."""
    text = re.sub(r"<[^>]*>", " ", text)
    text = re.sub(r"\\[A-Za-z]+", " ", text)
    text = re.sub(r"[$_{}^|*]", " ", text)
    return " ".join(text.split())


def labels(row: dict) -> list[str]:
    """The printed labels a row stands for (``row`` is one label or a list of rows sharing a reason)."""
    r = row.get("row")
    return [str(x) for x in r] if isinstance(r, list) else [str(r)]


# ------------------------------------------------------------------------------------------ loading
def load_inventory(path: str | Path) -> dict:
    """``config/paper_tables.yaml``: ``reasons`` {id: text} and ``papers`` [{paper, seed, identify,
    items: [{table|figure|text, [region], [rows], [omitted, why], [note]}]}]; each row {row,
    [cells], [attached], [omitted], [why], [note]}. Structural errors name the item."""
    import yaml

    try:
        doc = yaml.safe_load(Path(path).read_text("utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise SentembError(f"cannot read the paper inventory {path}: {e}") from None
    reasons = doc.get("reasons")
    if not isinstance(reasons, dict) or not all(isinstance(v, str) and v.strip() for v in reasons.values()):
        raise SentembError(f"{path}: `reasons` must map reason ids to non-empty texts")
    papers = doc.get("papers")
    if not isinstance(papers, list) or not papers:
        raise SentembError(f"{path}: expected a list under `papers`")
    for p in papers:
        for k in ("paper", "seed", "identify", "items"):
            if k not in p:
                raise SentembError(f"{path}: paper {p.get('paper')!r} lacks `{k}`")
        for i, item in enumerate(p["items"]):
            where = f"{path}: {p['paper']} items[{i}]"
            kinds = [k for k in KINDS if k in item]
            if len(kinds) != 1:
                raise SentembError(f"{where}: needs exactly one of {KINDS}")
            extra = set(item) - {*KINDS, "region", "rows", "omitted", "why", "note"}
            if extra:
                raise SentembError(f"{where}: unknown key(s) {sorted(extra)}")
            if item.get("rows") and (not isinstance(item.get("region"), list) or len(item["region"]) != 2):
                raise SentembError(f"{where}: rows need a `region` [start, end]")
            for j, row in enumerate(item.get("rows") or []):
                extra = set(row) - {"row", "cells", "attached", "differs", "omitted", "why", "note"}
                if extra or "row" not in row:
                    raise SentembError(f"{where}.rows[{j}]: needs `row`; unknown key(s) {sorted(extra)}")
    return doc


def item_id(paper: str, item: dict) -> str:
    kind = next(k for k in KINDS if k in item)
    return f"{paper} {kind.capitalize()} {item[kind]}"


# ------------------------------------------------------------------------------------------ references
def result_key(e: dict) -> str:
    run = f"baseline.{e.get('pooler')}" if e["method"] == "baseline" else (e.get("name") or e["method"])
    return f"results:{run}@{e['backbone']}/{e['table']}"


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and not isinstance(b, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def _parse_at(text: str) -> dict:
    import yaml

    at = {}
    for part in text.split(","):
        k, sep, v = part.partition("=")
        if not sep:
            raise ValueError(part)
        at[k.strip()] = yaml.safe_load(v.strip())
    return at


def resolve(ref: str, results: dict[str, dict], studies: dict[str, dict]) -> tuple | None:
    """What a reference names: ("results", key), ("study", name), ("point", name, role, index); None
    when it names nothing."""
    if ref.startswith("results:"):
        return ("results", ref) if ref in results else None
    if not ref.startswith("studies:"):
        return None
    name, _, rest = ref[len("studies:"):].partition("/")
    if name not in studies:
        return None
    if not rest:
        return ("study", name)
    role = "points"
    if rest.startswith("reference/"):
        role, rest = "reference", rest[len("reference/"):]
    try:
        at = _parse_at(rest)
    except ValueError:
        return None
    for i, p in enumerate(studies[name].get(role) or []):
        if set(p["at"]) == set(at) and all(_same(p["at"][k], at[k]) for k in at):
            return ("point", name, role, i)
    return None


def audit_references(inv: dict, results: list[dict], studies: dict[str, dict]) -> list[str]:
    """(c) every row attached to existing entries or omitted for a listed reason; (d) every entry and
    study point of paper_results.yaml attached to some row. Returns the problems found."""
    problems, used = [], set()
    by_key = {}
    for e in results:
        if result_key(e) in by_key:
            problems.append(f"two results entries share the key {result_key(e)}")
        by_key[result_key(e)] = e
    reasons = inv["reasons"]
    for p in inv["papers"]:
        for item in p["items"]:
            where = item_id(p["paper"], item)
            if not item.get("rows") and item.get("omitted") is None:
                problems.append(f"{where}: neither rows nor a reason (`omitted`)")
            if item.get("omitted") is not None and item["omitted"] not in reasons:
                problems.append(f"{where}: reason {item['omitted']!r} is not in `reasons`")
            for row in item.get("rows") or []:
                what = f"{where} row {labels(row)}"
                attached, omitted = row.get("attached") or [], row.get("omitted")
                if not attached and omitted is None:
                    problems.append(f"{what}: neither attached nor omitted")
                if omitted is not None and omitted not in reasons:
                    problems.append(f"{what}: reason {omitted!r} is not in `reasons`")
                for ref in attached:
                    hit = resolve(ref, by_key, studies)
                    if hit is None:
                        problems.append(f"{what}: {ref!r} names no entry of paper_results.yaml")
                    used.add(hit)
                for ref in row.get("differs") or []:
                    if ref not in attached or not row.get("note"):
                        problems.append(f"{what}: `differs` {ref!r} must be attached and explained in a `note`")
    for key in by_key:
        if ("results", key) not in used:
            problems.append(f"{key}: no printed row of config/paper_tables.yaml is attached to it")
    for name, s in studies.items():
        for role in ("points", "reference"):
            for i, pt in enumerate(s.get(role) or []):
                if ("point", name, role, i) not in used:
                    problems.append(f"studies:{name} {role} {pt['at']}: no printed row is attached to it")
    return problems


# ------------------------------------------------------------------------------------------ paper text
def mentions(text: str) -> dict[str, set[str]]:
    """The table and figure numbers a paper's text mentions (captions and references alike)."""
    return {kind: set(rx.findall(text)) for kind, rx in _MENTION.items()}


def region_lines(lines: list[str], region: list[str]) -> list[str] | None:
    """The normalised lines from the first holding ``region[0]`` to the next holding ``region[1]``."""
    start, end = normalise(region[0]), normalise(region[1])
    for i, line in enumerate(lines):
        if start in line:
            for j in range(i, len(lines)):
                if end in lines[j] and (j > i or line.find(end) > line.find(start)):
                    return lines[i:j + 1]
            return None
    return None


def printed_forms(v: float) -> set[str]:
    """How the papers print the value ``v`` (× 100 scores, geometry): two, one or three decimals, or
    as a fraction (UNA: 81.61 -> .8161; the text's 0.847 for 84.70)."""
    out = {f"{v:.2f}", f"{v:.1f}", f"{v:.3f}"}
    for d in (3, 4):
        f = f"{v / 100:.{d}f}"
        out |= {f, f.replace("0.", ".", 1)}
    return out


def _tokens(strings) -> set[str]:
    return {t.replace("−", "-") for s in strings for t in _DECIMAL.findall(s)}


def audit_paper(entry: dict, text: str, values=None) -> list[str]:
    """(a) and (b) for one paper against its seed text. With ``values`` (reference -> the attached
    entry's published numbers, None for a whole study), also (e): the numbers printed on a row (its
    line in a table, its ``cells`` if it has any, its label for a figure's or text's row) are the
    attached entries' — each entry has one of its numbers there (``printed_forms``), and together
    they account for two of them (one where only one is printed) — except for an entry the row lists
    under ``differs`` (the paper prints its value differently elsewhere; the row's note says so)."""
    problems = []
    paper = entry["paper"]
    flat = normalise(text)
    if normalise(entry["identify"]) not in flat:
        problems.append(f"{paper}: {entry['identify']!r} is not in its seed text (wrong seed file?)")
    listed = {kind: {str(item[kind]) for item in entry["items"] if kind in item} for kind in ("table", "figure")}
    for kind, found in mentions(text).items():
        for n in sorted(found - listed[kind]):
            problems.append(f"{paper}: {kind.capitalize()} {n} is in the paper but not in the inventory")
        for n in sorted(listed[kind] - found):
            problems.append(f"{paper}: {kind.capitalize()} {n} is in the inventory but not in the paper")
    lines = [normalise(line) for line in text.splitlines()]
    for item in entry["items"]:
        where = item_id(paper, item)
        if not item.get("region"):
            continue
        region = region_lines(lines, item["region"])
        if region is None:
            problems.append(f"{where}: region {item['region']!r} not found in the paper")
            continue
        body = " ".join(region)
        found_by = []
        for row in item.get("rows") or []:
            strings = [*labels(row), *[str(c) for c in row.get("cells") or []]]
            for s in strings:
                if normalise(s) not in body:
                    problems.append(f"{where}: {s!r} is not printed in the table's region")
            found_by += [normalise(s) for s in strings]
        data = [line for line in region if len(_DECIMAL.findall(line)) >= 2 and not line.startswith("Table ")]
        if "table" in item:
            for line in data:
                if not any(covers(s, line) for s in found_by):
                    problems.append(f"{where}: printed row {line[:90]!r} is neither attached nor omitted")
        if values is None:
            continue
        for row in item.get("rows") or []:
            strings = [normalise(x) for x in [*labels(row), *[str(c) for c in row.get("cells") or []]]]
            numbered = [line for line in region if _DECIMAL.search(line) and not line.startswith("Table ")]
            if row.get("cells"):  # a transposed or garbled row: its own cells
                printed = _tokens(normalise(str(c)) for c in row["cells"])
            elif "table" in item:
                printed = _tokens(line for line in numbered if any(covers(x, line) for x in strings))
            else:  # a number quoted in running text or a figure's caption
                printed = _tokens(strings)
            matched, total = set(), 0
            for ref in row.get("attached") or []:
                nums = values(ref)
                if nums is None or ref in (row.get("differs") or []):
                    continue
                hits = {t for v in nums for t in printed_forms(v) & printed}
                matched |= hits
                total += len(nums)
                if printed and not hits:
                    problems.append(f"{where} row {labels(row)}: none of {ref}'s numbers is printed on it")
            if len(matched) < min(2, len(printed), total):
                problems.append(f"{where} row {labels(row)}: its attached entries account for {len(matched)} "
                                f"of its printed numbers {sorted(printed)}")
    return problems


def covers(s: str, line: str) -> bool:
    """Whether the row string ``s`` (normalised) claims the data ``line``: a string holding a decimal
    number (a label with its first values, or a cell) anywhere on it; a label without one only if it
    is the line's whole text before its first number ("SimCSE-BERT base" does not claim "ESimCSE-BERT
    base 73.40 ...", "+ RD" does not claim "+ SR + RD 77.2 ..."; a label the conversion garbled carries
    `cells`)."""
    if not s:
        return False
    if _DECIMAL.search(s):
        return s in line
    m = _DECIMAL.search(line)
    return (line[:m.start()] if m else line).strip() == s


def seed_file(seeds_dir: str | Path, seed: str) -> Path | None:
    hits = sorted(Path(seeds_dir).glob(f"{seed}_*.txt"))
    return hits[0] if len(hits) == 1 else None


def audit_text(inv: dict, seeds_dir: str | Path, results: list[dict] | None = None,
               studies: dict[str, dict] | None = None) -> list[str]:
    """(a), (b) for every paper; given the published ``results`` and ``studies``, also the numbers of
    each attached entry against the printed row (``audit_paper``)."""
    values = None
    if results is not None:
        by_key = {result_key(e): e for e in results}

        def values(ref):
            hit = resolve(ref, by_key, studies or {})
            if hit is None or hit[0] == "study":
                return None
            if hit[0] == "results":
                return list(by_key[ref]["scores"].values())
            _, name, role, i = hit
            return list(studies[name][role][i]["scores"].values())

    problems = []
    for entry in inv["papers"]:
        f = seed_file(seeds_dir, str(entry["seed"]))
        if f is None:
            problems.append(f"{entry['paper']}: no single seed file {entry['seed']}_*.txt in {seeds_dir}")
            continue
        problems += audit_paper(entry, f.read_text("utf-8"), values)
    return problems


def counts(inv: dict) -> dict[str, Any]:
    """Items by kind; printed rows attached, and omitted by reason; items omitted as a whole (figures
    and tables without rows) by reason; attached rows with some cells omitted, by reason."""
    out: dict[str, Any] = {"items": {k: 0 for k in KINDS}, "rows_attached": 0, "rows_omitted": {},
                           "items_omitted": {}, "partly_omitted": {}}

    def add(key, reason, n):
        out[key][reason] = out[key].get(reason, 0) + n

    for p in inv["papers"]:
        for item in p["items"]:
            out["items"][next(k for k in KINDS if k in item)] += 1
            if not item.get("rows"):
                add("items_omitted", item["omitted"], 1)
            for row in item.get("rows") or []:
                n = len(labels(row))
                if row.get("attached"):
                    out["rows_attached"] += n
                    if row.get("omitted"):
                        add("partly_omitted", row["omitted"], n)
                elif row.get("omitted"):
                    add("rows_omitted", row["omitted"], n)
    return out


# ------------------------------------------------------- published entries against the configuration
def check_against_config(entries: list[dict], config: dict, source: str = "paper_results.yaml") -> None:
    """Refuse published numbers that no configured run reproduces (``config``: validated, e.g. by
    ``sentemb.config.load.load_config``); errors name the entry.

    * every run an entry names (``name`` or the method's own run, and ``also``) exists on its backbone,
      with the method, and has the entry's ``method_args`` / ``train`` settings (a baseline: the
      backbone's ``baselines`` list holds its pooler);
    * no configured run has published numbers filed under another name: a run without an entry of
      its own whose method arguments equal those of a run that has one (same method, backbone and
      table; compared on every argument an entry of that method pins) would be reported as "not
      reported" while the paper reports it. List it in that entry's ``also``, or tell it apart in
      the entry's ``method_args`` / ``train``.
    """
    from ..config.load import method_args_of
    from ..config.settings import Config
    from .style import BASELINE
    from .paper import _entry_name

    runs = {(r["name"], r["backbone"]): r for r in config["runs"]}
    cfg = Config.of(config)  # built once: method_args_of reads the typed tree
    specs = {id(r): spec for r, spec in zip(config["runs"], cfg.runs)}

    def resolved(r: dict) -> tuple[dict, dict]:
        return method_args_of(cfg, specs[id(r)]), {**config["train"], **r["train"]}

    covered: dict[tuple, set] = {}  # (method, backbone, table) -> run names with published numbers
    axes: dict[str, tuple[set, set]] = {}  # method -> (method arguments, train keys) some entry pins
    for i, e in enumerate(entries):
        where = f"{source}: results[{i}] ({e['source']})"
        if e["method"] == BASELINE:
            if e.get("pooler") not in config["baselines"].get(e["backbone"], []):
                raise SentembError(f"{where}: no baseline '{e['backbone']}' with pooler '{e.get('pooler')}' in "
                                   "the config's `baselines`")
            continue
        m_axes, t_axes = axes.setdefault(e["method"], (set(), set()))
        m_axes.update(e.get("method_args", {}))
        t_axes.update(e.get("train", {}))
        for name in [_entry_name(e), *e.get("also", [])]:
            r = runs.get((name, e["backbone"]))
            if r is None:
                raise SentembError(f"{where}: no configured run '{name}' on backbone '{e['backbone']}' "
                                   "reproduces this published row (add the run, or fix the entry's name/backbone)")
            if r["method"] != e["method"]:
                raise SentembError(f"{where}: run '{name}' on '{e['backbone']}' trains '{r['method']}', not "
                                   f"'{e['method']}'")
            margs, train = resolved(r)
            for kind, want, have in (("method_args", e.get("method_args", {}), margs),
                                     ("train", e.get("train", {}), train)):
                for k, v in want.items():
                    if have.get(k) != v:
                        raise SentembError(f"{where}: the published row needs {kind}.{k} = {v!r}, but run "
                                           f"'{name}' on '{e['backbone']}' has {have.get(k)!r}: the numbers "
                                           "belong to another run")
            covered.setdefault((e["method"], e["backbone"], e["table"]), set()).add(name)
    def on_axes(r: dict, m_axes: set, t_axes: set) -> dict:
        margs, train = resolved(r)
        return {**{k: margs.get(k) for k in m_axes}, **{f"train.{k}": train.get(k) for k in t_axes}}

    for (method, backbone, table), names in covered.items():
        m_axes, t_axes = axes.get(method, (set(), set()))
        for (name, b), r in runs.items():
            if b != backbone or r["method"] != method or name in names or r["study"]:
                continue  # a study's point differs from every run in its varied setting (sentemb.config.studies)
            mine = on_axes(r, m_axes, t_axes)
            for other in sorted(names):
                theirs = on_axes(runs[(other, backbone)], m_axes, t_axes)
                if mine == theirs and mine:
                    raise SentembError(
                        f"{source}: run '{name}' on '{backbone}' has the settings of '{other}' "
                        f"({', '.join(f'{k}={v!r}' for k, v in sorted(mine.items()))}), whose published {table} "
                        f"numbers are filed under '{other}' only: list '{name}' in that entry's `also`, or "
                        "pin the argument that tells them apart in the entry's method_args")

"""Readers for the STS evaluation sets in SentEval's ``data/downstream`` layout.

They reproduce SentEval's loaders as SimCSE's copy of SentEval uses them (``senteval/sts.py``):

* STS12–16: ``STS.input.<subset>.txt`` (tab-separated; the first two columns are the sentences,
  extra columns such as the raw STS16 source columns are ignored) with ``STS.gs.<subset>.txt``;
  pairs whose gold score is empty are dropped.
* STS-B: ``STSBenchmark/sts-{train,dev,test}.csv``, score column 4, sentences columns 5 and 6
  (0-based), extra columns ignored.
* SICK-R: ``SICK/SICK_{train,trial,test_annotated}.txt`` with a header line; sentences columns 1
  and 2, relatedness column 3. ``dev`` is ``SICK_trial.txt``.

Each sentence is whitespace-split and re-joined with single spaces, as SentEval's batcher does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from .. import SentembError

STS_SUBSETS: dict[str, list[str]] = {
    "STS12": ["MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"],
    "STS13": ["FNWN", "headlines", "OnWN"],
    "STS14": ["deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"],
    "STS15": ["answers-forums", "answers-students", "belief", "headlines", "images"],
    "STS16": ["answer-answer", "headlines", "plagiarism", "postediting", "question-question"],
}
TASKS = ["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness"]
#: the SentEval transfer tasks the papers report (``sentemb.evaluate.transfer``)
TRANSFER_TASKS = ["MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC"]

# Pairs with a gold score in each evaluated split (shared/README.md); used to verify downloads.
EXPECTED_PAIRS: dict[str, int] = {
    "STS12": 3108,
    "STS13": 1500,
    "STS14": 3750,
    "STS15": 3000,
    "STS16": 1186,
    "STSBenchmark": 1379,
    "STSBenchmark/dev": 1500,
    "SICKRelatedness": 4927,
}


@dataclass
class Pairs:
    """Sentence pairs with gold scores; ``subset`` names where they come from."""

    subset: str
    sent1: list[str]
    sent2: list[str]
    gold: list[float]

    def __len__(self) -> int:
        return len(self.gold)


def _norm(s: str) -> str:
    return " ".join(s.split())


def _read_lines(path: Path) -> list[str]:
    if not path.is_file():
        raise SentembError(f"STS data file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise SentembError(f"{path}, line {line}: not valid UTF-8 ({e.reason})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [l.rstrip("\r") for l in lines]


def _score(value: str, path: Path, lineno: int) -> float:
    try:
        score = float(value)
    except ValueError:
        raise SentembError(f"{path}, line {lineno}: gold score {value!r} is not a number") from None
    if not math.isfinite(score):  # float() reads "nan" and "inf": every correlation would be NaN
        raise SentembError(f"{path}, line {lineno}: gold score {value!r} is not a finite number")
    return score


def _scorable(pairs: Pairs, path: Path) -> Pairs:
    """``pairs`` when a correlation with their gold scores is defined: at least 2 scored pairs whose gold
    scores are not all equal (else Spearman and Pearson are NaN, and so would be the task's score)."""
    gold = [g for g in pairs.gold if not math.isnan(g)]
    if len(gold) < 2 or min(gold) == max(gold):
        what = f"{len(gold)} scored pair(s)" if len(gold) < 2 else f"all {len(gold)} gold scores are {gold[0]}"
        raise SentembError(f"{path}: {what}; a correlation needs at least 2 pairs with different gold scores")
    return pairs


def load_sts_subset(task_dir: Path, subset: str, unscored: bool = False) -> Pairs:
    """The pairs of one STS12-16 subset with a gold score (those SentEval evaluates); ``unscored``: every
    line of the input file, a pair without a gold score given NaN (the unlabeled texts ConSERT and
    PaSeR train on)."""
    inp = task_dir / f"STS.input.{subset}.txt"
    gs = task_dir / f"STS.gs.{subset}.txt"
    inputs, golds = _read_lines(inp), _read_lines(gs)
    if len(inputs) != len(golds):
        raise SentembError(
            f"{inp} has {len(inputs)} lines but {gs} has {len(golds)}: the files must be line-aligned"
        )
    s1, s2, g = [], [], []
    for i, (line, gold) in enumerate(zip(inputs, golds), start=1):
        if gold.strip() == "" and not unscored:
            continue
        cols = line.split("\t")
        if len(cols) < 2:
            raise SentembError(f"{inp}, line {i}: expected two tab-separated sentences, found {len(cols)} column(s)")
        s1.append(_norm(cols[0]))
        s2.append(_norm(cols[1]))
        g.append(_score(gold.strip(), gs, i) if gold.strip() else float("nan"))
    pairs = Pairs(subset, s1, s2, g)
    return pairs if unscored else _scorable(pairs, gs)  # unscored: the sentences are what is read


def _load_columns(path: Path, c1: int, c2: int, cs: int, header: bool, subset: str) -> Pairs:
    s1, s2, g = [], [], []
    for i, line in enumerate(_read_lines(path), start=1):
        if header and i == 1:
            continue
        if not line.strip():
            continue
        cols = line.strip().split("\t")
        if len(cols) <= max(c1, c2, cs):
            raise SentembError(
                f"{path}, line {i}: expected at least {max(c1, c2, cs) + 1} tab-separated columns, found {len(cols)}"
            )
        s1.append(_norm(cols[c1]))
        s2.append(_norm(cols[c2]))
        g.append(_score(cols[cs], path, i))
    return _scorable(Pairs(subset, s1, s2, g), path)


def load_task(data_dir: str | Path, task: str, split: str = "test", unscored: bool = False) -> list[Pairs]:
    """Load one task as a list of subsets (STS12–16: their subsets; STS-B, SICK-R: one split);
    ``unscored``: STS12–16's pairs without a gold score too (:func:`load_sts_subset`)."""
    root = Path(data_dir)
    if not root.is_dir():
        raise SentembError(f"SentEval data directory not found: {root}")
    if task in STS_SUBSETS:
        if split != "test":
            raise SentembError(f"{task} has only a test split (asked for '{split}')")
        task_dir = root / "STS" / f"{task}-en-test"
        return [load_sts_subset(task_dir, sub, unscored) for sub in STS_SUBSETS[task]]
    if task == "STSBenchmark":
        if split not in ("train", "dev", "test"):
            raise SentembError(f"STSBenchmark split must be train, dev or test, not '{split}'")
        return [_load_columns(root / "STS" / "STSBenchmark" / f"sts-{split}.csv", 5, 6, 4, False, split)]
    if task == "SICKRelatedness":
        fname = {"train": "SICK_train.txt", "dev": "SICK_trial.txt", "test": "SICK_test_annotated.txt"}
        if split not in fname:
            raise SentembError(f"SICKRelatedness split must be train, dev or test, not '{split}'")
        return [_load_columns(root / "SICK" / fname[split], 1, 2, 3, True, split)]
    raise SentembError(f"unknown task '{task}' (known: {', '.join(TASKS)})")


def count_pairs(data_dir: str | Path) -> dict[str, int]:
    """Number of scored pairs per evaluated split, keyed like EXPECTED_PAIRS."""
    counts = {t: sum(len(p) for p in load_task(data_dir, t)) for t in TASKS}
    counts["STSBenchmark/dev"] = len(load_task(data_dir, "STSBenchmark", "dev")[0])
    return counts


def verify_counts(data_dir: str | Path, expected: dict[str, int] | None = None) -> dict[str, int]:
    """Raise SentembError unless every split has its expected number of scored pairs."""
    expected = EXPECTED_PAIRS if expected is None else expected
    counts = count_pairs(data_dir)
    bad = [f"{k}: {counts.get(k)} pairs, expected {v}" for k, v in expected.items() if counts.get(k) != v]
    if bad:
        raise SentembError(f"SentEval data in {data_dir} failed verification: " + "; ".join(bad))
    return counts

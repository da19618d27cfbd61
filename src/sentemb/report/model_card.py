"""Model cards (issue 29 §1): a ``README.md`` in every exported model directory, so that on the
Hugging Face Hub (or any model registry) a model says what it is, how to load it, what defines it
and how it scored.

Two writers, one card:

* ``sentemb train`` writes the card **without results** into ``model/`` when it exports the model
  (``write_export_card``), so a model is never anonymous, even before it is evaluated.
* ``sentemb model-card --run-dir D`` (rule ``model_card``, after the run's ``eval_sts.json`` and,
  for a run with transfer tasks, ``eval_transfer.json``) rewrites it **with results**: the
  ``model-index`` the Hub reads, the results next to the published numbers of the run's row
  (``config/paper_results.yaml``). Its own output is ``<run dir>/model_card.json`` (what was
  written); ``model/`` stays the training's output, whose age Snakemake reads from
  ``.snakemake_timestamp``, so the card makes nothing downstream look outdated.

The machinery is huggingface_hub's — ``ModelCardData`` with ``EvalResult`` (-> ``model-index``) and
``ModelCard.from_template`` — which sentence-transformers' own card (``SentenceTransformerModelCardData``,
``generate_model_card``) is built on; its conventions are kept (``library_name``, ``pipeline_tag``,
its default tags, the section headings of its ``model_card_template.md``). Its template itself is not
used: sentence-transformers is not installed in the pipeline's job environment
(``workflow/envs/sentemb.yaml``), and the template is filled from its Trainer (losses, dataset
columns, a loaded model). Here the card is written from the run's files with no model loaded: the
command imports neither torch nor transformers.

Open choices, each a named constant below:

* ``METRIC_SCALE``: values are stored as ``eval_sts.json`` / ``eval_transfer.json`` hold them
  (Spearman × 100, accuracy × 100: the papers' unit), not as fractions; the metric's name says so.
* ``STS_HUB_DATASETS``: an STS result names the Hub's copy of the same test set (MTEB's) as its
  dataset, so the Hub links it; the SentEval protocol and data are named in the metric's ``config``
  and ``args``. Transfer tasks have no Hub copy of SentEval's splits: ``SentEval/<task>``.
* Stale results: an evaluation file older than the run's ``train.json`` belongs to an earlier model
  of the same run directory and is left out (with a warning), so the card has no results rather
  than wrong ones; results of another run (its ``run`` metadata) are an error.
"""

from __future__ import annotations

import ast
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .. import SentembError, __version__
from ..evaluate.senteval import TASKS, TRANSFER_TASKS
from ..utils import atomic_path, read_json, sha256_file

log = logging.getLogger(__name__)

CARD = "README.md"  # the Hub's card file (huggingface_hub.constants.REPOCARD_NAME)

#: sentence-transformers' card conventions (SentenceTransformerModelCardData's defaults, v6)
LIBRARY_NAME = "sentence-transformers"
PIPELINE_TAG = "sentence-similarity"
ST_TAGS = ("sentence-transformers", "sentence-similarity", "feature-extraction", "dense")

#: values are stored × 100, as the evaluation files and the papers give them (see the module docstring)
METRIC_SCALE = 100
STS_METRIC = "cosine_spearman"
TRANSFER_METRIC = "accuracy"
#: the Hub's copy of each STS test set (MTEB's: the same pairs SentEval scores), for model-index dataset.type
STS_HUB_DATASETS = {
    "STS12": "mteb/sts12-sts", "STS13": "mteb/sts13-sts", "STS14": "mteb/sts14-sts", "STS15": "mteb/sts15-sts",
    "STS16": "mteb/sts16-sts", "STSBenchmark": "mteb/stsbenchmark-sts", "SICKRelatedness": "mteb/sickr-sts",
}
STS_NAMES = {"STSBenchmark": "STS-B", "SICKRelatedness": "SICK-R"}
#: transfer tasks scored by k-fold cross-validation (no test split); the others have a test split
CV_TASKS = ("MR", "CR", "SUBJ", "MPQA")

#: license and language of the paper's backbones, from their Hub cards; used when the fetched backbone
#: directory has no README.md of its own (a hub fetch keeps none; a mirror copy may)
KNOWN_BACKBONES = {
    "google-bert/bert-base-uncased": {"license": "apache-2.0", "language": ["en"]},
    "google-bert/bert-large-uncased": {"license": "apache-2.0", "language": ["en"]},
    "FacebookAI/roberta-base": {"license": "mit", "language": ["en"]},
    "FacebookAI/roberta-large": {"license": "mit", "language": ["en"]},
    "sentence-transformers/all-MiniLM-L6-v2": {"license": "apache-2.0", "language": ["en"]},
}

#: each built-in method's page; its title line names the method, its "## Citation" block the paper
METHOD_DOCS = Path(__file__).resolve().parents[3] / "docs" / "methods"

POOLER_TEXT = {
    "cls_before_pooler": "the [CLS] token's last hidden state (SimCSE's evaluation pooler; no training MLP)",
    "cls": "the [CLS] token's last hidden state through the trained Linear + Tanh head (the checkpoint's pooler layer)",
    "avg": "the attention-masked mean of the last hidden states",
    "method": "the method's own module (see Full Model Architecture)",
}


# ----------------------------------------------------------------------------------------- inputs
@dataclass
class MethodPage:
    """What the card says about a method: its display name, paper title and BibTeX (empty when unknown)."""

    name: str
    display: str
    title: str = ""
    bibtex: str = ""
    page: str = ""  # the page's path in the repository


@dataclass
class CardInputs:
    """Everything a card is written from (``read_run_dir`` reads them from a run directory)."""

    run: dict  # the resolved run (run_config.json)
    model_dir: Path
    train: dict | None = None  # train.json (its ``provenance``: commit, corpus digest, versions)
    sts: dict | None = None  # eval_sts.json
    transfer: dict | None = None  # eval_transfer.json
    published: dict[str, dict] = field(default_factory=dict)  # table (sts, transfer, dev) -> paper_results entry
    datasets: list[str] = field(default_factory=list)  # Hub ids of the training corpus


def method_page(method: str, docs: Path = METHOD_DOCS) -> MethodPage:
    """The method's page ``docs/methods/<method>.md``: display name from its title line
    (``# SARCSE (`sarcse`)``), BibTeX from its ``## Citation`` block, the paper title from that."""
    path = docs / f"{method}.md"
    if not path.is_file():
        return MethodPage(method, method)
    text = path.read_text("utf-8")
    title_line = re.search(r"^# (.+?) \(`" + re.escape(method) + r"`\)", text, re.M)
    cite = re.search(r"^## Citation\b.*?```bibtex\n(.*?)```", text, re.M | re.S)
    bibtex = cite.group(1).strip() if cite else ""
    paper = re.search(r"^\s*title\s*=\s*\{(.*)\},?\s*$", bibtex, re.M)
    return MethodPage(method, title_line.group(1) if title_line else method,
                      re.sub(r"[{}]", "", paper.group(1)) if paper else "", bibtex, f"docs/methods/{method}.md")


def plugin_summary(run: dict) -> str:
    """The first line of a plug-in method's module docstring, read from its file without importing it."""
    module = run.get("method_module")
    if not module or not Path(module).is_file():
        return ""
    try:
        doc = ast.get_docstring(ast.parse(Path(module).read_text("utf-8"))) or ""
    except (OSError, SyntaxError, UnicodeDecodeError):
        return ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def resolved_run(run: dict) -> dict:
    """A run config's mapping (``sentemb.config.settings.Run``) with every key present: the optional ones
    the JSON leaves out at None, as None, so the card reads settings without a fallback of its own."""
    from ..config.settings import Run

    r = Run.from_dict(run)
    return {**{k: None for k in Run._OPTIONAL}, **r.to_dict()}


def published_for(entries: list[dict], run: dict, source: str = "paper_results.yaml") -> dict[str, dict]:
    """The published rows of ``run`` by table (sts, transfer, dev), matched as ``sentemb.report.paper.table_paper``
    matches them (the entry's run ``name`` or ``also``, on its backbone). An entry whose pinned
    ``method_args`` / ``train`` the run does not have is left out (with a warning): its numbers
    belong to another run."""
    from .style import BASELINE
    from .paper import _entry_name

    out = {}
    for e in entries:
        if e["method"] == BASELINE or e["backbone"] != run["backbone"] or e["method"] != run["method"]:
            continue
        if run["name"] not in [_entry_name(e), *e.get("also", [])]:
            continue
        have = {"method_args": run["method_args"], "train": run["train"]}
        differs = [f"{kind}.{k}" for kind in have for k, v in (e.get(kind) or {}).items() if have[kind].get(k) != v]
        if differs:
            log.warning("%s: the published %s row of '%s' on '%s' needs %s as it states; this run differs: left out",
                        source, e["table"], run["name"], run["backbone"], ", ".join(differs))
            continue
        out[e["table"]] = e
    return out


def _check_results(path: Path, doc: Any, run: dict) -> dict:
    """An evaluation file's document, checked: a mapping, for this run (its ``run`` metadata), with
    a number for each task it lists (``tasks``); errors name the file."""
    if not isinstance(doc, dict):
        raise SentembError(f"{path}: expected a JSON object of results, not {type(doc).__name__}")
    meta = doc.get("run")
    if isinstance(meta, dict):
        got = (meta.get("name"), meta.get("backbone"), str(meta.get("seed")))
        want = (run["name"], run["backbone"], str(run["seed"]))
        if got != want:
            raise SentembError(f"{path}: results of run {got[0]} on {got[1]}, seed {got[2]}, not of this run "
                               f"({want[0]} on {want[1]}, seed {want[2]})")
    tasks = doc.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        raise SentembError(f"{path}: no list of evaluated tasks ('tasks')")
    for t in tasks:
        if not isinstance(doc.get(t), (int, float)) or isinstance(doc.get(t), bool):
            raise SentembError(f"{path}: task '{t}' has no numeric result ({doc.get(t)!r})")
    return doc


def read_run_dir(run_dir: str | Path, *, paper_results: str | Path | None = None, datasets: Sequence[str] = (),
                 sts: str | Path | None = None, transfer: str | Path | None = None) -> CardInputs:
    """A run directory's card inputs: ``run_config.json``, ``train.json``, ``model/`` (required),
    ``eval_sts.json`` / ``eval_transfer.json`` (default: those in the directory, when present and
    not older than ``train.json``), the published rows of ``paper_results``."""
    run_dir = Path(run_dir)
    run_file, train_file, model_dir = run_dir / "run_config.json", run_dir / "train.json", run_dir / "model"
    for p in (run_file, train_file):
        if not p.is_file():
            raise SentembError(f"{p} not found: `sentemb model-card` writes the card of a trained run")
    if not model_dir.is_dir():
        raise SentembError(f"{model_dir} not found: the run has no exported model")
    run = read_json(run_file, "the resolved run")
    missing = [k for k in ("name", "method", "backbone", "seed") if not isinstance(run, dict) or k not in run]
    if missing:
        raise SentembError(f"{run_file}: not a resolved run (lacks {missing})")
    try:
        run = resolved_run(run)
    except (SentembError, TypeError) as e:
        raise SentembError(f"{run_file}: not a resolved run ({e})") from None
    train = read_json(train_file, "the training summary")
    if not isinstance(train, dict):
        raise SentembError(f"{train_file}: expected a JSON object, not {type(train).__name__}")
    trained_at = train_file.stat().st_mtime
    results = {}
    for kind, given, default in (("sts", sts, "eval_sts.json"), ("transfer", transfer, "eval_transfer.json")):
        path = Path(given) if given else run_dir / default
        if not path.is_file():
            if given:
                raise SentembError(f"{path} not found")
            continue
        if path.stat().st_mtime < trained_at:
            log.warning("%s is older than %s: results of an earlier model of this run, left out of the card",
                        path, train_file)
            continue
        results[kind] = _check_results(path, read_json(path, "results"), run)
    published = {}
    if paper_results:
        from .paper import load_paper_results

        published = published_for(load_paper_results(paper_results), run, str(paper_results))
    return CardInputs(run=run, model_dir=model_dir, train=train, sts=results.get("sts"),
                      transfer=results.get("transfer"), published=published, datasets=list(datasets))


# ----------------------------------------------------------------------------------------- facts of the export
def _json_or_none(path: Path) -> Any:
    try:
        return json.loads(path.read_text("utf-8")) if path.is_file() else None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None


@dataclass
class ExportFacts:
    """What the exported directory itself says (no model is loaded)."""

    modules: list[dict]
    custom: list[str]  # module classes outside sentence-transformers (loading needs trust_remote_code)
    architecture: str  # the module listing, as SentenceTransformer's repr lays it out
    max_seq_length: int | None
    dim: int | None
    pooler: str | None
    meta: dict


def export_facts(model_dir: Path) -> ExportFacts:
    """Modules, custom module classes, maximum length, output dimension and pooler of an export."""
    modules = _json_or_none(model_dir / "modules.json")
    if not isinstance(modules, list) or not modules:
        raise SentembError(f"{model_dir / 'modules.json'}: missing or unreadable: not a sentence-transformers export")
    st = _json_or_none(model_dir / "sentence_bert_config.json") or {}
    hf = _json_or_none(model_dir / "config.json") or {}
    meta = _json_or_none(model_dir / "sentemb.json") or {}
    lines, dim = [], None
    for m in modules:
        cls = m.get("type", "?").rsplit(".", 1)[-1]
        if cls == "Transformer":
            module_config = {"max_seq_length": st.get("max_seq_length"),
                             "do_lower_case": st.get("do_lower_case", False),
                             "architecture": (hf.get("architectures") or [hf.get("model_type", "?")])[0]}
            dim = hf.get("hidden_size", dim)
        else:
            module_config = _json_or_none(model_dir / m.get("path", "") / "config.json") or {}
            dim = module_config.get("out_features", module_config.get("word_embedding_dimension", dim))
            if not m.get("type", "").startswith("sentence_transformers."):
                dim = None  # the custom module sets it
        lines.append(f"  ({m.get('idx', len(lines))}): {cls}({json.dumps(module_config)})")
    custom = [m["type"] for m in modules if not m.get("type", "").startswith("sentence_transformers.")]
    return ExportFacts(modules, custom, "SentenceTransformer(\n" + "\n".join(lines) + "\n)", st.get("max_seq_length"),
                       dim, meta.get("pooler"), meta)


def backbone_facts(run: dict) -> dict:
    """The backbone's Hub id, revision, weights digest, license and language: from the fetched
    directory (``sentemb_source.json``, its own ``README.md``), else ``KNOWN_BACKBONES``. A randomly
    initialised backbone (``random_init``) has no base model and no license."""
    hub_id = run.get("backbone_hub_id")
    model = Path(run["paths"]["model"])
    source = _json_or_none(model / "sentemb_source.json") if model.name else None
    out = {"hub_id": hub_id or (source or {}).get("hub_id"), "random_init": (source or {}).get("random_init"),
           "commit": (source or {}).get("commit"), "revision": (source or {}).get("revision"),
           "sha256": (source or {}).get("sha256"), "license": None, "language": None}
    if out["random_init"]:
        return out
    card = model / CARD if model.name else None
    if card is not None and card.is_file():
        from huggingface_hub import ModelCard

        try:
            data = ModelCard.load(card, ignore_metadata_errors=True).data
            out["license"], out["language"] = data.license, data.language
        except Exception as e:  # a malformed backbone card only costs the license line
            log.warning("%s: unreadable model card (%s); its license is not taken", card, e)
    known = KNOWN_BACKBONES.get(out["hub_id"] or "", {})
    out["license"] = out["license"] or known.get("license")
    out["language"] = out["language"] or known.get("language")
    if isinstance(out["language"], str):
        out["language"] = [out["language"]]
    return out


# ----------------------------------------------------------------------------------------- the card
def eval_results(inputs: CardInputs) -> list:
    """huggingface_hub ``EvalResult``s of the run's STS results (and transfer results when evaluated)."""
    from huggingface_hub import EvalResult

    out = []
    if inputs.sts:
        s = inputs.sts
        setting = s.get("setting", "all")
        args = {"protocol": "SentEval", "setting": setting, "pooler": s.get("pooler"),
                "data": Path(str(s.get("data_dir", ""))).name or None, "scale": METRIC_SCALE}
        for t in s["tasks"]:
            name = STS_NAMES.get(t, t)
            out.append(EvalResult(
                task_type="sentence-similarity", task_name="Semantic Textual Similarity",
                dataset_type=STS_HUB_DATASETS.get(t, f"SentEval/{t}"), dataset_name=f"{name} (SentEval)",
                dataset_split="test", metric_type=STS_METRIC, metric_value=float(s[t]),
                metric_name=f"Spearman correlation of cosine similarities x {METRIC_SCALE} (SentEval, '{setting}')",
                metric_config=f"senteval-{setting}", metric_args={k: v for k, v in args.items() if v is not None}))
    if inputs.transfer:
        tr = inputs.transfer
        proto = tr.get("protocol") or {}
        args = {"protocol": "SentEval", **{k: proto[k] for k in ("classifier", "kfold", "seed", "mrpc_features")
                                          if k in proto}, "pooler": tr.get("pooler"), "scale": METRIC_SCALE}
        for t in tr["tasks"]:
            common = dict(task_type="text-classification", task_name="SentEval transfer",
                          dataset_type=f"SentEval/{t}", dataset_name=f"{t} (SentEval)",
                          dataset_split=None if t in CV_TASKS else "test",
                          metric_config=f"senteval-{proto.get('classifier', 'transfer')}",
                          metric_args={k: v for k, v in args.items() if v is not None})
            out.append(EvalResult(metric_type=TRANSFER_METRIC, metric_value=float(tr[t]),
                                  metric_name=f"Accuracy x {METRIC_SCALE}"
                                              + (" (k-fold cross-validation)" if t in CV_TASKS else ""), **common))
            if t == "MRPC" and isinstance(tr.get("MRPC_F1"), (int, float)):
                out.append(EvalResult(metric_type="f1", metric_value=float(tr["MRPC_F1"]),
                                      metric_name=f"F1 x {METRIC_SCALE}", **common))
    return out


def _fmt(v: Any, nd: int = 2) -> str:
    return "" if v is None else (f"{v:.{nd}f}" if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v))


def _results_table(ours: dict, tasks: list[str], entry: dict | None, seed: Any, all_tasks: list[str],
                   names: dict | None = None) -> str:
    """| Task | this model | published |, with the mean over tasks as its last row (the published
    Avg only beside a mean over the same tasks: all of ``all_tasks``)."""
    names = names or {}
    pub = dict((entry or {}).get("scores", {}))
    if set(tasks) != set(all_tasks):
        pub.pop("Avg", None)
    rows = [f"| Task | This model (seed {seed}) |" + (" Published |" if entry else ""),
            "|---|---|" + ("---|" if entry else "")]
    for t in [*tasks, "avg"]:
        label = "Avg" if t == "avg" else names.get(t, t)
        if ours.get(t) is None:
            continue
        published = f" {_fmt(pub.get('Avg' if t == 'avg' else t))} |" if entry else ""
        rows.append(f"| {label} | {_fmt(ours[t])} |" + published)
    return "\n".join(rows)


def _training_log(summary: dict | None, published_dev: dict | None) -> str:
    """The dev evaluations of training (sentence-transformers' "Training Logs"), the kept one in bold;
    ``summary`` is train.json (a record of what happened, not settings)."""
    if not summary:
        return ""
    hist = [h for h in summary.get("history") or [] if h.get("dev_stsb") is not None]
    out = []
    if hist:
        best = summary.get("best_step")
        out += ["| Step | STS-B dev (Spearman x 100) |", "|---|---|"]
        for h in hist:
            b = "**" if h["step"] == best else ""
            out.append(f"| {b}{h['step']}{b} | {b}{_fmt(h['dev_stsb'])}{b} |")
        out.append("\n* The bold row is the kept checkpoint (the best STS-B dev score).")
        if published_dev:
            out.append(f"* Published STS-B dev score of this row: {_fmt(published_dev['scores'].get('STSBenchmark'))} "
                       f"({published_dev['source']}).")
    else:
        out.append(f"The final weights after {summary.get('steps', '?')} optimizer steps "
                   "(`train.model_selection: last`: no STS-B dev evaluation).")
    return "\n".join(out)


def _settings_json(run: dict) -> str:
    """The resolved run without what is machine-specific (paths, tracking)."""
    keep = {k: v for k, v in run.items() if k not in ("paths", "tracking", "experiment", "run_name")}
    return json.dumps(keep, indent=2, default=str)


TEMPLATE = """---
# For reference on model card metadata, see the spec: https://github.com/huggingface/hub-docs/blob/main/modelcard.md?plain=1
# Doc / guide: https://huggingface.co/docs/hub/model-cards
{{ card_data }}
---

# {{ model_name }}

This is a [sentence-transformers](https://www.SBERT.net) model {{ origin }}, trained with **{{ method.display }}**\
{% if method.title %} ("{{ method.title }}"){% endif %}, an unsupervised sentence-embedding method, \
on {{ corpus_text }}, \
by sentemb. It maps sentences to a {% if dim %}{{ dim }}-dimensional {% endif %}dense vector space; \
the cosine similarity of two vectors scores the semantic similarity of the sentences.

## Model Details

### Model Description
- **Model Type:** Sentence Transformer
- **Training Method:** {{ method_line }}
- **Base model:** {{ base_line }}
- **Maximum Sequence Length:** {{ max_seq_length if max_seq_length else "the backbone's" }} tokens\
{% if run.train and run.train.max_len %} (trained on sentences cut at {{ run.train.max_len }} tokens){% endif %}
- **Output Dimensionality:** {{ (dim ~ " dimensions") if dim else "set by the custom module " ~ custom_modules }}
- **Similarity Function:** Cosine Similarity
- **Pooling:** {{ pooling }}
- **Training Dataset:** {{ corpus_line }}
{% if language %}- **Language:** {{ language | join(", ") }}
{% endif %}{% if license %}- **License:** {{ license }} (the base model's)
{% endif %}- **Seed:** {{ run.seed }}

### Full Model Architecture

```
{{ architecture }}
```

## Usage

### Direct Usage (Sentence Transformers)

```bash
pip install -U sentence-transformers
```
{% if custom %}
This model's module {{ custom_modules }} is sentemb's code, not sentence-transformers': install sentemb \
(`pip install -e .` in its repository) and load the model with `trust_remote_code=True` \
(sentence-transformers 6 asks for it before it imports a module class from outside its own package, \
from a local directory too).
{% endif %}
```python
from sentence_transformers import SentenceTransformer

model = SentenceTransformer("{{ model_ref }}"{% if custom %}, trust_remote_code=True{% endif %})
sentences = ["A man is playing a guitar.", "A man plays music.", "The dog runs in the park."]
embeddings = model.encode(sentences)
print(embeddings.shape)  # (3, {{ dim if dim else "dim" }})
print(model.similarity(embeddings, embeddings))  # cosine similarities
```

### With sentemb

```bash
sentemb evaluate --model {{ model_ref }} --pooler {{ eval_pooler }} --data-dir SENTEVAL_ROOT --output eval_sts.json
```

## Evaluation
{% if not sts and not transfer %}
Not evaluated yet: this card was written when the model was exported. `sentemb model-card` (rule \
`model_card`) rewrites it with the results once the run's evaluation is done.
{% endif %}{% if sts %}
### Semantic Textual Similarity

Evaluated with `sentemb evaluate` under the SentEval protocol as SimCSE (Gao et al. 2021) uses it: \
Spearman correlation × 100 between the cosine similarity of the two sentences' embeddings and the gold \
score; STS12–16 in the "{{ sts.setting }}" setting{% if sts.setting == "all" %} (one correlation over \
each year's concatenated subsets){% endif %}, STS-B and SICK-R on their test splits; pooler \
`{{ sts.pooler }}`, data `{{ sts_data }}`.

{{ sts_table }}
{% if published.sts %}
Published: {{ published.sts.source }}.
{% endif %}{% endif %}{% if transfer %}
### Transfer Tasks

SentEval's transfer tasks with `sentemb evaluate-transfer`: accuracy × 100 of {{ transfer_protocol }}.

{{ transfer_table }}
{% if published.transfer %}
Published: {{ published.transfer.source }}.
{% endif %}{% endif %}
## Training Details

### Training Dataset

Trained on {{ corpus_line }}.

### Training Hyperparameters

The resolved run (`run_config.json`: every setting that defines this model; the method's arguments \
are documented in {{ method_page_url }}):

```json
{{ settings }}
```
{% if training_log %}
### Training Logs

{{ training_log }}
{% endif %}
### Provenance
{% for key, value in provenance %}- **{{ key }}:** {{ value }}
{% endfor %}
### Framework Versions
{% for key, value in versions %}- {{ key }}: {{ value }}
{% else %}Not recorded (a model trained before `train.json` recorded them).
{% endfor %}
## Citation

### BibTeX
{% for name, bibtex in citations %}
#### {{ name }}
```bibtex
{{ bibtex }}
```
{% endfor %}"""


def render(inputs: CardInputs) -> str:
    """The card's text (front matter + body); no file is read but the export's small JSON files,
    the method's page and the backbone's source record."""
    from huggingface_hub import ModelCard, ModelCardData

    run, trained = resolved_run(inputs.run), inputs.train or {}  # trained: train.json
    facts = export_facts(inputs.model_dir)
    backbone = backbone_facts(run)
    method = method_page(run["method"])
    simcse = method_page("simcse")
    prov = trained.get("provenance") or {}
    trained_on = prov.get("corpus") or {}
    corpus_name = trained_on.get("name") or run["corpus"] or Path(str(run["paths"]["corpus"])).stem
    hub = f" ([{inputs.datasets[0]}](https://huggingface.co/datasets/{inputs.datasets[0]}))" if inputs.datasets else ""
    corpus_text = (f"{trained_on['sentences']:,} sentences of the corpus `{corpus_name}`{hub}" if trained_on.get("sentences")
                   else f"the corpus `{corpus_name}`{hub}")
    corpus_line = corpus_text + (f", sha256 `{trained_on['sha256']}`" if trained_on.get("sha256") else ", digest not recorded")
    hub_id = backbone["hub_id"]
    base_model = None if backbone["random_init"] else hub_id
    if base_model:
        rev = backbone["commit"] or backbone["revision"]
        origin = f"finetuned from [{hub_id}](https://huggingface.co/{hub_id})"
        base_line = f"[{hub_id}](https://huggingface.co/{hub_id})" + (f" (revision `{rev}`)" if rev else "")
    elif backbone["random_init"]:
        origin = f"trained from a randomly initialised encoder with the tokenizer of {hub_id}"
        base_line = f"none: randomly initialised ({json.dumps(backbone['random_init'])}), tokenizer of {hub_id}"
    else:
        origin, base_line = f"trained from the backbone `{run['backbone']}`", f"`{run['backbone']}`"
    if run.get("method_module"):
        summary = plugin_summary(run)
        method_line = (f"`{run['method']}`, a plug-in method from `{run['method_module']}` (code "
                       f"digest `{run['method_digest'] or '?'}`)" + (f": {summary}" if summary else ""))
        page_url = f"the plug-in's file `{run['method_module']}`"
    else:
        method_line = (f"{method.display} (`{run['method']}`)" + (f", \"{method.title}\"" if method.title else "")
                       + (f"; see `{method.page}` in sentemb's repository" if method.page else ""))
        page_url = f"`{method.page}` in sentemb's repository" if method.page else "the method's module docstring"
    pooler = facts.pooler or "?"
    on = (f"a randomly initialised {backbone['random_init'].get('model_type', 'encoder')} (tokenizer of {hub_id})"
          if isinstance(backbone["random_init"], dict) else hub_id or run["backbone"])
    model_name = f"{method.display} on {on} (sentemb run {run['name']}, seed {run['seed']})"
    evals = eval_results(inputs)
    card_data = ModelCardData(
        language=backbone["language"], license=backbone["license"], library_name=LIBRARY_NAME,
        pipeline_tag=PIPELINE_TAG, tags=[*ST_TAGS, "sentemb", run["method"]], base_model=base_model,
        datasets=inputs.datasets or None,
        metrics=sorted({e.metric_type for e in evals}) or None, model_name=model_name, eval_results=evals or None)
    sts, tr = inputs.sts, inputs.transfer
    proto = (tr or {}).get("protocol") or {}
    citations = [(method.display, method.bibtex)] if method.bibtex and run["method"] != "simcse" else []
    citations += [(simcse.display, simcse.bibtex)] if simcse.bibtex else []
    provenance = [("Run", f"`{run['name']}` on `{run['backbone']}`, seed {run['seed']}"),
                  ("sentemb", f"{prov.get('sentemb', __version__)}, "
                              f"git commit `{prov.get('git_commit') or 'not recorded'}`"),
                  ("Training", (f"{trained.get('steps', '?')} optimizer steps on {trained.get('device', '?')} "
                                f"({trained.get('precision', '?')})") if trained else "not recorded"),
                  ("Corpus", corpus_line)]
    if facts.meta.get("mlflow_run_id"):
        provenance.append(("MLflow run",
                           f"`{facts.meta['mlflow_run_id']}` (experiment `{run['experiment']}`)"))
    if backbone["sha256"]:
        provenance.append(("Backbone weights", f"sha256 `{backbone['sha256']}`"))
    versions = sorted((prov.get("versions") or {}).items())
    card = ModelCard.from_template(
        card_data, template_str=TEMPLATE, model_name=model_name, origin=origin, method=method,
        method_line=method_line, base_line=base_line, corpus_text=corpus_text, corpus_line=corpus_line,
        dim=facts.dim, max_seq_length=facts.max_seq_length, architecture=facts.architecture,
        custom=bool(facts.custom), custom_modules=", ".join(f"`{c}`" for c in facts.custom),
        pooling=f"{POOLER_TEXT.get(pooler, pooler)} (sentemb pooler `{pooler}`)", eval_pooler=pooler,
        language=backbone["language"], license=backbone["license"], run=run,
        model_ref="path/to/model", sts=sts, transfer=tr, published=inputs.published,
        sts_data=Path(str((sts or {}).get("data_dir", ""))).name or "?",
        sts_table=_results_table(sts, sts["tasks"], inputs.published.get("sts"), run["seed"], TASKS, STS_NAMES)
        if sts else "",
        transfer_protocol=(proto.get("classifier_description") or proto.get("classifier", "SentEval's classifier"))
        + (f", {proto['kfold']}-fold cross-validation where a task has no test split" if proto.get("kfold") else "")
        + (f", seed {proto['seed']}" if "seed" in proto else ""),
        transfer_table=_results_table(tr, tr["tasks"], inputs.published.get("transfer"), run["seed"], TRANSFER_TASKS)
        if tr else "",
        training_log=_training_log(inputs.train, inputs.published.get("dev")), settings=_settings_json(run),
        method_page_url=page_url, provenance=provenance, versions=versions, citations=citations)
    return str(card).rstrip() + "\n"


def write_card(model_dir: str | Path, text: str) -> Path:
    """``text`` into ``model_dir/README.md``, atomically (a failure leaves the previous card whole)."""
    path = Path(model_dir) / CARD
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


# ----------------------------------------------------------------------------------------- the writers
def training_provenance(run: dict, sentences: int) -> dict:
    """What ``train.json`` records for the card (``provenance``): sentemb's version and git commit,
    the corpus trained on (name, path, sentences, sha256) and the framework versions of training."""
    from importlib.metadata import PackageNotFoundError, version

    from ..tracking.runs import git_commit

    run = resolved_run(run)
    corpus = run["paths"].get("corpus")
    versions = {}
    for pkg in ("torch", "transformers", "tokenizers", "sentence-transformers"):
        try:
            versions[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    import platform

    versions["python"] = platform.python_version()
    return {"sentemb": __version__, "git_commit": git_commit(),
            "corpus": {"name": run["corpus"] or (Path(corpus).stem if corpus else None), "path": corpus,
                       "sentences": sentences,
                       "sha256": sha256_file(corpus) if corpus and Path(corpus).is_file() else None},
            "versions": versions}


def write_export_card(model_dir: str | Path, run: dict, train: dict | None) -> Path | None:
    """The card without results, into a freshly exported ``model_dir`` (``sentemb train``). Only a
    sentence-transformers export (``modules.json``) gets one: a pretraining stage's directory is no
    sentence encoder."""
    model_dir = Path(model_dir)
    if not (model_dir / "modules.json").is_file():
        return None
    return write_card(model_dir, render(CardInputs(run=run, model_dir=model_dir, train=train)))


def write_run_card(run_dir: str | Path, *, paper_results: str | Path | None = None, datasets: Sequence[str] = (),
                   sts: str | Path | None = None, transfer: str | Path | None = None,
                   marker: str | Path | None = None) -> dict:
    """The run's card with its results into ``<run_dir>/model/README.md``; with ``marker``, a JSON
    record of what was written (the rule's output). Returns that record."""
    inputs = read_run_dir(run_dir, paper_results=paper_results, datasets=datasets, sts=sts, transfer=transfer)
    path = write_card(inputs.model_dir, render(inputs))
    record = {"card": str(path), "sha256": sha256_file(path),
              "results": {"sts": inputs.sts is not None, "transfer": inputs.transfer is not None},
              "published": sorted(inputs.published)}
    if marker:
        from ..utils import write_json

        write_json(marker, record)
    return record

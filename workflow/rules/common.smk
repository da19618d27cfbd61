# Config validation, shared names and input functions. Rules stay thin: they call `sentemb`.
import functools
import json
import os
import re
import shlex

from sentemb import POOLERS, SentembError
from sentemb.config.load import (EVAL_KINDS, baseline_transfer, baselines, eval_spec, jobs, resolve_run, run_inputs, tested, tracking_options,
                            transfer_runs, validate_config)
from sentemb.config.settings import Config
from sentemb.data.cache import verify_resources
from sentemb.data.fetch import mirror_dir
from sentemb.config.paths import Layout
from sentemb.config.settings import fingerprint, run_options
from sentemb.utils import expose_cli
from sentemb.ops.scheduler import coalesce_reevaluations
from sentemb.config.studies import study_inputs, study_spec
from sentemb.report.figures import FIGURES

try:
    # the error names the file(s) the config was read from (and --config overrides, if any, apply on top)
    _files = [str(f) for f in getattr(workflow, "configfiles", [])]
    validate_config(config, source=f"the Snakemake config ({', '.join(_files)})" if _files else "the Snakemake config")
    _mirror = mirror_dir(config)
except SentembError as e:
    raise WorkflowError(str(e))
# The typed tree of the validated config (sentemb.config.settings.Config): every default already filled in.
CFG = Config.of(config)
# Every path of the DAG (sentemb.config.paths); its methods' defaults are the wildcards: LAYOUT.model() is
# resources/models/{backbone}.
LAYOUT = Layout.of(CFG)

# Cached downloads damaged since they were verified (truncated weights, an edited STS file, a cut corpus) are
# moved aside here so that they are made again (sentemb.data.cache); in the main process only, not in every
# job; under -n only reported.
if workflow.is_main_process:
    # (Snakemake 9 knows -n at parse time by its output settings; its executor is not set up yet)
    verify_resources(CFG.resources_dir, dry_run=bool(getattr(getattr(workflow, "output_settings", None), "dryrun", False)))

# Rules call the `sentemb` CLI: find the one installed with this Snakemake's Python even when its
# virtual environment is not activated (a per-rule conda env, when used, still comes first).
expose_cli()

# Snakemake's scheduler starts one more once-a-second re-evaluation chain with every finished job while
# jobs wait for cores (--max-jobs-per-timespan); one pending timer instead (sentemb.ops.scheduler): the
# tiny test DAG went from 583 to 503 CPU-seconds with it.
coalesce_reevaluations()

# under results_dir: two configs with their own results_dir never write the same log (issue 39)
LOGS = os.path.join(CFG.results_dir, "logs")
MIRROR = str(_mirror) if _mirror else ""
RUNS = [(r.name, r.backbone) for r in CFG.runs]
# (name, backbone, seed) of every training job: runs[].seeds, else the global seeds (sentemb.config.load.jobs)
JOBS = jobs(CFG)
RUN_DIR = LAYOUT.run_dir()
TRACKING = CFG.tracking.enabled
TRACKING_MARKER = LAYOUT.tracking_marker(CFG.experiment)
TRACKING_OPTIONS = LAYOUT.tracking_options()
# Every job (train, evaluate) waits this long for an absent MLflow server, then queues (sentemb.tracking.runs)
if CFG.tracking.wait_s is not None:
    os.environ.update(SENTEMB_TRACKING_WAIT_S=str(CFG.tracking.wait_s))  # set here, read by jobs
EVAL_DATA = LAYOUT.eval_data(CFG.evaluation.data)
# Several local GPUs: GPU jobs claim one each (sentemb.ops.gpu_slots); empty on Slurm / one GPU.
GPU_ENV = f"SENTEMB_GPU_SLOTS={CFG.local_gpus} " if CFG.local_gpus else ""


@functools.lru_cache(maxsize=None)
def _resolved(name, backbone, seed):
    return resolve_run(CFG, name, backbone, seed)


def resolved(wildcards):
    """A training job's resolved settings (sentemb.config.load.resolve_run; a Run, read, never changed),
    worked out once per job: the DAG asks for them about eight times per job (the train rule's inputs,
    its resources, run_config, the card), which was most of the paper configuration's `snakemake -n`."""
    return _resolved(wildcards.name, wildcards.backbone, int(wildcards.seed))


def devices_of(wildcards):
    """train.devices of a training job: its processes, one GPU each (sentemb.train.distributed)."""
    return resolved(wildcards).train.devices


def pretrain_devices(wildcards):
    """train.devices of a pretraining stage: its processes, one GPU each (sentemb.train.distributed)."""
    from sentemb.train.pretrain import resolve_pretrain

    return resolve_pretrain(CFG, wildcards.method, wildcards.backbone).train.devices


def train_gpus(wildcards):
    """The GPUs a training job requests: job_resources.train.gpu per process × train.devices."""
    return res("train", "gpu") * devices_of(wildcards)


def train_gpu_env(wildcards):
    """GPU_ENV of a training job: with local_gpus, it claims train.devices slots at once."""
    if not CFG.local_gpus:
        return ""
    n = devices_of(wildcards)
    return GPU_ENV + (f"SENTEMB_JOB_GPUS={n} " if n > 1 else "")


wildcard_constraints:
    name="|".join(re.escape(n) for n in sorted({n for n, _ in RUNS})),  # a study's point: <study>/<key>=<value>
    backbone="|".join(sorted(CFG.backbones)),
    seed=r"\d+",
    corpus=r"[A-Za-z0-9_.-]+",
    pooler="|".join(POOLERS),
    kind="|".join(EVAL_KINDS),


# Scheduling order among jobs that are ready at the same time (Snakemake `priority:`; higher first):
# the instant bookkeeping and input jobs (settings files, fetches from the mirror), then what gates
# training (the token cache and statistics, paraphrases, a pretraining stage), then training, the
# trained runs' STS evaluations, the untrained baselines', the transfer encodings; everything else
# (the short jobs: classifiers, cards, tables) fills in. Long jobs first keeps every core busy to the
# end (the order changes no result). Snakemake does not pass a job's priority on to the jobs it
# needs, so a rule upstream of a prioritised one must rank at least as high, or it waits until
# nothing else is ready (a run's run_config.json would hold its training back to the end).
PRIORITY = {"setup": 100, "stats": 50, "pretrain": 50, "train": 40, "evaluate": 30, "evaluate_baseline": 20,
            "encode": 10}


def shell_options(**options):
    """Shell-quoted CLI options for the values that are set (dicts as JSON):
    ``shell_options(sha256="ab", max_sentences=None)`` is ``"--sha256 ab"``."""
    return " ".join(
        f"--{key.replace('_', '-')} {shlex.quote(json.dumps(value) if isinstance(value, dict) else str(value))}"
        for key, value in options.items()
        if value not in (None, "")
    )


def res(kind, key):
    """Snakemake resources of a rule kind (config key job_resources.<kind>; every key has its
    default, sentemb.config.settings.JobResources)."""
    return getattr(getattr(CFG.job_resources, kind), key)


def run_of(wildcards):
    return resolved(wildcards).to_dict()


def method_inputs(wildcards):
    """Every input the run's method declares (Method.requires(args)), from the same package
    function that writes them into the run config (sentemb.config.load.run_inputs)."""
    return run_inputs(CFG, wildcards.name, wildcards.backbone)


# runs with test-set evaluation (runs[].evaluate: false = dev only, e.g. a cheap study's points)
TESTED = tested(CFG)


def eval_outputs():
    return [f"{LAYOUT.run_dir(n, b, s)}/eval_sts.json" for n, b, s in JOBS if (n, b) in TESTED]


# --- report end of the DAG (issue 12): transfer tasks, untrained baselines, paper table, figures
# runs with transfer tasks: runs[].transfer, else evaluation.transfer
TRANSFER_RUNS = transfer_runs(CFG)
TRANSFER = bool(TRANSFER_RUNS)  # a transfer table
BASELINE_TRANSFER = baseline_transfer(CFG)  # with the baselines' rows (sentemb.config.load.baseline_transfer)
# (backbone, pooler) of every untrained baseline (config `baselines`)
BASELINES = baselines(CFG)
BASE_DIR = LAYOUT.baseline_dir()
PAPER_RESULTS = CFG.paper_results or os.path.join(workflow.basedir, "config", "paper_results.yaml")
if not os.path.isfile(PAPER_RESULTS):  # else Snakemake's MissingInputException, in a rule, with no key named
    raise WorkflowError(f"config key 'paper_results': {PAPER_RESULTS} not found")
# what the tables, studies and model cards read: paper_results, plus the config's own published rows
# (config key `published`, a plug-in's paper) merged into <results_dir>/published.yaml by rule `published`
PUBLISHED = os.path.join(CFG.results_dir, "published.yaml") if CFG.published else PAPER_RESULTS


def baseline_outputs(kind="sts"):
    return [f"{LAYOUT.baseline_dir(b, p)}/eval_{kind}.json" for b, p in BASELINES]


def transfer_outputs():
    """Transfer results of the runs that have them and, unless evaluation.baseline_transfer is false, of
    every baseline (none without any run's)."""
    runs = [f"{LAYOUT.run_dir(n, b, s)}/eval_transfer.json" for n, b, s in JOBS if (n, b) in TRANSFER_RUNS]
    return runs + (baseline_outputs("transfer") if BASELINE_TRANSFER else [])


def train_summaries():
    return [f"{LAYOUT.run_dir(n, b, s)}/train.json" for n, b, s in JOBS]


# Studies (sentemb.config.studies, sentemb.report.studies): results/studies/<name>.csv/.md/.png/.svg/.pdf; their points are ordinary runs
STUDIES = {s["name"]: s for s in config["studies"]}
STUDY_TARGETS = [LAYOUT.study(n, ext) for n in STUDIES for ext in ("csv", "md", "png", "svg", "pdf")]


wildcard_constraints:
    study="|".join(re.escape(n) for n in sorted(STUDIES)) or "(?!)",


REPORT_TARGETS = (
    STUDY_TARGETS
    + [LAYOUT.table("table_paper", "csv"), LAYOUT.table("table_paper", "md")]
    + [LAYOUT.figure(f, ext) for f in FIGURES for ext in ("png", "svg", "pdf")]
    + ([LAYOUT.table("table_transfer", "csv"), LAYOUT.table("table_transfer", "md")] if TRANSFER else [])
)


# --- model cards (issue 29 §1; rule model_card in cards.smk)
def card_evaluations(wildcards):
    """What the card reports: eval_sts.json (runs evaluated on the test sets) and eval_transfer.json
    (runs with transfer tasks); nothing for a dev-only run (runs[].evaluate: false)."""
    key = (wildcards.name, wildcards.backbone)
    return ([f"{RUN_DIR}/eval_sts.json"] if key in TESTED else []) + (
        [f"{RUN_DIR}/eval_transfer.json"] if key in TRANSFER_RUNS else [])


def card_dataset(wildcards):
    """`--dataset HUB_ID` when the run trains on the configured corpus (config corpus.hub_repo);
    nothing for a corpus the pipeline builds itself (sts-unlabeled)."""
    corpus = resolved(wildcards).corpus
    return shell_options(dataset=CFG.corpus.hub_repo if corpus == CFG.corpus.name else None)


def card_outputs():
    return [f"{LAYOUT.run_dir(n, b, s)}/model_card.json" for n, b, s in JOBS]

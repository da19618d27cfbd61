"""Shared fixtures. Real data lives in ../shared (override with SENTEMB_SHARED)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# `sentemb plan` (the CLI) keeps its counts in the user's cache folder: not the suite's (tests/test_plan.py
# sets a store of its own where it tests one)
os.environ["SENTEMB_PLAN_CACHE"] = "none"


def shared_dir() -> Path | None:
    p = Path(os.environ.get("SENTEMB_SHARED", REPO.parent / "shared"))
    return p if (p / "data").is_dir() else None


SHARED = shared_dir()
SKIP_REASON = (
    f"real data not found: set SENTEMB_SHARED or place the shared/ folder beside the repository "
    f"(looked in {os.environ.get('SENTEMB_SHARED', REPO.parent / 'shared')})"
)


#: the environment variables of the thread pools a test process and its subprocesses start (torch's
#: OpenMP, numpy's OpenBLAS, MKL, the Rust tokenizers' Rayon pool)
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS")


def worker_threads() -> int | None:
    """Under pytest-xdist, each worker's share of the cores (at least 1); None in a single process.

    Two workers on two cores each running torch (and OpenBLAS) at its default of one thread per core
    put four spinning threads on two cores: on the 2-core machine that made the same work cost 3-8x
    the CPU (``sentemb gpu-check --cpu``: 237 s -> 74 s of CPU with one thread per worker)."""
    n = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not n:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // int(n))


def share_the_cores() -> None:
    """Limit this worker's thread pools to ``worker_threads()``, and its subprocesses' (the variables
    are set where the environment does not already set them: an explicit OMP_NUM_THREADS wins).
    Snakemake sets its jobs' own (a rule's ``threads``)."""
    n = worker_threads()
    if n is None:
        return
    for var in THREAD_VARS:
        os.environ.setdefault(var, str(n))
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    threadpool_limits(int(os.environ["OPENBLAS_NUM_THREADS"]), user_api="blas")


def pytest_configure(config):
    # realdata tests skip where ../shared is absent, but must always run in CI.
    if os.environ.get("CI") and SHARED is None:
        raise pytest.UsageError(f"CI is set but the real data is missing: {SKIP_REASON}")
    share_the_cores()


#: The test files that take longest, longest first: they are handed out first (``--dist loadfile``
#: with ``--no-loadscope-reorder``, pyproject.toml), so that the workers finish together; the
#: rest follow in collection order. xdist's default order (most tests first) left the one-test
#: DAG files and the tiny DAG (a file of 15 tests) to the end of the run, one worker busy for
#: minutes after the other had finished. (Three workers on the two cores, to use the core that the
#: waiting tests leave idle, took longer: 2026-11-30, 22 min 10 s against 20 min 23 s.)
LONGEST_FIRST = (
    "test_workflow.py",
    "test_fault_matrix.py",
    "test_tracking_dag.py",
    "test_gpucheck.py",
    "test_slurm.py",
    "test_real_shapes.py",
    "test_transfer.py",
    "test_graphs.py",
    "test_method_contract.py",
    "test_code_parity.py",
    "test_stateful.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's order is kept
    if SHARED is not None:
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if "realdata" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shared() -> Path:
    if SHARED is None:
        pytest.skip(SKIP_REASON)
    return SHARED


@pytest.fixture(scope="session")
def minilm_dir(shared) -> Path:
    return shared / "models" / "all-MiniLM-L6-v2"


def simcse_dag_config(dest: Path) -> Path:
    """``.test/config.yaml`` reduced to one SimCSE run at one seed, STS-B and SICK-R, no study, baseline,
    transfer or statistics beyond what training reads: the DAG of the tests that check the DAG's
    machinery rather than the methods (the tracked DAG, the fault matrix, Slurm). Written to
    ``dest/config.yaml``; returns ``dest``."""
    import yaml

    from sentemb.testing import simcse_dag_config as reduced

    cfg = reduced(REPO / ".test" / "config.yaml")
    assert cfg["runs"] == [{"method": "simcse", "backbone": "tiny-bert"}]
    cfg.pop("stats", None)  # no statistics beyond what training reads
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return dest


@pytest.fixture(scope="session")
def simcse_dag_inputs(tmp_path_factory, shared) -> Path:
    """The inputs of ``simcse_dag_config``'s DAG (``resources/``: model, corpus, SentEval;
    ``results/stats/``: the token cache), made once for the whole suite by ``snakemake --omit-from
    train`` and shared by the xdist workers (a lock in their common temporary folder): each test copies
    them into its own DAGs (``sentemb.testing.copy_dag_inputs``), as a rerun finds them, so that only
    training, evaluation and the tables run there. The SimCSE-only DAG's configs differ from this one
    in settings that make no input (tasks, train settings, ``devices``)."""
    import fcntl
    import subprocess
    import sys

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the workers' common folder
    d = root / "simcse_dag_inputs"
    with open(root / "simcse_dag_inputs.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (d / ".done").is_file():
            import shutil

            shutil.rmtree(d, ignore_errors=True)
            simcse_dag_config(d)
            env = {**os.environ, "SENTEMB_MIRROR": str(shared), "MLFLOW_TRACKING_URI": ""}
            p = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(d),
                                f"--configfile={d / 'config.yaml'}", "--cores", "2", "--omit-from", "train",
                                "results/table1.csv"], env=env, capture_output=True, text=True, timeout=900)
            assert p.returncode == 0, f"the SimCSE DAG's inputs:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
            (d / ".done").touch()
    return d


# The tiny world of the method contract (``sentemb.testing``), so unit tests need nothing from ../shared.
from sentemb.testing import TINY_WORDS, tiny_run, tiny_train  # noqa: E402,F401  (re-exported for the tests)


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    """A randomly initialised 2-layer BERT (hidden 32) with a tiny WordPiece vocabulary, saved in HF
    layout (``sentemb.testing.tiny_encoder_dir``)."""
    from sentemb.testing import tiny_encoder_dir

    return tiny_encoder_dir(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="session")
def tiny_roberta_dir(tmp_path_factory):
    """A random 2-layer RoBERTa (hidden 32) with a byte-level BPE of single bytes (<s> 0, <pad> 1, </s> 2)."""
    import torch
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import RobertaConfig, RobertaModel, RobertaTokenizerFast

    d = tmp_path_factory.mktemp("tiny_roberta")
    vocab = {t: i for i, t in enumerate(["<s>", "<pad>", "</s>", "<unk>"] + sorted(ByteLevel.alphabet()) + ["<mask>"])}
    tok = RobertaTokenizerFast(vocab=vocab, merges=[])
    tok.save_pretrained(d)
    torch.manual_seed(0)
    RobertaModel(RobertaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=64, max_position_embeddings=80, pad_token_id=1, bos_token_id=0,
                               eos_token_id=2)).save_pretrained(d)
    return d


def simcse_run(model, corpus, senteval, **train_over):
    """A resolved SimCSE run on the tiny model (``tiny_run``), seed 7."""
    return tiny_run(model, corpus, senteval, "simcse", **train_over)


def mlm_checkpoint(model_dir: Path, dest: Path, legacy: bool = False, seed: int = 1):
    """A random BertForMaskedLM of ``model_dir``'s shape saved to ``dest`` (its MLM head's bias,
    dense weight and LayerNorm made non-trivial), and the model itself in eval mode; ``legacy``: its
    file then renamed the way Google's BERT checkpoints on the Hub name their tensors
    (``LayerNorm.gamma`` / ``LayerNorm.beta``)."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file
    from transformers import BertConfig, BertForMaskedLM

    shutil.copytree(model_dir, dest)
    torch.manual_seed(seed)
    ref = BertForMaskedLM(BertConfig.from_pretrained(dest))
    with torch.no_grad():
        p = ref.cls.predictions
        for t in (p.bias, p.transform.dense.weight, p.transform.LayerNorm.weight):
            t.normal_()
    ref.save_pretrained(dest)
    if legacy:
        f = dest / "model.safetensors"
        state = load_file(str(f))
        old = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
               for k, v in state.items()}
        assert "cls.predictions.transform.LayerNorm.gamma" in old
        save_file(old, str(f), metadata={"format": "pt"})
    return dest, ref.eval()


def assert_same_model(a: Path, b: Path) -> None:
    """Every tensor of the exported model in ``a`` equals the one in ``b``, bit for bit."""
    import torch
    from safetensors.torch import load_file

    files = sorted(Path(a).rglob("*.safetensors"))
    assert files, f"no weights in {a}"
    for f in files:
        x, y = load_file(f), load_file(Path(b) / f.relative_to(a))
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), f"{f.relative_to(a)} differs"


def write_tiny_senteval(root: Path, n: int = 12) -> Path:
    """A SentEval-shaped tree with ``n`` scored pairs per file from the tiny vocabulary."""
    from sentemb.testing import tiny_senteval

    return tiny_senteval(root, n)


@pytest.fixture(scope="session")
def tiny_senteval(tmp_path_factory) -> Path:
    return write_tiny_senteval(tmp_path_factory.mktemp("senteval"))


@pytest.fixture
def tiny_corpus(tmp_path) -> Path:
    import random

    rng = random.Random(1)
    p = tmp_path / "corpus.txt"
    p.write_text("".join(" ".join(rng.choice(TINY_WORDS) for _ in range(rng.randint(4, 12))) + "\n" for _ in range(96)))
    return p

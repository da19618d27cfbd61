"""Shared fixtures. Real data lives in ../shared (override with SENTEMB_SHARED)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def shared_dir() -> Path | None:
    p = Path(os.environ.get("SENTEMB_SHARED", REPO.parent / "shared"))
    return p if (p / "data").is_dir() else None


SHARED = shared_dir()
SKIP_REASON = (
    f"real data not found: set SENTEMB_SHARED or place the shared/ folder beside the repository "
    f"(looked in {os.environ.get('SENTEMB_SHARED', REPO.parent / 'shared')})"
)


def pytest_configure(config):
    # realdata tests skip where ../shared is absent, but must always run in CI.
    if os.environ.get("CI") and SHARED is None:
        raise pytest.UsageError(f"CI is set but the real data is missing: {SKIP_REASON}")


def pytest_collection_modifyitems(config, items):
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


# A small WordPiece vocabulary, so unit tests need nothing from ../shared.
TINY_WORDS = (
    "the a an of and to in is was for on that with as by it at from his her he she they "
    "man woman dog cat plays playing guitar piano car red blue big small runs running is are "
    "sits sitting on mat park street city house tree sky sun water eats food apple music "
    "one two three new old good bad very not no yes this these there here what who"
).split()


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    """A randomly initialised 2-layer BERT (hidden 32) with a tiny WordPiece vocabulary, saved in HF layout."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    d = tmp_path_factory.mktemp("tiny_bert")
    chars = [c for c in "abcdefghijklmnopqrstuvwxyz.,'" if c not in TINY_WORDS]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(TINY_WORDS)) + chars
    vocab += [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"]
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = BertTokenizerFast(vocab=str(d / "vocab.txt"), do_lower_case=True)  # transformers 5: `vocab=`
    assert tok("the dog")["input_ids"][1:-1] == [vocab.index("the"), vocab.index("dog")]
    tok.save_pretrained(d)
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64,
    )
    BertModel(cfg).save_pretrained(d)
    return d


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


def tiny_train(**over):
    """The tests' train settings (``sentemb.settings.TrainSettings``): batch 16, max_len 16, lr 1e-3,
    STS-B dev every 2 steps, every step logged, on CPU; ``over`` replaces any of them."""
    import dataclasses

    from sentemb.settings import TrainSettings

    base = TrainSettings(batch_size=16, max_len=16, lr=1e-3, eval_steps=2, log_steps=1, save_steps=100, device="cpu")
    return dataclasses.replace(base, **over)


def tiny_run(model, corpus, senteval=None, method="simcse", *, seed=7, method_args=None, inputs=None, name=None,
             **train_over):
    """A resolved run (``sentemb.settings.Run``) of ``method`` on the tiny model (``tiny_train``
    settings, ``train_over`` replacing some), no MLflow; ``inputs``: the method's inputs by name."""
    from sentemb.methods import get_method
    from sentemb.settings import Run

    return Run(name=name or method, method=method, backbone="tiny", seed=seed, train=tiny_train(**train_over),
               method_args=get_method(method).resolve_args(method_args or {}), experiment="t",
               tracking={"enabled": False, "uri": None},
               paths={"model": str(model), "corpus": str(corpus), "senteval": str(senteval) if senteval else None,
                      "stats": None, "inputs": {k: str(v) for k, v in (inputs or {}).items()}})


def simcse_run(model, corpus, senteval, **train_over):
    """A resolved SimCSE run on the tiny model (``tiny_run``), seed 7."""
    return tiny_run(model, corpus, senteval, "simcse", **train_over)


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
    import random

    from sentemb.senteval import STS_SUBSETS

    rng = random.Random(0)
    words = TINY_WORDS

    def sent():
        return " ".join(rng.choice(words) for _ in range(rng.randint(3, 9)))

    def rows():
        return [(sent(), sent(), f"{rng.uniform(0, 5):.2f}") for _ in range(n)]

    for task, subsets in STS_SUBSETS.items():
        d = root / "STS" / f"{task}-en-test"
        d.mkdir(parents=True, exist_ok=True)
        for sub in subsets:
            r = rows()
            (d / f"STS.input.{sub}.txt").write_text("".join(f"{a}\t{b}\n" for a, b, _ in r))
            (d / f"STS.gs.{sub}.txt").write_text("".join(f"{g}\n" for *_, g in r))
    d = root / "STS" / "STSBenchmark"
    d.mkdir(parents=True, exist_ok=True)
    for split in ("train", "dev", "test"):
        (d / f"sts-{split}.csv").write_text(
            "".join(f"main-captions\tMSRvid\t2012test\t{i:04d}\t{g}\t{a}\t{b}\n" for i, (a, b, g) in enumerate(rows())))
    d = root / "SICK"
    d.mkdir(parents=True, exist_ok=True)
    for fname in ("SICK_train.txt", "SICK_trial.txt", "SICK_test_annotated.txt"):
        (d / fname).write_text("pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n" + "".join(
            f"{i}\t{a}\t{b}\t{g}\tNEUTRAL\n" for i, (a, b, g) in enumerate(rows())))
    return root


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

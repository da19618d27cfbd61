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
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(TINY_WORDS))
    vocab += [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"] + list("abcdefghijklmnopqrstuvwxyz.,'")
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = BertTokenizerFast(vocab_file=str(d / "vocab.txt"), do_lower_case=True)
    tok.save_pretrained(d)
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64,
    )
    BertModel(cfg).save_pretrained(d)
    return d

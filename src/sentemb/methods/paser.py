"""PaSeR: phrase reconstruction for sentence embeddings (seed paper 001; the method spec §2, issue 10).

Per corpus sentence s (line ``l`` of the corpus; its RAKE phrases are row ``l`` of the statistics
stage's ``rake_top<K>.parquet``, of which the top ``top_k`` are used):

1. **Phrase masking.** In a duplicate s̃ every word of each chosen phrase becomes one mask token
   (``mask_phrases``).
2. **EDA** (Wei & Zou 2019) on s and on s̃, independently: synonym replacement with WordNet
   (ratio 0.5, the authors' code README), or random swap / random deletion (ablations, Table 4).
   Mask tokens are never replaced, swapped or deleted.
3. **Decoding signal** (paper §3, "decoding signal"): with E_s = [CLS](Enc(s)) and
   E_s̃ = [CLS](Enc(s̃)) (no MLP, also at test time),
   ``signal = [E_s, E_s̃, m·|E_s − E_s̃|, n·|E_s ⊙ E_s̃|]`` (``decoding_signal``), a memory of 4 vectors
   (no positions), m = n = 10. The authors' code (``paser-code`` run): no absolute values and E_s̃
   passed through a trainable Linear(h, h) first, m = n = 1.
4. **Generation** (paper Eq. for L_gen): a randomly initialised 6-layer transformer decoder (FFN 768,
   16 heads; from the code, the paper is silent) cross-attends to the signal; its input and output
   word embeddings are the encoder's (one parameter; §4.2 "the word embedding layer is shared
   between the sentence encoder and the generative decoder"). Teacher forcing;
   ``L_gen = −(1/T) Σ_i log P(t_i | t_<i, signal)`` over the T target tokens of the batch.
   ``decoder_output: mlm_head`` (``paser-code``): the decoder's states go through the MLM head of
   step 5 instead, as the authors' code's ``cls.lm_head(decoder_outputs[0])``.
5. **MLM** (§3.2.4, Eq. 4) on s (15%, 80/10/10, BERT's recipe) with the backbone's pretrained MLM
   head (``cls.predictions.*`` of the checkpoint; randomly initialised and logged as a warning when
   the checkpoint has none, e.g. all-MiniLM-L6-v2). ``L = L_MLM + L_gen``; no contrastive term.
   Its output matrix is the encoder's word embeddings (BERT's tying, ``mlm_head_tied: true``) or
   its own trainable copy (``false``, the code: see below).

Logged terms: ``loss``, ``mlm``, ``gen``, ``phrases`` (number T of target tokens in the batch).

Where sentemb's default (the paper, or the method's behaviour where the paper is silent) differs from
the authors' code (chengzhipanpan/PaSeR @877ac00), a switch takes the code's value (``paser-code``;
table in docs/methods/paser.md): ``decoder_embeddings: encoder`` (their ``cl_init`` hands BART's
decoder BERT's whole embedding module as ``embed_tokens``), ``decoder_dropout_layout: bart``,
``decoder_ffn: null`` (the encoder's hidden size), ``masked_linear_init: normal``,
``target_truncation: sentence``, ``target_cut: tokens``.

Open choices (the paper and code leave them open; taken here, switches where cheap):

* **Order of masking and EDA:** masking first, on the original sentence (where RAKE's words align),
  then EDA on s and on s̃ separately with independent random draws; EDA skips mask tokens, so the
  targets are the original phrase words even where EDA changed other words.
* **Target for k > 1 phrases:** the masked phrases in RAKE rank order (best first), each phrase's
  subword tokens followed by the tokenizer's [SEP] (separator and end token), after a [CLS] start
  token: ``[CLS] p1 [SEP] p2 [SEP] p3 [SEP]``; the decoder reads all but the last token and predicts
  all but the first, so separators/end count among the T target tokens (``phrases``).
* **A phrase that occurs twice** in the sentence: its first occurrence whose words are not yet
  masked is masked (a phrase RAKE lists twice masks two occurrences and is a target twice).
* **Alignment:** RAKE's phrases are lowercased ``wordpunct_tokenize`` words; the sentence is split
  the same way (regex ``\\w+|[^\\w\\s]+``) with character spans, words are compared lowercased and
  each matched word's characters become one mask token (surrounded by spaces). A phrase whose
  words do not occur contiguously is skipped. Subword alignment follows from the tokenizer: the
  mask token is a special token (one id per word); the target is the tokenization of the phrase's
  words as written in the sentence.
* **Cut off by ``max_len`` (32):** a phrase any of whose mask tokens falls beyond the truncated s̃
  is dropped from the target (its surviving masks stay in s̃). The target is capped at
  ``max_target_len`` tokens by dropping whole trailing phrases (``target_cut: phrases``), or, as
  the code's tokenizer truncates its target column, cut mid-phrase after ``max_target_len`` − 1
  tokens and ended with [SEP] (``target_cut: tokens``; the same as truncating the tokenization of
  "p1 [SEP] p2 [SEP] … pk" at ``max_target_len``).
* **EDA details:** words are whitespace-separated tokens of the (already tokenized) sentence;
  EDA's character cleaning (``eda_clean``): none (the default), or ``eda``, EDA's ``get_only_chars``
  (``eda_only_chars``) on every word but the mask tokens, which EDA's ``eda()`` applies to its input
  and outputs (whether the authors' CSV was made by ``eda()`` or by its ``synonym_replacement`` alone
  is not known; docs/methods/paser.md); stopwords (``eda_stopwords``) are NLTK's English list (179 words, the
  default) or EDA's own (``eda``: 127 words, NLTK's list before its 2018 revision added the
  contractions and their pieces; ``eda_stopword_list``). 11 of the 52 extra words, contractions'
  pieces such as "isn", "won", "re", have WordNet synonyms: EDA replaces them, the NLTK list never
  does; 395 of the 30,840 unique STS lines hold one;
  WordNet synonyms are sorted before the random choice (deterministic across processes);
  n = max(1, int(ratio · #unmasked words)) replacements/swaps; deletion probability = ratio.
* **When EDA draws** (``eda_draw``): ``step`` (default; the paper is silent) draws from the
  micro-batch's generator, so a sentence seen in five epochs gets five augmentations; ``once``
  draws from the line's own generator (seed, line), so s and s̃ are augmented alike in every epoch,
  as the authors' code, which applies EDA offline to its training CSV (its README), reads them.
* **MLM input:** s after EDA, in its own forward pass (as SimCSE's auxiliary MLM), so E_s is
  computed from the uncorrupted s.
* **Bucketed widths** (``train.buckets``): [s; s̃] are padded to a bucket of their longest row
  (``Method.pad_rows``) and the decoder rows to a bucket of theirs, which may pass ``max_len`` up
  to ``max_target_len`` (the decoder's positions; widths grow in half-octaves past the last bucket,
  and a bucket above ``max_target_len`` is cut to it: ``Method.width(n, limit)``); padded decoder positions are attention 0 and label −100. The MLM
  masks are drawn over the real width of [s; s̃] (``mask_tokens(width=)``), so a batch is masked
  alike with and without buckets and every logged term is unchanged (``tests/test_buckets.py``).
  The number of decoder rows (sentences with a surviving phrase) varies per batch.
* **Small backbones:** the decoder's width is the encoder's hidden size h (it shares the word
  embeddings); ``decoder_heads`` must divide h (16 does for 768, 384 and 32), otherwise a config
  error names ``decoder_heads``.
* Sentences without phrases keep s̃ = s (encoded, no target): they add no L_gen; a batch without
  any target gives L_gen = 0.
* **k** (``top_k``, default 5): Table 5's RAKE top-5 row (77.7 / 79.3 / 65.4 on STS12–16 avg /
  STS-B / SICK-R) is the full model of Tables 4, 8 and 9 and the closest to Table 1 (77.72 / 79.19 /
  65.31); top 3 (77.8 / 79.4 / 64.4) is a study point (Table 5 bolds it on two columns).
* **The decoder's vocabulary projection** (``decoder_output``): the paper shares only the word
  embedding layer and says nothing of the output layer; ``embeddings`` (default) ties it to that
  layer, as BART does. The authors' code (``paser/models.py``, ``cl_forward``) computes
  ``cls.lm_head(decoder_outputs[0])`` — the same ``BertLMPredictionHead`` (transform: dense, GELU,
  LayerNorm; then vocabulary matrix + bias) that its MLM loss uses, loaded with
  ``--do_mlm`` from ``BertForPreTraining``'s ``cls.predictions`` (``train.py``:
  ``model.lm_head.load_state_dict(pretrained_model.cls.predictions.state_dict())``), trainable,
  and *not* tied to the input embeddings (``BertForCL`` defines no output embeddings, so
  ``tie_weights`` leaves ``lm_head.decoder`` as its own Linear, a copy of the pretrained matrix).
  ``decoder_output: mlm_head`` with ``mlm_head_tied: false`` is that form (``paser-code``); with
  ``mlm_head_tied: true`` the head's matrix stays the word embeddings.
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .. import SentembError
from ..model.backbone import MLMHead, mlm_head_state, read_weights
from .base import WEIGHTED, Encoded, Method, arg, slice_rows
from .registry import register_method

log = logging.getLogger(__name__)

#: nltk.tokenize.wordpunct_tokenize's pattern (rake-nltk's default word tokenizer)
WORD_RE = re.compile(r"\w+|[^\w\s]+")


# ----------------------------------------------------------------------------- phrase masking
class Masked(NamedTuple):
    """Result of ``mask_phrases``: the masked sentence, the phrases masked (in the given order,
    as written in the sentence) and, per masked phrase, its mask tokens' ordinals among all masks
    of the sentence (0 = first mask from the left)."""

    text: str
    phrases: list[str]
    mask_ordinals: list[list[int]]


def mask_phrases(sentence: str, phrases: Sequence[str], mask_token: str) -> Masked:
    """Replace every word of each phrase in ``phrases`` by one ``mask_token`` (methods.md §2,
    "mask the top k phrases in a duplicate s̃"). Words are ``wordpunct_tokenize`` words compared
    lowercased (RAKE's form); each phrase masks its first occurrence not yet masked; phrases not
    found are skipped (see the module docstring)."""
    spans = [(m.start(), m.end()) for m in WORD_RE.finditer(sentence)]
    words = [sentence[a:b].lower() for a, b in spans]
    masked = [False] * len(words)
    chosen: list[tuple[str, list[int]]] = []
    for phrase in phrases:
        pw = phrase.lower().split()
        if not pw:
            continue
        n = len(pw)
        for i in range(len(words) - n + 1):
            if words[i:i + n] == pw and not any(masked[i:i + n]):
                for j in range(i, i + n):
                    masked[j] = True
                chosen.append((" ".join(sentence[a:b] for a, b in spans[i:i + n]), list(range(i, i + n))))
                break
    if not chosen:
        return Masked(" ".join(sentence.split()), [], [])
    out, prev = [], 0
    for (a, b), m in zip(spans, masked):
        if m:
            out.append(sentence[prev:a])
            out.append(f" {mask_token} ")
            prev = b
    out.append(sentence[prev:])
    ordinal = {w: k for k, w in enumerate(j for j, m in enumerate(masked) if m)}
    return Masked(" ".join("".join(out).split()), [p for p, _ in chosen],
                  [[ordinal[j] for j in idx] for _, idx in chosen])


# ----------------------------------------------------------------------------- EDA
#: the stream key of ``eda_draw: once`` (seeds (seed, EDA_ONCE_STREAM, line): apart from the
#: micro-batch generators (seed, micro))
EDA_ONCE_STREAM = 0x6564

#: the pieces of contractions NLTK's English stopword list gained in its 2018 revision (with the
#: contractions themselves, the words holding an apostrophe): EDA's ``eda.py`` keeps the list from before
NLTK_2018_PIECES = frozenset({"d", "ll", "m", "o", "re", "ve", "y", "ain", "aren", "couldn", "didn", "doesn",
                              "hadn", "hasn", "haven", "isn", "ma", "mightn", "mustn", "needn", "shan", "shouldn",
                              "wasn", "weren", "won", "wouldn"})


def eda_stopword_list(nltk_english: list[str]) -> list[str]:
    """EDA's stopword list (Wei & Zou 2019, ``eda.py``: 127 words) from NLTK's English list: the words
    without an apostrophe that NLTK had before its 2018 revision, in NLTK's order."""
    return [w for w in nltk_english if "'" not in w and w not in NLTK_2018_PIECES]


#: the characters EDA's ``get_only_chars`` keeps (with the space); every other one becomes a space,
#: after apostrophes are dropped and hyphens, tabs and newlines become spaces
_EDA_LETTERS = frozenset("qwertyuiopasdfghjklzxcvbnm")
_EDA_CLEAN = str.maketrans({"’": "", "'": "", **{c: " " for c in "-\t\n"}})


def eda_only_chars(text: str) -> list[str]:
    """EDA's ``get_only_chars`` (Wei & Zou 2019, ``eda.py``) as words: apostrophes (' and ’) dropped
    ("don't" → "dont"), hyphens and white space → spaces, lowercased, every character but a-z a space;
    the words of the result (digits and punctuation alone leave none)."""
    text = text.translate(_EDA_CLEAN).lower()
    return "".join(c if c in _EDA_LETTERS else " " for c in text).split()


class EDA:
    """EDA operations (Wei & Zou 2019, ``eda.py``) on whitespace words that never touch ``protect``
    tokens (the mask token). All randomness from the numpy Generator passed in. ``clean``: EDA's
    ``get_only_chars`` on every other word first (``eda_only_chars``; ``eda()`` cleans its input and its
    outputs: the operations' outputs are clean already), also under op ``none``, as ``eda()`` returns
    the cleaned original sentence too."""

    def __init__(self, op: str, ratio: float, protect: str, wordnet=None, stopwords=(), clean: bool = False):
        self.op, self.ratio, self.protect = op, ratio, protect
        self.wordnet, self.stop = wordnet, set(stopwords)
        self.clean = clean
        self._syn: dict[str, list[str]] = {}

    def synonyms(self, word: str) -> list[str]:
        """EDA's ``get_synonyms``: WordNet lemma names, '_'/'-' → space, lowercased, letters and
        spaces only, the word itself removed; sorted (deterministic)."""
        if word not in self._syn:
            out = set()
            for syn in self.wordnet.synsets(word):
                for lemma in syn.lemmas():
                    s = lemma.name().replace("_", " ").replace("-", " ").lower()
                    s = "".join(c for c in s if c in " qwertyuiopasdfghjklzxcvbnm").strip()
                    if s:
                        out.add(" ".join(s.split()))
            out.discard(word)
            self._syn[word] = sorted(out)
        return self._syn[word]

    def __call__(self, sentence: str, rng: np.random.Generator) -> str:
        words = sentence.split()
        if self.clean:
            words = [c for w in words for c in ((w,) if w == self.protect else eda_only_chars(w))]
        free = [i for i, w in enumerate(words) if w != self.protect]
        if self.op == "none" or not free:
            return " ".join(words)
        n = max(1, int(self.ratio * len(free)))
        if self.op == "sr":
            cands = list(dict.fromkeys(words[i] for i in free if words[i].lower() not in self.stop))
            done = 0
            for k in rng.permutation(len(cands)):
                target = cands[int(k)]
                syns = self.synonyms(target.lower())
                if syns:
                    syn = syns[int(rng.integers(len(syns)))]
                    words = [syn if (w == target) else w for w in words]
                    done += 1
                if done >= n:
                    break
        elif self.op == "rs":
            if len(free) >= 2:
                for _ in range(n):
                    a, b = rng.choice(len(free), size=2, replace=False)
                    ia, ib = free[int(a)], free[int(b)]
                    words[ia], words[ib] = words[ib], words[ia]
        elif self.op == "rd":
            drop = {i for i in free if rng.random() < self.ratio}
            if len(drop) == len(words):  # keep one word (EDA: never return an empty sentence)
                drop.discard(free[int(rng.integers(len(free)))])
            words = [w for i, w in enumerate(words) if i not in drop]
        else:  # pragma: no cover - validated by Args choices
            raise SentembError(f"unknown EDA operation {self.op!r}")
        return " ".join(" ".join(words).split())


# ----------------------------------------------------------------------------- signal and decoder
def decoding_signal(e_s: torch.Tensor, e_masked: torch.Tensor, m: float, n: float,
                    absolute: bool = True) -> torch.Tensor:
    """The decoding signal of PaSeR (paper §3): ``[E_s, E_s̃, m·|E_s − E_s̃|, n·|E_s ⊙ E_s̃|]`` as a
    (B, 4, h) memory for the decoder's cross-attention. ``absolute=False``: the authors' code form
    ``[E_s, E_s̃, m·(E_s − E_s̃), n·(E_s ⊙ E_s̃)]``."""
    diff, prod = e_s - e_masked, e_s * e_masked
    if absolute:
        diff, prod = diff.abs(), prod.abs()
    return torch.stack([e_s, e_masked, m * diff, n * prod], dim=1)


#: the dropout calls reserved for one decoder forward under keyed/counter masks (``call_block``): more
#: than any decoder's (its embedding dropout and, per layer, the attention and residual dropouts)
DECODER_DROPOUT_CALLS = 256


class PhraseDecoder(nn.Module):
    """BART-style decoder: shared word embeddings + learned positions + LayerNorm, ``layers``
    post-LN transformer decoder layers (GELU, causal self-attention, cross-attention to the
    signal), output projection tied to the same word embeddings (``embed_tokens`` *is* the
    encoder's input embedding module) or, after ``project_with(head)``, ``head`` applied to the
    decoder's states (the method's MLM head, ``decoder_output: mlm_head``)."""

    def __init__(self, embed_tokens: nn.Embedding, layers: int, heads: int, ffn: int, dropout: float,
                 max_positions: int, init_std: float = 0.02, *, dropout_layout: str = "torch",
                 input_embeddings: nn.Module | None = None):
        super().__init__()
        h = embed_tokens.embedding_dim
        self.embed_tokens = embed_tokens
        self._head: list[nn.Module] | None = None
        # the encoder's whole embedding module (word + position + token type, LayerNorm, dropout) as the
        # input embedding (``decoder_embeddings: encoder``); in a list: its parameters stay the encoder's
        self._input_embeddings = [input_embeddings] if input_embeddings is not None else None
        self.embed_positions = nn.Embedding(max_positions, h)
        self.layernorm_embedding = nn.LayerNorm(h)
        self.dropout = nn.Dropout(dropout)
        layer = nn.TransformerDecoderLayer(h, heads, ffn, dropout, activation="gelu", batch_first=True)
        if dropout_layout == "bart":  # BART's defaults: attention_dropout = activation_dropout = 0
            layer.self_attn.dropout = 0.0
            layer.multihead_attn.dropout = 0.0
            layer.dropout = nn.Dropout(0.0)
        self.layers = nn.TransformerDecoder(layer, layers)
        for name, p in self.named_parameters():  # BART init: N(0, 0.02) weights, zero biases
            if name.startswith("embed_tokens"):
                continue
            if p.dim() > 1 or name.startswith("embed_positions"):
                nn.init.normal_(p, std=init_std)
            elif "norm" in name:
                nn.init.ones_(p) if name.endswith("weight") else nn.init.zeros_(p)
            else:
                nn.init.zeros_(p)

    def project_with(self, head: nn.Module) -> None:
        """Logits = ``head``(states) instead of states · Eᵀ. ``head`` is kept in a list, not registered
        as a submodule: its parameters stay the owner's (the method's ``mlm_head.*``), once."""
        self._head = [head]

    def hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        """The last layer's states (R, T, h) for decoder inputs (R, T)."""
        t = input_ids.size(1)
        pos = torch.arange(t, device=input_ids.device)
        if self._input_embeddings is not None:  # BERT's embeddings (its positions, LayerNorm, dropout), then BART's
            x = self._input_embeddings[0](input_ids=input_ids) + self.embed_positions(pos)[None]
        else:
            x = self.embed_tokens(input_ids) + self.embed_positions(pos)[None]
        x = self.dropout(self.layernorm_embedding(x))
        causal = torch.ones((t, t), dtype=torch.bool, device=x.device).triu(1)  # True = not attended
        return self.layers(x, memory.to(x.dtype), tgt_mask=causal, tgt_key_padding_mask=attention_mask == 0,
                           tgt_is_causal=True)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        """Logits (R, T, V) over the shared vocabulary for decoder inputs (R, T)."""
        y = self.hidden(input_ids, attention_mask, memory)
        if self._head is not None:
            return self._head[0](y)
        return y @ self.embed_tokens.weight.T


# ----------------------------------------------------------------------------- the method
def read_rake(path, corpus, top_k: int) -> list[list[str]]:
    """Top-``top_k`` phrases per corpus line from ``rake_top<K>.parquet``; errors (naming both
    files and counts) when it is not line-aligned with ``corpus`` or keeps fewer than ``top_k``."""
    import pyarrow.parquet as pq

    from ..data.corpus import count_corpus_lines
    from ..stats import read_metadata

    meta_k = read_metadata(path).get("top_k")
    if meta_k is not None and int(meta_k) < top_k:
        raise SentembError(f"{path} keeps the top {meta_k} RAKE phrases per line but PaSeR's top_k is {top_k} "
                           "(raise stats.rake_top_k)")
    table = pq.read_table(path, columns=["line", "phrases"])
    if corpus is not None:
        n = count_corpus_lines(corpus)
        if table.num_rows != n:
            raise SentembError(f"RAKE phrases {path} have {table.num_rows} rows but the corpus {corpus} has {n} "
                               "lines: they must be line-aligned (recompute the statistics of this corpus)")
    lines = table.column("line").to_numpy()
    if not np.array_equal(lines, np.arange(len(lines))):
        raise SentembError(f"{path}: column 'line' is not 0..{len(lines) - 1} in order")
    return [list(p or [])[:top_k] for p in table.column("phrases").to_pylist()]


def load_wordnet(nltk_data):
    """A WordNet reader from the NLTK data directory ``nltk_data`` (no download; that directory's
    WordNet, whatever other NLTK directories the process has read). Loading takes seconds (the lemma
    index), so one reader per directory is kept for the process (it is only read)."""
    import os

    return _wordnet(os.path.abspath(nltk_data))


@functools.lru_cache(maxsize=4)
def _wordnet(nltk_data: str):
    import nltk
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    if nltk_data not in nltk.data.path:
        nltk.data.path.insert(0, nltk_data)
    try:
        # this directory's, not the first on the path; the trailing "/" also finds corpora/wordnet.zip (what
        # nltk.download leaves), which NLTK's zip fallback misses without it
        root = nltk.data.find("corpora/wordnet/", paths=[nltk_data])
    except LookupError:
        raise SentembError(f"WordNet not found in NLTK data directory {nltk_data} (expected corpora/wordnet/ or "
                           "corpora/wordnet.zip; "
                           "the workflow's fetch_nltk rule fetches it)") from None
    import warnings

    with warnings.catch_warnings():  # "multilingual functions are not available": not used here
        warnings.simplefilter("ignore", UserWarning)
        return WordNetCorpusReader(root, None)


@register_method
class PaSeR(Method):
    name = "paser"

    @dataclass
    class Args:
        top_k: int = arg(5, "k: mask the top k RAKE phrases (Table 5's top 5 = the full model of Tables 4, 8, 9; "
                         "top 3 a study point; ≤ stats.rake_top_k)", minimum=1)
        eda: str = arg("sr", "EDA on s and s̃: synonym replacement (best, Table 4), random swap, random "
                       "deletion, or none", choices=("sr", "rs", "rd", "none"))
        eda_ratio: float = arg(0.5, "EDA ratio α (code README): n = max(1, int(α·#words)); deletion probability",
                               minimum=0, maximum=1)
        eda_draw: str = arg("step", "when EDA draws: step - each time a sentence is batched (another augmentation in "
                            "every epoch; the paper is silent); once - once per corpus line, the same in every "
                            "epoch (code: EDA applied offline to its training CSV)", choices=("step", "once"))
        eda_stopwords: str = arg("nltk", "the words synonym replacement never replaces: nltk - NLTK's English list "
                                 "(179 words; the paper is silent); eda - EDA's own list (127 words, NLTK's before "
                                 "2018; code: EDA's eda.py made its training CSV)", choices=("nltk", "eda"))
        eda_clean: str = arg("none", "EDA's character cleaning of s and s̃ (mask tokens kept): none - the sentence's "
                             "words as they are (the paper is silent); eda - EDA's get_only_chars, which its eda() "
                             "applies: lowercase, apostrophes dropped, every character but a-z a space (digits "
                             "and punctuation go). Which one made the code's CSV is not known",
                             choices=("none", "eda"))
        signal_m: float = arg(10.0, "m, factor of the difference part of the decoding signal")
        signal_n: float = arg(10.0, "n, factor of the product part of the decoding signal")
        signal_abs: bool = arg(True, "absolute values of difference and product (paper); false = code")
        masked_linear: bool = arg(False, "pass E_s̃ through a trainable Linear(h, h) before the signal (code)")
        masked_linear_init: str = arg("torch", "that Linear's initialisation: PyTorch's default (the paper is silent), "
                                      "or N(0, initializer_range) weights and zero bias (code: init_weights)",
                                      choices=("torch", "normal"))
        decoder_layers: int = arg(6, "transformer decoder layers (code)", minimum=1)
        decoder_heads: int = arg(16, "decoder attention heads (code); must divide the hidden size", minimum=1)
        decoder_ffn: int | None = arg(768, "decoder feed-forward size; null = the encoder's hidden size (code: "
                                      "decoder_ffn_dim=config.hidden_size, 768 on base models only)", minimum=1)
        decoder_dropout: float = arg(0.1, "decoder dropout (BART default)", minimum=0, exclusive_maximum=1)
        decoder_dropout_layout: str = arg("torch", "where decoder_dropout applies: torch = nn.TransformerDecoderLayer's "
                                          "(also the attention weights and the FFN activation); bart = BART's defaults "
                                          "(residual branches and embeddings only: attention and activation dropout 0; "
                                          "code)", choices=("torch", "bart"))
        decoder_embeddings: str = arg("word", "the decoder's input embedding: the shared word embeddings (§4.2), or "
                                      "the encoder's whole embedding module (word + position + token type, "
                                      "LayerNorm, dropout; code: decoder.embed_tokens = bert.embeddings), BART's "
                                      "positions added on top either way", choices=("word", "encoder"))
        target_truncation: str = arg("phrases", "a sentence cut by max_len: drop the phrases whose masks were cut "
                                     "(open choice), or its whole target when s or s̃ reaches max_len tokens (code: "
                                     "train.py's usable_sample)", choices=("phrases", "sentence"))
        empty_target: str = arg("none", "a line without a RAKE phrase: none - no decoder target (nothing to "
                                "reconstruct; open choice); sep - the target [CLS] [SEP], one token to predict "
                                "(code: train.py fills an empty target cell with ' ', which tokenizes to [CLS] [SEP]); "
                                "target_truncation still applies", choices=("none", "sep"))
        decoder_output: str = arg("embeddings", "the decoder's vocabulary projection: the word embeddings it "
                                  "shares with the encoder (§4.2), or the MLM head of L_MLM, pretrained "
                                  "cls.predictions (code: cls.lm_head(decoder_outputs))",
                                  choices=("embeddings", "mlm_head"))
        mlm_head_tied: bool = arg(True, "the MLM head's output matrix is the encoder's word embeddings (BERT); "
                                  "false = its own trainable copy of the pretrained matrix (code)")
        max_target_len: int = arg(64, "decoder target length cap, [CLS] and the end [SEP] included (how a longer "
                                  "target is cut: target_cut)", minimum=2)
        target_cut: str = arg("phrases", "a target longer than max_target_len: phrases - whole trailing phrases "
                              "dropped (open choice); tokens - cut mid-phrase after max_target_len - 1 tokens and "
                              "ended with [SEP], as the tokenizer's truncation (code: train.py tokenizes the target "
                              "column with max_length=max_seq_length, truncation=True)", choices=("phrases", "tokens"))
        mlm_prob: float = arg(0.15, "MLM masking probability on s (80/10/10)", minimum=0, maximum=1)
        mlm_weight: float = arg(1.0, "weight of L_MLM in L = w·L_MLM + L_gen", minimum=0)

    eval_pooler = "cls_before_pooler"
    width_groups = {"dec_": "decoder"}  # the decoder rows' own width (``Method.width``)
    schedule_args = ("top_k",)  # phrases kept per line: which words are masked, not how many rows
    contract_args = {"decoder_layers": 1, "decoder_ffn": 64}
    contract_no_dropout = {"decoder_dropout": 0.0}

    @classmethod
    def requires(cls, args):
        # WordNet and the stopword list (nltk) only for synonym replacement
        return ("rake", "nltk") if args.eda == "sr" else ("rake",)

    @classmethod
    def check(cls, args, config, where="method_args"):
        kmax = int(config["stats"]["rake_top_k"])  # a validated config: the default is filled in
        if args.top_k > kmax:
            raise SentembError(f"{where}.top_k: {args.top_k} is above 'stats.rake_top_k' ({kmax}), "
                               "the number of RAKE phrases kept per line; raise stats.rake_top_k or lower top_k")

    @classmethod
    def check_train(cls, args, settings, where="method_args"):
        # nn.MultiheadAttention is one opaque op to Dynamo: its attention dropout cannot take the counter
        # masks in a compiled step (the loop's set-up refuses any such module; this names PaSeR's keys earlier)
        if (settings.compile and settings.dropout_rng == "counter" and args.decoder_dropout_layout == "torch"
                and args.decoder_dropout > 0):
            raise SentembError(f"{where}: train.compile with train.dropout_rng counter cannot serve the attention "
                               f"dropout of PaSeR's decoder (method_args.decoder_dropout_layout torch, decoder_dropout "
                               f"{args.decoder_dropout}); set method_args.decoder_dropout_layout: bart, or "
                               "train.dropout_rng: stream, or train.compile: false")

    def __init__(self, encoder, tokenizer, args, ctx):
        super().__init__(encoder, tokenizer, args, ctx)
        a = self.args
        cfg = encoder.config
        h = cfg.hidden_size
        if h % a.decoder_heads:  # the backbone's width: known here (the range is on the argument)
            raise SentembError(f"method 'paser': decoder_heads ({a.decoder_heads}) must divide the backbone's "
                               f"hidden size ({h}); set method_args.decoder_heads to a divisor of {h}")
        if tokenizer.mask_token_id is None or tokenizer.cls_token_id is None or tokenizer.sep_token_id is None:
            raise SentembError("method 'paser' needs a tokenizer with mask, cls and sep tokens")
        embed = encoder.get_input_embeddings()
        std = getattr(cfg, "initializer_range", 0.02)
        if a.decoder_embeddings == "encoder" and not isinstance(getattr(encoder, "embeddings", None), nn.Module):
            raise SentembError("method 'paser': decoder_embeddings: encoder needs an encoder with an `embeddings` "
                               "module (BERT-family); set method_args.decoder_embeddings: word")
        self.decoder = PhraseDecoder(embed, a.decoder_layers, a.decoder_heads, a.decoder_ffn or h,
                                     a.decoder_dropout, a.max_target_len, std, dropout_layout=a.decoder_dropout_layout,
                                     input_embeddings=encoder.embeddings if a.decoder_embeddings == "encoder" else None)
        self.masked_proj = nn.Linear(h, h) if a.masked_linear else None
        if self.masked_proj is not None and a.masked_linear_init == "normal":
            nn.init.normal_(self.masked_proj.weight, std=std)
            nn.init.zeros_(self.masked_proj.bias)
        # untied: the copy starts as the checkpoint's cls.predictions.decoder.weight when it has one
        # (load_bert), else as the word embeddings (BERT's tied matrix, which HF checkpoints store once)
        self.mlm_head = MLMHead(cfg, tied=embed) if a.mlm_head_tied else MLMHead(cfg, weight=embed.weight)
        if a.decoder_output == "mlm_head":
            self.decoder.project_with(self.mlm_head)
        head = mlm_head_state(read_weights(ctx.model_dir)) if ctx.model_dir else {}
        if head:
            self.mlm_head.load_bert(head, str(ctx.model_dir))
        self.mlm_head_pretrained = bool(head)
        if not self.mlm_head_pretrained:
            log.warning("paser: the backbone checkpoint %s has no MLM head (cls.predictions): L_MLM uses a "
                        "randomly initialised one", ctx.model_dir)
        self.phrases = read_rake(ctx.input("rake"), ctx.corpus, a.top_k)
        wordnet, stop = None, ()
        if a.eda == "sr":
            from ..stats.rake import load_stopwords

            wordnet = load_wordnet(ctx.input("nltk"))
            stop = load_stopwords(ctx.input("nltk"))
            if a.eda_stopwords == "eda":
                stop = eda_stopword_list(stop)
        self.eda = EDA(a.eda, a.eda_ratio, tokenizer.mask_token, wordnet, stop, clean=a.eda_clean == "eda")

    # ------------------------------------------------------------------ batches
    def targets(self, masked: Masked, surviving: int, pieces: dict | None = None) -> list[int]:
        """Target ids ``[CLS] p1 [SEP] p2 [SEP] …`` of the phrases whose masks all survived truncation
        (``surviving`` = number of mask tokens in the truncated s̃); [] if none. At most
        ``max_target_len`` ids: whole trailing phrases dropped (``target_cut: phrases``), or cut
        mid-phrase and ended with [SEP] (``tokens``: the tokenizer's truncation of "p1 [SEP] … pk",
        so a cut just after a separator ends in [SEP] [SEP], as the tokenizer's would). ``pieces``: phrase →
        its token ids, tokenized beforehand for the whole batch (one tokenizer call instead of one per
        phrase: the same ids)."""
        tok = self.tokenizer
        cap, cut_tokens = self.args.max_target_len, self.args.target_cut == "tokens"
        ids = [tok.cls_token_id]
        for phrase, ords in zip(masked.phrases, masked.mask_ordinals):
            if max(ords) >= surviving:
                continue
            piece = (pieces[phrase] if pieces is not None else tok(phrase, add_special_tokens=False)["input_ids"]) \
                + [tok.sep_token_id]
            if len(ids) + len(piece) > cap:
                if cut_tokens:  # the tokenizer's truncation: [CLS], the first cap - 2 content tokens, [SEP]
                    ids = (ids + piece)[: cap - 1] + [tok.sep_token_id]
                break
            ids += piece
        return ids if len(ids) > 1 else []

    def mlm_mask(self, input_ids: torch.Tensor, special: torch.Tensor, rng, width: int | None = None):
        """BERT's MLM corruption (``sentemb.methods.masking.mask_tokens``): each non-special token chosen with
        p = mlm_prob; of those 80% → [MASK], 10% → a random token, 10% unchanged. Returns (inputs,
        labels with −100 elsewhere). ``width``: the batch's real width (the draws cover its columns
        only, so bucket padding does not change them)."""
        from .masking import mask_tokens

        x, y = mask_tokens(input_ids.numpy(), ~special.numpy(), self.args.mlm_prob, rng,
                           self.tokenizer.mask_token_id, len(self.tokenizer), width=width)
        return torch.from_numpy(x), torch.from_numpy(y)

    def build_batch(self, sentences, step=0, *, lines=None, micro=0):
        if lines is None or len(lines) != len(sentences):
            raise SentembError("method 'paser' needs the sentences' corpus line indices (build_batch lines=) "
                               "to read their RAKE phrases")
        tok, rng = self.tokenizer, self.np_rng(micro)
        masked = [mask_phrases(s, self.phrases[int(l)], tok.mask_token) for s, l in zip(sentences, lines)]
        # EDA after masking, on s and s̃ independently (s first for the whole batch, then s̃); eda_draw once:
        # each line's own draws (s̃'s after s's), the same whenever the line comes (the code's offline EDA)
        if self.args.eda_draw == "once":
            line_rngs = [np.random.default_rng([int(self.ctx.seed), EDA_ONCE_STREAM, int(l)]) for l in lines]
            s_aug = [self.eda(s, g) for s, g in zip(sentences, line_rngs)]
            m_aug = [self.eda(m.text, g) for m, g in zip(masked, line_rngs)]
        else:
            s_aug = [self.eda(s, rng) for s in sentences]
            m_aug = [self.eda(m.text, rng) for m in masked]
        b = len(sentences)
        enc = tok(s_aug + m_aug, padding=True, truncation=True, max_length=self.ctx.max_len, return_tensors="pt")
        real = int(enc["input_ids"].size(1))  # the longest row: MLM draws are made over it
        enc = self.pad_rows(dict(enc))  # to the bucket (train.buckets)
        ids, att = enc["input_ids"], enc["attention_mask"]
        surviving = (ids[b:] == tok.mask_token_id).sum(1).tolist()
        phrases = list(dict.fromkeys(p for m in masked for p in m.phrases))
        pieces = dict(zip(phrases, tok(phrases, add_special_tokens=False)["input_ids"])) if phrases else {}
        tgts = [self.targets(m, n, pieces) for m, n in zip(masked, surviving)]
        if self.args.empty_target == "sep":  # the code's " " target: [CLS] [SEP]
            tgts = [t if len(self.phrases[int(l)]) else [tok.cls_token_id, tok.sep_token_id] for l, t in zip(lines, tgts)]
        if self.args.target_truncation == "sentence":  # the code: no target when s or s̃ reaches max_len tokens
            n_tok = att.sum(1)
            tgts = [t if max(int(n_tok[i]), int(n_tok[b + i])) < self.ctx.max_len else [] for i, t in enumerate(tgts)]
        real_rows = [i for i, t in enumerate(tgts) if t]
        # a graphed run (ctx.static): one decoder row per sentence, those without a target a one-token
        # pad row without labels, so that the count of rows with a target is no shape (one captured
        # graph per width, not per count) and a chunk's decoder rows are a slice (``chunk``)
        rows = list(range(b)) if self.ctx.static else real_rows
        # decoder rows: to a bucket too, beyond max_len up to the decoder's positions (max_target_len)
        t_len = self.width(max((len(tgts[i]) - 1 for i in real_rows), default=1), limit=self.args.max_target_len)
        dec_in = torch.full((len(rows), t_len), tok.pad_token_id, dtype=torch.long)
        dec_att = torch.zeros((len(rows), t_len), dtype=torch.long)
        dec_lab = torch.full((len(rows), t_len), -100, dtype=torch.long)
        for r, i in enumerate(rows):
            t = tgts[i]
            if not t:  # a padding row (static only): one attended pad token, nothing to predict
                dec_att[r, 0] = 1
                continue
            dec_in[r, :len(t) - 1] = torch.tensor(t[:-1])
            dec_att[r, :len(t) - 1] = 1
            dec_lab[r, :len(t) - 1] = torch.tensor(t[1:])
        s_ids, s_att = ids[:b], att[:b]
        # get_special_tokens_mask(already_has_special_tokens=True) row by row, as one lookup
        special = torch.isin(s_ids, torch.tensor(sorted(set(tok.all_special_ids)), dtype=s_ids.dtype)) | (s_att == 0)
        mlm_ids, mlm_lab = self.mlm_mask(s_ids, special, rng, width=real)
        return {"input_ids": ids, "attention_mask": att, "dec_rows": torch.tensor(rows, dtype=torch.long),
                "dec_input_ids": dec_in, "dec_attention_mask": dec_att, "dec_labels": dec_lab,
                "mlm_input_ids": mlm_ids, "mlm_labels": mlm_lab}

    # ------------------------------------------------------------------ losses
    def signal(self, input_ids, attention_mask) -> torch.Tensor:
        """E_s, E_s̃ ([CLS], one forward pass over [s; s̃]) → decoding signal (B, 4, h)."""
        b = input_ids.size(0) // 2
        cls = self.encoder(input_ids=input_ids, attention_mask=attention_mask, return_dict=True).last_hidden_state[:, 0]
        e_s, e_m = cls[:b], cls[b:]
        if self.masked_proj is not None:
            e_m = self.masked_proj(e_m)
        return decoding_signal(e_s, e_m, self.args.signal_m, self.args.signal_n, self.args.signal_abs)

    has_batch_terms = False  # L_gen and L_mlm are sums over sentences (and their tokens)

    def n_sentences(self, batch):
        return batch["mlm_input_ids"].size(0)

    def chunk(self, batch, start, stop):
        """Sentences ``[start, stop)``: their s and s̃ rows, MLM rows and decoder rows (``dec_rows``
        made chunk-local)."""
        n = self.n_sentences(batch)
        dec = batch["dec_rows"]
        plain = {k: v for k, v in batch.items() if not k.startswith("dec_")}
        out = slice_rows(plain, start, stop, n, blocks={"input_ids": 2, "attention_mask": 2}, where="method 'paser'")
        if self.ctx.static:  # one decoder row per sentence, in order (build_batch): a slice, no data-dependent shape
            out.update({k: v[start:stop] for k, v in batch.items() if k.startswith("dec_")})
            out["dec_rows"] = dec[start:stop] - start
            return out
        sel = ((dec >= start) & (dec < stop)).nonzero().flatten()
        out.update({k: v[sel] for k, v in batch.items() if k.startswith("dec_")})
        out["dec_rows"] = dec[sel] - start
        return out

    def encode(self, batch):
        return Encoded(rows={"memory": self.signal(batch["input_ids"], batch["attention_mask"])})

    def static_idle_parameters(self, batch):
        """A graphed step runs the decoder over padding rows and the MLM head on every batch
        (``row_terms``); eagerly, a batch without a phrase target skips the decoder and one without
        a masked token the MLM head, so their own parameters get no gradient (not zeros): those."""
        gen = bool((batch["dec_labels"] != -100).any())
        mlm = bool((batch["mlm_labels"] != -100).any())
        if gen and mlm:  # nearly every batch: nothing idle, no parameter walk on the step's host path
            return []
        used = [self.encoder, self.masked_proj] + ([self.decoder] if gen else [])
        if mlm or (gen and self.args.decoder_output == "mlm_head"):  # the decoder's logits through the head
            used.append(self.mlm_head)
        live = {id(p) for m in used if m is not None for p in m.parameters()}
        idle = {id(p): p for m in (self.decoder, self.mlm_head) for p in m.parameters()
                if p.requires_grad and id(p) not in live}
        return list(idle.values())

    def row_terms(self, enc, chunk, batch):
        """L_gen (mean over the batch's target tokens) and λ·L_mlm (mean over its masked tokens),
        the chunk's share: its tokens' cross-entropy summed, divided by the batch's counts."""
        memory = enc.rows["memory"]
        b = chunk["mlm_input_ids"].size(0)
        labels = chunk["dec_labels"]
        sel = labels != -100
        n_tok = (batch["dec_labels"] != -100).sum()
        static = self.ctx.static  # train.graphs: no data-dependent shape, no host read (static_masked_ce)
        from ..model.dropout import call_block, rows

        # keyed/counter masks: the decoder's dropout calls take a block of their own, so the MLM
        # forward's masks are the same whether the decoder ran (graphed: always) or was skipped (a
        # chunk without a target), in every chunking
        with call_block(DECODER_DROPOUT_CALLS, "PaSeR's decoder"):
            if chunk["dec_rows"].numel() and static:
                from .masking import static_masked_ce

                with rows(chunk["dec_rows"]):
                    logits = self.decoder(chunk["dec_input_ids"], chunk["dec_attention_mask"], memory[chunk["dec_rows"]])
                gen = static_masked_ce(logits, labels, lambda x: x, n_tok)
            elif chunk["dec_rows"].numel() and not static and bool(sel.any()):
                with rows(chunk["dec_rows"]):  # keyed dropout: decoder row r belongs to sentence dec_rows[r]
                    logits = self.decoder(chunk["dec_input_ids"], chunk["dec_attention_mask"], memory[chunk["dec_rows"]])
                gen = F.cross_entropy(logits[sel].float(), labels[sel], reduction="sum") / n_tok
            else:
                gen = memory.float().sum() * 0.0  # no phrase in the chunk: L_gen = 0 (graph kept)
        mlm_lab = chunk["mlm_labels"]
        msel = mlm_lab != -100
        if static:
            from .masking import static_masked_ce

            hid = self.encoder(input_ids=chunk["mlm_input_ids"], attention_mask=chunk["attention_mask"][:b],
                               return_dict=True).last_hidden_state
            mlm = static_masked_ce(hid, mlm_lab, self.mlm_head, (batch["mlm_labels"] != -100).sum())
        elif bool(msel.any()):
            hid = self.encoder(input_ids=chunk["mlm_input_ids"], attention_mask=chunk["attention_mask"][:b],
                               return_dict=True).last_hidden_state
            n_masked = (batch["mlm_labels"] != -100).sum()
            mlm = F.cross_entropy(self.mlm_head(hid[msel]).float(), mlm_lab[msel], reduction="sum") / n_masked
        else:
            mlm = memory.float().sum() * 0.0
        weighted_mlm = self.args.mlm_weight * mlm
        return {"mlm": mlm.detach(), "gen": gen.detach(), "phrases": sel.sum().float(),
                WEIGHTED: {"mlm": weighted_mlm, "gen": gen}}

"""UNA: Unsupervised hard Negative Augmentation driven by TF-IDF (Shu et al.; the method spec §3).

SimCSE (dropout positives, MLP on [CLS] in training only, raw [CLS] at evaluation) plus synthetic
hard negatives, optionally with paraphrase positives:

* Step 1 (statistics stage, ``sentemb.stats.tfidf``): tf(t,d) = log(1 + n_t/n),
  idf(t) = −log(N_t/N) (UNA Eq. 2); s_t = max_d tf·idf, terms ranked by s descending (``rank``).
* Step 2 (UNA Eq. 3–5): per sentence with TF-IDF scores z over its n_z distinct terms,
  p_i = min(β·(z_i − min z)/C, 1), C = (1/n_z) Σ_i (z_i − min z); the arg-max term gets p = 1
  (:func:`replacement_probabilities`).
* Step 3: term i is replaced, with probability p_i, by a term drawn ∝ s_j among the terms whose
  rank lies within r of term i's rank (:func:`sample_replacement`).
* Every α batches (optimizer steps with ``step % α == 0``, counted from 0) the B negatives join
  the batch. ``negatives: false`` leaves them out altogether: with ``paraphrase: true`` that is
  UNA Table 1's "paraphrasing only" row (PEGASUS positives, no TF-IDF negatives); without, its first
  row, the authors' SimCSE reproduction in UNA's own loop (the symmetric loss below, over 2B rows). Layout (``loss: symmetric``, the authors' code): rows a_1, p_1, …, a_B, p_B,
  ã_1, ã_1, …, ã_B, ã_B (p = PEGASUS paraphrase of a, or a copy of a; ã = UNA negative of a);
  other steps: a_1, p_1, …, a_B, p_B. With u_k = MLP([CLS]) of row k and k⁺ = k xor 1 its partner,

      ℓ_k = −log e^{cos(u_k,u_k⁺)/τ} / Σ_{l≠k} e^{cos(u_k,u_l)/τ},   L = (1/R) Σ_k ℓ_k

  over all R rows in fp32 (:func:`symmetric_nt_xent`; the paper is silent on the loss, this is
  its code's form). Switch ``loss: simcse``: rows a_1, p_1, …, a_B, p_B, ã_1, …, ã_B (each
  negative once) and S = [cos(a_i, p_j) | cos(a_i, ã_j)]/τ (B × 2B), cross-entropy against
  arange(B) (:func:`simcse_hard_negative_loss`, Gao et al. 2021 Eq. 5 with unit weights).

Open choices (documented, switchable):

* ``redraw``: the paper guarantees each negative differs from its anchor. ``exclude_self``
  (default) removes term i itself from its window. ``code``: the authors' code — the window
  includes term i, and a negative whose text equals its anchor's becomes one vocabulary term drawn
  ∝ s − min s (``UNAAugmenter._fallback_term``).
* ``selection_form``: ``paper`` (default) reads Eq. 3–4 per distinct term (below); ``code`` computes
  the authors' per-token-position arithmetic (``UNAAugmenter._code_tokens``).
* ``rank_ties``: the order of terms with equal s in the ranking the window runs over: by term
  (default, the statistics file's rank) or by first occurrence in the corpus (``first_seen``, the
  code's stable sort of its corpus-ordered dict).
* ``write_back``: ``span`` (default) replaces each replaced token's character span in the
  original sentence (rest of the text and its case kept; a Title-case / UPPER-case token gets the
  replacement in the same case; a word replacing a token attached to a word, e.g. ")" in "(SA)",
  is set off by spaces); ``tokens``: the code's lowercased tokens joined by spaces.
* A *term* is a distinct lowercased token of the sentence (the TF-IDF vector's support): one draw
  per term, and all its occurrences get the same replacement (``selection_form: paper``). Tokens absent from the TF-IDF
  vocabulary (only possible when a sentence is not in the statistics' corpus) are neither scored
  nor replaced; a sentence without any known term gives its anchor back unchanged.
* Ablations (Table 2): ``selection: random`` replaces each term with probability β plus one
  uniformly chosen term always (the same mean as TF-IDF selection, and ≥ 1 replacement);
  ``replacement: random`` draws uniformly from the whole vocabulary (term itself excluded under
  ``exclude_self``).
* A window whose s-mass is zero (all s = 0 but the term) is sampled uniformly.
* Bucketed widths (``train.buckets``): all rows (anchors, positives, negatives) are tokenized
  as one tokenizer call would (``Method.tokenize_rows``: each distinct text once, anchors from the
  corpus's token cache) and padded to a bucket of the longest (``Method.pad_rows``); padded positions are
  attention 0, so the loss is unchanged (``tests/test_buckets.py``). The number of rows is 2B on
  steps without negatives and 4B (``loss: simcse``: 3B) on the steps with them.
* An empty paraphrase line means "no paraphrase": the anchor's copy is used and counted
  (logged term ``empty_paraphrases``); ``empty_paraphrase: empty`` makes the empty text the
  positive instead ([CLS] [SEP]), as the authors' code, whose text loader keeps the empty line. The paper evaluates every 100 batches: set
  ``train.eval_steps: 100`` in a run.

Logged terms: ``loss``, ``contrastive`` (= loss), ``negatives`` (rows added this step: 2B,
B with ``loss: simcse``, 0 on other steps), ``replaced`` (mean share of a negative's terms
replaced; 0 on steps without negatives), ``empty_paraphrases``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .. import SentembError
from ..model.backbone import MLPHead
from .base import WEIGHTED, Encoded, Method, arg
from .registry import register_method

_META_KEYS = ("negatives", "replaced", "empty_paraphrases", "neg_anchor")


# ------------------------------------------------------------------------------ steps 2 and 3
def replacement_probabilities(z: Sequence[float], beta: float) -> np.ndarray:
    """p_i = min(β·(z_i − min z)/C, 1), C = (1/n_z) Σ_i (z_i − min z) (UNA Eq. 3–4, Alg. 1 line 8),
    and p = 1 for the arg-max term (first one on ties). When C = 0 (one term, or all scores equal)
    only the arg-max term is replaced (p = 1 there, 0 elsewhere): no NaN."""
    z = np.asarray(z, dtype=np.float64)
    if z.size == 0:
        return z.copy()
    d = z - z.min()
    c = d.mean()
    p = np.minimum(beta * d / c, 1.0) if c > 0 else np.zeros_like(z)
    p[int(np.argmax(z))] = 1.0
    return p


def _cumsum0(s: np.ndarray) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(np.asarray(s, dtype=np.float64))])


def sample_replacement(rank: int, s: np.ndarray, radius: int, rng: np.random.Generator, *,
                       exclude_self: bool = True, cumsum: np.ndarray | None = None) -> int:
    """The rank of a replacement for the term of rank ``rank`` (UNA Step 3, Alg. 1 lines 9–10):
    drawn ∝ s_j over the window j ∈ [rank − r, rank + r] ∩ [0, V − 1], ``s`` in rank order
    (s descending). ``exclude_self`` removes ``rank`` itself from the window (the paper's
    guarantee that a negative differs from its anchor). A window with zero mass is sampled
    uniformly; a window holding only the term itself returns it. ``cumsum`` (``[0, cumsum(s)]``)
    may be passed to avoid recomputing it: then a draw costs O(log V)."""
    V = len(s)
    lo, hi = max(0, rank - radius), min(V - 1, rank + radius)
    cs = _cumsum0(s) if cumsum is None else cumsum
    self_mass = float(s[rank]) if exclude_self else 0.0
    mass = float(cs[hi + 1] - cs[lo]) - self_mass
    n_cand = hi - lo + 1 - (1 if exclude_self else 0)
    if n_cand <= 0:
        return int(rank)
    if mass <= 0.0:  # no s-mass in the window: uniform over its candidates
        j = lo + int(rng.integers(n_cand))
        return int(j + 1 if exclude_self and j >= rank else j)
    u = float(cs[lo]) + float(rng.random()) * mass
    if exclude_self and u >= cs[rank]:
        u += self_mass  # skip term `rank`'s own interval
    j = int(np.searchsorted(cs, u, side="right")) - 1
    j = min(max(j, lo), hi)
    if exclude_self and j == rank:  # float rounding at an interval edge
        j = rank + 1 if rank + 1 <= hi else rank - 1
    return j


def _match_case(original: str, term: str) -> str:
    if len(original) > 1 and original.isupper():
        return term.upper()
    if original[:1].isupper():
        return term[:1].upper() + term[1:]
    return term


_QUOTES = {"``": '"', "''": '"'}
_QUOTE_MARKS = re.compile(r"``|'{2}|\"")


def token_spans(text: str, raw: list[str]) -> list[tuple[int, int]] | None:
    """The character spans of ``raw`` = ``NLTKWordTokenizer().tokenize(text)`` in ``text``: what
    ``NLTKWordTokenizer().span_tokenize(text)`` returns, from tokens already made (span_tokenize
    tokenizes again; UNA's write-back needs both, nltk/tokenize/destructive.py). As there, the
    tokenizer's quote tokens (a double quote, two backquotes, two single quotes) are given back the quote marks of the text in
    order, then ``nltk.tokenize.util.align_tokens`` finds each token after the previous one.
    ``None`` where the tokens do not align (span_tokenize raises there), and where the text has
    fewer quote marks than quote tokens a token is aligned as it is (span_tokenize raises there too;
    no such text is known, and a token that is not in the text gives ``None``)."""
    from nltk.tokenize.util import align_tokens

    tokens = raw
    if '"' in text or "''" in text:
        marks = iter(m.group() for m in _QUOTE_MARKS.finditer(text))
        tokens = [next(marks, tok) if tok in ('"', "``", "''") else tok for tok in raw]
    try:
        return align_tokens(tokens, text)
    except ValueError:
        return None


class UNAAugmenter:
    """Steps 2–3 on raw sentences, against one ``tfidf*.parquet`` (term, df, idf, s, rank;
    metadata n_docs). Tokenization is the statistics stage's own (``stats.tfidf.tokenize`` and
    ``sentence_tfidf``)."""

    def __init__(self, terms: Sequence[str], df: Sequence[int], s: Sequence[float], n_docs: int, *,
                 beta: float = 0.5, radius: int = 4000, selection: str = "tfidf", replacement: str = "tfidf",
                 redraw: str = "exclude_self", write_back: str = "span", selection_form: str = "paper"):
        self.terms = list(terms)  # rank order
        self.s = np.asarray(s, dtype=np.float64)
        self.cumsum = _cumsum0(self.s)
        # the code's fallback draws a term ∝ s − min s (its normalized_tf_idf, reset_token_list)
        self.fallback_cumsum = _cumsum0(self.s - self.s.min() if len(self.s) else self.s)
        self.selection_form = selection_form
        self.rank = {t: i for i, t in enumerate(self.terms)}
        self.df = {t: int(d) for t, d in zip(self.terms, df)}
        self.n_docs = int(n_docs)
        self.beta, self.radius = float(beta), int(radius)
        self.selection, self.replacement, self.redraw, self.write_back = selection, replacement, redraw, write_back

    @classmethod
    def from_parquet(cls, path, rank_ties: str = "term", **kw) -> "UNAAugmenter":
        """The augmenter on a ``tfidf*.parquet``. ``rank_ties``: ``term`` keeps the file's ranks (equal s
        by term); ``first_seen`` ranks equal s by the terms' first occurrence in the corpus (its column
        ``first``), as the authors' code's stable sort of its corpus-ordered dict does."""
        import pyarrow.parquet as pq

        from ..stats import read_metadata

        cols = ["term", "df", "s", "rank"] + (["first"] if rank_ties == "first_seen" else [])
        missing = [c for c in cols if c not in pq.read_schema(path).names]
        if missing:
            raise SentembError(f"{path}: no column {', '.join(map(repr, missing))} (rank_ties: first_seen reads "
                               "'first', written since 2026-11-29): rebuild this file with the rule that made it, "
                               "stats_tfidf or stats_tfidf_para (e.g. `snakemake -R stats_tfidf_para ...`; the runs "
                               "that read it then rerun too)")
        t = pq.read_table(path, columns=cols)
        meta = read_metadata(path)
        if "n_docs" not in meta:
            raise SentembError(f"{path}: no n_docs in its metadata (write it with `sentemb stats`)")
        rank = t.column("rank").to_numpy()
        order = np.argsort(rank, kind="stable")
        if not np.array_equal(rank[order], np.arange(len(rank))):
            raise SentembError(f"{path}: column 'rank' is not 0..{len(rank) - 1}")
        if rank_ties == "first_seen":  # s descending, equal s by first occurrence
            order = np.lexsort((t.column("first").to_numpy(), -t.column("s").to_numpy()))
        terms = t.column("term").to_pylist()
        return cls([terms[i] for i in order], t.column("df").to_numpy()[order], t.column("s").to_numpy()[order],
                   meta["n_docs"], **kw)

    # -------------------------------------------------------------------------------------------
    @staticmethod
    def _spans(sentence: str, raw: list[str]):
        spans = token_spans(sentence, raw)
        return spans if spans is not None and len(spans) == len(raw) else None

    def _draw(self, term: str, rng: np.random.Generator) -> str:
        exclude = self.redraw == "exclude_self"
        k = self.rank[term]
        if self.replacement == "random":
            V = len(self.terms)
            if V <= 1:
                return term
            j = int(rng.integers(V - 1 if exclude else V))
            return self.terms[j + 1 if exclude and j >= k else j]
        return self.terms[sample_replacement(k, self.s, self.radius, rng, exclude_self=exclude, cumsum=self.cumsum)]

    def negative(self, sentence: str, rng: np.random.Generator) -> tuple[str, float]:
        """(UNA negative of ``sentence``, share of its scored terms replaced)."""
        from ..stats.tfidf import sentence_tfidf, word_tokens

        raw = word_tokens(sentence)  # tokenized once: the terms (lowercased) and the write-back's spans
        tokens = [t.lower() for t in raw]
        known = [t for t in tokens if t in self.df]
        if not known:
            return sentence, 0.0
        if len(known) == len(tokens):
            z_of = sentence_tfidf(tokens, self.df, self.n_docs)
        else:  # tf over all n tokens; unknown tokens are not scored (not in the statistics' vocabulary)
            z_of = {t: _tf_idf(tokens, t, self.df[t], self.n_docs) for t in dict.fromkeys(known)}
        uniq = list(z_of)  # the sentence's distinct known terms, first-seen order
        if self.selection_form == "code":  # per token position, each occurrence drawn and replaced on its own
            new = self._code_tokens(tokens, z_of, rng)
        else:
            if self.selection == "random":
                chosen = rng.random(len(uniq)) < self.beta
                chosen[int(rng.integers(len(uniq)))] = True
            else:
                chosen = rng.random(len(uniq)) < replacement_probabilities([z_of[t] for t in uniq], self.beta)
            repl = {t: self._draw(t, rng) for t, c in zip(uniq, chosen) if c}
            new = [repl.get(t, t) for t in tokens]
        changed = {old for old, t in zip(tokens, new) if old != t}
        out = self._write(sentence, tokens, new, raw)
        if self.redraw == "code" and out == sentence:
            # the code's fallback (function/tfidf_una.py ThresholdRep.__call__: `if example == output:
            # output = self.get_random_token()`): the negative is one vocabulary term drawn ∝ s − min s
            return self._fallback_term(rng), 1.0
        return out, min(1.0, len(changed) / len(uniq))

    def _code_tokens(self, tokens: list[str], z_of: dict[str, float], rng: np.random.Generator) -> list[str]:
        """Steps 2 and 3 as the authors' code computes them (``selection_form: code``;
        function/tfidf_una.py ``ThresholdRep.get_replace_prob`` and ``replace_tokens``): over the n
        token positions (a repeated term counted at each), p_i = β·n·(z_i − min z)/Σ_j (z_j − min z),
        not clipped; where every p < 1 the first arg-max is set to 1; where all z are equal (0/0: NaN)
        no position is replaced. One draw per position in order, and each replaced position gets a
        replacement of its own. ``selection: random``: each position with probability β, plus one
        uniformly chosen position: this project's per-position reading of the Table 2 ablation, not the
        code's ``UnifRep``. Unknown tokens (not in the statistics) have p = 0 and do not count."""
        pos = [i for i, t in enumerate(tokens) if t in z_of]
        u = rng.random(len(pos))
        if self.selection == "random":
            p = np.full(len(pos), self.beta)
            p[int(rng.integers(len(pos)))] = 1.0
        else:
            z = np.array([z_of[tokens[i]] for i in pos], dtype=np.float64)
            d = z - z.min()
            total = d.sum()
            if total > 0:
                p = d / total * self.beta * len(pos)
                if p.max() < 1:
                    p[int(np.argmax(p))] = 1.0
            else:  # the code's 0/0: NaN probabilities, and `random < nan` is false everywhere
                p = np.zeros(len(pos))
        new = list(tokens)
        for k, i in enumerate(pos):
            if u[k] < p[k]:
                new[i] = self._draw(tokens[i], rng)
        return new

    def _fallback_term(self, rng: np.random.Generator) -> str:
        """One vocabulary term drawn ∝ s_j − min s (uniformly where all s are equal): the code's
        ``get_random_token`` over its ``normalized_tf_idf``."""
        if not self.terms:
            raise SentembError("una: an empty TF-IDF vocabulary")
        cs = self.fallback_cumsum
        if cs[-1] <= 0:
            return self.terms[int(rng.integers(len(self.terms)))]
        j = int(np.searchsorted(cs, float(rng.random()) * cs[-1], side="right")) - 1
        return self.terms[min(max(j, 0), len(self.terms) - 1)]

    def _write(self, sentence: str, tokens: list[str], new: list[str], raw: list[str] | None = None) -> str:
        """The negative's text: ``new`` tokens written back (``write_back``). ``raw``: the
        sentence's word tokens in their case (``stats.tfidf.word_tokens``), when already made."""
        if self.write_back == "tokens":
            return " ".join(new)
        if raw is None:
            from ..stats.tfidf import word_tokens

            raw = word_tokens(sentence)
        spans = self._spans(sentence, raw)
        if spans is None:  # tokenizer spans do not align: the code's write-back for this sentence
            return " ".join(new)
        parts, last = [], 0
        for (a, b), old, t in zip(spans, tokens, new):
            parts.append(sentence[last:a])
            if t == old:
                parts.append(sentence[a:b])
            else:
                t = _match_case(sentence[a:b], _QUOTES.get(t, t))
                # a word written where an attached token stood ("(SA)", "do|n't") gets its own spaces
                if a > 0 and sentence[a - 1].isalnum() and t[:1].isalnum():
                    t = " " + t
                if b < len(sentence) and sentence[b].isalnum() and t[-1:].isalnum():
                    t = t + " "
                parts.append(t)
            last = b
        parts.append(sentence[last:])
        return "".join(parts)


def _tf_idf(tokens: list[str], term: str, df: int, n_docs: int) -> float:
    """tf·idf of ``term`` with tf over all of the sentence's tokens (UNA Eq. 2)."""
    import math

    return math.log1p(tokens.count(term) / len(tokens)) * (-math.log(df / n_docs) + 0.0)


# ------------------------------------------------------------------------------ losses
def symmetric_nt_xent(u: torch.Tensor, temperature: float) -> torch.Tensor:
    """NT-Xent over all R rows, each row a query, partner k⁺ = k xor 1 (rows in pairs), the
    others (l ≠ k) in the denominator; mean over rows (the UNA authors' code). fp32."""
    with torch.autocast(device_type=u.device.type, enabled=False):
        u = F.normalize(u.float(), dim=-1)
        sim = u @ u.T / temperature
        sim = sim.masked_fill(torch.eye(len(u), dtype=torch.bool, device=u.device), float("-inf"))
        target = torch.arange(len(u), device=u.device) ^ 1
        return F.cross_entropy(sim, target)


def simcse_hard_negative_loss(z1: torch.Tensor, z2: torch.Tensor, z3: torch.Tensor | None,
                              temperature: float) -> torch.Tensor:
    """S = [cos(z1_i, z2_j) | cos(z1_i, z3_j)]/τ (B × 2B; B × B without negatives), cross-entropy
    against arange(B) (Gao et al. 2021, Eq. 5 with unit hard-negative weight). fp32."""
    with torch.autocast(device_type=z1.device.type, enabled=False):
        z1 = F.normalize(z1.float(), dim=-1)
        cols = z2 if z3 is None else torch.cat([z2, z3], 0)
        sim = z1 @ F.normalize(cols.float(), dim=-1).T / temperature
        return F.cross_entropy(sim, torch.arange(len(z1), device=z1.device))


# ------------------------------------------------------------------------------ the method
@register_method
class UNA(Method):
    name = "una"

    @dataclass
    class Args:
        temperature: float = arg(0.05, "τ of the NT-Xent loss", exclusive_minimum=0)
        alpha: int = arg(5, "negatives join the batch on optimizer steps with step % alpha == 0 (from step 0)",
                         minimum=1)
        beta: float = arg(0.5, "β of the replacement probabilities (UNA Eq. 3): the mean p before clipping",
                          exclusive_minimum=0)
        radius: int = arg(4000, "r: replacements are drawn among terms ranked within r of the replaced term", minimum=1)
        paraphrase: bool = arg(False, "positives are the corpus line's paraphrase (paraphrases.txt) and the "
                               "statistics are tfidf_para.parquet; else a copy of the anchor and tfidf.parquet")
        negatives: bool = arg(True, "TF-IDF hard negatives every alpha steps; false = none (no TF-IDF "
                              "statistics): Table 1's 'paraphrasing only' row with paraphrase: true, its "
                              "SimCSE row (UNA's loop and loss, nothing added) without")
        loss: str = arg("symmetric", "symmetric: NT-Xent over all rows (authors' code); simcse: negatives as "
                        "extra columns of the B x B matrix", choices=("symmetric", "simcse"))
        selection: str = arg("tfidf", "which terms are replaced: by p_i (Step 2) or random (Table 2 ablation)",
                             choices=("tfidf", "random"))
        replacement: str = arg("tfidf", "replacement term: ∝ s within radius r (Step 3) or uniform over the "
                               "vocabulary (Table 2 ablation)", choices=("tfidf", "random"))
        redraw: str = arg("exclude_self", "exclude_self: a term is never replaced by itself (paper); code: it "
                          "may be, and a negative whose text equals its anchor's becomes one vocabulary term "
                          "drawn ∝ s − min s (the authors' fallback)", choices=("exclude_self", "code"))
        selection_form: str = arg("paper", "paper: Eq. 3-4 over the sentence's distinct terms (one draw and one "
                                  "replacement per term, the arg-max term always); code: over token positions "
                                  "(repeats counted, each occurrence drawn and replaced on its own, nothing "
                                  "replaced where all scores are equal: the code's 0/0)", choices=("paper", "code"))
        rank_ties: str = arg("term", "order of terms with equal s in the ranking the radius-r window runs over: "
                             "by term (the statistics file's), or first_seen: by first occurrence in the corpus "
                             "(code: a stable sort of its corpus-ordered dict)", choices=("term", "first_seen"))
        empty_paraphrase: str = arg("anchor", "an empty or whitespace-only paraphrase line (paraphrase: true): anchor - the anchor's copy "
                                    "is its positive (open choice: no paraphrase); empty - the empty text, [CLS] [SEP] "
                                    "(code: data/dataset.py reads the paraphrase file with load_dataset('text'), which "
                                    "keeps an empty line as ''); counted as empty_paraphrases either way",
                                    choices=("anchor", "empty"))
        write_back: str = arg("span", "span: replace character spans in the original sentence; tokens: "
                              "lowercased tokens joined by spaces (authors' code)", choices=("span", "tokens"))
        mlp_init: str = arg("normal", "the training MLP's Linear: N(0, initializer_range) weights and zero bias "
                            "(as SimCSE; the paper is silent), or PyTorch's default with its non-zero bias "
                            "(code: model/models.py MLPLayer)", choices=("normal", "torch"))

    eval_pooler = "cls_before_pooler"  # raw [CLS] at evaluation (the MLP is training-only)
    schedule_args = ("alpha", "radius")  # which steps mine negatives, not a step's shapes
    contract_args = {"paraphrase": True, "radius": 8, "alpha": 2}  # negatives on steps 0 and 2 of 4

    @classmethod
    def step_kinds(cls, args):
        """Negatives join the batch on one step in α (step 0 among them; of a run's T steps exactly
        ⌈T/α⌉, 1/α up to the last step); the other steps are those of ``negatives: false`` (2B rows)."""
        if not args.negatives or args.alpha <= 1:
            return [(1.0, {})]
        return [(1.0 / args.alpha, {}), (1.0 - 1.0 / args.alpha, {"negatives": False})]

    @classmethod
    def requires(cls, args):
        if not args.negatives:
            return ("paraphrases",) if args.paraphrase else ()
        return ("tfidf_para", "paraphrases") if args.paraphrase else ("tfidf",)

    def __init__(self, encoder, tokenizer, args, ctx):
        super().__init__(encoder, tokenizer, args, ctx)
        a = self.args
        self.mlp = MLPHead(encoder.config.hidden_size, getattr(encoder.config, "initializer_range", 0.02))
        if self.args.mlp_init == "torch":  # the code's MLPLayer: nn.Linear as PyTorch builds it (non-zero bias)
            self.mlp.dense.reset_parameters()
        self.augmenter = None
        if a.negatives:
            stats = ctx.input("tfidf_para" if a.paraphrase else "tfidf")
            self.augmenter = UNAAugmenter.from_parquet(stats, rank_ties=a.rank_ties, beta=a.beta, radius=a.radius,
                                                       selection=a.selection, replacement=a.replacement,
                                                       redraw=a.redraw, write_back=a.write_back,
                                                       selection_form=a.selection_form)
        self.paraphrases: list[str] | None = None
        if a.paraphrase:
            self.paraphrases = self._read_paraphrases(ctx.input("paraphrases"), ctx.corpus)

    @staticmethod
    def _read_paraphrases(path, corpus) -> list[str]:
        """All paraphrases, one per corpus line; a line count that differs from the corpus's fails
        here, i.e. before step 1."""
        from ..data.corpus import iter_lines

        para = list(iter_lines(path))
        if corpus is not None:
            from ..data.corpus import count_corpus_lines

            n = count_corpus_lines(corpus)
            if n != len(para):
                raise SentembError(f"{path} has {len(para)} lines but the corpus {corpus} has {n}: "
                                   "paraphrases must be one per corpus line (re-run the paraphrase stage)")
        return para

    # ---------------------------------------------------------------------------- batches
    def has_negatives(self, step: int) -> bool:
        return self.augmenter is not None and step % self.args.alpha == 0

    def build_batch(self, sentences, step=0, *, lines=None, micro=0):
        """Rows a_1, p_1, …, a_B, p_B [, ã_1, ã_1, …, ã_B, ã_B] (``loss: simcse``: ã_1, …, ã_B)
        tokenized together, plus scalar tensors ``negatives``, ``replaced``, ``empty_paraphrases``."""
        sentences = list(sentences)
        n_empty = 0
        if self.paraphrases is not None:
            if lines is None:
                raise SentembError("una with paraphrase: true needs the sentences' corpus line indices (lines=)")
            positives = []
            for s, i in zip(sentences, lines):
                p = self.paraphrases[int(i)]
                if not p.strip():
                    n_empty += 1
                    p = s if self.args.empty_paraphrase == "anchor" else ""
                positives.append(p)
        else:
            positives = sentences
        rows = [x for pair in zip(sentences, positives) for x in pair]
        # a_i is corpus line lines[i] (the token cache); p_i and the negatives are texts of their own
        row_lines = None if lines is None else [x for i in lines for x in (int(i), None)]
        n_neg, share = 0, 0.0
        if self.has_negatives(step):
            rng = self.np_rng(micro)
            made = [self.augmenter.negative(s, rng) for s in sentences]
            share = float(np.mean([r for _, r in made]))
            negs = [n for n, _ in made]
            if self.args.loss == "symmetric":
                negs = [x for n in negs for x in (n, n)]
            rows += negs
            n_neg = len(negs)
            if row_lines is not None:
                row_lines += [None] * n_neg
        # = tokenizer(rows, padding=True, ...), each distinct text tokenized once (Method.tokenize_rows)
        out = self.pad_rows(self.tokenize_rows(rows, row_lines))  # to a bucket of the longest row (train.buckets)
        out.update(negatives=torch.tensor(n_neg, dtype=torch.int64), replaced=torch.tensor(share, dtype=torch.float32),
                   empty_paraphrases=torch.tensor(n_empty, dtype=torch.int64),
                   neg_anchor=torch.arange(len(sentences)).repeat_interleave(n_neg // len(sentences)) if n_neg else
                   torch.zeros(0, dtype=torch.int64))
        return out

    @staticmethod
    def _n_negatives(batch) -> int:
        """The batch's negative rows, read from a shape (``neg_anchor``: each negative row's anchor),
        not from the ``negatives`` count's value: no host read inside the step (``train.graphs``)."""
        return batch["neg_anchor"].numel() if "neg_anchor" in batch else int(batch["negatives"])

    def n_sentences(self, batch):
        return (batch["input_ids"].size(0) - self._n_negatives(batch)) // 2

    def chunk(self, batch, start, stop):
        """Anchors ``[start, stop)``: their rows a_i, p_i and, on a step with negatives, their
        negatives' rows (ã_i, ã_i under ``loss: symmetric``, ã_i under ``simcse``); counts kept."""
        n, n_neg = self.n_sentences(batch), self._n_negatives(batch)
        k = n_neg // n if n_neg else 0  # rows per negative: 2 (symmetric) or 1 (simcse)
        dev = batch["input_ids"].device
        rows = torch.cat([torch.arange(2 * start, 2 * stop, device=dev), 2 * n + torch.arange(k * start, k * stop, device=dev)])
        out = {key: (v if v.dim() == 0 else v[rows]) for key, v in batch.items() if key != "neg_anchor"}
        out["negatives"] = torch.full((), k * (stop - start), dtype=torch.int64, device=dev)
        if "neg_anchor" in batch:
            out["neg_anchor"] = batch["neg_anchor"][k * start : k * stop] - start
        return out

    def encode(self, batch) -> Encoded:
        """u_k = MLP([CLS]) of every row: ``pairs`` (a_1, p_1, …) and ``negatives`` (the ã rows)."""
        from ..model.dropout import rows

        model_in = {k: v for k, v in batch.items() if k not in _META_KEYS}
        n_neg = self._n_negatives(batch)
        n = (batch["input_ids"].size(0) - n_neg) // 2
        per = n_neg // n if n else 0  # rows per negative
        dev = batch["input_ids"].device
        pair, neg = torch.arange(2 * n, device=dev), torch.arange(n * per, device=dev)
        # row -> (sentence, view), made on the device: a_i, p_i are views 0, 1; its negatives 2, 3
        sentence = torch.cat([pair // 2, neg // max(per, 1)])
        view = torch.cat([pair % 2, 2 + neg % max(per, 1)])
        with rows(sentence, view):  # keyed dropout (train.dropout_rng: keyed): a_i, p_i, ã_i are views of sentence i
            u = self.mlp(self.encoder(**model_in, return_dict=True).last_hidden_state[:, 0])
        n_pairs = u.size(0) - n_neg
        return Encoded(batch={"pairs": u[:n_pairs], "negatives": u[n_pairs:]})

    def batch_terms(self, emb, batch):
        tau = self.args.temperature
        pairs, negs = emb["pairs"], emb["negatives"]
        if self.args.loss == "symmetric":
            loss = symmetric_nt_xent(torch.cat([pairs, negs], 0), tau)
        else:
            loss = simcse_hard_negative_loss(pairs[0::2], pairs[1::2], negs if negs.size(0) else None, tau)
        return {"contrastive": loss.detach(), "negatives": batch["negatives"].float(),
                "replaced": batch["replaced"].float(), "empty_paraphrases": batch["empty_paraphrases"].float(),
                WEIGHTED: {"contrastive": loss}}

    def export_head(self):
        return self.mlp

"""PromptBERT, unsupervised (Jiang et al. 2022): the sentence is the [MASK] state of a template.

Jiang, Jiao, Huang, Zhang, Wang, Zhuang, Wei, Huang, Deng, Zhang (2022), "PromptBERT: Improving BERT
Sentence Embeddings with Prompts", EMNLP; arXiv:2201.04337. The authors' code is
github.com/kongds/Prompt-BERT (``run.sh unsup-bert``, ``prompt_bert/models.py``). A method written only
against sentemb's public API, in a file of its own (config key ``method_modules``); its
sentence-transformers module lives in ``promptbert_st.py`` next to it, which ``export`` copies into
the model.

What it computes. A template T with the sentence slot [X] and one [MASK] is filled with sentence x;
the sentence's representation is the last-layer state of the [MASK] token (the paper's "represent
sentence with the hidden vector of [MASK]" prompt representation):

    h_i = BERT(T(x_i))_[MASK]

Template denoising (the paper's unsupervised objective, §"Prompt based contrastive learning with
template denoising"): the template alone carries a bias, so the [MASK] state of the same template with
no sentence, at the position ids the template's tokens have around x_i (the tokens after [X] shifted
by x_i's length |x_i|), is subtracted:

    ĥ_i = BERT(T(∅); positions of T(x_i))_[MASK],      h̃_i = h_i − ĥ_i

Two *different* templates T, T' of the same sentence are the positive pair (the augmentation is the
template, plus dropout), and the loss is SimCSE's InfoNCE with temperature τ over in-batch negatives,
one direction, through a training-only Linear+Tanh head g (the authors' ``--mlp_only_train``):

    ℓ_i = −log  e^{cos(g(h̃_i), g(h̃'_i))/τ} / Σ_j e^{cos(g(h̃_i), g(h̃'_j))/τ}

ĥ is computed with the graph (the authors' default: ``mask_embedding_sentence_delta_freeze`` off), in
the same training mode (dropout) as h.

Evaluation embeds through template T too: the raw [MASK] state h_i, with no head and, by default, no
denoising (the authors' unsupervised evaluation, ``eargs`` of ``run.sh unsup-bert``, passes neither
``--mask_embedding_sentence_delta`` nor the MLP), the sentence ending in a period where it ends in none
of . ? " ' (``eval_period``, their ``evaluation.py``). The STS-B dev evaluation that selects the
checkpoint subtracts ĥ (``dev_denoise``, their trainer's ``sent_emb`` path) and adds no period. In
training ĥ is computed per sentence length and shared (``delta: per_length``, their ``get_delta``). ``eval_denoise: true`` subtracts ĥ at evaluation too:
the export then stores ĥ_k for every sentence length k (a (k_max + 1) × d table, computed once in eval
mode), as the authors' supervised evaluation computes it.

Defaults are the authors' BERT-base unsupervised run: T = 'This sentence of "[X]" means [MASK].'
(training and evaluation), T' = 'This sentence : "[X]" means [MASK].', τ = 0.05, batch 256, lr 1e-5,
one epoch, max_seq_length 32 (set the last four in the config's ``train``; their 32 sentence pieces
are ``max_len: 34``, below).

``max_len`` and the templates. ``train.max_len`` bounds the sentence as for every method (the corpus's
token cache: at most max_len − 2 word pieces, the [CLS] and [SEP] counted); the templates' own tokens
come on top, so a training row is max_len − 2 + |T| wide (|T|: the template's tokens with [CLS] and
[SEP]; 10 for the BERT defaults, so max_len 32 gives rows of 40), and the template-only rows |T| wide.
Building the method refuses a max_len whose rows would pass the model's positions (``max_length_of``),
naming max_len and the template. At evaluation a sentence keeps up to the model's maximum minus the
template's tokens (no truncation below the model's maximum otherwise, methods.md §0).

Use it from a config next to SimCSE::

    method_modules: [examples/methods/promptbert.py]
    runs:
      - {method: simcse, backbone: bert-base-uncased}
      - {method: promptbert, backbone: bert-base-uncased}

Open choices: the authors' training rows put the sentence's pieces between the template's pieces (as
here); with a WordPiece tokenizer that is the tokenization of the filled template. Templates are
given with ``[X]`` and ``[MASK]``; the authors' ``*cls*_..._*sep+*`` syntax is not read.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from sentemb import SentembError
from sentemb.methods import WEIGHTED, Encoded, Method, arg, method_source, register_method
from sentemb.methods.simcse import info_nce
from sentemb.model.backbone import MLPHead, export as export_encoder, load_encoder, max_length_of
from sentemb.model.dropout import rows


def _load_st():
    """``promptbert_st.py`` (next to this file) as a module: the functions the export shares."""
    name = __name__ + "_st"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("promptbert_st.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


st = _load_st()

DEFAULT_T = 'This sentence of "[X]" means [MASK].'
DEFAULT_T2 = 'This sentence : "[X]" means [MASK].'


@register_method
class PromptBERT(Method):
    """The [MASK] state of a template, denoised, two templates as the positive pair, InfoNCE."""

    name = "promptbert"

    @dataclass
    class Args:
        temperature: float = arg(0.05, "τ of the InfoNCE loss (SimCSE's Eq. 1 on the denoised [MASK] states)",
                                 exclusive_minimum=0)
        template: str = arg(DEFAULT_T, "T: the template of the first view and of evaluation, with '[X]' (the "
                            "sentence) and '[MASK]' once each (authors' unsup-bert)")
        template2: str = arg(DEFAULT_T2, "T': the template of the second view (the positive), same form")
        denoise: bool = arg(True, "template denoising in training: subtract the [MASK] state of the template "
                            "alone at the same positions (false = ablation without it)")
        eval_denoise: bool = arg(False, "subtract it at evaluation too (the export stores one vector per "
                                 "sentence length); authors' unsupervised evaluation: false")
        dev_denoise: bool = arg(True, "subtract it in the STS-B dev evaluation that selects the checkpoint (authors' "
                                "unsup-bert: --mask_embedding_sentence_delta makes their trainer's dev embedding "
                                "denoised, while their test evaluation is not)")
        eval_period: bool = arg(True, "at evaluation (and in the export), a sentence not ending in . ? \" ' gets a "
                                "period before it fills the template (authors' evaluation.py; not in their dev "
                                "selection)")
        delta: str = arg("per_length", "ĥ in training: per_length - one template row per sentence length, each with "
                         "its own dropout, shared by the batch's sentences of that length (within a chunk under "
                         "stream dropout; authors' get_delta); "
                         "per_sentence - one row per sentence (the paper's ĥ_i; the same without dropout)",
                         choices=("per_length", "per_sentence"))
        mlp: bool = arg(True, "a Linear+Tanh head on the views in training only (authors' --mlp_only_train)")
        delta_positions: str = arg("model", "the position ids of the template-alone rows (ĥ): model - the model's own "
                                   "first position, padding_idx + 1 on RoBERTa, where the sentence rows start; code - "
                                   "0 on every backbone (authors' models.py and get_delta: torch.arange from 0; on "
                                   "RoBERTa that includes position 1, its padding row). The same on BERT",
                                   choices=("model", "code"))

    eval_pooler = "method"
    #: The contract runs without template denoising in training: on its tiny random encoder (2 layers,
    #: weights of std 0.02) the sentence moves the [MASK] state by ~0.1% of its norm, so h − ĥ cancels ~99.9%
    #: and the gradient through h and through ĥ nearly cancel too; the fp32 round-off of another batch split
    #: (chunked, two processes) is amplified ~1000× past the contract's tolerances (measured: chunked 1e-3 vs
    #: 1e-4, devices 2.5e-5 vs 1e-5). tests/test_plugins.py checks the denoising itself against an independent
    #: computation. eval_denoise: the contract exercises the export's stored ĥ_k table. The contract's export
    #: check holds the export to the dev embedder, so both denoise and neither adds the period here (the
    #: authors' dev and test embeddings differ by those two; tests/test_plugins.py checks each).
    contract_args = {"denoise": False, "eval_denoise": True, "dev_denoise": True, "eval_period": False}

    @classmethod
    def check(cls, args, config, where="method_args"):
        for key in ("template", "template2"):
            t = getattr(args, key)
            if t.count("[X]") != 1 or t.count("[MASK]") != 1:
                raise SentembError(f"{where}.{key}: {t!r} must hold '[X]' (the sentence) and '[MASK]' once each")

    def __init__(self, encoder, tokenizer, args, ctx):
        super().__init__(encoder, tokenizer, args, ctx)
        a = self.args
        try:
            self.parts = [st.template_ids(tokenizer, a.template), st.template_ids(tokenizer, a.template2)]
        except ValueError as e:
            raise SentembError(f"method 'promptbert': {e}") from None
        self.mask_id = tokenizer.mask_token_id
        self.offset = st.position_offset(encoder.config) if a.delta_positions == "model" else 0
        limit = max_length_of(encoder, tokenizer)
        self.extra = max(len(h) + len(t) for h, t in self.parts)  # the longest template, [CLS] and [SEP] included
        self.row_limit = ctx.max_len - 2 + self.extra
        if self.row_limit > limit:
            raise SentembError(f"method 'promptbert': train.max_len {ctx.max_len} leaves rows of up to "
                               f"{ctx.max_len - 2} sentence pieces + {self.extra} template tokens = {self.row_limit}, "
                               f"more than the model's {limit} positions; lower max_len to at most "
                               f"{limit - self.extra + 2} or shorten the templates")
        self.mlp = MLPHead(encoder.config.hidden_size, getattr(encoder.config, "initializer_range", 0.02)) if a.mlp else None

    # ------------------------------------------------------------------ training
    def build_batch(self, sentences, step=0, *, lines=None, micro=0):
        tok = self.tokenize(sentences, lines)  # [CLS] s [SEP], truncated to max_len, as every method
        n = tok["attention_mask"].sum(1).tolist()
        sents = [tok["input_ids"][i, 1:k - 1].tolist() for i, k in enumerate(n)]
        lengths = torch.tensor([len(s) for s in sents], dtype=torch.long)
        width = self.width(max(len(s) for s in sents) + self.extra, limit=self.row_limit)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        out = {"lengths": lengths}
        for v, (head, tail) in enumerate(self.parts):
            ids, att = st.fill(sents, head, tail, pad, width)
            sfx = "" if v == 0 else "2"
            out[f"input_ids{sfx}"], out[f"attention_mask{sfx}"] = ids, att
            out[f"mask_pos{sfx}"] = st.mask_positions(lengths, head, tail, self.mask_id)
        return out

    def encode(self, batch):
        b = batch["input_ids"].size(0)
        ids = torch.cat([batch["input_ids"], batch["input_ids2"]])
        att = torch.cat([batch["attention_mask"], batch["attention_mask2"]])
        hidden = self.encoder(input_ids=ids, attention_mask=att, return_dict=True).last_hidden_state  # (2b, W, d)
        h = st.gather(hidden, torch.cat([batch["mask_pos"], batch["mask_pos2"]]))
        if self.args.denoise:
            noise = []
            per_length = self.args.delta == "per_length"
            # per_length: a row for every possible sentence length 0..max_len-2 (a static shape), gathered by length
            lengths = torch.arange(self.ctx.max_len - 1, device=batch["lengths"].device) if per_length \
                else batch["lengths"]
            n = len(lengths)
            for v, (head, tail) in enumerate(self.parts):
                t_ids, t_pos = st.template_rows(head, tail, lengths, self.offset)  # on the batch's device
                # keyed dropout: template row i is view 2 or 3 of key i; per_length's rows are keyed by the length
                # itself (absolute), so a chunk or a process draws the masks the whole batch draws
                with rows(list(range(n)), 2 + v, absolute=per_length):
                    th = self.encoder(input_ids=t_ids, position_ids=t_pos, attention_mask=torch.ones_like(t_ids),
                                      return_dict=True).last_hidden_state
                pos = st.mask_positions(torch.zeros(n, dtype=torch.long), head, tail, self.mask_id)
                hat = st.gather(th, pos)
                noise.append(hat[batch["lengths"]] if per_length else hat)
            h = h - torch.cat(noise)
        if self.mlp is not None:
            h = self.mlp(h)
        return Encoded(batch={"z1": h[:b], "z2": h[b:]})

    def batch_terms(self, emb, batch):
        loss = info_nce(emb["z1"], emb["z2"], self.args.temperature)
        return {"contrastive": loss.detach(), WEIGHTED: {"contrastive": loss}}

    # ------------------------------------------------------------------ evaluation and export
    def _table(self, model, longest: int, denoise: bool):
        head, tail = self.parts[0]
        return st.denoise_table(model, head, tail, self.mask_id, longest, offset=self.offset) if denoise else None

    def embedder(self, pooler, device):
        """The STS-B dev embedding that selects the checkpoint: through T, denoised with ``dev_denoise``
        (in eval mode, at the current weights), no period (the authors' trainer's dev batcher adds none)."""
        return PromptEmbedder(self.encoder, self.tokenizer, *self.parts[0], self.mask_id,
                              table=lambda longest: self._table(self.encoder, longest, self.args.dev_denoise),
                              device=device)

    def export(self, out_dir, pooler, meta):
        out_dir = Path(out_dir)
        limit = max_length_of(self.encoder, self.tokenizer)
        source = method_source(type(self))  # `sentemb evaluate` imports this file again to find the embedder
        export_encoder(self.encoder, self.tokenizer, out_dir, pooler="avg", head=None, max_seq_length=limit,
                       meta={**({"method_module": source[0]} if source else {}), **meta, "pooler": "method"})
        import json
        import shutil

        shutil.rmtree(out_dir / "1_Pooling", ignore_errors=True)
        head, tail = self.parts[0]
        table = self._table(self.encoder, limit - len(head) - len(tail), self.args.eval_denoise)
        st.save_prompt(out_dir, {"template": self.args.template, "head": head, "tail": tail, "mask_id": self.mask_id,
                                 "denoise": table is not None, "period": bool(self.args.eval_period)}, table)
        modules = [{"idx": 0, "name": "0", "path": "", "type": "promptbert_st.PromptTransformer"}]
        (out_dir / "modules.json").write_text(json.dumps(modules, indent=2))

    @classmethod
    def load_embedder(cls, model_dir, device, batch_size=128, precision="fp32"):
        cfg, table = st.load_prompt(model_dir)
        encoder, tokenizer = load_encoder(model_dir, device=device)
        return PromptEmbedder(encoder, tokenizer, cfg["head"], cfg["tail"], cfg["mask_id"],
                              table=(lambda longest: table), device=device, batch_size=batch_size, precision=precision,
                              period=bool(cfg.get("period", False)))


class PromptEmbedder:
    """list[str] -> (n, d) float32: each sentence through template T, the [MASK] state (minus ĥ_k with
    a table), length-sorted batches; a sentence keeps up to the model's maximum minus T's tokens."""

    def __init__(self, encoder, tokenizer, head, tail, mask_id, *, table, device, batch_size=128, precision="fp32",
                 period: bool = False):
        self.encoder, self.tokenizer, self.head, self.tail, self.mask_id = encoder, tokenizer, head, tail, mask_id
        self.table, self.device, self.batch_size, self.precision = table, torch.device(device), batch_size, precision
        self.period = period  # st.end_period before the template (the authors' evaluation.py)
        self.budget = max(1, max_length_of(encoder, tokenizer) - len(head) - len(tail))

    def __call__(self, sentences):
        uniq = list(dict.fromkeys(sentences))
        texts = [st.end_period(u) for u in uniq] if self.period else uniq
        sents = [list(s) for s in self.tokenizer(texts, add_special_tokens=False, truncation=True,
                                                 max_length=self.budget)["input_ids"]]
        table = self.table(self.budget)
        order = sorted(range(len(uniq)), key=lambda i: len(sents[i]), reverse=True)
        out = np.empty((len(uniq), self.encoder.config.hidden_size), dtype=np.float32)
        training = self.encoder.training
        self.encoder.eval()
        bf16 = self.precision == "bf16" or (self.precision == "auto" and self.device.type == "cuda"
                                            and torch.cuda.is_bf16_supported())
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        with torch.inference_mode(), torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=bf16):
            for k in range(0, len(order), self.batch_size):
                idx = order[k: k + self.batch_size]
                chunk = [sents[i] for i in idx]
                ids, att = st.fill(chunk, self.head, self.tail, pad)
                lengths = torch.tensor([len(s) for s in chunk], dtype=torch.long)
                mpos = st.mask_positions(lengths, self.head, self.tail, self.mask_id)
                h = st.embed_rows(self.encoder, ids.to(self.device), att.to(self.device), mpos, lengths, table)
                out[idx] = h.float().cpu().numpy()
        self.encoder.train(training)
        pos = {s: i for i, s in enumerate(uniq)}
        return out[[pos[s] for s in sentences]]


__all__ = ["PromptBERT", "PromptEmbedder"]

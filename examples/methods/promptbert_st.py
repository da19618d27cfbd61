"""PromptBERT's sentence embedding without sentemb: the template rows, the [MASK] state, the denoising.

This file needs only torch, transformers and (for ``PromptTransformer``) sentence-transformers. The
plug-in ``promptbert.py`` builds its training rows and its evaluation embedding with these
functions, and its ``export`` copies this file into the exported model, whose ``modules.json``
names ``promptbert_st.PromptTransformer``: ``SentenceTransformer(path, trust_remote_code=True)``
then embeds through the template exactly as ``sentemb evaluate`` does, with no sentemb installed.

A template is text with one ``[X]`` (the sentence) and one ``[MASK]`` (spelled ``[MASK]`` whatever the
tokenizer's mask token is). It is tokenized in two pieces around ``[X]`` and the sentence's word
pieces are put between them: ``head = [CLS] + pieces(prefix)``, ``tail = pieces(suffix) + [SEP]``,
row = head + sentence + tail. With a WordPiece (BERT) tokenizer, which splits at spaces and
punctuation first, the row equals the tokenization of the whole filled template; a byte-level BPE
(RoBERTa) joins a piece to its leading space, so there the template's spaces around ``[X]`` count.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

CONFIG_FILE = "promptbert.json"
DENOISE_FILE = "promptbert_denoise.safetensors"
ROBERTA_TYPES = ("roberta", "xlm-roberta", "camembert")


def template_ids(tokenizer, template: str) -> tuple[list[int], list[int]]:
    """``(head, tail)`` token ids of ``template`` around its ``[X]``; ValueError unless it holds one
    ``[X]`` and one ``[MASK]``."""
    if template.count("[X]") != 1 or template.count("[MASK]") != 1:
        raise ValueError(f"template {template!r} must hold '[X]' (the sentence) and '[MASK]' once each")
    if tokenizer.mask_token_id is None:
        raise ValueError("the tokenizer has no mask token")
    prefix, suffix = template.split("[X]")

    def pieces(text: str) -> list[int]:
        text = text.replace("[MASK]", tokenizer.mask_token)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text.strip() else []

    head = [tokenizer.cls_token_id, *pieces(prefix)]
    tail = [*pieces(suffix), tokenizer.sep_token_id]
    if (head + tail).count(tokenizer.mask_token_id) != 1:
        raise ValueError(f"template {template!r}: '[MASK]' does not tokenize to one mask token")
    return head, tail


def end_period(text: str) -> str:
    """The authors' ``evaluation.py``: a sentence that does not end in . ? " or ' gets a period
    before it fills the template (``if len(s) > 0 and s[-1] not in '.?"\'': s += '.'``)."""
    return text + "." if len(text) > 0 and text[-1] not in ".?\"'" else text


def position_offset(config) -> int:
    """The first position id: RoBERTa-type models count positions from padding_idx + 1."""
    return int(config.pad_token_id) + 1 if getattr(config, "model_type", "") in ROBERTA_TYPES else 0


def fill(sentences: list[list[int]], head: list[int], tail: list[int], pad_id: int, width: int | None = None):
    """Rows head + sentence + tail, right-padded to ``width`` (default: the longest row): ``input_ids``
    and ``attention_mask`` (n, width)."""
    rows = [head + s + tail for s in sentences]
    width = width or max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    att = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        att[i, : len(r)] = 1
    return ids, att


def mask_positions(lengths: torch.Tensor, head: list[int], tail: list[int], mask_id: int) -> torch.Tensor:
    """The [MASK]'s position in rows head + sentence (``lengths`` word pieces) + tail."""
    if mask_id in head:
        return torch.full_like(lengths, head.index(mask_id))
    return lengths + len(head) + tail.index(mask_id)


def template_rows(head: list[int], tail: list[int], lengths: torch.Tensor, offset: int = 0):
    """The template alone, one row per sentence (``lengths``: its word pieces), with the position ids
    it has around that sentence: head at offset + 0..|head|−1, tail shifted by the sentence's length
    (PromptBERT's template denoising: the same template, the same positions, no sentence).
    Returns ``input_ids`` and ``position_ids`` (n, |head| + |tail|)."""
    t = torch.arange(len(head) + len(tail), device=lengths.device)
    pos = offset + t.unsqueeze(0) + (t >= len(head)).long().unsqueeze(0) * lengths.long().unsqueeze(1)
    ids = torch.tensor(head + tail, dtype=torch.long, device=lengths.device).expand(lengths.numel(), -1)
    return ids, pos


def gather(hidden: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """``hidden[i, pos[i]]`` for each row i: (n, d)."""
    return hidden[torch.arange(hidden.size(0), device=hidden.device), pos.to(hidden.device)]


def denoise_table(model, head, tail, mask_id, longest: int, batch_size: int = 128,
                  offset: int | None = None) -> torch.Tensor:
    """ĥ_k, the [MASK] state of the template alone at the positions of a k-piece sentence, for k =
    0..longest (model in eval mode, no gradient): (longest + 1, d) float32. ``offset``: the first
    position id (default: the model's, ``position_offset``)."""
    dev = next(model.parameters()).device
    lengths = torch.arange(longest + 1)
    mpos = mask_positions(torch.zeros_like(lengths), head, tail, mask_id)  # no sentence in these rows
    ids, pos = template_rows(head, tail, lengths, position_offset(model.config) if offset is None else offset)
    out = []
    training = model.training
    model.eval()
    with torch.inference_mode():
        for s in range(0, ids.size(0), batch_size):
            h = model(input_ids=ids[s:s + batch_size].to(dev), position_ids=pos[s:s + batch_size].to(dev),
                      attention_mask=torch.ones_like(ids[s:s + batch_size]).to(dev), return_dict=True).last_hidden_state
            out.append(gather(h, mpos[s:s + batch_size]).float().cpu())
    model.train(training)
    return torch.cat(out) if out else torch.zeros(0, model.config.hidden_size)


def save_prompt(out_dir: str | Path, config: dict, table: torch.Tensor | None) -> None:
    """``promptbert.json`` (template, head, tail, mask id, denoise, period), the ĥ_k table if any, and this file."""
    out_dir = Path(out_dir)
    (out_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2), "utf-8")
    if table is not None:
        from safetensors.torch import save_file

        save_file({"table": table.contiguous()}, str(out_dir / DENOISE_FILE))
    if Path(__file__).resolve() != (out_dir / Path(__file__).name).resolve():
        shutil.copyfile(__file__, out_dir / Path(__file__).name)


def load_prompt(model_dir: str | Path) -> tuple[dict, torch.Tensor | None]:
    model_dir = Path(model_dir)
    cfg_file = model_dir / CONFIG_FILE
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{cfg_file} not found: not a PromptBERT export")
    cfg = json.loads(cfg_file.read_text("utf-8"))
    table = None
    if cfg.get("denoise"):
        from safetensors.torch import load_file

        table = load_file(str(model_dir / DENOISE_FILE))["table"]
    return cfg, table


def embed_rows(model, ids, att, mpos, lengths, table) -> torch.Tensor:
    """The sentence embedding of built rows: the [MASK] state, minus ĥ_k (``table``) when denoising."""
    h = gather(model(input_ids=ids, attention_mask=att, return_dict=True).last_hidden_state, mpos)
    if table is not None:
        h = h - table.to(h.device, h.dtype)[lengths.to(h.device)]
    return h


# ------------------------------------------------------------------------------------ sentence-transformers
def __getattr__(name: str):
    """``PromptTransformer``, defined on first use: sentence-transformers (several seconds to import)
    is imported only by what embeds through it (``SentenceTransformer(path, trust_remote_code=True)``
    reads the class named in ``modules.json``), not by sentemb, which imports this file for its
    functions in every job and Snakemake run that lists the plug-in."""
    if name == "PromptTransformer":
        cls = _prompt_transformer()
        if cls is not None:
            globals()[name] = cls
            return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _prompt_transformer():
    """The sentence-transformers module class, or None without sentence-transformers."""
    try:  # sentence-transformers >= 6
        from sentence_transformers.base.modules.transformer import Transformer as _Transformer
    except ImportError:  # pragma: no cover - sentence-transformers 5, or none
        try:
            from sentence_transformers.models import Transformer as _Transformer
        except ImportError:
            _Transformer = None
    if _Transformer is None:
        return None

    class PromptTransformer(_Transformer):
        """The encoder with PromptBERT's template around every sentence; ``sentence_embedding`` is
        the [MASK] state (minus the stored ĥ_k when the model denoises at evaluation)."""

        prompt: dict = {}
        table: torch.Tensor | None = None

        @classmethod
        def load(cls, model_name_or_path: str, subfolder: str = "", **kwargs):
            module = super().load(model_name_or_path, subfolder=subfolder, **kwargs)
            d = Path(model_name_or_path) / subfolder
            if not d.is_dir():  # a hub repository: its files through the cache
                from sentence_transformers.util import load_dir_path

                d = Path(load_dir_path(model_name_or_path, subfolder=subfolder))
            module.prompt, module.table = load_prompt(d)
            return module

        def save(self, output_path: str, *args, **kwargs) -> None:
            super().save(output_path, *args, **kwargs)
            save_prompt(output_path, self.prompt, self.table)

        def _rows(self, texts):
            head, tail = self.prompt["head"], self.prompt["tail"]
            budget = max(1, (self.max_seq_length or 512) - len(head) - len(tail))
            texts = [end_period(str(t)) if self.prompt.get("period") else str(t) for t in texts]
            sents = [list(s) for s in self.tokenizer(texts, add_special_tokens=False,
                                                     truncation=True, max_length=budget)["input_ids"]]
            ids, att = fill(sents, head, tail, self.tokenizer.pad_token_id or 0)
            lengths = torch.tensor([len(s) for s in sents], dtype=torch.long)
            return {"input_ids": ids, "attention_mask": att, "prompt_lengths": lengths,
                    "prompt_mask_pos": mask_positions(lengths, head, tail, self.prompt["mask_id"])}

        def preprocess(self, inputs, prompt=None, processing_kwargs=None, **kwargs):
            return {**self._rows(inputs), "modality": "text"}

        def tokenize(self, texts, *args, **kwargs):  # sentence-transformers 5
            return self._rows(texts)

        def forward(self, features, **kwargs):
            lengths, mpos = features.pop("prompt_lengths"), features.pop("prompt_mask_pos")
            features = super().forward(features, **kwargs)
            h = gather(features["token_embeddings"], mpos)
            if self.table is not None:
                h = h - self.table.to(h.device, h.dtype)[lengths.to(h.device)]
            features["sentence_embedding"] = h
            return features

    PromptTransformer.__qualname__ = "PromptTransformer"  # as if defined at the top level (its modules.json type)
    return PromptTransformer

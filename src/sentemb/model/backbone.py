"""Backbone loading, poolers and export in Hugging Face + sentence-transformers layout.

Poolers follow SimCSE's ``Pooler`` (princeton-nlp/SimCSE, ``simcse/models.py``):

* ``cls``: the model's pooler output (dense + tanh on [CLS]). For checkpoints trained here the
  SimCSE MLP head is saved in the pooler slot, as SimCSE's ``simcse_to_huggingface.py`` does.
* ``cls_before_pooler``: the raw last-layer [CLS] vector.
* ``avg``: attention-masked mean of the last layer.
* ``avg_first_last``: masked mean of (hidden_states[1] + hidden_states[-1]) / 2. As in SimCSE,
  "first" is the output of the first Transformer layer, not the embedding layer.
* ``avg_top2``: masked mean of the last two layers.
* ``avg_static_last``: masked mean of (hidden_states[0] + hidden_states[-1]) / 2, i.e. the (static)
  embedding-layer output and the last layer: what SimCSE's paper rows "first-last avg." computed
  before its code changed ``avg_first_last`` to the first Transformer layer (SimCSE issue #285).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .. import POOLERS, SentembError

log = logging.getLogger(__name__)


def needs_hidden_states(pooler: str) -> bool:
    return pooler in ("avg_first_last", "avg_top2", "avg_static_last")


def masked_mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)


def pool(pooler: str, outputs, attention_mask: torch.Tensor) -> torch.Tensor:
    """Sentence vectors from a Hugging Face encoder output (see module docstring)."""
    if pooler == "cls_before_pooler":
        return outputs.last_hidden_state[:, 0]
    if pooler == "cls":
        if getattr(outputs, "pooler_output", None) is None:
            raise SentembError("pooler 'cls' needs a model with a pooler layer; use 'cls_before_pooler'")
        return outputs.pooler_output
    if pooler == "avg":
        return masked_mean(outputs.last_hidden_state, attention_mask)
    if pooler == "avg_first_last":
        hs = outputs.hidden_states
        return masked_mean((hs[1] + hs[-1]) / 2.0, attention_mask)
    if pooler == "avg_static_last":
        hs = outputs.hidden_states
        return masked_mean((hs[0] + hs[-1]) / 2.0, attention_mask)
    if pooler == "avg_top2":
        hs = outputs.hidden_states
        return masked_mean((hs[-1] + hs[-2]) / 2.0, attention_mask)
    raise SentembError(f"unknown pooler '{pooler}' (choose from {', '.join(POOLERS)})")


def load_encoder(model_dir: str | Path, *, dropout: float | None = None, device=None, sdpa: bool = True,
                 pooling_layer: bool = True):
    """Load (model, tokenizer) from a Hugging Face directory; optionally override dropout rates.

    ``pooling_layer=False`` (training) leaves out BERT's pretrained NSP pooler (methods.md §0: it is
    neither loaded nor computed); models without that option load as they are."""
    from transformers import AutoConfig, AutoModel

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise SentembError(f"not a Hugging Face model directory (no config.json): {model_dir}")
    try:
        cfg = AutoConfig.from_pretrained(model_dir)
    except (OSError, ValueError) as e:
        raise SentembError(f"{model_dir}/config.json cannot be loaded by transformers: {type(e).__name__}: {e}") from None
    if dropout is not None:
        for key in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout"):
            if hasattr(cfg, key):
                setattr(cfg, key, dropout)
    kwargs = {"config": cfg}
    if not pooling_layer:
        kwargs["add_pooling_layer"] = False
    if sdpa:
        kwargs["attn_implementation"] = "sdpa"
    check_weights(model_dir)
    try:
        try:
            model = _from_pretrained(AutoModel, model_dir, kwargs)
        except (ValueError, ImportError):  # architecture without SDPA support
            kwargs.pop("attn_implementation", None)
            model = _from_pretrained(AutoModel, model_dir, kwargs)
    except (OSError, ValueError, ImportError) as e:
        raise SentembError(f"{model_dir}: the model cannot be loaded by transformers: {type(e).__name__}: {e}") from None
    tokenizer = load_tokenizer(model_dir)
    if device is not None:
        model.to(device)
    return model, tokenizer


#: written beside a tokenizer that stands in for a model's own (``sentemb.ops.shapes.write_model_dir``: a
#: real architecture, random weights, a small tokenizer of its family): its size is not the model's
STAND_IN_TOKENIZER = "sentemb_stand_in_tokenizer.txt"


def load_tokenizer(model_dir: str | Path, *, fast: bool = False):
    """The tokenizer of a Hugging Face model directory (what ``load_encoder`` returns beside the model),
    refused with an error naming the directory where its vocabulary is under half of ``config.json``'s
    ``vocab_size`` (no vocabulary file: transformers 5 then builds a tokenizer of its 5 special tokens,
    which maps every word to [UNK] without a word; or a cut one), or, without a ``vocab_size``, holds
    nothing but special tokens; with ``fast``, where no fast tokenizer can be built. A directory marked
    ``STAND_IN_TOKENIZER`` is not compared with ``vocab_size``."""
    from transformers import AutoTokenizer

    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise SentembError(f"model directory not found: {model_dir}")
    try:
        tok = AutoTokenizer.from_pretrained(str(model_dir), **({"use_fast": True} if fast else {}))
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise SentembError(f"{model_dir}: the tokenizer cannot be loaded by transformers: {type(e).__name__}: {e}") \
            from None
    if fast and not tok.is_fast:
        raise SentembError(f"{model_dir}: no fast tokenizer (tokenizer.json) available")
    try:
        vocab_size = json.loads((model_dir / "config.json").read_text("utf-8")).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        vocab_size = None  # a tokenizer-only directory, or a config.json that load_encoder names itself
    stand_in = (model_dir / STAND_IN_TOKENIZER).is_file()
    if isinstance(vocab_size, int) and len(tok) < vocab_size // 2 and not stand_in:
        raise SentembError(f"{model_dir}: the tokenizer has {len(tok)} tokens, config.json's vocab_size is "
                           f"{vocab_size}: its vocabulary file is missing, cut or another model's")
    if len(tok) <= len(set(tok.all_special_tokens)):
        raise SentembError(f"{model_dir}: the tokenizer has only its {len(tok)} special tokens: no vocabulary file "
                           "(a Hugging Face model directory saved with its tokenizer holds one)")
    return tok


def keep_stand_in_mark(out_dir: str | Path, tokenizer, config) -> None:
    """Mark a saved model whose tokenizer is far smaller than its vocabulary (``STAND_IN_TOKENIZER``):
    :func:`load_tokenizer` lets only a stand-in through, so the model trained from one is marked too."""
    if len(tokenizer) < getattr(config, "vocab_size", 0) // 2:
        (Path(out_dir) / STAND_IN_TOKENIZER).write_text(
            f"The tokenizer here stands in for the model's own ({len(tokenizer)} of its {config.vocab_size} ids): "
            "trained from a model directory of sentemb.ops.shapes.write_model_dir.\n", "utf-8")


def check_weights(model_dir: str | Path) -> None:
    """Refuse, naming the file, a weights file whose bytes cannot hold what its header describes (a
    cut download or copy): safetensors' header is read (a few KB); a ``.bin`` in PyTorch's zip format
    (since 1.6) must be a whole zip archive (an older pickle ``.bin`` is left to the loader). A directory
    without weights is left to the loader's message."""
    import zipfile

    model_dir = Path(model_dir)
    for path in sorted(model_dir.glob("*.safetensors")):
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                f.keys()
        except Exception as e:  # SafetensorError ("incomplete metadata, file not fully covered"), OSError
            raise SentembError(f"{path}: not a whole safetensors file ({type(e).__name__}: {e}); fetch it again") \
                from None
    for path in sorted(model_dir.glob("pytorch_model*.bin")):
        with open(path, "rb") as f:
            if f.read(2) != b"PK":  # PyTorch's format before 1.6 (a pickle stream): left to the loader
                continue
        try:
            with zipfile.ZipFile(path) as z:
                z.namelist()
        except (zipfile.BadZipFile, OSError) as e:
            raise SentembError(f"{path}: not a whole PyTorch checkpoint ({e}); fetch it again") from None


def _from_pretrained(auto_cls, model_dir, kwargs):
    try:
        return auto_cls.from_pretrained(model_dir, **kwargs)
    except TypeError:  # an architecture without add_pooling_layer
        if "add_pooling_layer" not in kwargs:
            raise
        return auto_cls.from_pretrained(model_dir, **{k: v for k, v in kwargs.items() if k != "add_pooling_layer"})


def _write_pooler_slot(out_dir: Path, head: nn.Module) -> None:
    """Store ``head`` (Linear ``.dense`` + Tanh) as ``pooler.dense.*`` in a saved checkpoint whose
    encoder was trained without a pooler, so ``--pooler cls`` of the export is [CLS] + head
    (SimCSE's ``simcse_to_huggingface.py`` layout)."""
    from safetensors.torch import load_file, save_file

    tensors = {"pooler.dense.weight": head.dense.weight.detach().cpu().contiguous(),
               "pooler.dense.bias": head.dense.bias.detach().cpu().contiguous()}
    single = out_dir / "model.safetensors"
    if single.is_file():
        state = load_file(str(single))
        state.update(tensors)
        save_file(state, str(single), metadata={"format": "pt"})
        return
    index = out_dir / "model.safetensors.index.json"
    if not index.is_file():
        raise SentembError(f"{out_dir}: no model.safetensors(.index.json) written; cannot store the head")
    idx = json.loads(index.read_text("utf-8"))
    save_file(tensors, str(out_dir / "pooler.safetensors"), metadata={"format": "pt"})
    idx["weight_map"].update({k: "pooler.safetensors" for k in tensors})
    index.write_text(json.dumps(idx, indent=2))


def max_length_of(model, tokenizer) -> int:
    """The longest input the model takes: no truncation beyond the model's maximum (methods.md §0)."""
    limit = getattr(model.config, "max_position_embeddings", 512)
    if getattr(model.config, "model_type", "") in ("roberta", "xlm-roberta", "camembert"):
        limit -= 2  # RoBERTa positions start after the padding index
    tl = getattr(tokenizer, "model_max_length", None)
    if tl and tl < 100_000:
        limit = min(limit, tl)
    return limit


class MLPHead(nn.Module):
    """SimCSE's training-only projection: Linear(h, h) + Tanh on [CLS] (Gao et al. 2021, §3)."""

    def __init__(self, hidden: int, init_std: float = 0.02):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.activation = nn.Tanh()
        # Same initialisation as a freshly built BERT pooler (SimCSE initialises its MLP this way).
        nn.init.normal_(self.dense.weight, std=init_std)
        nn.init.zeros_(self.dense.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(x))


def export(
    encoder,
    tokenizer,
    out_dir: str | Path,
    *,
    pooler: str,
    max_seq_length: int,
    head: MLPHead | None = None,
    meta: dict | None = None,
) -> None:
    """Save ``encoder`` in HF format plus the sentence-transformers files for ``pooler``.

    ``head`` (the SimCSE MLP) is written into the encoder's pooler slot when it has one, so the
    ``cls`` pooler of the saved model is [CLS] + trained MLP and ``cls_before_pooler`` is raw [CLS].
    ``out_dir`` must not be a final Snakemake output directly; callers write to a temporary dir.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    has_pooler = getattr(encoder, "pooler", None) is not None and hasattr(encoder.pooler, "dense")
    if head is not None and has_pooler:
        with torch.no_grad():
            encoder.pooler.dense.weight.copy_(head.dense.weight)
            encoder.pooler.dense.bias.copy_(head.dense.bias)
    encoder.save_pretrained(out_dir, safe_serialization=True)
    if head is not None and not has_pooler:
        if getattr(encoder.config, "model_type", "") not in ("bert", "roberta", "xlm-roberta", "camembert", "electra"):
            log.warning("%s: no pooler slot for the head; '--pooler cls' of this export is not [CLS]+head",
                        getattr(encoder.config, "model_type", "?"))
        else:
            _write_pooler_slot(out_dir, head)
    tokenizer.save_pretrained(out_dir)
    keep_stand_in_mark(out_dir, tokenizer, encoder.config)
    # sentence-transformers modules reproducing ``pooler``: Transformer -> Pooling (-> Dense+Tanh for
    # "cls", i.e. the pooler layer), so SentenceTransformer(out_dir) embeds as `sentemb evaluate` does.
    st_mode = {"cls_before_pooler": "cls", "cls": "cls", "avg": "mean"}.get(pooler)
    if st_mode is None:
        raise SentembError(f"pooler '{pooler}' has no sentence-transformers equivalent; export with "
                           "cls, cls_before_pooler or avg")
    hidden = encoder.config.hidden_size
    modes = {f"pooling_mode_{m}": False for m in ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens")}
    modes["pooling_mode_cls_token" if st_mode == "cls" else "pooling_mode_mean_tokens"] = True
    (out_dir / "1_Pooling").mkdir(exist_ok=True)
    (out_dir / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": hidden, **modes}, indent=2))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if pooler == "cls":
        dense = head.dense if head is not None else getattr(getattr(encoder, "pooler", None), "dense", None)
        if dense is None:
            raise SentembError("pooler 'cls' needs a model with a pooler layer")
        from safetensors.torch import save_file

        (out_dir / "2_Dense").mkdir(exist_ok=True)
        (out_dir / "2_Dense" / "config.json").write_text(json.dumps({
            "in_features": hidden, "out_features": hidden, "bias": True,
            "activation_function": "torch.nn.modules.activation.Tanh"}, indent=2))
        save_file({"linear.weight": dense.weight.detach().cpu().contiguous(),
                   "linear.bias": dense.bias.detach().cpu().contiguous()}, str(out_dir / "2_Dense" / "model.safetensors"))
        modules.append({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (out_dir / "modules.json").write_text(json.dumps(modules, indent=2))
    (out_dir / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False}, indent=2)
    )
    (out_dir / "sentemb.json").write_text(json.dumps({"pooler": pooler, **(meta or {})}, indent=2, default=str))


# ----------------------------------------------------------------------------- MLM head
def read_weights(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a HF checkpoint directory (single or sharded safetensors, or pytorch_model.bin),
    under today's names (:func:`modern_names`)."""
    from safetensors.torch import load_file

    model_dir = Path(model_dir)
    if (model_dir / "model.safetensors").is_file():
        return modern_names(load_file(str(model_dir / "model.safetensors")))
    idx = model_dir / "model.safetensors.index.json"
    if idx.is_file():
        out = {}
        for f in sorted(set(json.loads(idx.read_text("utf-8"))["weight_map"].values())):
            out.update(load_file(str(model_dir / f)))
        return modern_names(out)
    if (model_dir / "pytorch_model.bin").is_file():
        return modern_names(torch.load(model_dir / "pytorch_model.bin", map_location="cpu", weights_only=True))
    raise SentembError(f"{model_dir}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin")


def check_same_vocabulary(tokenizer, other, where: str) -> None:
    """Raise unless ``tokenizer`` maps every token to the id that ``other`` (a tokenizer) does (the same
    vocabulary): a run whose weights come from another checkpoint than its backbone
    (``runs[].weights``) is fed token ids and statistics made with the backbone's tokenizer."""
    mine, theirs = tokenizer.get_vocab(), other.get_vocab()
    if mine != theirs:
        differ = sorted(set(mine.items()) ^ set(theirs.items()))[:3]
        raise SentembError(f"{where}: the two vocabularies differ ({len(mine)} and {len(theirs)} tokens; e.g. "
                           f"{differ}): the token cache and the statistics are the backbone's tokenizer's; name "
                           "weights with the backbone's vocabulary")


def modern_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A checkpoint's tensor names as ``from_pretrained`` reads them: ``LayerNorm.gamma`` is
    ``LayerNorm.weight`` and ``LayerNorm.beta`` is ``LayerNorm.bias``. Google's BERT checkpoints on the Hub (``bert-base-uncased``,
    ``bert-large-uncased``: their ``model.safetensors`` too) still name every LayerNorm's tensors
    ``LayerNorm.gamma`` / ``LayerNorm.beta``, among them the MLM head's ``cls.predictions.transform``,
    which PaSeR and InfoCSE read from the file themselves (transformers renames them on load)."""
    rename = {"LayerNorm.gamma": "LayerNorm.weight", "LayerNorm.beta": "LayerNorm.bias"}
    out = {}
    for k, v in state.items():
        old = next((o for o in rename if k.endswith(o)), None)
        name = k[: -len(old)] + rename[old] if old else k
        if name in out or (old and name in state):
            raise SentembError(f"checkpoint names {name} twice (as {k} and {name})")
        out[name] = v
    return out


def mlm_head_state(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The ``cls.predictions.*`` tensors of a checkpoint's weights (prefix removed; Condenser's
    ``lm.`` prefix too); {} when it has no MLM head."""
    for p in ("lm.cls.predictions.", "cls.predictions."):
        s = {k[len(p):]: v for k, v in weights.items() if k.startswith(p)}
        if s:
            return s
    return {}


class MLMHead(nn.Module):
    """BERT's MLM prediction head (``cls.predictions``): dense + activation + LayerNorm, then
    logits = x Wᵀ + b (Devlin et al. 2019; InfoCSE's Eq. 4 W, PaSeR's L_MLM).

    ``tied``: an embedding module whose weight is W (as in BERT; not registered as a submodule, so
    the word embeddings stay the encoder's); else W is this head's own parameter, copied from
    ``weight`` (InfoCSE's stage-2 auxiliary head)."""

    def __init__(self, config, tied: nn.Embedding | None = None, weight: torch.Tensor | None = None):
        super().__init__()
        from transformers.activations import ACT2FN

        h = config.hidden_size
        self.dense = nn.Linear(h, h)
        self.act = ACT2FN[getattr(config, "hidden_act", "gelu")]
        self.LayerNorm = nn.LayerNorm(h, eps=getattr(config, "layer_norm_eps", 1e-12))
        self.bias = nn.Parameter(torch.zeros(tied.num_embeddings if tied is not None else config.vocab_size))
        self._tied = [tied] if tied is not None else None  # a list: not registered as a submodule twice
        self.weight = None if tied is not None else nn.Parameter(
            weight.detach().clone() if weight is not None else torch.empty(config.vocab_size, h).normal_(
                std=getattr(config, "initializer_range", 0.02)))
        nn.init.normal_(self.dense.weight, std=getattr(config, "initializer_range", 0.02))
        nn.init.zeros_(self.dense.bias)

    @property
    def W(self) -> torch.Tensor:
        return self._tied[0].weight if self._tied is not None else self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.LayerNorm(self.act(self.dense(x))), self.W, self.bias)

    def load_bert(self, state: dict[str, torch.Tensor], where: str) -> None:
        """From BERT's ``cls.predictions.*`` tensors (the decoder weight, when present and untied here)."""
        own = {"dense.weight": "transform.dense.weight", "dense.bias": "transform.dense.bias",
               "LayerNorm.weight": "transform.LayerNorm.weight", "LayerNorm.bias": "transform.LayerNorm.bias",
               "bias": "bias"}
        if self.weight is not None and "decoder.weight" in state:
            own["weight"] = "decoder.weight"
        missing = [v for v in own.values() if v not in state]
        if missing:
            raise SentembError(f"{where}: MLM head tensors missing: cls.predictions.{', cls.predictions.'.join(missing)}")
        with torch.no_grad():
            for k, v in own.items():
                dst = dict(self.named_parameters())[k]
                if dst.shape != state[v].shape:
                    raise SentembError(f"{where}: cls.predictions.{v} has shape {tuple(state[v].shape)}, "
                                       f"expected {tuple(dst.shape)} (another hidden size or vocabulary?)")
                dst.copy_(state[v])

    def bert_state(self) -> dict[str, torch.Tensor]:
        out = {"transform.dense.weight": self.dense.weight, "transform.dense.bias": self.dense.bias,
               "transform.LayerNorm.weight": self.LayerNorm.weight, "transform.LayerNorm.bias": self.LayerNorm.bias,
               "bias": self.bias, "decoder.weight": self.W}
        return {f"cls.predictions.{k}": v.detach().cpu().contiguous() for k, v in out.items()}

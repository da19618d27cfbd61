"""InfoCSE: information-aggregated contrastive learning (Wu et al., 2022; the method spec §4).

Notation of the paper (§2-3): H = BERT's last-layer states, h = its [CLS] vector, M = the 6th
layer's states and M^{>0} = those at every position but [CLS]; W = the MLM output matrix.

Two pipeline stages.

**Stage 1, auxiliary-network pretraining** (§3.1; ``sentemb pretrain``, rule ``pretrain``, class
``InfoCSEPretrain`` run by the shared loop with ``model_selection: last``). x̂ = x with 15% of its
tokens masked (80% [MASK] / 10% random / 10% kept). H = BERT(x̂); the auxiliary network shares
BERT's lower ``skip_from`` layers; its ``head_layers`` extra Transformer layers read
[h; M^{>0}] (Eq. 5's input) and predict the masked tokens through the same W as BERT's own MLM:

    L_aux = Σ_{j∈masked} CE(H̃^j W, x̂^j)   (Eq. 5),   L_mlm = Σ_{j∈masked} CE(H^j W, x̂^j)   (Eq. 4),
    L^pretrain = L_aux + L_mlm   (Eq. 6).

The output (``results/pretrain/infocse/<backbone>/model``) is the encoder (HF layout) with
``aux_head.safetensors`` holding the extra layers (``c_head.<i>.*``, Condenser's names) and the MLM
head (``cls.predictions.*``, BERT's names), and ``infocse_aux.json``.

**Stage 2, joint training** (§3.2). z1, z2 = MLP([CLS]) of two dropout views (SimCSE, Eq. 3,
τ = 0.05, fp32). x̂ = x masked at ``mask_rate`` (0.4, Table 7). The auxiliary network no longer shares
the lower layers: a frozen copy of the embeddings and lower ``skip_from`` layers (kept in eval mode)
gives M^{>0} of x̂, and

    C = [h; Detach(M^{>0})],   L_aux = Σ_{j∈masked} CE(Layers_2(C)^j W, x̂^j),
    L^joint = L_cl + λ·L_aux   (Eq. 7),  λ = 1e-5 (Table 8 and the authors' code; §4.2's text: 0.005)

with h the main encoder's [CLS] of the *unmasked* sentence: the only path of L_aux's gradient
into the encoder. Both the main encoder and the auxiliary network start from stage 1 (§3.2); the
auxiliary MLM head is the network's own trainable copy of stage 1's head (W included, so that W is
not the main encoder's word-embedding matrix, which would be a second gradient path). Evaluation
uses the raw last-layer [CLS] (Table 9).

Choices the paper leaves **open** (switches):

* ``aux_inputs``: ``sentence`` (paper §3.2: "copied twice ... the other is used to generate the
  masked input": one masked copy per sentence, paired with the first dropout view's [CLS]) or
  ``view`` (the authors' code, built on SimCSE's ``do_mlm``: one masked copy per view, each with its
  own view's [CLS]).
* ``cls_layer``: which layer's [CLS] is h. ``null`` = the last layer (the 12th on BERT-base; on
  BERT-large the paper does not say, the last layer (24th) is taken).
* ``skip_from`` (6) and ``head_layers`` (2) are the paper's 6 and 2 on 12-layer BERT; smaller
  backbones (the tiny test BERT, 6-layer MiniLM) need a smaller ``skip_from`` (< the backbone's
  number of layers; checked, the error names the key).
* Stage 1's masking unit: single tokens (BERT's MLM, the paper's §2) by default;
  ``pretrain.mask_unit: word`` masks whole words as Condenser does.
* Loss reduction: the mean over masked positions (the HF/authors' code convention, with which the
  λ of Table 8 was tuned) instead of Eq. 4/5's sum.
* ``mlp: batchnorm``: the authors' code's ``--batchnorm`` head, taken to be DiffCSE's projection
  (Linear → BatchNorm → ReLU → Linear → BatchNorm without affine; the code InfoCSE builds on).
* Random replacement tokens are drawn from the whole vocabulary (BERT / HF collator convention).
* ``projection_init``: the BatchNorm projection's Linear layers at PyTorch's default (``torch``) or
  N(0, initializer_range) as the code's ``init_weights`` leaves them (``normal``, ``infocse-code``).
* ``aux_lower_eval``: the frozen lower copy in eval mode (default; the code's ``--mlm_eval``, set by
  its base script), or in training mode with dropout (``false``: its BERT-large script omits the flag,
  ``infocse-code`` on bert-large-uncased).
* Bucketed widths (``train.buckets``): the masks of both stages are drawn over the batch's real
  width (its longest row), not the bucket it is padded to (``mask_tokens(width=)``), so a batch is
  masked alike with and without buckets; the padding columns are attention 0 and label -100, and
  the losses on the real tokens are unchanged (``tests/test_buckets.py``).

Presets: the paper values are the defaults; ``infocse-code`` in ``config/config.yaml`` carries the
code's (2 epochs, lr 7e-6, ``mlp: batchnorm``, mask 0.3 on large). Ablations: ``init: backbone``
(Table 4, no pretraining: the auxiliary network is the backbone's lower ``skip_from`` and upper
``head_layers`` layers), ``detach: false`` (Table 6: the lower auxiliary layers are trainable); the λ
and mask-rate sweeps (Tables 7, 8) are the studies ``infocse-lambda`` and ``infocse-mask``. ``aux_checkpoint`` skips stage 1 with a directory holding a BERT
encoder, its MLM head and the head layers (this module's stage-1 output, or a Condenser checkpoint
with head weights: ``c_head.*`` in ``model.pt``); a headless one is refused unless ``head_init:
random``. ``aux_checkpoint: model`` is the model the run loads: with ``runs[].weights`` naming the
Hub's Condenser (``infocse-code``), the encoder, the frozen lower copy and the MLM head all come from
it, as in the authors' ``train_cls_mlm.py``.
* ``head_init``: the auxiliary network's ``head_layers`` come with the rest of it (``pretrained``:
  stage 1 or ``aux_checkpoint``, or with ``init: backbone`` the backbone's upper layers; the paper
  pretrains both networks), or start fresh (``random``: N(0, initializer_range), biases 0, LayerNorm
  1/0). ``random`` is what the authors' scripts run: they name Hub checkpoints (``Luyu/condenser``,
  ``ffgcc/condenser-bert-large-uncased``) that hold no ``c_head``, and ``train_cls_mlm.py`` loads
  ``model.pt`` only from a local directory, so its ``c_head`` keeps ``init_weights``'s draw, while the
  encoder, the frozen lower copy and the MLM head come from Condenser. ``infocse-code`` sets it.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .. import SentembError
from ..config.fields import check_mapping, fields, to_dict
from ..config.settings import PretrainStage
from ..model.backbone import MLMHead, MLPHead, mlm_head_state, read_weights
from .base import WEIGHTED, Encoded, Method, arg, slice_rows
from .registry import register_method
from .masking import mask_tokens  # noqa: F401  (public here too: BERT's MLM corruption)
from .simcse import info_nce

log = logging.getLogger(__name__)

AUX_HEAD_FILE = "aux_head.safetensors"
AUX_META_FILE = "infocse_aux.json"

@dataclass
class PretrainBlock(PretrainStage):
    """The keys of ``methods.infocse.pretrain`` besides the training settings (``TrainSettings``):
    the stage's corpus and seed, and its masking."""

    mask_rate: float = arg(0.15, "share of tokens masked for L_mlm and L_aux (BERT's 15%)")
    mask_unit: str = arg("token", "mask word pieces, or whole words as Condenser does", choices=("token", "word"))


#: keys of the ``pretrain`` block besides the training settings
PRETRAIN_OWN_KEYS = {f.name for f in fields(PretrainBlock)}
#: stage-1 training defaults (paper §4.1: Condenser's 8 epochs, lr 1e-4, batch 1024; Condenser's
#: warmup 10% and weight decay 0.01); the configured corpus, not BookCorpus + Wikipedia
PRETRAIN_TRAIN_DEFAULTS = {"epochs": 8, "batch_size": 1024, "lr": 1e-4, "warmup_ratio": 0.1, "weight_decay": 0.01,
                           "model_selection": "last", "eval_at_end": False}
#: what ``infocse_aux.json`` records as the stage (``corpus`` only when given)
PRETRAIN_DEFAULTS = {k: v for k, v in to_dict(PretrainBlock()).items() if k != "corpus"}


# ----------------------------------------------------------------------------------- masking
# ----------------------------------------------------------------------------------- modules
class BatchNormProjection(nn.Module):
    """The authors' code's ``--batchnorm`` head (DiffCSE's ProjectionMLP): Linear → BN → ReLU →
    Linear → BN (no affine), no biases."""

    def __init__(self, hidden: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(hidden, 2 * hidden, bias=False), nn.BatchNorm1d(2 * hidden), nn.ReLU(),
                                 nn.Linear(2 * hidden, hidden, bias=False), nn.BatchNorm1d(hidden, affine=False))

    def forward(self, x):
        return self.net(x)


def _init_bert_(module: nn.Module, std: float) -> None:
    """BERT's initialisation (normal(0, initializer_range) weights, zero biases, unit LayerNorm)."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def _extended_mask(attention_mask: torch.Tensor, dtype: torch.dtype, sdpa: bool) -> torch.Tensor:
    """(B, L) 1/0 -> (B, 1, 1, L) mask for a BertLayer: boolean for SDPA (any autocast dtype), else
    additive (eager attention adds it to the scores)."""
    m = attention_mask[:, None, None, :]
    if sdpa:
        return m.bool()
    return (1.0 - m.to(dtype)) * torch.finfo(dtype).min


def run_layers(layers, states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    cfg = getattr(getattr(getattr(layers[0], "attention", None), "self", None), "config", None) if len(layers) else None
    sdpa = getattr(cfg, "_attn_implementation", None) == "sdpa"
    ext = _extended_mask(attention_mask, states.dtype, sdpa) if attention_mask is not None else None
    for layer in layers:
        out = layer(states, attention_mask=ext)
        states = out[0] if isinstance(out, tuple) else out
    return states


def aux_mlm_loss(cls: torch.Tensor, lower_states: torch.Tensor, labels: torch.Tensor, head_layers,
                 output_matrix, attention_mask: torch.Tensor | None = None,
                 count: torch.Tensor | None = None, static: bool = False) -> torch.Tensor:
    """The auxiliary network's MLM loss, Eq. 5 (stage 1) / §3.2 (stage 2):

        C = [h; M^{>0}],  H̃ = Layers_2(C),  L_aux = mean_{j∈masked} CE(H̃^j W, x̂^j).

    ``cls`` (B, H): h. ``lower_states`` (B, L-1, H): M^{>0}, the positions after [CLS] (the caller
    detaches it in stage 2). ``labels`` (B, L): original ids at masked positions, -100 elsewhere
    (position 0 is [CLS], never masked). ``head_layers``: the extra Transformer layers.
    ``output_matrix``: W, a (V, H) tensor (logits = x Wᵀ) or a module mapping states to logits (BERT's
    MLM head). ``attention_mask`` (B, L): padding. A batch without a masked token gives 0 (not NaN),
    still connected to the graph. ``count``: divide the summed cross-entropy by the whole batch's
    number of masked tokens instead of the mean (a chunk's share, ``Method.row_terms``). ``static``:
    over every position (``static_masked_ce``; ``train.graphs``), the same number."""
    states = torch.cat([cls.unsqueeze(1), lower_states], dim=1)
    out = run_layers(head_layers, states, attention_mask)
    if static:
        from .masking import static_masked_ce

        return static_masked_ce(out, labels, output_matrix, count)
    sel = labels != -100
    picked = out[sel]
    logits = picked @ output_matrix.T if isinstance(output_matrix, torch.Tensor) else output_matrix(picked)
    with torch.autocast(device_type=logits.device.type, enabled=False):
        if not bool(sel.any()):
            return logits.float().sum() * 0.0 + cls.float().sum() * 0.0
        return _mean_ce(logits, labels[sel], count)


def _mean_ce(logits: torch.Tensor, labels: torch.Tensor, count: torch.Tensor | None) -> torch.Tensor:
    """Cross-entropy in fp32, the mean over the rows, or the sum divided by ``count``."""
    if count is None:
        return F.cross_entropy(logits.float(), labels)
    return F.cross_entropy(logits.float(), labels, reduction="sum") / count


def mlm_loss(states: torch.Tensor, labels: torch.Tensor, head: nn.Module, count: torch.Tensor | None = None,
             static: bool = False) -> torch.Tensor:
    """BERT's own MLM loss, Eq. 4 (mean over masked positions, fp32; 0 when nothing is masked);
    ``count`` and ``static`` as in ``aux_mlm_loss``."""
    if static:
        from .masking import static_masked_ce

        return static_masked_ce(states, labels, head, count)
    sel = labels != -100
    logits = head(states[sel])
    with torch.autocast(device_type=logits.device.type, enabled=False):
        if not bool(sel.any()):
            return logits.float().sum() * 0.0 + states.float().sum() * 0.0
        return _mean_ce(logits, labels[sel], count)


# ----------------------------------------------------------------------------------- checkpoints
def _strip(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def encoder_state(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The BertModel tensors of a checkpoint (BertModel or BertForMaskedLM/Condenser ``bert.*`` /
    ``lm.bert.*`` names), without the NSP pooler."""
    for p in ("lm.bert.", "bert."):
        if any(k.startswith(p) for k in weights):
            weights = _strip(weights, p)
            break
    return {k: v for k, v in weights.items() if not k.startswith(("cls.", "pooler.", "c_head."))}


def read_aux_checkpoint(path: str | Path, hidden_size: int, head_layers: int, need_layers: bool = True,
                        need_mlm: bool = True) -> dict[str, Any]:
    """Encoder, MLM head and auxiliary head layers of a stage-1 output or ``aux_checkpoint``.

    Layouts: this module's (``aux_head.safetensors``: ``c_head.<i>.*`` + ``cls.predictions.*``), or a
    Condenser checkpoint (HF weights with ``cls.predictions.*`` + ``model.pt`` holding ``c_head.*``).
    ``need_layers=False`` (``head_init: random``): the head layers are not read, and a headless
    checkpoint (the Hub's Condenser) serves. ``need_mlm=False`` (``aux_checkpoint: model``): a checkpoint
    without an MLM head gives ``mlm`` {} (the head then starts fresh). Errors name the path and what is
    missing."""
    from safetensors.torch import load_file

    path = Path(path)
    if not (path / "config.json").is_file():
        raise SentembError(f"InfoCSE auxiliary checkpoint {path}: not a model directory (no config.json)")
    cfg = json.loads((path / "config.json").read_text("utf-8"))
    if cfg.get("hidden_size") != hidden_size:
        raise SentembError(f"InfoCSE auxiliary checkpoint {path}: hidden size {cfg.get('hidden_size')} differs from "
                           f"the backbone's {hidden_size}")
    weights = read_weights(path)
    head: dict[str, torch.Tensor] = {}
    if (path / AUX_HEAD_FILE).is_file():
        head = load_file(str(path / AUX_HEAD_FILE))
    elif (path / "model.pt").is_file():  # Condenser: the head's state dict beside the HF weights
        head = torch.load(path / "model.pt", map_location="cpu", weights_only=True)
    layers = _strip(head, "c_head.") if need_layers else {}
    if need_layers and not layers:
        raise SentembError(f"InfoCSE auxiliary checkpoint {path}: no auxiliary head layers (c_head.<i>.* in "
                           f"{AUX_HEAD_FILE} or model.pt); a headless checkpoint cannot start stage 2 (drop "
                           "aux_checkpoint to run the pretrain stage, or set head_init: random as the authors' "
                           "scripts run)")
    n = len({k.split(".")[0] for k in layers})
    if need_layers and n != head_layers:
        raise SentembError(f"InfoCSE auxiliary checkpoint {path}: {n} head layers, but head_layers is {head_layers}")
    mlm = mlm_head_state(head) or mlm_head_state(weights)
    if not mlm and need_mlm:
        raise SentembError(f"InfoCSE auxiliary checkpoint {path}: no MLM head (cls.predictions.*)")
    enc = encoder_state(weights)
    meta = json.loads((path / AUX_META_FILE).read_text("utf-8")) if (path / AUX_META_FILE).is_file() else {}
    return {"encoder": enc, "mlm": mlm, "layers": layers, "meta": meta}


def _load_encoder_state(encoder: nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    missing, unexpected = encoder.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("pooler.")]
    if missing:
        raise SentembError(f"{where}: encoder tensors missing: {', '.join(missing[:5])}"
                           f"{' ...' if len(missing) > 5 else ''}")


def _check_layers(args: dict, n_layers: int, need_head_from_backbone: bool) -> None:
    where = "(config key methods.infocse.{k} or runs[].method_args.{k})"
    if not 1 <= args.skip_from < n_layers:
        raise SentembError(f"infocse: skip_from = {args.skip_from} must be between 1 and the backbone's number of "
                           f"layers minus one ({n_layers - 1}) {where.format(k='skip_from')}")
    if args.head_layers < 1 or (need_head_from_backbone and args.head_layers > n_layers):
        raise SentembError(f"infocse: head_layers = {args.head_layers} must be between 1 and the backbone's "
                           f"{n_layers} layers {where.format(k='head_layers')}")
    cl = args.cls_layer
    if cl is not None and not 1 <= cl <= n_layers:
        raise SentembError(f"infocse: cls_layer = {cl} must be between 1 and the backbone's {n_layers} layers "
                           f"{where.format(k='cls_layer')}")


# ----------------------------------------------------------------------------------- stage 2
@register_method
class InfoCSE(Method):
    """Stage 2 (joint training, Eq. 7); its ``pretrain_stage`` is stage 1 (``InfoCSEPretrain``)."""

    name = "infocse"

    @dataclass
    class Args:
        temperature: float = arg(0.05, "τ of InfoNCE (Eq. 3)", exclusive_minimum=0)
        aux_weight: float = arg(1e-5, "λ of Eq. 7 (Table 8 and code; §4.2's text says 0.005)", minimum=0)
        mask_rate: float = arg(0.4, "share of tokens masked in x̂ for L_aux (Table 7; code: 0.3 on BERT-large)",
                               exclusive_minimum=0, exclusive_maximum=1)
        skip_from: int = arg(6, "M^{>0} = states after this many layers (the paper's 6th layer); < the backbone's layers",
                             minimum=1)
        head_layers: int = arg(2, "extra Transformer layers of the auxiliary network (paper: 2)", minimum=1)
        cls_layer: int | None = arg(None, "layer whose [CLS] is h (null = the last; the paper's 12th on BERT-base)",
                                    minimum=1)
        detach: bool = arg(True, "Detach(M^{>0}) with frozen lower auxiliary layers (false: Table 6's ablation, "
                           "the lower auxiliary layers are trained)")
        init: str = arg("pretrain", "pretrain: both networks from stage 1 (§3.2); backbone: no pretraining (Table 4, "
                        "the auxiliary network is the backbone's lower skip_from + upper head_layers layers)",
                        choices=("pretrain", "backbone"))
        aux_checkpoint: str | None = arg(None, "skip stage 1: a directory with a BERT encoder, its MLM head and the "
                                         "head layers (this stage-1 output or Condenser with c_head weights; "
                                         "with head_init: random a headless one, e.g. the Hub's Luyu/condenser); "
                                         "model: the model the run loads, i.e. its runs[].weights (infocse-code: "
                                         "the Hub's Condenser, fetched by the workflow) or its backbone")
        head_init: str = arg("pretrained", "the auxiliary network's head_layers: pretrained with the rest of it (stage 1 "
                             "or aux_checkpoint; init: backbone: the backbone's upper layers), or random: "
                             "N(0, initializer_range), biases 0, LayerNorm 1/0 (code: its scripts name a Hub "
                             "checkpoint without c_head, so train_cls_mlm.py's model.pt is never loaded)",
                             choices=("pretrained", "random"))
        aux_inputs: str = arg("sentence", "open: one masked copy per sentence fed with view 1's [CLS] (paper), or one "
                              "per view with that view's [CLS] (code)", choices=("sentence", "view"))
        mlp: str = arg("train_only", "projection on [CLS] in training: SimCSE's Linear+Tanh, the code's BatchNorm "
                       "projection, or none", choices=("train_only", "batchnorm", "none"))
        projection_init: str = arg("torch", "the BatchNorm projection's Linear weights: PyTorch's default (the paper "
                                   "is silent), or N(0, initializer_range) (code: cl_init's init_weights)",
                                   choices=("torch", "normal"))
        aux_lower_eval: bool = arg(True, "the frozen lower copy runs in eval mode, no dropout (code's --mlm_eval, its "
                                   "base script); false: in training mode, with dropout (its BERT-large script "
                                   "omits the flag)")
        pretrain: dict | None = arg(None, "stage-1 settings (only in methods.infocse): train keys (epochs 8, "
                                    "batch_size 1024, lr 1e-4, warmup_ratio 0.1, weight_decay 0.01, max_steps, ...), "
                                    "corpus (name under resources/corpus; default the configured corpus), seed (42), "
                                    "mask_rate (0.15), mask_unit (token|word)")

    eval_pooler = "cls_before_pooler"
    pretrain_train_defaults = PRETRAIN_TRAIN_DEFAULTS
    contract_args = {"skip_from": 1}  # 2 layers: M^{>0} after layer 1 (paper: 6 of 12)

    # ------------------------------------------------------------------ config
    @classmethod
    def validate_args(cls, args, where):
        super().validate_args(args, where)
        block = args.get("pretrain") if isinstance(args, dict) else None
        if block:
            validate_pretrain_block(block, f"{where}.pretrain")

    @classmethod
    def check(cls, args, config, where="method_args"):
        """Rules across InfoCSE's arguments (the layer numbers against the backbone's depth are
        checked when the backbone is loaded)."""
        if args.aux_checkpoint and args.init == "backbone":
            raise SentembError(f"{where}.aux_checkpoint/init: aux_checkpoint and init: backbone exclude each other")

    @classmethod
    def requires(cls, args):
        return ("pretrained",) if args.init == "pretrain" and not args.aux_checkpoint else ()

    @classmethod
    def args_for_depth(cls, layers):
        """M^{>0} after half the layers (the paper: 6 of BERT-base's 12)."""
        return {"skip_from": max(1, int(layers) // 2)}

    @classmethod
    def layers_needed(cls, args):
        """The state after ``skip_from`` layers is read, and with ``init: backbone`` the upper
        ``head_layers`` layers are copied into the auxiliary network."""
        a = cls.make_args(args)
        return max(a.skip_from + 1, a.head_layers if a.init == "backbone" and a.head_init == "pretrained" else 0)

    # ------------------------------------------------------------------ construction
    def __init__(self, encoder, tokenizer, args, ctx):
        super().__init__(encoder, tokenizer, args, ctx)
        a, cfg = self.args, encoder.config
        n_layers = cfg.num_hidden_layers
        _check_layers(a, n_layers, a.init == "backbone" and a.head_init == "pretrained")
        std = getattr(cfg, "initializer_range", 0.02)
        if a.mlp == "train_only":
            self.mlp = MLPHead(cfg.hidden_size, std)
        elif a.mlp == "batchnorm":
            self.mlp = BatchNormProjection(cfg.hidden_size)
            if a.projection_init == "normal":  # the code's init_weights: Linear N(0, std); BatchNorm untouched
                _init_bert_(self.mlp, std)
        else:
            self.mlp = None

        from transformers.models.bert.modeling_bert import BertLayer

        src = None
        fresh = a.head_init == "random"  # the head layers keep _init_bert_'s draw below (the code's c_head)
        if a.aux_checkpoint == "model" and not ctx.model_dir:
            raise SentembError("infocse: aux_checkpoint: model needs the run's model directory (none was given)")
        aux_dir = str(ctx.model_dir) if a.aux_checkpoint == "model" else a.aux_checkpoint  # None: no checkpoint
        if aux_dir:
            src = read_aux_checkpoint(aux_dir, cfg.hidden_size, a.head_layers, need_layers=not fresh,
                                      need_mlm=a.aux_checkpoint != "model")
        elif a.init == "pretrain":
            src = read_aux_checkpoint(ctx.input("pretrained"), cfg.hidden_size, a.head_layers, need_layers=not fresh)
        if src is not None:
            where = aux_dir or str(ctx.input("pretrained"))
            m = src["meta"]
            if m and m.get("skip_from") not in (None, a.skip_from):
                raise SentembError(f"infocse: {where} was pretrained with skip_from {m['skip_from']}, this run uses "
                                   f"{a.skip_from} (config key methods.infocse.skip_from)")
            _load_encoder_state(self.encoder, src["encoder"], where)  # main encoder from stage 1 (§3.2)

        # Auxiliary network: a copy of the embeddings + lower skip_from layers (frozen unless detach is off) ...
        self.aux_lower = copy.deepcopy(self.encoder)
        self.aux_lower.encoder.layer = self.aux_lower.encoder.layer[: a.skip_from]
        self.aux_lower.config = copy.deepcopy(cfg)
        self.aux_lower.config.num_hidden_layers = a.skip_from
        if getattr(self.aux_lower, "pooler", None) is not None:
            self.aux_lower.pooler = None
        self.aux_lower.requires_grad_(not a.detach)
        # ... + the extra layers and the MLM head (its own W, initialised from stage 1's).
        self.aux_head = nn.ModuleList([BertLayer(cfg) for _ in range(a.head_layers)])
        _init_bert_(self.aux_head, std)
        self.aux_mlm = MLMHead(cfg, weight=self.encoder.get_input_embeddings().weight)
        if src is not None:
            if not fresh:
                missing, _ = self.aux_head.load_state_dict(src["layers"], strict=False)
                if missing:
                    raise SentembError(f"infocse: {where}: head layer tensors missing: {', '.join(missing[:5])}")
            if src["mlm"]:
                self.aux_mlm.load_bert(src["mlm"], where)
            else:  # aux_checkpoint: model without cls.predictions (the code's lm_head would start fresh too)
                log.warning("infocse: %s has no MLM head (cls.predictions.*): the auxiliary MLM head starts fresh "
                            "with W = the word embeddings", where)
        else:  # Table 4 "w/o pretraining": the backbone's upper layers and (if present) MLM head
            if not fresh:
                self.aux_head.load_state_dict(
                    copy.deepcopy(self.encoder.encoder.layer[n_layers - a.head_layers:]).state_dict())
            head = mlm_head_state(read_weights(ctx.model_dir)) if ctx.model_dir else {}
            if head:
                self.aux_mlm.load_bert(head, str(ctx.model_dir))
            else:
                log.warning("infocse: %s has no MLM head (cls.predictions.*): the auxiliary MLM head starts fresh "
                            "with W = the word embeddings", ctx.model_dir)

    def train(self, mode: bool = True):
        super().train(mode)
        if self.args.detach and self.args.aux_lower_eval:
            self.aux_lower.eval()  # the frozen copy is a feature extractor: no dropout
        return self

    # ------------------------------------------------------------------ batches
    def _mask(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, rate: float, rng,
              word_ids: np.ndarray | None = None):
        """BERT's corruption of the attended non-special tokens (``mask_tokens``), drawn over the
        batch's real width (its longest row): a batch padded to a bucket gets the same masks."""
        ids = input_ids.numpy()
        am = attention_mask.numpy()
        maskable = (am == 1) & ~np.isin(ids, self.tokenizer.all_special_ids)
        width = int(am.sum(1).max()) if am.size else None
        x, y = mask_tokens(ids, maskable, rate, rng, self.tokenizer.mask_token_id, len(self.tokenizer), word_ids,
                           width=width)
        return torch.from_numpy(x).to(input_ids.dtype), torch.from_numpy(y).long()

    def build_batch(self, sentences, step=0, *, lines=None, micro=0):
        enc = self.tokenize(sentences, lines)
        copies = 2 if self.args.aux_inputs == "view" else 1
        rng = self.np_rng(micro)
        ids = enc["input_ids"].repeat(copies, 1)
        am = enc["attention_mask"].repeat(copies, 1)
        enc["mlm_input_ids"], enc["mlm_labels"] = self._mask(ids, am, self.args.mask_rate, rng)
        return enc

    # ------------------------------------------------------------------ losses
    def encode_views(self, batch):
        """Both dropout views in one pass (SimCSE). Returns (z1, z2, h per view stacked (2B, H))."""
        last, h = self.encode_cls(batch)
        z = self.mlp(last) if self.mlp is not None else last
        b = batch["input_ids"].size(0)
        return z[:b], z[b:], h

    def encode_cls(self, batch):
        """The last layer's [CLS] of both views (2B, H) and h, the ``cls_layer``'s [CLS] (2B, H)."""
        keys = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch]
        doubled = {k: torch.cat([batch[k], batch[k]], 0) for k in keys}
        cl = self.args.cls_layer
        out = self.encoder(**doubled, output_hidden_states=cl is not None, return_dict=True)
        last = out.last_hidden_state[:, 0]
        return last, (out.hidden_states[cl][:, 0] if cl is not None else last)

    def aux_loss(self, h: torch.Tensor, batch: dict[str, torch.Tensor], count: torch.Tensor | None = None) -> torch.Tensor:
        """L_aux of §3.2 from h (the main encoder's [CLS] of the unmasked views, (2B, H)):
        C = [h; Detach(M^{>0})] with M^{>0} from the frozen lower copy on x̂. ``count``: see
        ``aux_mlm_loss``."""
        b = batch["input_ids"].size(0)
        h = h[:b] if self.args.aux_inputs == "sentence" else h
        am = batch["attention_mask"].repeat(h.size(0) // b, 1)
        kw = {"token_type_ids": batch["token_type_ids"].repeat(h.size(0) // b, 1)} if "token_type_ids" in batch else {}
        if self.args.detach:
            with torch.no_grad():
                lower = self.aux_lower(input_ids=batch["mlm_input_ids"], attention_mask=am, **kw).last_hidden_state
            lower = lower.detach()
        else:
            lower = self.aux_lower(input_ids=batch["mlm_input_ids"], attention_mask=am, **kw).last_hidden_state
        return aux_mlm_loss(h, lower[:, 1:], batch["mlm_labels"], self.aux_head, self.aux_mlm, attention_mask=am,
                            count=count, static=self.ctx.static)

    def chunk(self, batch, start, stop):
        copies = 2 if self.args.aux_inputs == "view" else 1
        return slice_rows(batch, start, stop, self.n_sentences(batch),
                          blocks={"mlm_input_ids": copies, "mlm_labels": copies}, where="method 'infocse'")

    def encode(self, batch):
        """The two views' last-layer [CLS] (the in-batch InfoNCE applies the projection, whose
        BatchNorm variant normalises over the whole batch) and h for the chunk's L_aux."""
        last, h = self.encode_cls(batch)
        b = batch["input_ids"].size(0)
        return Encoded(batch={"cls1": last[:b], "cls2": last[b:]}, rows={"h": h})

    def batch_terms(self, emb, batch):
        last = torch.cat([emb["cls1"], emb["cls2"]], 0)
        z = self.mlp(last) if self.mlp is not None else last
        b = emb["cls1"].size(0)
        l_cl = info_nce(z[:b], z[b:], self.args.temperature)  # Eq. 3
        return {"contrastive": l_cl.detach(), WEIGHTED: {"contrastive": l_cl}}

    def row_terms(self, enc, chunk, batch):
        """λ·L_aux (Eq. 7) of the chunk's masked copies, divided by the batch's masked tokens."""
        l_aux = self.aux_loss(enc.rows["h"], chunk, count=(batch["mlm_labels"] != -100).sum())
        return {"aux_mlm": l_aux.detach(), WEIGHTED: {"aux_mlm": self.args.aux_weight * l_aux}}

    def export_head(self):
        return self.mlp if isinstance(self.mlp, MLPHead) else None


# ----------------------------------------------------------------------------------- stage 1
class InfoCSEPretrain(Method):
    """Stage 1 (§3.1, Eq. 6): L = L_aux + L_mlm on x̂, the auxiliary network sharing BERT's lower
    ``skip_from`` layers, W shared (tied to the word embeddings, as in BERT). Not registered: InfoCSE's
    ``pretrain_stage``, trained by the shared loop (``sentemb pretrain``); its export is the stage-1
    directory."""

    name = "infocse"
    Args = InfoCSE.Args
    validate_args = InfoCSE.validate_args

    def __init__(self, encoder, tokenizer, args, ctx):
        super().__init__(encoder, tokenizer, args, ctx)
        from transformers.models.bert.modeling_bert import BertLayer

        a, cfg = self.args, encoder.config
        _check_layers(a, cfg.num_hidden_layers, False)
        self.stage = {**PRETRAIN_DEFAULTS, **{k: v for k, v in (a.pretrain or {}).items() if k in PRETRAIN_OWN_KEYS}}
        std = getattr(cfg, "initializer_range", 0.02)
        self.aux_head = nn.ModuleList([BertLayer(cfg) for _ in range(a.head_layers)])  # fresh, as Condenser
        _init_bert_(self.aux_head, std)
        self.mlm_head = MLMHead(cfg, tied=self.encoder.get_input_embeddings())
        head = mlm_head_state(read_weights(ctx.model_dir)) if ctx.model_dir else {}
        if head:
            self.mlm_head.load_bert(head, str(ctx.model_dir))  # "the backbone's pretrained MLM output matrix"
        else:
            log.warning("infocse pretrain: %s has no MLM head (cls.predictions.*): its transform starts fresh, "
                        "W = the word embeddings", ctx.model_dir)

    def build_batch(self, sentences, step=0, *, lines=None, micro=0):
        word_ids = None
        if self.stage["mask_unit"] == "word":  # Condenser's whole-word masking
            enc = self.tokenizer(sentences, padding=True, truncation=True, max_length=self.ctx.max_len,
                                 return_tensors="pt")
            word_ids = np.array([[-1 if w is None else w for w in enc.word_ids(i)] for i in range(len(sentences))])
            batch = self.pad_rows(dict(enc))
            pad = batch["input_ids"].size(1) - word_ids.shape[1]
            if pad > 0:  # bucket padding: no word there
                word_ids = np.pad(word_ids, ((0, 0), (0, pad)), constant_values=-1)
        else:
            batch = self.tokenize(sentences, lines)
        x, y = InfoCSE._mask(self, batch["input_ids"], batch["attention_mask"], self.stage["mask_rate"],
                             self.np_rng(micro), word_ids)
        batch["input_ids"], batch["mlm_labels"] = x, y
        return batch

    has_batch_terms = False  # Eq. 6: two MLM losses, means over the batch's masked tokens

    def encode(self, batch):
        keys = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch]
        out = self.encoder(**{k: batch[k] for k in keys}, output_hidden_states=True, return_dict=True)
        return Encoded(rows={"hidden_states": out.hidden_states, "last": out.last_hidden_state})

    def row_terms(self, enc, chunk, batch):
        hs, last, cl = enc.rows["hidden_states"], enc.rows["last"], self.args.cls_layer
        h = (hs[cl] if cl is not None else last)[:, 0]
        count = (batch["mlm_labels"] != -100).sum()
        l_mlm = mlm_loss(last, chunk["mlm_labels"], self.mlm_head, count, static=self.ctx.static)  # Eq. 4
        l_aux = aux_mlm_loss(h, hs[self.args.skip_from][:, 1:], chunk["mlm_labels"], self.aux_head, self.mlm_head,
                             attention_mask=chunk["attention_mask"], count=count, static=self.ctx.static)  # Eq. 5, M^{>0} shared: not detached
        return {"aux_mlm": l_aux.detach(), "mlm": l_mlm.detach(),  # Eq. 6
                WEIGHTED: {"aux_mlm": l_aux, "mlm": l_mlm}}

    def embedder(self, pooler, device):
        raise SentembError("infocse pretrain: the stage-1 model is not evaluated (train.model_selection: last)")

    def export(self, out_dir, pooler, meta):
        from safetensors.torch import save_file

        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        self.encoder.save_pretrained(out_dir, safe_serialization=True)
        self.tokenizer.save_pretrained(out_dir)
        from ..model.backbone import keep_stand_in_mark

        keep_stand_in_mark(out_dir, self.tokenizer, self.encoder.config)
        tensors = {f"c_head.{k}": v.detach().cpu().contiguous() for k, v in self.aux_head.state_dict().items()}
        tensors.update(self.mlm_head.bert_state())
        save_file(tensors, str(out_dir / AUX_HEAD_FILE), metadata={"format": "pt"})
        a = self.args
        (out_dir / AUX_META_FILE).write_text(json.dumps(
            {**meta, "skip_from": a.skip_from, "head_layers": a.head_layers, "cls_layer": a.cls_layer,
             "stage": self.stage}, indent=2, default=str))


#: declared here, below the stage's class (which shares InfoCSE's Args)
InfoCSE.pretrain_stage = InfoCSEPretrain


# ----------------------------------------------------------------------------------- the pretrain block
def validate_pretrain_block(block: Any, where: str) -> None:
    """``methods.infocse.pretrain``: train keys (``TrainSettings``) and ``PretrainBlock``'s; errors name the key."""
    import jsonschema

    if not isinstance(block, dict):
        raise SentembError(f"{where}: must be a mapping, not {type(block).__name__}")
    props = _train_key_validators()
    unknown = [k for k in block if k not in props and k not in PRETRAIN_OWN_KEYS]
    if unknown:
        raise SentembError(f"{where}.{unknown[0]}: unknown pretrain setting (known: "
                           f"{', '.join(sorted([*PRETRAIN_OWN_KEYS, *props]))})")
    check_mapping(PretrainBlock, {k: v for k, v in block.items() if k in PRETRAIN_OWN_KEYS}, where, "infocse pretrain")
    if "mask_rate" in block and not 0 < block["mask_rate"] < 1:
        raise SentembError(f"{where}.mask_rate: {block['mask_rate']!r} must be between 0 and 1")
    for k, v in block.items():
        if k in props:
            # what jsonschema.validate(v, schema) raises, without checking the schema itself on every call
            error = jsonschema.exceptions.best_match(props[k].iter_errors(v))
            if error is not None:
                raise SentembError(f"{where}.{k}: {error.message}")


@functools.lru_cache(maxsize=None)
def _train_key_validators() -> dict[str, Any]:
    """train key -> a JSON-schema validator of its override (no default), built once: a config's runs
    check the same pretrain block many times (the paper configuration's ``snakemake -n``, about 1,000)."""
    import jsonschema

    from ..config.settings import section_schema

    out = {}
    for k, schema in section_schema("train", defaults=False)["properties"].items():
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        out[k] = cls(schema)
    return out



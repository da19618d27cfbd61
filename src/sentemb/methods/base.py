"""The interface between the shared training loop and a method.

The loop (``sentemb.train.loop``) owns data order, optimisation, precision, evaluation, checkpoints and
tracking. A method owns only

1. its typed arguments (``Args``, a dataclass declared once in the method's module),
2. the inputs it reads (``requires(args)``: names of statistics-stage or other workflow outputs,
   handed over as paths in ``ctx.inputs``),
3. how a list of corpus sentences becomes model inputs (``build_batch``, on CPU, deterministic for
   a given ``(ctx.seed, micro)``), and
4. its loss, in three parts (issue 26 §1), so that the loop can encode a batch in chunks
   (``train.chunk_size``, gradient caching) without the method knowing:

   a. ``encode(chunk) -> Encoded``: the chunk's sentences (rows ``chunk(batch, start, stop)`` of the
      micro-batch) through the encoder and heads. ``Encoded.batch`` holds the tensors the in-batch
      terms read, each with its rows in the batch's order, so that concatenating the chunks' tensors
      along dim 0 gives the whole batch's (SimCSE: ``z1``, ``z2``, (n, d) each); ``Encoded.rows``
      holds whatever the chunk's per-sentence terms read (hidden states, [CLS] vectors, ...).
   b. ``batch_terms(emb, batch)``: the terms that couple sentences (InfoNCE over all views, UNA's
      negatives, ArcCon's angular logits), from the whole batch's ``emb`` (the concatenated
      ``Encoded.batch``) and the whole CPU-built batch (for counts to log).
   c. ``row_terms(enc, chunk, batch)``: the terms that are sums over sentences (SARCSE's
      reconstruction, InfoCSE's auxiliary MLM, PaSeR's decoder, ArcCSE's triplets), computed
      within the chunk from ``enc`` and **normalised by the whole batch's count** (read from
      ``batch``), so that they add up over the chunks to the batch's term.

   Each returns logged terms (scalars, detached) and, under ``WEIGHTED``, each weighted term with
   its graph; the step's loss is the sum of all weighted terms. ``losses(batch)`` (one chunk = the
   whole batch) is that composition and gives the same number as a single-pass implementation.
   A method whose loss has no in-batch term sets ``has_batch_terms = False`` (the loop then
   skips the first, graph-free pass of gradient caching).

Extra trainable modules (heads, decoders) are submodules of the method, so the loop optimises them
too; frozen ones set ``requires_grad = False`` and the optimizer leaves them out. A method whose
sentence embedding is not a pooled encoder output declares ``eval_pooler = "method"`` and
overrides ``embedder``, ``export`` and ``load_embedder``.

Gradient caching for free (``sentemb.train.step.chunked_backward``; Gao et al. 2021, "Scaling Deep
Contrastive Learning Batch Size under Memory Limited Setup"): with ``train.chunk_size: N`` the loop
encodes the batch N sentences at a time without a graph, computes (b) and its gradient with respect
to ``emb`` once, then re-encodes each chunk with its graph (the chunk's random state replayed, so
the dropout masks are those of the first pass) and back-propagates that cached gradient together
with the chunk's (c). What a method must respect for that: ``encode`` and ``row_terms`` see only
their chunk; every random choice is made in ``build_batch`` (from ``np_rng(micro)``) or by dropout;
``chunk`` slices every row-aligned tensor of the batch (the default slices the tensors whose first
dimension is the number of sentences; a method with another row layout overrides it).

A method that keeps state across steps (a momentum-updated copy of the encoder, a queue of keys:
``docs/methods/writing-a-method.md``, "A method that keeps state") has four promises from the loop:

* ``self.step`` (the optimizer step being computed, 0-based: the updates done before it) and
  ``self.micro`` (the global index of the micro-batch being computed) are set before every call of
  ``encode``/``batch_terms``/``row_terms`` of a training step (``build_batch`` gets them as arguments);
* ``after_step(step)`` is called once per optimizer step, on every process, after the update (under
  SAM after the one update, under ``grad_accum`` once for all the micro-batches);
* ``before_epoch(epoch)`` is called on every process before the optimizer step that holds the epoch's
  first micro-batch (epoch 0 before step 0; a resumed run calls it for the epochs it has not begun);
* the method's ``state_dict()`` (parameters, frozen ones too, persistent buffers, ``get_extra_state``)
  is what a checkpoint saves (rank 0) and a resume loads (every rank).

And one rule: ``encode``, ``batch_terms`` and ``row_terms`` may be called more than once on the same
micro-batch (gradient caching encodes twice, SAM runs every micro-batch twice, the contract re-runs
``losses``, ``chunk_size: auto`` probes ``encode`` at set-up), so they change no state: they may only
stash what the hook needs with ``self.stash(name, tensor)`` (keyed by ``self.micro``, so that a
repeated call overwrites; ``after_step`` reads it with ``take_stash(name)``); the state changes in
``after_step`` alone, in place (``copy_``, ``mul_``, ``fill_``: a graphed step, ``train.graphs``,
reads the tensors it was captured with). Under ``train.devices: N`` every rank holds the same state:
``batch_terms`` sees every rank's rows already; ``all_ranks_rows`` gathers rows collected elsewhere.

Adding a method = one module (a ``Method`` subclass decorated with ``@register_method``) + its
config block: in ``sentemb/methods/`` for a built-in one (the package imports every module in it),
or in the user's own file listed in the config's ``method_modules`` (``docs/methods/writing-a-method.md``,
``examples/methods/debiased.py``). Argument ranges are declared on the arguments (``arg(...,
minimum=, maximum=, exclusive_minimum=, exclusive_maximum=, choices=)``) and rules across them in
``check(args, config, where)``: both run when the config is validated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Sequence

import torch
from torch import nn

from .. import SentembError
from ..config.fields import ArgSpec, arg, build, check_mapping, specs  # noqa: F401  (arg, ArgSpec: public here too)
from ..model.encoder import EmbedFn, Embedder

#: The batch of the loop's STS-B dev embedder (``Method.embedder``: fp32, the dev set's plan kept;
#: ``sentemb.evaluate.sts.tune_dev_embedder`` raises it to ``DEV_BATCH_CUDA`` for bf16 on CUDA).
DEV_BATCH = 128

#: Names a method may list in ``requires(args)``; ``sentemb.config.load.run_inputs`` maps each to a path.
INPUT_NAMES = ("token_freq", "tfidf", "tfidf_para", "rake", "paraphrases", "nltk", "pretrained")

#: The key of ``losses(batch)``'s result holding the weighted terms: ``{name: w·L_name}``, each a
#: scalar tensor *with* its graph, exactly as it is added into ``loss`` (so they sum to ``loss``),
#: named as the method logs the unweighted term (``contrastive``, ``recon``, ...). The loop pops it
#: before logging; with ``train.log_grad_norms`` it logs ‖∇ w·L_name‖ on ``grad_norm_parameters()``
#: as ``train/grad_norm/<name>``. A method that returns no such key gets ``train/grad_norm/loss``
#: (its total's gradient norm) for free; one line (``WEIGHTED: {"contrastive": loss}``) names it.
WEIGHTED = "weighted"


@dataclass
class Encoded:
    """What ``Method.encode`` returns for a chunk of sentences (see the module docstring, step a)."""

    #: the in-batch terms' inputs: row-aligned tensors, concatenated over chunks along dim 0
    batch: dict[str, torch.Tensor] = field(default_factory=dict)
    #: what the chunk's own per-sentence terms read (kept with its graph; never concatenated)
    rows: dict[str, Any] = field(default_factory=dict)


def slice_rows(batch: dict[str, torch.Tensor], start: int, stop: int, n: int, *,
               blocks: dict[str, int] | None = None, where: str = "method") -> dict[str, torch.Tensor]:
    """Sentences ``[start, stop)`` of a batch of ``n``: a tensor whose dim 0 is ``n`` is sliced, one
    of ``k·n`` rows named in ``blocks`` (``{key: k}``, k blocks of n rows such as [view 1; view 2])
    keeps rows ``start:stop`` of each block, a 0-dim tensor (a count) is kept whole. Any other shape
    is an error naming the key: the method must override ``Method.chunk``."""
    out = {}
    blocks = blocks or {}
    for key, v in batch.items():
        if v.dim() == 0:
            out[key] = v
        elif key in blocks:
            k = blocks[key]
            if v.size(0) != k * n:
                raise SentembError(f"{where}.chunk: batch['{key}'] has {v.size(0)} rows, expected {k}x{n}")
            out[key] = torch.cat([v[j * n + start : j * n + stop] for j in range(k)], 0)
        elif v.size(0) == n:
            out[key] = v[start:stop]
        else:
            raise SentembError(f"{where}.chunk: batch['{key}'] has {v.size(0)} rows for {n} sentences; override "
                               "Method.chunk to say which rows belong to which sentence")
    return out


def add_terms(total: dict[str, torch.Tensor], terms: dict[str, Any]) -> dict[str, torch.Tensor]:
    """``total`` updated with ``terms`` added key by key (per-chunk logged terms of ``row_terms``)."""
    for key, v in terms.items():
        total[key] = total[key] + v if key in total else v
    return total


@dataclass
class MethodContext:
    """What a method may read besides its own arguments."""

    max_len: int
    seed: int
    backbone: str = ""  # name of the backbone in config (key of `backbones`)
    model_dir: Path | None = None  # the pretrained backbone's directory
    #: every input the method declared in ``requires(args)``, by name (see INPUT_NAMES)
    inputs: dict[str, Path] = field(default_factory=dict)
    corpus: Path | None = None  # the training corpus (one sentence per line; line i <-> index i)
    #: the corpus tokenized once (``sentemb.data.tokens.TokenCache``), set by the loop; ``Method.tokenize`` reads it
    tokens: Any = None
    #: the run's bucket widths (``train.buckets`` resolved for its device, ``sentemb.data.buckets``), None
    #: to pad every width to its longest row; a method pads each variable width with ``self.width(n)``
    buckets: tuple[int, ...] | None = None
    #: the run's step is captured as a CUDA graph (``train.graphs``, ``sentemb.train.graphs``): no shape may
    #: depend on the data and no device value may be read on the host inside the step; a method whose
    #: usual form does either (a loss over the masked positions only) takes its static form
    static: bool = False

    def input(self, name: str) -> Path:
        """The path of declared input ``name``; a clear error if the run was not given it."""
        if name not in self.inputs:
            raise SentembError(f"input '{name}' was not provided to this run (declared inputs: {sorted(self.inputs)}); "
                               "does the method's requires(args) list it?")
        return Path(self.inputs[name])


def eager_stash() -> None:
    """``Method.stash`` under ``torch.compiler.disable``, so that a compiled step (``train.compile``)
    runs it eagerly: Dynamo would otherwise guard on ``self.micro`` and recompile for every
    micro-batch. Applied once by the loop's set-up of a compiled run (not at import: the decorator
    imports ``torch._dynamo``, seconds of CPU in every command that merely lists the methods)."""
    if not getattr(Method.stash, "_eager_stash", False):
        Method.stash = torch.compiler.disable(Method.stash)
        Method.stash._eager_stash = True


def all_ranks_rows(t: torch.Tensor) -> torch.Tensor:
    """Every process's rows of ``t`` concatenated along dim 0 in rank order, detached (``train.devices``
    > 1; ranks may hold different numbers of rows); ``t`` itself (detached) on one process. For state
    collected outside ``batch_terms`` (whose ``emb`` holds every rank's rows already), so that every
    rank enqueues the same keys: call it on every rank, in ``after_step`` or during the step."""
    from ..train.distributed import gather_rows, world_size

    if world_size() == 1:
        return t.detach()
    return gather_rows(t.detach(), with_grad=False)[0]


@torch.no_grad()
def ema_(target: nn.Module, online: nn.Module, decay: float) -> None:
    """θ_target ← decay·θ_target + (1 − decay)·θ_online over the two modules' parameters, in their
    ``parameters()`` order (a momentum encoder: MoCo's Eq. 2, ESimCSE's Eq. 2). One fused multi-tensor
    ``lerp_`` per dtype and device (``torch._foreach_lerp_``) instead of two eager ops per tensor: on
    a GPU that is a few launches rather than ~400 for a BERT-base copy. In place, no host sync, so it
    may run in ``after_step`` of a graphed run (``train.graphs``). A target parameter that requires grad
    is refused: the optimizer would update it as well, as the momentum encoder of no paper is."""
    mine, theirs = list(target.parameters()), list(online.parameters())
    trained = [n for n, m in target.named_parameters() if m.requires_grad]
    if trained:  # the optimizer would move it too: two updates, and a key that back-propagates
        raise SentembError(f"ema_: the target's parameters must not be trained, but {len(trained)} require grad "
                           f"({', '.join(trained[:3])}{' ...' if len(trained) > 3 else ''}): make the momentum copy "
                           "with .requires_grad_(False) (copy.deepcopy(encoder).requires_grad_(False))")
    if len(mine) != len(theirs):
        raise SentembError(f"ema_: {len(mine)} target parameters against {len(theirs)} online ones")
    groups: dict[tuple, tuple[list, list]] = {}
    for m, p in zip(mine, theirs):
        if m.shape != p.shape:
            raise SentembError(f"ema_: a target parameter of shape {tuple(m.shape)} against {tuple(p.shape)}")
        a, b = groups.setdefault((m.device, m.dtype), ([], []))
        a.append(m)
        b.append(p.detach().to(m.dtype))
    for a, b in groups.values():
        torch._foreach_lerp_(a, b, 1.0 - decay)


def fusable_method(cls) -> bool:
    """Whether ``cls`` itself declares ``Method.fusable`` (an inherited declaration does not count)."""
    return bool(vars(cls).get("fusable", False))


def check_fusable(cls, settings, where: str) -> None:
    """``train.fuse_micro_batches`` > 1 with a method that does not declare ``fusable``: refused
    naming the key (at config load and when the job starts)."""
    n = getattr(settings, "fuse_micro_batches", 1)
    if n > 1 and not fusable_method(cls):
        raise SentembError(f"{where}: train.fuse_micro_batches {n}: method '{cls.name}' does not declare "
                           "Method.fusable (that one forward over several micro-batches computes their summed loss); "
                           "set train.fuse_micro_batches: 1")


def total_loss(weighted: dict[str, torch.Tensor]) -> torch.Tensor:
    """The sum of the weighted terms in their order, fp32 (the loss a method back-propagates)."""
    terms = list(weighted.values())
    if not terms:
        raise SentembError("a method returned no weighted loss term")
    loss = terms[0]
    for t in terms[1:]:
        loss = loss + t
    return loss.float()


class Method(nn.Module):
    name: ClassVar[str]

    @dataclass
    class Args:
        """No arguments (a method's own module declares its ``Args`` dataclass with ``arg(...)``)."""

    #: an optional stage before training: the Method subclass the shared loop trains once per method
    #: and backbone (``sentemb pretrain``, rule ``pretrain``, settings in ``methods.<name>.pretrain``);
    #: a run whose ``requires(args)`` lists ``pretrained`` reads its output directory as
    #: ``ctx.inputs["pretrained"]``. None by default.
    pretrain_stage: ClassVar[type[Method] | None] = None
    #: the stage's ``train`` defaults (over the config's ``train``; under the block's own keys)
    pretrain_train_defaults: ClassVar[dict[str, Any]] = {}

    #: False for a loss that is only a sum over sentences (no term couples two sentences): gradient
    #: caching then needs no graph-free first pass
    has_batch_terms: ClassVar[bool] = True

    #: pooler used to evaluate the exported model (sentemb evaluate --pooler); "method" = the
    #: method's own embedder (``load_embedder``)
    eval_pooler: ClassVar[str] = "cls_before_pooler"

    #: the method contract (``sentemb.testing``, ``sentemb check-method``): argument overrides a tiny
    #: 2-layer encoder of hidden 32 needs (e.g. a layer number below 2); the paper's values stay the defaults
    contract_args: ClassVar[dict[str, Any]] = {}
    #: arguments that turn off the method's own dropout (beyond the encoder's ``train.dropout``), for
    #: the contract's dropout-off gradient comparisons (e.g. a decoder's dropout)
    contract_no_dropout: ClassVar[dict[str, Any]] = {}
    #: integer arguments that change which steps or rows do extra work, not the shapes of a step
    #: (UNA's alpha and radius): ``sentemb plan`` counts one step per shape, so it leaves them out
    schedule_args: ClassVar[tuple[str, ...]] = ()
    #: the groups of row tensors a batch holds besides the sentences' (``sentemb.data.buckets.batch_shapes``):
    #: key prefix -> group name (ArcCSE ``{"tri_": "triplets"}``); each group has one padded width
    width_groups: ClassVar[dict[str, str]] = {}
    #: train settings the paper trains the method with that a one-step measurement should use
    #: (``sentemb gpu-check``; a run sets them in its config): ArcCSE's SAM ``{"sam_rho": 0.05}``
    paper_train: ClassVar[dict[str, Any]] = {}

    #: for the contract's ``state_accum`` check: True when ``grad_accum`` over k micro-batches of B/k
    #: sentences trains what one batch of B does (state included). None: when the loss has no in-batch
    #: term (``has_batch_terms = False``); a method whose in-batch negatives see the whole batch differs
    accum_equal: ClassVar[bool | None] = None

    #: ``train.fuse_micro_batches`` (``sentemb.train.step.Fused``): True when one ``encode`` of the
    #: ``merge`` of k micro-batches, ``batch_terms`` on each micro-batch's rows of it and ``row_terms``
    #: on the whole merge compute the k micro-batches' summed loss: the encoder treats rows
    #: independently, ``encode``/``batch_terms``/``row_terms`` read no ``self.micro``, and
    #: ``row_terms`` of the merge is the mean of the micro-batches' (per-sentence terms of equal
    #: micro-batches normalised by their count; otherwise ``merge`` says how, as ArcCSE's triplet
    #: weights). Read from the class's own body only (``fusable_method``): a subclass changes the
    #: loss, so it declares it again. The contract's check ``fused`` tests it.
    fusable: ClassVar[bool] = False

    @property
    def step(self) -> int:
        """The optimizer step being computed (0-based: the updates done before it); set by the loop
        before the step's ``encode``/``batch_terms``/``row_terms`` calls (module docstring). Read it;
        the loop writes it. A graphed step (``train.graphs``) must not read it: a replay keeps the
        value of its capture (the capture check refuses it, ``sentemb.train.graphs``)."""
        return self._read("step")

    @step.setter
    def step(self, value: int) -> None:
        self.__dict__["_step"] = int(value)

    @property
    def micro(self) -> int:
        """The global index of the micro-batch being computed; as ``step``."""
        return self._read("micro")

    @micro.setter
    def micro(self, value: int) -> None:
        self.__dict__["_micro"] = int(value)

    def _read(self, name: str) -> int:
        reads = self.__dict__.get("_reads")
        if reads is not None:  # the graphed step's capture check records what the step reads (its thread's)
            import threading

            if reads[0] == threading.get_ident():
                reads[1].add(name)
        return self.__dict__.get(f"_{name}", 0)

    def __init__(self, encoder: nn.Module, tokenizer, args: dict[str, Any] | Any, ctx: MethodContext):
        super().__init__()
        self.encoder = encoder
        self.tokenizer = tokenizer
        self.args = self.make_args(args, where=f"method '{self.name}'")  # an instance of Args
        self.ctx = ctx

    # ------------------------------------------------------------------ arguments and inputs
    @classmethod
    def arg_specs(cls) -> list[ArgSpec]:
        return specs(cls.Args)

    @classmethod
    def arg_defaults(cls) -> dict[str, Any]:
        return {s.name: s.default for s in cls.arg_specs()}

    @classmethod
    def args_for_depth(cls, layers: int) -> dict[str, Any]:
        """Arguments that depend on the encoder's depth, for tooling that builds the method on a model
        of ``layers`` layers (``sentemb gpu-check``): InfoCSE's ``skip_from`` at half of them. Default none."""
        return {}

    @classmethod
    def layers_needed(cls, args: dict[str, Any]) -> int:
        """The fewest encoder layers the method's ``args`` (a mapping) read: ``sentemb plan`` counts a
        step on a reduced-depth model (every layer has one shape). 0: any depth. A method that keeps
        a copy of the encoder's lower k layers returns more than k: a copy with as many layers as the
        probe is taken for a full copy and scaled to the real depth (``sentemb.ops.plan.encoder_copies``)."""
        return 0

    @classmethod
    def validate_args(cls, args: dict[str, Any], where: str) -> None:
        """Check user-given ``args`` against ``Args``; errors name the key (``where.<name>``)."""
        check_mapping(cls.Args, args, where, f"method '{cls.name}'")

    @classmethod
    def resolve_args(cls, *layers: dict[str, Any] | None, where: str = "method_args") -> dict[str, Any]:
        """Defaults updated by each layer in turn (e.g. ``methods.<name>``, then ``runs[i].method_args``):
        the mapping form (a run's ``method_args``)."""
        out = cls.arg_defaults()
        for layer in layers:
            if layer:
                cls.validate_args(layer, where)
                out.update(layer)
        return out

    @classmethod
    def make_args(cls, args: dict[str, Any] | Any = None, where: str = "method_args"):
        """An instance of ``Args`` from a mapping (validated, defaults filled) or as it is."""
        if isinstance(args, cls.Args):
            return args
        return build(cls.Args, cls.resolve_args(args, where=where))

    @classmethod
    def check(cls, args, config: dict, where: str = "method_args") -> None:
        """The method's rules across arguments (``mask_rate <= mask_rate_large``) and against the
        whole validated ``config`` (an argument bounded by a ``stats`` setting), on a run's resolved
        ``args`` (an ``Args``); raise SentembError naming the keys, prefixed by ``where``
        (``runs[i].method_args``, a study's point). Run when the config is validated, so a bad
        combination fails ``snakemake -n``, not a GPU job. One argument's range is declared on the
        argument instead (``arg(..., minimum=, maximum=, exclusive_minimum=, choices=)``) and enforced
        by ``validate_args``. What needs the loaded backbone or tokenizer (a layer count, a [MASK]
        token) can only be checked where they are loaded. Default: nothing to check."""

    @classmethod
    def check_train(cls, args, settings, where: str = "method_args") -> None:
        """The method's rules against the run's training settings (``settings``, a ``TrainSettings``:
        the top-level ``train`` with the run's own over it), on its resolved ``args``; raise
        SentembError naming the keys, prefixed by ``where`` (``runs[i]``, a study's point). Run when
        the config is validated, beside ``check``. For a step the method's arguments make impossible
        under a setting (PaSeR's decoder with ``train.compile`` and counter masks). Default: nothing."""

    @classmethod
    def requires(cls, args) -> tuple[str, ...]:
        """Names of the inputs (``INPUT_NAMES``) a run with these ``args`` (an ``Args``) reads."""
        return ()

    @classmethod
    def step_kinds(cls, args) -> list[tuple[float, dict[str, Any]]]:
        """The kinds of optimizer step a run with ``args`` (an ``Args``) takes, for ``sentemb plan``:
        (share of the steps, argument overrides under which the first step is of that kind), the
        first kind with no overrides and the most work. Default: every step is like the first. UNA:
        negatives on one step in α."""
        return [(1.0, {})]

    @classmethod
    def pooler_for(cls, args) -> str:
        """The evaluation pooler of a model trained with ``args`` (an ``Args``; known before training)."""
        return cls.eval_pooler

    # ------------------------------------------------------------------ randomness
    def np_rng(self, micro: int):
        """numpy Generator seeded with ``(ctx.seed, micro)``: the same batch after resume/accumulation."""
        import numpy as np

        return np.random.default_rng([int(self.ctx.seed), int(micro)])

    def torch_rng(self, micro: int) -> torch.Generator:
        """CPU torch Generator seeded with ``(ctx.seed, micro)``."""
        import numpy as np

        g = torch.Generator()
        g.manual_seed(int(np.random.SeedSequence([int(self.ctx.seed), int(micro)]).generate_state(1, np.uint64)[0] >> 1))
        return g

    # ------------------------------------------------------------------ training
    def width(self, n: int, limit: int | None = None) -> int:
        """The padded width of a row group whose longest row has ``n`` positions: the smallest of the
        run's buckets that holds it (``train.buckets``, ``sentemb.data.buckets.bucket_width``), ``n``
        without buckets. Every variable width a method builds goes through it, so that one epoch
        meets a few step shapes. ``limit``: the group's own longest possible width (ArcCSE's
        triplets: their truncation, within the model's positions; PaSeR's decoder rows:
        ``max_target_len``); beyond the last bucket the widths then grow in half-octaves up to it,
        and a bucket above it is cut to it (``bucket_width``)."""
        from ..data.buckets import bucket_width

        return bucket_width(n, self.ctx.buckets, limit)

    def tokenize(self, sentences: Sequence[str], lines: Sequence[int] | None = None) -> dict[str, torch.Tensor]:
        """``tokenizer(sentences, padding=True, truncation=True, max_length=ctx.max_len)`` as CPU
        tensors; read from the corpus's token cache (no tokenizer call) when the loop has one and
        ``lines`` (the sentences' corpus line indices) are given: the same tensors either way."""
        if self._token_cache() is not None and lines is not None:
            out = self.ctx.tokens.batch(lines, self.ctx.max_len)
        else:
            out = dict(self.tokenizer(list(sentences), padding=True, truncation=True, max_length=self.ctx.max_len,
                                      return_tensors="pt"))
        return self.pad_rows(out)

    def _token_cache(self):
        """The corpus's token cache where it gives the tokenizer's own rows: ``TokenCache.batch`` keeps
        a row's first tokens, so a tokenizer that truncates on the left tokenizes every row."""
        if getattr(self.tokenizer, "truncation_side", "right") != "right":
            return None
        return self.ctx.tokens

    def tokenize_rows(self, texts: Sequence[str], lines: Sequence[int | None] | None = None) -> dict[str, torch.Tensor]:
        """Exactly ``tokenizer(texts, padding=True, truncation=True, max_length=ctx.max_len,
        return_tensors="pt")`` (before ``pad_rows``), for rows that repeat texts (a dropout view's
        copy, UNA's negatives twice): each distinct text is tokenized once and its rows gathered. A
        text whose ``lines[i]`` is its corpus line index (``None``: not a corpus line) is read from
        the token cache when the loop has one, and the two blocks are padded to the longest row as
        the one call pads (right-padding, right-truncating tokenizers; another tokenizes every text)."""
        if not texts:
            raise SentembError(f"method '{self.name}': no rows to tokenize")
        index: dict[str, int] = {}
        line_of: list[int | None] = []
        pos = []
        for i, text in enumerate(texts):
            j = index.setdefault(text, len(index))
            if j == len(line_of):
                line_of.append(None)
            if lines is not None and lines[i] is not None and line_of[j] is None:
                line_of[j] = int(lines[i])
            pos.append(j)
        uniq = list(index)
        cache = self._token_cache() if getattr(self.tokenizer, "padding_side", "right") != "left" else None
        cached = [j for j, line in enumerate(line_of) if line is not None] if cache is not None else []
        rest = [j for j in range(len(uniq)) if cache is None or line_of[j] is None]
        blocks = []
        if cached:
            blocks.append((cached, cache.batch([line_of[j] for j in cached], self.ctx.max_len)))
        if rest:
            blocks.append((rest, dict(self.tokenizer([uniq[j] for j in rest], padding=True, truncation=True,
                                                     max_length=self.ctx.max_len, return_tensors="pt"))))
        if len(blocks) == 1:
            whole = blocks[0][1]
        else:  # rows in the order of `uniq`, padded to the longest of both blocks
            if set(blocks[0][1]) != set(blocks[1][1]):
                raise SentembError(f"method '{self.name}': the token cache's keys {sorted(blocks[0][1])} differ "
                                   f"from the tokenizer's {sorted(blocks[1][1])} (train.token_cache: false)")
            width = max(int(b["input_ids"].size(1)) for _, b in blocks)
            where = torch.empty(len(uniq), dtype=torch.int64)
            where[torch.tensor(cached + rest)] = torch.arange(len(uniq))
            whole = {k: torch.cat([self.pad_width(k, b[k], width) for _, b in blocks], 0)[where] for k in blocks[1][1]}
        if pos == list(range(len(uniq))):
            return whole
        take = torch.tensor(pos, dtype=torch.int64)
        return {k: v[take] for k, v in whole.items()}

    def pad_width(self, key: str, t: torch.Tensor, width: int) -> torch.Tensor:
        """Tensor ``t`` of batch key ``key`` right-padded along dim 1 to ``width``: ``input_ids`` (and
        keys ending in ``input_ids``) with the tokenizer's pad token, ``token_type_ids`` with its pad
        segment (``pad_token_type_id``, 0 for BERT), everything else with 0."""
        from ..data.buckets import pad_to

        pad = 0
        if key.endswith("input_ids"):
            pad = getattr(self.tokenizer, "pad_token_id", None)
        elif key.endswith("token_type_ids"):
            pad = getattr(self.tokenizer, "pad_token_type_id", 0)
        return pad_to(t, width, pad if pad is not None else 0, dim=1)

    def pad_rows(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A tokenizer's output (``input_ids``, ``attention_mask``, ``token_type_ids``, ...) padded on
        the right to ``self.width`` of its width: ids with the pad token, everything else with 0
        (left-padding tokenizers are not bucketed). Unchanged without buckets."""
        if not self.ctx.buckets or "input_ids" not in batch or getattr(self.tokenizer, "padding_side", "right") == "left":
            return batch
        w = self.width(int(batch["input_ids"].size(1)))
        return {k: self.pad_width(k, v, w) if v.dim() == 2 else v for k, v in batch.items()}

    def build_batch(self, sentences: list[str], step: int = 0, *, lines: Sequence[int] | None = None,
                    micro: int = 0) -> dict[str, torch.Tensor]:
        """Turn corpus sentences into a flat dict of CPU tensors (dynamic padding, truncation to
        ``ctx.max_len``); tokenize the corpus sentences with ``self.tokenize(sentences, lines)``.
        It runs in the loop's prefetch thread, a step ahead: no global RNG, no device work.

        ``step``: optimizer steps done so far (schedules such as UNA's "every α steps").
        ``lines``: the sentences' corpus line indices (paraphrases and RAKE rows are line-aligned).
        ``micro``: the global micro-batch index; draw every random choice from ``np_rng(micro)`` /
        ``torch_rng(micro)`` so batches are identical after a resume and under accumulation."""
        raise NotImplementedError

    def n_sentences(self, batch: dict[str, torch.Tensor]) -> int:
        """The number of corpus sentences in ``batch`` (the unit ``chunk`` slices by)."""
        return int(batch["input_ids"].size(0))

    def chunk(self, batch: dict[str, torch.Tensor], start: int, stop: int) -> dict[str, torch.Tensor]:
        """The sub-batch of sentences ``[start, stop)`` (``slice_rows``; padding width kept, so that a
        sentence is computed on the same shape in every chunking). Override for another row layout."""
        return slice_rows(batch, start, stop, self.n_sentences(batch), where=f"method '{self.name}'")

    def merge(self, batches: list[dict[str, torch.Tensor]]) -> tuple[dict[str, torch.Tensor], list[tuple[int, int]]]:
        """k micro-batches as one batch for ``train.fuse_micro_batches`` (``fusable`` methods): their
        rows concatenated, sentences of micro-batch j at ``spans[j]`` = [start, stop), each tensor
        padded on the right to the widest (``input_ids`` with the pad token, everything else with
        0, as ``pad_rows``). Returns (the merged batch, ``spans``). This default serves batches whose
        every tensor has one row per sentence; another layout is an error naming the key (override)."""
        sizes = [self.n_sentences(b) for b in batches]
        spans = [(sum(sizes[:j]), sum(sizes[: j + 1])) for j in range(len(sizes))]
        out = {}
        for key in batches[0]:
            vs = [b.get(key) for b in batches]
            for v, n in zip(vs, sizes):
                if v is None or v.dim() == 0 or v.size(0) != n:
                    raise SentembError(f"method '{self.name}'.merge: batch['{key}'] is not one row per sentence in every "
                                       "micro-batch; override Method.merge to say how micro-batches are merged")
            width = max(int(v.size(1)) for v in vs) if vs[0].dim() >= 2 else None
            if width is not None:
                vs = [self.pad_width(key, v, width) for v in vs]
            out[key] = torch.cat(vs, 0)
        return out, spans

    def encode(self, batch: dict[str, torch.Tensor]) -> Encoded:
        """Step (a): encode a chunk's sentences (module docstring)."""
        raise NotImplementedError

    def batch_terms(self, emb: dict[str, torch.Tensor], batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Step (b): the in-batch terms from the whole batch's ``emb``: logged terms and ``WEIGHTED``."""
        return {WEIGHTED: {}}

    def row_terms(self, enc: Encoded, chunk: dict[str, torch.Tensor], batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Step (c): the chunk's share of the per-sentence terms, each normalised by the whole
        ``batch``'s count: logged terms (additive over chunks) and ``WEIGHTED``."""
        return {WEIGHTED: {}}

    def losses(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Named loss terms of the whole batch in one pass: ``encode`` + ``batch_terms`` +
        ``row_terms``. ``"loss"`` is the total that is back-propagated (fp32 scalar), the sum of the
        ``WEIGHTED`` terms; the other terms are logged (``train/<name>``), scalars, detached, e.g.
        ``{"loss": a + b·r, "contrastive": a.detach(), "recon": r.detach(),
        WEIGHTED: {"contrastive": a, "recon": b·r}}``."""
        enc = self.encode(batch)
        out = self.batch_terms(enc.batch, batch)
        rows = self.row_terms(enc, batch, batch)
        weighted = {**out.pop(WEIGHTED), **rows.pop(WEIGHTED)}
        return {"loss": total_loss(weighted), **out, **rows, WEIGHTED: weighted}

    # ------------------------------------------------------------------ state kept across steps
    def stash(self, name: str, value: torch.Tensor) -> None:
        """Keep ``value`` (detached) for ``after_step`` under ``name`` and this micro-batch
        (``self.micro``): a repeated call on the same micro-batch (gradient caching, SAM's second
        pass) overwrites it. The one way a step may hand tensors to the hook that also holds under
        ``train.graphs``: there the step's stash is a static output of the captured graph, copied
        out under the replayed micro-batch's index after every replay (``sentemb.train.graphs``).
        Runs eagerly under ``train.compile`` (no recompilation per micro-batch)."""
        sink = self.__dict__.get("_stash_sink")
        if sink is not None:  # inside a graphed micro-batch: the graph's static output
            sink[name] = value.detach()
            return
        self.__dict__.setdefault("_stashed", {}).setdefault(name, {})[self.__dict__.get("_micro", 0)] = value.detach()

    def take_stash(self, name: str) -> list[torch.Tensor]:
        """What the step's micro-batches stashed under ``name`` (``stash``), in micro-batch order
        (one tensor per micro-batch that stashed it), and forget it: call it in ``after_step``."""
        got = self.__dict__.setdefault("_stashed", {}).pop(name, {})
        return [got[m] for m in sorted(got)]

    @classmethod
    def prepare_compile(cls) -> None:
        """Called once by the set-up of a compiled run (``train.compile``), before ``torch.compile``:
        where a method puts a function Dynamo must not compile under ``torch.compiler.disable`` (not at
        import, which would import ``torch._dynamo`` in every command). ArcCSE's ArcCon loss is the
        case. Default: nothing."""

    def before_epoch(self, epoch: int) -> None:
        """Called before the optimizer step that holds epoch ``epoch``'s first micro-batch (0-based: epoch
        0 before step 0; ``sentemb.train.loop.epochs_begun``), on every process, with ``self.step`` that
        step, between ``after_step`` of the step before and the step's batches' losses. With
        ``grad_accum`` an epoch may begin inside a step: the hook then runs before the whole step. A
        resumed run calls it for the epochs that begin from its first step on (a checkpoint is saved
        after ``after_step``, so the resumed and the uninterrupted run call it alike). As in
        ``after_step``, state changes here in place (``zero_``, ``fill_``). ``build_batch`` may have
        built the step's batches already (``train.prefetch``, ``train.workers``): batches must not read
        what the hook changes. Default: nothing."""

    def after_step(self, step: int) -> None:
        """Called once per optimizer step ``step`` (0-based, = ``self.step`` during it), on every
        process, after the update: the one place where state that is not a trainable weight changes
        (an EMA of the encoder, a queue enqueuing the keys stashed during the step). Whatever must
        survive a resume lives in ``state_dict()`` (parameters, persistent buffers, ``get_extra_state``);
        nothing may stay pending once it returns (a checkpoint may be saved right after). Default: nothing."""

    def static_idle_parameters(self, batch: dict[str, torch.Tensor]) -> list[nn.Parameter]:
        """Under ``train.graphs`` (``ctx.static``): the trainable parameters that an eager step over
        this micro-batch (``batch`` on the CPU, as ``build_batch`` made it: read without a device
        sync) would leave without a gradient, while the static step, which runs every path on every
        micro-batch, writes them zeros. A zero gradient is not no gradient: AdamW would move such a
        parameter (its momentum, weight decay). The graphed step hands them to the optimizer without
        a gradient, as the eager step does, when no micro-batch of the step used them. PaSeR's
        decoder on a batch without a phrase target is the case. Default: none."""
        return []

    def grad_norm_parameters(self) -> list[nn.Parameter]:
        """The parameters on which ``train.log_grad_norms`` measures each weighted term's gradient:
        the trainable parameters of the encoder (the PLM). A method whose sentence embedding is made
        by more shared modules (SARCSE's TextCNN) adds them."""
        return [p for p in self.encoder.parameters() if p.requires_grad]

    # ------------------------------------------------------------------ evaluation and export
    def export_head(self) -> nn.Module | None:
        """A Linear+Tanh head (``.dense``) stored in the exported checkpoint's pooler slot (or None)."""
        return None

    def dev_head(self, pooler: str) -> nn.Module | None:
        """A module applied after pooling by the training-time dev embedder (default: the export
        head when the evaluation pooler is ``cls``, i.e. the head is kept at test time)."""
        return self.export_head() if pooler == "cls" else None

    def embedder(self, pooler: str, device: torch.device) -> EmbedFn:
        """What the loop's STS-B dev evaluation encodes sentences with (list[str] -> array), using
        the current weights. Default: the encoder + ``pooler`` (+ ``dev_head``)."""
        # fp32 even on CUDA: model selection should not hinge on bf16 rounding (3,000 sentences: cheap).
        return Embedder(self.encoder, self.tokenizer, "cls_before_pooler" if pooler == "cls" else pooler,
                        head=self.dev_head(pooler), batch_size=DEV_BATCH, device=device, precision="fp32", keep_plan=True)

    def export(self, out_dir: Path, pooler: str, meta: dict[str, Any]) -> None:
        """Write the trained sentence encoder to ``out_dir`` (HF + sentence-transformers layout).
        ``meta`` (method, name, backbone, seed, step, dev) goes into ``sentemb.json``."""
        from ..model.backbone import export, max_length_of

        export(self.encoder, self.tokenizer, out_dir, pooler=pooler, head=self.export_head(),
               max_seq_length=max_length_of(self.encoder, self.tokenizer), meta=meta)

    @classmethod
    def load_embedder(cls, model_dir: str | Path, device: torch.device, batch_size: int = 128,
                      precision: str = "fp32") -> EmbedFn:
        """The embedder of an exported model for ``sentemb evaluate --pooler method``. Only methods
        with ``eval_pooler = "method"`` implement it."""
        raise SentembError(f"method '{cls.name}' defines no embedder of its own; evaluate with a pooler "
                           f"(its models use '{cls.eval_pooler}')")

"""The published backbone architectures, and random-weight model directories at their real widths.

``ARCHITECTURES`` holds the Hugging Face ``config.json`` fields that fix the shapes of the four
backbones the paper configuration trains (``config/config.yaml``). The figures are those of the hub
files (checked against our knowledge of ``google-bert/bert-base-uncased``, ``bert-large-uncased``,
``FacebookAI/roberta-base``, ``roberta-large`` ``config.json``; no network is used here): BERT's
WordPiece vocabulary of 30522 with 512 positions and 2 token types; RoBERTa's byte-level BPE of
50265 with 514 positions (the padding index 1 plus an offset of 2: positions start at
``pad_token_id + 1``), one token type, ``<s>`` 0, ``<pad>`` 1, ``</s>`` 2.

``write_model_dir(arch, out, num_layers=...)`` writes a randomly initialised encoder of that
architecture (optionally with fewer layers: every layer has the same shape, so the per-layer cost
and memory scale linearly) and a stand-in tokenizer of the right family, in the layout
``sentemb.model.backbone.load_encoder`` reads. BERT: the all-MiniLM-L6-v2 tokenizer of the shared mirror
when there is one (its vocabulary *is* bert-base-uncased's 30522 WordPiece entries), else a small
generated WordPiece; RoBERTa: a byte-level BPE of single bytes (no merges; ids ``<s>`` 0, ``<pad>``
1, ``</s>`` 2 as the real one), the embedding matrix kept at the real 50265 rows. ``sentemb plan``
and the real-shape tests (``tests/test_real_shapes.py``) both build their models here.
"""

from __future__ import annotations

import os
from pathlib import Path

from .. import SentembError

_BERT = {"model_type": "bert", "vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2,
         "pad_token_id": 0, "hidden_act": "gelu", "layer_norm_eps": 1e-12, "hidden_dropout_prob": 0.1,
         "attention_probs_dropout_prob": 0.1}
_ROBERTA = {"model_type": "roberta", "vocab_size": 50265, "max_position_embeddings": 514, "type_vocab_size": 1,
            "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "hidden_act": "gelu", "layer_norm_eps": 1e-5,
            "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}
_BASE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072}
_LARGE = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096}

#: name -> the shape-fixing fields of the published Hugging Face config.json
ARCHITECTURES: dict[str, dict] = {
    "bert-base-uncased": {**_BERT, **_BASE},
    "bert-large-uncased": {**_BERT, **_LARGE},
    "roberta-base": {**_ROBERTA, **_BASE},
    "roberta-large": {**_ROBERTA, **_LARGE},
}

#: words each of which is one token of every stand-in tokenizer (and of bert-base-uncased's WordPiece):
#: a line of k of them is k content tokens, which ``sentemb plan`` uses to count a step at a given width
COUNTING_WORDS = tuple(("the a of and to in is was for on that with as by it at from he she they man woman dog cat "
                        "plays guitar car red runs park street city house music one two new old good").split())


def shared_dirs() -> list[Path]:
    """Folders laid out like ``shared/`` that may hold the mirror: ``$SENTEMB_SHARED``,
    ``$SENTEMB_MIRROR``, and a ``shared/`` folder beside this checkout."""
    found = [os.environ.get("SENTEMB_SHARED"), os.environ.get("SENTEMB_MIRROR"),
             Path(__file__).resolve().parents[4] / "shared"]
    return [Path(d) for d in found if d]


def minilm_dirs() -> list[Path]:
    """Where a BERT WordPiece tokenizer of the real vocabulary may be found (the mirror's MiniLM)."""
    return [d / "models" / "all-MiniLM-L6-v2" for d in shared_dirs()]


def architecture_of(hub_id: str) -> str:
    """The ``ARCHITECTURES`` name of a backbone's ``hub_id`` (``google-bert/bert-base-uncased`` ->
    ``bert-base-uncased``; the last path part, case-insensitive)."""
    name = str(hub_id).rstrip("/").rsplit("/", 1)[-1].lower()
    if name not in ARCHITECTURES:
        raise SentembError(f"backbone '{hub_id}': no published architecture is known for it "
                           f"(sentemb.ops.shapes.ARCHITECTURES: {sorted(ARCHITECTURES)})")
    return name


def backbone_architecture(config, backbone: str) -> str | dict:
    """The architecture of configured ``backbone`` (``config``: a validated mapping or the tree): its
    ``random_init`` shape (HF config keys with ``model_type``) when it has one, else the published one
    of its ``hub_id``, else the shape read from its model directory's ``config.json``
    (``backbone_model_dir``: fetched, mirrored or in a shared/ folder), else an error."""
    from ..config.settings import Config

    spec = Config.of(config).backbones[backbone]
    if spec.random_init:
        return dict(spec.random_init)
    try:
        return architecture_of(spec.hub_id)
    except SentembError as e:
        d = backbone_model_dir(config, backbone)
        if d is None:
            raise SentembError(f"{e}; and no model directory with a config.json was found for it (fetch it, or set "
                               "mirror / SENTEMB_MIRROR)") from None
        return architecture_from_dir(d)


#: the config.json fields that fix an encoder's shapes (``architecture_from_dir`` keeps these)
SHAPE_FIELDS = ("model_type", "vocab_size", "max_position_embeddings", "type_vocab_size", "pad_token_id",
                "bos_token_id", "eos_token_id", "hidden_act", "layer_norm_eps", "hidden_dropout_prob",
                "attention_probs_dropout_prob", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size")


def architecture_from_dir(model_dir: str | Path) -> dict:
    """The shape-fixing fields (``SHAPE_FIELDS``) of a Hugging Face model directory's ``config.json``
    (BERT or RoBERTa family: what ``hf_config`` builds)."""
    import json

    f = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(f.read_text("utf-8"))
    except (OSError, ValueError) as e:
        raise SentembError(f"{f}: cannot read the model's config ({e})") from None
    if cfg.get("model_type") not in ("bert", "roberta"):
        raise SentembError(f"{f}: model_type {cfg.get('model_type')!r}; sentemb plan knows bert and roberta shapes")
    return {k: cfg[k] for k in SHAPE_FIELDS if cfg.get(k) is not None}


def backbone_model_dir(config, backbone: str) -> Path | None:
    """A directory holding ``backbone``'s real ``config.json`` (and tokenizer), or None: the fetched
    one (``resources/models/<backbone>``), else ``<mirror>/<mirror_path>`` (config ``mirror`` or
    ``$SENTEMB_MIRROR``), else ``<shared>/<mirror_path>`` of ``shared_dirs``."""
    from ..config.paths import Layout
    from ..config.settings import Config

    cfg = Config.of(config)
    spec = cfg.backbones[backbone]
    sub = spec.mirror_path or f"models/{str(spec.hub_id).rstrip('/').rsplit('/', 1)[-1]}"
    roots = [Path(Layout.of(cfg).model(backbone))]
    mirror = os.environ.get("SENTEMB_MIRROR") or cfg.mirror
    if mirror:
        roots.append(Path(mirror).expanduser() / sub)
    roots += [d / sub for d in shared_dirs()]
    return next((d for d in roots if (d / "config.json").is_file()), None)


def fields_of(arch: str | dict) -> dict:
    """The HF config fields of an ``ARCHITECTURES`` name or of a shape given as a mapping."""
    return dict(ARCHITECTURES[arch]) if isinstance(arch, str) else dict(arch)


def depth(arch: str | dict) -> int:
    """The architecture's number of Transformer layers."""
    return int(fields_of(arch).get("num_hidden_layers", 12))


def hf_config(arch: str | dict, num_layers: int | None = None):
    """The transformers config of ``arch`` (a name or a mapping of HF config keys with
    ``model_type``), with ``num_layers`` Transformer layers if given."""
    from transformers import BertConfig, RobertaConfig

    fields = fields_of(arch)
    cls = {"bert": BertConfig, "roberta": RobertaConfig}[fields.pop("model_type")]
    if num_layers is not None:
        fields["num_hidden_layers"] = int(num_layers)
    return cls(**fields)


def parameter_count(arch: str | dict, num_layers: int | None = None) -> int:
    """Parameters of the encoder (no NSP pooler), counted on the meta device (no memory used)."""
    import torch
    from transformers import AutoModel

    with torch.device("meta"):
        model = AutoModel.from_config(hf_config(arch, num_layers), add_pooling_layer=False)
    return sum(p.numel() for p in model.parameters())


def _minilm_dir() -> Path | None:
    return next((d for d in minilm_dirs() if (d / "vocab.txt").is_file()), None)


def stand_in_tokenizer(arch: str | dict):
    """A tokenizer of ``arch``'s family (see the module docstring)."""
    family = fields_of(arch)["model_type"]
    if family == "bert":
        from transformers import AutoTokenizer, BertTokenizerFast

        src = _minilm_dir()
        if src is not None:
            return AutoTokenizer.from_pretrained(src)
        import tempfile

        words = COUNTING_WORDS + ("an",)
        vocab = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        vocab += sorted(set(words)) + list("abcdefghijklmnopqrstuvwxyz0123456789.,'!?-")
        vocab += [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz0123456789"]
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "vocab.txt").write_text("\n".join(vocab) + "\n", "utf-8")
            return BertTokenizerFast(vocab=str(Path(d) / "vocab.txt"), do_lower_case=True)
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import RobertaTokenizerFast

    tokens = ["<s>", "<pad>", "</s>", "<unk>"] + sorted(ByteLevel.alphabet()) + ["<mask>"]
    merges: list[tuple[str, str]] = []
    # each counting word one token, with and without its leading space (Ġ); the spaced merges rank
    # first, so that a spaced word never merges its letters apart from its Ġ
    for spaced in (True, False):
        for word in COUNTING_WORDS:
            symbols = (["\u0120"] if spaced else []) + list(word)
            s = symbols[0]
            for ch in symbols[1:]:
                merges.append((s, ch))
                s += ch
                if s not in tokens:
                    tokens.append(s)
    merges = list(dict.fromkeys(merges))
    return RobertaTokenizerFast(vocab={t: i for i, t in enumerate(tokens)}, merges=merges)


def write_model_dir(arch: str | dict, out: str | Path, num_layers: int | None = None, seed: int = 0) -> Path:
    """A randomly initialised ``arch`` encoder (``num_layers`` layers, default the published number)
    with a stand-in tokenizer of its family, saved in Hugging Face layout under ``out``."""
    import torch
    from transformers import AutoModel

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = stand_in_tokenizer(arch)
    cfg = hf_config(arch, num_layers)
    if len(tokenizer) > cfg.vocab_size:
        raise SentembError(f"{arch}: stand-in tokenizer has {len(tokenizer)} ids, more than the vocabulary {cfg.vocab_size}")
    tokenizer.save_pretrained(out)
    from ..model.backbone import STAND_IN_TOKENIZER

    (out / STAND_IN_TOKENIZER).write_text(
        f"The tokenizer here stands in for {arch}'s own ({len(tokenizer)} of its {cfg.vocab_size} ids): written by "
        "sentemb.ops.shapes.write_model_dir beside random weights at the real shapes, to time and size steps.\n",
        "utf-8")
    torch.manual_seed(seed)
    AutoModel.from_config(cfg, add_pooling_layer=False).save_pretrained(out)
    return out


def layers_needed(method: str, method_args: dict, minimum: int = 2) -> int:
    """The fewest Transformer layers a reduced-depth model of ``method`` needs: ``minimum``, or more
    where the method reads a given layer (``Method.layers_needed``: InfoCSE's state after
    ``skip_from`` layers, and with ``init: backbone`` its upper ``head_layers`` layers). Every other
    method is depth-independent: all layers of an encoder have one shape."""
    from ..methods import get_method

    return max(minimum, int(get_method(method).layers_needed(dict(method_args))))

"""Padding-free training forward for BERT-family encoders (``train.unpad``).

A batch padded to its longest sentence spends a third of its positions on padding at max_len 32
(`sentemb benchmark --overhead` prints the share). With ``train.unpad: true`` the encoder runs, in
training mode, on the real tokens only: the batch's tokens are packed into one row of length
T = Σ lengths (with each sentence's own position ids and token types), so the embeddings, every
linear layer, LayerNorm and dropout see T positions instead of B × L. Attention is the only step
that needs the sentence boundaries: a function registered through transformers' attention interface
(``AttentionInterface``) puts queries, keys and values back in (B, L) layout, runs scaled dot-product
attention with the key-padding mask, and packs the result again. The output is scattered back to
the (B, L, d) layout the methods read (padded positions are zeros).

Same sentences in each batch, same computation on every real token: with dropout off the outputs
equal the padded forward's (tested on every method). With dropout on, the masks are drawn for T
positions instead of B × L, so a run draws other (equally distributed) masks than a padded run:
it is a different random run, which is why ``train.unpad`` is off by default and part of a run's
settings. Evaluation (eval mode) always uses the model's own forward.

Supported: encoder-only BERT-like models with absolute positions (``bert``, ``roberta``,
``xlm-roberta``, ``camembert``) on the sdpa or eager attention implementation.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from .. import SentembError

VARLEN = "sentemb_varlen"
SUPPORTED = ("bert", "roberta", "xlm-roberta", "camembert")
_ROBERTA_POSITIONS = ("roberta", "xlm-roberta", "camembert")  # positions start at padding_idx + 1
_registered = False


def _register() -> None:
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(VARLEN, varlen_attention)
    AttentionMaskInterface.register(VARLEN, lambda *args, **kwargs: None)  # boundaries come in `sentemb_unpad`
    _registered = True


def varlen_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                     sentemb_unpad=None, **kwargs):
    """Attention within each packed sentence. ``query``/``key``/``value``: (1, heads, T, d) of the
    packed tokens; ``sentemb_unpad`` = (index, B, L, key_mask): the tokens' positions in the
    flattened (B·L) layout and the (B, 1, 1, L) boolean key mask. Returns (1, T, heads, d)."""
    if sentemb_unpad is None:
        raise SentembError("sentemb varlen attention called without the packing plan (sentemb.model.unpad)")
    index, b, length, key_mask = sentemb_unpad
    _, heads, t, d = query.shape
    qkv = torch.stack((query[0], key[0], value[0]), 0).permute(2, 0, 1, 3).reshape(t, 3 * heads * d)
    padded = qkv.new_zeros(b * length, 3 * heads * d).index_copy(0, index, qkv)
    q, k, v = padded.view(b, length, 3, heads, d).permute(2, 0, 3, 1, 4)  # each (B, heads, L, d)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, dropout_p=dropout, scale=scaling)
    return out.transpose(1, 2).reshape(b * length, heads * d).index_select(0, index).view(1, t, heads, d), None


def check(encoder, where: str) -> None:
    """Raise a SentembError naming ``where`` unless ``encoder`` can run padding-free."""
    cfg = encoder.config
    mtype = getattr(cfg, "model_type", "")
    if mtype not in SUPPORTED:
        raise SentembError(f"{where}: padding-free training supports {', '.join(SUPPORTED)} encoders, not "
                           f"'{mtype}'; set it to false")
    if getattr(cfg, "is_decoder", False) or getattr(cfg, "add_cross_attention", False):
        raise SentembError(f"{where}: the encoder is configured as a decoder; set it to false")
    if getattr(cfg, "position_embedding_type", "absolute") not in ("absolute", None):
        raise SentembError(f"{where}: needs absolute position embeddings, not '{cfg.position_embedding_type}'")
    if cfg._attn_implementation not in ("sdpa", "eager"):
        raise SentembError(f"{where}: the encoder uses attention '{cfg._attn_implementation}' (sdpa or eager needed)")


def packed_forward(encoder, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   token_type_ids: torch.Tensor | None = None, output_hidden_states: bool = False):
    """The encoder's forward on the real tokens only (module docstring). Returns a model output
    with ``last_hidden_state`` (B, L, d) and, if asked, ``hidden_states`` in the padded layout."""
    from transformers.modeling_outputs import BaseModelOutputWithPoolingAndCrossAttentions

    _register()
    b, length = input_ids.shape
    mask = attention_mask.bool()
    index = mask.reshape(-1).nonzero().squeeze(1)
    if encoder.config.model_type in _ROBERTA_POSITIONS:
        pad = encoder.embeddings.padding_idx
        positions = (torch.cumsum(mask, 1) * mask + pad).long()  # RoBERTa's create_position_ids_from_input_ids
    else:
        positions = torch.arange(length, device=input_ids.device).expand(b, length)
    types_ = token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids)

    def pack(x):
        return x.reshape(-1).index_select(0, index)[None]

    cfg = encoder.config
    before = cfg._attn_implementation
    cfg._attn_implementation = VARLEN
    try:
        out = type(encoder).forward(encoder, input_ids=pack(input_ids), token_type_ids=pack(types_),
                                    position_ids=pack(positions), output_hidden_states=output_hidden_states,
                                    return_dict=True, sentemb_unpad=(index, b, length, mask[:, None, None, :]))
    finally:
        cfg._attn_implementation = before

    def unpack(x):
        return x.new_zeros(b * length, x.shape[-1]).index_copy(0, index, x[0]).view(b, length, -1)

    return BaseModelOutputWithPoolingAndCrossAttentions(
        last_hidden_state=unpack(out.last_hidden_state),
        hidden_states=tuple(unpack(h) for h in out.hidden_states) if output_hidden_states else None)


_PACKABLE = {"input_ids", "attention_mask", "token_type_ids", "output_hidden_states", "return_dict"}


def _forward(self, *args, **kwargs):
    """Training-mode calls with input ids and an attention mask go padding-free; anything else
    (evaluation, positional arguments, embeddings as input, attentions asked for) is the model's own."""
    if (self.training and not args and set(kwargs) <= _PACKABLE and kwargs.get("input_ids") is not None
            and kwargs.get("attention_mask") is not None and kwargs.get("return_dict", True)):
        return packed_forward(self, kwargs["input_ids"], kwargs["attention_mask"], kwargs.get("token_type_ids"),
                              bool(kwargs.get("output_hidden_states")))
    return type(self).forward(self, *args, **kwargs)


def installed(encoder) -> bool:
    """Whether ``install`` made ``encoder``'s training forward padding-free (its hidden states then
    have one row per real token, not per sentence)."""
    return getattr(getattr(encoder, "forward", None), "__func__", None) is _forward


def install(encoder, where: str = "train.unpad") -> None:
    """Make ``encoder``'s training forward padding-free (an instance attribute: a deep copy of the
    encoder is rebound to the copy; saving and loading are unaffected)."""
    check(encoder, where)
    _register()
    encoder.forward = types.MethodType(_forward, encoder)

"""BERT's masked-language-model corruption, shared by every method with an MLM term (InfoCSE's
auxiliary and MLM losses, PaSeR's L_MLM)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def static_masked_ce(states: torch.Tensor, labels: torch.Tensor, head, count=None) -> torch.Tensor:
    """The masked-token cross-entropy in its static form (``MethodContext.static``, ``train.graphs``):
    ``head`` (a module, or a (V, H) output matrix: logits = x Wᵀ) over *every* position of ``states``
    (..., H), the positions whose label is -100 ignored: Σ_j CE(head(states_j), labels_j) / ``count``
    (default: the number of labelled positions), fp32; 0, still connected to the graph, when no
    position is labelled. The same number as selecting the labelled rows first, with no
    data-dependent shape and no host read, for the head's cost over all positions."""
    flat = states.reshape(-1, states.size(-1))
    logits = flat @ head.T if isinstance(head, torch.Tensor) else head(flat)
    labels = labels.reshape(-1)
    with torch.autocast(device_type=logits.device.type, enabled=False):
        total = F.cross_entropy(logits.float(), labels, ignore_index=-100, reduction="sum")
        if count is None:
            count = (labels != -100).sum()
        return total / (count.clamp(min=1) if isinstance(count, torch.Tensor) else max(int(count), 1))


def mask_tokens(input_ids: np.ndarray, maskable: np.ndarray, rate: float, rng: np.random.Generator, mask_id: int,
                vocab_size: int, word_ids: np.ndarray | None = None, width: int | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """BERT's MLM corruption (Devlin et al. 2019; InfoCSE §2 "BERT's MLM objective"): each maskable
    position (or each word, with ``word_ids``: -1 = not a word) is chosen with probability ``rate``;
    a chosen token becomes [MASK] with p 0.8, a uniformly random token with p 0.1, stays with p 0.1.
    Returns (x̂, labels) with labels = the original id at chosen positions, -100 elsewhere.

    ``width``: the batch's real width (its longest row, before bucket padding, ``train.buckets``).
    The draws are made over the first ``width`` columns only, so that a batch padded to a bucket
    gets the masks of the unpadded one (the draws' shape is the random stream's); the columns past
    it stay as they are with label -100."""
    if width is not None and width < input_ids.shape[1]:
        if maskable[:, width:].any():
            raise ValueError(f"mask_tokens: maskable positions beyond the real width {width}")
        x, y = mask_tokens(input_ids[:, :width], maskable[:, :width], rate, rng, mask_id, vocab_size,
                           None if word_ids is None else word_ids[:, :width])
        out, labels = input_ids.copy(), np.full(input_ids.shape, -100, dtype=y.dtype)
        out[:, :width], labels[:, :width] = x, y
        return out, labels
    shape = input_ids.shape
    if word_ids is None:
        chosen = (rng.random(shape) < rate) & maskable
    else:
        n_words = int(word_ids.max()) + 1 if word_ids.size else 0
        pick = rng.random((shape[0], max(n_words, 1))) < rate
        chosen = np.zeros(shape, dtype=bool)
        valid = (word_ids >= 0) & maskable
        rows = np.nonzero(valid)
        chosen[rows] = pick[rows[0], word_ids[rows]]
    r = rng.random(shape)
    rand_tok = rng.integers(0, vocab_size, shape)
    out = input_ids.copy()
    out[chosen & (r < 0.8)] = mask_id
    rnd = chosen & (r >= 0.8) & (r < 0.9)
    out[rnd] = rand_tok[rnd]
    labels = np.where(chosen, input_ids, -100)
    return out, labels

"""sentemb: a reproducible pipeline for unsupervised sentence embeddings (SimCSE family)."""

__version__ = "0.1.0"

#: sentence poolers (SimCSE's names), see sentemb.model.backbone.pool
POOLERS = ("cls", "cls_before_pooler", "avg", "avg_first_last", "avg_top2", "avg_static_last")


class SentembError(Exception):
    """An error caused by bad input (config, data file, corpus); its message names the cause."""

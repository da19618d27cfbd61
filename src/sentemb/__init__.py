"""sentemb: a reproducible pipeline for unsupervised sentence embeddings (SimCSE family)."""

__version__ = "0.1.0"


class SentembError(Exception):
    """An error caused by bad input (config, data file, corpus); its message names the cause."""

"""Inputs: fetched, verified and cached (:mod:`.fetch`, :mod:`.cache`), read (:mod:`.corpus`) and
tokenized once per tokenizer (:mod:`.tokens`)."""

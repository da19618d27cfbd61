"""Evaluation under the SentEval protocol: STS (:mod:`.sts`, sets read by :mod:`.senteval`) and the
transfer tasks (:mod:`.transfer`)."""

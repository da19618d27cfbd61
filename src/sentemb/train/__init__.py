"""Training: the one loop every method shares (:mod:`.loop`), on several processes
(:mod:`.distributed`), with SAM (:mod:`.sam`), per-term gradient norms (:mod:`.grad_norms`) and a
method's pretraining stage (:mod:`.pretrain`)."""

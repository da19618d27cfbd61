"""Training: the one loop every method shares (:mod:`.loop`), its ways of computing a step's gradient
(:mod:`.step`), on several processes (:mod:`.distributed`), with SAM (:mod:`.sam`), per-term gradient
norms (:mod:`.grad_norms`) and a method's pretraining stage (:mod:`.pretrain`)."""

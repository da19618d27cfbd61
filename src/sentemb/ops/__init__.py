"""Operating the pipeline: what a configuration costs (:mod:`.plan`), throughput (:mod:`.benchmark`),
a GPU's first check (:mod:`.gpucheck`), FLOPs and peaks (:mod:`.flops`), the published architectures
at random weights (:mod:`.shapes`) and one GPU per local job (:mod:`.gpu_slots`)."""

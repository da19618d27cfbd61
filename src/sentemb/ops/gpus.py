"""The GPUs ``sentemb plan`` and ``sentemb benchmark`` know: one table of memory and dense bf16 peak.

``GPUS``: name -> (memory in GB, dense bf16 peak in TFLOP/s, without sparsity; the vendors' data
sheets: H100 SXM and H200 989, A100 312, L40S 362, A10 125, RTX 4090 165). ``A100-40`` is the 40 GB
A100. ``sentemb.ops.plan.GPU_MEMORY_GB`` and ``sentemb.ops.benchmark.PEAK_BF16_TFLOPS`` are views
of it, so the two cannot disagree.
"""

from __future__ import annotations

GPUS: dict[str, tuple[int, float]] = {
    "H100": (80, 989.0),
    "H200": (141, 989.0),
    "A100": (80, 312.0),
    "A100-40": (40, 312.0),
    "L40S": (48, 362.0),
    "A10": (24, 125.0),
    "4090": (24, 165.0),
}
GPU_MEMORY_GB: dict[str, int] = {k: v[0] for k, v in GPUS.items()}
PEAK_BF16_TFLOPS: dict[str, float] = {k: v[1] for k, v in GPUS.items()}


def gpu_spec(name: str) -> tuple[str, int, float]:
    """(canonical name, memory GB, bf16 peak TFLOP/s) of ``name`` (case-insensitive), or a
    ``SentembError`` naming the known GPUs."""
    from .. import SentembError

    key = str(name).strip().upper()
    if key not in GPUS:
        raise SentembError(f"--gpu {key}: unknown GPU (known: {', '.join(GPUS)})")
    return (key, *GPUS[key])

"""Counted FLOPs and a device's peak: what "share of peak" (MFU) is measured against.

``counted(fn)`` runs ``fn`` under ``torch.utils.flop_counter.FlopCounterMode`` with SDPA forced to its
math backend, so every matmul of the step is counted, attention included (the fused CPU/CUDA
attention kernels are not all registered with the counter; their math form is the same FLOPs).
Counting a real optimizer step covers every method's own work without a formula per method: both
SimCSE views, SAM's second forward/backward, InfoCSE's and PaSeR's extra networks, SARCSE's decoder.
Only matmul-like ops are counted (as in the MFU convention of PaLM, Chowdhery et al. 2022, App. B);
element-wise work is not.

``cpu_peak_tflops()`` is the CPU's own ceiling measured in the same process: the best of a few large
matmuls on the threads torch uses, in the dtype the measured rows compute in (a CPU with bf16
instructions multiplies bf16 several times faster than fp32: 0.87 against 0.21 TFLOP/s on this
project's 2-core machine, so bf16 rows against an fp32 ceiling read over 100 %). On CUDA the peak is the GPU's bf16 dense figure by name
(``sentemb.ops.benchmark.PEAK_BF16_TFLOPS``).
"""

from __future__ import annotations

import time
from typing import Any, Callable


def counted(fn: Callable[[], Any]) -> tuple[Any, float]:
    """``(fn(), FLOPs)``: the floating-point operations of the matmuls ``fn`` runs (forward and
    backward), with scaled-dot-product attention in its math form so that it is counted too."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    with sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as fc:
        out = fn()
    return out, float(fc.get_total_flops())


def counted_by_module(fn: Callable[[], Any]) -> tuple[Any, float, dict[str, float]]:
    """``counted`` with the FLOPs attributed to each module (forward and backward), by the name
    ``FlopCounterMode`` gives it (the first module called, then the attribute path:
    ``BertModel.encoder.layer.0``)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    with sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as fc:
        out = fn()
    per_module = {name: float(sum(ops.values())) for name, ops in fc.get_flop_counts().items()}
    return out, float(fc.get_total_flops()), per_module


def fp32_gemms():
    """A context in which the CPU's bf16 and fp16 matrix products (``aten.mm``, ``addmm``, ``bmm``,
    ``baddbmm``, ``linear``, ``matmul``) run as fp32 products of the same, exactly widened, inputs, rounded back to the
    input's dtype: what a native bf16 GEMM computes (fp32 accumulation, one rounding of the output)
    up to the order of the sums. A CPU without bf16 instructions (AVX2) emulates those products: on
    this project's machine a bf16 ``g @ w`` of a linear layer's backward ran at 0.8 GFLOP/s against
    fp32's 160, and ``sentemb plan``'s counted ArcCSE steps spent 92 % of their time there. Shapes,
    dtypes, saved tensors and counted FLOPs are unchanged (a ``FlopCounterMode`` entered inside this
    one sees the bf16 op): for counting and for tests of the bf16 path's plumbing, not for a run's
    figures. CUDA tensors pass through untouched."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten
    # linear and matmul reach a mode undecomposed under inference_mode (the evaluation's encoder)
    ops = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default, aten.linear.default,
           aten.matmul.default}
    narrow = (torch.bfloat16, torch.float16)

    class _Fp32Gemms(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in ops:
                tensors = [a for a in args if isinstance(a, torch.Tensor)]
                dtype = tensors[0].dtype if tensors else None
                if dtype in narrow and all(t.device.type == "cpu" for t in tensors):
                    wide = [a.float() if isinstance(a, torch.Tensor) else a for a in args]
                    return func(*wide, **kwargs).to(dtype)
            return func(*args, **kwargs)

    return _Fp32Gemms()


#: the environment variable a ``sentemb`` command reads at its start: ``fp32`` runs the whole command
#: under ``fp32_gemms`` (``sentemb gpu-check --cpu`` sets it for its rows and their subprocesses),
#: ``native`` or unset leaves the CPU's own bf16 kernels
CPU_GEMMS_ENV = "SENTEMB_CPU_BF16_GEMMS"


def cpu_gemms_from_env():
    """The context ``CPU_GEMMS_ENV`` asks for: ``fp32_gemms()`` for ``fp32``, else a no-op; any
    other value is refused naming the variable."""
    import contextlib
    import os

    value = os.environ.get(CPU_GEMMS_ENV, "")
    if value in ("", "native"):
        return contextlib.nullcontext()
    if value == "fp32":
        return fp32_gemms()
    from .. import SentembError

    raise SentembError(f"{CPU_GEMMS_ENV}={value!r}: not one of native, fp32")


#: the longest one product of ``cpu_peak_tflops`` may take (seconds): a CPU without fp16 (or bf16)
#: matmul units emulates them, about 100x slower, and six 2048² products took minutes there
PEAK_PRODUCT_S = 0.5


def cpu_peak_tflops(n: int = 2048, repeats: int = 5, dtype: str = "fp32") -> float:
    """This CPU's matmul throughput in TFLOP/s for ``dtype`` (``fp32``, ``bf16`` or ``fp16``, as
    ``train.precision`` names them): the best of ``repeats`` ``n``×``n`` products (2·n³ FLOPs each)
    after one warm-up, on ``torch.get_num_threads()`` threads. A 256² product is timed first, and
    ``n`` lowered where one product of ``n``² would take over ``PEAK_PRODUCT_S`` (an emulated dtype)."""
    import torch

    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    g = torch.Generator().manual_seed(0)
    if n > 256:
        small = torch.randn(256, 256, generator=g).to(torch_dtype)
        torch.mm(small, small)
        one = float("inf")
        for _ in range(3):  # the fastest of three: a busy machine's one slow sample would shrink n
            t = time.perf_counter()
            torch.mm(small, small)
            one = min(one, time.perf_counter() - t)
        guess = one * (n / 256) ** 3
        if guess > PEAK_PRODUCT_S:
            n = max(256, int(256 * (PEAK_PRODUCT_S / max(guess, 1e-9) * (n / 256) ** 3) ** (1 / 3)))
    a = torch.randn(n, n, generator=g).to(torch_dtype)
    b = torch.randn(n, n, generator=g).to(torch_dtype)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t)
    return 2.0 * n**3 / best / 1e12

"""The ``sentemb`` command line: one module of this package per stage contributes its subcommands
through ``register``; the domain modules it calls carry no argparse code (issue 28 §3).

Heavy imports (torch, transformers, mlflow) happen inside the command functions, so ``sentemb
--help`` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from .. import SentembError, __version__

# Modules of this package that define ``register(subparsers)``; each adds one or more subcommands.
COMMAND_MODULES = [
    "sentemb.cli.data",
    "sentemb.cli.stats",
    "sentemb.cli.methods",
    "sentemb.cli.config_keys",
    "sentemb.cli.tokens",
    "sentemb.cli.train",
    "sentemb.cli.pretrain",
    "sentemb.cli.evaluate",
    "sentemb.cli.transfer",
    "sentemb.cli.tables",
    "sentemb.cli.report",
    "sentemb.cli.studies",
    "sentemb.cli.tracking",
    "sentemb.cli.benchmark",
    "sentemb.cli.gpucheck",
    "sentemb.cli.plan",
    "sentemb.cli.inputs",
    "sentemb.cli.model_card",
]

#: commands whose module imports no torch: ``sentemb <command>`` builds only that module's parser, so
#: a rule that runs once per run (``model_card``) starts in a fraction of a second
LIGHT_COMMANDS = {"model-card": "sentemb.cli.model_card"}


#: commands that may run on a GPU: they claim a GPU slot when $SENTEMB_GPU_SLOTS is set
GPU_COMMANDS = {"train", "evaluate", "evaluate-transfer", "encode-transfer", "pretrain", "paraphrase", "benchmark"}


def build_parser(modules: list[str] = COMMAND_MODULES) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sentemb", description="sentemb: train, evaluate and compare unsupervised "
                                     "sentence embeddings (SimCSE and five successors) under one protocol.")
    parser.add_argument("--version", action="version", version=f"sentemb {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in modules:
        importlib.import_module(name).register(sub)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``timeout``, Slurm's ``scancel``, Snakemake stopping its jobs) raised in the
    main thread as an interruption, as Ctrl-C is: every ``with`` block unwinds (temporary folders
    removed, an atomic output not moved into place, the MLflow run ended KILLED) before exit 143."""


def _terminate(signum, frame) -> None:
    raise Terminated(f"signal {signum}")


def _catch_sigterm():
    """Turn SIGTERM into ``Terminated`` in this process; return what puts the handler it replaced
    back (``main`` calls it when the command returns: a process that calls ``main`` keeps its own).
    A forked child (batch or statistics workers, which their parent stops with SIGTERM) gets the
    default action back."""
    import os
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None  # handlers can only be set from the main thread (a caller embedding main())
    if "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ:  # a rank under torchrun: killed at once, as
        return lambda: None  # before (one blocked in a collective could not run the handler until it returns)
    before = signal.signal(signal.SIGTERM, _terminate)
    if not getattr(_catch_sigterm, "registered", False):
        def child() -> None:
            if signal.getsignal(signal.SIGTERM) is _terminate:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)

        os.register_at_fork(after_in_child=child)
        _catch_sigterm.registered = True
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL if before is None else before)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser([LIGHT_COMMANDS[command]] if command in LIGHT_COMMANDS else COMMAND_MODULES)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    restore = _catch_sigterm()
    try:
        if args.command in GPU_COMMANDS:
            from ..ops.gpu_slots import claim_from_env

            claim_from_env()  # before torch touches CUDA: one GPU per job (config local_gpus)
        from ..ops.flops import cpu_gemms_from_env

        with cpu_gemms_from_env():  # SENTEMB_CPU_BF16_GEMMS=fp32: the CPU's bf16 products in fp32 (gpu-check --cpu)
            rc = args.func(args)
    except SentembError as e:
        print(f"sentemb {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM (``Terminated``): cleaned up on the way out
        term = isinstance(e, Terminated)
        print(f"sentemb {args.command}: {'terminated (SIGTERM)' if term else 'interrupted'}", file=sys.stderr)
        return 143 if term else 130
    finally:
        restore()
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())

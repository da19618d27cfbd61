"""``sentemb gpu-check``: without CUDA it says so and fails; ``--cpu`` runs the same code at a toy size
(every method through the loop, the sentence-transformers recipe, the fp32/bf16 STS comparison)."""

import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.realdata


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible: the no-GPU message cannot be tested")
def test_without_cuda_it_says_so_and_exits_nonzero():
    p = subprocess.run([sys.executable, "-m", "sentemb", "gpu-check"], capture_output=True, text=True)
    assert p.returncode == 2
    assert "no CUDA device is visible" in p.stderr


def test_the_same_checks_run_on_the_cpu(shared, tmp_path):
    import tempfile
    from pathlib import Path

    left = lambda: set(Path(tempfile.gettempdir()).glob("sentemb-gpucheck-*"))  # noqa: E731
    before = left()
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join((shared / "data" / "wiki1m_head.txt").read_text().splitlines(True)[:200]))
    out = tmp_path / "table.md"
    p = subprocess.run([sys.executable, "-m", "sentemb", "gpu-check", "--cpu", "--shared", str(shared), "--corpus",
                        str(corpus), "--batch-size", "8", "--steps", "1", "--warmup", "1", "--no-dag",
                        "--sts-tasks", "STSBenchmark", "--output", str(out), "--rows-json", str(tmp_path / "rows.json"),
                        # two of the six (the suite's time budget): no input, and SAM's second pass
                        # (ArcCSE's paper_train); every method runs the loop in the method contract, and
                        # the inputs' builders (sentemb.stats.inputs) run there too
                        "--method", "simcse", "--method", "arccse"], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert left() <= before, left() - before  # its work folder (the inputs, the epoch's run: ~260 MB) removed
    table = out.read_text()
    assert not any(line.startswith(f"| train {m} ") for m in ("una", "paser", "infocse") for line in table.splitlines())
    for m in ("simcse", "arccse"):
        row = next(line for line in table.splitlines() if line.startswith(f"| train {m} B=8 bf16"))
        share = float(row.split("= ")[1].split("%")[0])
        assert 0 < share < 1000, row  # a counted FLOP rate against the CPU's measured matmul peak
    assert "| train sentence-transformers MNRL B=8 bf16 |" in table
    assert "| CPU bf16 matrix products | fp32 GEMMs of the bf16 inputs |" in table  # --cpu-gemms' default
    plan = next(line for line in table.splitlines() if line.startswith("| plan vs measured, simcse B=8"))
    est, meas = (float(x.split()[-2]) for x in plan.split("|")[2].split("/"))
    assert est > 0 and meas > 0
    sts = next(line for line in table.splitlines() if line.startswith("| STS Avg fp32 / bf16"))
    fp32, bf16 = (float(x) for x in sts.split("|")[2].split("/"))
    assert 50 < fp32 < 100 and abs(bf16 - fp32) < 2  # MiniLM's STS-B (avg pooling) in both precisions
    # issue 26 §5: the gradient-caching row and the two-process row (gloo on the CPU here)
    chunk = next(line for line in table.splitlines() if line.startswith("| train simcse B=8 bf16 chunk_size 2 |"))
    assert "x the unchunked step" in chunk
    # a real multi-step run: one epoch of the corpus through `sentemb train`, scored before and after
    epoch = next(line for line in table.splitlines() if line.startswith("| train simcse one epoch of the corpus"))
    before, after = (float(x) for x in epoch.split("STS Avg (fp32, avg pooling) ")[1].split(";")[0].split(" -> "))
    assert 50 < before < 100 and 50 < after < 100 and "steps end to end" in epoch, epoch
    # every training step it measured, for sentemb plan-check: settings, steps timed (1 after 1 warm-up), ms/step
    from sentemb.ops.plan_check import load_measured

    header, rows = load_measured(tmp_path / "rows.json")
    assert header["corpus"] == "data/c.txt" and header["device"].startswith("cpu")
    by = {r.what: r for r in rows}
    assert set(by) == {"train simcse B=8 bf16", "train arccse B=8 bf16", "train simcse B=8 bf16 chunk_size 2"}, set(by)
    assert by["train arccse B=8 bf16"].train == {"prefetch": False, "sam_rho": 0.05, "attention": "sdpa"}  # as it ran
    assert all(r.build_ms is not None and 0 <= r.build_ms < r.ms for r in rows)  # built in line: part of the step
    assert by["train simcse B=8 bf16 chunk_size 2"].train["chunk_size"] == 2
    for r in rows:
        assert r.steps == (1, 2) and r.batch == 8 and r.model == "all-MiniLM-L6-v2"
        assert f"{r.ms:.0f} ms/step" in next(line for line in table.splitlines() if line.startswith(f"| {r.what} |"))
    dev = next(line for line in table.splitlines() if line.startswith("| train simcse B=8 devices 2"))
    diff = float(dev.split("relative difference ")[1].split()[0].rstrip("|"))
    assert diff < 1e-4, dev  # two processes, keyed dropout: the one-process weights to fp32 round-off



def test_plan_check_prices_the_steps_it_measured(shared, monkeypatch, capsys):
    """``gpu-check --plan-check``: after the table, the steps measured priced as ``sentemb plan`` prices
    a job, the model found among the config's backbones by its directory's name (the mirror's
    all-MiniLM-L6-v2 is the demo config's ``minilm``); a model that is none of them is named, not priced."""
    from pathlib import Path

    from sentemb.cli.gpucheck import _plan_check
    from sentemb.ops import plan_check

    root = Path(__file__).resolve().parents[1]
    row = plan_check.measured_record("train simcse B=8 bf16", "simcse", "all-MiniLM-L6-v2", 8, 32, 0.05, (1, 2),
                                     {"prefetch": False})
    monkeypatch.setattr(plan_check, "RECORDED", [row, {**row, "what": "elsewhere", "model": "my-own-model"}])
    out = _plan_check(str(root / "config" / "demo.yaml"), "cpu", shared / "data" / "wiki1m_head.txt")
    assert capsys.readouterr().out.strip() == "\n".join(out).strip()
    priced = [line for line in out if line.startswith("| train simcse B=8 bf16 |")]
    assert len(priced) == 1 and float(priced[0].split("|")[3]) > 0, out
    assert out[-2] == "no verdict: measured on this CPU (--cpu); the plan prices a GPU's step", out
    assert "is a CPU: priced for" in out[1] and not any("within" in x or "OFF" in x for x in out), out
    assert out[-1].startswith("not priced: row 'elsewhere': model my-own-model is not a backbone"), out


@pytest.mark.parametrize("extra, env, says", [
    (["--output", "{d}/C.md", "--rows-json", "{d}/C.json"], {}, "--rows-json and --output's JSON twin are the same file"),
    (["--output", "{d}/nodir/T.md"], {}, "--output: the folder {d}/nodir does not exist"),
    (["--rows-json", "{d}"], {}, "--rows-json: {d} is a directory"),
    (["--sts-tasks", "Bogus"], {}, "--sts-tasks: Bogus unknown"),
    (["--max-len", "512"], {}, "--max-len 512: the model"),
    (["--host-parts", "dev_eval"], {}, "--host-parts chooses among the host rows"),
    (["--only-host", "--host-parts", "tune"], {"SENTEMB_TUNE": '[{"attention": "bogus"}]'},
     "SENTEMB_TUNE[0].attention: 'bogus' is not one of"),
    (["--only-host", "--host-parts", "tune"], {"SENTEMB_TUNE": "[]"}, "SENTEMB_TUNE=[]: no row to run"),
    (["--only-host", "--host-parts", "profile"], {"SENTEMB_PROFILE": '[{"batch": 0}]'},
     "SENTEMB_PROFILE[0].batch: 0 is not a positive integer"),
    (["--only-host", "--host-parts", "profile"], {"SENTEMB_PROFILE": '[{"bogus": 1}]'},
     "SENTEMB_PROFILE[0].bogus: unknown argument of train"),
    (["--cpu-gemms", "native"], {"SENTEMB_CPU_BF16_GEMMS": "fp32"},
     "--cpu-gemms native and SENTEMB_CPU_BF16_GEMMS=fp32 disagree"),
    ([], {"SENTEMB_CPU_BF16_GEMMS": "bf16"}, "SENTEMB_CPU_BF16_GEMMS='bf16': not one of native, fp32"),
])
def test_what_would_fail_after_the_rows_is_refused_before_any(tiny_bert_dir, tiny_corpus, tiny_senteval, tmp_path,
                                                               monkeypatch, capsys, extra, env, says):
    """A probe found these failing after every training row (a traceback for a missing --output folder, a
    bad SENTEMB_PROFILE after the other rows), or clobbering the rows file: minutes of a lend each. Now
    each is refused in its own words before any row runs, and nothing is written."""
    from sentemb.cli import main

    for k in ("SENTEMB_TUNE", "SENTEMB_PROFILE", "SENTEMB_TUNE_BATCHES", "SENTEMB_CPU_BF16_GEMMS"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    d = tmp_path / "out"
    d.mkdir()
    argv = ["gpu-check", "--cpu", "--model", str(tiny_bert_dir), "--corpus", str(tiny_corpus), "--senteval",
            str(tiny_senteval), "--method", "simcse", "--no-dag", "--no-epoch", "--batch-size", "8",
            *[a.format(d=d) for a in extra]]
    assert main(argv) == 2
    assert says.format(d=d) in capsys.readouterr().err
    assert sorted(p.name for p in d.iterdir()) == []


@pytest.mark.parametrize("given, env, want", [([], None, "fp32"), (["--cpu-gemms", "native"], None, "native"),
                                              ([], "native", "native")])
def test_cpu_gemms_are_set_for_the_rows_and_put_back_after_them(tiny_bert_dir, tiny_corpus, tiny_senteval, monkeypatch,
                                                                given, env, want):
    """``--cpu-gemms`` (default fp32, or SENTEMB_CPU_BF16_GEMMS's value): the rows run with the variable set
    (their subprocesses read it) and, for fp32, a bf16 product computed in fp32; the variable is as before
    once the command ends (a test calling ``main`` leaves no fp32 GEMMs behind in its process)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    import sentemb.cli.gpucheck as G
    from sentemb.cli import main

    monkeypatch.delenv("SENTEMB_CPU_BF16_GEMMS", raising=False)
    if env:
        monkeypatch.setenv("SENTEMB_CPU_BF16_GEMMS", env)
    seen = {}

    def rows(*a, **k):
        x = torch.randn(64, 64).bfloat16()
        seen["env"] = os.environ.get("SENTEMB_CPU_BF16_GEMMS")
        seen["fp32"] = torch.equal(x @ x, (x.float() @ x.float()).bfloat16())
        seen["mode"] = _get_current_dispatch_mode()
        return []

    monkeypatch.setattr(G, "check", rows)
    assert main(["gpu-check", "--cpu", "--model", str(tiny_bert_dir), "--corpus", str(tiny_corpus), "--senteval",
                 str(tiny_senteval), "--method", "simcse", "--no-dag", "--no-epoch", *given]) == 0
    assert seen["env"] == want
    if want == "fp32":
        assert seen["fp32"] and seen["mode"] is not None  # the rows' bf16 product is the fp32 one, rounded
    else:
        assert seen["mode"] is None  # the CPU's own kernels: no mode between the rows and aten
    assert os.environ.get("SENTEMB_CPU_BF16_GEMMS") == env

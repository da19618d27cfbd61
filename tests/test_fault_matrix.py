"""The fault matrix in CI (issue 14 §2): SIGKILL of the whole Snakemake process group while a
training job has saved state and while an evaluation runs; unlock; rerun. The table must equal an
uninterrupted run's byte for byte, no partial output may be taken for finished, and MLflow must
hold exactly one FINISHED run per job and none RUNNING. The other points (fetch, stats,
paraphrase_shard, train_before_save, table) run with ``python scripts/fault_matrix.py`` (all points
by default); CI runs these two to keep the suite inside its time budget."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = [pytest.mark.integration, pytest.mark.realdata]


def test_kills_during_training_and_evaluation_recover_identically(shared, simcse_dag_inputs, tmp_path):
    # the reference and both points start from the suite's inputs of the SimCSE DAG (conftest), and run
    # side by side (the script's default)
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "fault_matrix.py"), "--shared", str(shared),
                        "--points", "train_after_save,evaluate", "--keep", str(tmp_path),
                        "--inputs", str(simcse_dag_inputs)],
                       capture_output=True, text=True, timeout=1800)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-5000:]
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.split() and line.split()[0] in ("train_after_save", "evaluate")}
    assert set(rows) == {"train_after_save", "evaluate"}, out[-3000:]
    for point, cols in rows.items():
        assert cols[1:5] == ["yes", "yes", "yes", "none"], f"{point}: {' '.join(cols)}"  # hit, recovered, identical, partial
        assert cols[-1] == "yes", out[-3000:]
    assert "2 fault points, 2 hit, 2 recovered identically" in out

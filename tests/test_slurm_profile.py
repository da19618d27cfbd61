"""The Slurm profile against the Slurm executor plugin's own CPU logic, without a cluster: the CPUs a
job asks for are its rule's threads (config ``job_resources.<kind>.cpus``), for GPU jobs too. A
walkthrough found the profile's ``cpus_per_gpu`` replacing them for every GPU job, so changing
``job_resources.train.cpus`` changed nothing on Slurm."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import yaml

from conftest import REPO

partitions = pytest.importorskip("snakemake_executor_plugin_slurm.partitions")


def _job(rule: str, threads: int, gpu: int):
    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    resources = {**profile["default-resources"], "gpu": gpu, **((profile.get("set-resources") or {}).get(rule) or {})}
    return SimpleNamespace(resources=resources, threads=threads, name=rule)


@pytest.mark.parametrize("rule, threads, gpu", [("train", 8, 1), ("train", 16, 1), ("evaluate", 4, 1),
                                                ("encode_transfer", 2, 1), ("evaluate_transfer", 4, 0),
                                                ("stats_tfidf", 8, 0)])
def test_a_job_asks_slurm_for_its_rules_threads(rule, threads, gpu):
    assert partitions.get_job_cpu_requirement(_job(rule, threads, gpu)) == (threads, "task")


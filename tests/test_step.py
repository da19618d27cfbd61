"""The step strategies (``sentemb.train.step``): which one a job's settings choose, and the settings
none serves refused naming the keys. No model, no training."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sentemb import SentembError
from sentemb.config.settings import TrainSettings
from sentemb.train.step import resolve_chunk_size, strategy_for


def _job(world: int = 1, **train) -> SimpleNamespace:
    """What ``strategy_for`` reads of a ``Job``: the run's name, its settings, the resolved chunk
    size (a number of sentences needs no batch) and the number of processes."""
    job = SimpleNamespace(run=SimpleNamespace(name="r"), settings=TrainSettings(**train), world=world)
    job.chunk = resolve_chunk_size(job, lambda *a: pytest.fail("no batch is built for a numeric chunk_size"))
    return job


@pytest.mark.parametrize("world, train, want", [
    (1, {}, "Plain()"),
    (1, {"chunk_size": 8}, "Chunked()"),
    (1, {"chunk_size": 64, "batch_size": 64}, "Plain()"),  # one chunk holds the whole batch
    (1, {"sam_rho": 0.05}, "SAM(Plain())"),
    (1, {"sam_rho": 0.05, "chunk_size": 8}, "SAM(Chunked())"),
    (2, {"devices": 2}, "Sharded()"),
    (2, {"devices": 2, "chunk_size": 8}, "Sharded()"),  # chunks of this process's share
    (2, {"devices": 2, "sam_rho": 0.05}, "SAM(Sharded())"),
])
def test_strategy_for_picks_the_strategy_of_the_settings(world, train, want):
    assert repr(strategy_for(_job(world, **train))) == want


@pytest.mark.parametrize("train, match", [
    ({"devices": 2, "log_grad_norms": True}, r"run 'r': train\.log_grad_norms .*train\.devices 2"),
    ({"devices": 2, "compile": True}, r"run 'r': train\.compile .*train\.devices 2"),
    ({"dropout_rng": "keyed", "compile": True}, r"run 'r': train\.dropout_rng keyed .*train\.compile"),
    ({"sam_rho": 0.05, "precision": "fp16"}, r"run 'r': SAM \(train\.sam_rho 0\.05\) .*train\.precision fp16"),
])
def test_strategy_for_refuses_what_no_strategy_serves_naming_the_keys(train, match):
    with pytest.raises(SentembError, match=match):
        strategy_for(_job(train.get("devices", 1), **train))
    with pytest.raises(SentembError, match=match.replace("run 'r'", "cfg")):  # the config's check says the same
        TrainSettings(**train).check("cfg")

"""SIGTERM in ``sentemb``: raised as an interruption in the main thread (``sentemb.cli.Terminated``),
the default action in forked workers and in torchrun's ranks, passed on to torchrun by the launcher of
``train.devices`` > 1. ``tests/test_plan.py`` stops a real ``sentemb plan`` so and checks its clean-up."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest


def test_main_puts_the_callers_handler_back():
    from sentemb.cli import main

    mine = lambda *a: None  # noqa: E731
    before = signal.signal(signal.SIGTERM, mine)
    try:
        assert main(["methods", "simcse"]) == 0
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_forked_child_gets_the_default_action_and_the_parent_raises(monkeypatch):
    from sentemb.cli import Terminated, _catch_sigterm

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    restore = _catch_sigterm()
    try:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report its handler and leave at once
            os.write(w, b"default" if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL else b"other")
            os._exit(0)
        os.waitpid(pid, 0)
        assert os.read(r, 16) == b"default"
        with pytest.raises(Terminated):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs as soon as the main thread takes the signal
    finally:
        restore()


def test_a_rank_under_torchrun_keeps_the_default_action(monkeypatch):
    from sentemb.cli import _catch_sigterm

    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    before = signal.getsignal(signal.SIGTERM)
    _catch_sigterm()()
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_launcher_passes_an_interruption_on_to_torchrun_and_waits_for_it(monkeypatch):
    from sentemb.train import distributed

    seen = []

    class FakeTorchrun:
        def __init__(self, cmd, env):
            self.waits = 0

        def wait(self, timeout=None):
            self.waits += 1
            if self.waits == 1:
                raise KeyboardInterrupt("signal 15")
            seen.append(("waited", timeout))
            return -15

        def send_signal(self, sig):
            seen.append(("signal", sig))

        def kill(self):
            seen.append(("kill",))

    monkeypatch.setattr(subprocess, "Popen", FakeTorchrun)
    with pytest.raises(KeyboardInterrupt):
        distributed.launch(2, ["train", "--run-config", "x.json", "--output-dir", "out"])
    assert seen == [("signal", signal.SIGTERM), ("waited", 60)]

"""Run by tests under ``torchrun`` directly (not through ``sentemb train``): train the run config
``RUN`` (its ``train.devices`` = the number of processes) into ``OUT``; with ``--kill-after K``
first stopped after K optimizer steps (the loop's kill hook: the state on disk is all that
survives) and then resumed by a fresh ``train`` call."""

import argparse
import json

from sentemb.train import distributed
from sentemb.train.loop import train

p = argparse.ArgumentParser()
p.add_argument("run")
p.add_argument("out")
p.add_argument("--kill-after", type=int, default=None)
a = p.parse_args()
run = json.loads(open(a.run, encoding="utf-8").read())
if a.kill_after:
    try:
        train(run, a.out, stop_after=a.kill_after, progress=False)
        raise SystemExit("the kill hook did not stop training")
    except KeyboardInterrupt:
        pass
train(run, a.out, progress=False)
distributed.shutdown()

"""A Lightning callback for tests of launchers that run sweep jobs at once: each job, when its training
starts, waits until `parties` jobs have reached that point. Jobs run one after another never meet, and the
first one fails after `timeout_s`; jobs run at once pass, whatever the machine's load (timestamps of two
short runs can miss each other on a busy machine)."""
from __future__ import annotations

import os
import time
from pathlib import Path

from lightning.pytorch import Callback


class Rendezvous(Callback):
    def __init__(self, folder: str, parties: int = 2, timeout_s: float = 300.0):
        self.folder, self.parties, self.timeout_s = Path(folder), parties, timeout_s

    def on_train_start(self, trainer, pl_module) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / str(os.getpid())).touch()
        deadline = time.monotonic() + self.timeout_s
        while len(list(self.folder.iterdir())) < self.parties:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no other job started training within {self.timeout_s:g} s of this one")
            time.sleep(0.1)

"""Launched by ``torchrun`` in the tests: data-parallel pretraining through the API, then the
names of this process's threads that belong to the process group's backend (gloo), counted at
each epoch's end and after ``pretrain`` has returned, written to ``OUT/threads_<rank>.json``.
The garbage collector is off meanwhile: what ``pretrain`` released must be freed by reference
counting alone (an object in a reference cycle that holds the group would wait for a collection).

Usage: torchrun --nproc-per-node 2 tests/torchrun_threads.py OUT
"""

from __future__ import annotations

import gc
import glob
import json
import os
import sys

from contrastkit.train import PretrainConfig, pretrain


def backend_threads() -> list:
    names = []
    for path in glob.glob("/proc/self/task/*/comm"):
        try:
            with open(path, encoding="utf-8") as handle:
                names.append(handle.read().strip())
        except OSError:  # a thread that ended while we looked
            pass
    return sorted(name for name in names if "gloo" in name)


def main(out: str) -> None:
    during = []
    config = PretrainConfig(data="glyphlab", data_options={"train_scenes": 16, "val_scenes": 9, "test_scenes": 12,
                                                           "size": 28},
                            method="simclr", epochs=1, batch_size=8, device="cpu", log_every=1,
                            out=os.path.join(out, "run"))
    gc.collect()
    gc.disable()
    try:
        pretrain(config, progress=False, on_epoch_end=lambda epoch, record: during.append(backend_threads()))
        after = backend_threads()
    finally:
        gc.enable()
    with open(os.path.join(out, f"threads_{os.environ['RANK']}.json"), "w", encoding="utf-8") as handle:
        json.dump({"during": during, "after": after}, handle)


if __name__ == "__main__":
    main(sys.argv[1])

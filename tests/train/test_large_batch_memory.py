"""A large-batch step fits in memory that grows linearly with the batch: a 4,096-pair SimCLR
step (``--micro-batch 64``, logged, the last batch kept) and its read-out run in a child whose
data segment may grow by 256 MiB only (``_bounded.py``). An O(N^2) part of the step does not
fit there: the 8,192 x 8,192 similarity matrix of the batch's two views is 512 MiB in float64,
which the batch diagnostics formed on every logged step (the 16,384-pair step of the CIFAR-10
report then asked for more than 24 GB). ``benchmarks/results/large_batch_step.md`` has the
figures at 4,096 to 65,536 pairs."""

import json
import os

import pytest

from _bounded import CEILING, worker  # noqa: F401 (a fixture)

PAIRS = 4096


def test_a_4096_pair_step_and_its_read_out_fit_in_256_mib_above_the_start(worker, tmp_path):
    out = tmp_path / "run"
    config = dict(data="glyphlab", data_options={"train_scenes": PAIRS, "val_scenes": 60, "test_scenes": 120,
                                                 "size": 28},
                  epochs=1, batch_size=PAIRS, micro_batch=64, log_every=1, out=str(out), device="cpu", threads=1)
    assert (2 * PAIRS) ** 2 * 8 >= 2 * CEILING  # the batch's matrix alone is twice the room
    answer = worker.call("pretrain", config, timeout=600)
    assert answer.get("returned") == 1, answer.get("traceback", answer)
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "step"]
    assert len(steps) == 1 and steps[0]["negatives"] == 2 * PAIRS - 2  # every anchor against the whole batch
    assert 0 < steps[0]["positive_probability"] <= 1 and steps[0]["effective_negatives"] >= 1
    assert os.path.isfile(out / "last_batch.pt") and os.path.isfile(out / "summary.json")

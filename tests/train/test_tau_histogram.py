"""The per-epoch distribution of a temperature method's per-anchor temperatures: the counting
(against a loop), the trainer's ``tau_histogram`` records, and the run report's figure."""

from __future__ import annotations

import json
import math

import pytest
import torch

from _tiny_run import tiny_config
from contrastkit.metrics.temperatures import TAU_EDGES, TemperatureHistogram
from contrastkit.report.run_page import run_page
from contrastkit.train import pretrain


def test_counts_fall_in_the_log_spaced_bins():
    # No value on an edge (where the bin is a matter of the last bit of log10).
    taus = torch.tensor([0.005, 0.0102, 0.0101, 0.0999, 0.31, 0.1001, 0.5, 9.99, 2.0, 50.0], dtype=torch.float64)
    h = TemperatureHistogram()
    h.add(taus[:4])
    h.add(taus[4:])
    record = h.record(epoch=3, step=12)
    expected = [0] * (len(TAU_EDGES) - 1)
    for tau in taus.tolist():  # below the first edge: the first bin; above the last: the last
        expected[sum(1 for edge in TAU_EDGES[1:-1] if tau > edge)] += 1
    assert record["counts"] == expected
    assert (record["epoch"], record["step"], record["anchors"]) == (3, 12, 10)
    assert record["mean"] == pytest.approx(sum(taus.tolist()) / 10) and record["min"] == 0.005 and record["max"] == 50.0
    assert record["counts"][0] == 3 and record["counts"][-1] == 2  # 0.005, 0.0101, 0.0102; 9.99 and 50
    assert TAU_EDGES[0] == pytest.approx(0.01) and TAU_EDGES[-1] == pytest.approx(10.0)
    assert h.record(epoch=4)["anchors"] == 0  # a fresh histogram after each record


def test_ranks_merge_by_sum_min_and_max():
    a, b = TemperatureHistogram(), TemperatureHistogram()
    a.add(torch.tensor([0.1, 0.2]))
    b.add(torch.tensor([0.05, 0.4, 0.4]))
    # The other rank's tensors, in the order merged() combines them.
    theirs = [b.counts, b.stats[0], b.stats[1], b.stats[2], b.stats[3]]
    ops = []

    def reduce(value, op):
        ops.append(op)
        other = theirs.pop(0)
        return {"sum": value + other, "min": torch.minimum(value, other), "max": torch.maximum(value, other)}[op]

    a.merged(reduce)
    assert ops == ["sum", "sum", "sum", "min", "max"]
    record = a.record(epoch=1)
    assert record["anchors"] == 5 and sum(record["counts"]) == 5
    assert record["mean"] == pytest.approx(1.15 / 5) and record["min"] == pytest.approx(0.05)
    assert record["max"] == pytest.approx(0.4)


def test_a_run_records_one_histogram_per_epoch_and_the_report_draws_it(tmp_path):
    out = tmp_path / "run"
    pretrain(tiny_config(out, temperature_method="individual", epochs=2), progress=False, baselines=False)
    with open(out / "metrics.jsonl", encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle]
    histograms = [r for r in records if r["kind"] == "tau_histogram"]
    assert [r["epoch"] for r in histograms] == [1, 2]
    for r in histograms:  # 2 steps of 8 pairs, 2 anchors each
        assert r["anchors"] == 32 and sum(r["counts"]) == 32
        assert r["min"] <= r["mean"] <= r["max"] and math.isfinite(r["mean"])
    assert histograms[0]["mean"] == pytest.approx(0.1)  # the first epoch sees every scene at its initial tau
    assert "per-anchor temperatures over epochs" in run_page(out, pictures=False).render()


def test_a_fixed_tau_records_no_histogram(tmp_path):
    out = tmp_path / "run"
    pretrain(tiny_config(out, epochs=1), progress=False, baselines=False)
    with open(out / "metrics.jsonl", encoding="utf-8") as handle:
        assert not any(json.loads(line)["kind"] == "tau_histogram" for line in handle)

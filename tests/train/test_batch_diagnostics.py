"""The batch diagnostics of every logged step (contrastkit.metrics.batch, the tap in the methods'
loss, the trainer's record) and the warnings they give: each provoked by a real run."""

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from _tiny_run import tiny_config
from contrastkit.analysis import explain
from contrastkit.methods import ContrastiveModel, get_method
from contrastkit.methods.tap import BatchTap, observe_batch
from contrastkit.metrics.batch import (DIAGNOSTICS, BatchProblem, batch_diagnostics, batch_warnings,
                                       diagnostics_record)
from contrastkit.train import pretrain
from contrastkit.train.last_batch import read_last_batch

from _host_reads import counted_reads




def _records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _expected(problem, tau, anchors=None):
    """The diagnostics recomputed from explain (float64), independently of batch_diagnostics:
    over every anchor, or over the rows ``anchors`` only."""
    s = problem.matrix().double().cpu()
    e = explain(s, temperature=tau, positive=problem.positive.tolist(), exclude_diagonal=problem.exclude_diagonal)
    rows = np.arange(s.shape[0]) if anchors is None else np.asarray(anchors)
    negative = e.in_denominator.copy()[rows]
    negative[np.arange(len(rows)), e.positive[rows]] = False
    values = s.numpy()[rows]
    p = e.positive_probability[rows]
    return {"positive_probability": p.mean(), "min_positive_probability": p.min(),
            "effective_negatives": e.effective_negatives[rows].mean(),
            "positive_similarity": values[np.arange(len(rows)), e.positive[rows]].mean(),
            "hardest_negative_similarity": np.where(negative, values, -np.inf).max(axis=1).mean(),
            "negative_similarity": (np.where(negative, values, 0).sum(axis=1) / negative.sum(axis=1)).mean()}


def _embeddings(method, n=6, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)


@pytest.mark.parametrize("tau", [0.05, 0.2, 1.0])
def test_two_view_diagnostics_are_explains_numbers(tau):
    z_a, z_b = _embeddings("simclr")
    problem = get_method("simclr").batch_problem(None, (z_a, z_b))
    # SimCLR's 2B x 2B matrix of the normalised views, positives i <-> i + B, self excluded.
    z = torch.nn.functional.normalize(torch.cat([z_a, z_b]).double(), dim=1)
    assert problem.similarities is None  # computed a block of anchors at a time, never held whole
    assert torch.allclose(problem.matrix(), z @ z.T, atol=1e-15)
    assert problem.positive.tolist() == [6, 7, 8, 9, 10, 11, 0, 1, 2, 3, 4, 5] and problem.exclude_diagonal
    assert problem.negatives == 10
    values = dict(zip(DIAGNOSTICS, batch_diagnostics(problem, tau).tolist()))
    for key, expected in _expected(problem, tau).items():
        assert values[key] == pytest.approx(expected, rel=1e-12, abs=1e-14), key


def test_moco_and_convirt_problems():
    model = ContrastiveModel("moco", "small", 1, temperature=0.2, queue_size=8)
    query, keys = _embeddings("moco", n=4, d=64)
    problem = get_method("moco").batch_problem(model, (query, keys))
    assert problem.shape == (4, 9) and problem.positive.tolist() == [0] * 4
    q = torch.nn.functional.normalize(query.double(), dim=1)
    k = torch.nn.functional.normalize(keys.double(), dim=1)
    queue = torch.nn.functional.normalize(model.queue.negatives(oldest_first=False).double(), dim=1)
    assert torch.allclose(problem.matrix()[:, 0], (q * k).sum(1), atol=1e-12)
    assert torch.allclose(problem.matrix()[:, 1:], q @ queue.T, atol=1e-12)
    assert problem.item_of(2, 0) == 2 and problem.item_of(2, 3) == -1  # own key; a queued key
    values = dict(zip(DIAGNOSTICS, batch_diagnostics(problem, 0.2).tolist()))
    for key, expected in _expected(problem, 0.2).items():
        assert values[key] == pytest.approx(expected, rel=1e-12, abs=1e-14), key
    v, u = _embeddings("convirt", n=5, d=7)
    problem = get_method("convirt").batch_problem(None, (v, u))
    assert problem.positive.tolist() == list(range(5)) and not problem.exclude_diagonal and problem.negatives == 4
    values = dict(zip(DIAGNOSTICS, batch_diagnostics(problem, 0.1).tolist()))
    for key, expected in _expected(problem, 0.1).items():
        assert values[key] == pytest.approx(expected, rel=1e-12, abs=1e-14), key


@pytest.mark.parametrize("method", ["simclr", "moco", "convirt"])
def test_a_large_batch_is_read_a_block_of_anchors_at_a_time_and_sampled_beyond_the_bound(method, monkeypatch):
    """A large batch's matrix is never formed: the diagnostics read blocks of anchors (each
    against every candidate), and beyond MAX_DIAGNOSTIC_ANCHORS a sample spread over the batch,
    whose numbers are explain's over the same anchors."""
    import contrastkit.metrics.batch as batch_module

    monkeypatch.setattr(batch_module, "_BLOCK_ENTRIES", 40)  # blocks of a few anchors
    model = ContrastiveModel("moco", "small", 1, temperature=0.2, queue_size=8) if method == "moco" else None
    first, second = _embeddings(method, n=13, d=64 if method == "moco" else 5, seed=3)
    problem = get_method(method).batch_problem(model, (first, second))
    asked = []
    rows_of = problem.rows_of
    problem.rows_of = lambda index: asked.append(index.tolist()) or rows_of(index)
    m, k = problem.shape
    for bound in (m, 7):
        asked.clear()
        anchors = batch_module.diagnostic_anchors(m, bound)
        values = dict(zip(DIAGNOSTICS, batch_diagnostics(problem, 0.2, max_anchors=bound).tolist()))
        assert [row for block in asked for row in block] == anchors.tolist()
        assert max(len(block) for block in asked) * k <= max(40, k)  # one block: at most 40 similarities
        expected = _expected(problem, 0.2, anchors.tolist())
        for key in DIAGNOSTICS:
            assert values[key] == pytest.approx(expected[key], rel=1e-12, abs=1e-14), (bound, key)
    sample = batch_module.diagnostic_anchors(m, 7).tolist()
    assert len(sample) == 7 and sample[0] == 0 and sample[-1] == m - 1 and sample == sorted(set(sample))


def test_the_tap_reads_no_value_and_keeps_nothing_unarmed():
    """The step's work for the diagnostics stays on the device: no tensor value is read (the
    trainer reads them once, with the loss, at its logging step); an unarmed tap computes nothing."""
    method = get_method("simclr")
    model = ContrastiveModel("simclr", "small", 1, temperature=0.2)
    tap = BatchTap()
    embeddings = _embeddings("simclr")
    with counted_reads() as reads:
        observe_batch(method, model, embeddings, tap)
    assert reads == [] and tap.problem is None and tap.values is None
    tap.arm()
    with counted_reads() as reads:
        observe_batch(method, model, embeddings, tap)
    assert reads == [], reads
    problem, values = tap.take()
    assert isinstance(problem, BatchProblem) and values.shape == (len(DIAGNOSTICS),)
    assert not tap.armed and tap.take() == (None, None)


def test_every_logged_step_carries_its_batch_diagnostics(tmp_path):
    out = tmp_path / "run"
    pretrain(tiny_config(out, epochs=2, log_every=1), progress=False, baselines=False)
    steps = [r for r in _records(out) if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    for record in steps:
        assert set(DIAGNOSTICS) | {"negatives"} <= set(record)
        assert record["negatives"] == 2 * 8 - 2 and 0 < record["positive_probability"] <= 1
        assert 1 <= record["effective_negatives"] <= record["negatives"]
        assert record["min_positive_probability"] <= record["positive_probability"]
        assert record["hardest_negative_similarity"] >= record["negative_similarity"]
        assert "warnings" not in record
    # The last step's numbers are those of the batch it kept (float32 similarities: 1e-6).
    batch = read_last_batch(str(out))
    assert batch.step == steps[-1]["step"] == 4 and batch.temperature == pytest.approx(0.2)
    problem = BatchProblem(batch.similarities, batch.positive, batch.exclude_diagonal, None, None, None, None)
    assert batch.similarities.shape == (16, 16)
    for key, expected in _expected(problem, batch.temperature).items():
        assert steps[-1][key] == pytest.approx(expected, abs=1e-6), key


def test_log_every_logs_only_its_steps_and_the_epoch_ends(tmp_path):
    out = tmp_path / "run"
    pretrain(tiny_config(out, epochs=1, log_every=5, data_options={**tiny_config(out).data_options,
                                                                   "train_scenes": 56}), progress=False,
             baselines=False)
    steps = [r for r in _records(out) if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [5, 7] and all("positive_probability" in r for r in steps)


# ------------------------------------------------------------------------------ the warnings

def test_warning_rules():
    record = {"negative_similarity": 0.95, "positive_similarity": 0.99, "effective_negatives": 13.9, "negatives": 14,
              "min_positive_probability": 0.5, "tau": 0.2}
    before = [{"negative_similarity": 0.91}, {"negative_similarity": 0.93}]
    assert [w["kind"] for w in batch_warnings(record, previous=before)] == ["collapse"]
    assert "effective negatives 13.9 of 14" in batch_warnings(record, previous=before)[0]["message"]
    assert batch_warnings({**record, "negative_similarity": 0.5}, previous=before) == []
    # Three logged steps in a row, not falling: not at the first two steps of a run, nor while
    # the similarities fall (a network leaving its initial state), nor after a low one.
    assert batch_warnings(record) == [] and batch_warnings(record, previous=before[1:]) == []
    assert batch_warnings(record, previous=[{"negative_similarity": 0.97}, {"negative_similarity": 0.96}]) == []
    assert batch_warnings(record, previous=[{"negative_similarity": 0.5}, {"negative_similarity": 0.96}]) == []
    rising = [{"negative_similarity": 0.955}, {"negative_similarity": 0.97}]
    assert [w["kind"] for w in batch_warnings(record, previous=rising)] == ["collapse"]
    assert [w["kind"] for w in batch_warnings({"tau": 0.0101}, learnable=True, tau_bound=0.01)] == ["tau_at_bound"]
    assert batch_warnings({"tau": 0.0101}, learnable=False, tau_bound=0.01) == []  # a fixed tau is chosen
    assert batch_warnings({"tau": 0.02}, learnable=True, tau_bound=0.01) == []
    assert [w["kind"] for w in batch_warnings({"min_positive_probability": 0.9995})] == ["positives_certain"]
    assert batch_warnings({}) == [] and diagnostics_record([0.5] * 6, 14)["negatives"] == 14


class Constant(nn.Module):
    """An encoder that all but ignores its input: every image gets nearly the same features."""

    out_dim = 16

    def __init__(self) -> None:
        super().__init__()
        self.centre = nn.Parameter(torch.linspace(-1, 1, 16))

    def forward(self, x):
        return self.centre.expand(x.shape[0], 16) + 1e-4 * x.flatten(1)[:, :16]


def _warned(out, capsys, kind, message):
    records = [r for r in _records(out) if r["kind"] == "step"]
    flagged = [r["step"] for r in records if kind in r.get("warnings", [])]
    err = capsys.readouterr().err
    printed = [line for line in err.splitlines() if line.startswith("warning: step ") and message in line]
    return flagged, printed, records


def test_a_collapsing_embedding_is_warned_about(tmp_path, capsys):
    out = tmp_path / "run"
    pretrain(tiny_config(out, epochs=3, norm="group"), encoder=Constant(), progress=False, baselines=False)
    flagged, printed, records = _warned(out, capsys, "collapse", "the embedding is collapsing")
    assert flagged == [r["step"] for r in records][2:]  # every logged step from the third
    assert len(printed) == 1 and printed[0].startswith(f"warning: step {flagged[0]}: ")  # printed once
    assert records[0]["negative_similarity"] > 0.99


def test_a_network_leaving_its_initial_state_is_not_a_collapse(tmp_path, capsys):
    """With GroupNorm / LayerNorm a network starts with every similarity near 1 and leaves it in a
    few steps: no warning."""
    out = tmp_path / "run"
    pretrain(tiny_config(out, epochs=3, norm="group"), progress=False, baselines=False)
    records = [r for r in _records(out) if r["kind"] == "step"]
    assert records[0]["negative_similarity"] > 0.9 and records[-1]["negative_similarity"] < 0.9
    assert not any("warnings" in r for r in records) and "warning:" not in capsys.readouterr().err


def test_a_learnable_tau_pinned_at_its_bound_is_warned_about(tmp_path, capsys):
    out = tmp_path / "run"
    pretrain(tiny_config(out, temperature=0.01, learnable_temperature=True), progress=False, baselines=False)
    flagged, printed, records = _warned(out, capsys, "tau_at_bound", "pinned at its bound")
    assert flagged and len(printed) == 1 and records[0]["tau"] <= 0.0101


def test_positives_certain_for_every_anchor_is_warned_about(tmp_path, capsys):
    """Identical views (no augmentation) at the smallest tau: the positive is the anchor's copy,
    so every anchor picks it with p+ ~ 1 and there is nothing left to learn."""
    out = tmp_path / "run"
    pretrain(tiny_config(out, epochs=2, view_strength=0.0, temperature=0.01), progress=False, baselines=False)
    flagged, printed, records = _warned(out, capsys, "positives_certain", "p+ is 1 for every anchor")
    assert flagged and len(printed) == 1
    assert all(r["min_positive_probability"] >= 0.999 for r in records if r["step"] in flagged)
    assert math.isclose(records[-1]["positive_similarity"], 1.0, abs_tol=1e-6)

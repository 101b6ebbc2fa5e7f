"""Per-anchor temperatures across two ranks (gloo, CPU, float64): every loss, in both
distributed modes, dense and tiled (ring in ``"local"`` mode), equals one process on the
concatenated batch to 1e-10 -- values, per-anchor losses and the averaged parameter gradients,
the temperature head's included (its temperatures are each rank's own anchors')."""

from __future__ import annotations

import warnings

import pytest
import torch

import distributed_temperature_workers as T
import distributed_workers as W

TOL = dict(rtol=1e-10, atol=1e-10)
SEED = 11
SIZES = (3, 5)  # uneven: the gathered temperatures must follow the rows of each rank
CASES = [(name, mode) for name in T.LOSSES for mode in W.MODES if (name, mode) not in T.SKIP]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return W.spawn(T.suite_worker, 2, tmp_path_factory.mktemp("per_anchor"), SEED, SIZES, ("mean", "sum", "none"))


def reference(name: str, reduction: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return T.loss_and_grads(T.AnchorTemperatures(), T.dense_name(name),
                                W.concatenated(W.batches(SEED, SIZES)), reduction)


def own(name: str, per_anchor: torch.Tensor, rank: int) -> torch.Tensor:
    start, stop, total = sum(SIZES[:rank]), sum(SIZES[:rank + 1]), sum(SIZES)
    name = T.dense_name(name)
    if name in ("nt_xent_views", "dcl", "hard_negative", "hcl"):
        return torch.cat([per_anchor[start:stop], per_anchor[total + start:total + stop]])
    if name.startswith("supcon"):
        return per_anchor[2 * start:2 * stop]
    return per_anchor[start:stop]


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("name, mode", CASES)
def test_value_and_gradients_equal_one_process(two_ranks, name, mode, reduction):
    ref_value, ref_grads = reference(name, reduction)
    values = torch.stack([r[(name, mode, reduction)][0] for r in two_ranks])
    if mode == "global" and not name.startswith("sigmoid"):
        for value in values:
            torch.testing.assert_close(value, ref_value, **TOL)
    else:  # each rank's share: their mean is the global loss
        torch.testing.assert_close(values.mean(), ref_value, **TOL)
    assert {"head.weight", "head.bias"} <= set(ref_grads)
    for r in two_ranks:
        grads = r[(name, mode, reduction)][1]
        assert set(grads) == set(ref_grads)
        for key, ref_grad in ref_grads.items():
            assert float(ref_grad.abs().max()) > 1e-6, "a vanishing reference gradient would test nothing"
            torch.testing.assert_close(grads[key], ref_grad, **TOL, msg=lambda m: f"{key}: {m}")


@pytest.mark.parametrize("name, mode", CASES)
def test_per_anchor_losses(two_ranks, name, mode):
    ref_losses, _ = reference(name, "none")
    for rank, r in enumerate(two_ranks):
        got = r[(name, mode, "none")][0]
        expected = ref_losses if mode == "global" and not name.startswith("sigmoid") else own(name, ref_losses, rank)
        torch.testing.assert_close(got, expected, **TOL)


# ---------------------------------------------------------------- the temperature methods


@pytest.fixture(scope="module")
def adaptive_ranks(tmp_path_factory):
    return W.spawn(T.adaptive_worker, 2, tmp_path_factory.mktemp("adaptive"), SEED, SIZES, ("mean", "sum", "none"))


@pytest.mark.parametrize("chunk", [None, T.TILE], ids=["dense", "tiled"])
@pytest.mark.parametrize("mode", W.MODES)
@pytest.mark.parametrize("name", sorted(T.ADAPTIVE))
def test_macl_and_dual_equal_one_process(adaptive_ranks, name, mode, chunk):
    data = W.concatenated(W.batches(SEED, SIZES))
    for reduction in ("mean", "sum"):
        ref_value, ref_grads = T.adaptive_losses(W.Encoder(), name, data, reduction)
        values = torch.stack([r[(name, mode, chunk, reduction)][0] for r in adaptive_ranks])
        if mode == "global":
            for value in values:
                torch.testing.assert_close(value, ref_value, **TOL)
        else:
            torch.testing.assert_close(values.mean(), ref_value, **TOL)
        for r in adaptive_ranks:
            grads = r[(name, mode, chunk, reduction)][1]
            for key, ref_grad in ref_grads.items():
                torch.testing.assert_close(grads[key], ref_grad, **TOL, msg=lambda m: f"{key}: {m}")
    ref_losses, _ = T.adaptive_losses(W.Encoder(), name, data, "none")
    for rank, r in enumerate(adaptive_ranks):
        got = r[(name, mode, chunk, "none")][0]
        expected = ref_losses if mode == "global" else own("nt_xent_views", ref_losses, rank)
        torch.testing.assert_close(got, expected, **TOL)


@pytest.mark.parametrize("kind", ["individual", "network"])
def test_per_sample_state_is_sharded_and_synchronised(adaptive_ranks, kind):
    """Three training steps over two ranks (each its share of every batch's samples) leave every
    rank with the state and the encoder of one process that saw the whole batches."""
    expected = T.stateful_training(kind, SEED, SIZES)
    assert bool(torch.isfinite(expected["state.log_u"]).any())
    for r in adaptive_ranks:
        got = r[kind]
        assert set(got) == set(expected)
        for key, value in expected.items():
            torch.testing.assert_close(got[key], value.to(got[key].dtype), rtol=1e-9, atol=1e-12,
                                       msg=lambda m: f"{kind} {key}: {m}")
    if kind == "individual":
        assert bool((expected["state.tau"] != 0.2).any()), "no temperature moved: the test would test nothing"


def test_data_parallel_training_keeps_every_ranks_per_sample_state(tmp_path):
    """Two ranks pretrain with iSogCLR's individual temperatures: rank 0's checkpoint holds the
    estimates of every training sample (each rank saw half of them), and a run stopped after
    its first epoch and resumed ends with the uninterrupted run's state and weights."""
    options = dict(data="glyphlab", data_options={"train_scenes": 16, "val_scenes": 9, "test_scenes": 12, "size": 28},
                   method="simclr", temperature_method="individual", epochs=2, batch_size=8, device="cpu",
                   log_every=1)
    straight, interrupted = str(tmp_path / "straight"), str(tmp_path / "interrupted")
    results = W.spawn(T.pretrain_worker, 2, tmp_path, options, straight, interrupted)
    assert results[0]["straight"]["epochs"] == 2 and all(r["stopped"] for r in results)
    load = lambda out: torch.load(f"{out}/checkpoints/last.pt", map_location="cpu", weights_only=False)["model"]
    a, b = load(straight), load(interrupted)
    assert bool(torch.isfinite(a["temperature_method.log_u"]).all()), "samples of rank 1 missing from the state"
    assert bool((a["temperature_method.tau"] != 0.1).all())
    for key, value in a.items():
        assert torch.equal(value, b[key]), key

"""Global negatives on torch.distributed: multi-process (gloo, CPU) equality with the
single-process loss on the concatenated batch, in float64 to 1e-10.

Spawning is slow, so each module-scoped fixture spawns once and runs many checks; the tests
below only compare what the workers measured with references computed here.
"""

from __future__ import annotations

import pytest
import torch

import distributed_temperature_workers as T
import distributed_workers as W
from contrastkit import distributed as cd
from contrastkit import losses as L
from loss_catalog import cases

TOL = dict(rtol=1e-10, atol=1e-10)
SEED = 7
EQUAL = (4, 4)          # two ranks, equal batches
UNEVEN = (2, 3, 4)      # three ranks, uneven batches
REDUCTIONS = ("mean", "sum", "none")


def reference(name: str, sizes, reduction: str):
    """Single-process loss and parameter gradients on the concatenated batch (always dense)."""
    dense = W.TILED.get(name, name)
    return W.loss_and_grads(W.Encoder(), dense, W.concatenated(W.batches(SEED, sizes)), reduction)


CASES = [(name, mode) for name in W.LOSSES for mode in W.MODES if (name, mode) not in W.SKIP]
#: The catalogued losses with a distributed path that W.LOSSES does not run, and where each is
#: run on several processes against one process on the concatenated batch.
ELSEWHERE = {
    **dict.fromkeys(("simple_loss", "hard_negative_nt_xent", "hard_negative_nt_xent[quantile]", "debiased_nt_xent",
                     "hcl"), "tests/losses/test_tiled_variants.py (dense, tiled and ring)"),
    "sigmoid_loss": "tests/losses/test_losses_sigmoid.py (distributed_sigmoid_workers)",
    **dict.fromkeys(T.ADAPTIVE, "tests/distributed/test_distributed_per_anchor_temperature.py (ADAPTIVE)"),
    "robust_nt_xent": "tests/distributed/test_distributed_per_anchor_temperature.py (IndividualTemperatureLoss's "
                      "and TemperatureNetworkLoss's per-sample state)",
}


def test_every_catalogued_distributed_loss_runs_on_several_processes():
    """A loss catalogued with distributed=True must be run here (W.LOSSES) or be named in ELSEWHERE."""
    here = set(W.CASE_OF.values())
    assert here | set(ELSEWHERE) == set(cases(distributed=True)) and not here & set(ELSEWHERE)


def own_anchor_losses(name: str, per_anchor: torch.Tensor, sizes, rank: int) -> torch.Tensor:
    """The entries of the global ``reduction="none"`` losses that belong to ``rank``'s anchors."""
    start, stop, total = sum(sizes[:rank]), sum(sizes[:rank + 1]), sum(sizes)
    name = W.TILED.get(name, name)
    if name in ("nt_xent_views", "dcl"):
        return torch.cat([per_anchor[start:stop], per_anchor[total + start:total + stop]])
    if name in ("supcon_views", "supcon_in_views"):
        return per_anchor[2 * start:2 * stop]
    return per_anchor[start:stop]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """One spawned 2-process run: every loss (equal batches), error handling, DDP training,
    the MoCo key queue."""
    return EQUAL, W.spawn(W.suite_worker, 2, tmp_path_factory.mktemp("two"), SEED, EQUAL, REDUCTIONS,
                          ("errors", "ddp", "queue"))


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory):
    """One spawned 3-process run: every loss (uneven batches), a sub-group of two ranks, the
    MoCo key queue."""
    return UNEVEN, W.spawn(W.suite_worker, 3, tmp_path_factory.mktemp("three"), SEED, UNEVEN, REDUCTIONS,
                           ("subgroup", "queue"))


@pytest.fixture(params=["two_ranks", "three_ranks"], ids=["2-ranks-equal", "3-ranks-uneven"])
def loss_run(request):
    sizes, results = request.getfixturevalue(request.param)
    return sizes, [r["losses"] for r in results]


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("name, mode", CASES)
def test_value_and_averaged_gradients_match_single_process(loss_run, name, mode, reduction):
    sizes, results = loss_run
    ref_value, ref_grads = reference(name, sizes, reduction)
    values = torch.stack([r[(name, mode, reduction)][0] for r in results])
    if mode == "global":  # every rank returns the global loss itself
        for value in values:
            torch.testing.assert_close(value, ref_value, **TOL)
    else:  # the mean over ranks is the global loss (what DDP's averaging assumes)
        torch.testing.assert_close(values.mean(), ref_value, **TOL)
    for r in results:
        grads = r[(name, mode, reduction)][1]
        assert set(grads) == set(ref_grads)
        for key, ref_grad in ref_grads.items():
            assert float(ref_grad.abs().max()) > 1e-6, "a vanishing reference gradient would test nothing"
            torch.testing.assert_close(grads[key], ref_grad, **TOL, msg=lambda m: f"{key}: {m}")


@pytest.mark.parametrize("name, mode", CASES)
def test_per_anchor_losses(loss_run, name, mode):
    sizes, results = loss_run
    ref_losses, _ = reference(name, sizes, "none")
    for rank, r in enumerate(results):
        got = r[(name, mode, "none")][0]
        expected = ref_losses if mode == "global" else own_anchor_losses(name, ref_losses, sizes, rank)
        torch.testing.assert_close(got, expected, **TOL)


def test_local_mode_mean_with_equal_batches_is_the_mean_over_own_anchors(two_ranks):
    sizes, results = two_ranks[0], [r["losses"] for r in two_ranks[1]]
    ref_losses, _ = reference("nt_xent_views", sizes, "none")
    for rank, r in enumerate(results):
        expected = own_anchor_losses("nt_xent_views", ref_losses, sizes, rank).mean()
        torch.testing.assert_close(r[("nt_xent_views", "local", "mean")][0], expected, **TOL)


def test_process_group_argument(three_ranks):
    sizes = W.SUBGROUP_SIZES
    results = [r["subgroup"] for r in three_ranks[1]]
    ref_value, ref_grads = reference("nt_xent_views", sizes[:2], "mean")
    assert results[2] == {}
    for mode in W.MODES:
        values = torch.stack([results[r][mode][0] for r in (0, 1)])
        torch.testing.assert_close(values.mean(), ref_value, **TOL)
        for r in (0, 1):
            for key, ref_grad in ref_grads.items():
                torch.testing.assert_close(results[r][mode][1][key], ref_grad, **TOL)


def test_errors_are_raised_on_every_rank(two_ranks):
    results = [r["errors"] for r in two_ranks[1]]
    for rank, r in enumerate(results):
        for case, message in r.items():
            assert message is not None and not message.startswith("UNEXPECTED"), (rank, case, message)
        assert "NaN" in r["nan_on_rank_1"] and "z_a" in r["nan_on_rank_1"]
        if rank == 0:
            assert "rank 1" in r["nan_on_rank_1"]
        assert "width" in r["width_differs"] and "rank" in r["width_differs"]
        assert "dtype" in r["dtype_differs"]
        assert "negatives" in r["bank_with_distributed"]
        assert "distributed_mode" in r["bad_mode"]
        assert "no anchor has a positive" in r["no_positive_anywhere"]
        assert "chunk_size" in r["supcon_tiled_local"] and "local" in r["supcon_tiled_local"]


def test_three_sgd_steps_under_ddp_equal_single_process_training(two_ranks):
    results = [r["ddp"] for r in two_ranks[1]]
    initial = {k: p.detach() for k, p in W.Encoder().named_parameters()}
    for name in ("nt_xent_views", "supcon_views"):
        expected = W.reference_training(name, SEED, W.DDP_SIZES, W.DDP_STEPS, W.DDP_LR)
        assert any(float((expected[k] - initial[k]).abs().max()) > 1e-3 for k in expected), "training must move"
        for mode in W.MODES:
            for r in results:
                for key, value in expected.items():
                    torch.testing.assert_close(r[(name, mode)][key], value, **TOL,
                                               msg=lambda m: f"{name}/{mode}/{key}: {m}")


@pytest.mark.parametrize("run", ["two_ranks", "three_ranks"])
def test_key_queue_is_identical_on_every_rank_and_equals_single_process(request, run):
    from contrastkit.distributed import KeyQueue

    results = [r["queue"] for r in request.getfixturevalue(run)[1]]
    world = len(results)
    single = KeyQueue(W.QUEUE_SIZE, W.D_OUT, dtype=torch.float64)
    wrapped = False
    for step in range(W.QUEUE_STEPS):
        keys = torch.cat(W.queue_keys(SEED, step, world))  # rank 0's keys first
        single.enqueue(keys)
        wrapped |= int(single.filled) == W.QUEUE_SIZE
        for r in results:
            assert torch.equal(r["history"][step], single.negatives())
    assert wrapped, "the test must exercise the wrap-around"
    for r in results:
        for key, value in single.state_dict().items():
            assert torch.equal(r["state"][key], value)


def test_ring_exchange_runs_exactly_for_tiled_local_mode(loss_run):
    """The equalities above cover the ring only if the tiled local cases really took it."""
    _, results = loss_run
    for r in results:
        calls = r["ring_calls"]
        expected = {(name, "local") for name in W.TILED} - W.SKIP
        assert set(calls) == expected


# --------------------------------------------------------------------------- single process


def test_distributed_true_without_process_group_raises():
    z = torch.randn(4, 3)
    with pytest.raises(ValueError, match="init_process_group"):
        L.nt_xent_views(z, z, temperature=0.5, distributed=True)
    with pytest.raises(ValueError, match="init_process_group"):
        L.SupCon(temperature=0.5, distributed=True)(z, torch.tensor([0, 0, 1, 1]))


def test_bad_distributed_arguments():
    z = torch.randn(4, 3)
    with pytest.raises(TypeError, match="distributed"):
        L.dcl(z, z, temperature=0.5, distributed="yes")
    with pytest.raises(ValueError, match="distributed_mode"):
        L.info_nce(z, z, temperature=0.5, distributed_mode="both")


def test_helpers_without_process_group():
    assert not cd.is_active()
    assert cd.get_rank() == 0 and cd.get_world_size() == 1
    assert cd.resolve_group(False) is None
    layout = cd.RowLayout(sizes=(2, 3, 4), rank=1)
    assert (layout.offset, layout.local, layout.total, layout.largest) == (2, 3, 9, 4)
    assert layout.local_rows().tolist() == [2, 3, 4]


def test_key_queue_starting_full_holds_random_unit_keys_until_overwritten():
    torch.manual_seed(5)
    expected = torch.nn.functional.normalize(torch.randn(6, 3), dim=1)
    torch.manual_seed(5)
    queue = cd.KeyQueue(6, 3, start_full=True)
    assert torch.equal(queue.keys, expected) and int(queue.filled) == 6
    assert torch.equal(queue.negatives(), expected)
    new = torch.arange(12.0).reshape(4, 3)
    queue.enqueue(new)
    # Storage order: the 4 new keys over rows 0-3; oldest first: the 2 random keys left, then the new.
    assert torch.equal(queue.negatives(oldest_first=False), torch.cat([new, expected[4:]]))
    assert torch.equal(queue.negatives(), torch.cat([expected[4:], new]))
    queue.enqueue(new)  # wraps: rows 4, 5, 0, 1
    assert int(queue.pointer) == 2
    assert torch.equal(queue.negatives(), torch.cat([new[2:], new]))


def test_key_queue_state_restores_its_fill():
    """A restored queue knows how many rows hold keys (kept on the host, so reading it does
    not wait for the device)."""
    source = cd.KeyQueue(5, 2)
    source.enqueue(torch.ones(3, 2))
    restored = cd.KeyQueue(5, 2)
    assert restored.negatives().shape == (0, 2)
    restored.load_state_dict(source.state_dict())
    assert torch.equal(restored.negatives(), torch.ones(3, 2))
    restored.enqueue(2 * torch.ones(3, 2))
    assert torch.equal(restored.negatives(), torch.tensor([[1.0, 1.0]] * 2 + [[2.0, 2.0]] * 3))
    with pytest.raises(TypeError, match="start_full"):
        cd.KeyQueue(5, 2, start_full="yes")

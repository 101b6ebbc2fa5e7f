"""Every method across ranks (gloo, CPU, float64): the simple and hard-negative losses equal one
process on the concatenated batch to 1e-10 (values and parameter gradients), data-parallel
training of ``simple``, ``hard_negative`` and ``convirt`` equals single-process training, and
MoCo's shuffle-BN permutes the key network's batch exactly and reproducibly.

One module-scoped spawn of two processes runs every check; the tests compare.
"""

from __future__ import annotations

import pytest
import torch

import distributed_scaleout_workers as S
import distributed_workers as W
from contrastkit.distributed import shuffle_across_ranks

TOL = dict(rtol=1e-10, atol=1e-10)
SEED = 7
SIZES = (3, 5)  # uneven: the local-mode reduction must weigh the ranks by their anchors


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return W.spawn(S.suite_worker, 2, tmp_path_factory.mktemp("scaleout"), SEED, SIZES, ("mean", "sum", "none"))


def reference(name: str, reduction: str):
    return S.loss_and_grads(W.Encoder(), name, W.concatenated(W.batches(SEED, SIZES)), reduction)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("mode", W.MODES)
@pytest.mark.parametrize("name", list(S.LOSSES))
def test_loss_and_gradients_equal_one_process_on_the_global_batch(two_ranks, name, mode, reduction):
    ref_value, ref_grads = reference(name, reduction)
    results = [r["losses"][(name, mode, reduction)] for r in two_ranks]
    values = torch.stack([value for value, _ in results])
    if mode == "global":
        for value in values:
            torch.testing.assert_close(value, ref_value, **TOL)
    else:
        torch.testing.assert_close(values.mean(), ref_value, **TOL)
    expected_keys = {"net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"}
    if name != "simple_loss":
        expected_keys.add("temperature.log_scale")
    assert set(ref_grads) == expected_keys
    for _, grads in results:
        assert set(grads) == expected_keys
        for key, ref_grad in ref_grads.items():
            assert float(ref_grad.abs().max()) > 1e-6
            torch.testing.assert_close(grads[key], ref_grad, **TOL, msg=lambda m: f"{key}: {m}")


@pytest.mark.parametrize("mode", W.MODES)
@pytest.mark.parametrize("name", list(S.LOSSES))
def test_per_anchor_losses_are_the_global_ones(two_ranks, name, mode):
    ref_losses, _ = reference(name, "none")
    total = sum(SIZES)
    for rank, r in enumerate(two_ranks):
        got = r["losses"][(name, mode, "none")][0]
        if mode == "local":
            start, stop = sum(SIZES[:rank]), sum(SIZES[:rank + 1])
            expected = torch.cat([ref_losses[start:stop], ref_losses[total + start:total + stop]])
        else:
            expected = ref_losses
        torch.testing.assert_close(got, expected, **TOL)


def test_global_negatives_change_the_losses():
    """The reference is not what each rank would compute alone: the equalities above can fail."""
    parts = W.batches(SEED, SIZES)
    for name in S.LOSSES:
        alone = torch.stack([S.loss_and_grads(W.Encoder(), name, part, "mean")[0] for part in parts]).mean()
        assert abs(float(alone - reference(name, "mean")[0])) > 1e-3, name


@pytest.mark.parametrize("method", S.METHODS)
def test_data_parallel_training_equals_one_process(two_ranks, method):
    expected = S.train_method(method, SEED, SIZES, S.TRAIN_STEPS, S.TRAIN_LR)
    initial = {k: p.detach() for k, p in S.PairModel(method).named_parameters()}
    assert any(float((expected[k] - initial[k]).abs().max()) > 1e-3 for k in expected), "training must move"
    for r in two_ranks:
        for key, value in expected.items():
            torch.testing.assert_close(r["methods"][method][key], value, **TOL, msg=lambda m: f"{key}: {m}")


def test_shuffle_helper_permutes_the_global_batch_and_restores_each_ranks_rows(two_ranks):
    helpers = [r["shuffle"]["helper"] for r in two_ranks]
    permutation = helpers[0]["permutation"]
    assert torch.equal(helpers[1]["permutation"], permutation)  # one permutation for all ranks
    assert sorted(permutation.tolist()) == list(range(sum(SIZES)))
    for rank, helper in enumerate(helpers):
        start, stop = sum(SIZES[:rank]), sum(SIZES[:rank + 1])
        # Rank r holds the rows permutation[offset(r):offset(r) + n_r] of the global batch ...
        assert helper["shuffled"][:, 0].long().tolist() == permutation[start:stop].tolist()
        # ... and unshuffling gives each rank the outputs of its own rows, in order.
        assert torch.equal(helper["unshuffled"], 2 * helper["tagged"])
    assert permutation.tolist() != list(range(sum(SIZES)))


def test_moco_shuffle_bn_keys_equal_the_unshuffled_keys_with_a_key_network_in_eval_mode(two_ranks):
    for r in two_ranks:
        shuffled, plain = r["shuffle"][("keys", True)]
        torch.testing.assert_close(shuffled, plain, rtol=1e-12, atol=1e-12)
        # In training mode the key network's BatchNorm sees another batch: the keys change.
        shuffled, plain = r["shuffle"][("keys", False)]
        assert float((shuffled - plain).abs().max()) > 1e-4


def test_moco_shuffle_permutation_differs_per_step_and_repeats_with_the_seed(two_ranks):
    runs = [r["shuffle"]["permutations"] for r in two_ranks]
    for permutations in runs:
        assert len(permutations) == 2 * S.SHUFFLE_STEPS
        first, second = permutations[:S.SHUFFLE_STEPS], permutations[S.SHUFFLE_STEPS:]
        assert all(torch.equal(a, b) for a, b in zip(first, second))  # same seed, same permutations
        assert len({tuple(p.tolist()) for p in first}) == S.SHUFFLE_STEPS  # a new one each step
    for a, b in zip(*runs):
        assert torch.equal(a, b)  # rank 0 draws, every rank applies the same


def test_shuffle_is_a_no_op_under_one_process():
    x = torch.randn(4, 3)
    state = torch.get_rng_state()
    shuffled, shuffle = shuffle_across_ranks(x, False)
    assert shuffled is x and shuffle.permutation is None and shuffle.unshuffle(x) is x
    assert torch.equal(torch.get_rng_state(), state)  # nothing drawn: single-process runs are unchanged

"""The read-out without labels (contrastkit.metrics.readout): view retrieval against a brute-force
ranking, the held-out loss against the loss itself, and the same views for every encoder."""

from __future__ import annotations

import numpy as np
import torch

from contrastkit import losses
from contrastkit.metrics.readout import label_free_numbers, view_retrieval


def _brute_force(h_a, h_b, k):
    a = h_a / np.linalg.norm(h_a, axis=1, keepdims=True)
    b = h_b / np.linalg.norm(h_b, axis=1, keepdims=True)
    sims = b @ a.T
    hits = [int((sims[i] >= sims[i, i]).sum() - 1 < k) for i in range(len(sims))]  # ties count against
    return float(np.mean(hits))


def test_view_retrieval_matches_a_brute_force_ranking():
    rng = np.random.default_rng(0)
    h_a = rng.normal(size=(300, 16))
    h_b = h_a + rng.normal(scale=1.2, size=h_a.shape)  # noisy second views: some found, some not
    found = view_retrieval(torch.from_numpy(h_a), torch.from_numpy(h_b), ks=(1, 5), chunk=37)
    for k in (1, 5):
        expected = _brute_force(h_a, h_b, k)
        assert 0.0 < expected < 1.0
        assert found[f"view_retrieval_top{k}"] == expected


def test_identical_views_are_always_found_and_a_collapsed_encoder_at_most_by_chance():
    h = torch.randn(50, 8, dtype=torch.float64)
    assert view_retrieval(h, h)["view_retrieval_top1"] == 1.0
    # every similarity is 1 up to the matrix product's rounding: exact ties count against, so a
    # collapsed encoder is found no more often than chance (5 of 50 at top-5)
    collapsed = torch.ones(50, 8, dtype=torch.float64)
    assert view_retrieval(collapsed, collapsed)["view_retrieval_top5"] <= 5 / 50


def test_the_held_out_loss_is_the_mean_loss_over_batches_of_the_run_size():
    torch.manual_seed(0)
    h_a, h_b = torch.randn(25, 6, dtype=torch.float64), torch.randn(25, 6, dtype=torch.float64)
    numbers = label_free_numbers(h_a, h_b, temperature=0.3, batch_size=10)
    norm = torch.nn.functional.normalize
    expected = np.mean([float(losses.nt_xent_views(norm(h_a[s:s + 10], dim=1), norm(h_b[s:s + 10], dim=1),
                                                   temperature=0.3)) for s in (0, 10, 20)])
    assert np.isclose(numbers["heldout_loss"], expected, rtol=0, atol=1e-12)


class _NoisyViews:
    def views_of(self, images):
        return images + torch.randn_like(images), images + torch.randn_like(images)


def test_the_views_batch_by_batch_are_the_whole_views_whatever_the_caller_draws_between_batches():
    from contrastkit.metrics.readout import held_out_view_batches, held_out_views

    images = torch.rand(10, 1, 4, 4)
    whole_a, whole_b = held_out_views(images, _NoisyViews(), max_samples=8, seed=3, batch_size=3)
    assert whole_a.shape == (8, 1, 4, 4)
    torch.manual_seed(11)
    parts = []
    for view_a, view_b in held_out_view_batches(images, _NoisyViews(), max_samples=8, seed=3, batch_size=3):
        parts.append((view_a, view_b))
        torch.rand(5)  # the caller's own draws between batches (an encoder's dropout, say)
    assert [a.shape[0] for a, _ in parts] == [3, 3, 2]
    assert torch.equal(torch.cat([a for a, _ in parts]), whole_a)
    assert torch.equal(torch.cat([b for _, b in parts]), whole_b)
    # the caller's stream moved by its own draws only
    assert torch.equal(torch.rand(3), _after_draws(11, len(parts)))
    # another seed, other views
    other_a, _ = held_out_views(images, _NoisyViews(), max_samples=8, seed=4, batch_size=3)
    assert not torch.equal(other_a, whole_a)


def _after_draws(seed, draws):
    torch.manual_seed(seed)
    for _ in range(draws):
        torch.rand(5)
    return torch.rand(3)

"""Retrieval and zero-shot read-outs against hand-computed rankings and a brute-force
reference that enumerates every tie-breaking order."""

import itertools
import math

import numpy as np
import pytest
import torch

from contrastkit.metrics.retrieval import (chance_recall, class_embeddings, cosine_similarity, mean_rank,
                                           rank_counts, recall_at_k, retrieval_metrics, zero_shot_accuracy)

# Hand example (worked below, row = query, target = the diagonal):
#   row 0: 0.9 is the unique maximum                      -> rank 1
#   row 1: 0.3 with one higher (0.8)                      -> rank 2
#   row 2: all three 0.4 tie                              -> rank uniform on {1, 2, 3}
S = [[0.9, 0.1, 0.5],
     [0.2, 0.3, 0.8],
     [0.4, 0.4, 0.4]]


def test_hand_ranking_with_ties():
    higher, tied = rank_counts(S)
    assert higher.tolist() == [0, 1, 0]
    assert tied.tolist() == [0, 0, 2]
    assert recall_at_k(S, 1) == pytest.approx((1 + 0 + 1 / 3) / 3)
    assert recall_at_k(S, 2) == pytest.approx((1 + 1 + 2 / 3) / 3)
    assert recall_at_k(S, 3) == pytest.approx(1.0)
    assert recall_at_k(S, 10) == pytest.approx(1.0)
    assert mean_rank(S) == pytest.approx((1 + 2 + 2) / 3)


def test_hand_ranking_transposed_is_the_other_direction():
    # Columns as queries: col 0 (0.9, 0.2, 0.4) -> rank 1; col 1 (0.1, 0.3, 0.4) -> 0.3 has one
    # higher -> rank 2; col 2 (0.5, 0.8, 0.4) -> 0.4 has two higher -> rank 3.
    st = np.asarray(S).T
    assert recall_at_k(st, 1) == pytest.approx(1 / 3)
    assert recall_at_k(st, 2) == pytest.approx(2 / 3)
    assert mean_rank(st) == pytest.approx(2.0)


def _brute_force_recall(s, k):
    """Average over every order of the candidates that respects the scores (ties permuted)."""
    s = np.asarray(s, dtype=float)
    hits = []
    for q in range(s.shape[0]):
        orders = []
        for perm in itertools.permutations(range(s.shape[1])):
            scores = [s[q, c] for c in perm]
            if all(scores[i] >= scores[i + 1] for i in range(len(scores) - 1)):
                orders.append(perm)
        hits.append(sum(perm.index(q) < k for perm in orders) / len(orders))
    return sum(hits) / len(hits)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_against_brute_force_with_many_ties(seed):
    rng = np.random.default_rng(seed)
    s = rng.integers(0, 3, size=(5, 5)).astype(float)  # values in {0, 1, 2}: ties everywhere
    for k in (1, 2, 3, 5):
        assert recall_at_k(s, k) == pytest.approx(_brute_force_recall(s, k), abs=1e-12)


def test_constant_scorer_is_exactly_chance():
    s = np.zeros((7, 7))
    for k in (1, 3, 5, 7, 10):
        assert recall_at_k(s, k) == pytest.approx(chance_recall(7, k))
    assert chance_recall(7, 3) == pytest.approx(3 / 7)
    assert chance_recall(7, 10) == 1.0
    assert mean_rank(s) == pytest.approx(4.0)


def test_retrieval_metrics_from_embeddings():
    # Images at angles 0, 60, 120 degrees; texts at 10, 50, 200 degrees. Cosines by hand:
    # image 0 vs texts: cos10 = .985, cos50 = .643, cos200 = -.940 -> text 0 first (rank 1)
    # image 1 vs texts: cos50 = .643, cos10 = .985, cos140 = -.766 -> text 1 first (rank 1)
    # image 2 vs texts: cos110 = -.342, cos70 = .342, cos80 = .174 -> text 2 second (rank 2)
    def unit(deg):
        return [math.cos(math.radians(deg)), math.sin(math.radians(deg))]

    v = torch.tensor([unit(0), unit(60), unit(120)]) * torch.tensor([[1.0], [2.0], [0.5]])  # norms ignored
    u = torch.tensor([unit(10), unit(50), unit(200)])
    m = retrieval_metrics(v, u, ks=(1, 2))
    assert m["pairs"] == 3
    assert m["i2t_recall@1"] == pytest.approx(2 / 3)
    assert m["i2t_recall@2"] == pytest.approx(1.0)
    assert m["i2t_mean_rank"] == pytest.approx(4 / 3)
    # text->image: text 0 (10) vs images 0, 60, 120 deg: cos10 = .985 best (rank 1)
    # text 1 (50) vs images: cos50 = .643, cos10 = .985, cos70 = .342 -> image 1 first (rank 1)
    # text 2 (200) vs images: cos160 = -.940, cos140 = -.766, cos80 = .174 -> image 2 first (rank 1)
    assert m["t2i_recall@1"] == pytest.approx(1.0)
    assert m["chance_recall@1"] == pytest.approx(1 / 3)
    assert m["chance_mean_rank"] == pytest.approx(2.0)


def test_zero_shot_hand_example():
    # Two classes; prompts: class 0 at 0 and 90 degrees (mean direction 45), class 1 at 180.
    prompts = np.array([[1.0, 0.0], [0.0, 3.0], [-1.0, 0.0]])
    centres = class_embeddings(prompts, np.array([0, 0, 1]), 2)
    assert centres[0] == pytest.approx([math.sqrt(0.5), math.sqrt(0.5)])
    assert centres[1] == pytest.approx([-1.0, 0.0])
    images = np.array([[1.0, 1.0], [-1.0, 0.2], [0.0, 1.0], [-1.0, -1.0]])
    # cosines with class 0 (45 deg) / class 1 (180 deg): image 0 -> 0; image 1 -> 1;
    # image 2 -> 0 (cos45 vs cos90); image 3 -> 1 (cos180 vs cos45).
    labels = np.array([0, 1, 1, 1])  # image 2 mislabelled on purpose: 3 of 4 right
    assert zero_shot_accuracy(images, centres, labels) == pytest.approx(0.75)


def test_cosine_similarity_matches_definition():
    a = np.array([[3.0, 4.0]])
    b = np.array([[4.0, 3.0], [0.0, -2.0]])
    assert cosine_similarity(a, b)[0] == pytest.approx([24 / 25, -4 / 5])


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="square"):
        recall_at_k(np.zeros((2, 3)), 1)
    with pytest.raises(ValueError, match="NaN"):
        recall_at_k([[0.0, float("nan")], [0.0, 1.0]], 1)
    with pytest.raises(ValueError, match="k must"):
        recall_at_k(S, 0)
    with pytest.raises(ValueError, match="targets"):
        recall_at_k(np.zeros((2, 3)), 1, targets=[0, 3])
    with pytest.raises(ValueError, match="pair up"):
        retrieval_metrics(np.ones((3, 2)), np.ones((2, 2)))
    with pytest.raises(ValueError, match="zero-norm"):
        cosine_similarity(np.zeros((1, 2)), np.ones((1, 2)))
    with pytest.raises(ValueError, match="no prompt"):
        class_embeddings(np.ones((2, 2)), np.array([0, 0]), 2)

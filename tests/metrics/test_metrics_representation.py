"""Representation metrics against hand-computed cases and loop-based float64 references.

The references below follow the papers' definitions term by term with plain ``math`` (no
shared code with ``contrastkit.metrics``); the small cases are worked out in the comments.
"""

import math

import pytest
import torch

from contrastkit.metrics import (
    alignment,
    effective_rank,
    penalty_entropy,
    representation_metrics,
    similarity_profile,
    tolerance,
    uniformity,
)


def unit(rows):
    out = []
    for row in rows:
        n = math.sqrt(sum(v * v for v in row))
        out.append([v / n for v in row])
    return out


def dot(a, b):
    return sum(x * y for x, y in zip(a, b))


def random_rows(n, d, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64)


# ---------------------------------------------------------------------------- alignment

def test_alignment_collapsed_pairs_is_zero():
    x = random_rows(7, 3, 0)
    assert alignment(x, x.clone()) == pytest.approx(0.0, abs=1e-12)


def test_alignment_antipodal_pairs_is_four():
    # ||u - (-u)||^2 = ||2u||^2 = 4 on the unit sphere.
    x = torch.tensor([[1.0, 0.0], [0.0, 3.0], [0.6, 0.8]])
    assert alignment(x, -x) == pytest.approx(4.0)
    assert alignment(x, -x, alpha=1.0) == pytest.approx(2.0)


def test_alignment_orthogonal_and_mixed():
    # pair 0 orthogonal (||e1 - e2||^2 = 2), pair 1 identical (0): mean 1.
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    y = torch.tensor([[0.0, 2.0], [0.0, 5.0]])
    assert alignment(x, y) == pytest.approx(1.0)
    # without normalisation: ||(1,-2)||^2 = 5 and ||(0,-4)||^2 = 16 -> 10.5
    assert alignment(x, y, normalize=False) == pytest.approx(10.5)


# ---------------------------------------------------------------------------- uniformity

def reference_uniformity(x, t=2.0):
    x = unit(x.tolist())
    terms = [math.exp(-t * sum((a - b) ** 2 for a, b in zip(x[i], x[j])))
             for i in range(len(x)) for j in range(len(x)) if i < j]
    return math.log(sum(terms) / len(terms))


def test_uniformity_collapsed_is_zero():
    x = torch.tensor([[0.3, 0.4]]).repeat(9, 1)
    assert uniformity(x) == pytest.approx(0.0, abs=1e-12)


def test_uniformity_two_antipodal_points():
    # one pair at squared distance 4: log exp(-2 * 4) = -8
    x = torch.tensor([[1.0, 0.0], [-1.0, 0.0]])
    assert uniformity(x) == pytest.approx(-8.0)
    # large t stays finite (a naive mean of exp would underflow to log 0)
    assert uniformity(x, t=1000.0) == pytest.approx(-4000.0)


def test_uniformity_square_on_circle():
    # 4 points at 90 degrees: 4 pairs at squared distance 2, 2 pairs at 4
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]])
    expected = math.log((4 * math.exp(-4.0) + 2 * math.exp(-8.0)) / 6)
    assert uniformity(x) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_uniformity_matches_reference_any_chunk(chunk):
    x = random_rows(11, 4, 1)
    assert uniformity(x, chunk_size=chunk) == pytest.approx(reference_uniformity(x), rel=1e-10)


def test_uniformity_is_wang_isola_pdist_formula():
    # The authors' reference implementation: pdist(x).pow(2).mul(-t).exp().mean().log()
    x = torch.nn.functional.normalize(random_rows(20, 5, 2), dim=1)
    theirs = float(torch.pdist(x, p=2).pow(2).mul(-2).exp().mean().log())
    assert uniformity(x, chunk_size=7) == pytest.approx(theirs, rel=1e-10)


# ---------------------------------------------------------------------------- tolerance

def reference_tolerance(x, labels):
    x = unit(x.tolist())
    sims = [dot(x[i], x[j]) for i in range(len(x)) for j in range(len(x)) if i != j and labels[i] == labels[j]]
    return sum(sims) / len(sims)


def test_tolerance_hand_case():
    # class 0: e1, e2 -> cos 0; class 1: e1, -e1 -> cos -1; mean over pairs -0.5
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0], [-1.0, 0.0]])
    assert tolerance(x, torch.tensor([0, 0, 1, 1])) == pytest.approx(-0.5)


def test_tolerance_collapsed_classes_is_one():
    x = torch.tensor([[1.0, 0.0]] * 3 + [[0.0, 1.0]] * 2)
    assert tolerance(x, torch.tensor([0, 0, 0, 1, 1])) == pytest.approx(1.0)


def test_tolerance_unequal_classes_matches_reference():
    x = random_rows(13, 3, 3)
    labels = [0, 0, 0, 0, 0, 0, 1, 1, 2, 2, 2, 3, 4]  # singletons contribute no pair
    assert tolerance(x, torch.tensor(labels)) == pytest.approx(reference_tolerance(x, labels), rel=1e-10)


def test_tolerance_needs_a_pair():
    with pytest.raises(ValueError, match="two samples"):
        tolerance(torch.eye(3), torch.tensor([0, 1, 2]))
    with pytest.raises(TypeError, match="labels"):
        tolerance(torch.eye(3), torch.tensor([0.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="labels must have shape"):
        tolerance(torch.eye(3), torch.tensor([0, 1]))


# ---------------------------------------------------------------------------- profile

def test_similarity_profile_hand_case():
    # anchors e1, e2, e3; candidates y: y0 = e1 (pos of 0), y1 = (e1 + e2)/sqrt2, y2 = e3
    r = 1 / math.sqrt(2)
    x = torch.eye(3)
    y = torch.tensor([[1.0, 0.0, 0.0], [r, r, 0.0], [0.0, 0.0, 1.0]])
    # positives: 1, r, 1 -> mean (2 + r) / 3
    # anchor 0 negatives: y1 -> r, y2 -> 0; anchor 1: y0 -> 0, y2 -> 0; anchor 2: 0, 0
    profile = similarity_profile(x, y, k=2)
    assert profile.positive == pytest.approx((2 + r) / 3)
    assert profile.negatives.tolist() == pytest.approx([r / 3, 0.0])


def test_similarity_profile_matches_reference_and_chunks():
    x, y = random_rows(15, 4, 4), random_rows(15, 4, 5)
    xu, yu = unit(x.tolist()), unit(y.tolist())
    ranked = [sorted((dot(xu[i], yu[j]) for j in range(15) if j != i), reverse=True)[:10] for i in range(15)]
    expected = [sum(r[k] for r in ranked) / 15 for k in range(10)]
    for chunk in (1, 4, 100):
        profile = similarity_profile(x, y, chunk_size=chunk)
        assert profile.positive == pytest.approx(sum(dot(xu[i], yu[i]) for i in range(15)) / 15)
        assert profile.negatives.tolist() == pytest.approx(expected, rel=1e-10)


def test_similarity_profile_needs_enough_rows():
    with pytest.raises(ValueError, match="at least 11 rows"):
        similarity_profile(torch.eye(5), torch.eye(5))


# ---------------------------------------------------------------------------- penalty entropy

def reference_penalty_entropy(x, y, tau, b):
    x, y = unit(x.tolist()), unit(y.tolist())
    entropies = []
    for s in range(0, len(x), b):
        m = len(x[s:s + b])
        if m < 2:
            break
        z = x[s:s + b] + y[s:s + b]
        for i in range(2 * m):
            pos = (i + m) % (2 * m)
            w = [math.exp(dot(z[i], z[j]) / tau) for j in range(2 * m) if j not in (i, pos)]
            p = [v / sum(w) for v in w]
            entropies.append(-sum(q * math.log(q) for q in p))
    return sum(entropies) / len(entropies)


def test_penalty_entropy_collapsed_is_uniform_over_negatives():
    # every negative has the same similarity -> uniform penalty over 2b - 2 negatives
    x = torch.ones(8, 3)
    assert penalty_entropy(x, x, temperature=0.1, batch_size=4) == pytest.approx(math.log(6))


def test_penalty_entropy_hand_case():
    # b = 2: anchor e1 has negatives e2 (s = 0) and (e1+e3)/sqrt2 (s = r)
    r = 1 / math.sqrt(2)
    x = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    y = torch.tensor([[1.0, 0.0, 0.0], [r, 0.0, r]])
    tau = 0.5
    p = 1 / (1 + math.exp(r / tau))  # share of the e2 negative
    h = -(p * math.log(p) + (1 - p) * math.log(1 - p))
    # anchor e2 (row 1): negatives e1 (0) and e1 (0) -> log 2
    # anchor y0 = e1 (row 2): negatives e2 (0) and y1 (r) -> h
    # anchor y1 (row 3): negatives e1 (r) and e1 (r) -> log 2
    expected = (h + math.log(2) + h + math.log(2)) / 4
    assert penalty_entropy(x, y, temperature=tau, batch_size=2) == pytest.approx(expected, rel=1e-12)


def test_penalty_entropy_matches_reference_with_partial_batch():
    x, y = random_rows(11, 4, 6), random_rows(11, 4, 7)  # batches of 4, 4, 3
    got = penalty_entropy(x, y, temperature=0.2, batch_size=4)
    assert got == pytest.approx(reference_penalty_entropy(x, y, 0.2, 4), rel=1e-10)


def test_penalty_entropy_increases_with_tau():
    x, y = random_rows(16, 4, 8), random_rows(16, 4, 9)
    values = [penalty_entropy(x, y, temperature=t, batch_size=8) for t in (0.05, 0.1, 0.5, 1.0, 5.0)]
    assert all(a < b for a, b in zip(values, values[1:]))
    assert values[-1] < math.log(14)


def test_penalty_entropy_bad_input():
    with pytest.raises(ValueError, match="temperature"):
        penalty_entropy(torch.eye(4), torch.eye(4), temperature=0.0, batch_size=2)
    with pytest.raises(ValueError, match="batch_size"):
        penalty_entropy(torch.eye(4), torch.eye(4), temperature=0.1, batch_size=1)


# ---------------------------------------------------------------------------- effective rank

def test_effective_rank_identity_is_dimension():
    assert effective_rank(torch.eye(5)) == pytest.approx(5.0)


def test_effective_rank_collapsed_is_one():
    x = torch.tensor([[0.2, -1.0, 3.0]]).repeat(50, 1)
    assert effective_rank(x) == pytest.approx(1.0, abs=1e-6)
    # collapsed embeddings after centering are zero: undefined
    with pytest.raises(ValueError, match="zero matrix"):
        effective_rank(x, center=True)


@pytest.mark.parametrize("rows, features", [(40, 6), (6, 40)])  # the d x d, then the N x N Gram matrix
def test_effective_rank_known_singular_values(rows, features):
    # singular values (3, 1): p = (3/4, 1/4), erank = exp(H(p)), invariant to rotations
    p = (0.75, 0.25)
    expected = math.exp(-sum(v * math.log(v) for v in p))
    g = torch.Generator().manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(rows, 2, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(features, 2, generator=g, dtype=torch.float64))
    x = u @ torch.diag(torch.tensor([3.0, 1.0], dtype=torch.float64)) @ v.T
    for chunk in (1, 4, 7, 1000):
        assert effective_rank(x, chunk_size=chunk) == pytest.approx(expected, rel=1e-8)
        assert effective_rank(x.T.contiguous(), chunk_size=chunk) == pytest.approx(expected, rel=1e-8)


def test_effective_rank_of_a_few_raw_images_of_a_million_values_is_computed():
    # A d x d Gram matrix of d = 1,000,000 would be 8 TB; the 4 x 4 one of the rows is all it needs.
    g = torch.Generator().manual_seed(2)
    x = torch.rand(4, 1_000_000, generator=g)
    singular = torch.linalg.svdvals(x.double())
    p = singular / singular.sum()
    assert effective_rank(x) == pytest.approx(float(torch.exp(-(p * p.log()).sum())), rel=1e-9)


def test_effective_rank_zero_matrix_raises():
    with pytest.raises(ValueError, match="zero-norm|zero matrix"):
        effective_rank(torch.zeros(3, 2))


# ---------------------------------------------------------------------------- bad input, bundle

def test_bad_embeddings_are_named():
    with pytest.raises(ValueError, match="NaN"):
        uniformity(torch.tensor([[float("nan"), 1.0], [1.0, 0.0]]))
    with pytest.raises(ValueError, match="zero-norm"):
        alignment(torch.zeros(2, 2), torch.ones(2, 2))
    with pytest.raises(ValueError, match="y has shape"):
        alignment(torch.ones(2, 2), torch.ones(3, 2))
    with pytest.raises(ValueError, match="at least 2 rows"):
        uniformity(torch.ones(1, 2))
    with pytest.raises(ValueError, match="chunk_size"):
        uniformity(torch.eye(3), chunk_size=0)
    with pytest.raises(TypeError, match="torch.Tensor"):
        uniformity([[1.0, 0.0]])


def test_representation_metrics_bundle_agrees_with_parts():
    x, y = random_rows(30, 4, 10).float(), random_rows(30, 4, 11).float()
    labels = torch.arange(30) % 3
    out = representation_metrics(x, y, labels, temperature=0.3, batch_size=8)
    assert out["alignment"] == pytest.approx(alignment(x, y))
    assert out["uniformity"] == pytest.approx(uniformity(x))
    assert out["tolerance"] == pytest.approx(tolerance(x, labels))
    assert out["penalty_entropy"] == pytest.approx(penalty_entropy(x, y, temperature=0.3, batch_size=8))
    assert out["penalty_entropy_max"] == pytest.approx(math.log(14))
    assert len(out["top_negative_similarity"]) == 10
    assert out["effective_rank"] == pytest.approx(effective_rank(x))
    assert "tolerance" not in representation_metrics(x, y, temperature=0.3, batch_size=8)

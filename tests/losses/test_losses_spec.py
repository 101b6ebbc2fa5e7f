"""The worked examples and exercises of the source texts (SPEC §1-§3), recomputed here from
first principles with ``math`` and compared with the library."""

import math

import pytest
import torch

from contrastkit import losses as L


def softmax(values):
    m = max(values)
    e = [math.exp(v - m) for v in values]
    return [x / sum(e) for x in e]


# ---------------------------------------------------------------- SPEC §1 (seed 000)


def test_seed000_worked_example_probabilities_and_loss():
    s, tau = [1.0, 0.5, 0.0], 0.5
    expected_p = softmax([v / tau for v in s])  # logits (2, 1, 0)
    expected_loss = -math.log(expected_p[0])
    # the text's printed values agree with the recomputation to the digits it prints
    assert expected_p == pytest.approx([0.6652409558, 0.2447284711, 0.0900305732], abs=1e-10)
    assert expected_loss == pytest.approx(0.4076059644, abs=1e-10)

    sim = torch.tensor([s], dtype=torch.float64)
    loss = L.contrastive_loss(sim, torch.tensor([0]), temperature=tau)
    assert float(loss) == pytest.approx(expected_loss, abs=1e-12)
    # same number through the candidate-choice API with unit vectors at the right cosines
    angles = [math.acos(v) for v in s]
    query = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    cands = torch.tensor([[math.cos(a), math.sin(a)] for a in angles], dtype=torch.float64)
    loss2 = L.info_nce(query, cands[:1], cands[1:], temperature=tau)
    assert float(loss2) == pytest.approx(expected_loss, abs=1e-12)


def test_seed000_shift_invariance():
    s = torch.tensor([[1.0, 0.5, 0.0]], dtype=torch.float64)
    a = L.contrastive_loss(s, torch.tensor([0]), temperature=0.5)
    b = L.contrastive_loss(s + 3.25, torch.tensor([0]), temperature=0.5)
    assert float(a) == pytest.approx(float(b), abs=1e-12)


@pytest.mark.parametrize("tau,printed", [(1.0, 0.4506), (0.5, 0.5713), (0.1, 0.9796)])
def test_seed000_temperature_block(tau, printed):
    s = [0.8, 0.4, 0.2]
    p_pos = softmax([v / tau for v in s])[0]
    assert p_pos == pytest.approx(printed, abs=5e-5)  # the text rounds to 4 digits
    loss = L.contrastive_loss(torch.tensor([s], dtype=torch.float64), torch.tensor([0]), temperature=tau)
    assert math.exp(-float(loss)) == pytest.approx(p_pos, abs=1e-12)


@pytest.mark.parametrize("tau", [1.0, 0.5, 0.1])
def test_seed000_gradients(tau):
    s = [0.8, 0.4, 0.2]
    p = softmax([v / tau for v in s])
    expected = [(p[0] - 1) / tau] + [pj / tau for pj in p[1:]]
    sim = torch.tensor([s], dtype=torch.float64, requires_grad=True)
    L.contrastive_loss(sim, torch.tensor([0]), temperature=tau).backward()
    assert sim.grad[0].tolist() == pytest.approx(expected, abs=1e-12)
    # the magnitude on the positive equals the sum of magnitudes on the negatives
    assert abs(expected[0]) == pytest.approx(sum(expected[1:]), abs=1e-12)


# ---------------------------------------------------------------- SPEC §2 (seed 002)

Z = [[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [0.6, 0.8]]
PAIRS = [1, 0, 3, 2]


def pairwise_losses(z, pairs, tau):
    out = []
    for i, zi in enumerate(z):
        sims = [sum(a * b for a, b in zip(zi, zj)) for zj in z]
        others = [sims[j] / tau for j in range(len(z)) if j != i]
        m = max(others)
        out.append(-sims[pairs[i]] / tau + m + math.log(sum(math.exp(o - m) for o in others)))
    return out


def test_seed002_worked_example():
    expected = pairwise_losses(Z, PAIRS, 1.0)
    # Rows 0 and 2 match the text (0.8189). The text prints 0.9344 for rows 1 and 3 and a mean
    # of 0.8766; that is a slip: <z1, z3> = 0.8*0.6 + 0.6*0.8 = 0.96, and the text's 0.9344 is
    # what S_13 = 0.48 (one product term only) would give. The right values are 1.0960 and
    # mean 0.9574.
    assert expected[0] == pytest.approx(0.8189, abs=1e-4)
    assert expected[1] == pytest.approx(-0.8 + math.log(math.exp(0.8) + math.exp(0.6) + math.exp(0.96)))
    assert expected[1] == pytest.approx(1.0960, abs=1e-4)
    z = torch.tensor(Z, dtype=torch.float64)
    got = L.nt_xent(z, torch.tensor(PAIRS), temperature=1.0, reduction="none")
    assert got.tolist() == pytest.approx(expected, abs=1e-12)
    assert float(L.nt_xent(z, torch.tensor(PAIRS), temperature=1.0)) == pytest.approx(sum(expected) / 4, abs=1e-12)
    # the same as a precomputed matrix with the diagonal excluded
    s = z @ z.T
    got2 = L.similarity_loss(s, torch.tensor(PAIRS), temperature=1.0, exclude_diagonal=True, reduction="none")
    assert got2.tolist() == pytest.approx(expected, abs=1e-12)


def test_seed002_f1_including_the_diagonal_changes_the_loss():
    # F1: with the diagonal in the denominator every row gains the term exp(1/tau) from itself.
    s = torch.tensor(Z, dtype=torch.float64) @ torch.tensor(Z, dtype=torch.float64).T
    wrong = L.similarity_loss(s, torch.tensor(PAIRS), temperature=0.1, exclude_diagonal=False, reduction="none")
    right = L.similarity_loss(s, torch.tensor(PAIRS), temperature=0.1, exclude_diagonal=True, reduction="none")
    for i in range(4):
        others = [float(s[i, j]) / 0.1 for j in range(4) if j != i]
        with_self = others + [float(s[i, i]) / 0.1]
        lse = lambda xs: max(xs) + math.log(sum(math.exp(x - max(xs)) for x in xs))
        assert float(wrong[i]) == pytest.approx(lse(with_self) - float(s[i, PAIRS[i]]) / 0.1, abs=1e-10)
        assert float(right[i]) == pytest.approx(lse(others) - float(s[i, PAIRS[i]]) / 0.1, abs=1e-10)
    assert bool((wrong > right).all())


def lemma_limits(row_sims, pos):
    """SPEC §2 lemma for one row given the similarities to the other rows."""
    a, b = max(row_sims), row_sims[pos]
    m = sum(1 for s in row_sims if s == a)
    limit_zero = math.inf if a > b else math.log(m)
    return limit_zero, a - b, math.log(len(row_sims))


@pytest.mark.parametrize(
    "s01,s02,case",
    [(0.9, -0.1, "unique max"), (0.9, 0.95, "A > B"), (0.9, 0.9, "tie")],
)
def test_seed002_f2_limits(s01, s02, case):
    # Row 0 of a 3-row problem: positive is row 1 (similarity s01), negative row 2 (s02).
    sims = [s01, s02]
    limit_zero, rate, limit_inf = lemma_limits(sims, 0)
    if case == "unique max":
        assert limit_zero == 0 and rate == pytest.approx(0.0)
    elif case == "A > B":
        assert limit_zero == math.inf and rate == pytest.approx(0.05)
    else:
        assert limit_zero == pytest.approx(math.log(2)) and rate == 0
    sim = torch.tensor([sims], dtype=torch.float64)
    loss = lambda tau: float(L.contrastive_loss(sim, torch.tensor([0]), temperature=tau))
    assert loss(1e8) == pytest.approx(limit_inf, abs=1e-6)  # log(N - 1) with N = 3
    assert 1e-3 * loss(1e-3) == pytest.approx(rate, abs=1e-3)
    if math.isfinite(limit_zero):
        assert loss(1e-3) == pytest.approx(limit_zero, abs=1e-6)
    else:
        assert loss(1e-3) > 40


def test_seed002_f3_changing_z3():
    z = [row[:] for row in Z]
    z[3] = [-0.6, 0.8]
    expected = pairwise_losses(z, PAIRS, 1.0)
    got = L.nt_xent(torch.tensor(z, dtype=torch.float64), torch.tensor(PAIRS), temperature=1.0, reduction="none")
    assert got.tolist() == pytest.approx(expected, abs=1e-12)
    # z3 moved away from z0 and z1: the rows of the (2, 3) pair lose their closest rival
    # (row 3 is now less similar to 0 and 1), and the pair itself is less aligned (0.8 - 0.48).
    assert expected[3] != pytest.approx(pairwise_losses(Z, PAIRS, 1.0)[3])


def test_seed002_f4_dropping_the_positive_from_the_denominator():
    # F4: the wrong denominator (positive dropped) is exactly the decoupled loss; it is smaller
    # than NT-Xent on every row and can be negative.
    z = torch.tensor(Z, dtype=torch.float64)
    for tau in (1.0, 0.1):
        expected = []
        for i in range(4):
            negs = [sum(a * b for a, b in zip(Z[i], Z[j])) / tau for j in range(4) if j not in (i, PAIRS[i])]
            m = max(negs)
            expected.append(m + math.log(sum(math.exp(x - m) for x in negs))
                            - sum(a * b for a, b in zip(Z[i], Z[PAIRS[i]])) / tau)
        # dcl takes the views form: pairs (0, 1) and (2, 3) are views a = rows 0, 2; b = rows 1, 3
        got = L.dcl(z[[0, 2]], z[[1, 3]], temperature=tau, reduction="none")
        # views order: anchors 0, 2, 1, 3
        assert got.tolist() == pytest.approx([expected[0], expected[2], expected[1], expected[3]], abs=1e-12)
        standard = L.nt_xent(z, torch.tensor(PAIRS), temperature=tau, reduction="none")
        assert bool((torch.tensor(expected, dtype=torch.float64) < standard).all())
    assert min(expected) < 0  # at tau = 0.1 the decoupled loss is negative


def test_seed002_two_rows_is_degenerate():
    z = torch.tensor([[1.0, 0.0], [0.6, 0.8]], dtype=torch.float64)
    with pytest.warns(UserWarning, match="degenerate"):
        loss = L.nt_xent(z, torch.tensor([1, 0]), temperature=0.3, reduction="none")
    assert loss.tolist() == [0.0, 0.0]


# ---------------------------------------------------------------- SPEC §3 (seed 003)

S3 = [[0.879, -0.06, -0.06, -0.06], [-0.06, 0.879, -0.06, -0.06],
      [-0.06, -0.06, 0.879, 0.724], [-0.06, -0.06, 0.724, 0.879]]


def convirt_reference(s, tau, lam):
    n = len(s)
    total = 0.0
    for i in range(n):
        row = [s[i][k] / tau for k in range(n)]
        col = [s[k][i] / tau for k in range(n)]
        lse = lambda xs: max(xs) + math.log(sum(math.exp(x - max(xs)) for x in xs))
        total += lam * (lse(row) - row[i]) + (1 - lam) * (lse(col) - col[i])
    return total / n


def test_seed003_row3_distribution():
    logits = [v / 0.1 for v in S3[2]]
    assert logits == pytest.approx([-0.6, -0.6, 8.79, 7.24])
    p = softmax(logits)
    assert p[2] == pytest.approx(0.825, abs=1e-3) and p[3] == pytest.approx(0.175, abs=1e-3)
    assert -math.log(p[2]) == pytest.approx(0.193, abs=1e-3)


@pytest.mark.parametrize("tau,printed", [(0.01, 0.0000), (0.1, 0.0964), (1.0, 0.8732)])
def test_seed003_temperature_sweep(tau, printed):
    expected = convirt_reference(S3, tau, 0.75)  # S is symmetric, so lambda does not matter here
    assert expected == pytest.approx(printed, abs=5e-5)
    s = torch.tensor(S3, dtype=torch.float64)
    got = L.similarity_loss(s, torch.arange(4), temperature=tau, exclude_diagonal=False)
    assert float(got) == pytest.approx(expected, abs=1e-12)
    assert float(got) < math.log(4)  # below the uniform-choice reference log 4 = 1.3863


def test_seed003_uniform_reference():
    # uniform choice among N candidates costs log N
    s = torch.zeros(32, 32, dtype=torch.float64)
    got = L.similarity_loss(s, torch.arange(32), temperature=0.1, exclude_diagonal=False)
    assert float(got) == pytest.approx(math.log(32), abs=1e-12)
    assert math.log(32) == pytest.approx(3.466, abs=1e-3)
    assert -math.log(0.05) == pytest.approx(2.996, abs=1e-3)

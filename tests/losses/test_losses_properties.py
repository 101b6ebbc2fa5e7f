"""Property tests (hypothesis) of the loss family."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from contrastkit import losses as L

SETTINGS = settings(max_examples=40, deadline=None)


def embeddings(n, d, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64)


@SETTINGS
@given(n=st.integers(1, 6), k=st.integers(2, 6), shift=st.floats(-50, 50), tau=st.floats(0.05, 5), seed=st.integers(0, 10**6))
def test_constant_added_to_every_logit_changes_nothing(n, k, shift, tau, seed):
    s = embeddings(n, k, seed)
    pos = torch.randint(0, k, (n,), generator=torch.Generator().manual_seed(seed))
    a = L.contrastive_loss(s, pos, temperature=tau, reduction="none")
    b = L.contrastive_loss(s + shift, pos, temperature=tau, reduction="none")
    assert torch.allclose(a, b, rtol=1e-9, atol=1e-9)


@SETTINGS
@given(n=st.integers(2, 6), d=st.integers(2, 5), seed=st.integers(0, 10**6), tau=st.floats(0.05, 2))
def test_permutation_equivariance(n, d, seed, tau):
    a, b = embeddings(n, d, seed), embeddings(n, d, seed + 1)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    for fn in (lambda x, y: L.nt_xent_views(x, y, temperature=tau, reduction="none"),
               lambda x, y: L.dcl(x, y, temperature=tau, reduction="none")):
        base, permuted = fn(a, b), fn(a[perm], b[perm])
        assert torch.allclose(permuted, torch.cat([base[:n][perm], base[n:][perm]]), rtol=1e-10, atol=1e-12)
    base = L.bidirectional_info_nce(a, b, temperature=tau, weight=0.75, reduction="none")
    assert torch.allclose(L.bidirectional_info_nce(a[perm], b[perm], temperature=tau, weight=0.75,
                                                   reduction="none"), base[perm], rtol=1e-10)
    base = L.info_nce(a, b, temperature=tau, reduction="none")
    assert torch.allclose(L.info_nce(a[perm], b[perm], temperature=tau, reduction="none"), base[perm], rtol=1e-10)


@SETTINGS
@given(n=st.integers(2, 6), d=st.integers(1, 5), seed=st.integers(0, 10**6), tau=st.floats(0.01, 10),
       labels=st.lists(st.integers(0, 2), min_size=4, max_size=4))
def test_nonnegative_when_positive_in_denominator(n, d, seed, tau, labels):
    a, b = embeddings(n, d, seed), embeddings(n, d, seed + 1)
    assert (L.nt_xent_views(a, b, temperature=tau, reduction="none") >= 0).all()
    assert (L.info_nce(a, b, temperature=tau, reduction="none") >= 0).all()
    assert (L.bidirectional_info_nce(a, b, temperature=tau, weight=0.3, reduction="none") >= 0).all()
    assert (L.hard_negative_nt_xent(a, b, temperature=tau, top_k=1, reduction="none") >= 0).all()
    z = embeddings(4, d, seed + 2)
    assert (L.supcon(z, torch.tensor(labels), temperature=tau, reduction="none") >= 0).all()


@SETTINGS
@given(n=st.integers(2, 6), d=st.integers(1, 5), seed=st.integers(0, 10**6))
def test_infinite_temperature_gives_log_of_denominator_size(n, d, seed):
    a, b = embeddings(n, d, seed), embeddings(n, d, seed + 1)
    tau = 1e9
    assert float(L.nt_xent_views(a, b, temperature=tau)) == pytest.approx(math.log(2 * n - 1), abs=1e-6)
    assert float(L.info_nce(a, b, temperature=tau)) == pytest.approx(math.log(n), abs=1e-6)
    assert float(L.dcl(a, b, temperature=tau)) == pytest.approx(math.log(2 * n - 2), abs=1e-6)
    assert float(L.hard_negative_nt_xent(a, b, temperature=tau, top_k=1)) == pytest.approx(math.log(2), abs=1e-6)


@SETTINGS
@given(n=st.integers(1, 8), d=st.integers(1, 6), seed=st.integers(0, 10**6))
def test_identical_embeddings_give_log_2n_minus_1(n, d, seed):
    row = embeddings(1, d, seed)
    z = row.repeat(n, 1)
    with pytest.warns(UserWarning) if n < 2 else _no_warning():
        loss = L.nt_xent_views(z, z.clone(), temperature=0.37)
    assert float(loss) == pytest.approx(math.log(2 * n - 1), abs=1e-12)


class _no_warning:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

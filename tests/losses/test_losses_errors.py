"""Bad input raises a clear error naming the argument, never a silent NaN."""

import math

import pytest
import torch

from contrastkit import losses as L
from loss_catalog import CATALOG, cases


def ok(n=4, d=3, dtype=torch.float32):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(n * 10 + d), dtype=dtype)


@pytest.mark.parametrize("tau", [0, -0.1, math.inf, math.nan, torch.tensor(-1.0), torch.tensor([0.1, 0.2])])
def test_bad_temperature(tau):
    with pytest.raises(ValueError, match="temperature"):
        L.nt_xent_views(ok(), ok(), temperature=tau)


@pytest.mark.parametrize("tau", ["0.1", None, True])
def test_temperature_type(tau):
    with pytest.raises(TypeError, match="temperature"):
        L.info_nce(ok(), ok(), temperature=tau)


def test_not_a_tensor_and_integer_dtype():
    with pytest.raises(TypeError, match="z_a must be a torch.Tensor"):
        L.nt_xent_views([[1.0, 0.0]], ok(), temperature=0.1)
    with pytest.raises(TypeError, match="query must have a floating dtype"):
        L.info_nce(torch.ones(4, 3, dtype=torch.long), ok(), temperature=0.1)


def test_shape_mismatch():
    with pytest.raises(ValueError, match="z_b has shape"):
        L.nt_xent_views(ok(4, 3), ok(5, 3), temperature=0.1)
    with pytest.raises(ValueError, match="u has shape"):
        L.bidirectional_info_nce(ok(4, 3), ok(4, 2), temperature=0.1)
    with pytest.raises(ValueError, match="z must have 2 dimensions"):
        L.nt_xent(torch.ones(4), torch.tensor([1, 0, 3, 2]), temperature=0.1)
    with pytest.raises(ValueError, match="negatives has shape"):
        L.info_nce(ok(4, 3), ok(4, 3), ok(6, 2), temperature=0.1)
    with pytest.raises(ValueError, match="negatives must have 3 dimensions"):
        L.info_nce(ok(4, 3), ok(4, 3), ok(6, 3), temperature=0.1, negative_mode="paired")


def test_dtype_mismatch():
    with pytest.raises(TypeError, match="dtype"):
        L.nt_xent_views(ok(), ok(dtype=torch.float64), temperature=0.1)


def test_empty_batch():
    with pytest.raises(ValueError, match="empty"):
        L.nt_xent_views(torch.empty(0, 3), torch.empty(0, 3), temperature=0.1)
    with pytest.raises(ValueError, match="empty"):
        L.info_nce(torch.empty(0, 3), torch.empty(0, 3), temperature=0.1)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nan_and_inf_inputs(value):
    x = ok()
    x[1, 2] = value
    with pytest.raises(ValueError, match="z_a contains 1 NaN or infinite"):
        L.nt_xent_views(x, ok(), temperature=0.1)
    with pytest.raises(ValueError, match="similarities contains"):
        L.similarity_loss(x[:, :3].repeat(1, 2)[:, :4], torch.tensor([1, 0, 3, 2]), temperature=0.1,
                          exclude_diagonal=True)


def test_zero_norm_rows():
    x = ok()
    x[2] = 0
    with pytest.raises(ValueError, match="zero-norm"):
        L.nt_xent_views(ok(), x, temperature=0.1)
    # without normalisation a zero row is a legitimate input
    assert torch.isfinite(L.nt_xent_views(ok(), x, temperature=0.1, normalize=False))


@pytest.mark.parametrize("index,match", [
    ([1, 0, 3], "shape"),
    ([1, 0, 3, 4], "out of range"),
    ([1, 0, 2, 3], "to themselves"),
    ([1, 2, 3, 0], "not symmetric"),
    ([1.0, 0.0, 3.0, 2.0], "integer dtype"),
])
def test_invalid_positive_maps(index, match):
    error = TypeError if match == "integer dtype" else ValueError
    with pytest.raises(error, match=match):
        L.nt_xent(ok(), torch.tensor(index), temperature=0.1)


def test_invalid_labels():
    with pytest.raises(ValueError, match="labels must have shape"):
        L.supcon(ok(), torch.tensor([0, 1, 0]), temperature=0.1)
    with pytest.raises(TypeError, match="labels must have an integer dtype"):
        L.supcon(ok(), torch.tensor([0.0, 1.0, 0.0, 1.0]), temperature=0.1)
    with pytest.raises(ValueError, match="no anchor has a positive"):
        L.supcon(ok(), torch.tensor([0, 1, 2, 3]), temperature=0.1)


def test_options():
    with pytest.raises(ValueError, match="reduction"):
        L.nt_xent_views(ok(), ok(), temperature=0.1, reduction="avg")
    with pytest.raises(ValueError, match="weight"):
        L.bidirectional_info_nce(ok(), ok(), temperature=0.1, weight=1.5)
    with pytest.raises(ValueError, match="variant"):
        L.supcon(ok(), torch.tensor([0, 1, 0, 1]), temperature=0.1, variant="both")
    with pytest.raises(ValueError, match="negative_mode"):
        L.info_nce(ok(), ok(), ok(), temperature=0.1, negative_mode="shared")
    with pytest.raises(ValueError, match="exactly one of top_k and quantile"):
        L.hard_negative_nt_xent(ok(), ok(), temperature=0.1)
    with pytest.raises(ValueError, match="top_k"):
        L.hard_negative_nt_xent(ok(), ok(), temperature=0.1, top_k=0)
    with pytest.raises(ValueError, match="quantile"):
        L.hard_negative_nt_xent(ok(), ok(), temperature=0.1, quantile=1.0)
    with pytest.raises(ValueError, match="tau_plus"):
        L.debiased_nt_xent(ok(), ok(), temperature=0.1, tau_plus=1.0)
    with pytest.raises(ValueError, match="beta"):
        L.hcl(ok(), ok(), temperature=0.1, beta=-1)
    with pytest.raises(ValueError, match="negative_weight"):
        L.simple_loss(ok(), ok(), negative_weight=-1)
    with pytest.raises(ValueError, match="exclude_diagonal=True needs a square"):
        L.similarity_loss(ok(4, 5), torch.tensor([1, 0, 3, 2]), temperature=0.1, exclude_diagonal=True)
    with pytest.raises(ValueError, match="points an anchor at itself, but the diagonal is excluded"):
        L.similarity_loss(ok(4, 4), torch.tensor([1, 1, 3, 2]), temperature=0.1, exclude_diagonal=True)
    with pytest.raises(ValueError, match="at least 2 pairs"):
        L.dcl(ok(1, 3), ok(1, 3), temperature=0.1)


def test_few_rows_warning():
    with pytest.warns(UserWarning, match="N >= 4"):
        L.nt_xent_views(ok(1, 3), ok(1, 3), temperature=0.1)


@pytest.mark.parametrize("loss", [
    lambda a, b: L.info_nce(a, b, temperature=0.1),
    lambda a, b: L.bidirectional_info_nce(a, b, temperature=0.1),
    lambda a, b: L.info_nce(a, b, temperature=0.1, chunk_size=1),
])
def test_one_pair_without_negatives_warns(loss):
    """With N = 1 the only candidate is the positive: the loss is 0 whatever the embeddings.

    Computed as ``logsumexp([s / tau]) - s / tau``, it is 0 up to the rounding of a float32 logit
    of size ``|s| / tau <= 1 / tau = 10``: a few units in the last place of 10 (the tiled path's
    online log-sum-exp rounds differently from the dense one, by kernel; seen: one ulp, 9.5e-7).
    """
    with pytest.warns(UserWarning, match="degenerate.*N >= 4"):
        value = loss(ok(1, 3), ok(1, 3))
    logit_ulp = torch.finfo(torch.float32).eps * (1 / 0.1)
    assert abs(float(value)) <= 4 * logit_ulp


def test_a_bank_of_negatives_needs_no_warning():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        L.info_nce(ok(1, 3), ok(1, 3), ok(5, 3), temperature=0.1)
        L.info_nce(ok(2, 3), ok(2, 3), temperature=0.1)


# Every catalogued loss refuses a bad option by name, with the input value checks on and off
# (value_checks(False) skips the checks that read tensor values, not those of the options).
BAD_REDUCTION = r"reduction must be one of \('mean', 'sum', 'none'\), got 'avg'"
BAD_OPTIONS = [pytest.param(name, {"reduction": "avg"}, BAD_REDUCTION, id=f"{name}-reduction=avg")
               for name in sorted(CATALOG)] + [
    pytest.param(name, {"chunk_size": bad}, rf"chunk_size must be >= 1, got {bad}", id=f"{name}-chunk_size={bad}")
    for name in sorted(cases(tiled=True)) for bad in (0, -1)]


@pytest.mark.parametrize("checks", [True, False], ids=["checks-on", "checks-off"])
@pytest.mark.parametrize("name,option,message", BAD_OPTIONS)
def test_every_loss_refuses_a_bad_option_by_name(name, option, message, checks):
    case = CATALOG[name]
    with L.value_checks(checks), pytest.raises(ValueError, match=message):
        case(case.tensors(4, 3), 0.1, **option)

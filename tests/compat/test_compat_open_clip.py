"""contrastkit.compat.open_clip against the installed open_clip (``open_clip_torch``; the
``test`` and ``compat-test`` extras pin it): the same signatures and defaults; the same values
and gradients (features, ``logit_scale``, ``logit_bias``) in float32 and float64 over batch
sizes from 1 pair to one that contrastkit tiles, feature widths, logit scales (0 and negative
ones included), with and without a bias, ``output_dict``; the peer's errors for inputs that do
not pair; every distributed option of both losses on 2 gloo processes, compared per rank; and
open_clip's training step run unchanged with the import swapped.

The peer is ``open_clip/loss.py`` of the installed package, loaded on its own: the package's
``__init__`` imports its models (torchvision, timm), seconds in every spawned worker, and the
loss module needs torch only."""

import importlib
import importlib.util
import inspect
import math
import os
import sys
import warnings

import pytest
import torch
from torch import nn

if importlib.util.find_spec("open_clip") is None:
    pytest.skip("open_clip_torch is not installed (pip install 'contrastkit[compat-test]')", allow_module_level=True)


def _peer_loss_module():
    """``open_clip/loss.py`` run on its own (or, should it ever import the rest of the package,
    ``open_clip.loss`` itself)."""
    name = "_open_clip_loss_peer"
    if name not in sys.modules:
        folder = importlib.util.find_spec("open_clip").submodule_search_locations[0]
        spec = importlib.util.spec_from_file_location(name, os.path.join(folder, "loss.py"))
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except ImportError:
            module = importlib.import_module("open_clip.loss")
        sys.modules[name] = module
    return sys.modules[name]


peer = _peer_loss_module()

from contrastkit.compat import open_clip as compat  # noqa: E402
from contrastkit.losses.tiled import use_tiled  # noqa: E402

KINDS = ("ClipLoss", "SigLipLoss")
CLIP_SCALE = 1 / 0.07  # open_clip's initial logit_scale.exp()


# --------------------------------------------------------------------------- helpers


def _features(n, d, dtype, seed, rank=0):
    """Image and text features ``(n, d)`` whose rows are NOT unit vectors (norms in [0.5, 2]):
    the loss must use them as given, as the peer does."""
    g = torch.Generator().manual_seed(seed * 7919 + rank)
    out = []
    for _ in range(2):
        x = torch.nn.functional.normalize(torch.randn(n, d, generator=g, dtype=torch.float64), dim=1)
        out.append((x * (0.5 + 1.5 * torch.rand(n, 1, generator=g, dtype=torch.float64))).to(dtype))
    out[1] = (0.6 * out[0] + 0.8 * out[1]).to(dtype)  # the texts lean to their images
    return out


def _run(loss_fn, image, text, scale, bias, *, output_dict=False):
    """(loss, {image, text, scale, bias: gradient}) of one call on fresh leaves."""
    image, text = image.clone().requires_grad_(), text.clone().requires_grad_()
    leaves = {"image": image, "text": text}
    if isinstance(scale, torch.Tensor):
        scale = leaves["scale"] = scale.clone().requires_grad_()
    if isinstance(bias, torch.Tensor):
        bias = leaves["bias"] = bias.clone().requires_grad_()
    out = loss_fn(image, text, scale, bias, output_dict=output_dict)
    if output_dict:
        assert isinstance(out, dict) and list(out) == ["contrastive_loss"]
        out = out["contrastive_loss"]
    assert isinstance(out, torch.Tensor) and out.dim() == 0
    out.backward()
    return out.detach(), {key: leaf.grad for key, leaf in leaves.items()}


def _tolerance(dtype, scale, image, text):
    """Each logit ``scale * <image_i, text_j>`` is a sum of ``d`` products, rounded by the peer
    and by contrastkit (who also divides by ``1 / |scale|``) to at most ``d * eps * |scale| *
    |image_i| |text_j|`` each; the loss and its gradients inherit the error of their largest
    logits, plus a few ``eps`` of their own."""
    eps = torch.finfo(dtype).eps
    bound = abs(float(scale)) * float(image.norm(dim=1).max()) * float(text.norm(dim=1).max())
    return 4 * eps * (1 + image.shape[1] * bound)


def _assert_same(theirs, ours, tol, features):
    """Values to ``tol`` (absolute, and relative for large losses); gradients to ``tol`` times
    what a logit's error moves them by (the features' norms and ``|scale|``)."""
    (their_value, their_grads), (our_value, our_grads) = theirs, ours
    assert torch.isfinite(their_value)
    assert abs(float(our_value) - float(their_value)) <= tol * (1 + abs(float(their_value))), \
        (float(our_value), float(their_value))
    assert set(our_grads) == set(their_grads)
    reach = 1 + max(float(f.norm(dim=1).max()) for f in features)
    for key, their_grad in their_grads.items():
        our_grad = our_grads[key]
        assert our_grad is not None, key
        assert our_grad.dtype == their_grad.dtype and our_grad.shape == their_grad.shape, key
        size = float(their_grad.abs().max()) if their_grad.numel() else 0.0
        torch.testing.assert_close(our_grad, their_grad, rtol=tol, atol=tol * reach * (1 + size), msg=key)


SCALES = [CLIP_SCALE, 100.0, 1.0, 0.5, -3.0, 0.0]  # open_clip's initial and largest, small, negative, 0


# --------------------------------------------------------------------------- signatures


@pytest.mark.parametrize("kind", KINDS)
def test_the_signatures_and_defaults_are_the_peers(kind):
    for method in ("__init__", "forward"):
        ours = inspect.signature(getattr(getattr(compat, kind), method)).parameters
        theirs = inspect.signature(getattr(getattr(peer, kind), method)).parameters
        assert list(ours) == list(theirs), (kind, method)
        for name, parameter in theirs.items():
            assert ours[name].kind == parameter.kind, (kind, method, name)
            assert ours[name].default == parameter.default, (kind, method, name)
    for option in inspect.signature(getattr(peer, kind).__init__).parameters:  # the peer's attributes
        if option != "self":
            assert hasattr(getattr(compat, kind)(), option), option


# --------------------------------------------------------------------------- one process


SIZES = [(1, 4), (2, 3), (7, 16), (64, 32)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("scale", SCALES, ids=lambda s: f"scale={s:.4g}")
def test_values_and_gradients_equal_the_peer(kind, dtype, scale):
    for n, d in SIZES:
        image, text = _features(n, d, dtype, seed=n + d)
        tol = _tolerance(dtype, scale, image, text)
        for bias in (None, torch.tensor(-2.5, dtype=dtype)):
            for output_dict in (False, True):
                args = (image, text, torch.tensor(scale, dtype=dtype), bias)
                theirs = _run(getattr(peer, kind)(), *args, output_dict=output_dict)
                with warnings.catch_warnings():  # none, as from the peer (one pair included)
                    warnings.simplefilter("error")
                    ours = _run(getattr(compat, kind)(), *args, output_dict=output_dict)
                _assert_same(theirs, ours, tol, (image, text))
                assert ours[0].dtype == dtype
        if kind == "ClipLoss" and n == 1:  # one pair: no negative, a loss of 0 as in the peer
            assert float(ours[0]) == 0.0


@pytest.mark.parametrize("kind", KINDS)
def test_a_python_float_and_a_one_element_logit_scale_equal_the_peer(kind):
    image, text = _features(9, 6, torch.float64, seed=3)
    tol = _tolerance(torch.float64, 20.0, image, text)
    one = torch.ones(1, dtype=torch.float64)
    for scale, bias in ((20.0, -1.0), (20.0 * one, -1.0 * one)):  # open_clip's nonscalar_logit_scale: (1,)
        theirs = _run(getattr(peer, kind)(), image, text, scale, bias)
        ours = _run(getattr(compat, kind)(), image, text, scale, bias)
        _assert_same(theirs, ours, tol, (image, text))


@pytest.mark.parametrize("kind", KINDS)
def test_a_batch_above_the_dense_size_takes_the_tiled_path_and_equals_the_peer(kind):
    n, d = 1100, 8
    assert use_tiled(n, n, None) is not None  # contrastkit tiles this batch
    image, text = _features(n, d, torch.float64, seed=11)
    args = (image, text, torch.tensor(30.0, dtype=torch.float64), torch.tensor(-4.0, dtype=torch.float64))
    theirs = _run(getattr(peer, kind)(), *args)
    ours = _run(getattr(compat, kind)(), *args)
    _assert_same(theirs, ours, _tolerance(torch.float64, 30.0, image, text), (image, text))


def test_the_clip_bias_changes_nothing_and_stays_connected():
    image, text = _features(6, 5, torch.float64, seed=4)
    scale = torch.tensor(5.0, dtype=torch.float64)
    (without, _), (with_bias, grads) = (_run(compat.ClipLoss(), image, text, scale, bias)
                                        for bias in (None, torch.tensor(3.0, dtype=torch.float64)))
    assert float(with_bias) == float(without)
    assert grads["bias"] is not None and float(grads["bias"]) == 0.0
    _, their_grads = _run(peer.ClipLoss(), image, text, scale, torch.tensor(3.0, dtype=torch.float64))
    assert abs(float(their_grads["bias"])) < 1e-12  # the peer's: 0 up to rounding


@pytest.mark.parametrize("kind", KINDS)
def test_gradcheck_with_scale_and_bias(kind):
    image, text = _features(5, 3, torch.float64, seed=6)
    for scale in (2.5, -1.5, 0.0):
        inputs = (image.clone().requires_grad_(), text.clone().requires_grad_(),
                  torch.tensor(scale, dtype=torch.float64, requires_grad=True),
                  torch.tensor(-0.7, dtype=torch.float64, requires_grad=True))
        assert torch.autograd.gradcheck(getattr(compat, kind)(), inputs)


@pytest.mark.parametrize("kind", KINDS)
def test_features_that_do_not_pair_are_refused_as_by_the_peer(kind):
    scale, bias = torch.tensor(10.0), torch.tensor(-1.0)
    for image, text in ((torch.randn(5, 4), torch.randn(3, 4)), (torch.randn(4, 5), torch.randn(4, 3)),
                        (torch.randn(4, 3), torch.randn(4, 3, dtype=torch.float64))):
        with pytest.raises((RuntimeError, IndexError)):  # the peer's matmul or cross_entropy
            getattr(peer, kind)()(image, text, scale, bias)
        with pytest.raises((ValueError, TypeError), match="text_features"):
            getattr(compat, kind)()(image, text, scale, bias)


def test_bad_input_and_unsupported_options_are_refused_by_name():
    with pytest.raises(ValueError, match="use_horovod=True"):
        compat.ClipLoss(use_horovod=True)
    with pytest.raises(ValueError, match="dist_impl"):
        compat.SigLipLoss(dist_impl="ring")
    with pytest.raises(AssertionError):  # the peer's own refusal of it
        peer.SigLipLoss(dist_impl="ring")
    image, text = torch.randn(4, 3), torch.randn(4, 3)
    for kind in KINDS:
        bad = image.clone()
        bad[1, 2] = math.nan
        with pytest.raises(ValueError, match="image_features contains 1 NaN"):
            getattr(compat, kind)()(bad, text, 10.0, -1.0)
        with pytest.raises(ValueError, match="logit_scale must be a single number"):
            getattr(compat, kind)()(image, text, torch.ones(4), -1.0)
        with pytest.raises(ValueError, match="logit_scale must be finite"):
            getattr(compat, kind)()(image, text, torch.tensor(math.inf), -1.0)
        with pytest.raises(ValueError, match="logit_bias must be finite"):
            getattr(compat, kind)()(image, text, 10.0, torch.tensor(math.nan))
        with pytest.raises(ValueError, match=r"world_size=2\) needs an initialised torch.distributed"):
            getattr(compat, kind)(rank=0, world_size=2)(image, text, 10.0, -1.0)


# --------------------------------------------------------------------------- training step


class _TinyClip(nn.Module):
    """Two small towers with L2-normalised outputs and open_clip's learnable ``logit_scale``
    (and, for SigLIP, ``logit_bias``); forward returns open_clip's output dict."""

    def __init__(self, init_logit_scale, init_logit_bias=None):
        super().__init__()
        torch.manual_seed(0)
        self.visual = nn.Sequential(nn.Linear(12, 16), nn.GELU(), nn.Linear(16, 8))
        self.text = nn.Sequential(nn.Linear(10, 16), nn.GELU(), nn.Linear(16, 8))
        self.logit_scale = nn.Parameter(torch.ones([]) * init_logit_scale)
        self.logit_bias = None if init_logit_bias is None else nn.Parameter(torch.ones([]) * init_logit_bias)

    def forward(self, images, texts):
        out = {"image_features": nn.functional.normalize(self.visual(images), dim=-1),
               "text_features": nn.functional.normalize(self.text(texts), dim=-1),
               "logit_scale": self.logit_scale.exp()}
        if self.logit_bias is not None:
            out["logit_bias"] = self.logit_bias
        return out


def _train_step(loss_module, model_options):
    """open_clip_train's step: ``losses = loss(**model_out, output_dict=True)``, their sum
    backward, AdamW, then the clamp of ``logit_scale`` to [0, log 100]."""
    model = _TinyClip(**model_options)
    g = torch.Generator().manual_seed(1)
    images, texts = torch.randn(24, 12, generator=g), torch.randn(24, 10, generator=g)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    loss = loss_module(rank=0, world_size=1)
    values = []
    for _ in range(3):
        losses = loss(**model(images, texts), output_dict=True)
        total_loss = sum(losses.values())
        optimizer.zero_grad()
        total_loss.backward()
        optimizer.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(100))
        values.append(float(total_loss.detach()))
    return values, {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("kind, model_options", [("ClipLoss", {"init_logit_scale": math.log(1 / 0.07)}),
                                                  ("SigLipLoss", {"init_logit_scale": math.log(10),
                                                                  "init_logit_bias": -10.0})])
def test_open_clips_training_step_runs_unchanged_with_the_import_swapped(kind, model_options):
    their_values, theirs = _train_step(getattr(peer, kind), model_options)
    our_values, ours = _train_step(getattr(compat, kind), model_options)
    initial = dict(_TinyClip(**model_options).named_parameters())
    assert set(ours) == set(theirs)
    for name, their_parameter in theirs.items():
        assert not torch.equal(their_parameter, initial[name]), name  # every parameter moved
        # AdamW moves each entry by about lr * sign(gradient) in its first steps, whatever the
        # gradient's size: float32 rounding in the gradients changes the last bits of the steps
        # (1e-5 is 1e-3 of lr), a gradient of the wrong sign would change a step by 2 * lr.
        torch.testing.assert_close(ours[name], their_parameter, rtol=1e-5, atol=1e-5, msg=name)
    assert our_values == pytest.approx(their_values, rel=1e-5)


# --------------------------------------------------------------------------- two processes

RANKS = 2
ROWS = 4  # per rank
DIST_SCALES = (CLIP_SCALE, -2.0)
CLIP_MODES = [(local, with_grad) for local in (False, True) for with_grad in (False, True)]


def _distributed_worker(rank, world, seed):
    """Every distributed option of both losses, the peer's and ours, on this rank's features:
    ``{case: (their (loss, grads), our (loss, grads))}``, the values of uneven batches, and the
    errors a bad input on rank 1 raises on each rank."""
    results, uneven, errors = {}, {}, {}
    for dtype in (torch.float64, torch.float32):
        image, text = _features(ROWS, 6, dtype, seed, rank)
        for scale in DIST_SCALES:
            args = (image, text, torch.tensor(scale, dtype=dtype))
            for local, with_grad in CLIP_MODES:
                options = dict(local_loss=local, gather_with_grad=with_grad, rank=rank, world_size=world)
                for bias in (None, torch.tensor(1.5, dtype=dtype)):
                    results[("ClipLoss", dtype, scale, local, with_grad, bias is not None)] = tuple(
                        _run(module.ClipLoss(**options), *args, bias, output_dict=bias is not None)
                        for module in (peer, compat))
            for impl in (None, "bidir", "shift", "reduce", "gather"):
                options = dict(rank=rank, world_size=world, dist_impl=impl)
                results[("SigLipLoss", dtype, scale, impl)] = tuple(
                    _run(module.SigLipLoss(**options), *args, torch.tensor(-3.0, dtype=dtype))
                    for module in (peer, compat))
    # A logit_scale of exactly 0: ClipLoss's per-rank scale gradients are compared through their
    # mean (the module's description), SigLipLoss's as they are.
    image, text = _features(ROWS, 6, torch.float64, seed, rank)
    for local, with_grad in CLIP_MODES:
        options = dict(local_loss=local, gather_with_grad=with_grad, rank=rank, world_size=world)
        results[("ClipLoss-zero", local, with_grad)] = tuple(
            _run(module.ClipLoss(**options), image, text, torch.tensor(0.0, dtype=torch.float64), None)
            for module in (peer, compat))
    results[("SigLipLoss-zero",)] = tuple(
        _run(module.SigLipLoss(rank=rank, world_size=world), image, text, torch.tensor(0.0, dtype=torch.float64),
             torch.tensor(-1.0, dtype=torch.float64)) for module in (peer, compat))
    # A batch above the dense size on each rank: contrastkit's tiled paths (the ring for
    # local_loss=True and for SigLIP).
    image, text = _features(800, 4, torch.float64, seed + 1, rank)
    args = (image, text, torch.tensor(20.0, dtype=torch.float64))
    for local, with_grad in ((False, True), (True, True)):
        options = dict(local_loss=local, gather_with_grad=with_grad, rank=rank, world_size=world)
        results[("ClipLoss-tiled", local, with_grad)] = tuple(
            _run(module.ClipLoss(**options), *args, None) for module in (peer, compat))
    results[("SigLipLoss-tiled",)] = tuple(
        _run(module.SigLipLoss(rank=rank, world_size=world), *args, torch.tensor(-5.0, dtype=torch.float64))
        for module in (peer, compat))
    # Uneven row counts (the peer cannot): our value only.
    image, text = _features(3 + 2 * rank, 6, torch.float64, seed + 2, rank)
    for local, with_grad in CLIP_MODES:
        loss = compat.ClipLoss(local_loss=local, gather_with_grad=with_grad, rank=rank, world_size=world)
        uneven[("ClipLoss", local, with_grad)] = loss(image, text, torch.tensor(7.0, dtype=torch.float64)).detach()
    uneven[("SigLipLoss",)] = compat.SigLipLoss(rank=rank, world_size=world)(
        image, text, torch.tensor(7.0, dtype=torch.float64), torch.tensor(-2.0, dtype=torch.float64)).detach()
    # A NaN in rank 1's features: every rank raises (none waits for it).
    image, text = _features(ROWS, 6, torch.float64, seed, rank)
    if rank == 1:
        image = image.clone()
        image[0, 0] = math.nan
    for name, loss in (("global", compat.ClipLoss(rank=rank, world_size=world)),
                       ("local", compat.ClipLoss(local_loss=True, rank=rank, world_size=world)),
                       ("local-with-grad", compat.ClipLoss(local_loss=True, gather_with_grad=True, rank=rank,
                                                           world_size=world)),
                       ("siglip", compat.SigLipLoss(rank=rank, world_size=world))):
        try:
            loss(image, text, 10.0, -1.0)
            errors[name] = None
        except ValueError as error:
            errors[name] = str(error)
    # rank and world_size that are not the process group's.
    for name, loss in (("wrong-rank", compat.ClipLoss(rank=world - 1 - rank, world_size=world)),
                       ("wrong-world", compat.SigLipLoss(rank=rank, world_size=world + 1))):
        try:
            loss(image, text, 10.0, -1.0)
            errors[name] = None
        except ValueError as error:
            errors[name] = str(error)
    return {"results": results, "uneven": uneven, "errors": errors}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """One spawned run of :func:`_distributed_worker` on 2 gloo processes."""
    import distributed_workers as W

    return W.spawn(_distributed_worker, RANKS, tmp_path_factory.mktemp("open_clip"), 5)


def _global_batch(seed, sizes, d=6, dtype=torch.float64):
    parts = [_features(n, d, dtype, seed, rank) for rank, n in enumerate(sizes)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def _case_inputs(case):
    """``(dtype, logit_scale, global image and text features)`` of a case of the worker."""
    if case[0] in KINDS:
        return case[1], case[2], _global_batch(5, [ROWS] * RANKS, 6, case[1])
    if case[0] in ("ClipLoss-zero", "SigLipLoss-zero"):
        return torch.float64, 0.0, _global_batch(5, [ROWS] * RANKS)
    return torch.float64, 20.0, _global_batch(6, [800] * RANKS, 4)  # the tiled cases


def test_two_processes_every_distributed_option_equals_the_peer_on_each_rank(two_ranks):
    cases = two_ranks[0]["results"].keys()
    assert len(cases) == 2 * 2 * (4 * 2 + 5) + 4 + 1 + 3
    for case in cases:
        dtype, scale, (image, text) = _case_inputs(case)
        tol = _tolerance(dtype, scale, image, text)
        for rank, found in enumerate(two_ranks):
            theirs, ours = found["results"][case]
            if case[0] == "ClipLoss-zero":  # logit_scale's gradient: per rank only its mean (below)
                theirs, ours = [(value, {k: v for k, v in grads.items() if k != "scale"})
                                for value, grads in (theirs, ours)]
            try:
                _assert_same(theirs, ours, tol, (image, text))
            except AssertionError as error:
                raise AssertionError(f"{case}, rank {rank}: {error}") from None
    for local, with_grad in CLIP_MODES:
        theirs, ours = (sum(found["results"][("ClipLoss-zero", local, with_grad)][who][1]["scale"]
                            for found in two_ranks) for who in (0, 1))
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


def test_two_processes_the_options_differ_where_the_peer_says_they_do(two_ranks):
    """The comparisons above have teeth: gather_with_grad changes the peer's feature gradients
    (by 1 / world_size in the global loss), local_loss changes its value."""
    results = two_ranks[0]["results"]
    key = ("ClipLoss", torch.float64, CLIP_SCALE)
    without, with_grad = (results[key + (False, g, False)][0] for g in (False, True))
    assert float(without[0]) == float(with_grad[0])
    torch.testing.assert_close(with_grad[1]["image"], RANKS * without[1]["image"], rtol=1e-12, atol=1e-14)
    assert not torch.allclose(results[key + (True, True, False)][0][1]["image"],
                              results[key + (True, False, False)][0][1]["image"])
    assert abs(float(results[key + (True, True, False)][0][0]) - float(with_grad[0])) > 1e-3


def test_two_processes_uneven_batches_give_shares_whose_mean_is_the_global_loss(two_ranks):
    image, text = _global_batch(7, [3 + 2 * rank for rank in range(RANKS)])
    scale = torch.tensor(7.0, dtype=torch.float64)
    reference = {"ClipLoss": float(compat.ClipLoss()(image, text, scale)),
                 "SigLipLoss": float(compat.SigLipLoss()(image, text, scale, torch.tensor(-2.0, dtype=torch.float64)))}
    for case in two_ranks[0]["uneven"]:
        values = [float(found["uneven"][case]) for found in two_ranks]
        if case[0] == "ClipLoss" and not case[1]:  # global loss: every rank returns it
            assert values == pytest.approx([reference["ClipLoss"]] * RANKS, rel=1e-12), case
        else:
            assert sum(values) / RANKS == pytest.approx(reference[case[0]], rel=1e-12), case


def test_two_processes_a_bad_input_on_one_rank_is_raised_on_every_rank(two_ranks):
    for rank, found in enumerate(two_ranks):
        wrong_rank = found["errors"].pop("wrong-rank")
        assert f"ClipLoss(rank={RANKS - 1 - rank}, world_size={RANKS}) does not match" in wrong_rank
        assert f"SigLipLoss(rank={rank}, world_size={RANKS + 1}) does not match" in found["errors"].pop("wrong-world")
    assert set(two_ranks[0]["errors"]) == {"global", "local", "local-with-grad", "siglip"}
    for name in two_ranks[0]["errors"]:
        assert "image_features contains 1 NaN" in two_ranks[1]["errors"][name], name
        assert "another rank failed validation" in two_ranks[0]["errors"][name], name

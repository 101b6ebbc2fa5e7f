"""Cached-gradient accumulation (``contrastkit.methods.accumulation``, ``pretrain --micro-batch``):
the gradients equal the single big batch where no layer has batch statistics (float64, every
method), the replay of random layers, BatchNorm's difference, and the bad inputs."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn

from contrastkit import losses
from contrastkit.cli import main
from contrastkit.models import ProjectionHead, SmallCNN, build_encoder
from contrastkit.models.text import WordTokenizer
from contrastkit.train import METHOD_REGISTRY, PretrainConfig, cached_gradient_loss, get_method, pretrain
from contrastkit.methods.convirt import ConvirtModel
from contrastkit.methods import SiglipModel
from contrastkit.methods import ContrastiveModel, resolve_for_data

TOL = dict(rtol=1e-9, atol=1e-9)  # float64; the issue asks for 1e-6
B, M = 8, 2
TWO_VIEW = [name for name, method in METHOD_REGISTRY.items() if not method.paired]
PAIRED_METHODS = [name for name, method in METHOD_REGISTRY.items() if method.paired]


def _views(seed: int = 0, n: int = B, size: int = 12):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, size, size, generator=g, dtype=torch.float64)
    return x, (x + 0.1 * torch.randn(x.shape, generator=g, dtype=torch.float64)).clamp(0, 1)


def _labels(n: int = B) -> torch.Tensor:
    return torch.arange(n) % 3


def _two_view_model(name: str, norm=None) -> ContrastiveModel:
    torch.manual_seed(0)
    model = ContrastiveModel(name, "small", 1, temperature=0.3, learnable_temperature=name != "simple",
                             projection_dim=8, queue_size=2 * B if name == "moco" else None, norm=norm)
    return model.double().train()


def _grads(model: nn.Module) -> dict:
    return {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}


def _plain(model, method, batch, labels):
    model.zero_grad(set_to_none=True)
    loss = method.loss(model, batch, labels)
    loss.backward()
    return loss.detach(), _grads(model)


def _accumulated(model, method, batch, labels, m=M):
    model.zero_grad(set_to_none=True)
    loss = method.cached_gradient_loss(model, batch, labels, m)
    return loss, _grads(model)


def _assert_same(a: dict, b: dict, **tol) -> None:
    assert set(a) == set(b) and a
    for key in a:
        torch.testing.assert_close(a[key], b[key], **(tol or TOL), msg=key)


@pytest.mark.parametrize("name", TWO_VIEW)
def test_group_norm_gradients_equal_the_full_batch_for_every_two_view_method(name):
    method = get_method(name)
    model = _two_view_model(name, norm="group")
    twin = copy.deepcopy(model)  # MoCo's queue and key network move with each step
    batch, labels = _views(), _labels()
    loss, grads = _plain(model, method, batch, labels)
    loss_m, grads_m = _accumulated(twin, method, batch, labels)
    torch.testing.assert_close(loss_m, loss, **TOL)
    _assert_same(grads_m, grads)
    if name != "simple":
        assert any("temperature" in k for k in grads_m)  # the learnable tau's gradient, from step 2
    for (key, state), state_m in zip(model.state_dict().items(), twin.state_dict().values()):
        torch.testing.assert_close(state_m, state, **TOL, msg=key)  # MoCo: key network and queue too


@pytest.mark.parametrize("name", PAIRED_METHODS)
def test_paired_gradients_equal_the_full_batch(name):
    from contrastkit.models.text import PAD, UNK

    tokenizer = WordTokenizer([PAD, UNK, "red", "blue", "square", "circle", "big"], max_length=6)
    torch.manual_seed(0)
    model_class = ConvirtModel if name == "convirt" else SiglipModel  # siglip also trains its bias
    model = model_class("small", 1, tokenizer, learnable_temperature=True, projection_dim=8,
                        text_encoder="transformer", text_width=16, norm="group").double().train()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, len(tokenizer), (B, 5), generator=g)
    mask = torch.rand(B, 5, generator=g) > 0.3
    mask[:, 0] = True
    batch = (_views()[0], (ids, mask))
    method = get_method(name)
    loss, grads = _plain(model, method, batch, None)
    loss_m, grads_m = _accumulated(model, method, batch, None)
    torch.testing.assert_close(loss_m, loss, **TOL)
    _assert_same(grads_m, grads)


@pytest.mark.parametrize("name", ["simclr", "moco"])
def test_batch_norm_one_micro_batch_is_the_plain_step_and_running_statistics_count_once(name):
    method = get_method(name)
    model = _two_view_model(name)
    twin = copy.deepcopy(model)
    batch = _views()
    loss, grads = _plain(model, method, batch, None)
    loss_m, grads_m = _accumulated(twin, method, batch, None, m=B)
    torch.testing.assert_close(loss_m, loss, **TOL)
    _assert_same(grads_m, grads)
    for (key, buffer), buffer_m in zip(model.named_buffers(), twin.buffers()):
        torch.testing.assert_close(buffer_m, buffer, **TOL, msg=key)  # the replay did not count


def test_batch_norm_in_train_mode_sees_micro_batches():
    """The documented difference: BatchNorm normalises each micro-batch by its own statistics."""
    method = get_method("simclr")
    model = _two_view_model("simclr")
    batch = _views()
    _, grads = _plain(model, method, batch, None)
    _, grads_m = _accumulated(model, method, batch, None)
    gap = max(float((grads[k] - grads_m[k]).abs().max()) for k in grads)
    assert gap > 1e-4
    model.eval()  # running statistics: no batch dependence, exact again
    _, grads = _plain(model, method, batch, None)
    _, grads_m = _accumulated(model, method, batch, None)
    _assert_same(grads_m, grads)


class _DropoutTower(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 4))

    def forward(self, x):
        return self.net(x)


def test_dropout_replays_identically_in_the_second_pass():
    """Reference: the same micro-batches embedded once with a graph (the same dropout masks),
    the loss on their concatenation; the replay must reproduce those masks."""
    torch.manual_seed(0)
    tower = _DropoutTower().double()
    tau = losses.Temperature(0.5, learnable=True).double()
    x = torch.randn(B, 5, dtype=torch.float64)
    y = x + 0.1 * torch.randn(B, 5, dtype=torch.float64)
    params = list(tower.parameters()) + list(tau.parameters())

    def embed(part):
        return tower(part[0]), tower(part[1])

    def loss_of(z):
        return losses.nt_xent_views(z[0], z[1], temperature=tau)

    torch.manual_seed(5)
    blocks = [embed((x[i:i + M], y[i:i + M])) for i in range(0, B, M)]
    reference = loss_of((torch.cat([b[0] for b in blocks]), torch.cat([b[1] for b in blocks])))
    expected = torch.autograd.grad(reference, params)
    after_reference = torch.get_rng_state()

    torch.manual_seed(5)
    value = cached_gradient_loss(embed, loss_of, (x, y), M)
    torch.testing.assert_close(value, reference.detach(), **TOL)
    for p, g in zip(params, expected):
        torch.testing.assert_close(p.grad, g, **TOL)
    assert torch.equal(torch.get_rng_state(), after_reference)  # the replay drew nothing of its own


def test_helper_takes_a_single_tensor_and_any_nesting():
    encoder = nn.Linear(3, 2).double()
    x = torch.randn(6, 3, dtype=torch.float64)
    value = cached_gradient_loss(encoder, lambda z: z.pow(2).sum(), x, 3)
    expected = torch.autograd.grad(encoder(x).pow(2).sum(), encoder.weight)[0]
    torch.testing.assert_close(encoder.weight.grad, expected, **TOL)
    torch.testing.assert_close(value, encoder(x).pow(2).sum().detach(), **TOL)
    encoder.zero_grad()
    batch = {"a": [x], "b": (x * 2, "not a tensor")}
    cached_gradient_loss(lambda p: (encoder(p["a"][0]), encoder(p["b"][0])),
                         lambda z: (z[0] * z[1]).sum(), batch, 2)
    expected = torch.autograd.grad((encoder(x) * encoder(2 * x)).sum(), encoder.weight)[0]
    torch.testing.assert_close(encoder.weight.grad, expected, **TOL)


def test_group_norm_option_removes_the_batch_dependence_and_keeps_the_default():
    x = torch.randn(6, 3, 16, 16)
    for encoder in (SmallCNN(3, norm="group"), build_encoder("resnet18", 3, norm="group")):
        encoder.train()
        assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in encoder.modules())
        torch.testing.assert_close(encoder(x)[:2], encoder(x[:2]), rtol=1e-5, atol=1e-5)
    head = ProjectionHead(8, 16, 4, norm="group")
    assert any(isinstance(m, nn.LayerNorm) for m in head.modules())
    # The default is unchanged: BatchNorm, the same state-dict keys as before the option.
    default = SmallCNN(3)
    assert sum(isinstance(m, nn.BatchNorm2d) for m in default.modules()) == 4
    assert set(default.state_dict()) == set(SmallCNN(3, norm="batch").state_dict())
    with pytest.raises(ValueError, match="norm must be one of"):
        SmallCNN(3, norm="layer")


# -- bad input -----------------------------------------------------------------------------

@pytest.mark.parametrize("m, message", [(16, "must be at most the batch"), (3, "must divide the batch"),
                                        (0, "must be an integer >= 1")])
def test_helper_refuses_a_micro_batch_out_of_range(m, message):
    encoder = nn.Linear(3, 2)
    with pytest.raises(ValueError, match=message):
        cached_gradient_loss(encoder, lambda z: z.sum(), torch.randn(8, 3), m)
    assert encoder.weight.grad is None


def test_helper_refuses_embeddings_that_are_not_per_row():
    with pytest.raises(ValueError, match="one row per row of the micro-batch"):
        cached_gradient_loss(lambda x: x.sum(0, keepdim=True), lambda z: z.sum(), torch.randn(8, 3), 4)
    with pytest.raises(TypeError, match="embed must return a tensor"):
        cached_gradient_loss(lambda x: [x], lambda z: z.sum(), torch.randn(8, 3), 4)


class _Drifting(nn.Module):
    """Keeps state between calls: its second pass over a micro-batch differs from the first."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 2)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.linear(x) + self.calls


class _NumpyNoise(nn.Module):
    """Draws its noise from numpy's generator, which the replay does not restore."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 2)

    def forward(self, x):
        import numpy as np

        return self.linear(x) + torch.as_tensor(np.random.rand(*x.shape[:1], 2), dtype=x.dtype)


@pytest.mark.parametrize("encoder", [_Drifting(), _NumpyNoise()], ids=["stateful", "numpy-random"])
def test_a_non_deterministic_encoder_is_detected_before_its_gradient_is_applied(encoder):
    with pytest.raises(ValueError, match=r"the encoder is not deterministic: output 0 of micro-batch 0 \(rows 0-3\)"):
        cached_gradient_loss(encoder, lambda z: z.pow(2).sum(), torch.randn(8, 3), 4)
    assert encoder.linear.weight.grad is None


def test_config_refuses_bad_micro_batches_and_methods_that_do_not_opt_in(monkeypatch):
    with pytest.raises(ValueError, match=r"micro_batch \(7\) must divide the batch size \(60\)"):
        PretrainConfig(micro_batch=7, batch_size=60).resolved()
    with pytest.raises(ValueError, match=r"micro_batch \(120\) must be at most the batch size \(60\)"):
        PretrainConfig(micro_batch=120, batch_size=60).resolved()
    monkeypatch.setenv("WORLD_SIZE", "2")  # under torchrun: this process's share of the batch
    with pytest.raises(ValueError, match=r"divide this process's share of the batch under torchrun \(30 of 60\)"):
        PretrainConfig(micro_batch=20, batch_size=60).resolved()
    monkeypatch.delenv("WORLD_SIZE")
    assert PretrainConfig(micro_batch=20, batch_size=60).resolved().micro_batch == 20
    # Without a batch size the data choose it: the micro-batch is checked against that choice.
    unsized = PretrainConfig(micro_batch=7).resolved()
    with pytest.raises(ValueError, match=r"micro_batch \(7\) must divide the batch size \(60\), chosen for 120 "
                                         r"training images.*--batch-size sets it"):
        resolve_for_data(unsized, 120)
    with pytest.raises(ValueError, match=r"torchrun \(30 of 60\), chosen for 120 training images"):
        resolve_for_data(PretrainConfig(micro_batch=20).resolved(), 120, world_size=2)
    assert resolve_for_data(PretrainConfig(micro_batch=32).resolved(), 60_000)[0].batch_size == 256
    assert PretrainConfig(norm="batch").resolved().norm is None  # what runs before the option stored
    monkeypatch.setattr(type(get_method("simclr")), "cached_gradients", False)
    with pytest.raises(ValueError, match="method 'simclr' does not take --micro-batch"):
        PretrainConfig(micro_batch=20).resolved()


def test_every_registered_method_takes_micro_batches():
    """simple and hard_negative too: their losses take the in-batch negatives (docs/accumulation.md)."""
    assert all(method.cached_gradients for method in METHOD_REGISTRY.values())


def test_cli_bad_micro_batch_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    out = str(tmp_path / "run")
    for option, message in (("7", "must divide the batch size (60)"), ("64", "must be at most the batch size (60)")):
        assert main(["pretrain", "--micro-batch", option, "--epochs", "1", "--out", out, "--quiet"]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1
    monkeypatch.setattr(type(get_method("dcl")), "cached_gradients", False)
    assert main(["pretrain", "--method", "dcl", "--micro-batch", "30", "--out", out, "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "does not take --micro-batch" in err and len(err.splitlines()) == 1


TINY = dict(data="glyphlab", data_options={"train_scenes": 16, "val_scenes": 9, "test_scenes": 12, "size": 28},
            epochs=1, batch_size=8, device="cpu", log_every=1, eval_every=0, norm="group")


def _final_weights(out):
    return torch.load(out / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)["model"]


@pytest.mark.parametrize("method", ["simclr", "moco"])
def test_pretrain_micro_batch_trains_like_the_full_batch(tmp_path, method):
    runs = {}
    for m in (None, 2):
        out = tmp_path / f"m{m}"
        summary = pretrain(PretrainConfig(method=method, out=str(out), micro_batch=m, **TINY), progress=False,
                           baselines=False)
        with open(out / "metrics.jsonl", encoding="utf-8") as handle:
            steps = [r["loss"] for r in map(json.loads, handle) if r["kind"] == "step"]
        runs[m] = summary, steps, _final_weights(out)
    (plain, steps, weights), (_, steps_m, weights_m) = runs[None], runs[2]
    assert len(steps) == 2
    assert steps_m == pytest.approx(steps, rel=1e-5, abs=1e-6)
    # float32 rounding, amplified where Adam divides a near-zero gradient by its norm: a real
    # difference moves the weights by about lr (2e-3) per step
    for key in weights:
        torch.testing.assert_close(weights_m[key], weights[key], rtol=1e-4, atol=2e-4, msg=key)
    with open(tmp_path / "m2" / "config.json", encoding="utf-8") as handle:
        assert json.load(handle)["config"]["micro_batch"] == 2

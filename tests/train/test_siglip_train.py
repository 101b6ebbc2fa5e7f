"""``--method siglip``: SigLIP's sigmoid loss on image-text pairs in the pretraining pipeline
(its model against a float64 reference, configuration, a tiny end-to-end run with retrieval
above chance, exact resume, and two processes equal to one)."""

import json
import math
import os

import pytest
import torch

from contrastkit.cli import main
from contrastkit.train import PretrainConfig, pretrain
from contrastkit.methods import METHOD_REGISTRY, Siglip, SiglipModel

import siglip_train_workers as SW

# 192 training pairs, 8 epochs of 6 steps: enough for retrieval and zero-shot well above chance.
DATA = {"train_scenes": 192, "val_scenes": 24, "test_scenes": 48}
RUN = dict(method="siglip", data="glyphlab-text", data_options=DATA, batch_size=32, projection_dim=32,
           lr=5e-3, device="cpu", log_every=1)


def _reference_loss(v, u, tau, bias):
    """-(1/N) sum_ij log sigmoid(z_ij (<v_i, u_j> / tau + b)), in plain float64 Python."""
    v = [[x / math.sqrt(sum(y * y for y in row)) for x in row] for row in v.tolist()]
    u = [[x / math.sqrt(sum(y * y for y in row)) for x in row] for row in u.tolist()]
    total = 0.0
    for i, vi in enumerate(v):
        for j, uj in enumerate(u):
            logit = sum(a * b for a, b in zip(vi, uj)) / tau + bias
            z = 1.0 if i == j else -1.0
            total += math.log1p(math.exp(-z * logit))
    return total / len(v)


def test_model_starts_at_siglip_init_and_its_loss_is_the_sigmoid_loss():
    model, (images, tokens) = SW.model_and_batch()
    assert isinstance(METHOD_REGISTRY["siglip"], Siglip)
    assert model.temperature.learnable and float(model.temperature.log_scale.detach()) == pytest.approx(math.log(10))
    assert float(model.bias.detach()) == -10.0 and model.bias.requires_grad
    with torch.no_grad():
        loss = model.loss(images, tokens)
        v, u = model.image_embeddings(images).double(), model.text_embeddings(*tokens).double()
    assert float(loss) == pytest.approx(_reference_loss(v, u, tau=0.1, bias=-10.0), rel=1e-5)
    loss = model.loss(images, tokens)
    loss.backward()
    assert model.bias.grad is not None and model.temperature.log_scale.grad is not None


def test_config_learnable_by_default_constant_fixes_tau_and_convirt_options_are_checked():
    c = PretrainConfig(method="siglip", data="glyphlab-text").resolved()
    assert (c.temperature, c.learnable_temperature, c.temperature_schedule) == (0.1, True, "learnable")
    assert c.weight is None and c.projection_dim == 512 and c.text_encoder == "mean" and c.views == "paired"
    c = PretrainConfig(method="siglip", data="glyphlab-text", temperature=0.05,
                       temperature_schedule="constant").resolved()
    assert (c.temperature, c.learnable_temperature) == (0.05, False)
    c = PretrainConfig(method="siglip", data="glyphlab-text", temperature_schedule="cosine:0.05,0.2").resolved()
    assert not c.learnable_temperature and c.temperature == 0.2
    # The other methods keep their constant default.
    assert PretrainConfig().resolved().temperature_schedule == "constant"
    with pytest.raises(ValueError, match="siglip needs paired data"):
        PretrainConfig(method="siglip", data="glyphlab").resolved()
    with pytest.raises(ValueError, match="does not apply to siglip"):
        PretrainConfig(method="siglip", data="glyphlab-text", weight=0.5).resolved()


def test_fixed_temperature_stays_fixed_and_bias_is_trained(tmp_path):
    out = str(tmp_path / "fixed")
    summary = pretrain(PretrainConfig(**{**RUN, "data_options": {**DATA, "train_scenes": 64}}, epochs=1,
                                      temperature=0.2, temperature_schedule="constant", out=out),
                       progress=False, baselines=False)
    assert summary["final_temperature"] == pytest.approx(0.2) and summary["temperature_schedule"] == "constant"
    state = torch.load(os.path.join(out, "checkpoints", "last.pt"), weights_only=False)["model"]
    assert float(state["bias"]) != -10.0


class _Stop(Exception):
    pass


def _stop_after_first_epoch(epoch, record):
    if epoch == 1:
        raise _Stop()


def test_tiny_end_to_end_run_beats_chance_and_resumes_exactly(tmp_path, capsys):
    straight, interrupted = str(tmp_path / "straight"), str(tmp_path / "interrupted")
    args = ["pretrain", "--method", "siglip", "--data", "glyphlab-text", "--batch-size", "32",
            "--projection-dim", "32", "--lr", "5e-3", "--epochs", "8", "--device", "cpu", "--quiet", "--json",
            "--no-report"] + [a for k, v in DATA.items() for a in ("--data-option", f"{k}={v}")]
    assert main(args + ["--out", straight]) == 0
    summary = json.loads(capsys.readouterr().out)
    for name in ("config.json", "metrics.jsonl", "summary.json", "tokenizer.json", "checkpoints/last.pt"):
        assert os.path.exists(os.path.join(straight, name)), name
    assert summary["method"] == "siglip" and summary["temperature_schedule"] == "learnable"
    assert summary["retrieval_pairs"] == 48
    # Retrieval and zero-shot well above chance (chance mean rank 24.5, R@5 5/48; zero-shot 1/3).
    for side in ("i2t", "t2i"):
        assert summary[f"retrieval_{side}_mean_rank"] < 0.7 * summary["retrieval_chance_mean_rank"], side
        assert summary[f"retrieval_{side}_recall@5"] > 1.5 * summary["retrieval_chance_recall@5"], side
    assert summary["zero_shot_accuracy"] > 2 * summary["zero_shot_chance"]
    # The logged temperature is tau = 1 / t, and it was trained.
    steps = [json.loads(line) for line in open(os.path.join(straight, "metrics.jsonl")) if '"step"' in line]
    taus = [r["tau"] for r in steps if r["kind"] == "step"]
    assert taus[0] != taus[-1] and summary["final_temperature"] == pytest.approx(taus[-1], rel=1e-6)

    # Interrupted after epoch 1 and resumed: the same weights (bias and scale included) as the straight run.
    config = PretrainConfig(**RUN, epochs=8, out=interrupted)
    with pytest.raises(_Stop):
        pretrain(config, progress=False, on_epoch_end=_stop_after_first_epoch)
    resumed = pretrain(config, resume=True, progress=False, baselines=False)  # its weights and loss are compared
    a = torch.load(os.path.join(straight, "checkpoints", "last.pt"), weights_only=False)["model"]
    b = torch.load(os.path.join(interrupted, "checkpoints", "last.pt"), weights_only=False)["model"]
    assert a.keys() == b.keys() and "bias" in a and "temperature.log_scale" in a
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert resumed["final_loss"] == summary["final_loss"]

    # `contrastkit probe` rebuilds the model and its tokenizer: the same retrieval.
    assert main(["probe", straight, "--no-baselines", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    for key in ("retrieval_i2t_recall@1", "retrieval_t2i_recall@10", "zero_shot_accuracy"):
        assert again[key] == pytest.approx(summary[key]), key


def test_two_processes_give_the_gradients_of_one(tmp_path):
    import distributed_workers as W

    results = W.spawn(SW.ddp_worker, 2, tmp_path)
    model, batch = SW.model_and_batch()
    loss = model.loss(*batch)
    loss.backward()
    expected = SW.gradients(model)
    assert sum(r["loss"] for r in results) / 2 == pytest.approx(float(loss.detach()), rel=1e-5)
    for r in results:
        assert r["grads"].keys() == expected.keys()
        for name, grad in expected.items():
            torch.testing.assert_close(r["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)

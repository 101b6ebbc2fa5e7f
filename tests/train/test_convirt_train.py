"""ConVIRT in the pretraining pipeline: the model's loss against a float64 reference, and a
tiny end-to-end run through ``contrastkit pretrain --method convirt`` (run folder, tokenizer,
summary, resume, refusal to overwrite)."""

import json
import os

import pytest
import torch

import reference
from contrastkit.cli import main
from contrastkit.data import load_paired
from contrastkit.models.text import WordTokenizer
from contrastkit.methods import PretrainConfig
from contrastkit.methods.convirt import ConvirtModel, PairedBatches, build_tokenizer

TINY = ["--data-option", "train_scenes=48", "--data-option", "val_scenes=24", "--data-option", "test_scenes=24"]


@pytest.mark.parametrize("weight", [0.0, 0.75, 1.0])
def test_model_loss_is_the_weighted_bidirectional_info_nce(weight):
    ds = load_paired("glyphlab-text", seed=1, train_scenes=8, val_scenes=3, test_scenes=3)
    tok = build_tokenizer(ds)
    torch.manual_seed(0)
    model = ConvirtModel("small", 1, tok, temperature=0.1, weight=weight, projection_dim=16).eval()
    torch.manual_seed(1)
    images, tokens = PairedBatches(tok, torch.device("cpu"))(ds.train, torch.arange(8))
    with torch.no_grad():
        loss = model.loss(images, tokens)
        v = reference.normalized(reference.rows(model.image_embeddings(images).double()))
        u = reference.normalized(reference.rows(model.text_embeddings(*tokens).double()))
    expected = reference.mean(reference.bidirectional(v, u, tau=0.1, weight=weight))
    assert float(loss) == pytest.approx(expected, rel=1e-5)


def test_paired_batches_draw_realisations_and_trim_padding():
    ds = load_paired("glyphlab-text", seed=1, train_scenes=6, val_scenes=3, test_scenes=3, realisations=3)
    tok = build_tokenizer(ds)
    images, (ids, mask) = PairedBatches(tok, torch.device("cpu"))(ds.train, torch.tensor([4, 1]))
    for row, index in enumerate([4, 1]):
        assert any(torch.equal(images[row], ds.train.realisations[index, r]) for r in range(3))
        assert tok.decode(ids[row]) == " ".join(WordTokenizer.tokenize(ds.train.texts[index]))
    assert mask.sum(1).max() == ids.shape[1]


def test_config_rejects_what_convirt_cannot_use():
    with pytest.raises(ValueError, match="convirt needs paired data"):
        PretrainConfig(method="convirt", data="glyphlab").resolved()
    with pytest.raises(ValueError, match=r"weight \(lambda\) must be a number in \[0, 1\]"):
        PretrainConfig(method="convirt", data="glyphlab-text", weight=1.5).resolved()
    with pytest.raises(ValueError, match="views 'B' does not apply"):
        PretrainConfig(method="convirt", data="glyphlab-text", views="B").resolved()
    with pytest.raises(ValueError, match="image-text methods only"):
        PretrainConfig(method="simclr", weight=0.5).resolved()
    c = PretrainConfig(method="convirt", data="glyphlab-text").resolved()
    assert (c.weight, c.temperature, c.projection_dim, c.text_encoder) == (0.75, 0.1, 512, "mean")
    assert PretrainConfig(method="simclr").resolved().projection_dim == 64


def test_tiny_end_to_end_run_resume_and_overwrite_guard(tmp_path, capsys):
    out = str(tmp_path / "run")
    args = ["pretrain", "--method", "convirt", "--data", "glyphlab-text", *TINY, "--batch-size", "16",
            "--projection-dim", "32", "--text-encoder", "transformer", "--weight", "0.25", "--out", out, "--quiet",
            "--no-report"]  # not judged here (a report that fails is a warning, not an error)
    assert main(args + ["--epochs", "1"]) == 0
    capsys.readouterr()
    for name in ("config.json", "metrics.jsonl", "summary.json", "tokenizer.json", "checkpoints/last.pt"):
        assert os.path.exists(os.path.join(out, name)), name
    tok = WordTokenizer.load(os.path.join(out, "tokenizer.json"))
    ds = load_paired("glyphlab-text", seed=0, train_scenes=48, val_scenes=24, test_scenes=24)
    assert tok.vocabulary == WordTokenizer.build(ds.train.texts).vocabulary

    # Refuses to overwrite the run without --resume / --force.
    assert main(args + ["--epochs", "1"]) == 2
    assert "not empty" in capsys.readouterr().err

    # Resume to 2 epochs; the stored options (weight, text encoder) are kept.
    assert main(["pretrain", "--out", out, "--resume", "--epochs", "2", "--quiet", "--json", "--no-report"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["epochs"] == 2 and summary["method"] == "convirt" and summary["steps"] == 6
    config = json.load(open(os.path.join(out, "config.json")))["config"]
    assert (config["weight"], config["text_encoder"], config["projection_dim"]) == (0.25, "transformer", 32)
    for key in ("retrieval_i2t_recall@1", "retrieval_t2i_recall@5", "retrieval_chance_recall@10",
                "retrieval_fact_ceiling_recall@1", "zero_shot_accuracy", "probe_accuracy",
                "random_init_probe_accuracy"):
        assert key in summary, key
    assert summary["retrieval_pairs"] == 24
    assert summary["retrieval_chance_recall@1"] == pytest.approx(1 / 24)
    assert summary["zero_shot_chance"] == pytest.approx(1 / 3)
    epochs = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl")) if '"epoch"' in line]
    assert [r["epoch"] for r in epochs if r["kind"] == "epoch"] == [1, 2]

    # `contrastkit probe` re-evaluates the checkpoint with the stored tokenizer: same retrieval.
    assert main(["probe", out, "--no-baselines", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    for key in ("retrieval_i2t_recall@1", "retrieval_t2i_recall@10", "zero_shot_accuracy", "probe_accuracy"):
        assert again[key] == pytest.approx(summary[key]), key

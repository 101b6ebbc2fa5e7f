"""``--compile``: the training steps run a torch.compile'd encoder (inductor on CPU), whose
losses equal the eager run's within float rounding, whose checkpoints read like an eager
run's, and which resumes exactly; the read-out calls it eagerly. A few steps of a tiny run:
the compilation itself takes tens of seconds on a CPU (torch caches it on disk)."""

import json

import pytest
import torch

from _tiny_run import TINY_ARGS, tiny_config
from contrastkit.cli import main
from contrastkit.train import pretrain


@pytest.fixture(scope="module")
def compiler():
    """Skip, with the reason, where torch.compile cannot build kernels here."""
    from contrastkit.train.setup import compile_encoder

    try:  # the layers the tests' encoder has, forward and backward: what the runs below compile
        module = compile_encoder(torch.nn.Sequential(
            torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 2)))
        module(torch.ones(2, 3, 8, 8)).sum().backward()
    except Exception as err:  # no C++ compiler, an old torch, a toolchain that cannot build for this CPU
        pytest.skip(f"torch.compile cannot run here: {type(err).__name__}: {str(err).splitlines()[0][:200]}")


def _step_losses(out):
    with open(out / "metrics.jsonl", encoding="utf-8") as handle:
        return [record["loss"] for record in map(json.loads, handle) if record["kind"] == "step"]


def _weights(out):
    return torch.load(out / "checkpoints" / "last.pt", weights_only=True)["model"]


def test_compiled_steps_match_eager_and_resume_exactly(tmp_path, compiler):
    # SGD: its update is linear in the gradient, so the two runs stay within rounding of each
    # other step after step. (AdamW's first update is about lr * sign(g): a gradient component
    # that is zero up to rounding moves its weight by +-lr either way, and the runs drift apart
    # by ~1e-3 in the loss within a few steps, as they do between 1 and 2 threads.)
    options = dict(epochs=2, threads=1, log_every=1, optimizer="sgd")
    eager = pretrain(tiny_config(tmp_path / "eager", **options), progress=False, baselines=False)
    compiled = pretrain(tiny_config(tmp_path / "compiled", compile=True, **options), progress=False, baselines=False)
    a, b = _step_losses(tmp_path / "eager"), _step_losses(tmp_path / "compiled")
    assert len(a) == len(b) == 4  # 2 epochs of 2 steps
    # Inductor fuses and reorders the float32 sums eager runs one kernel at a time (and picks its
    # own vector width): the losses agree within the rounding of the longest sum, a BatchNorm
    # statistic over both views' 2 x 8 images of 28 x 28 pixels, at most that many float32 ulps.
    longest_sum = 2 * 8 * 28 * 28
    assert torch.allclose(torch.tensor(a), torch.tensor(b), rtol=longest_sum * torch.finfo(torch.float32).eps,
                          atol=0), (a, b)
    assert abs(compiled["probe_accuracy"] - eager["probe_accuracy"]) <= 0.1
    # the checkpoint holds the module's own keys: the compiled run reads like an eager one
    assert _weights(tmp_path / "compiled").keys() == _weights(tmp_path / "eager").keys()
    recorded = json.loads((tmp_path / "compiled" / "config.json").read_text())["config"]
    assert recorded["compile"] is True
    # The online probe (on by default) reads h through a forward hook, which the compiled encoder
    # runs too: the head trained at every step, on the compiled step's h. Its Adam step moves each
    # weight by at most about its learning rate, so the two heads are within that per step.
    from contrastkit.train.online import PROBE_LR

    eager_head, compiled_head = (torch.load(tmp_path / name / "checkpoints" / "last.pt", weights_only=False)
                                 ["online_probe"] for name in ("eager", "compiled"))
    assert compiled_head["steps"] == eager_head["steps"] == 4
    assert torch.allclose(compiled_head["head"]["weight"], eager_head["head"]["weight"], rtol=0, atol=4 * PROBE_LR)
    assert "online_probe_accuracy" in compiled and "online_knn_accuracy" in compiled

    class Stop(Exception):
        pass

    def stop(epoch, record):
        raise Stop

    cut = tiny_config(tmp_path / "cut", compile=True, **options)
    with pytest.raises(Stop):
        pretrain(cut, progress=False, on_epoch_end=stop)
    resumed = pretrain(cut, resume=True, progress=False, baselines=False)
    full, again = _weights(tmp_path / "compiled"), _weights(tmp_path / "cut")
    assert all(torch.equal(full[k], again[k]) for k in full)
    assert resumed["final_loss"] == compiled["final_loss"]
    assert _step_losses(tmp_path / "cut") == _step_losses(tmp_path / "compiled")


def test_the_cli_flag_compiles_the_encoder(tmp_path, capsys, monkeypatch, compiler):
    compiled = []
    real = torch.nn.Module.compile

    def recording(module, *args, **kwargs):
        compiled.append(type(module).__name__)
        return real(module, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "compile", recording)
    out = tmp_path / "run"
    assert main(["pretrain", *TINY_ARGS, "--epochs", "1", "--threads", "1", "--compile", "--no-baselines",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    assert compiled == ["SmallCNN"]  # the encoder, and nothing else
    assert json.loads((out / "config.json").read_text())["config"]["compile"] is True
    assert "compile: true" in (out / "config.yaml").read_text()


def test_kernels_torch_cannot_build_end_the_run_in_one_line_naming_compile(tmp_path, capsys, monkeypatch):
    """Where inductor cannot build the encoder's kernels (a toolchain that cannot build for this
    CPU, an operator it cannot lower), the run said so in torch's traceback of dynamo frames."""
    real = torch.nn.Module.compile

    def failing_backend(graph, example_inputs):
        raise RuntimeError("C++ compile error: cannot build a kernel for this CPU")

    monkeypatch.setattr(torch.nn.Module, "compile", lambda module, **options: real(module, backend=failing_backend))
    code = main(["pretrain", *TINY_ARGS, "--epochs", "1", "--threads", "1", "--compile", "--no-baselines",
                 "--out", str(tmp_path / "run")])
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 2, error
    assert error[-1].startswith("contrastkit pretrain: error: --compile: torch.compile could not build"), error
    assert "cannot build a kernel for this CPU" in error[-1] and "train without --compile" in error[-1]
    assert not any(line.startswith("Traceback") for line in error)


def test_bad_compile_settings_are_clear(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="compile must be true or false"):
        pretrain(tiny_config(tmp_path / "a", compile="yes"), progress=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no compiler to be found
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(ValueError, match="--compile needs a C\\+\\+ compiler"):
        pretrain(tiny_config(tmp_path / "b", compile=True), progress=False)

"""A tiny GlyphLab pretraining run (seconds on a CPU), for the tests of a run's outputs."""

from contrastkit.cli import main
from contrastkit.train import PretrainConfig, pretrain

TINY_GLYPHLAB = {"train_scenes": 16, "val_scenes": 9, "test_scenes": 12, "size": 28}
# The same run on the command line.
TINY_ARGS = ["--data", "glyphlab", *[f"--data-option={key}={value}" for key, value in TINY_GLYPHLAB.items()],
             "--batch-size", "8", "--device", "cpu", "--log-every", "1", "--quiet", "--no-report"]
# Numbers of a summary that depend on the machine's speed, not on the run.
TIMINGS = ("seconds", "train_seconds", "eval_seconds", "images_per_second")


def tiny_config(out, **overrides):
    options = dict(data="glyphlab", data_options=dict(TINY_GLYPHLAB), epochs=1, batch_size=8, out=str(out),
                   device="cpu", log_every=1)
    options.update(overrides)
    return PretrainConfig(**options)


def without_timings(summary):
    return {key: value for key, value in summary.items() if key not in TIMINGS}


class _Trained(Exception):
    pass


def _stop_after(epochs):
    def stop(epoch, record):
        if epoch >= epochs:
            raise _Trained
    return stop


def train_only(config, *, resume=False, **options):
    """``pretrain(config, ...)`` up to its last epoch's checkpoint, without the evaluation (the
    tests of training itself read the checkpoint)."""
    try:
        pretrain(config, resume=resume, progress=False, on_epoch_end=_stop_after(config.epochs), **options)
    except _Trained:
        return
    raise AssertionError("the run ended before its last epoch")


def preempted_at_backward(monkeypatch, n):
    """SIGTERM to this process during the ``n``-th backward pass (the step then finishes and
    the run checkpoints it and stops); returns a function that puts the real backward back."""
    import os
    import signal

    import torch

    real, calls = torch.Tensor.backward, [0]

    def backward(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == n:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "backward", backward)
    return lambda: monkeypatch.setattr(torch.Tensor, "backward", real)


def one_error_line(capsys, argv):
    """Run the CLI on ``argv``, which must fail as a user error: exit status 2 after exactly one
    line on stderr and no traceback; that line."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]

"""Files a user hands contrastkit that torch reads (``--encoder-weights``, a run's checkpoints,
its ``last_batch.pt``): a damaged one is called damaged in one line naming the file, one that
pickles more than tensors is named for what it holds, and never with torch's advice to load it
with ``weights_only=False`` (which would run the file's code)."""

import argparse
import random

import pytest
import torch

from _tiny_run import TINY_ARGS, one_error_line
from contrastkit.cli import main
from contrastkit.train.checkpoint import load_checkpoint, save_checkpoint
from contrastkit.train.last_batch import read_last_batch

# Random bytes that torch's weights-only unpickler refuses in each of the ways seen: an
# "Unsupported operand" (an UnpicklingError carrying the advice), IndexError, KeyError,
# UnicodeDecodeError (found by trying seeds; each seed's bytes are fixed by random.Random).
RANDOM_SEEDS = [0, 8, 15, 33]
# The same bytes after the first bytes of a torch.save file (its zip archive, an older pickle):
# what torch itself then fails on.
HEADS = [b"", b"PK\x03\x04", b"\x80\x02"]


def gives_no_unsafe_advice(message):
    """None of torch's words that advise loading the file anyway (``weights_only=False`` runs its code)."""
    return not any(words in message for words in ("weights_only", "arbitrary code", "trust", "still be loaded"))


def _random_bytes(seed, size=2000):
    rng = random.Random(seed)
    return bytes(rng.randrange(256) for _ in range(size))


@pytest.mark.parametrize("head", HEADS, ids=["random", "zip-head", "pickle-head"])
@pytest.mark.parametrize("seed", RANDOM_SEEDS)
def test_random_bytes_as_encoder_weights_are_called_corrupt(tmp_path, capsys, seed, head):
    weights = tmp_path / "weights.pt"
    weights.write_bytes(head + _random_bytes(seed))
    line = one_error_line(capsys, ["pretrain", *TINY_ARGS, "--encoder-weights", str(weights), "--epochs", "1",
                                   "--out", str(tmp_path / "run")])
    assert f"encoder weights file {weights} is not a readable PyTorch/safetensors weights file" in line, line
    assert gives_no_unsafe_advice(line), line


def test_a_pickled_module_as_encoder_weights_is_named_without_the_unsafe_advice(tmp_path, capsys):
    weights = tmp_path / "module.pt"
    torch.save(torch.nn.Linear(2, 2), weights)
    line = one_error_line(capsys, ["pretrain", *TINY_ARGS, "--encoder-weights", str(weights), "--epochs", "1",
                                   "--out", str(tmp_path / "run")])
    assert f"encoder weights file {weights} holds more than tensors" in line, line
    assert "torch.nn.modules.linear.Linear" in line and "state_dict()" in line, line
    assert gives_no_unsafe_advice(line), line


def test_a_checkpoint_that_pickles_an_object_is_refused_without_the_unsafe_advice(tmp_path):
    path = tmp_path / "checkpoints" / "last.pt"
    save_checkpoint(str(path), {"epoch": 1, "options": argparse.Namespace(a=1)})  # its digest matches
    with pytest.raises(ValueError) as raised:
        load_checkpoint(str(path))
    message = str(raised.value)
    assert f"checkpoint {path}" in message and "argparse.Namespace" in message, message
    assert gives_no_unsafe_advice(message) and "\n" not in message, message


@pytest.mark.parametrize("content", ["random", "object"])
def test_a_damaged_last_batch_file_is_refused_without_the_unsafe_advice(tmp_path, content):
    path = tmp_path / "last_batch.pt"
    if content == "random":
        path.write_bytes(_random_bytes(0))
    else:
        torch.save({"format": "x", "options": argparse.Namespace(a=1)}, path)
    with pytest.raises(ValueError) as raised:
        read_last_batch(str(tmp_path))
    message = str(raised.value)
    assert str(path) in message and gives_no_unsafe_advice(message) and "\n" not in message, message
    if content == "object":
        assert "argparse.Namespace" in message, message

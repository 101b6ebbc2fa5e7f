"""The CPU-thread default of a run: the cores the process may use; an explicit count is kept."""

import argparse
import os

import pytest
import torch

from contrastkit.commands import pretrain as pretrain_command
from contrastkit.train import PretrainConfig
from contrastkit.train import setup
from contrastkit.train.setup import limit_threads, resolve_threads


def _cli_config(*argv: str) -> PretrainConfig:
    parser = argparse.ArgumentParser()
    pretrain_command.add_arguments(parser)
    return pretrain_command.config_from_args(parser.parse_args(list(argv))).resolved()


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no os.sched_getaffinity on this platform")
def test_default_resolves_to_the_affinity_count():
    assert PretrainConfig().resolved().threads == 0
    assert _cli_config().threads == 0
    assert resolve_threads(0) == len(os.sched_getaffinity(0))


def test_default_follows_the_affinity_mask_and_is_applied(monkeypatch):
    # Three allowed cores whatever this machine has: the count must come from the mask.
    monkeypatch.setattr(setup.os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    before = torch.get_num_threads()
    with limit_threads(PretrainConfig().resolved().threads):
        assert torch.get_num_threads() == 3
    assert torch.get_num_threads() == before


def test_without_an_affinity_call_torch_chooses(monkeypatch):
    monkeypatch.delattr(setup.os, "sched_getaffinity", raising=False)
    assert resolve_threads(0) == torch.get_num_threads()


def test_an_explicit_count_is_honoured(monkeypatch):
    monkeypatch.setattr(setup.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert _cli_config("--threads", "1").threads == 1
    assert resolve_threads(1) == 1
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with limit_threads(1):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_a_negative_count_is_refused():
    with pytest.raises(ValueError, match="threads"):
        PretrainConfig(threads=-1).resolved()

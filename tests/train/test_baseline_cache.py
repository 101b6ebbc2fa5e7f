"""The read-out's baselines are computed once per data set and protocol, then read back."""

import json
import os
import warnings

import pytest
import torch

from contrastkit import layout
from contrastkit.cli import main
from contrastkit.metrics import readout as readout_module
from contrastkit.train import PretrainConfig, evaluate_run, pretrain
from contrastkit.train.baselines import BaselineCache, data_digest, encoder_digest
from contrastkit.methods import load_data

from _tiny_run import TINY_ARGS, tiny_config

BASELINE_KEYS = ("random_init_probe_accuracy", "random_init_probe_val_accuracy", "random_init_probe_c",
                 "random_init_knn_accuracy", "raw_pixel_probe_accuracy", "raw_pixel_probe_val_accuracy",
                 "raw_pixel_probe_c", "raw_pixel_knn_accuracy")


@pytest.fixture
def read_outs(monkeypatch):
    """How many feature sets were read out (probe + kNN) since the test began."""
    calls = []
    original = readout_module.evaluate_features

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return original(*args, **kwargs)

    monkeypatch.setattr(readout_module, "evaluate_features", counted)
    return calls


def _files(root):
    folder = os.path.join(root, layout.BASELINES)
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def test_a_second_run_reads_both_baselines_back_with_the_same_numbers(tmp_path, read_outs):
    cache = str(tmp_path / "cache")
    first = pretrain(tiny_config(tmp_path / "a", baseline_cache=cache), progress=False)
    assert len(read_outs) == 3  # trained encoder, random-init, raw pixels
    assert len(_files(cache)) == 2
    second = pretrain(tiny_config(tmp_path / "b", baseline_cache=cache, lr=1e-3), progress=False)
    assert len(read_outs) == 4  # only the trained encoder again
    assert {k: second[k] for k in BASELINE_KEYS} == {k: first[k] for k in BASELINE_KEYS}
    assert second["beats_baselines"] is not None


def test_the_cached_numbers_are_the_computed_ones(tmp_path):
    cached = str(tmp_path / "cache")
    pretrain(tiny_config(tmp_path / "a", baseline_cache=cached), progress=False)
    from_cache = pretrain(tiny_config(tmp_path / "b", baseline_cache=cached), progress=False)
    computed = pretrain(tiny_config(tmp_path / "c", baseline_cache="off"), progress=False)
    assert {k: from_cache[k] for k in BASELINE_KEYS} == {k: computed[k] for k in BASELINE_KEYS}


def test_what_decides_a_baseline_names_it(tmp_path, read_outs):
    cache = str(tmp_path / "cache")
    pretrain(tiny_config(tmp_path / "a", baseline_cache=cache), progress=False)
    assert len(read_outs) == 3
    # Another seed: another untrained encoder (recomputed), the same pixels (read back). GlyphLab
    # draws its images from the seed too, so the seed-0 data set is passed as an object.
    same_data = load_data(tiny_config(tmp_path / "a").resolved())
    pretrain(tiny_config(tmp_path / "b", baseline_cache=cache, seed=1), progress=False, dataset=same_data)
    assert len(read_outs) == 5
    # Another kNN k: another protocol, both recomputed.
    pretrain(tiny_config(tmp_path / "c", baseline_cache=cache, knn_k=5), progress=False)
    assert len(read_outs) == 8
    # Other data (a subset of the test split): both recomputed.
    pretrain(tiny_config(tmp_path / "d", baseline_cache=cache, test_limit=10), progress=False)
    assert len(read_outs) == 11
    assert len(_files(cache)) == 7  # 2 + 1 + 2 + 2


def test_off_writes_nothing_and_computes_every_time(tmp_path, read_outs, monkeypatch):
    monkeypatch.setenv(layout.CACHE_ENV, str(tmp_path / "auto"))
    for name in "ab":
        pretrain(tiny_config(tmp_path / name, baseline_cache="off"), progress=False)
    assert len(read_outs) == 6
    assert not (tmp_path / "auto").exists()


def test_auto_is_the_environment_s_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(layout.CACHE_ENV, str(tmp_path / "env"))
    pretrain(tiny_config(tmp_path / "a"), progress=False)  # baseline_cache defaults to "auto"
    assert len(_files(tmp_path / "env")) == 2
    monkeypatch.delenv(layout.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert layout.default_cache_root() == str(tmp_path / "xdg" / "contrastkit")


def test_an_unreadable_cache_file_is_reported_left_alone_and_recomputed(tmp_path, read_outs):
    cache = str(tmp_path / "cache")
    first = pretrain(tiny_config(tmp_path / "a", baseline_cache=cache), progress=False)
    damaged = os.path.join(cache, layout.BASELINES, _files(cache)[0])
    with open(damaged, "w", encoding="utf-8") as handle:
        handle.write("{ not json")
    with pytest.warns(UserWarning, match="cannot be used"):
        second = pretrain(tiny_config(tmp_path / "b", baseline_cache=cache), progress=False)
    assert len(read_outs) == 3 + 2  # the trained encoder and the damaged baseline
    assert open(damaged, encoding="utf-8").read() == "{ not json"
    assert {k: second[k] for k in BASELINE_KEYS} == {k: first[k] for k in BASELINE_KEYS}


def test_a_cache_file_of_another_name_is_not_trusted(tmp_path, read_outs):
    cache = str(tmp_path / "cache")
    pretrain(tiny_config(tmp_path / "a", baseline_cache=cache), progress=False)
    a, b = (os.path.join(cache, layout.BASELINES, name) for name in _files(cache))
    with open(b, encoding="utf-8") as handle:
        record = json.load(handle)
    with open(a, "w", encoding="utf-8") as handle:
        json.dump(record, handle)  # b's numbers under a's name
    with pytest.warns(UserWarning, match="not a contrastkit baseline of this name"):
        pretrain(tiny_config(tmp_path / "b", baseline_cache=cache), progress=False)
    assert len(read_outs) == 5


def test_a_cache_that_cannot_be_written_is_a_warning_not_a_failure(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("a file where the cache folder would go")
    with pytest.warns(UserWarning, match="cannot be written"):
        summary = pretrain(tiny_config(tmp_path / "a", baseline_cache=str(blocked)), progress=False)
    assert summary["raw_pixel_probe_accuracy"] is not None
    assert blocked.read_text() == "a file where the cache folder would go"


def test_bad_settings_name_the_option(tmp_path):
    with pytest.raises(ValueError, match="baseline_cache"):
        tiny_config(tmp_path / "a", baseline_cache="").resolved()
    with pytest.raises(ValueError, match="baseline_cache"):
        BaselineCache.from_setting(3)
    # A relative folder is kept absolute, so `contrastkit probe` finds it from anywhere.
    assert tiny_config(tmp_path / "a", baseline_cache="cache").resolved().baseline_cache == os.path.abspath("cache")
    assert tiny_config(tmp_path / "a", baseline_cache="off").resolved().baseline_cache == "off"


def test_the_data_digest_sees_every_pixel_and_label_but_not_the_batching():
    images = torch.rand(10, 1, 4, 4)
    labels = torch.arange(10) % 3
    whole = data_digest([([images], labels)])
    assert data_digest([([images[:3], images[3:]], labels)]) == whole
    changed = images.clone()
    changed[7, 0, 2, 1] += 1e-6
    assert data_digest([([changed], labels)]) != whole
    assert data_digest([([images], labels.flip(0))]) != whole
    # The same images split differently between two splits are other data.
    assert data_digest([([images[:5]], labels[:5]), ([images[5:]], labels[5:])]) != \
        data_digest([([images[:4]], labels[:4]), ([images[4:]], labels[4:])])


def test_the_encoder_digest_sees_weights_buffers_and_architecture():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    cpu = torch.device("cpu")
    before = encoder_digest(net, cpu)
    assert encoder_digest(net, cpu) == before
    net[1].running_mean += 1.0
    assert encoder_digest(net, cpu) != before
    wider = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3, eps=1e-3))
    wider.load_state_dict(net.state_dict())
    assert encoder_digest(wider, cpu) != encoder_digest(net, cpu)


def test_the_command_line_option_and_probe(tmp_path, read_outs, monkeypatch, capsys):
    cache = tmp_path / "cache"
    assert main(["pretrain", *TINY_ARGS, "--epochs", "1", "--out", str(tmp_path / "run"),
                 "--baseline-cache", str(cache)]) == 0
    assert len(_files(cache)) == 2 and len(read_outs) == 3
    with open(layout.RunFolder(tmp_path / "run").config, encoding="utf-8") as handle:
        assert json.load(handle)["config"]["baseline_cache"] == str(cache)
    # probe reads the run's setting; --baseline-cache off recomputes.
    numbers = evaluate_run(str(tmp_path / "run"))
    assert len(read_outs) == 4
    capsys.readouterr()
    assert main(["probe", str(tmp_path / "run"), "--baseline-cache", "off", "--json"]) == 0
    assert len(read_outs) == 7
    recomputed = json.loads(capsys.readouterr().out)
    assert {k: recomputed[k] for k in BASELINE_KEYS} == {k: numbers[k] for k in BASELINE_KEYS}


def test_a_change_of_the_probe_s_stopping_rule_recomputes(tmp_path, read_outs, monkeypatch):
    from contrastkit.metrics import probe

    cache = str(tmp_path / "cache")
    pretrain(tiny_config(tmp_path / "a", baseline_cache=cache), progress=False)
    monkeypatch.setattr(probe, "PROBE_TOLERANCE", probe.PROBE_TOLERANCE * 10)
    pretrain(tiny_config(tmp_path / "b", baseline_cache=cache), progress=False)
    assert len(read_outs) == 6
    assert len(_files(cache)) == 4


def test_a_streamed_folder_s_baselines_are_cached_like_the_same_images_in_memory(tmp_path, read_outs):
    from _data_fixtures import write_image_folder

    folder = tmp_path / "images"
    write_image_folder(folder, classes=("cat", "dog", "eel"), per_class=14, mode="RGB", sizes=((16, 16),))
    cache = str(tmp_path / "cache")
    options = dict(data=str(folder), epochs=1, batch_size=8, device="cpu", log_every=1, baseline_cache=cache)
    streamed = pretrain(PretrainConfig(out=str(tmp_path / "a"), data_options={"stream": True}, workers=1, **options),
                        progress=False)
    assert len(read_outs) == 3 and len(_files(cache)) == 2
    again = pretrain(PretrainConfig(out=str(tmp_path / "b"), data_options={"stream": True}, **options), progress=False)
    assert len(read_outs) == 4  # the same files, now without workers: the same data
    assert {k: again[k] for k in BASELINE_KEYS} == {k: streamed[k] for k in BASELINE_KEYS}
    in_memory = pretrain(PretrainConfig(out=str(tmp_path / "c"), **options), progress=False)
    assert len(read_outs) == 5 and len(_files(cache)) == 2  # the same images held in memory
    assert {k: in_memory[k] for k in BASELINE_KEYS} == {k: streamed[k] for k in BASELINE_KEYS}

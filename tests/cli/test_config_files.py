"""--config FILE for pretrain, sweep and experiment: keys, precedence, errors, and OUT/config.yaml."""

import argparse
import json
import sys

import pytest

from _tiny_run import TINY_ARGS, without_timings
from contrastkit.config_files import read_config_file, write_config_file
from contrastkit.cli import main
from contrastkit.commands import pretrain as pretrain_command
from contrastkit.commands.common import UsageError, add_config_argument, apply_config_file, config_defaults
from contrastkit.train import PretrainConfig


def _parser():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--method", choices=("simclr", "moco"), default=None)
    parser.add_argument("--data-option", action="append", default=None)
    parser.add_argument("--temperatures", default=None)
    parser.add_argument("--no-variants", action="store_true")
    add_config_argument(parser, aliases={"data_options": "data-option"})
    return parser


def _parse(tmp_path, text, argv=(), name="run.yaml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    parser = _parser()
    argv = ["--config", str(path), *argv]
    apply_config_file(parser, argv)
    return parser.parse_args(argv)


def test_keys_with_dashes_or_underscores_and_command_line_precedence(tmp_path):
    args = _parse(tmp_path, "epochs: 3\nlr: 1e-3\nmethod: moco\ndata-option: {size: 28, clutter: [2, 5]}\n"
                  "temperatures: [0.1, 0.5]\nno_variants: true\n", argv=["--epochs", "5"])
    assert args.epochs == 5  # the command line wins
    assert args.lr == 0.001 and args.method == "moco" and args.no_variants is True
    assert args.data_option == ["size=28", "clutter=[2, 5]"]
    assert args.temperatures == "0.1,0.5"
    args = _parse(tmp_path, '{"data_options": {"size": 28}}', argv=["--data-option", "size=32"], name="run.json")
    assert args.data_option == ["size=28", "size=32"]  # the later item, the command line's, wins


@pytest.mark.parametrize("text, message", [
    ("epoch: 3\n", r"run.yaml: unknown key 'epoch' \(did you mean 'epochs'\?\)"),
    ("epochs: 1.5\n", r"'epochs' must be an integer, got 1.5"),
    ("epochs: three\n", r"'epochs' must be an integer, got 'three'"),
    ("lr: [1, 2]\n", r"'lr' must be a number"),
    ("method: byol\n", r"'method' must be one of simclr, moco, got 'byol'"),
    ("no-variants: 1\n", r"'no-variants' must be true or false"),
    ("data_option: [1, 2]\n", r"'data_option' must be a mapping or a list of KEY=VALUE strings"),
    ("epochs: 1\nepochs_: 2\n", r"unknown key 'epochs_'"),
    ("data-option: {a: 1}\ndata_options: {b: 2}\n", r"'data_options' sets --data-option a second time"),
])
def test_bad_keys_and_values_name_the_key_and_the_file(tmp_path, text, message):
    with pytest.raises(UsageError, match=message):
        _parse(tmp_path, text)


def test_files_that_are_not_configurations(tmp_path):
    for text, message in (("epochs: [3\n", r"does not parse as YAML \(line 2"), ("- 1\n- 2\n", "must hold a mapping"),
                          ("{epochs: 3", "does not parse")):
        with pytest.raises(ValueError, match=message):
            _parse(tmp_path, text)
    with pytest.raises(ValueError, match=r"run.json is not valid JSON \(line 1"):
        _parse(tmp_path, "epochs: 3", name="run.json")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_config_file(tmp_path / "missing.yaml")
    assert _parse(tmp_path, "").epochs is None  # an empty file: no options


def test_json_configs_need_no_pyyaml(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "yaml", None)  # import yaml fails
    assert _parse(tmp_path, '{"epochs": 4}', name="run.yaml").epochs == 4
    with pytest.raises(ValueError, match=r"contrastkit\[yaml\]"):
        _parse(tmp_path, "epochs: 4\n")
    write_config_file(tmp_path / "out.yaml", {"lr": 2e-05, "epochs": 3})  # JSON, which is YAML too
    assert read_config_file(tmp_path / "out.yaml") == {"lr": 2e-05, "epochs": 3}


def test_every_pretrain_config_field_is_a_pretrain_config_key():
    parser = argparse.ArgumentParser()
    pretrain_command.add_arguments(parser)
    defaults = config_defaults(parser, PretrainConfig().to_dict(), "config.yaml")
    assert set(defaults) >= {"epochs", "data_option", "logger", "knn_k", "out"}


@pytest.mark.parametrize("command", [["pretrain"], ["sweep"], ["experiment", "positive-pairs"]])
def test_cli_refuses_unknown_keys_and_unparsable_files(tmp_path, capsys, command):
    bad_key = tmp_path / "bad.yaml"
    bad_key.write_text("epoch: 3\n", encoding="utf-8")
    broken = tmp_path / "broken.yaml"
    broken.write_text("epochs: [3\n", encoding="utf-8")
    for path, message in ((bad_key, f"config file {bad_key}: unknown key 'epoch'"), (broken, "does not parse")):
        assert main([*command, "--config", str(path), "--out", str(tmp_path / "out")]) == 2
        error = capsys.readouterr().err.strip()
        assert error.count("\n") == 0 and message in error
    assert not (tmp_path / "out").exists()


def test_a_runs_config_yaml_reproduces_it(tmp_path, capsys, one_torch_thread):
    config = tmp_path / "run.yaml"
    config.write_text("epochs: 2\nmethod: simclr\nseed: 3\ntemperature: 0.3\n", encoding="utf-8")
    first, second = tmp_path / "first", tmp_path / "second"
    assert main(["pretrain", "--config", str(config), *TINY_ARGS, "--epochs", "1", "--out", str(first), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["epochs"] == 1  # the command line over the file
    stored = read_config_file(first / "config.yaml")
    assert stored["seed"] == 3 and stored["temperature"] == 0.3 and stored["out"] == str(first)
    assert main(["pretrain", "--config", str(first / "config.yaml"), "--out", str(second), "--quiet", "--json",
                 "--no-report"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert without_timings(again) == without_timings(summary)
    with open(second / "config.json", encoding="utf-8") as a, open(first / "config.json", encoding="utf-8") as b:
        assert {**json.load(a)["config"], "out": None} == {**json.load(b)["config"], "out": None}


@pytest.mark.parametrize("name, text, message", [
    ("run.yaml", "epochs: 3\nlr: 1e-3\nepochs: 5\n", r"run.yaml: key 'epochs' is given twice \(lines 1 and 3\)"),
    ("run.yaml", "data-option:\n  size: 28\n  clutter: 2\n  size: 32\n",
     r"run.yaml: key 'size' under 'data-option' is given twice \(lines 2 and 4\)"),
    ("run.yaml", "data-option: {size: 28, size: 32}\n", r"key 'size' under 'data-option' is given twice \(both on line 1\)"),
    ("run.json", '{\n  "epochs": 3,\n  "lr": 0.001,\n  "epochs": 5\n}\n',
     r"run.json: key 'epochs' is given twice \(lines 2 and 4\)"),
    ("run.json", '{"lr": 0.1,\n "data_options": {"size": 28,\n   "clutter": [2, {"size": 1}],\n   "size": 32}}\n',
     r"run.json: key 'size' under 'data_options' is given twice \(lines 2 and 4\)"),
    ("run.yaml", '{"epochs": 3, "epochs": 5}', r"run.yaml: key 'epochs' is given twice \(both on line 1\)"),  # JSON in .yaml
])
def test_a_key_given_twice_is_refused_naming_the_file_the_key_and_the_lines(tmp_path, name, text, message):
    with pytest.raises(ValueError, match=message):
        _parse(tmp_path, text, name=name)


def test_the_same_key_in_different_mappings_is_no_duplicate(tmp_path):
    args = _parse(tmp_path, '{"data_options": {"size": 28, "clutter": {"size": 3}}}', name="run.json")
    assert args.data_option == ["size=28", 'clutter={"size": 3}']
    args = _parse(tmp_path, "data-option:\n  size: 28\n  clutter: {size: 3}\n")
    assert args.data_option == ["size=28", 'clutter={"size": 3}']


def test_cli_refuses_a_key_given_twice(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("epochs: 1\nseed: 3\nepochs: 2\n", encoding="utf-8")
    assert main(["pretrain", "--config", str(config), *TINY_ARGS, "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and f"config file {config}: key 'epochs' is given twice (lines 1 and 3)" in error
    assert not (tmp_path / "out").exists()

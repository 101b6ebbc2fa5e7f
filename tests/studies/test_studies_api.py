"""The study layer (``contrastkit.studies``): registry, settings, validation before any run,
the trainer owning the thread default, statistics, and the layering of studies and commands."""

import ast
import math
import os
from pathlib import Path

import pytest

from contrastkit import layout, studies
from contrastkit.studies import CONVIRT_ABLATION, EXPERIMENTS, POSITIVE_PAIRS, STUDIES, SWEEP
from contrastkit.studies.stats import binomial_standard_error, standard_error
from contrastkit.train import PretrainConfig

SRC = Path(__file__).resolve().parents[2] / "src" / "contrastkit"


def test_registry():
    assert set(STUDIES) == {"sweep", "positive-pairs", "convirt-ablation", "schedules", "temperature-methods"}
    assert set(EXPERIMENTS) == {"positive-pairs", "convirt-ablation", "schedules", "temperature-methods"}
    assert SWEEP.outputs == (layout.RUNS, layout.SWEEP_TABLE, layout.SWEEP_SETTINGS, layout.VERDICTS) + layout.SWEEP_PLOTS
    assert POSITIVE_PAIRS.outputs[-1] == layout.POSITIVE_PAIRS_PLOT
    assert CONVIRT_ABLATION.default_out == os.path.join(layout.DEFAULT_ROOT, "experiment-convirt-ablation")
    with pytest.raises(ValueError, match="unknown experiment 'sweep'"):
        studies.run_experiment("sweep")
    with pytest.raises(ValueError, match="known: convirt-ablation, positive-pairs, schedules, sweep"):
        studies.get_study("nope")


def test_settings_fill_defaults_and_validate():
    s = SWEEP.settings(temperatures=[0.5, 0.1], seeds=None)
    assert s["temperatures"] == [0.1, 0.5] and s["seeds"] == 3 and s["epochs"] == 100 and s["threads"] is None
    assert SWEEP.settings()["temperatures"] == [0.05, 0.1, 0.2, 0.5, 1.0]
    p = POSITIVE_PAIRS.settings()
    assert p["temperature"] == 0.2 and p["seeds"] == 3 and p["epochs"] == 150  # pretrain's simclr default
    c = CONVIRT_ABLATION.settings(data_options={"train_scenes": 32})
    assert c["data_options"] == {"train_scenes": 32, "val_scenes": 100, "test_scenes": 300}
    for study, options, message in [
        (SWEEP, dict(temperatures=[0.001]), ">= 0.01"),
        (SWEEP, dict(temperatures=[]), "--temperatures is empty"),
        (SWEEP, dict(temperatures=[0.1, 0.1]), "repeated"),
        (SWEEP, dict(seeds=0), "--seeds must be >= 1"),
        (SWEEP, dict(batch_size=1), "--batch-size must be >= 2"),
        (POSITIVE_PAIRS, dict(weights=[0.5]), "positive-pairs has no option --weights"),
        (POSITIVE_PAIRS, dict(temperature=float("nan")), "--temperature must be finite"),
        (CONVIRT_ABLATION, dict(temperature=0.1), "use --temperatures, not --temperature"),
        (CONVIRT_ABLATION, dict(weights=[0.5, 2.0]), "--weights must be finite and in [0, 1]"),
    ]:
        with pytest.raises((ValueError, TypeError), match=message.replace("[", r"\[").replace("(", r"\(")):
            study.settings(**options)


def test_nothing_is_written_before_every_run_config_is_valid(tmp_path):
    out = tmp_path / "sweep"
    with pytest.raises(ValueError, match="views"):  # the trainer's own check, before the first run
        studies.run_sweep(str(out), temperatures=[0.1], seeds=1, views="C")
    with pytest.raises(ValueError, match=">= 0.01"):
        studies.run_sweep(str(out), temperatures=[0.001])
    assert not out.exists()


def test_threads_default_is_the_trainers():
    # None: the run configs leave threads out, so PretrainConfig's default applies (one owner)
    for study in STUDIES.values():
        for spec in study.specs(study.settings(seeds=1)):
            assert "threads" not in spec.config
            assert PretrainConfig(**spec.config).threads == PretrainConfig().threads
    spec = SWEEP.specs(SWEEP.settings(seeds=1, threads=3))[0]
    assert spec.config["threads"] == 3


@pytest.mark.parametrize("argv", [["sweep"], ["experiment", "positive-pairs"]])
def test_study_commands_leave_threads_to_the_trainer(argv):
    import argparse
    import importlib

    from contrastkit.cli import COMMANDS

    parser = argparse.ArgumentParser()
    importlib.import_module(COMMANDS[argv[0]][0]).add_arguments(parser)
    args = parser.parse_args(argv[1:])
    assert args.threads is None and args.epochs is None and args.seeds is None


def test_standard_errors():
    assert standard_error([1.0, 2.0, 3.0]) == pytest.approx(1.0 / math.sqrt(3))
    assert math.isnan(standard_error([1.0]))
    assert binomial_standard_error(0.6, 300) == pytest.approx(math.sqrt(0.24 / 300))
    assert math.isnan(binomial_standard_error(0.5, None)) and math.isnan(binomial_standard_error(0.5, 0))


def _imports(path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            base = node.module if node.level == 0 else f"contrastkit.{path.parent.name}.{node.module}"
            yield base, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []


def test_studies_never_import_commands_and_nobody_imports_their_private_names():
    for path in sorted((SRC / "studies").glob("*.py")):
        for module, _ in _imports(path):
            assert not module.startswith(("contrastkit.commands", "contrastkit.cli")), (path.name, module)
    for folder in ("studies", "commands"):
        for path in sorted((SRC / folder).glob("*.py")):
            for module, names in _imports(path):
                if not module.startswith("contrastkit."):
                    continue
                private = [n for n in names if n.startswith("_")]
                private_module = [p for p in module.split(".")[1:] if p.startswith("_") and p != "_io"]
                assert not private and not private_module, (f"{folder}/{path.name}", module, names)

"""Fuzzing the config-file parser: a ``--config`` file damaged (truncated, bit-flipped, a field
overwritten, garbage appended, grown past the input ceiling) or made of arbitrary bytes is
read by ``pretrain``, ``sweep`` and ``experiment`` in a child limited to 1 GiB of memory
above its start (``_bounded.py``) and ends, like any bad input, in exit status 2 after one error line, with
nothing written. The runs are asked to ``--resume`` a folder that does not exist, so a file
that happens to parse stops right after it is read instead of training."""

import json
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from _bounded import damage, fuzz_settings, worker, write_damaged  # noqa: F401 (worker is a fixture)

FUZZ = fuzz_settings()

VALID = {
    "pretrain": {"data": "glyphlab", "epochs": 2, "batch-size": 8, "temperature": 0.2, "seed": 1,
                 "data-option": ["train_scenes=16"], "logger": "csv"},
    "sweep": {"temperatures": "0.1,0.5", "seeds": 1, "epochs": 1, "batch-size": 8},
    "experiment": {"seeds": 1, "epochs": 1, "batch-size": 8},
}


def _yaml(settings):
    lines = []
    for key, value in settings.items():
        lines.append(f"{key}: {json.dumps(value)}")  # JSON values are YAML flow values
    return ("# a contrastkit config file\n" + "\n".join(lines) + "\n").encode()


def _argv(command, config, out):
    extra = ["positive-pairs"] if command == "experiment" else []
    return [command, *extra, "--config", str(config), "--resume", "--out", str(out)]


def _assert_refused(answer, command, folder, name):
    assert "returned" in answer, answer.get("traceback", answer)
    result = answer["returned"]
    assert result["rc"] == 2, result
    lines = result["err"].strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"contrastkit {command}: error: "), result["err"]
    assert "Traceback" not in result["err"]
    assert sorted(os.listdir(folder)) == [name]  # nothing written next to it, no run folder made


@pytest.mark.parametrize("command", sorted(VALID))
@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_damaged_config_file_is_one_error_line(worker, tmp_path_factory, command, suffix):  # noqa: F811
    settings_ = VALID[command]
    data = json.dumps(settings_).encode() if suffix == ".json" else _yaml(settings_)
    root = tmp_path_factory.mktemp("configs")

    @FUZZ
    @given(damaged=damage(data, header=32))
    def check(damaged):
        folder = Path(tempfile.mkdtemp(dir=root))
        config = folder / f"run{suffix}"
        write_damaged(config, damaged)
        answer = worker.call("cli", *_argv(command, config, folder / "missing-run"))
        _assert_refused(answer, command, folder, config.name)

    check()


def test_arbitrary_bytes_as_a_config_file(worker, tmp_path_factory):  # noqa: F811
    root = tmp_path_factory.mktemp("noise")

    @FUZZ
    @given(data=st.binary(max_size=512), suffix=st.sampled_from([".yaml", ".json", ".yml", ".cfg"]))
    def check(data, suffix):
        folder = Path(tempfile.mkdtemp(dir=root))
        config = folder / f"run{suffix}"
        config.write_bytes(data)
        answer = worker.call("cli", *_argv("pretrain", config, folder / "missing-run"))
        _assert_refused(answer, "pretrain", folder, config.name)

    check()


def test_the_undamaged_files_parse_and_stop_at_the_missing_run(worker, tmp_path):  # noqa: F811
    # The control: the valid files are read (the error is about the folder to resume, not the file).
    for command, settings_ in VALID.items():
        for suffix, data in ((".yaml", _yaml(settings_)), (".json", json.dumps(settings_).encode())):
            folder = Path(tempfile.mkdtemp(dir=tmp_path))
            config = folder / f"run{suffix}"
            config.write_bytes(data)
            answer = worker.call("cli", *_argv(command, config, folder / "missing-run"))
            _assert_refused(answer, command, folder, config.name)
            assert "missing-run" in answer["returned"]["err"], (command, suffix, answer["returned"]["err"])

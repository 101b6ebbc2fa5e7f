"""``contrastkit explain``: numbers in the output, --json, --plot, and one-line errors."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from contrastkit.analysis import explain, sweep
from contrastkit.cli import main

SRC = str(Path(__file__).resolve().parents[2] / "src")
SPEC3 = [[0.879, -0.06, -0.06, -0.06], [-0.06, 0.879, -0.06, -0.06],
         [-0.06, -0.06, 0.879, 0.724], [-0.06, -0.06, 0.724, 0.879]]


def six(x: float) -> str:
    return f"{x:.6f}"


def softmax(scores, tau):
    weights = [math.exp(s / tau) for s in scores]
    return [w / sum(weights) for w in weights]


def run_cli(*argv: str):
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "contrastkit", "explain", *argv],
                          capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture
def spec3_csv(tmp_path):
    path = tmp_path / "spec3.csv"
    path.write_text("# SPEC 3 image-report similarities\n" + "\n".join(",".join(str(x) for x in row) for row in SPEC3))
    return path


@pytest.fixture
def spec2_npy(tmp_path):
    z = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [0.6, 0.8]])
    path = tmp_path / "spec2.npy"
    np.save(path, z @ z.T)
    return path


def test_no_arguments_explains_the_seed_example_in_a_subprocess():
    done = run_cli()
    assert done.returncode == 0, done.stderr
    p = softmax([1.0, 0.5, 0.0], 0.5)
    for x in p:
        assert six(x) in done.stdout
    assert six(-math.log(p[0])) in done.stdout                   # 0.407606
    assert six((p[0] - 1) / 0.5) in done.stdout                  # dL/ds+
    assert six(p[1] / 0.5) in done.stdout and six(p[2] / 0.5) in done.stdout
    assert f"log 3 = {six(math.log(3))}" in done.stdout
    assert "0 +" in done.stdout                                  # the positive is marked
    assert "tau -> 0+: loss -> 0" in done.stdout
    assert "Traceback" not in done.stderr


def test_scores_with_tau_in_process(capsys):
    assert main(["explain", "1", "0.5", "0", "--tau", "0.5"]) == 0
    out = capsys.readouterr().out
    p = softmax([1.0, 0.5, 0.0], 0.5)
    assert six(p[0]) in out and six(-math.log(p[0])) in out
    # penalty shares of the negatives: p_j / (1 - p+)
    assert six(p[1] / (1 - p[0])) in out and six(p[2] / (1 - p[0])) in out


def test_commas_negative_numbers_and_positive_index(capsys):
    assert main(["explain", "0.2,-0.5", "0.1", "--positive", "2", "--tau", "1"]) == 0
    out = capsys.readouterr().out
    p = softmax([0.2, -0.5, 0.1], 1.0)
    assert six(p[2]) in out and six(-math.log(p[2])) in out
    assert "2 +" in out
    assert "loss -> inf" in out  # 0.2 > 0.1: a negative wins as tau -> 0


def test_temperature_sweep_prints_the_spec1_block(capsys):
    assert main(["explain", "0.8", "0.4", "0.2", "--tau", "1,0.5,0.1"]) == 0
    out = capsys.readouterr().out
    for tau, cited in ((1.0, "0.4506"), (0.5, "0.5713"), (0.1, "0.9796")):
        p = softmax([0.8, 0.4, 0.2], tau)
        assert round(p[0], 4) == float(cited) and six(p[0]) in out
        assert six(-math.log(p[0])) in out
    assert "frozen encoder" in out


def test_matrix_diagonal_sweep_spec3(capsys, spec3_csv):
    assert main(["explain", "--matrix", str(spec3_csv), "--diagonal", "--tau", "0.01,0.1,1"]) == 0
    out = capsys.readouterr().out
    for tau in (0.1, 1.0):
        mean = sum(-math.log(softmax(SPEC3[i], tau)[i]) for i in range(4)) / 4
        assert six(mean) in out
    assert six(0.0964324716) in out and six(0.8731635148) in out  # SPEC §3: 0.0964, 0.8732
    assert "9.277e-08" in out  # tau = 0.01: 2 * log(1 + e^-15.5 + 2 e^-93.9) / 4, not a false 0


def test_matrix_positives_excludes_diagonal(capsys, spec2_npy):
    assert main(["explain", "--matrix", str(spec2_npy), "--positives", "1,0,3,2", "--tau", "1", "--row", "1"]) == 0
    out = capsys.readouterr().out
    s = np.load(spec2_npy)
    # row 1 without its self-similarity: candidates 0 (positive), 2, 3
    row = [s[1, 0], s[1, 2], s[1, 3]]
    loss = -math.log(softmax(row, 1.0)[0])
    assert six(loss) in out and "1 (self)" in out and "excluded" in out
    assert six(math.log(3)) in out


def test_json_matches_library(capsys):
    assert main(["explain", "1", "0.5", "0", "--tau", "0.5", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    reference = explain([1.0, 0.5, 0.0], temperature=0.5)
    for name in ("logits", "probabilities", "gradients", "penalty", "penalty_entropy", "effective_negatives",
                 "hardest_negative", "log_n", "limit_zero", "limit_zero_rate", "limit_infinity", "losses"):
        np.testing.assert_allclose(np.array(data[name], dtype=float), getattr(reference, name), rtol=1e-15)
    assert data["loss"] == pytest.approx(-math.log(softmax([1.0, 0.5, 0.0], 0.5)[0]), rel=1e-12)


def test_json_sweep_and_infinite_limit(capsys, spec3_csv):
    assert main(["explain", "0.9", "0.95", "--tau", "1,0.1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["temperatures"] == [1.0, 0.1]
    assert data["results"][0]["limit_zero"] == ["Infinity"]
    assert data["losses"] == pytest.approx([-math.log(softmax([0.9, 0.95], t)[0]) for t in (1.0, 0.1)])
    assert main(["explain", "--matrix", str(spec3_csv), "--diagonal", "--tau", "0.1,1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    reference = sweep(SPEC3, temperatures=[0.1, 1.0], positive=range(4))
    np.testing.assert_allclose(data["losses"], reference.losses, rtol=1e-15)


def test_plot_writes_png_and_never_overwrites(tmp_path, capsys):
    path = tmp_path / "temperature.png"
    assert main(["explain", "0.8", "0.4", "0.2", "--tau", "1,0.5,0.1", "--plot", str(path)]) == 0
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    capsys.readouterr()
    assert main(["explain", "--plot", str(path)]) == 2
    assert "--force" in capsys.readouterr().err
    assert path.read_bytes() == data
    assert main(["explain", "--plot", str(path), "--force"]) == 0
    assert path.read_bytes() != data


def test_plot_panels_are_labelled():
    from contrastkit.analysis import plot_temperature

    # ten candidates: the positive, the six hardest negatives and one summed line per panel
    row = [0.5, 0.9, 0.8, 0.7, 0.6, 0.4, 0.3, 0.2, 0.1, 0.0]
    fig = plot_temperature(row, temperatures=[0.1, 0.5])
    axes = fig.axes
    assert len(axes) == 3
    for ax in axes:
        assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()
        assert ax.get_legend() is not None
    assert axes[0].get_xscale() == "log" and axes[1].get_xscale() == "log"
    labels = [t.get_text() for t in axes[0].get_legend().get_texts()]
    assert any("positive" in x for x in labels) and any("3 other negatives" in x for x in labels)
    # panel (c): the dots are the actual penalty shares of the negatives at tau = 0.1
    dots = [line for line in axes[2].get_lines() if line.get_marker() == "o"]
    shares = explain(row, temperature=0.1).penalty[0, 1:]
    np.testing.assert_allclose(dots[0].get_ydata(), shares, rtol=1e-12)


def test_plot_matrix_anchor(tmp_path, spec2_npy):
    path = tmp_path / "anchor.png"
    assert main(["explain", "--matrix", str(spec2_npy), "--positives", "1,0,3,2", "--row", "1",
                 "--plot", str(path), "--json"]) == 0
    assert path.stat().st_size > 20_000


def test_rich_tables_keep_every_digit():
    from contrastkit.commands.explain_output import print_anchor

    pytest.importorskip("rich")
    for width in (120, 40):  # 40 columns is too narrow: falls back to plain lines, never truncates
        buffer = io.StringIO()
        print_anchor(explain([1.0, 0.5, 0.0], temperature=0.5), header="header", stream=buffer, rich=True,
                     width=width)
        text = buffer.getvalue()
        for x in softmax([1.0, 0.5, 0.0], 0.5):
            assert six(x) in text
        assert "…" not in text


@pytest.fixture
def bad_files(tmp_path):
    (tmp_path / "ragged.csv").write_text("1,2\n3\n")
    (tmp_path / "words.csv").write_text("a,b\nc,d\n")
    (tmp_path / "rect.csv").write_text("1,0,0\n0,1,0\n")
    (tmp_path / "fake.npy").write_bytes(b"not numpy")
    (tmp_path / "sq.csv").write_text("1,0.2,0.1,0\n0.2,1,0,0.1\n0.1,0,1,0.3\n0,0.1,0.3,1\n")
    np.save(tmp_path / "vector.npy", np.arange(3.0))
    return tmp_path


BAD = [
    (["1", "x", "0"], "not a number"),
    (["1", "0.5", "0", "--tau", "0"], "--tau"),
    (["1", "0.5", "0", "--tau", "-0.5"], "--tau"),
    (["1", "0.5", "0", "--tau", "0.5,abc"], "--tau"),
    (["1", "0.5", "0", "--tau", "inf"], "--tau"),
    (["1", "0.5", "0", "--positive", "3"], "--positive"),
    (["1", "0.5", "0", "--positive", "first"], "--positive"),
    (["1", "nan", "0"], "NaN"),
    (["1"], "negative"),
    (["1", "0.5", "0", "--tau", "1e-320"], "too small"),
    (["--matrix", "{d}/missing.csv", "--diagonal"], "not found"),
    (["--matrix", "{d}", "--diagonal"], "directory"),
    (["--matrix", "{d}/rect.csv", "--diagonal"], "square"),
    (["--matrix", "{d}/vector.npy", "--diagonal"], "square"),
    (["--matrix", "{d}/ragged.csv", "--diagonal"], "cannot read"),
    (["--matrix", "{d}/words.csv", "--diagonal"], "cannot read"),
    (["--matrix", "{d}/fake.npy", "--diagonal"], "not a .npy"),
    (["--matrix", "{d}/sq.csv"], "--positives"),
    (["--matrix", "{d}/sq.csv", "--positives", "1,0,3"], "4 rows"),
    (["--matrix", "{d}/sq.csv", "--positives", "1,0,3,4"], "out of range"),
    (["--matrix", "{d}/sq.csv", "--positives", "1,0,2,3"], "themselves"),
    (["--matrix", "{d}/sq.csv", "--positives", "1,0,x,2"], "integer"),
    (["--matrix", "{d}/sq.csv", "--positives", ","], "empty"),
    (["--matrix", "{d}/sq.csv", "--diagonal", "--row", "9"], "--row"),
    (["--matrix", "{d}/sq.csv", "--diagonal", "--positive", "1"], "--positives"),
    (["1", "0.5", "--matrix", "{d}/sq.csv", "--diagonal"], "not both"),
    (["1", "0.5", "--positives", "1,0"], "needs --matrix"),
    (["1", "0.5", "--diagonal"], "needs --matrix"),
]


@pytest.mark.parametrize("argv, fragment", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_and_exit_2(argv, fragment, bad_files, capsys):
    argv = [a.format(d=bad_files) for a in argv]
    assert main(["explain", *argv]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("contrastkit explain: error: ") and fragment in lines[0]
    assert captured.out == ""


@pytest.mark.parametrize("argv, fragment", [(["--tau"], "--tau"), (["--bogus"], "unrecognized"),
                                             (["--positives", "1,0", "--diagonal"], "not allowed")])
def test_argparse_errors_are_one_line_too(argv, fragment, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["explain", *argv])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("contrastkit explain: error: ") and fragment in lines[0]


def test_bad_input_in_a_subprocess_has_no_traceback():
    # the remaining bad inputs are checked in-process above; a subprocess costs a Python start-up
    done = run_cli("1", "abc", "--tau", "0.5")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == ["contrastkit explain: error: similarity 'abc' is not a number"]
    assert done.stdout == ""


def test_methods_table_shows_each_method_next_to_the_fixed_tau(capsys):
    from contrastkit.analysis import explain_methods

    assert main(["explain", "0.8", "0.4", "0.2", "0.55", "--tau", "0.5", "--methods", "--plain"]) == 0
    out = capsys.readouterr().out
    comparison = explain_methods([0.8, 0.4, 0.2, 0.55], temperature=0.5)
    for name, view in zip(["fixed tau", "MACL", "dual temperature", "iSogCLR (individual)", "TempNet (network)"],
                          comparison):
        line = next(line for line in out.splitlines() if line.startswith(name + " "))
        assert six(view.temperatures[0]) in line and six(view.positive_pull[0]) in line
        assert six(view.explanation.effective_negatives[0]) in line


def test_one_method_as_json(capsys):
    assert main(["explain", "0.8", "0.4", "0.2", "--tau", "0.3", "--method", "dual:0.1,0.5", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [m["method"] for m in data["methods"]] == ["dual"]
    assert data["methods"][0]["settings"] == {"intra_temperature": 0.1, "inter_temperature": 0.5}
    assert data["fixed"]["temperatures"] == [0.3]


@pytest.mark.parametrize("argv, message", [
    (["0.8", "0.4", "--methods", "--tau", "0.1,0.5"], "give one --tau"),
    (["0.8", "0.4", "--methods", "--sigmoid"], "leave out --sigmoid"),
    (["0.8", "0.4", "--method", "cosine:0.1,1"], "not a temperature method"),
])
def test_methods_errors_are_one_line(argv, message):
    result = run_cli(*argv)
    assert result.returncode != 0 and message in result.stderr and "Traceback" not in result.stderr

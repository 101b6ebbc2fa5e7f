"""``contrastkit.analysis.explain_sigmoid`` and ``contrastkit explain --sigmoid``: the sigmoid
(SigLIP) loss of a row of similarities against autograd, hand-computed values and the
library's loss, next to the softmax view."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from contrastkit.analysis import explain, explain_sigmoid
from contrastkit.cli import main
from contrastkit.commands.explain_output import fmt
from contrastkit.losses import sigmoid_loss

SPEC3 = [[0.879, -0.06, -0.06, -0.06], [-0.06, 0.879, -0.06, -0.06],
         [-0.06, -0.06, 0.879, 0.724], [-0.06, -0.06, 0.724, 0.879]]


def sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_hand_computed_row():
    # s = (1, 0.5, 0), tau = 0.5 (t = 2), b = -1: logits (1, 0, -1), labels (+, -, -).
    e = explain_sigmoid([1.0, 0.5, 0.0], temperature=0.5, bias=-1.0)
    assert e.scale == 2.0 and e.threshold == 0.5
    np.testing.assert_allclose(e.logits[0], [1.0, 0.0, -1.0], rtol=0, atol=1e-15)
    np.testing.assert_allclose(e.match_probabilities[0], [sig(1), 0.5, sig(-1)], rtol=1e-15)
    np.testing.assert_allclose(e.probabilities[0], [sig(1), 0.5, sig(1)], rtol=1e-15)
    terms = [math.log1p(math.exp(-1)), math.log(2), math.log1p(math.exp(-1))]
    np.testing.assert_allclose(e.loss_terms[0], terms, rtol=1e-15)
    assert e.loss == pytest.approx(sum(terms), rel=1e-15)
    residual = [sig(1) - 1, 0.5, sig(-1)]   # q - y
    np.testing.assert_allclose(e.bias_gradients[0], residual, rtol=1e-14)
    np.testing.assert_allclose(e.gradients[0], [2 * r for r in residual], rtol=1e-14)
    np.testing.assert_allclose(e.scale_gradients[0], [1.0 * residual[0], 0.5 * residual[1], 0.0], rtol=1e-14)
    assert e.bias_gradient[0] == pytest.approx(sum(residual), rel=1e-14)
    # The softmax side is explain() at the same tau.
    np.testing.assert_array_equal(e.softmax.probabilities, explain([1.0, 0.5, 0.0], temperature=0.5).probabilities)


@pytest.mark.parametrize("tau,bias", [(0.1, -10.0), (0.5, 0.3), (2.0, -1.5), (0.03, 4.0)])
def test_gradients_match_autograd(tau, bias):
    s = torch.tensor([[0.9, 0.2, -0.4, 0.85, 0.0], [0.1, -0.7, 0.6, 0.3, 0.95]], dtype=torch.float64,
                     requires_grad=True)
    positive = [0, 4]
    t = torch.tensor(1.0 / tau, dtype=torch.float64, requires_grad=True)
    b = torch.tensor(bias, dtype=torch.float64, requires_grad=True)
    z = -torch.ones(2, 5, dtype=torch.float64)
    z[0, 0] = z[1, 4] = 1.0
    row_losses = -torch.nn.functional.logsigmoid(z * (t * s + b)).sum(dim=1)
    e = explain_sigmoid(s.detach(), temperature=tau, bias=bias, positive=positive)
    np.testing.assert_allclose(e.losses, row_losses.detach().numpy(), rtol=1e-13)
    for i in range(2):
        gs, gt, gb = torch.autograd.grad(row_losses[i], (s, t, b), retain_graph=True)
        np.testing.assert_allclose(e.gradients[i], gs[i].numpy(), rtol=1e-12, atol=1e-300)
        assert e.scale_gradient[i] == pytest.approx(float(gt), rel=1e-12, abs=1e-300)
        assert e.bias_gradient[i] == pytest.approx(float(gb), rel=1e-12, abs=1e-300)
    # tau and SigLIP's log-scale t' = log t, by the chain rule through autograd too.
    tau_t = torch.tensor(tau, dtype=torch.float64, requires_grad=True)
    (g_tau,) = torch.autograd.grad(-torch.nn.functional.logsigmoid(z[0] * (s[0].detach() / tau_t + b.detach())).sum(),
                                   tau_t)
    assert e.temperature_gradient[0] == pytest.approx(float(g_tau), rel=1e-12)
    assert e.log_scale_gradient[0] == pytest.approx(e.scale * e.scale_gradient[0], rel=1e-15)


def test_matrix_rows_are_the_library_loss():
    # image = S, text = I (normalize=False): <image_i, text_j> = S_ij, positives on the diagonal.
    s = torch.tensor(SPEC3, dtype=torch.float64)
    e = explain_sigmoid(s, temperature=0.1, bias=-2.0, positive=range(4))
    library = sigmoid_loss(s, torch.eye(4, dtype=torch.float64), temperature=0.1, bias=-2.0, normalize=False,
                           reduction="none")
    np.testing.assert_allclose(e.losses, library.numpy(), rtol=1e-13)
    assert e.loss == pytest.approx(float(sigmoid_loss(s, torch.eye(4, dtype=torch.float64), temperature=0.1,
                                                      bias=-2.0, normalize=False)), rel=1e-13)


def test_what_the_views_show():
    row = [0.8, 0.4, 0.2, -0.1]
    e = explain_sigmoid(row, temperature=0.2, bias=-1.0)
    # Softmax: gradients of a row sum to zero. Sigmoid: they do not, and each pair's depends on its own s only.
    assert abs(e.softmax.gradients.sum()) < 1e-15 and abs(e.gradient_sum[0]) > 0.1
    moved = explain_sigmoid([0.8, 0.4, 0.2, 0.7], temperature=0.2, bias=-1.0)
    np.testing.assert_array_equal(moved.gradients[0, :3], e.gradients[0, :3])
    assert not np.array_equal(moved.softmax.gradients[0, :3], e.softmax.gradients[0, :3])
    # The bias shifts every logit alike: a shift of every s by c equals a bias change of c / tau.
    shifted = explain_sigmoid([x + 0.1 for x in row], temperature=0.2, bias=-1.5)
    np.testing.assert_allclose(shifted.probabilities, e.probabilities, rtol=1e-12)
    np.testing.assert_allclose(shifted.softmax.probabilities, e.softmax.probabilities, rtol=1e-12)
    # At SigLIP's initialisation (t = 10, b = -10) every pair is judged a negative: the threshold is s = 1.
    init = explain_sigmoid(row, temperature=0.1)
    assert init.bias == -10.0 and init.threshold == pytest.approx(1.0)
    assert (init.match_probabilities < 0.5).all()


def test_excluded_diagonal_pairs_count_for_nothing():
    s = np.array([[1.0, 0.6, 0.1], [0.6, 1.0, 0.2], [0.1, 0.2, 1.0]])
    e = explain_sigmoid(s, temperature=0.5, bias=0.0, positive=[1, 0, 0], exclude_diagonal=True)
    for i in range(3):
        assert e.labels[i, i] == 0 and e.loss_terms[i, i] == 0 and e.gradients[i, i] == 0
    assert e.losses[0] == pytest.approx(math.log1p(math.exp(-1.2)) + math.log1p(math.exp(0.2)), rel=1e-14)


def test_exports_and_bad_input():
    e = explain_sigmoid([1.0, 0.5, 0.0], temperature=0.5)
    data = json.loads(e.to_json())
    assert data["bias"] == -10.0 and data["threshold"] == 5.0 and "softmax" in data
    assert len(e.candidate_records()) == 3 and "softmax_gradient" in e.to_csv()
    with pytest.raises(ValueError, match="bias must be finite"):
        explain_sigmoid([1.0, 0.0], temperature=0.5, bias=float("nan"))
    with pytest.raises(TypeError, match="bias must be a number"):
        explain_sigmoid([1.0, 0.0], temperature=0.5, bias="high")
    with pytest.raises(ValueError, match="temperature"):
        explain_sigmoid([1.0, 0.0], temperature=0.0)


def test_cli_prints_both_views(capsys):
    assert main(["explain", "0.9", "0.3", "-0.2", "--sigmoid", "--tau", "0.1", "--bias", "-3", "--plain"]) == 0
    out = capsys.readouterr().out
    e = explain_sigmoid([0.9, 0.3, -0.2], temperature=0.1, bias=-3.0)
    for value in (*e.probabilities[0], *e.gradients[0], *e.softmax.probabilities[0], e.losses[0],
                  e.softmax.losses[0], e.bias_gradient[0], e.scale_gradient[0]):
        assert fmt(value) in out, value
    assert "s > -b tau = 0.300000" in out and "binary decision" in out and "compete" in out


def test_cli_json_and_matrix(capsys, tmp_path):
    assert main(["explain", "1", "0.5", "0", "--sigmoid", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["bias"] == -10.0 and data["temperature"] == 0.5
    assert data["losses"] == pytest.approx(explain_sigmoid([1, 0.5, 0], temperature=0.5).losses.tolist(), rel=1e-15)
    path = tmp_path / "s.csv"
    path.write_text("\n".join(",".join(str(x) for x in row) for row in SPEC3))
    assert main(["explain", "--matrix", str(path), "--diagonal", "--sigmoid", "--tau", "0.1", "--row", "2",
                 "--plain"]) == 0
    out = capsys.readouterr().out
    assert fmt(explain_sigmoid(SPEC3, temperature=0.1, positive=range(4)).loss) in out and "anchor 2:" in out


@pytest.mark.parametrize("argv,fragment", [
    (["1", "0", "--bias", "2"], "--bias needs --sigmoid"),
    (["1", "0", "--sigmoid", "--bias", "x"], "--bias 'x' is not a number"),
    (["1", "0", "--sigmoid", "--bias", "inf"], "--bias must be one finite number"),
    (["1", "0", "--sigmoid", "--plot", "p.png"], "--plot draws the softmax view only"),
])
def test_cli_bad_input_is_one_line(argv, fragment, capsys):
    assert main(["explain", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1


def test_default_bias_is_read_from_its_owner(capsys, monkeypatch):
    import contrastkit.losses.sigmoid

    monkeypatch.setattr(contrastkit.losses.sigmoid, "SIGLIP_BIAS", -3.0)  # the command holds no number of its own
    assert main(["explain", "1", "0.5", "0", "--sigmoid", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bias"] == -3.0


def test_help_names_the_default_bias_without_loading_torch():
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = str(Path(__file__).resolve().parents[2] / "src")
    script = ("import sys; from contrastkit.cli import main\n"
              "try:\n    main(['explain', '--help'])\nexcept SystemExit:\n    pass\n"
              "print('torch loaded' if 'torch' in sys.modules else 'no torch')")
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("no torch")
    bias_help = " ".join(done.stdout.rsplit("--bias B", 1)[1].split("no torch")[0].split())  # its option line
    assert "SigLIP's initialisation" in bias_help and "SIGLIP_BIAS" in bias_help and "10" not in bias_help

"""The temperature explorer driven in a real headless Chromium (Playwright for Python).

The page's displayed numbers are read back and compared with :func:`contrastkit.analysis.explain`
to the precision shown, and the full-precision values kept in ``data-value`` attributes to 1e-12.
Skipped, with the reason, only where Playwright or a Chromium executable cannot be found
(``.ci/install-browser`` installs both). Screenshots go to ``test-artifacts/``.
"""

import math
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from contrastkit.analysis import explain
from contrastkit.report.explorer import PRESETS, ExplorerServer, write_explorer

ARTIFACTS = Path(os.environ.get("CONTRASTKIT_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts"))
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# Fields shown with a fixed number of decimals (the page's display precision).
CANDIDATE_FIELDS = {"logit": ("logits", 4), "prob": ("probabilities", 6), "grad": ("gradients", 4),
                    "pen": ("penalty", 4)}
SUMMARY_FIELDS = {"out-loss": ("loss", 6), "out-log-n": ("log_n", 6), "out-loss-uniform": ("loss_uniform_negatives", 6),
                  "out-limit-zero": ("limit_zero", 6), "out-limit-zero-rate": ("limit_zero_rate", 6),
                  "out-limit-inf": ("limit_infinity", 6), "out-entropy": ("penalty_entropy", 6),
                  "out-effective": ("effective_negatives", 4), "out-margin": ("hardest_margin", 6)}


def _chromium() -> str:
    candidates = [os.environ.get("CONTRASTKIT_CHROMIUM"), "/usr/bin/chromium",
                  shutil.which("chromium"), shutil.which("chromium-browser"), shutil.which("google-chrome")]
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    pytest.skip("no Chromium executable found (looked for $CONTRASTKIT_CHROMIUM, /usr/bin/chromium, chromium, "
                "chromium-browser, google-chrome on PATH); run .ci/install-browser")


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="Playwright for Python is not installed (pip install 'contrastkit[browser]')")
    executable = _chromium()
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def page_file(tmp_path_factory):
    return write_explorer(tmp_path_factory.mktemp("explorer") / "explorer.html")


@pytest.fixture(scope="module")
def tab(browser):
    """One browser tab for the module (a new context costs seconds on a small machine)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme="light")
    tab = context.new_page()
    tab.problems = []
    tab.on("pageerror", lambda err: tab.problems.append(f"page error: {err}"))
    tab.on("console", lambda msg: tab.problems.append(f"console {msg.type}: {msg.text}")
           if msg.type in ("error", "warning") else None)
    tab.on("request", lambda req: tab.problems.append(f"network request: {req.url}")
           if not req.url.startswith(("file:", "data:", "http://127.0.0.1:")) else None)
    yield tab
    context.close()


@pytest.fixture()
def page(tab, page_file):
    """The explorer freshly loaded from file://; no script error, console error or network request."""
    tab.problems.clear()
    tab.goto(page_file.as_uri())
    tab.wait_for_selector("#prob-0:not(:empty)")
    yield tab
    assert tab.problems == []


def screenshot(tab, name):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


# ---------------------------------------------------------------- reading the page


def read_inputs(tab):
    """The similarities, positive and temperature the page is showing (what a user sees)."""
    return tab.evaluate("""() => {
        const rows = document.querySelectorAll('#candidate-rows tr');
        const s = [], checked = [];
        rows.forEach((row, j) => {
            s.push(Number(document.getElementById('sim-' + j).value));
            if (document.getElementById('pos-' + j).checked) checked.push(j);
        });
        return {s: s, positive: checked, tau: Number(document.getElementById('tau-number').value)};
    }""")


def read_outputs(tab):
    return tab.evaluate("""() => {
        const out = {};
        document.querySelectorAll('[data-value]').forEach(el => {
            out[el.id] = {text: el.textContent, value: el.dataset.value};
        });
        return out;
    }""")


def displayed_number(text):
    if text in ("+∞", "−∞"):
        return math.inf if text == "+∞" else -math.inf
    return float(text)


def assert_shown(text, full, expected, decimals, what):
    """Displayed text rounds ``expected`` to ``decimals``; the full value agrees to 1e-12."""
    if math.isinf(expected):
        assert displayed_number(text) == expected and float(full) == expected, what
        return
    if "e" in text:  # tiny but not zero: 3 significant digits
        assert 0 < abs(expected) < 0.5 * 10 ** -decimals, f"{what}: {text} for {expected!r}"
        assert displayed_number(text) == pytest.approx(expected, rel=0.5e-2), f"{what}: {text} for {expected!r}"
    else:
        assert abs(displayed_number(text) - expected) <= 0.5 * 10 ** -decimals + 1e-12 * max(1, abs(expected)), \
            f"{what}: page shows {text}, explain gives {expected!r}"
        assert len(text.split(".")[1]) == decimals if decimals else "." not in text, f"{what}: {text}"
    assert float(full) == pytest.approx(expected, rel=1e-12, abs=1e-13), f"{what}: {full} vs {expected!r}"


def check_page_against_explain(tab):
    shown = read_inputs(tab)
    assert len(shown["positive"]) == 1, "exactly one positive is selected"
    positive = shown["positive"][0]
    e = explain(shown["s"], temperature=shown["tau"], positive=positive)
    out = read_outputs(tab)
    for j in range(len(shown["s"])):
        for prefix, (field, decimals) in CANDIDATE_FIELDS.items():
            if prefix == "pen" and j == positive:
                assert out[f"pen-{j}"]["text"] == "—" and e.penalty[0, j] == 0
                continue
            cell = out[f"{prefix}-{j}"]
            assert_shown(cell["text"], cell["value"], float(getattr(e, field)[0, j]), decimals, f"{field}[{j}]")
    for element, (field, decimals) in SUMMARY_FIELDS.items():
        value = getattr(e, field)
        expected = float(value if np.ndim(value) == 0 else value[0])
        assert_shown(out[element]["text"], out[element]["value"], expected, decimals, field)
    assert_shown(out["out-p-positive"]["text"], out["out-p-positive"]["value"],
                 float(e.positive_probability[0]), 6, "positive probability")
    assert_shown(out["out-tau-loss"]["text"], out["out-tau-loss"]["value"], shown["tau"] * e.loss, 6, "tau * loss")
    assert int(out["out-hardest"]["value"]) == int(e.hardest_negative[0])
    return shown, e


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("preset_id", [p["id"] for p in PRESETS])
def test_each_preset_shows_the_numbers_of_explain(page, preset_id):
    page.click(f"#preset-{preset_id}")
    assert page.get_attribute(f"#preset-{preset_id}", "aria-pressed") == "true"
    shown, _ = check_page_against_explain(page)
    preset = next(p for p in PRESETS if p["id"] == preset_id)
    assert shown == {"s": preset["similarities"], "positive": [preset["positive"]], "tau": preset["temperature"]}
    if preset_id == PRESETS[0]["id"]:
        screenshot(page, "explorer-spec1")
    if preset_id == "s3-row3":
        screenshot(page, "explorer-spec3-convirt")


def test_spec_numbers_as_displayed(page):
    # Independent of explain: the texts' printed numbers, read off the page.
    page.click("#preset-s1-example")
    assert [page.text_content(f"#prob-{j}") for j in range(3)] == ["0.665241", "0.244728", "0.090031"]
    assert page.text_content("#out-loss") == "0.407606"  # SPEC §1: L = 0.4076059644
    page.click("#preset-s2-f2-above")
    assert page.text_content("#out-limit-zero") == "+∞"
    assert page.text_content("#out-limit-zero-rate") == "0.050000"  # A - B = 0.95 - 0.9
    page.click("#preset-s2-f2-tie")
    assert page.text_content("#out-limit-zero") == f"{math.log(2):.6f}"
    assert page.text_content("#out-loss") == f"{math.log(2):.6f}"
    page.click("#preset-s3-row3")
    # SPEC §3 row 3: logits (-0.6, -0.6, 8.79, 7.24), distribution ~ (0, 0, 0.825, 0.175), loss ~ 0.193.
    logits = [-0.6, -0.6, 8.79, 7.24]
    z = sum(math.exp(v - 8.79) for v in logits)
    p = [math.exp(v - 8.79) / z for v in logits]
    assert [round(v, 3) for v in p] == [0, 0, 0.825, 0.175] and round(-math.log(p[2]), 3) == 0.193
    assert [page.text_content(f"#logit-{j}") for j in range(4)] == ["-0.6000", "-0.6000", "8.7900", "7.2400"]
    assert [page.text_content(f"#prob-{j}") for j in (2, 3)] == [f"{p[2]:.6f}", f"{p[3]:.6f}"]
    assert page.text_content("#out-loss") == f"{-math.log(p[2]):.6f}"


def test_keyboard_moves_the_temperature_on_a_log_scale(page):
    page.click("#preset-s1-block-tau05")
    slider = page.locator("#tau-range")
    slider.focus()
    seen = []
    for key, presses in (("ArrowRight", 3), ("ArrowLeft", 10), ("PageDown", 1), ("Home", 1), ("End", 1),
                         ("PageDown", 2)):
        for _ in range(presses):
            page.keyboard.press(key)
        position = float(slider.input_value())
        shown, e = check_page_against_explain(page)
        # The page computes with the temperature it shows: 10**position to 3 significant digits.
        assert shown["tau"] == float(f"{10 ** position:.3g}")
        seen.append((key, position, shown["tau"], e.loss))
    positions = [s[1] for s in seen]
    assert positions[:2] == pytest.approx([-0.3 + 0.03, -0.3 + 0.03 - 0.10])
    assert positions[3] == -2 and positions[4] == 1
    assert seen[3][2] == 0.01 and seen[4][2] == 10.0
    assert page.get_attribute("#tau-range", "aria-valuetext") == f"τ = {seen[-1][2]:g}"
    # Ranking unchanged, distribution sharper at lower tau (SPEC §1): the loss falls with tau here.
    assert seen[3][3] < seen[2][3] < seen[0][3] < seen[4][3]


def test_typing_the_temperature(page):
    page.click("#preset-s1-block-tau1")
    for tau in ("0.5", "0.1", "0.013", "37", "0.0004"):
        page.fill("#tau-number", tau)
        shown, e = check_page_against_explain(page)
        assert shown["tau"] == float(tau)
    # Outside the slider's range the slider sits at its end; the number field keeps the value.
    assert float(page.input_value("#tau-range")) == -2
    page.fill("#tau-number", "0.1")
    _, e = check_page_against_explain(page)
    assert page.text_content("#prob-0") == f"{e.probabilities[0, 0]:.6f}"
    assert round(float(e.probabilities[0, 0]), 4) == 0.9796  # SPEC §1 temperature block at tau = 0.1


def test_invalid_temperature_is_flagged_and_recovered(page):
    page.click("#preset-s1-example")
    for bad in ("0", "-1"):
        page.fill("#tau-number", bad)
        assert page.get_attribute("#tau-number", "aria-invalid") == "true"
        assert "must be a number > 0" in page.text_content("#status")
    page.fill("#tau-number", "0.25")
    assert page.get_attribute("#tau-number", "aria-invalid") is None
    assert page.text_content("#status") == ""
    check_page_against_explain(page)


def test_overflow_is_reported_like_explain(page):
    page.click("#preset-s1-example")
    page.fill("#sim-1", "1e305")
    page.fill("#tau-number", "1e-5")
    assert "too small for these similarities" in page.text_content("#status")
    with pytest.raises(ValueError, match="too small for these similarities"):
        explain([1.0, 1e305, 0.0], temperature=1e-5)


def test_edit_add_remove_candidates_and_choose_the_positive(page):
    page.click("#preset-s1-example")
    page.click("#add-candidate")
    assert page.evaluate("document.activeElement.id") == "sim-3"  # focus moves to the new field
    page.keyboard.type("0.75")
    check_page_against_explain(page)
    page.fill("#sim-0", "-0.2")
    page.locator("#sim-range-2").focus()
    page.keyboard.press("ArrowRight")  # the slider moves by its step, 0.01
    assert page.input_value("#sim-2") == "0.01"
    page.locator("#pos-3").check()
    shown, e = check_page_against_explain(page)
    assert shown["positive"] == [3] and shown["s"] == [-0.2, 0.5, 0.01, 0.75]
    assert page.get_attribute("#preset-s1-example", "aria-pressed") == "false"
    page.click("#remove-1")
    shown, _ = check_page_against_explain(page)
    assert shown["s"] == [-0.2, 0.01, 0.75] and shown["positive"] == [2]
    page.click("#remove-0")
    # The last two cannot be removed: a row needs a positive and a negative.
    assert page.is_disabled("#remove-0") and page.is_disabled("#remove-1")
    shown, _ = check_page_against_explain(page)
    assert shown["s"] == [0.01, 0.75] and shown["positive"] == [1]


def test_keyboard_only_preset_and_every_control_labelled(page):
    page.locator("#preset-s3-row3").focus()
    page.keyboard.press("Enter")
    assert page.get_attribute("#preset-s3-row3", "aria-pressed") == "true"
    assert read_inputs(page)["positive"] == [2]
    unlabelled = page.evaluate("""() => [...document.querySelectorAll('input, button')]
        .filter(el => !(el.labels && el.labels.length) && !el.getAttribute('aria-label') && !el.textContent.trim())
        .map(el => el.id)""")
    assert unlabelled == []
    # Tab order reaches the temperature and the candidates' controls.
    page.locator("#preset-s1-example").focus()
    page.keyboard.press("Enter")
    page.evaluate("""() => { window.focused = [];
        document.addEventListener('focusin', ev => window.focused.push(ev.target.id)); }""")
    for _ in range(24):
        page.keyboard.press("Tab")
    reached = set(page.evaluate("window.focused"))
    assert {"tau-range", "tau-number", "pos-0", "sim-range-0", "sim-0", "add-candidate"} <= reached


def test_narrow_screen_scrolls_the_table_not_the_page(page):
    page.set_viewport_size({"width": 700, "height": 900})
    try:
        page.click("#preset-s4-hardness")
        assert page.evaluate("document.documentElement.scrollWidth") == 700
        check_page_against_explain(page)
    finally:
        page.set_viewport_size({"width": 1280, "height": 900})


def test_javascript_formulas_equal_explain_on_random_rows(page):
    rng = random.Random(9)
    cases = []
    for _ in range(60):
        k = rng.randint(2, 12)
        s = [round(rng.uniform(-1, 1), rng.choice([1, 2, 3])) for _ in range(k)]
        if rng.random() < 0.3:
            s[rng.randrange(k)] = max(s)  # ties at the top
        cases.append((s, rng.randrange(k), 10 ** rng.uniform(-2.5, 1.5)))
    results = page.evaluate("cases => cases.map(([s, p, t]) => window.contrastkitExplorer.explainRow(s, p, t))", cases)
    for (s, positive, tau), js in zip(cases, results):
        e = explain(s, temperature=tau, positive=positive)
        for field in ("logits", "probabilities", "gradients", "penalty"):
            np.testing.assert_allclose(js[field], getattr(e, field)[0], rtol=1e-11, atol=1e-13, err_msg=field)
        for field in ("penalty_entropy", "effective_negatives", "hardest_margin", "log_n", "loss_uniform_negatives",
                      "limit_zero", "limit_zero_rate", "limit_infinity"):
            expected = float(getattr(e, field)[0])
            assert js[field] == pytest.approx(expected, rel=1e-11, abs=1e-13), field
        assert js["loss"] == pytest.approx(e.loss, rel=1e-11, abs=1e-13)
        assert js["hardest_negative"] == int(e.hardest_negative[0])


def test_state_survives_in_the_link(page, page_file):
    page.click("#preset-s2-f2-above")
    link = page.evaluate("location.href")
    assert link.startswith(page_file.as_uri() + "#")
    page.goto(link)
    page.reload()
    assert read_inputs(page) == {"s": [0.9, 0.95], "positive": [0], "tau": 0.1}
    check_page_against_explain(page)


def test_served_page_in_the_browser(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        tab = context.new_page()
        with ExplorerServer(0) as server:
            tab.goto(server.url)
            tab.click("#preset-s1-block-tau01")
            check_page_against_explain(tab)
            tab.fill("#tau-number", "0.02")
            shown, _ = check_page_against_explain(tab)
            assert shown["tau"] == 0.02
            screenshot(tab, "explorer-served-tau0.02")
    finally:
        context.close()


def test_a_similarity_of_many_digits_is_shown_whole(page):
    """A user's model gives similarities such as -0.8372415304183960: the box widens to show
    every digit (a fixed 4.9rem box showed "-0.83724" and hid the rest)."""
    whole = "() => [...document.querySelectorAll('.sim input[type=number]')].every(el => el.scrollWidth <= el.clientWidth)"
    page.fill("#sim-0", "-0.8372415304183960")
    page.fill("#sim-1", "0.5")
    assert page.evaluate(whole)
    page.goto(page.evaluate("location.href"))  # from the link, as a report's explorer opens
    page.reload()
    assert page.input_value("#sim-0") == "-0.837241530418396" and page.evaluate(whole)

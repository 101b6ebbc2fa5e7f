"""The pictures of a run's report (views, neighbors, map, one real batch), the explorer on the
run's real rows and the sweep report's neighbors per temperature, checked against the run's own
data and checkpoint recomputed here; a CIFAR-10 run's report screenshotted in Chromium.

The browser tests skip, with the reason, where Playwright or a Chromium cannot be found; the
CIFAR-10 test where the real data (``shared/data/cifar10-jpeg.tar.gz`` next to the checkout, or
``$CONTRASTKIT_CIFAR10_TARBALL``) is absent. Screenshots go to ``test-artifacts/``.
"""

import base64
import io
import json
import os
import shutil
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import torch

from _tiny_run import tiny_config
from contrastkit.analysis import explain
from contrastkit.cli import main
from contrastkit.report import report_html, write_report
from contrastkit.report.document import fmt
from contrastkit.train import pretrain
from contrastkit.train.last_batch import read_last_batch
from contrastkit.train.runs import load_run

from _data_fixtures import CIFAR_TARBALL, cifar_subset

PIL = pytest.importorskip("PIL.Image", reason="pillow decodes the page's PNG images here")

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("CONTRASTKIT_TEST_ARTIFACTS", ROOT / "test-artifacts"))
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SECTIONS = ("views", "neighbors", "map", "batch")


# ------------------------------------------------------------------------------ reading a page

class Images(HTMLParser):
    """Every ``<img>`` of a page with its attributes and the id of the section it is in."""

    def __init__(self):
        super().__init__()
        self.section, self.images, self.sections, self.links = None, [], [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section":
            self.section = attrs.get("id")
            self.sections.append(self.section)
        elif tag == "img":
            self.images.append({**attrs, "section": self.section})
        elif tag == "a":
            self.links.append(attrs.get("href"))


def parse(page):
    parser = Images()
    parser.feed(page)
    return parser


def decoded(img):
    data = img["src"].removeprefix("data:image/png;base64,")
    array = np.asarray(PIL.open(io.BytesIO(base64.b64decode(data))))
    return array[:, :, None] if array.ndim == 2 else array


def as_hwc(image):
    """A data set's ``(C, H, W)`` image (float in [0, 1] or uint8) as the page's ``(H, W, C)`` uint8."""
    image = image.detach().cpu()
    if image.dtype != torch.uint8:
        image = (image.float().clamp(0, 1) * 255).round().to(torch.uint8)
    return image.permute(1, 2, 0).numpy()


def check_pictures(run, page):
    """Each picture is present and made of the run's own data: every image is the data set's image
    it names, the views are the last batch's, the neighbors those of the run's checkpoint."""
    parsed = parse(page)
    for section in SECTIONS:
        assert section in parsed.sections, f"the report has no {section} picture"
    saved = load_run(str(run))
    dataset = saved.load_data()
    batch = read_last_batch(str(run))
    splits = {"train": dataset.train, "test": dataset.test if len(dataset.test) else dataset.val}
    by_section = {}
    for img in parsed.images:
        if "data-index" not in img:
            continue
        by_section.setdefault(img["section"], []).append(img)
        index, view = int(img["data-index"]), img.get("data-view")
        pixels = decoded(img)
        if view in ("view A", "view B", "image"):
            item = batch.indices.tolist().index(index)
            stored = batch.picture(item, {"view A": 0, "view B": 1, "image": 2}[view])
            assert np.array_equal(pixels, stored.permute(1, 2, 0).numpy()), (img["section"], index, view)
        else:  # a source image or a held-out image: the data set's own
            from contrastkit.data.loader import read_images

            expected = as_hwc(read_images(splits[img["data-split"]], torch.tensor([index]))[0])
            assert np.array_equal(pixels, expected), (img["section"], img["data-split"], index)
    assert len(by_section["views"]) == 3 * len(batch.shown)  # source, view A, view B of each shown element
    # Neighbors: recomputed from the checkpoint's encoder on the held-out images.
    test = splits["test"]
    from contrastkit.data.loader import read_images

    images = read_images(test, torch.arange(len(test))).float()
    images = images / 255 if images.max() > 1 else images
    encoder = saved.build_model(tuple(dataset.image_shape), torch.device("cpu")).encoder.eval()
    with torch.no_grad():
        h = torch.nn.functional.normalize(encoder(images).double(), dim=1)
    rows = [img for img in by_section["neighbors"]]
    queries = [img for img in rows if "anchor" in img["class"]]
    assert 1 <= len(queries) <= 8
    trained = [img for img in rows if "anchor" not in img["class"] and "trained" in img.get("title", "")]
    per_query = len(trained) // len(queries)
    assert per_query == min(6, len(test) - 1)
    for q, query in enumerate(queries):
        qi = int(query["data-index"])
        shown = [int(img["data-index"]) for img in trained[q * per_query:(q + 1) * per_query]]
        similarity = (h @ h[qi]).numpy()
        similarity[qi] = -np.inf
        kth = np.sort(similarity)[::-1][per_query - 1]
        assert all(similarity[i] >= kth - 1e-5 for i in shown), (qi, shown)
        assert all(similarity[a] >= similarity[b] - 1e-5 for a, b in zip(shown, shown[1:]))
        label = int(test.labels[qi])
        for img, i in zip(trained[q * per_query:(q + 1) * per_query], shown):
            assert ("same" in img["class"]) == (int(test.labels[i]) == label)
    # Map: every held-out image of the sample, thumbnails named.
    assert f'data-map-points="{min(len(test), 1000)}"' in page and 'data-map-method="t-SNE"' in page
    # One real batch: the numbers are explain's on the batch the run kept.
    e = batch.explanation()
    assert f'<div class="value">{fmt(float(e.positive_probability.mean()), 3)}</div>' in page  # the mean p+ card
    lowest = int(np.argmin(e.positive_probability))
    assert batch.anchors["lowest"] == lowest
    assert f"Anchor {lowest}: p+ = {e.positive_probability[lowest]:.4f}" in page
    return parsed


# ------------------------------------------------------------------------------ runs

@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("pictures") / "run"
    pretrain(tiny_config(out, epochs=2), progress=False, baselines=False)
    write_report(out)
    return out




@pytest.fixture(scope="module")
def cifar_run(tmp_path_factory):
    if not CIFAR_TARBALL:
        pytest.skip("the CIFAR-10 JPEG tarball (shared/data/cifar10-jpeg.tar.gz next to the checkout, or "
                    "$CONTRASTKIT_CIFAR10_TARBALL) is not present")
    root = tmp_path_factory.mktemp("cifar")
    data = cifar_subset(root / "cifar10", per_class=40)
    out = root / "run"
    pretrain(tiny_config(out, data=str(data), data_options={}, epochs=2, batch_size=32, log_every=2),
             progress=False, baselines=False)
    assert main(["report", str(out)]) == 0
    return out


# ------------------------------------------------------------------------------ the run report

def test_run_report_shows_the_four_pictures_made_of_the_runs_own_data(tiny_run):
    page = (tiny_run / "report.html").read_text(encoding="utf-8")
    parsed = check_pictures(tiny_run, page)
    assert parsed.sections.index("views") < parsed.sections.index("batch") < parsed.sections.index("training")
    assert parsed.links == ["explorer.html"] and (tiny_run / "explorer.html").is_file()
    # Still one file: every image embedded, no script.
    assert "<script" not in page.lower()
    assert all(img["src"].startswith("data:image/png;base64,") for img in parsed.images)


def test_report_without_pictures_reads_no_checkpoint(tiny_run, tmp_path, monkeypatch):
    import contrastkit.report.pictures as pictures

    monkeypatch.setattr(pictures, "held_out_pictures", lambda *a, **k: pytest.fail("read the checkpoint"))
    out = tmp_path / "plain.html"
    assert main(["report", str(tiny_run), "--out", str(out), "--no-pictures"]) == 0
    sections = parse(out.read_text(encoding="utf-8")).sections
    assert not set(SECTIONS) & set(sections) and "training" in sections


def test_a_run_whose_data_cannot_be_read_says_so_in_one_line(tiny_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    record = json.loads((run / "config.json").read_text())
    record["config"]["data_options"]["train_scenes"] = 3  # the data no longer match the checkpoint's run
    (run / "config.json").write_text(json.dumps(record))
    page = report_html(run)
    assert "no pictures of held-out images: checkpoint" in page and "does not belong to the run" in page
    assert 'id="views"' in page  # the last batch's pictures need neither


def test_a_file_of_the_users_in_the_explorers_place_is_kept(tiny_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    (run / "explorer.html").unlink()
    (run / "explorer.html").write_text("my notes")
    page = write_report(run, pictures=True).read_text(encoding="utf-8")
    assert (run / "explorer.html").read_text() == "my notes"
    assert 'id="batch"' in page and 'href="explorer.html"' not in page


@pytest.mark.parametrize("damage", [b"not a torch file", None])
def test_a_damaged_last_batch_is_one_line_in_the_report_and_for_explore(tiny_run, tmp_path, capsys, damage):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    path = run / "last_batch.pt"
    if damage is None:  # a readable file of another format version
        torch.save({"format": 99}, path)
    else:
        path.write_bytes(damage)
    page = report_html(run)
    assert "last_batch.pt" in page and ("cannot be read" in page or "format 99" in page)
    assert 'id="views"' not in page and 'id="neighbors"' in page  # the held-out pictures need no batch
    assert main(["explore", str(run), "--no-open", "--out", str(tmp_path / "e.html")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("contrastkit explore: error: ") and "last_batch.pt" in err and len(err.splitlines()) == 1


def test_the_page_records_the_time_its_pictures_took(tiny_run):
    """(The cost against a run's time is measured on CIFAR-10: benchmarks/bench_pictures.py.)"""
    from contrastkit.report.run_page import run_page

    page = run_page(tiny_run)
    assert page.timings["pictures"] > 0


# ------------------------------------------------------------------------------ the explorer on real rows

def _chromium():
    for path in (os.environ.get("CONTRASTKIT_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                 shutil.which("chromium-browser"), shutil.which("google-chrome")):
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


@pytest.fixture()
def tab(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme="light")
    tab = context.new_page()
    tab.problems = []
    tab.on("pageerror", lambda err: tab.problems.append(f"page error: {err}"))
    tab.on("console", lambda msg: tab.problems.append(f"console {msg.type}: {msg.text}")
           if msg.type in ("error", "warning") else None)
    tab.on("request", lambda req: tab.problems.append(f"network request: {req.url}")
           if not req.url.startswith(("file:", "data:")) else None)
    yield tab
    assert tab.problems == []
    context.close()


def screenshot(tab, name):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def test_explore_run_loads_real_rows_that_agree_with_explain(tiny_run, tmp_path, tab, capsys):
    out = tmp_path / "explorer.html"
    assert main(["explore", str(tiny_run), "--no-open", "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    batch = read_last_batch(str(tiny_run))
    whole = batch.explanation()
    tab.goto(out.as_uri())
    tab.wait_for_selector("#prob-0:not(:empty)")
    presets = tab.evaluate("JSON.parse(document.getElementById('ck-presets').textContent)")
    rows = [p for p in presets if p["id"].startswith("run-")]
    assert [p["id"] for p in rows] == ["run-lowest", "run-median", "run-highest"]
    assert tab.get_attribute("#preset-run-lowest", "aria-pressed") == "true"  # the page opens on it
    p_positive = whole.positive_probability
    assert [p_positive[p["row"]] for p in rows] == sorted(p_positive[p["row"]] for p in rows)
    assert rows[0]["row"] == int(np.argmin(p_positive)) and rows[2]["row"] == int(np.argmax(p_positive))
    for preset in rows:
        assert tab.evaluate(f"window.contrastkitExplorer.loadPreset('{preset['id']}')")
        state = tab.evaluate("window.contrastkitExplorer.state()")
        result = tab.evaluate("window.contrastkitExplorer.result()")
        row, columns = preset["row"], preset["columns"]
        # The row is the batch's: its similarities, its positive (first), every candidate of its
        # denominator, at the run's tau.
        assert state["s"] == batch.similarities[row, columns].double().tolist()
        assert state["tau"] == batch.temperature and state["positive"] == 0
        assert columns[0] == int(batch.positive[row]) and sorted(columns) == sorted(
            c for c in range(batch.shape[1]) if whole.in_denominator[row, c])
        e = explain(state["s"], temperature=state["tau"], positive=0)
        assert abs(result["loss"] - e.loss) <= 1e-9
        for field in ("probabilities", "gradients", "penalty", "logits"):
            np.testing.assert_allclose(result[field], getattr(e, field)[0], rtol=0, atol=1e-9, err_msg=field)
        assert abs(result["effective_negatives"] - float(e.effective_negatives[0])) <= 1e-9
        # ... and what explain computes for that row of the whole batch.
        np.testing.assert_allclose(result["probabilities"], whole.probabilities[row, columns], atol=1e-9)
        shown = float(tab.get_attribute("#out-loss", "data-value"))
        assert abs(shown - float(whole.losses[row])) <= 1e-9
    screenshot(tab, "explorer-run-rows")


def test_the_reports_link_opens_the_explorer_on_the_run(tiny_run, tab):
    tab.goto((tiny_run / "report.html").as_uri())
    tab.click("#batch a")
    tab.wait_for_selector("#prob-0:not(:empty)")
    assert tab.url.endswith("explorer.html") or "explorer.html#" in tab.url
    assert tab.get_attribute("#preset-run-lowest", "aria-pressed") == "true"


def test_explore_refuses_what_is_not_a_finished_run(tmp_path, capsys):
    for argv, message in (([str(tmp_path / "nope")], "does not exist"), ([str(tmp_path)], "has no last_batch.pt")):
        assert main(["explore", *argv, "--no-open"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("contrastkit explore: error: ") and message in err and len(err.splitlines()) == 1


# ------------------------------------------------------------------------------ CIFAR-10 in Chromium

def test_cifar10_report_in_chromium(cifar_run, tab):
    page = (cifar_run / "report.html").read_text(encoding="utf-8")
    check_pictures(cifar_run, page)
    tab.goto((cifar_run / "report.html").as_uri())
    for section in SECTIONS:
        assert tab.locator(f"#{section}").is_visible()
    broken = tab.evaluate("Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0)).length")
    assert broken == 0
    assert tab.evaluate("document.images.length") > 100
    screenshot(tab, "report-cifar10")
    for section in SECTIONS:
        tab.locator(f"#{section}").screenshot(path=str(ARTIFACTS / f"report-cifar10-{section}.png"))


# ------------------------------------------------------------------------------ a sweep of two temperatures

def test_sweep_report_shows_the_same_queries_per_temperature(tmp_path):
    from contrastkit.studies import SWEEP

    from _tiny_run import TINY_GLYPHLAB

    out = tmp_path / "sweep"
    SWEEP.run(str(out), progress=False, jobs=1, temperatures=[0.1, 0.5], seeds=1, epochs=2, batch_size=8,
              no_variants=True, data_options=dict(TINY_GLYPHLAB), device="cpu")
    page = report_html(out)
    parsed = parse(page)
    assert "neighbors-by-tau" in parsed.sections and "diagnostics-by-tau" in parsed.sections
    header = page[page.index('id="neighbors-by-tau-table"'):]
    header = header[:header.index("</thead>")]
    assert ">random init<" in header and ">τ = 0.1<" in header and ">τ = 0.5<" in header
    images = [img for img in parsed.images if img["section"] == "neighbors-by-tau"]
    queries = [int(img["data-index"]) for img in images if "anchor" in img["class"]]
    by_encoder = {}
    for img in images:
        if "data-encoder" in img:
            by_encoder.setdefault(img["data-encoder"], []).append(int(img["data-index"]))
    assert set(by_encoder) == {"random init", "τ = 0.1", "τ = 0.5"}
    for tau in (0.1, 0.5):  # each column is that run's own encoder on the same held-out images
        run = out / "runs" / f"nt_xent-tau{tau:g}-seed0"
        saved = load_run(str(run))
        dataset = saved.load_data()
        encoder = saved.build_model(tuple(dataset.image_shape), torch.device("cpu")).encoder.eval()
        with torch.no_grad():
            h = torch.nn.functional.normalize(encoder(dataset.test.images).double(), dim=1)
        shown = by_encoder[f"τ = {tau:g}"]
        assert len(shown) == 4 * len(queries)
        for q, query in enumerate(queries):
            similarity = (h @ h[query]).numpy()
            similarity[query] = -np.inf
            kth = np.sort(similarity)[::-1][3]
            assert all(similarity[i] >= kth - 1e-5 for i in shown[4 * q:4 * q + 4])
    table = page[page.index('id="diagnostics-by-tau"'):]
    assert ">0.1<" in table and ">0.5<" in table and "effective negatives" in table

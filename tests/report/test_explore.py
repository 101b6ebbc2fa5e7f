"""The temperature explorer without a browser: the page is self-contained, its presets are the
texts' examples, the file is never written over a user's file, the server and the CLI."""

import json
import math
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from contrastkit.cli import main
from contrastkit.report.explorer import PRESETS, ExplorerServer, explorer_html, is_explorer_page, write_explorer

SRC = Path(__file__).resolve().parents[2] / "src"
SVG_NAMESPACE = "http://www.w3.org/2000/svg"  # an XML name, never fetched


def softmax(values):
    top = max(values)
    e = [math.exp(v - top) for v in values]
    return [x / sum(e) for x in e]


def preset(preset_id):
    return next(p for p in PRESETS if p["id"] == preset_id)


def preset_probabilities(preset_id):
    p = preset(preset_id)
    return softmax([s / p["temperature"] for s in p["similarities"]]), p["positive"]


# ---------------------------------------------------------------- the page


def test_page_is_self_contained():
    page = explorer_html()
    assert page.startswith("<!DOCTYPE html>")
    assert "{{" not in page  # every placeholder filled
    # No external resource of any kind: no src/href to a file or URL, no URL but the SVG namespace.
    assert not re.search(r"<(script|img|iframe|link)[^>]*\b(src|href)\s*=", page, flags=re.I)
    assert re.findall(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}[^\s\"'<>)]*", page, flags=re.I) == [SVG_NAMESPACE]
    # The browser itself is told to refuse any network access.
    assert "default-src 'none'" in page
    assert '<meta name="generator" content="contrastkit explore">' in page


def test_page_embeds_every_preset_as_json():
    page = explorer_html()
    blob = re.search(r'<script type="application/json" id="ck-presets">(.*?)</script>', page, flags=re.S)
    assert json.loads(blob.group(1)) == PRESETS
    ids = [p["id"] for p in PRESETS]
    assert len(set(ids)) == len(ids)
    for p in PRESETS:
        assert len(p["labels"]) == len(p["similarities"]) >= 2
        assert 0 <= p["positive"] < len(p["similarities"]) and p["temperature"] > 0


def test_page_cites_the_sources_by_name():
    # The presets name the texts a reader can look up, never section numbers of an internal file.
    page = explorer_html()
    assert "SPEC" not in page and "§" not in page
    groups = {p["group"] for p in PRESETS}
    assert groups == {"Course page P10", "Textbook 30.2, exercise F2", "ConVIRT tutorial", "Wang & Liu: hardness"}


def test_script_text_cannot_close_the_script_element():
    page = explorer_html(presets=[dict(PRESETS[0], note="a </script><b>x</b> note")])
    assert "</script><b>" not in page
    with pytest.raises(ValueError, match="presets is empty"):
        explorer_html(presets=[])


# ---------------------------------------------------------------- presets are the texts' examples


def test_preset_spec1_worked_example():
    # SPEC §1: s = (1, 0.5, 0), first positive, tau = 0.5 -> p and L as printed by the text.
    p, positive = preset_probabilities("s1-example")
    assert positive == 0
    assert p == pytest.approx([0.6652409558, 0.2447284711, 0.0900305732], abs=1e-10)
    assert -math.log(p[0]) == pytest.approx(0.4076059644, abs=1e-10)


@pytest.mark.parametrize("preset_id, p_positive", [
    ("s1-block-tau1", 0.4506), ("s1-block-tau05", 0.5713), ("s1-block-tau01", 0.9796)])
def test_preset_spec1_temperature_block(preset_id, p_positive):
    p, positive = preset_probabilities(preset_id)
    assert p[positive] == pytest.approx(p_positive, abs=5e-5)


def test_presets_spec2_f2_limits():
    # SPEC §2 F2: row 0 of N = 3, p(0) = 1, S01 = 0.9 is the positive, S02 the only negative.
    for preset_id, s02 in (("s2-f2", -0.1), ("s2-f2-above", 0.95), ("s2-f2-tie", 0.9)):
        p = preset(preset_id)
        assert p["similarities"] == [0.9, s02] and p["positive"] == 0
    # The tie gives p_+ = 1/2 at every tau, i.e. L = log 2 (the lemma's log m, m = 2).
    p, _ = preset_probabilities("s2-f2-tie")
    assert -math.log(p[0]) == pytest.approx(math.log(2), abs=1e-12)


def test_preset_spec3_row3():
    # SPEC §3, row 3 of S at tau = 0.1: logits (-0.6, -0.6, 8.79, 7.24), p ~ (0, 0, 0.825, 0.175), loss ~ 0.193.
    p, positive = preset_probabilities("s3-row3")
    assert positive == 2
    assert [s / 0.1 for s in preset("s3-row3")["similarities"]] == pytest.approx([-0.6, -0.6, 8.79, 7.24])
    assert p == pytest.approx([0, 0, 0.825, 0.175], abs=5e-4)
    assert -math.log(p[2]) == pytest.approx(0.193, abs=5e-4)


# ---------------------------------------------------------------- writing the file


def test_write_refuses_a_user_file_and_replaces_its_own(tmp_path):
    target = tmp_path / "page.html"
    write_explorer(target)
    assert is_explorer_page(target)
    write_explorer(target)  # our own page: replaced without asking
    user = tmp_path / "notes.html"
    user.write_text("<html>my notes</html>")
    with pytest.raises(FileExistsError, match="not written by contrastkit.*--force"):
        write_explorer(user)
    assert user.read_text() == "<html>my notes</html>"
    write_explorer(user, force=True)
    assert is_explorer_page(user)
    # no temporary left; the page is recorded in the folder's manifest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["contrastkit-manifest.json", "notes.html", "page.html"]


def test_write_errors(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a directory"):
        write_explorer(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        write_explorer(tmp_path / "missing" / "page.html")


def test_cli_writes_the_page(tmp_path, capsys, monkeypatch):
    opened = []
    monkeypatch.setattr("webbrowser.open", lambda url: opened.append(url) or True)
    monkeypatch.chdir(tmp_path)
    assert main(["explore", "--no-open"]) == 0
    assert is_explorer_page(tmp_path / "contrastkit-explorer.html")
    assert "wrote contrastkit-explorer.html" in capsys.readouterr().out
    assert opened == []

    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setattr("sys.platform", "linux")
    assert main(["explore"]) == 0  # no display: say where the page is instead of a console browser
    assert "no display found: open file://" in capsys.readouterr().out and opened == []

    monkeypatch.setenv("DISPLAY", ":0")
    assert main(["explore", "--out", "other.html"]) == 0
    assert opened == [(tmp_path / "other.html").as_uri()]


@pytest.mark.parametrize("argv, message", [
    (["--port", "9000"], "--port and --serve-seconds only apply with --serve"),
    (["--serve", "--port", "70000", "--no-open"], "--port must be in [0, 65535]"),
    (["--serve", "--serve-seconds", "0", "--no-open"], "--serve-seconds must be a positive number"),
    (["--serve", "--serve-seconds", "inf", "--no-open"], "--serve-seconds must be a positive number"),
    (["--out", "mine.html", "--no-open"], "mine.html exists and was not written by contrastkit"),
    (["--out", "nowhere/page.html", "--no-open"], "does not exist"),
])
def test_cli_errors(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.html").write_text("mine")
    assert main(["explore", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("contrastkit explore: error: ") and message in err
    assert len(err.strip().splitlines()) == 1
    assert (tmp_path / "mine.html").read_text() == "mine"


# ---------------------------------------------------------------- serving


def test_server_serves_only_the_page_on_localhost():
    with ExplorerServer(0) as server:
        assert server.url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(server.url, timeout=10) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/html")
            assert response.read().decode("utf-8") == explorer_html()
        for path in ("../../etc/passwd", "explorer.js", "assets/"):
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(server.url + path, timeout=10)
            assert err.value.code == 404
    with pytest.raises(ValueError, match="port must be"):
        ExplorerServer(-1)


def test_cli_serve_prints_the_url_and_serves(tmp_path):
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}
    process = subprocess.Popen(
        [sys.executable, "-m", "contrastkit", "explore", "--serve", "--port", "0", "--no-open",
         "--serve-seconds", "60"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert url, (line, process.stderr.read() if process.poll() is not None else "")
        with urllib.request.urlopen(url.group(0), timeout=10) as response:
            assert "contrastkit explore" in response.read().decode("utf-8")
    finally:
        process.terminate()
        process.wait(timeout=10)
    assert list(tmp_path.iterdir()) == []  # --serve without --out writes nothing


def test_the_page_takes_the_temperature_methods_settings_and_names_from_their_records():
    """The explorer's methods view computes with the defaults and shows the names that the
    methods' records hold (contrastkit.temperature_methods), embedded in the page, not a copy."""
    from contrastkit.report.explorer import explorer_html
    from contrastkit.temperature_methods import get_temperature_method

    page = explorer_html()
    embedded = json.loads(re.search(r'<script type="application/json" id="ck-methods">(.*?)</script>',
                                    page, re.S).group(1))
    assert list(embedded) == ["macl", "dual", "individual", "network"]
    for name, shown in embedded.items():
        record = get_temperature_method(name)
        assert shown == {"label": record.label, "settings": dict(record.defaults)}
        assert f'<option value="{name}">{record.label}</option>' in page
        assert f'<tr><th scope="row">{record.label}</th><td class="num" id="m-tau-{name}"></td>' in page
    assert embedded["macl"]["settings"] == {"temperature": 0.1, "alpha": 0.5, "threshold": 0.0}

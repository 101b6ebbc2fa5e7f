"""The read-out benchmark runs (on GlyphLab, seconds) and checks what it claims: the next run's
baselines come from the cache, with the first run's numbers."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_read_out_benchmark_times_a_first_and_a_next_run(tmp_path):
    out = tmp_path / "readout.json"
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "bench_readout.py"), "glyphlab", "--batch-size", "32",
         "--steps", "1", "--threads", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "the next run's numbers are the first run's: identical" in done.stdout
    record = json.loads(out.read_text())
    first, following = record["readouts"].values()
    assert first["numbers"] == following["numbers"]
    assert not list(tmp_path.glob("**/baselines/*.json"))  # the benchmark's cache was temporary

"""``contrastkit explore [RUN]``: write (or serve) the interactive temperature explorer and open it;
given a run folder, on real rows of that run's last training batch
(:func:`contrastkit.report.explorer.run_presets`), written to ``RUN/explorer.html``."""

from __future__ import annotations

import argparse
from pathlib import Path

from contrastkit import layout
from contrastkit.commands.common import UsageError

DEFAULT_OUT = "contrastkit-explorer.html"
DEFAULT_SERVE_SECONDS = 3600.0
DEFAULT_PORT = 8765


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", nargs="?", default=None,
                        help="a contrastkit pretrain output: open the explorer on the anchors of lowest, median and "
                             "highest p+ of its last training batch, at its tau (default: the texts' examples only)")
    parser.add_argument("--out", metavar="FILE", default=None,
                        help=f"where to write the page (default ./{DEFAULT_OUT}, RUN/explorer.html for a run; with "
                             "--serve, nothing is written unless --out is given)")
    parser.add_argument("--force", action="store_true",
                        help="replace FILE even if it was not written by contrastkit")
    parser.add_argument("--serve", action="store_true",
                        help="serve the page on http://127.0.0.1:PORT/ (this machine only) instead of opening a file")
    parser.add_argument("--port", type=int, default=None,
                        help=f"port for --serve (default {DEFAULT_PORT}; 0 picks a free one)")
    parser.add_argument("--serve-seconds", type=float, default=None, metavar="S",
                        help=f"stop serving after S seconds (default {DEFAULT_SERVE_SECONDS:g}); Ctrl+C stops earlier")
    parser.add_argument("--no-open", action="store_true", help="do not open a web browser")


def run(args: argparse.Namespace) -> int:
    from contrastkit.report.document import open_in_browser
    from contrastkit.report.explorer import PRESETS, ExplorerServer, write_explorer

    if not args.serve and (args.port is not None or args.serve_seconds is not None):
        raise UsageError("--port and --serve-seconds only apply with --serve")
    port = DEFAULT_PORT if args.port is None else args.port
    seconds = DEFAULT_SERVE_SECONDS if args.serve_seconds is None else args.serve_seconds
    if not 0 <= port <= 65535:
        raise UsageError(f"--port must be in [0, 65535], got {port}")
    if not 0 < seconds < float("inf"):
        raise UsageError(f"--serve-seconds must be a positive number of seconds, got {seconds:g}")

    presets, default_out = None, DEFAULT_OUT
    if args.run is not None:
        presets, default_out = _run_rows(args.run), layout.RunFolder(args.run).explorer
        presets += PRESETS
    if args.out is not None or not args.serve:
        path = write_explorer(Path(args.out if args.out is not None else default_out), force=args.force,
                              presets=presets)
        print(f"wrote {path}")
        if not args.serve and not args.no_open:
            open_in_browser(path.resolve().as_uri())
    if args.serve:
        server = ExplorerServer(port, presets=presets)
        print(f"serving the explorer on {server.url} for {seconds:g} s (Ctrl+C to stop)", flush=True)
        if not args.no_open:
            open_in_browser(server.url)
        try:
            server.serve_for(seconds)
        except KeyboardInterrupt:
            print("stopped")
    return 0


def _run_rows(run: str) -> list:
    """The explorer's rows of the run folder ``run`` (its last batch)."""
    import os

    from contrastkit.report.explorer import run_presets
    from contrastkit.train.last_batch import read_last_batch

    if not os.path.isdir(run):
        raise FileNotFoundError(f"run folder {run} does not exist")
    batch = read_last_batch(run)
    if batch is None:
        raise ValueError(f"{run} has no {layout.LAST_BATCH}: it is not a finished contrastkit pretrain run, or was "
                         "written by an older contrastkit (train it again to keep its last batch)")
    return run_presets(batch)

"""``contrastkit report``: one self-contained HTML file for a run, a sweep or an experiment folder."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", metavar="RUN_DIR",
                        help="a contrastkit pretrain output, a sweep folder (sweep.csv) or an experiment folder")
    parser.add_argument("--out", metavar="FILE", default=None, help="where to write the page (default RUN_DIR/report.html)")
    parser.add_argument("--force", action="store_true", help="replace FILE even if it was not written by contrastkit")
    parser.add_argument("--open", action="store_true", help="open the report in a web browser")
    parser.add_argument("--no-pictures", action="store_true",
                        help="leave out the pictures of the run's images (views, neighbors, map, one real batch; "
                             "for a sweep, its temperatures' neighbors), which read the checkpoints and data")


def run(args: argparse.Namespace) -> int:
    from contrastkit.report.html import detect_kind, write_report

    kind = detect_kind(args.folder)
    path = write_report(args.folder, args.out, force=args.force, pictures=not args.no_pictures)
    print(f"wrote {path} ({kind} report)")
    if args.open:
        from contrastkit.report.document import open_in_browser

        open_in_browser(path.resolve().as_uri())
    return 0

"""``contrastkit shard SOURCE OUT``: write image data as tar shards (WebDataset's layout, as img2dataset writes it)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from contrastkit._io import escape_line
from contrastkit.commands.common import print_left_out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write SOURCE (a class-folder tree, an unlabeled collection: a folder or a .txt/.csv list of images, or an "
        "image-text CSV) as tar shards in OUT: 00000.tar, ... with KEY.jpg|png|..., KEY.cls (class id), KEY.txt "
        "(caption), KEY.json per sample, index.json and classes.txt; a source with train/val/test parts gets "
        "one shard set per part (OUT/train, ...). --data OUT (or OUT/train) trains from them. Run again after "
        "an interruption: the shards already written are kept, the rest written.")
    parser.add_argument("source", metavar="SOURCE", help="class-folder tree, image folder or list, or image-text CSV")
    parser.add_argument("out", metavar="OUT", help="the folder to write the shards in (created)")
    parser.add_argument("--shard-size", type=int, default=1000, metavar="N", help="samples per shard (default 1000)")
    parser.add_argument("--resize", type=int, default=None, metavar="S",
                        help="store images with their shorter side at most S pixels, aspect ratio kept (default: "
                             "the files' bytes unchanged)")
    parser.add_argument("--workers", type=int, default=0, metavar="N",
                        help="processes writing shards in parallel (default 0: this one)")
    parser.add_argument("--bad-files", choices=("skip", "fail"), default="skip",
                        help="an image that cannot be read: leave it out and name it (skip, default) or stop (fail)")
    parser.add_argument("--force", action="store_true",
                        help="start over in an OUT written with other settings (deletes only what contrastkit wrote)")
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    parser.add_argument("--json", action="store_true", help="print what was written as JSON")


def run(args: argparse.Namespace) -> int:
    from contrastkit.data.shard_writer import write_shards

    def progress(done: int, total: int) -> None:
        if not args.quiet and not args.json and sys.stderr.isatty():
            print(f"\rshards {done}/{total}", end="" if done < total else "\n", file=sys.stderr, flush=True)

    result = write_shards(args.source, args.out, shard_size=args.shard_size, resize=args.resize, workers=args.workers,
                          force=args.force, bad_files=args.bad_files, progress=progress)
    if args.json:
        print(json.dumps(asdict(result), indent=2, sort_keys=True))
        return 0
    for part, written in result.parts.items():
        where = escape_line(written.folder)
        label = "" if part == "all" else f"{part}: "
        print(f"{label}wrote {written.samples} samples in {len(written.shards)} shards to {where}"
              + (f"; {len(written.left_out)} files left out" if written.left_out else ""))
        print_left_out(written.left_out)
    if result.kept:
        print(f"kept {result.kept} shards written before (unchanged since)")
    return 0

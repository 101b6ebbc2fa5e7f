"""``contrastkit neighbors RUN QUERY... --k 8``: the images of a run's collection nearest to each
query, by cosine similarity of the encoder's h, printed and drawn (see
:mod:`contrastkit.train.neighbors`)."""

from __future__ import annotations

import argparse
import json
import os

from contrastkit._io import escape_line
from contrastkit.commands.common import (UsageError, add_collection_changed_argument, parse_data_options, print_left_out,
                                         print_skipped)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Print, for each query, the k images of a pretraining run's collection nearest to it by cosine "
        "similarity of h (the encoder's output, what the linear probe reads: the projection head's z "
        "discards what the augmentations change), and draw them in a PNG. The collection is the run's own "
        "data set (train, val and test; --split for one, --data for another data set). A QUERY is an image "
        "file, SPLIT:INDEX (test:12: image 12 of the test split) or ROW (12: row 12 of the collection, rows "
        "numbered train, val, test, as contrastkit embed numbers its rows); a query that is an image of the "
        "collection is left out of its own neighbors. The damaged files an unlabeled collection skips are named "
        "and have no row: never a neighbor, and refused as a query. The search is exact (torch, in chunks); "
        "--index faiss builds a FAISS flat index, saved in RUN/neighbors/ and reused while the checkpoint and "
        "the data are unchanged.")
    parser.add_argument("run_dir", metavar="RUN", help="output folder of contrastkit pretrain")
    parser.add_argument("queries", metavar="QUERY", nargs="+",
                        help="an image file, SPLIT:INDEX (e.g. test:12) or a collection ROW (e.g. 12); "
                             "write a file named like a number as ./12")
    parser.add_argument("--k", type=int, default=8, help="neighbors per query (default 8)")
    parser.add_argument("--data", default=None,
                        help="data set to search: glyphlab, digits or a path "
                             "(default: the run's own, with its options)")
    parser.add_argument("--data-option", action="append", default=None, metavar="KEY=VALUE",
                        help="loader option for --data, repeatable (VALUE parsed as JSON if it can be)")
    parser.add_argument("--split", choices=("train", "val", "test", "all"), default="all",
                        help="the collection: one split, or all (default: train, val and test)")
    parser.add_argument("--index", choices=("exact", "faiss"), default="exact",
                        help="exact: torch, in chunks (default); faiss: a FAISS IndexFlatIP, saved in RUN/neighbors/ "
                             "and reused (needs pip install 'contrastkit[faiss]')")
    parser.add_argument("--chunk", type=int, default=None, metavar="N",
                        help="rows compared at once by the exact search (default 4096: a 64 MiB block)")
    parser.add_argument("--out", default=None, metavar="PNG",
                        help="where to draw the queries and their neighbors (default RUN/neighbors.png; "
                             "an earlier picture of this command is replaced, any other file never)")
    parser.add_argument("--no-picture", action="store_true", help="draw no picture")
    parser.add_argument("--checkpoint", default=None, help="checkpoint file (default RUN/checkpoints/last.pt)")
    parser.add_argument("--batch-size", type=int, default=256, help="images per forward pass (default 256)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, ... (default auto)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: the run's setting)")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes decoding a streamed data set's images (default: the run's setting)")
    parser.add_argument("--json", action="store_true", help="print the neighbors as JSON")
    add_collection_changed_argument(parser.add_argument, "neighbors")


def run(args: argparse.Namespace) -> int:
    from contrastkit import layout
    from contrastkit.metrics.search import DEFAULT_CHUNK, FaissMissingError
    from contrastkit.train.embed import left_out_note, skipped_note
    from contrastkit.train.neighbors import find_neighbors

    if args.k < 1:
        raise ValueError(f"--k must be at least 1, got {args.k}")
    if args.chunk is not None and args.chunk < 1:
        raise ValueError(f"--chunk must be at least 1, got {args.chunk}")
    if args.data_option is not None and args.data is None:
        raise UsageError("--data-option applies to --data (the run's own data set keeps its options)")
    if args.no_picture and args.out is not None:
        raise UsageError("--out names the picture that --no-picture leaves out: give one of them")
    picture = None if args.no_picture else (args.out or layout.RunFolder(args.run_dir).neighbors_picture)
    if picture is not None and args.out is None and not os.path.isdir(args.run_dir):
        picture = None  # the missing run is reported by the search, not as a missing picture folder
    try:
        search = find_neighbors(args.run_dir, args.queries, k=args.k, data=args.data,
                                data_options=parse_data_options(args.data_option), split=args.split,
                                index=args.index, picture=picture, checkpoint=args.checkpoint,
                                chunk=args.chunk or DEFAULT_CHUNK, device=args.device, batch_size=args.batch_size,
                                threads=args.threads, workers=args.workers,
                                collection_changed=args.collection_changed)
    except FaissMissingError as err:  # an ImportError: the one line says which extra to install
        raise UsageError(str(err)) from None
    if args.json:
        print(json.dumps(search.to_dict(), indent=2, sort_keys=True))
        return 0
    skipped = (f"; {skipped_note(len(search.skipped))}" if search.skipped else "") \
        + (f"; {left_out_note(len(search.left_out))}" if search.left_out else "")
    # The data set's name and the files are the user's: a byte that is not UTF-8 is written \xNN.
    print(f"the {search.k} nearest of {search.rows} images ({'+'.join(search.splits)} of {escape_line(search.data)}"
          f"{skipped}) by cosine similarity of h, {search.index} search"
          + (f" ({'reused' if search.index_reused else 'built and saved'} {escape_line(search.index_file)})"
             if search.index_file else ""))
    print_skipped(search.skipped)
    print_left_out(search.left_out)
    for query in search.queries:
        print()
        print(f"{escape_line(query.query)}{_described(query.image, query.query)}")
        for neighbor in query.neighbors:
            print(f"  {neighbor.rank:>3}  {neighbor.similarity:7.4f}  {neighbor.image.id}{_described(neighbor.image)}")
    if search.picture:
        print()
        print(f"wrote {escape_line(search.picture)}")
    return 0


def _described(image, given: str = "") -> str:
    """What follows an image's id on its line: its class, and its file where the id is not one."""
    parts = []
    if image.class_name is not None or image.label is not None:
        parts.append(image.class_name if image.class_name is not None else f"class {image.label}")
    if image.split is not None and image.name != str(image.index):
        parts.append(image.name)
    if given and given != image.id and image.split is not None:
        parts.insert(0, image.id)
    # One line per image, whatever its file is called: a newline or a tab in a name is written \xNN.
    return ("  " + "  ".join(escape_line(part) for part in parts)) if parts else ""

"""``contrastkit embed RUN --out FILE``: a run's embeddings of a data set, to ``.npy``/``.csv`` or ``.npz``."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from contrastkit._io import escape_line
from contrastkit.commands.common import add_collection_changed_argument, parse_data_options, print_left_out, print_skipped


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write the embeddings of a pretraining run's encoder: h (the encoder output, what the linear probe "
        "reads) and, with --projection, z (the projection head's output), one row per image, with its "
        "split, label and name. OUT ending in .npz: one archive (h, z, labels, splits, names); otherwise "
        "OUT.npy, OUT_z.npy and OUT.csv. The encoder is rebuilt from RUN (config.json and its checkpoint).")
    parser.add_argument("run_dir", metavar="RUN", help="output folder of contrastkit pretrain")
    parser.add_argument("--out", required=True, metavar="FILE", help="FILE.npz, or FILE.npy / FILE (.npy + .csv)")
    parser.add_argument("--data", default=None,
                        help="data set to embed: glyphlab, digits or a path (default: the run's own, with its options)")
    parser.add_argument("--data-option", action="append", default=None, metavar="KEY=VALUE",
                        help="loader option for --data, repeatable (VALUE parsed as JSON if it can be)")
    parser.add_argument("--split", choices=("train", "val", "test", "all"), default="all",
                        help="which split (default all: train, val and test)")
    parser.add_argument("--projection", action="store_true", help="also write z, the projection head's output")
    parser.add_argument("--checkpoint", default=None, help="checkpoint file (default RUN/checkpoints/last.pt)")
    parser.add_argument("--batch-size", type=int, default=256, help="images per forward pass (default 256)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, ... (default auto)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: the run's setting)")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes decoding a streamed data set's images, a batch at a time (default: the run's setting)")
    parser.add_argument("--force", action="store_true",
                        help="replace the files of an earlier contrastkit embed output (never other files)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--json", action="store_true", help="print what was written as JSON")
    add_collection_changed_argument(parser.add_argument, "embed")


def run(args: argparse.Namespace) -> int:
    from contrastkit.train.embed import export_embeddings, left_out_note, skipped_note

    if args.data_option is not None and args.data is None:
        raise ValueError("--data-option applies to --data (the run's own data set keeps its options)")
    result = export_embeddings(args.run_dir, args.out, data=args.data, data_options=parse_data_options(args.data_option),
                               split=args.split, projection=args.projection, checkpoint=args.checkpoint,
                               force=args.force, device=args.device, batch_size=args.batch_size,
                               threads=args.threads, workers=args.workers, progress=False if args.quiet else None,
                               collection_changed=args.collection_changed)
    if args.json:
        print(json.dumps(asdict(result), indent=2, sort_keys=True))
        return 0
    widths = f"h {result.h_dim}" + (f", z {result.z_dim}" if result.z_dim is not None else "")
    written = ", ".join(escape_line(path) for role, path in result.files.items() if role != "marker")
    print(f"wrote {result.rows} rows ({widths}) of {'+'.join(result.splits)} to {written}"
          + (f"; {skipped_note(len(result.skipped))}" if result.skipped else "")
          + (f"; {left_out_note(len(result.left_out))}" if result.left_out else ""))
    print_skipped(result.skipped)
    print_left_out(result.left_out)
    return 0

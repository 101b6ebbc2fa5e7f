"""``contrastkit export RUN --format safetensors|onnx|torchscript --out FILE``: a run's encoder for deployment."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from contrastkit.layout import MODEL_FORMATS  # standard library only: --help stays light


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write a pretraining run's encoder (and, with --projection, its projection head) as a safetensors state "
        "dict, an ONNX graph or a TorchScript file, with FILE.contrastkit.json: its input contract (channels, "
        "size, the resize and crop rule of the run's data, interpolation, pixel scale and normalisation; "
        "contrastkit.data.preprocess_image applies it), outputs and the check of the export against the PyTorch encoder "
        "(ONNX read back with onnxruntime, TorchScript with torch.jit.load). The encoder is rebuilt from RUN "
        "(config.json and its checkpoint).")
    parser.add_argument("run_dir", metavar="RUN", help="output folder of contrastkit pretrain")
    parser.add_argument("--out", required=True, metavar="FILE",
                        help="the file to write; without a suffix it gets the format's (.safetensors, .onnx, .pt)")
    parser.add_argument("--format", choices=tuple(MODEL_FORMATS), default=None,
                        help="safetensors (needs contrastkit[safetensors]), onnx (needs contrastkit[onnx]) or "
                             "torchscript (default: the one the suffix of --out names)")
    parser.add_argument("--projection", action="store_true",
                        help="also export the projection head: a second output z (safetensors: keys encoder.* and head.*)")
    parser.add_argument("--checkpoint", default=None, help="checkpoint file (default RUN/checkpoints/last.pt)")
    parser.add_argument("--opset", type=int, default=17, help="ONNX opset (default 17)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: the run's setting)")
    parser.add_argument("--force", action="store_true",
                        help="replace the files of an earlier contrastkit export (never other files)")
    parser.add_argument("--json", action="store_true", help="print what was written as JSON")


def run(args: argparse.Namespace) -> int:
    from contrastkit.train import export_model

    result = export_model(args.run_dir, args.out, format=args.format, projection=args.projection,
                          checkpoint=args.checkpoint, force=args.force, opset=args.opset, threads=args.threads)
    if args.json:
        print(json.dumps(asdict(result), indent=2, sort_keys=True))
        return 0
    outputs = f"h {result.h_dim}" + (f", z {result.z_dim}" if result.z_dim is not None else "")
    shape = "x".join(map(str, result.input_shape))
    print(f"wrote {result.files['model']} ({result.format}: {shape} images -> {outputs}) and its input contract "
          f"{result.files['marker']}")
    if result.checked_with is None:
        print("not checked against the PyTorch encoder: onnxruntime is not installed (pip install 'contrastkit[onnx]')")
    else:
        print(f"checked against the PyTorch encoder with {result.checked_with}: largest difference "
              f"{result.max_abs_diff:.2g}")
    return 0

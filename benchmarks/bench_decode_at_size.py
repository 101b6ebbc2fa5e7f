"""Decoding JPEG photos at the size used: images/s of a training epoch on camera-size JPEGs,
contrastkit's reduced decode against a full decode and against torchvision ``ImageFolder`` + PIL,
and how far the reduced decode's pixels are from a full decode's.

Each configuration runs in its own process and trains one whole epoch of an unlabeled photo
folder's training split, as ``pretrain`` does: :func:`~contrastkit.data.make_loader` with
``--workers`` DataLoader workers over an :class:`~contrastkit.data.EpochBatchSampler`, the batched
kornia views, the small CNN with its projection head, NT-Xent and AdamW. The readers:

* ``contrastkit``: the collection as it reads (a JPEG decoded at the smallest DCT scale that
  keeps the size used, :mod:`contrastkit.data.preprocess`);
* ``contrastkit, full decode``: the same, every file decoded whole
  (``ImagePreprocessing.read(..., full_decode=True)``), what it did before;
* ``torchvision ImageFolder + PIL``: ``torchvision.datasets.ImageFolder`` over the same training
  files, ``Resize(S)`` + ``CenterCrop(S)`` + ``PILToTensor`` (the same pixels' recipe, on a full
  decode), the same sampler, workers, views and step.

The page cache is warmed before the first configuration (every file read once), so the figures
are decoding, not the disk. Then, per image size, the pixel difference of the reduced decode
from the full one over every photo (mean, 99th percentile and maximum of ``|a - b|`` in levels of
255).

Photo sets (``--photos DIR``, any number): a flat folder of JPEG photos. The committed results
used (1) Debian 12's photographic wallpapers, the largest file of each (``apt-get download
plasma-workspace-wallpapers mate-backgrounds``, ``dpkg-deb -x``, then for each wallpaper the
largest ``.jpg``: 35 photos, median 2560 x 1600, up to 5640 x 3172) and (2) ``--camera N``: ``N``
synthetic 12-megapixel (4000 x 3000) JPEGs made from CIFAR-10 test images (bicubic upscale plus
sensor-like grain, quality 90), written under ``--work``.

    PYTHONPATH=src python benchmarks/bench_decode_at_size.py --photos WALLPAPERS \\
        --camera 96 --cifar10 CIFAR10_DIR --sizes 64 128 224 --workers 2 --batch-size 8 --epochs 3 \\
        --out benchmarks/results/decode_at_size.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

READERS = ["contrastkit", "contrastkit, full decode", "torchvision ImageFolder + PIL"]


def build_camera_set(cifar: Path, out: Path, count: int) -> Path:
    """``count`` 4000 x 3000 JPEGs from CIFAR-10 test images (bicubic upscale, grain, quality 90)."""
    from PIL import Image

    if out.is_dir() and len(list(out.glob("*.jpg"))) == count:
        return out
    out.mkdir(parents=True, exist_ok=True)
    classes = sorted(p for p in (cifar / "test").iterdir() if p.is_dir())
    files = [sorted(c.glob("*.jpg")) for c in classes]
    rng = np.random.default_rng(0)
    for i in range(count):
        with Image.open(files[i % len(classes)][i // len(classes)]) as image:
            big = np.asarray(image.convert("RGB").resize((4000, 3000), Image.BICUBIC), dtype=np.float32)
        big += rng.normal(0.0, 4.0, size=big.shape).astype(np.float32)
        Image.fromarray(np.clip(big, 0, 255).astype(np.uint8)).save(out / f"camera{i:03d}.jpg", quality=90)
    return out


class _TorchvisionSplit(torch.utils.data.Dataset):
    """torchvision ``ImageFolder`` items ``(uint8 image, index)`` as the loader's streamed splits give."""

    def __init__(self, files: List[str], size: int, work: Path) -> None:
        from torchvision import datasets, transforms

        tree = work / f"tv-{os.getpid()}" / "photos"
        tree.mkdir(parents=True, exist_ok=True)
        for i, file in enumerate(files):  # one class folder of links, in the split's order
            link = tree / f"{i:05d}{Path(file).suffix}"
            if not link.exists():
                os.symlink(os.path.abspath(file), link)
        self.folder = datasets.ImageFolder(str(tree.parent), transform=transforms.Compose(
            [transforms.Resize(size), transforms.CenterCrop(size), transforms.PILToTensor()]))

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, index: int):
        image, _ = self.folder[index]
        return image, index


def one(folder: str, reader: str, size: int, workers: int, batch_size: int, epochs: int,
        work: str) -> Dict[str, Any]:
    """One configuration, in this process: ``epochs`` epochs, the first a warm-up (the workers'
    start); images/s of the others, then of as many epochs of the loader alone."""
    from contrastkit import losses
    from contrastkit.data import EpochBatchSampler, make_loader, make_views
    from contrastkit.data.collection import open_collection
    from contrastkit.data.preprocess import ImagePreprocessing
    from contrastkit.methods import build_model
    from contrastkit.train import PretrainConfig

    torch.set_num_threads(1)
    data = open_collection(folder, size=size, color="RGB", val_fraction=0.05, test_fraction=0.05)
    split = data.train
    if reader == "contrastkit, full decode":
        plain = ImagePreprocessing.read
        ImagePreprocessing.read = lambda self, path, full_decode=False: plain(self, path, full_decode=True)
    elif reader == "torchvision ImageFolder + PIL":
        split = _TorchvisionSplit([data.train.path(i) for i in range(len(data.train))], size, Path(work))
    views = make_views(data, device="cpu")
    model = build_model(PretrainConfig(seed=0).resolved(), data.image_shape)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    sampler = EpochBatchSampler(len(split), batch_size, seed=0)
    if reader == "torchvision ImageFolder + PIL":  # torch's own loader, as a torchvision user writes it
        loader = torch.utils.data.DataLoader(split, batch_sampler=sampler, num_workers=workers,
                                             persistent_workers=workers > 0, prefetch_factor=2 if workers else None)
    else:
        loader = make_loader(split, batch_sampler=sampler, workers=workers)
    torch.manual_seed(0)
    images = 0
    for epoch in range(epochs):
        if epoch == 1:  # the workers are up: time the epochs after the first
            started, images = time.perf_counter(), 0
        sampler.set_epoch(epoch)
        for batch, _ in loader:
            view_a, view_b = views.views_of(batch)
            z = model.head(model.encoder(torch.cat([view_a, view_b])))
            loss = losses.nt_xent_views(*z.chunk(2), temperature=0.2)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            images += batch.shape[0]
    seconds = time.perf_counter() - started
    # Then the loader alone (no step) for as many epochs: what the decoding itself delivers.
    started, alone = time.perf_counter(), 0
    for epoch in range(epochs, 2 * epochs - 1):
        sampler.set_epoch(epoch)
        for batch, _ in loader:
            alone += batch.shape[0]
    alone_seconds = time.perf_counter() - started
    return {"reader": reader, "size": size, "images": images // (epochs - 1), "seconds": seconds / (epochs - 1),
            "images_per_second": images / seconds, "loader_images_per_second": alone / alone_seconds}


def pixel_difference(folder: Path, size: int) -> Dict[str, float]:
    """The reduced decode's pixels against a full decode's, every photo of ``folder``."""
    from contrastkit.data.preprocess import SHORTER_SIDE_THEN_CENTRE_CROP, ImagePreprocessing

    crop = ImagePreprocessing("RGB", (size, size), SHORTER_SIDE_THEN_CENTRE_CROP)
    differences = []
    for file in sorted(folder.glob("*.jpg")):
        reduced = crop.read(file).astype(np.int16)
        full = crop.read(file, full_decode=True).astype(np.int16)
        differences.append(np.abs(reduced - full).ravel())
    every = np.concatenate(differences)
    return {"mean": float(every.mean()), "p99": float(np.percentile(every, 99)), "max": int(every.max())}


def _describe(folder: Path) -> str:
    from PIL import Image

    pixels = []
    for file in sorted(folder.glob("*.jpg")):
        with Image.open(file) as image:
            pixels.append(image.size)
    areas = sorted(w * h for w, h in pixels)
    median = sorted(pixels, key=lambda s: s[0] * s[1])[len(pixels) // 2]
    return (f"{len(pixels)} JPEGs, median {median[0]} x {median[1]} ({areas[len(areas) // 2] / 1e6:.1f} MP), "
            f"largest {max(areas) / 1e6:.1f} MP, {sum(f.stat().st_size for f in folder.glob('*.jpg')) / 2**20:.0f} MiB")


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=Path, nargs="*", default=[], help="flat folders of JPEG photos")
    parser.add_argument("--camera", type=int, default=0, help="also N synthetic 12 MP JPEGs (needs --cifar10)")
    parser.add_argument("--cifar10", type=Path, default=None, help="CIFAR-10 as a class-folder tree (test/)")
    parser.add_argument("--work", type=Path, default=None, help="where the synthetic set and links go")
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 128, 224])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=3, help="per row; the first is a warm-up")
    parser.add_argument("--out", type=Path, default=None, help="write the Markdown table here too")
    parser.add_argument("--one", nargs=3, metavar=("FOLDER", "READER", "SIZE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="decode-bench-"))
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1], int(args.one[2]), args.workers, args.batch_size,
                             args.epochs, str(work))))
        return 0
    folders = [p.resolve() for p in args.photos]
    if args.camera:
        if args.cifar10 is None:
            parser.error("--camera needs --cifar10")
        folders.append(build_camera_set(args.cifar10, work / "camera", args.camera))
    for folder in folders:  # the page cache warmed: the figures are decoding, not the disk
        for file in folder.glob("*.jpg"):
            file.read_bytes()
    before = _uptime()
    rows: List[Dict[str, Any]] = []
    differences: Dict[str, Dict[int, Dict[str, float]]] = {}
    for folder in folders:
        for size in args.sizes:
            for reader in READERS:
                command = [sys.executable, os.path.abspath(__file__), "--one", str(folder), reader, str(size),
                           "--workers", str(args.workers), "--batch-size", str(args.batch_size), "--epochs",
                           str(args.epochs), "--work", str(work)]
                done = subprocess.run(command, capture_output=True, text=True)
                if done.returncode:
                    raise SystemExit(f"{reader} at {size} failed:\n{done.stderr[-3000:]}")
                row = json.loads(done.stdout.strip().splitlines()[-1])
                row["folder"] = folder.name
                rows.append(row)
                print(json.dumps(row), file=sys.stderr)
            differences.setdefault(folder.name, {})[size] = pixel_difference(folder, size)
    after = _uptime()
    lines = ["# Decoding JPEG photos at the size used", "",
             "Command (from the repository root):", "",
             "    PYTHONPATH=src python benchmarks/bench_decode_at_size.py " + " ".join(
                 (["--photos", *["PHOTOS"] * len(args.photos)] if args.photos else [])
                 + (["--camera", str(args.camera), "--cifar10", "CIFAR10_DIR"] if args.camera else [])
                 + ["--sizes", *map(str, args.sizes), "--workers", str(args.workers), "--batch-size",
                    str(args.batch_size), "--epochs", str(args.epochs)]), "",
             f"python {platform.python_version()}, torch {torch.__version__}, {os.cpu_count()} CPUs, "
             f"{args.workers} DataLoader workers, 1 torch thread in the main process, batch {args.batch_size}, "
             f"{args.epochs} epochs of the training split per row (small CNN, kornia views, NT-Xent, AdamW), "
             "the first a warm-up (the persistent workers' start): seconds and images/s are per epoch after it; "
             f"then {args.epochs - 1} epochs of the loader alone (decoding, no step); page cache warm.", "",
             f"Load: before `{before}`; after `{after}`. The machine is shared: compare the ratios within a set "
             "and size, which ran minutes apart.", ""]
    for folder in folders:
        lines += [f"## {folder.name}: {_describe(folder)}", "",
                  "| size | reader | images per epoch | seconds per epoch | images/s | contrastkit's speed-up | "
                  "loader alone, images/s | contrastkit's speed-up |",
                  "|---|---|---|---|---|---|---|---|"]
        for size in args.sizes:
            mine = [r for r in rows if r["folder"] == folder.name and r["size"] == size]
            ours = next(r for r in mine if r["reader"] == READERS[0])
            for r in mine:
                first = r["reader"] == READERS[0]
                ratio = "" if first else f"{ours['images_per_second'] / r['images_per_second']:.1f}x"
                alone = "" if first else f"{ours['loader_images_per_second'] / r['loader_images_per_second']:.1f}x"
                lines.append(f"| {size} | {r['reader']} | {r['images']} | {r['seconds']:.1f} | "
                             f"{r['images_per_second']:.1f} | {ratio} | {r['loader_images_per_second']:.1f} | {alone} |")
        lines += ["", "Pixels of the reduced decode against a full decode, then the same resize and crop "
                      "(levels of 255, every value of every photo):", "",
                  "| size | mean abs difference | 99th percentile | max |", "|---|---|---|---|"]
        for size, d in differences[folder.name].items():
            lines.append(f"| {size} | {d['mean']:.2f} | {d['p99']:.0f} | {d['max']} |")
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

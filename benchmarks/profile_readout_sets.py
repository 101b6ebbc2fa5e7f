"""Where the read-out's time goes, by feature set: the linear probe and the kNN on an encoder's
``h`` (the small CNN at initialisation, 128 features) against the same on the raw pixels (the
baseline), on one data set, with torch's current thread count.

    PYTHONPATH=src python benchmarks/profile_readout_sets.py CIFAR10_DIR [--threads 2]
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", help="a data set path or name for contrastkit.data.load_dataset")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    from contrastkit.data import load_dataset
    from contrastkit.metrics import knn_accuracy, linear_probe
    from contrastkit.models import SmallCNN
    from contrastkit.metrics.readout import extract_features

    torch.set_num_threads(args.threads)
    ds = load_dataset(args.data)
    splits = (ds.train, ds.val, ds.test)
    labels = [s.labels.numpy() for s in splits]
    encoder = SmallCNN(in_channels=ds.image_shape[0]).eval()
    sets = {
        f"encoder h ({encoder.out_dim})": [extract_features(encoder, s.images, torch.device("cpu")) for s in splits],
        f"raw pixels ({ds.train.images[0].numel()})": [s.images.reshape(len(s), -1).float().numpy() for s in splits],
    }
    print(f"threads {args.threads}; train/val/test {len(ds.train)}/{len(ds.val)}/{len(ds.test)}")
    for name, x in sets.items():
        wall, cpu = time.perf_counter(), time.process_time()
        probe = linear_probe(x[0], labels[0], x[1], labels[1], x[2], labels[2])
        wall_probe, cpu_probe = time.perf_counter() - wall, time.process_time() - cpu
        wall, cpu = time.perf_counter(), time.process_time()
        knn_accuracy(x[0], labels[0], x[2], labels[2])
        wall_knn, cpu_knn = time.perf_counter() - wall, time.process_time() - cpu
        print(f"{name}: probe {wall_probe:.1f} s wall / {cpu_probe:.1f} s CPU (C {probe.best_c:g}), "
              f"kNN {wall_knn:.1f} s wall / {cpu_knn:.1f} s CPU")


if __name__ == "__main__":
    main()

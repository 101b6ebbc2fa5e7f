"""Small tar shards for the tests of streamed training: a class-folder tree of generated PNG
images written as shards by ``contrastkit.data.write_shards`` (what ``contrastkit shard`` runs)."""

import io
import os
import tarfile

import numpy as np


def write_image_tree(root, *, classes=3, per_class=20, size=16, seed=0):
    """``root/<class>/<i>.png``: ``per_class`` images of ``size`` x ``size`` per class, each
    class a colour with noise (learnable, cheap)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for label in range(classes):
        folder = os.path.join(root, f"class{label}")
        os.makedirs(folder, exist_ok=True)
        base = rng.integers(0, 256, size=3)
        for i in range(per_class):
            pixels = np.clip(base + rng.normal(0, 40, size=(size, size, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(os.path.join(folder, f"{i:03d}.png"))
    return root


def write_shards(tmp_path, *, per_shard=10, **options):
    """The tree of :func:`write_image_tree` as shards in ``tmp_path/shards``; the folder."""
    from contrastkit.data import write_shards

    tree = write_image_tree(str(tmp_path / "tree"), **options)
    out = str(tmp_path / "shards")
    write_shards(tree, out, shard_size=per_shard)
    return out


def add_damaged_shard(folder, name="shard-damaged.tar", *, train=2, held_out=2, label=0):
    """A shard of samples whose image bytes are not an image (each with a ``.cls``): ``train``
    of them in the training split and ``held_out`` in val or test (keys chosen by
    ``split_of_key``). Returns their keys."""
    from contrastkit.data import split_of_key

    keys, wanted = [], {"train": train, "held": held_out}
    for number in range(10_000):
        key = f"bad-{number:04d}"
        kind = "train" if split_of_key(f"{name}/{key}") == "train" else "held"
        if wanted[kind]:
            wanted[kind] -= 1
            keys.append(key)
        if not any(wanted.values()):
            break
    with tarfile.open(os.path.join(folder, name), "w") as tar:
        for key in keys:
            for suffix, data in ((".png", b"this is not a PNG file" * 4), (".cls", str(label).encode())):
                info = tarfile.TarInfo(key + suffix)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return [f"{name}/{key}" for key in keys]


def write_planned_shards(folder, plan, *, size=16, classes=3, seed=0):
    """Shards whose samples' splits are chosen: ``plan`` is one dict per shard with the counts
    ``train``, ``held`` (val or test) and ``damaged_train``, ``damaged_held`` (image bytes that
    are not an image); keys are picked by ``split_of_key``. Returns the damaged keys."""
    from PIL import Image

    from contrastkit.data import split_of_key

    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    damaged, number = [], 0
    for index, wanted in enumerate(plan):
        name = f"planned-{index:03d}.tar"
        left = {kind: int(wanted.get(kind, 0)) for kind in ("train", "held", "damaged_train", "damaged_held")}
        with tarfile.open(os.path.join(folder, name), "w") as tar:
            while any(left.values()):
                key = f"{number:06d}"
                number += 1
                held = split_of_key(f"{name}/{key}") != "train"
                kind = next((k for k in (("held", "damaged_held") if held else ("train", "damaged_train"))
                             if left[k]), None)
                if kind is None:
                    continue
                left[kind] -= 1
                label = int(rng.integers(classes))
                if kind.startswith("damaged"):
                    data = b"this is not a PNG file" * 4
                    damaged.append(f"{name}/{key}")
                else:
                    pixels = np.clip(label * 80 + rng.normal(0, 30, size=(size, size, 3)), 0, 255).astype(np.uint8)
                    buffer = io.BytesIO()
                    Image.fromarray(pixels).save(buffer, format="PNG")
                    data = buffer.getvalue()
                for suffix, member in ((".png", data), (".cls", str(label).encode())):
                    info = tarfile.TarInfo(key + suffix)
                    info.size = len(member)
                    tar.addfile(info, io.BytesIO(member))
    with open(os.path.join(folder, "classes.txt"), "w", encoding="utf-8") as handle:
        handle.writelines(f"class{i}\n" for i in range(classes))
    return damaged

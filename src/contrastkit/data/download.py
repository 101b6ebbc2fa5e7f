"""Optional download helpers for MNIST and CIFAR-10 (plain ``urllib``; need internet).

The loaders never download anything; these helpers fetch the official files into a folder
that :func:`contrastkit.data.load_dataset` then reads. Every file is checked against its
published MD5 checksum; a file that is already there is verified and kept, never overwritten
(a mismatch raises ``ValueError`` and leaves it alone).
"""

from __future__ import annotations

import hashlib
import os
import tarfile
import urllib.request
from pathlib import Path
from typing import Dict, Union

MNIST_URL = "https://ossci-datasets.s3.amazonaws.com/mnist/"
#: MD5 of the official gzipped MNIST files.
MNIST_MD5: Dict[str, str] = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
#: MD5 of the official CIFAR-10 python archive.
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
CIFAR10_FOLDER = "cifar-10-batches-py"

PathLike = Union[str, "os.PathLike[str]"]


def _md5(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fetch(url: str, target: Path, md5: str, timeout: float) -> None:
    """Download ``url`` to ``target`` through a partial file, checking the MD5 before renaming."""
    if target.exists():
        got = _md5(target)
        if got != md5:
            raise ValueError(f"{target} exists but its MD5 is {got}, expected {md5}; "
                             f"remove it to download it again")
        return
    partial = target.with_name(target.name + ".part")
    digest = hashlib.md5()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, open(partial, "wb") as out:
            for block in iter(lambda: response.read(1 << 20), b""):
                digest.update(block)
                out.write(block)
    except OSError as err:
        partial.unlink(missing_ok=True)
        raise OSError(f"cannot download {url}: {err}") from None
    if digest.hexdigest() != md5:
        partial.unlink(missing_ok=True)
        raise ValueError(f"{url}: downloaded data have MD5 {digest.hexdigest()}, expected {md5}")
    os.replace(partial, target)


def download_mnist(root: PathLike, *, base_url: str = MNIST_URL, md5: Dict[str, str] = MNIST_MD5,
                   timeout: float = 60.0) -> Path:
    """Fetch the four gzipped MNIST idx files into ``root``; returns ``root`` for ``load_dataset``."""
    root = Path(root).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    for name, digest in md5.items():
        _fetch(base_url.rstrip("/") + "/" + name, root / name, digest, timeout)
    return root


def _safe_extract(archive: Path, root: Path) -> None:
    with tarfile.open(archive, "r:gz") as tar:
        members = tar.getmembers()
        base = root.resolve()
        for member in members:
            dest = (root / member.name).resolve()
            if not (member.isfile() or member.isdir()) or (base not in dest.parents and dest != base):
                raise ValueError(f"{archive}: refusing to extract {member.name!r} (link or path outside {root})")
        if hasattr(tarfile, "data_filter"):
            tar.extractall(root, members=members, filter="data")
        else:  # Python < 3.11.4: members were checked above
            tar.extractall(root, members=members)


def download_cifar10(root: PathLike, *, url: str = CIFAR10_URL, md5: str = CIFAR10_MD5,
                     timeout: float = 60.0) -> Path:
    """Fetch and unpack the CIFAR-10 python archive into ``root``.

    Returns ``root / "cifar-10-batches-py"`` (also accepted: ``root`` itself) for
    ``load_dataset``. An already unpacked folder is returned as it is.
    """
    root = Path(root).expanduser()
    folder = root / CIFAR10_FOLDER
    if (folder / "test_batch").is_file():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    archive = root / url.rstrip("/").rsplit("/", 1)[-1]
    _fetch(url, archive, md5, timeout)
    _safe_extract(archive, root)
    if not (folder / "test_batch").is_file():
        raise ValueError(f"{archive}: the archive did not contain {CIFAR10_FOLDER}/test_batch")
    return folder

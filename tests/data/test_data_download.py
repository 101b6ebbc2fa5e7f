"""Download helpers, exercised offline through file:// URLs on fixtures written here."""

import hashlib
import tarfile

import pytest

from _data_fixtures import write_cifar, write_mnist
from contrastkit.data import download_cifar10, download_mnist, load_dataset


def _md5(path):
    return hashlib.md5(path.read_bytes()).hexdigest()


def test_download_mnist_then_load(tmp_path):
    server = tmp_path / "server"
    write_mnist(server, gz=True)
    md5 = {p.name: _md5(p) for p in server.iterdir()}
    assert len(md5) == 4
    root = download_mnist(tmp_path / "data", base_url=server.as_uri(), md5=md5)
    assert sorted(p.name for p in root.iterdir()) == sorted(md5)
    assert len(load_dataset(root).test) == 20
    # A second call finds the verified files and downloads nothing.
    download_mnist(root, base_url=(tmp_path / "nowhere").as_uri(), md5=md5)


def test_download_checksum_mismatch_leaves_nothing(tmp_path):
    server = tmp_path / "server"
    write_mnist(server, gz=True)
    md5 = {p.name: "0" * 32 for p in server.iterdir()}
    with pytest.raises(ValueError, match="MD5"):
        download_mnist(tmp_path / "data", base_url=server.as_uri(), md5=md5)
    assert list((tmp_path / "data").iterdir()) == []


def test_existing_file_with_wrong_checksum_is_not_overwritten(tmp_path):
    server = tmp_path / "server"
    write_mnist(server, gz=True)
    md5 = {p.name: _md5(p) for p in server.iterdir()}
    (tmp_path / "data").mkdir()
    mine = tmp_path / "data" / "train-images-idx3-ubyte.gz"
    mine.write_bytes(b"my own file")
    with pytest.raises(ValueError, match="exists but its MD5"):
        download_mnist(tmp_path / "data", base_url=server.as_uri(), md5=md5)
    assert mine.read_bytes() == b"my own file"


def test_download_unreachable(tmp_path):
    with pytest.raises(OSError, match="cannot download"):
        download_mnist(tmp_path, base_url=(tmp_path / "missing").as_uri(), md5={"a.gz": "0" * 32})


def test_download_cifar10_then_load(tmp_path):
    write_cifar(tmp_path / "src" / "cifar-10-batches-py")
    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "src" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    folder = download_cifar10(tmp_path / "data", url=archive.as_uri(), md5=_md5(archive))
    assert folder.name == "cifar-10-batches-py"
    assert len(load_dataset(tmp_path / "data").test) == 8
    assert download_cifar10(tmp_path / "data", url="file:///nowhere", md5="0" * 32) == folder


def test_download_cifar10_refuses_escaping_archive(tmp_path):
    evil = tmp_path / "evil.tar.gz"
    (tmp_path / "payload").write_text("x")
    with tarfile.open(evil, "w:gz") as tar:
        tar.add(tmp_path / "payload", arcname="../outside")
    with pytest.raises(ValueError, match="refusing"):
        download_cifar10(tmp_path / "data", url=evil.as_uri(), md5=_md5(evil))
    assert not (tmp_path / "outside").exists()

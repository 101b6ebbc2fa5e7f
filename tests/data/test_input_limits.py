"""Hostile inputs to the loaders and to ``explain --matrix``: each ends in one clear error
naming the file, within bounded memory (the calls run in a child with 1 GiB of private memory
above its start, see ``_bounded.py``), never a hang, a traceback or a silent misreading."""

import gzip
import io
import os
import struct
import zipfile
import zlib

import numpy as np
import pytest

from _bounded import CEILING, assert_clean, assert_cli_error, worker
from _data_fixtures import write_idx, write_mnist


# ------------------------------------------------------------------------------ explain --matrix


def test_explain_matrix_dev_zero_is_refused_before_reading(worker):
    line = assert_cli_error(worker.call("cli", "explain", "--matrix", "/dev/zero", "--diagonal"), "explain",
                            "/dev/zero")
    assert "character device" in line


def test_explain_matrix_fifo_is_refused_without_waiting_for_a_writer(worker, tmp_path):
    fifo = tmp_path / "matrix.csv"
    os.mkfifo(fifo)
    line = assert_cli_error(worker.call("cli", "explain", "--matrix", str(fifo), "--diagonal", timeout=30),
                            "explain", str(fifo))
    assert "FIFO" in line


def test_explain_matrix_over_the_ceiling_is_refused(worker, tmp_path):
    path = tmp_path / "big.csv"
    with open(path, "wb") as handle:
        handle.truncate(CEILING + 1)  # sparse: no disk used
    line = assert_cli_error(worker.call("cli", "explain", "--matrix", str(path), "--diagonal"), "explain", str(path))
    assert "ceiling" in line and "CONTRASTKIT_MAX_INPUT_BYTES" in line


def test_explain_empty_list_entry_is_refused_not_skipped(worker):
    line = assert_cli_error(worker.call("cli", "explain", "1,,2"), "explain", "'1,,2'")
    assert "empty entry" in line
    assert_cli_error(worker.call("cli", "explain", "1", "0.5", "--tau", "1,,0.5"), "explain", "--tau")
    assert_cli_error(worker.call("cli", "explain", "1,2,"), "explain", "empty entry")
    assert worker.call("cli", "explain", "1,", "0.5,", "0")["returned"]["rc"] == 0  # commas and spaces


def test_explain_complex_npy_is_refused_not_made_real(worker, tmp_path):
    path = tmp_path / "s.npy"
    np.save(path, np.eye(3) + 1j * np.ones((3, 3)))
    line = assert_cli_error(worker.call("cli", "explain", "--matrix", str(path), "--diagonal"), "explain", str(path))
    assert "complex" in line


def test_explain_npy_header_claiming_more_than_the_file_holds(worker, tmp_path):
    path = tmp_path / "s.npy"
    path.write_bytes(_npy_header("<f8", (200_000, 200_000)) + bytes(64))  # claims 298 GiB
    line = assert_cli_error(worker.call("cli", "explain", "--matrix", str(path), "--diagonal"), "explain", str(path))
    assert "declares shape (200000, 200000)" in line and "holds 64 bytes" in line
    path.write_bytes(_npy_header("<f8", (3, 3)) + bytes(64))
    assert "holds 64 bytes" in assert_cli_error(worker.call("cli", "explain", "--matrix", str(path), "--diagonal"),
                                                "explain", str(path))


def test_explain_still_reads_fortran_npy_and_commented_csv(tmp_path):
    from contrastkit.commands.explain_input import load_matrix

    matrix = np.asfortranarray(np.arange(9.0).reshape(3, 3))
    np.save(tmp_path / "f.npy", matrix)
    assert np.array_equal(load_matrix(str(tmp_path / "f.npy")), matrix)
    np.save(tmp_path / "i.npy", np.eye(2, dtype=np.int16))
    assert np.array_equal(load_matrix(str(tmp_path / "i.npy")), np.eye(2))
    (tmp_path / "c.csv").write_text("# note\n1 0.5\n0.5 1\n")
    assert np.array_equal(load_matrix(str(tmp_path / "c.csv")), [[1, 0.5], [0.5, 1]])


def _npy_header(descr, shape):
    text = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode("latin1")
    text += b" " * (63 - (10 + len(text)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text


# ------------------------------------------------------------------------------ MNIST idx


def _gzip_bomb(path, header, inflated):
    """``header`` followed by ``inflated`` zero bytes, as about ``inflated / 1000`` bytes of
    gzip (a run of gzip members, each 1 MiB of zeros: readers treat them as one stream)."""
    zeros = gzip.compress(bytes(2**20), compresslevel=9)
    with open(path, "wb") as handle:
        handle.write(gzip.compress(header))
        for _ in range(inflated // 2**20):
            handle.write(zeros)


def test_gzip_bomb_stops_at_the_declared_size(worker, tmp_path):
    folder = tmp_path / "mnist"
    write_mnist(folder, gz=True)
    bomb = folder / "train-images-idx3-ubyte.gz"
    _gzip_bomb(bomb, struct.pack(">BBBB", 0, 0, 8, 3) + struct.pack(">III", 40, 28, 28), 2**30)
    assert bomb.stat().st_size < 1.5 * 2**20
    answer = worker.call("load_path", str(folder), {})
    assert answer["raised"] == "ValueError", answer
    assert str(bomb) in answer["message"] and "holds more" in answer["message"]
    peak = worker.call("peak")["returned"]
    assert peak < 2**30 // 4  # the 1 GiB was never held in memory


def test_idx_header_over_the_ceiling_is_refused_before_reading(worker, tmp_path):
    path = tmp_path / "train-images-idx3-ubyte.gz"
    _gzip_bomb(path, struct.pack(">BBBB", 0, 0, 8, 3) + struct.pack(">III", 1_000_000, 32, 32), 0)
    answer = worker.call("read_idx", str(path), 3)
    assert answer["raised"] == "ValueError" and str(path) in answer["message"] and "ceiling" in answer["message"]


def test_idx_dimensions_whose_product_overflows(worker, tmp_path):
    # 2**22 * 2**22 * 2**20 = 2**64 wraps to 0 in 64-bit arithmetic: an empty file would "match"
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(struct.pack(">BBBB", 0, 0, 8, 3) + struct.pack(">III", 2**22, 2**22, 2**20))
    answer = worker.call("read_idx", str(path), 3)
    assert_clean(answer, str(path))
    assert "raised" in answer and "ceiling" in answer["message"]


def test_idx_still_reads_plain_and_gzipped(tmp_path):
    from contrastkit.data.files import read_idx

    array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(tmp_path / "a", array)
    write_idx(tmp_path / "a", array, gz=True)
    assert np.array_equal(read_idx(tmp_path / "a", 3), array)
    assert np.array_equal(read_idx(tmp_path / "a.gz", 3), array)
    (tmp_path / "b.gz").write_bytes(gzip.compress(bytes(10))[:-6])
    with pytest.raises(ValueError, match="b.gz"):
        read_idx(tmp_path / "b.gz", 3)


# ------------------------------------------------------------------------------ npz, special files


def _npz_with_member(path, name, member):
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(name, member)
        for key in ("y_train", "x_test", "y_test"):
            buffer = io.BytesIO()
            np.save(buffer, np.zeros((4, 8, 8), np.uint8) if key.startswith("x") else np.zeros(4, np.int64))
            archive.writestr(f"{key}.npy", buffer.getvalue())


def test_npz_member_claiming_238_gib_is_refused(worker, tmp_path):
    path = tmp_path / "data.npz"
    _npz_with_member(path, "x_train.npy", _npy_header("|u1", (1_000_000, 256, 1000)) + bytes(16))
    answer = worker.call("load_path", str(path), {})
    assert_clean(answer, str(path))
    assert "raised" in answer and "x_train" in answer["message"]


def test_npz_member_declaring_more_than_its_zip_entry(worker, tmp_path):
    path = tmp_path / "data.npz"
    _npz_with_member(path, "x_train.npy", _npy_header("|u1", (4, 8, 8)) + bytes(16))
    answer = worker.call("load_path", str(path), {})
    assert answer["raised"] == "ValueError" and "x_train" in answer["message"] and "holds 16 bytes" in answer["message"]


def test_npz_complex_or_object_arrays_are_refused(tmp_path):
    from contrastkit.data.files import load_npz

    for bad in (np.zeros((4, 8, 8), np.complex64), np.array([None] * 4, dtype=object)):
        path = tmp_path / "d.npz"
        np.savez(path, x_train=bad, y_train=np.zeros(4, int), x_test=np.zeros((4, 8, 8)), y_test=np.zeros(4, int))
        with pytest.raises(ValueError, match=r"d.npz \(x_train\)"):
            load_npz(path)


@pytest.mark.parametrize("special", ["fifo", "device_link"])
def test_special_files_in_data_folders_are_refused(worker, tmp_path, special):
    folder = tmp_path / "mnist"
    write_mnist(folder)
    target = folder / "t10k-labels-idx1-ubyte"
    target.unlink()
    if special == "fifo":
        os.mkfifo(target)
    else:
        os.symlink("/dev/zero", target)
    answer = worker.call("load_path", str(folder), {}, timeout=30)
    assert answer["raised"] == "ValueError" and str(target) in answer["message"], answer
    assert ("FIFO" if special == "fifo" else "character device") in answer["message"]


def test_labels_far_beyond_the_sample_count_are_refused(worker, tmp_path):
    path = tmp_path / "d.npz"
    labels = np.array([0, 1, 2**40, 0], dtype=np.int64)  # would make 2**40 class names
    np.savez(path, x_train=np.zeros((4, 8, 8), np.uint8), y_train=labels, x_test=np.zeros((2, 8, 8), np.uint8),
             y_test=np.zeros(2, int), x_val=np.zeros((2, 8, 8), np.uint8), y_val=np.zeros(2, int))
    answer = worker.call("load_path", str(path), {})
    assert answer.get("raised") == "ValueError", answer
    assert "d.npz: labels go up to 1099511627776 but there are only 8 samples" in answer["message"]


def test_huge_decoded_image_and_huge_resize_are_refused(worker, tmp_path):
    from PIL import Image

    root = tmp_path / "images"
    for name in ("a", "b"):
        (root / name).mkdir(parents=True)
        for i in range(3):
            Image.new("L", (8, 8), i * 40).save(root / name / f"{i}.png")
    (root / "b" / "huge.png").write_bytes(_png_header(9000, 9000))  # 324 MB decoded, 57 bytes on disk
    answer = worker.call("load_path", str(root), {})
    assert answer["raised"] == "ValueError" and "huge.png" in answer["message"] and "ceiling" in answer["message"]
    os.remove(root / "b" / "huge.png")
    answer = worker.call("load_path", str(root), {"size": 100_000})
    assert answer["raised"] == "ValueError" and "ceiling" in answer["message"], answer


def _png_header(width, height):
    """A PNG that declares an 8-bit RGBA image of ``width`` x ``height`` and holds no pixels."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0))
            + chunk(b"IEND", b""))


def test_pair_csv_bounded_and_named(worker, tmp_path):
    from PIL import Image

    Image.new("L", (8, 8)).save(tmp_path / "a.png")
    csv = tmp_path / "pairs.csv"
    csv.write_text("image,text\n" + "a.png,some words\n" * 10)
    answer = worker.call("load_pair_csv", str(csv), {"size": 100_000})
    assert answer["raised"] == "ValueError" and "pairs.csv" in answer["message"] and "ceiling" in answer["message"]
    csv.write_bytes(b"image,text\n\xff\xfe,x\n")
    answer = worker.call("load_pair_csv", str(csv), {})
    assert answer["raised"] == "ValueError" and "pairs.csv" in answer["message"] and "UTF-8" in answer["message"]
    csv.write_text("image,text\na.png,\"" + "x" * 200_000 + "\"\n")  # over csv's field limit
    answer = worker.call("load_pair_csv", str(csv), {})
    assert answer["raised"] == "ValueError" and "pairs.csv, line" in answer["message"], answer
    csv.write_text("image,text\n/dev/zero,words\n")
    answer = worker.call("load_pair_csv", str(csv), {})
    assert answer["raised"] == "ValueError" and "/dev/zero" in answer["message"] and "line 2" in answer["message"]


def test_ceiling_setting():
    from contrastkit import _io

    assert _io.max_input_bytes() >= 1  # whatever the environment says, it parses
    old = os.environ.get(_io.MAX_INPUT_BYTES_ENV)
    try:
        for text, value in (("500M", 500 * 2**20), ("8GiB", 8 * 2**30), ("123", 123), ("", _io.DEFAULT_MAX_INPUT_BYTES)):
            os.environ[_io.MAX_INPUT_BYTES_ENV] = text
            assert _io.max_input_bytes() == value
        for text in ("lots", "-5", "0"):
            os.environ[_io.MAX_INPUT_BYTES_ENV] = text
            with pytest.raises(ValueError, match=_io.MAX_INPUT_BYTES_ENV):
                _io.max_input_bytes()
    finally:
        if old is None:
            os.environ.pop(_io.MAX_INPUT_BYTES_ENV, None)
        else:
            os.environ[_io.MAX_INPUT_BYTES_ENV] = old
    # 60 000 CIFAR images as float32 fit under the default
    assert 60_000 * 3 * 32 * 32 * 4 < _io.DEFAULT_MAX_INPUT_BYTES


def test_memory_error_becomes_one_named_error():
    from contrastkit import _io

    with pytest.raises(ValueError, match="some.file: not enough memory"):
        with _io.memory_guard("some.file"):
            raise MemoryError
    with pytest.raises(RuntimeError, match="other"):
        with _io.memory_guard("some.file"):
            raise RuntimeError("other")


def test_zlib_error_in_gzip_names_the_file(tmp_path):
    from contrastkit.data.files import read_idx

    data = bytearray(gzip.compress(struct.pack(">BBBB", 0, 0, 8, 1) + struct.pack(">I", 100) + bytes(100)))
    data[12] ^= 0xFF  # inside the deflate stream
    (tmp_path / "x.gz").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="x.gz"):
        read_idx(tmp_path / "x.gz", 1)


def test_an_image_size_over_the_ceiling_is_refused_naming_the_option(worker, tmp_path):
    """--image-size 100000 printed a traceback after trying to allocate 240,000,000,000 bytes."""
    from PIL import Image

    from contrastkit.data.collection import MAX_SIZE

    root = tmp_path / "photos"
    root.mkdir()
    for i in range(12):
        Image.new("RGB", (8, 8), (i * 20, 0, 0)).save(root / f"{i}.png")
    args = ["pretrain", "--data", str(root), "--out", str(tmp_path / "run"), "--epochs", "1", "--device", "cpu",
            "--quiet", "--no-report"]
    line = assert_cli_error(worker.call("cli", *args, "--image-size", "100000"), "pretrain", "--image-size 100000")
    assert f"ceiling of {MAX_SIZE}" in line
    assert not (tmp_path / "run").exists()  # refused before the run folder is made
    assert_cli_error(worker.call("cli", *args, "--image-size", "0"), "pretrain", "--image-size")
    # the library's option (a --config file, --data-option size=...) is refused by name too
    line = assert_cli_error(worker.call("cli", *args, "--data-option", f"size={MAX_SIZE + 1}"), "pretrain",
                            f"size {MAX_SIZE + 1}")
    assert "ceiling" in line

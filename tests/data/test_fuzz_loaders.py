"""Fuzzing the data loaders: every format, one file of it truncated, bit-flipped, with a header
field overwritten, grown or over the input ceiling, read in a child limited to 1 GiB
of memory above its start (``_bounded.py``). The load either works or ends in one ValueError /
FileNotFoundError naming the data; never a traceback of another kind, a MemoryError, a
crash or a hang. ``CONTRASTKIT_FUZZ_EXAMPLES=500`` runs a deeper search than the default."""

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from _bounded import assert_clean, damage, fuzz_settings, worker, write_damaged
from _data_fixtures import write_cifar, write_image_folder, write_mnist

FUZZ = fuzz_settings()


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    root = tmp_path_factory.mktemp("originals")
    write_mnist(root / "mnist", n_train=30, n_test=10)
    write_mnist(root / "mnist_gz", n_train=30, n_test=10, gz=True)
    write_cifar(root / "cifar", per_batch=4, n_test=6)
    write_image_folder(root / "images", per_class=4)
    rng = np.random.default_rng(0)
    (root / "npz").mkdir()
    np.savez_compressed(root / "npz" / "data.npz", x_train=rng.integers(0, 256, (30, 8, 8), dtype=np.uint8),
                        y_train=np.arange(30) % 3, x_test=rng.random((9, 8, 8, 1)).astype(np.float32),
                        y_test=np.arange(9) % 3)
    pairs = root / "pairs"
    write_image_folder(pairs, classes=("x",), per_class=6)
    (pairs / "pairs.csv").write_text("image,text,label\n" + "".join(
        f"x/img_{i:03d}.png,picture {i},{'ab'[i % 2]}\n" for i in range(6)))
    return root


def _damaged_copy(originals, name, member, damaged):
    folder = Path(tempfile.mkdtemp(dir=originals.parent)) / name
    shutil.copytree(originals / name, folder)
    target = folder / member
    write_damaged(target, (damaged[0], damaged[1]))
    return folder


def _members(originals, name, pattern="*"):
    return sorted(str(p.relative_to(originals / name)) for p in (originals / name).rglob(pattern) if p.is_file())


def _fuzz(worker, originals, name, member, data, call, *args):
    folder = _damaged_copy(originals, name, member, data)
    path = folder / "pairs.csv" if name == "pairs" else folder / "data.npz" if name == "npz" else folder
    answer = worker.call(call, str(path), *args)
    assert_clean(answer, str(folder))
    shutil.rmtree(folder.parent)
    return answer


def _member_and_damage(originals, name, pattern="*"):
    return st.sampled_from(_members(originals, name, pattern)).flatmap(
        lambda member: st.tuples(st.just(member), damage((originals / name / member).read_bytes())))


@pytest.mark.parametrize("name", ["mnist", "mnist_gz", "cifar", "images", "npz"])
def test_damaged_data_files(worker, originals, name):
    @FUZZ
    @given(case=_member_and_damage(originals, name))
    def check(case):
        member, damaged = case
        _fuzz(worker, originals, name, member, damaged, "load_path", {})

    check()


def test_damaged_pair_csv_or_its_images(worker, originals):
    @FUZZ
    @given(case=_member_and_damage(originals, "pairs"))
    def check(case):
        member, damaged = case
        _fuzz(worker, originals, "pairs", member, damaged, "load_pair_csv", {"size": 8})

    check()


def test_the_undamaged_originals_load(worker, originals):
    for name in ("mnist", "mnist_gz", "cifar", "images"):
        assert "returned" in worker.call("load_path", str(originals / name), {}), name
    assert "returned" in worker.call("load_path", str(originals / "npz" / "data.npz"), {})
    assert "returned" in worker.call("load_pair_csv", str(originals / "pairs" / "pairs.csv"), {"size": 8})

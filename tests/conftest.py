import atexit
import os
import shutil
import tempfile

import pytest
import torch

# Keep the suite predictable on small CI machines.
os.environ.setdefault("OMP_NUM_THREADS", "2")
# The read-out's baseline cache never goes to the user's ~/.cache: one folder per test process
# (what module-scoped fixtures use), and a fresh one per test (the autouse fixture below).
_SESSION_CACHE = tempfile.mkdtemp(prefix="contrastkit-test-cache-")
atexit.register(shutil.rmtree, _SESSION_CACHE, ignore_errors=True)
os.environ["CONTRASTKIT_CACHE"] = _SESSION_CACHE


@pytest.fixture(autouse=True)
def _fresh_baseline_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("CONTRASTKIT_CACHE", str(tmp_path_factory.mktemp("baseline-cache")))


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="run tests marked slow")
    parser.addoption("--test-device", default=os.environ.get("CONTRASTKIT_TEST_DEVICE", "cpu"),
                     help="device of the device-agnostic tests (the test_device fixture): cpu (default), "
                          "cuda, cuda:1, ...; also CONTRASTKIT_TEST_DEVICE")


def pytest_configure(config):
    name = config.getoption("--test-device")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as err:
        raise pytest.UsageError(f"--test-device {name!r} is not a torch device: {err}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError(f"--test-device {name!r} was asked for but CUDA is not available")


@pytest.fixture(scope="session")
def test_device(request):
    """The device the device-agnostic tests run their tensors on (``--test-device``)."""
    return torch.device(request.config.getoption("--test-device"))


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip_slow = pytest.mark.skip(reason="slow test: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny tensors gain nothing from intra-op threads, and on a shared, busy machine thread
    contention makes kornia calls several times slower; restored after the module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

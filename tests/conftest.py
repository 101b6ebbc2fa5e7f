import os

import pytest
import torch

# Keep the suite predictable on small CI machines.
os.environ.setdefault("OMP_NUM_THREADS", "2")


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

import os

import pytest
import torch

# Keep the suite predictable on small CI machines.
os.environ.setdefault("OMP_NUM_THREADS", "2")


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="run tests marked slow")


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

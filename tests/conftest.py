import atexit
import os
import shutil
import tempfile

import pytest

# Under pytest-xdist (`-n auto`, the README's test command) the workers share the cores: idle
# OpenMP threads sleep instead of spinning on a core another worker computes on (set before
# torch loads its OpenMP runtime), and each worker computes with its share of the cores.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
if _WORKERS > 1:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

# Keep the suite predictable on small CI machines.
os.environ.setdefault("OMP_NUM_THREADS", "2")
if _WORKERS > 1:
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // _WORKERS) if hasattr(os, "sched_getaffinity")
                          else 1)
# The read-out's baseline cache never goes to the user's ~/.cache: one folder per test process
# (what module-scoped fixtures use), and a fresh one per test (the autouse fixture below).
_SESSION_CACHE = tempfile.mkdtemp(prefix="contrastkit-test-cache-")
atexit.register(shutil.rmtree, _SESSION_CACHE, ignore_errors=True)
os.environ["CONTRASTKIT_CACHE"] = _SESSION_CACHE


# Hypothesis: the suite draws the same examples on every run ("ci", the default: derandomized, no
# example database), so that a run fails only when the code changed, never on a new draw. A
# developer searches for new failing inputs with `pytest --hypothesis-profile explore` (fresh random
# draws each run, failures remembered in .hypothesis/ and replayed first) and commits what it finds
# as an @example (docs/testing.md, "The fuzz suite").
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
_hypothesis_settings.register_profile("explore", derandomize=False, print_blob=True)
_hypothesis_settings.load_profile("ci")  # --hypothesis-profile (loaded after this file) overrides it

_TESTS = os.path.dirname(os.path.abspath(__file__))


def pytest_ignore_collect(collection_path, config):
    """The tests' own helper modules (fixtures, worker scripts, toy plug-ins) hold no tests and no
    doctests: --doctest-modules would import each one into every worker, and the import of a
    plug-in registers it (a toy temperature method listed by other tests' explain --methods),
    a worker script runs. Only ``test_*.py`` files are collected from tests/."""
    path = str(collection_path)
    if path.endswith(".py") and path.startswith(_TESTS + os.sep):
        name = os.path.basename(path)
        if not name.startswith("test_") and name != "conftest.py":
            return True
    return None


@pytest.fixture(autouse=True)
def _fresh_baseline_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("CONTRASTKIT_CACHE", str(tmp_path_factory.mktemp("baseline-cache")))


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="run tests marked slow")
    parser.addoption("--test-device", default=os.environ.get("CONTRASTKIT_TEST_DEVICE", "cpu"),
                     help="device of the device-agnostic tests (the test_device fixture): cpu (default), "
                          "cuda, cuda:1, ...; also CONTRASTKIT_TEST_DEVICE")


#: The CPU flags torch's kernels of each ``ATEN_CPU_CAPABILITY`` execute (its AVX-512 build needs
#: the F, BW, VL and DQ subsets).
_CAPABILITY_FLAGS = {"avx2": ("avx2", "fma"), "avx512": ("avx512f", "avx512bw", "avx512vl", "avx512dq")}


def _refuse_a_capability_this_cpu_lacks() -> None:
    """torch runs the kernels ``ATEN_CPU_CAPABILITY`` names without asking the CPU: ``avx512`` on a
    CPU without AVX-512 ends the first softmax in "Illegal instruction", a crash that names nothing.
    Refused here in one line instead."""
    asked = os.environ.get("ATEN_CPU_CAPABILITY", "").lower()
    if asked not in _CAPABILITY_FLAGS or not os.path.exists("/proc/cpuinfo"):
        return
    with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
        flags = next((line.split(":", 1)[1].split() for line in handle if line.startswith("flags")), [])
    missing = [flag for flag in _CAPABILITY_FLAGS[asked] if flag not in flags]
    if missing:
        raise pytest.UsageError(f"ATEN_CPU_CAPABILITY={asked} needs CPU instructions this CPU lacks "
                                f"({', '.join(missing)}): torch would stop with 'Illegal instruction'; "
                                "use a capability it has (default, avx2, ...)")


def pytest_configure(config):
    _refuse_a_capability_this_cpu_lacks()
    name = config.getoption("--test-device")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as err:
        raise pytest.UsageError(f"--test-device {name!r} is not a torch device: {err}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError(f"--test-device {name!r} was asked for but CUDA is not available")
    if not hasattr(config, "workerinput"):  # once, before pytest-xdist starts its workers
        _build_the_font_cache()


def _build_the_font_cache() -> None:
    """On a machine where matplotlib never ran (a fresh CI home), the first process to import it
    builds its font cache and says so on stderr: a command tested for exactly one line of
    stderr would then see two. Built here first, in the process that starts the workers."""
    try:
        import matplotlib.font_manager  # noqa: F401
    except ImportError:
        pass


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


# Tests that start processes of their own (a process group, torchrun, Lightning's ddp): under
# pytest-xdist they run one at a time, in one worker, so that no two of them compete for the
# cores (their gloo and subprocess time-outs assume a machine they share with one test). A
# nodeid prefix: a whole module, or one test of it. They get the ``serial`` mark (``-m serial``).
SERIAL = (
    "tests/compat/test_compat_lightly.py::test_gathered_options_under_two_processes_equal_the_peer",
    "tests/losses/test_losses_precision.py::test_float32_small_losses_keep_their_digits_in_the_ring",
    "tests/compat/test_compat_open_clip.py::test_two_processes_",
    "tests/distributed/test_cluster_faults.py::",
    "tests/distributed/test_distributed.py::",
    "tests/distributed/test_distributed_accumulation.py::",
    "tests/distributed/test_distributed_per_anchor_temperature.py::",
    "tests/distributed/test_distributed_scaleout.py::",
    "tests/distributed/test_distributed_torchrun.py::",
    "tests/distributed/test_online_probe_distributed.py::",
    "tests/distributed/test_short_batches.py::",
    "tests/distributed/test_stream_distributed.py::",
    "tests/losses/test_losses_sigmoid.py::",
    "tests/losses/test_tiled_variants.py::test_two_processes_equal_one_on_the_global_batch",
    "tests/train/test_siglip_train.py::test_two_processes_give_the_gradients_of_one",
    "tests/integrations/test_lightning.py::test_ddp_on_two_processes_equals_one_process_on_the_global_batch",
    "tests/integrations/test_lightning.py::test_under_ddp_a_batch_short_of_readable_images_on_one_rank_is_skipped_by_every_rank",
    "tests/integrations/test_lightning.py::test_under_ddp_rank_zero_names_the_damaged_files_every_rank_skipped",
)


def _work_unit(nodeid):
    """What a test runs with under pytest-xdist: the serial group, else its module (so that a
    module's fixtures, a spawned process group or a tiny run several tests read, are built
    once, not once per worker)."""
    return "serial" if nodeid.startswith(SERIAL) else nodeid.split("::", 1)[0]


def pytest_itemcollected(item):
    if _work_unit(item.nodeid) == "serial":
        item.add_marker(pytest.mark.serial)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``pytest -n auto`` (the README's test command) hands out work units of
    :func:`_work_unit`. Its own ``--dist loadgroup`` would do that with ``xdist_group`` marks,
    but with pytest 9.2 it ignores them (pytest-xdist issue 1386), so the grouping is done
    here, from the test ids; ``--dist`` each, loadfile or worksteal are left to pytest-xdist."""
    if config.getvalue("dist") not in ("load", "loadgroup", "loadscope"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return _work_unit(nodeid)

        def _assign_work_unit(self, node):
            # The serial group is the longest unit (its tests run one after another): handed
            # out first, it runs while the other workers share the rest, instead of starting
            # late and leaving them idle at the end.
            if "serial" in self.workqueue:
                self.workqueue.move_to_end("serial", last=False)
            super()._assign_work_unit(node)

    return ByWorkUnit(config, log)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny tensors gain nothing from intra-op threads, and on a shared, busy machine thread
    contention makes kornia calls several times slower; restored after the module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

"""The tests that start processes of their own (a process group, torchrun) run in the serial
group of tests/conftest.py, one at a time, so that no two compete for the cores their
time-outs assume (docs/testing.md, "Running time")."""

import re
from pathlib import Path

from conftest import SERIAL

TESTS = Path(__file__).parent
STARTS_PROCESSES = re.compile(r"\.spawn\(|\btorchrun\(|start_processes\(|init_process_group\(")


def test_every_module_that_starts_a_process_group_is_in_the_serial_group():
    starting = sorted(path.relative_to(TESTS.parent).as_posix() for path in TESTS.rglob("test_*.py")
                      if STARTS_PROCESSES.search(path.read_text()))
    assert starting, "the pattern no longer finds the process-group tests"
    missing = [module for module in starting if not any(entry.startswith(module + "::") for entry in SERIAL)]
    assert missing == []

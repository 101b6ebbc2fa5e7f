"""The fuzz suite's bounded child (``_bounded.py``) really bounds memory: an allocation without
bound ends in a ``MemoryError`` near the budget, whatever allocates it (Python, numpy, torch),
the child survives it and goes on answering, and the budget leaves room for real work."""

import pytest

from _bounded import DATA_BUDGET, BoundedWorker, worker  # noqa: F401 (worker is a fixture)

STEP = 64 * 2**20


@pytest.mark.parametrize("kind", ["bytearray", "numpy", "torch"])
def test_an_unbounded_allocation_is_caught_near_the_budget(worker, kind):
    # what the child holds between calls stays near its start (freed memory may even go below it)
    assert 0.9 * DATA_BUDGET < worker.call("budget")["returned"] < 1.1 * DATA_BUDGET
    # the child would stop by itself at 4x the budget: a missing limit fails here, not the machine
    answer = worker.call("hog", kind, STEP, 4 * DATA_BUDGET)
    assert answer.get("raised") in ("MemoryError", "RuntimeError"), answer
    if answer["raised"] == "RuntimeError":  # torch's CPU allocator reports the same refusal
        assert "allocate" in answer["message"], answer["message"]
    assert worker.call("budget")["returned"] > 0.9 * DATA_BUDGET  # the chunks were freed
    assert worker.call("cli", "explain", "1", "0.5", "0")["returned"]["rc"] == 0  # and it still works


def test_the_limit_stops_the_allocation_at_the_budget_not_before(worker):
    room = worker.call("budget")["returned"]
    # half of the room, in one piece and in chunks, is allowed: the budget is for real work
    assert worker.call("hog", "numpy", room // 2, room // 2)["returned"] >= room // 2
    assert worker.call("hog", "bytearray", STEP, room // 2)["returned"] >= room // 2
    # one piece the size of the room plus a chunk is not
    assert worker.call("hog", "numpy", room + STEP, room + STEP)["raised"] == "MemoryError"


def test_a_header_claiming_gigabytes_fails_at_the_allocation_even_untouched():
    child = BoundedWorker()  # its own child: the resident peak counts from its start
    try:
        # torch.empty touches no page: only the accounting of the mapping stops it
        answer = child.call("hog", "torch", 8 * DATA_BUDGET, 8 * DATA_BUDGET)
        assert answer.get("raised") == "RuntimeError" and "allocate" in answer["message"], answer
        assert child.call("peak")["returned"] < DATA_BUDGET // 8  # nothing of it became resident
    finally:
        child.close()

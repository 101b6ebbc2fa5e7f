"""Counting the reads of a tensor's value by Python (each a host sync on an accelerator), for the
tests of code that must not synchronise: on the CPU the same calls show where a GPU would wait."""

import contextlib

import torch

READS = ("item", "__bool__", "__float__", "__int__", "tolist")


@contextlib.contextmanager
def counted_reads():
    """Every call of :data:`READS` on any tensor while the block runs, by name, in order."""
    calls = []
    saved = {name: getattr(torch.Tensor, name) for name in READS}

    def counting(name):
        def wrapper(self, *args, **kwargs):
            calls.append(name)
            return saved[name](self, *args, **kwargs)
        return wrapper

    for name in READS:
        setattr(torch.Tensor, name, counting(name))
    try:
        yield calls
    finally:
        for name, original in saved.items():
            setattr(torch.Tensor, name, original)

"""No host synchronisation inside a training step, counted on the CPU.

A GPU runs ahead of the Python that queues its work until Python reads a value back
(``.item()``, ``bool(t)`` / ``if t``, ``float(t)``, ``.tolist()``, ``.cpu()``, ``.numpy()``,
printing a tensor): then the host waits for everything queued. These tests patch those tensor
methods (``tests/_host_reads.py``), make :func:`contrastkit.losses.validation.reads_are_free`
say ``False`` (so the CPU runs exactly the code an accelerator runs: the value checks are
queued with ``torch._assert_async``) and record every read during whole training runs, step by
step, with the training images held on the device (``--data-on-device on``, the CPU standing in
for it): the reads are allowed at logging steps only (the loss and the batch diagnostics are read
there), and on every other step their count is 0.

Two kinds of reads are of host tensors by construction and are not syncs on an accelerator:
the step counters of a non-fused optimizer (torch keeps them on the host; identified by
identity) and kornia's checks of its augmentation parameters (the view maker keeps kornia's
random generator on the host, :mod:`contrastkit.data.views`). They are counted apart. On a GPU
``benchmarks/gpu`` counts the synchronisations themselves (``torch.cuda.set_sync_debug_mode``).
"""

import collections

import pytest
import torch

from contrastkit.losses import validation
from contrastkit.train import loop

from _host_reads import recorded_reads
from _tiny_run import tiny_config, train_only
from test_gpu_training import RGBImages


class _TaggedBatches:
    """The run's batches, tagging the reads recorder with the step each batch is for."""

    def __init__(self, batches, run, recorder):
        self.batches, self.run, self.recorder = batches, run, recorder

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        for item in self.batches:
            self.recorder.tag = self.run.state.step + 1
            yield item


def _host_side(read, step_counters):
    return any(read.tensor is counter for counter in step_counters) or "/kornia/" in read.file


def _reads_per_step(monkeypatch, tmp_path, dataset=None, **options):
    """``(reads by step, logging steps, host-side reads by step)`` of a two-epoch run."""
    monkeypatch.setattr(validation, "reads_are_free", lambda x: False)
    runs = []
    set_up, train_epoch = loop._set_up, loop._train_epoch
    with recorded_reads() as recorder:
        def tagging_set_up(*args, **kwargs):
            run = set_up(*args, **kwargs)
            run.data.source.loader = _TaggedBatches(run.data.source.loader, run, recorder)
            runs.append(run)
            return run

        def recording_epoch(run, *args, **kwargs):
            recorder.on = True
            try:
                return train_epoch(run, *args, **kwargs)
            finally:
                recorder.on = False

        monkeypatch.setattr(loop, "_set_up", tagging_set_up)
        monkeypatch.setattr(loop, "_train_epoch", recording_epoch)
        config = tiny_config(tmp_path / "run", **{"epochs": 2, "batch_size": 4, "log_every": 3, "data_on_device": "on",
                                                  **options})
        train_only(config, dataset=dataset)
    run = runs[0]
    assert run.data.on_device.hold
    # The optimizers' step counters (the online probe's Adam too) are host tensors, as torch keeps them.
    optimizers = [run.trainables.optimizer] + ([run.trainables.online.optimizer] if run.trainables.online else [])
    counters = [state["step"] for optimizer in optimizers for state in optimizer.state.values() if "step" in state]
    logging = {step for step in range(1, run.plan.total_steps + 1)
               if step % run.plan.config.log_every == 0 or step % run.plan.steps_per_epoch == 0}
    device, host = collections.defaultdict(list), collections.defaultdict(list)
    for read in recorder.reads:
        (host if _host_side(read, counters) else device)[read.tag].append(read.where)
    return run.plan.total_steps, logging, device, host


CASES = {
    "simclr-learnable-tau": {"learnable_temperature": True},
    "moco-realisations-tau-schedule": {"method": "moco", "views": "A", "temperature_schedule": "cosine:0.1,0.5"},
    "supcon-labels": {"method": "supcon", "views": "B"},
    "siglip-pairs": {"method": "siglip", "data": "glyphlab-text", "views": "paired"},
    "convirt-pairs": {"method": "convirt", "data": "glyphlab-text", "views": "paired"},
    "fp16-channels-last": {"precision": "fp16", "channels_last": True},
    "bf16-micro-batches": {"precision": "bf16", "micro_batch": 2},
    "simclr-individual-temperatures": {"temperature_method": "individual"},  # the step's sample indices
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_no_read_back_inside_a_training_step(name, monkeypatch, tmp_path, one_torch_thread):
    steps, logging, device, host = _reads_per_step(monkeypatch, tmp_path, **CASES[name])
    quiet = [step for step in range(1, steps + 1) if step not in logging]
    assert quiet, "the run must have steps that do not log"
    assert {step: device[step] for step in quiet if device[step]} == {}
    # the count can fail: the logging steps read the loss and the diagnostics back
    assert all(device[step] for step in logging)


def test_a_streamed_rgb_data_set_held_on_the_device(monkeypatch, tmp_path, one_torch_thread):
    steps, logging, device, host = _reads_per_step(monkeypatch, tmp_path, dataset=RGBImages(48), batch_size=4)
    quiet = [step for step in range(1, steps + 1) if step not in logging]
    assert quiet and {step: device[step] for step in quiet if device[step]} == {}


def test_the_counter_sees_a_read_inside_a_step(monkeypatch, tmp_path, one_torch_thread):
    """A step that reads its loss (what the trainer used to do at every step) is counted."""
    original = loop._train_step

    def reading(run, *args, **kwargs):
        loss, batch = original(run, *args, **kwargs)
        float(loss.detach())
        return loss, batch

    monkeypatch.setattr(loop, "_train_step", reading)
    steps, logging, device, host = _reads_per_step(monkeypatch, tmp_path)
    assert all(any(where.startswith("__float__") for where in device[step]) for step in range(1, steps + 1))

"""Device-agnostic training tests: a training step with --precision, --channels-last and
--data-on-device on ``--test-device`` (CPU by default; ``--test-device cuda`` on a GPU machine,
as ``benchmarks/gpu/run.sh`` runs them). On CUDA the host synchronisations of each training
step are counted by CUDA itself (``torch.cuda.set_sync_debug_mode``): none outside the logging
steps. tests/train/test_gpu_training.py checks the CPU's bit-exact claims."""

import warnings

import numpy as np
import pytest
import torch

from contrastkit.methods import PretrainConfig, build_model, channels_last_batch, get_method
from contrastkit.methods.precision import autocast_supported
from contrastkit.train import loop

from _tiny_run import tiny_config, train_only


def _epoch_losses(out):
    return torch.load(out / "checkpoints" / "last.pt", weights_only=True)["epoch_losses"]


@pytest.mark.parametrize("precision", ["32", "bf16", "fp16"])
def test_each_precision_trains_on_the_test_device(test_device, precision, tmp_path, one_torch_thread):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    if dtype is not None and not autocast_supported(test_device, dtype):
        pytest.skip(f"torch cannot autocast to {dtype} on {test_device}")
    train_only(tiny_config(tmp_path / "run", epochs=2, device=str(test_device), precision=precision,
                           channels_last=precision != "32"))
    losses = _epoch_losses(tmp_path / "run")
    assert len(losses) == 2 and np.isfinite(losses).all()


@pytest.mark.parametrize("encoder", ["small", "resnet18"])
def test_channels_last_step_equals_nchw_on_the_test_device(test_device, encoder, one_torch_thread):
    """float64, where the two layouts round alike (tests/train/test_gpu_training.py says why)."""
    config = PretrainConfig(encoder=encoder).resolved()
    g = torch.Generator().manual_seed(0)
    images = torch.rand(8, 3, 16, 16, dtype=torch.float64, generator=g).to(test_device)
    batch = (images, images.flip(-1))
    results = []
    for channels_last in (False, True):
        model = build_model(config, (3, 16, 16)).double().to(test_device)
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        loss = get_method("simclr").loss(model, channels_last_batch(batch) if channels_last else batch)
        loss.backward()
        results.append([loss.detach()] + [p.grad for p in model.parameters() if p.grad is not None])
    for plain, last in zip(*results):
        torch.testing.assert_close(last, plain, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("options", [{}, {"method": "moco", "views": "A"}], ids=["simclr", "moco-realisations"])
def test_images_held_on_the_test_device_give_the_same_run(test_device, options, tmp_path, one_torch_thread):
    for setting in ("off", "on"):
        train_only(tiny_config(tmp_path / setting, epochs=2, device=str(test_device), data_on_device=setting,
                               **options))
    off, on = _epoch_losses(tmp_path / "off"), _epoch_losses(tmp_path / "on")
    if test_device.type == "cpu":
        assert on == off
    else:  # the same draws; a GPU's kernels may reduce in another order from run to run
        assert on == pytest.approx(off, rel=1e-3)


class _MarkedBatches:
    """The run's batches; remembers how many warnings had come when each step's batch came."""

    def __init__(self, batches, run, caught, marks):
        self.batches, self.run, self.caught, self.marks = batches, run, caught, marks

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        for item in self.batches:
            self.marks.append((self.run.state.step + 1, len(self.caught)))
            yield item


@pytest.mark.parametrize("options", [{}, {"precision": "bf16", "channels_last": True, "encoder": "resnet18"},
                                     {"precision": "fp16"}, {"method": "moco", "views": "A"},
                                     {"method": "siglip", "data": "glyphlab-text", "views": "paired"}],
                         ids=["simclr", "bf16-channels-last-resnet18", "fp16", "moco", "siglip"])
def test_cuda_counts_no_sync_inside_a_training_step(test_device, options, tmp_path, monkeypatch):
    if test_device.type != "cuda":
        pytest.skip("CUDA counts its own synchronisations; tests/train/test_step_syncs.py counts them on the CPU")
    runs, marks = [], []
    set_up = loop._set_up
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        def marking_set_up(*args, **kwargs):
            run = set_up(*args, **kwargs)
            run.data.source.loader = _MarkedBatches(run.data.source.loader, run, caught, marks)
            runs.append(run)
            return run

        def counting_epoch(run, *args, **kwargs):
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("warn")
            try:
                return train_epoch(run, *args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("default")

        train_epoch = loop._train_epoch
        monkeypatch.setattr(loop, "_set_up", marking_set_up)
        monkeypatch.setattr(loop, "_train_epoch", counting_epoch)
        train_only(tiny_config(tmp_path / "run", **{"epochs": 2, "batch_size": 4, "log_every": 3, "device": "cuda",
                                                   "data_on_device": "on", **options}))
    run = runs[0]
    syncs = [w for w in caught if "synchroniz" in str(w.message).lower()]
    per_step = {}
    bounds = marks + [(None, len(caught))]
    for (step, start), (_, stop) in zip(bounds, bounds[1:]):
        per_step[step] = [f"{w.filename}:{w.lineno}" for w in caught[start:stop] if w in syncs]
    logging = {s for s in per_step if s % run.plan.config.log_every == 0 or s % run.plan.steps_per_epoch == 0}
    quiet = {s: where for s, where in per_step.items() if s not in logging and where}
    assert quiet == {}

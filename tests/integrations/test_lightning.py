"""The Lightning integration (contrastkit.integrations.lightning): a real ``lightning.Trainer``
on CPU, one process and ``ddp`` with two gloo processes, and the optional extra's boundary."""

import functools
import importlib.util
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from contrastkit import losses
from contrastkit.losses import MIN_TEMPERATURE

from _ports import unused_port

ROOT = Path(__file__).resolve().parents[2]
HAS_LIGHTNING = importlib.util.find_spec("lightning") is not None
pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec")  # inside Lightning 2.6
needs_lightning = pytest.mark.skipif(not HAS_LIGHTNING,
                                     reason="the lightning extra is not installed (pip install -e '.[lightning]')")


def _env() -> dict:
    """The children's environment: the package first on the path, and a ``MASTER_PORT`` the
    kernel never hands out by itself (Lightning's own pick of a free port can be taken by another
    test's socket before its rank 0 binds it; it uses a port it is given)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
            "MASTER_PORT": str(unused_port())}


def _python(code: str, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    env = _env()
    return subprocess.run([sys.executable, *(["-c", code] if not code.endswith(".py") else [code]), *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def test_the_core_package_never_imports_lightning():
    result = _python(
        "import sys\n"
        "import contrastkit, contrastkit.train, contrastkit.losses, contrastkit.data, contrastkit.models\n"
        "import contrastkit.integrations, contrastkit.cli, contrastkit.methods.optimization\n"
        "found = sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning'))\n"
        "print(found)\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_without_lightning_the_integration_says_what_to_install():
    result = _python(
        "import sys\n"
        "sys.modules['lightning'] = None  # as if not installed\n"
        "try:\n"
        "    import contrastkit.integrations.lightning\n"
        "except ImportError as err:\n"
        "    print(err)\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ("contrastkit.integrations.lightning needs Lightning, which is not installed: "
                                     "pip install 'contrastkit[lightning]'")


@pytest.fixture(scope="module")
def tiny():
    from contrastkit.data import load_dataset

    return load_dataset("glyphlab", train_scenes=48, val_scenes=16, test_scenes=8)


def _trainer(tmp_path, **options):
    import lightning

    defaults = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, default_root_dir=str(tmp_path))
    return lightning.Trainer(**{**defaults, **options})


class _Record:
    """A callback keeping each step's loss, tau and tau's gradient."""

    def __new__(cls):
        import lightning

        class Record(lightning.Callback):
            def __init__(self):
                self.losses, self.taus, self.grads = [], [], []

            def on_train_batch_start(self, trainer, module, batch, batch_idx):
                self.taus.append(module.temperature)

            def on_before_optimizer_step(self, trainer, module, optimizer):
                grad = module.model.temperature.log_scale.grad
                self.grads.append(None if grad is None else float(grad))

            def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
                self.losses.append(float(outputs["loss"]))

        return Record()


def _own_encoder():
    """A user's module without batch statistics: (N, 1, 32, 32) -> (N, 16)."""
    return nn.Sequential(nn.Conv2d(1, 16, 3, stride=2, padding=1), nn.GroupNorm(4, 16), nn.ReLU(),
                         nn.Conv2d(16, 16, 3, stride=2, padding=1), nn.GroupNorm(4, 16), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten())


@needs_lightning
def test_one_process_trainer_trains_a_users_encoder_and_logs(tiny, tmp_path):
    from contrastkit.integrations.lightning import ContrastiveDataModule, ContrastiveModule
    from contrastkit.train import PretrainConfig
    from contrastkit.methods.optimization import warmup_cosine

    torch.manual_seed(0)  # the user's encoder is initialised from the global RNG: independent of test order
    config = PretrainConfig(method="simclr", batch_size=16, temperature=0.2, lr=3e-3, warmup_fraction=0.25, seed=1)
    data = ContrastiveDataModule(tiny, batch_size=16)
    own = _own_encoder()
    own_weights = {key: value.clone() for key, value in own.state_dict().items()}
    module = ContrastiveModule(config, data, encoder=own)
    initial = {key: value.clone() for key, value in module.model.state_dict().items()}
    record = _Record()
    trainer = _trainer(tmp_path, max_steps=9, callbacks=[record])
    torch.manual_seed(0)  # the views
    trainer.fit(module, data)

    assert trainer.global_step == 9
    changed = [key for key, value in module.model.state_dict().items() if not torch.equal(value, initial[key])]
    assert any(key.startswith("encoder.") for key in changed) and any(key.startswith("head.") for key in changed)
    # Copied (build_model) and never written back: the user's module is untouched, the trained one is
    # module.encoder. pretrain trains a copy too but loads the trained weights back into the caller's
    # module when it returns (docs/lightning.md says why the two differ).
    assert all(torch.equal(value, own_weights[key]) for key, value in own.state_dict().items())
    assert not all(torch.equal(value, own_weights[key.removeprefix("module.")])
                   for key, value in module.encoder.state_dict().items())
    assert sum(record.losses[-3:]) < sum(record.losses[:3])
    # self.log: loss, tau and the warm-up + cosine learning rate of the last step (index 8 of 9).
    metrics = trainer.callback_metrics
    assert {"loss", "tau", "lr", "val_loss"} <= set(metrics)
    assert float(metrics["loss"]) == pytest.approx(sum(record.losses[-3:]) / 3, rel=1e-5)  # the last epoch's mean
    assert float(metrics["lr"]) == pytest.approx(3e-3 * warmup_cosine(9, 2)(8), rel=1e-6)
    assert float(metrics["tau"]) == pytest.approx(0.2) and record.taus == pytest.approx([0.2] * 9)
    assert module.distributed is False

    # The checkpoint rebuilds the module from its saved config (the user's encoder passed again).
    path = tmp_path / "last.ckpt"
    trainer.save_checkpoint(path)
    again = ContrastiveModule.load_from_checkpoint(path, data=data, encoder=_own_encoder())
    assert all(torch.equal(value, again.model.state_dict()[key]) for key, value in module.model.state_dict().items())
    module.eval()
    images = tiny.test.images[:5]
    assert module.embed(images).shape == (5, 16)
    assert torch.allclose(module.embed((images * 255).round().to(torch.uint8)), module.embed(images), atol=1e-2)


@needs_lightning
def test_a_learnable_tau_is_clamped_after_every_optimizer_step(tiny, tmp_path):
    from contrastkit.integrations.lightning import ContrastiveDataModule, ContrastiveModule
    from contrastkit.train import PretrainConfig

    # A learnable tau started at its floor; identical views (strength 0) leave the contrastive
    # term almost flat, and the loss's 10 tau pushes log(1 / tau) past its cap at every step:
    # only clamp_() after the step brings it back (the forward's clamp alone would not).
    config = PretrainConfig(method="simclr", batch_size=16, view_strength=0.0, learnable_temperature=True,
                            temperature=MIN_TEMPERATURE, lr=3e-3, seed=1)

    def rewards_small_tau(z_a, z_b, *, temperature):
        return losses.nt_xent_views(z_a, z_b, temperature=temperature) + 10 * temperature()

    data = ContrastiveDataModule(tiny, batch_size=16)
    module = ContrastiveModule(config, data, loss=rewards_small_tau)
    record = _Record()
    _trainer(tmp_path, max_steps=4, callbacks=[record], limit_val_batches=0).fit(module, data)
    assert all(grad is not None and grad < -0.05 for grad in record.grads)
    assert module.model.temperature.log_scale.item() <= math.log(1 / MIN_TEMPERATURE) + 1e-6
    assert record.taus == pytest.approx([MIN_TEMPERATURE] * 4, abs=1e-6)


@needs_lightning
def test_a_scheduled_tau_is_set_before_every_step(tiny, tmp_path):
    from contrastkit.integrations.lightning import ContrastiveDataModule, ContrastiveModule
    from contrastkit.train import PretrainConfig

    config = PretrainConfig(method="dcl", batch_size=16, temperature_schedule="linear:0.5,0.1", seed=2)
    data = ContrastiveDataModule.from_config(PretrainConfig(data="glyphlab", batch_size=16, train_limit=48))
    module = ContrastiveModule(config, data)
    record = _Record()
    _trainer(tmp_path, max_steps=5, callbacks=[record], limit_val_batches=0).fit(module, data)
    schedule = module.config.schedule
    # on_train_batch_start of the callback runs before the module's: it sees the previous step's tau.
    assert record.taus[1:] == pytest.approx([schedule.value(step, 5) for step in range(4)], rel=1e-6)
    assert module.temperature == pytest.approx(schedule.value(4, 5), rel=1e-6)
    assert record.grads == [None] * 5  # a scheduled tau is no parameter


@needs_lightning
def test_any_loss_plugs_in_with_the_keywords_it_takes(tiny):
    from contrastkit.integrations.lightning import ContrastiveDataModule, ContrastiveModule
    from contrastkit.train import PretrainConfig

    data = ContrastiveDataModule(tiny, batch_size=16)
    config = PretrainConfig(method="simclr", batch_size=16, view_strength=0.0, temperature=0.3)
    images, labels = tiny.train.images[:8], tiny.train.labels[:8]
    seen = {}

    def spy(z_a, z_b, *, temperature, labels=None):
        seen.update(temperature=temperature, labels=labels)
        return losses.nt_xent_views(z_a, z_b, temperature=temperature)

    plain = ContrastiveModule(config, data)
    module = ContrastiveModule(config, data, loss=spy)
    assert torch.allclose(module.loss(images, labels), plain.loss(images, labels))  # same seed, same weights
    assert seen["temperature"] is module.model.temperature and torch.equal(seen["labels"], labels)

    hard = ContrastiveModule(config, data, loss=functools.partial(losses.hard_negative_nt_xent, top_k=3))
    debiased = ContrastiveModule(config, data, loss=losses.debiased_nt_xent)
    as_module = ContrastiveModule(config, data, loss=losses.DCL(temperature=losses.Temperature(0.5, learnable=True)))
    values = [m.loss(images, labels).item() for m in (plain, hard, debiased, as_module)]
    assert len(set(values)) == 4 and all(math.isfinite(v) for v in values)
    assert any(p is as_module.loss_function.temperature.log_scale for p in as_module.parameters())
    with pytest.raises(ValueError, match="moco"):
        ContrastiveModule(PretrainConfig(method="moco", batch_size=16), data, loss=spy)


@needs_lightning
def test_under_several_processes_a_loss_that_cannot_gather_is_refused(tiny, tmp_path):
    import types

    import torch.distributed as dist

    from contrastkit.integrations.lightning import ContrastiveDataModule, ContrastiveModule
    from contrastkit.train import PretrainConfig

    data = ContrastiveDataModule(tiny, batch_size=16)
    config = PretrainConfig(method="simclr", batch_size=16)
    def own_rows_only(z_a, z_b, *, temperature):  # a user's loss without distributed=
        return losses.nt_xent_views(z_a, z_b, temperature=temperature)

    cannot, can = (ContrastiveModule(config, data, loss=loss) for loss in (own_rows_only, losses.dcl))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'group'}", rank=0, world_size=1)
    try:
        for module in (cannot, can):
            module._trainer = types.SimpleNamespace(world_size=2)  # what setup() reads of a 2-process trainer
        with pytest.raises(ValueError, match="loss own_rows_only takes no distributed= argument"):
            cannot.setup("fit")
        can.setup("fit")
        assert can.distributed and can._keywords_for(None)["distributed_mode"] == "local"
    finally:
        dist.destroy_process_group()


@needs_lightning
def test_bad_input_gets_one_clear_error(tiny):
    from contrastkit.data import load_dataset
    from contrastkit.integrations.lightning import ContrastiveDataModule, ContrastiveModule
    from contrastkit.train import PretrainConfig

    data = ContrastiveDataModule(tiny, batch_size=16)
    with pytest.raises(ValueError, match="image-text pairs"):
        ContrastiveModule(PretrainConfig(method="convirt", data="glyphlab-text"), data)
    with pytest.raises(ValueError, match="views 'A'"):
        ContrastiveModule(PretrainConfig(views="A"), data)
    with pytest.raises(ValueError, match="micro_batch"):
        ContrastiveModule(PretrainConfig(batch_size=16, micro_batch=4), data)
    with pytest.raises(ValueError, match="temperature_method 'dual' is that loss"):
        ContrastiveModule(PretrainConfig(batch_size=16, temperature_method="dual"), data, loss=losses.dcl)
    # A loader of one's own without the sample indices: a per-sample temperature method's step refuses it.
    individual = ContrastiveModule(PretrainConfig(batch_size=16, temperature_method="individual"), data)
    with pytest.raises(ValueError, match="temperature_method 'individual' keeps one state per training sample"):
        individual.training_step((tiny.train.images[:8], tiny.train.labels[:8]), 0)
    with pytest.raises(TypeError, match="encoder must be"):
        ContrastiveModule(PretrainConfig(), data, encoder=3)
    with pytest.raises(TypeError, match="data must be"):
        ContrastiveModule(PretrainConfig(), object())
    with pytest.raises(ValueError, match="batch_size must be"):
        ContrastiveDataModule(tiny, batch_size=1)
    too_few = load_dataset("glyphlab", train_scenes=8, val_scenes=1, test_scenes=1)
    with pytest.raises(ValueError, match="the val split of 1 images gives each of 1 process"):
        ContrastiveDataModule(too_few, batch_size=4).val_dataloader()


@needs_lightning
def test_without_a_batch_size_the_modules_size_it_as_pretrain_does(tiny):
    """The data module and the module take pretrain's data-sized batch when none is given, and
    the module the data module's own batch (the one it trains at) before the data's."""
    from contrastkit.data.base import Dataset, Split
    from contrastkit.integrations.lightning import ContrastiveDataModule, ContrastiveModule
    from contrastkit.methods import default_batch_size
    from contrastkit.train import PretrainConfig

    labels = torch.arange(60_000) % 2
    big = Dataset("big", ["0", "1"], Split(torch.zeros(60_000, 1, 8, 8), labels),
                  Split(torch.zeros(4, 1, 8, 8), labels[:4]), Split(torch.zeros(4, 1, 8, 8), labels[:4]))
    assert ContrastiveDataModule(big).batch_size == 256 == default_batch_size(60_000)[0]
    assert ContrastiveDataModule(tiny).batch_size == 48  # 48 training scenes: the whole split, below 60
    assert ContrastiveModule(PretrainConfig(), ContrastiveDataModule(big)).config.batch_size == 256
    assert ContrastiveModule(PretrainConfig(), ContrastiveDataModule(big, batch_size=32)).config.batch_size == 32
    assert ContrastiveModule(PretrainConfig(), big).config.batch_size == 256
    assert ContrastiveModule(PretrainConfig(batch_size=128), ContrastiveDataModule(big)).config.batch_size == 128
    config = PretrainConfig(data="glyphlab", data_options={"train_scenes": 48, "val_scenes": 16, "test_scenes": 8})
    assert ContrastiveDataModule.from_config(config).batch_size == 48


@needs_lightning
@pytest.mark.parametrize("batch_size, expected", [(None, (16, 16, 16)), (4, (4, 4, 12)), (64, (64, 16, 16))],
                         ids=["chosen", "given", "given-above-the-split"])
def test_pretrain_and_the_lightning_modules_take_the_batch_and_queue_that_resolve_for_data_gives(
        tmp_path, batch_size, expected):
    """What the data decide is decided in one place (resolve_for_data): for MoCo on the same
    configuration and data (16 training scenes), pretrain's recorded configuration and plan, the
    Lightning data module's batch and the Lightning module's configuration and queue are that
    record's. ``expected``: the batch size, the step's batch (at most the split) and MoCo's
    default queue for that step's batch (up to 16 of them, fewer than the split holds: 4 * 3)."""
    import json

    from contrastkit.integrations.lightning import ContrastiveDataModule, ContrastiveModule
    from contrastkit.methods import resolve_for_data

    from _tiny_run import TINY_GLYPHLAB, tiny_config, train_only

    config = tiny_config(tmp_path / "run", method="moco", batch_size=batch_size)
    fitted, choices = resolve_for_data(config.resolved(), TINY_GLYPHLAB["train_scenes"])
    assert (choices.batch_size, choices.step_batch, choices.queue_size) == expected
    assert (fitted.batch_size, fitted.queue_size) == (choices.batch_size, choices.queue_size)
    train_only(config)
    with open(tmp_path / "run" / "config.json", encoding="utf-8") as handle:
        stored = json.load(handle)
    assert (stored["config"]["batch_size"], stored["config"]["queue_size"]) == (choices.batch_size, choices.queue_size)
    assert stored["derived"]["batch_size"] == choices.step_batch and stored["derived"]["defaults"] == choices.record()
    data = ContrastiveDataModule.from_config(config)
    module = ContrastiveModule(config, data)
    assert data.batch_size == choices.batch_size
    assert (module.config.batch_size, module.config.queue_size) == (choices.batch_size, choices.queue_size)
    assert module.model.queue.size == choices.queue_size


_DDP_SCRIPT = '''
"""Train a ContrastiveModule a few steps on DEVICES CPU processes; rank 0 saves the model."""
import sys

import lightning
import torch

from contrastkit.data import load_dataset
from contrastkit.integrations.lightning import ContrastiveDataModule, ContrastiveModule
from contrastkit.train import PretrainConfig

devices, out = int(sys.argv[1]), sys.argv[2]
torch.set_num_threads(1)
dataset = load_dataset("glyphlab", train_scenes=48, val_scenes=16, test_scenes=8)
# No batch statistics (GroupNorm, LayerNorm in the head) and identity views: the step is a
# function of the global batch alone. SGD, since Adam's first steps divide a gradient by its
# own size and so magnify the rounding of near-zero entries.
config = PretrainConfig(method="simclr", batch_size=16, norm="group", view_strength=0.0, optimizer="sgd",
                        learnable_temperature=True, temperature=0.2, lr=0.05, warmup_fraction=0.3, seed=3)
data = ContrastiveDataModule(dataset, batch_size=16, seed=5)
module = ContrastiveModule(config, data)
trainer = lightning.Trainer(max_steps=3, accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
                            logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, limit_val_batches=0, default_root_dir=out + ".lightning")
trainer.fit(module, data)
if trainer.global_rank == 0:
    torch.save({"model": module.model.state_dict(), "distributed": module.distributed,
                "world_size": trainer.world_size, "steps": trainer.global_step}, out)
'''


def _run_here(script, *args):
    """Run ``script`` with ``args`` as a program in this process (its thread setting undone)."""
    import runpy

    threads, argv = torch.get_num_threads(), sys.argv
    sys.argv = [str(script), *map(str, args)]
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = argv
        torch.set_num_threads(threads)


@needs_lightning
def test_ddp_on_two_processes_equals_one_process_on_the_global_batch(tmp_path):
    script = tmp_path / "ddp_run.py"
    script.write_text(_DDP_SCRIPT, encoding="utf-8")
    runs = {}
    for devices in (1, 2):
        out = tmp_path / f"devices{devices}.pt"
        if devices == 1:  # the one-process reference runs here: a fresh interpreter costs more than its steps
            _run_here(script, devices, out)
        else:
            result = _python(str(script), str(devices), str(out), timeout=240)
            assert result.returncode == 0, result.stderr[-3000:]
        runs[devices] = torch.load(out)
    one, two = runs[1], runs[2]
    assert (one["world_size"], one["distributed"], one["steps"]) == (1, False, 3)
    assert (two["world_size"], two["distributed"], two["steps"]) == (2, True, 3)
    for key, value in one["model"].items():
        assert torch.allclose(two["model"][key], value, rtol=0, atol=1e-6), key
    # The equality is not vacuous: three steps moved the weights and tau.
    from contrastkit.data import load_dataset
    from contrastkit.integrations.lightning import ContrastiveDataModule, ContrastiveModule
    from contrastkit.train import PretrainConfig

    dataset = load_dataset("glyphlab", train_scenes=48, val_scenes=16, test_scenes=8)
    initial = ContrastiveModule(PretrainConfig(method="simclr", batch_size=16, norm="group", temperature=0.2,
                                               learnable_temperature=True, seed=3),
                                ContrastiveDataModule(dataset, batch_size=16)).model.state_dict()
    moved = max(float((one["model"][key] - value).abs().max()) for key, value in initial.items())
    assert moved > 1e-3
    assert float((one["model"]["temperature.log_scale"] - initial["temperature.log_scale"]).abs()) > 1e-4


@needs_lightning
@pytest.mark.parametrize("workers", [0, 1])
def test_the_data_module_skips_and_names_the_damaged_files_of_a_collection(tmp_path, workers):
    """An unlabeled image collection goes through Lightning's loaders as it goes through
    ``contrastkit pretrain`` (items ``(image, -1)``: no label reaches the loss), and its damaged
    files, read in a worker or here, leave their batch and are named, never stopping the run."""
    import json
    import warnings

    from _data_fixtures import write_collection
    from contrastkit.data import open_data
    from contrastkit.integrations.lightning import ContrastiveDataModule, ContrastiveModule
    from contrastkit.train import PretrainConfig

    # A training split of 40 files, 4 of them empty: one epoch of 5 batches of 8 reads them all.
    damaged = ["zero.jpg", "zero1.jpg", "zero2.jpg", "zero3.jpg", "fake.png"]  # fake.png: the test split
    collection = open_data(write_collection(tmp_path / "photos", 60, damaged))  # bad_files: skip, the default
    assert collection.num_classes == 0 and len(collection.train) == 40
    config = PretrainConfig(method="simclr", batch_size=8, temperature=0.2, seed=0)
    data = ContrastiveDataModule(collection, batch_size=8, workers=workers)
    module = ContrastiveModule(config, data)
    logs = tmp_path / "logs"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = _trainer(logs, max_epochs=1)
        trainer.fit(module, data)
    assert trainer.global_step == 5
    named = sorted(os.path.basename(line.split("\t")[0]) for line in data.skipped_files())
    assert named == sorted(damaged[:4])
    assert all("cannot read image" in line for line in data.skipped_files())
    written = (logs / "skipped.txt").read_text().splitlines()
    assert written == data.skipped_files()
    assert "skipped.txt" in json.loads((logs / "contrastkit-manifest.json").read_text())["files"]
    assert any("skipped 4 damaged image file(s)" in str(w.message) for w in caught)

    # A skipped.txt of the user's is never replaced: the names go in the warning instead.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "skipped.txt").write_text("my own notes")
    data = ContrastiveDataModule(open_data(tmp_path / "photos"), batch_size=8, workers=workers)
    with pytest.warns(UserWarning, match="is not contrastkit's, so not replaced: .*zero"):
        _trainer(mine, max_epochs=1).fit(ContrastiveModule(config, data), data)
    assert (mine / "skipped.txt").read_text() == "my own notes"


@needs_lightning
def test_a_collection_that_fails_on_damaged_files_stops_naming_the_file(tmp_path):
    from _data_fixtures import write_collection
    from contrastkit.data import UnreadableImageError, open_data
    from contrastkit.integrations.lightning import ContrastiveDataModule, ContrastiveModule
    from contrastkit.train import PretrainConfig

    collection = open_data(write_collection(tmp_path / "photos", 60, ["zero.jpg"]), bad_files="fail")
    data = ContrastiveDataModule(collection, batch_size=8)
    module = ContrastiveModule(PretrainConfig(method="simclr", batch_size=8, seed=0), data)
    with pytest.raises(UnreadableImageError, match="zero.jpg"):
        _trainer(tmp_path, max_epochs=1).fit(module, data)


_DDP_COLLECTION_SCRIPT = '''
"""One epoch of a ContrastiveModule on a collection with damaged files, on 2 CPU processes."""
import os
import sys

import lightning
import torch

from contrastkit.data import open_data
from contrastkit.integrations.lightning import ContrastiveDataModule, ContrastiveModule
from contrastkit.train import PretrainConfig

photos, logs = sys.argv[1], sys.argv[2]
torch.set_num_threads(1)
data = ContrastiveDataModule(open_data(photos), batch_size=8)
module = ContrastiveModule(PretrainConfig(method="simclr", batch_size=8, norm="group", seed=0), data)
trainer = lightning.Trainer(max_epochs=1, accelerator="cpu", devices=2, strategy="ddp", logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            limit_val_batches=0, default_root_dir=logs)
trainer.fit(module, data)
# One write of one line: the two processes share the pipe, and print's pieces interleave.
os.write(1, f"rank {trainer.global_rank} steps {trainer.global_step} named {len(data.skipped_files())}\\n".encode())
'''


@needs_lightning
def test_under_ddp_rank_zero_names_the_damaged_files_every_rank_skipped(tmp_path):
    from _data_fixtures import write_collection

    # 40 training files, 4 of them empty: each of the 2 processes reads 20 (5 steps of 4).
    damaged = ["zero.jpg", "zero1.jpg", "zero2.jpg", "zero3.jpg"]
    write_collection(tmp_path / "photos", 60, damaged)
    script = tmp_path / "ddp_collection.py"
    script.write_text(_DDP_COLLECTION_SCRIPT, encoding="utf-8")
    result = _python(str(script), str(tmp_path / "photos"), str(tmp_path / "logs"), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rank 0 steps 5 named 4" in result.stdout
    named = [line.split("\t")[0] for line in (tmp_path / "logs" / "skipped.txt").read_text().splitlines()]
    assert sorted(os.path.basename(path) for path in named) == sorted(damaged)


_DDP_SHORT_BATCH_SCRIPT = '''
"""Two steps of a ContrastiveModule on 2 CPU processes, rank 1's first batch left with one
readable image; a collective that waits longer than 90 s raises instead of blocking."""
import datetime
import os
import sys

import lightning
import torch
from lightning.pytorch.strategies import DDPStrategy

from contrastkit.data import open_data
from contrastkit.integrations.lightning import ContrastiveDataModule, ContrastiveModule
from contrastkit.train import PretrainConfig

photos, out = sys.argv[1], sys.argv[2]
torch.set_num_threads(1)
data = ContrastiveDataModule(open_data(photos), batch_size=8, shuffle=False)
module = ContrastiveModule(PretrainConfig(method="simclr", batch_size=8, seed=0), data)
initial = {key: value.clone() for key, value in module.model.state_dict().items()}
after = []


class Weights(lightning.Callback):
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        after.append({key: value.clone() for key, value in module.model.state_dict().items()})


trainer = lightning.Trainer(max_epochs=1, limit_train_batches=2, accelerator="cpu", devices=2, callbacks=[Weights()],
                            strategy=DDPStrategy(timeout=datetime.timedelta(seconds=90)), logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            limit_val_batches=0, default_root_dir=out + ".lightning")
trainer.fit(module, data)
if trainer.global_rank == 0:
    torch.save({"initial": initial, "after": after, "steps": trainer.global_step}, out)
'''


def _bounded_python(script: str, *args: str, timeout: int) -> subprocess.CompletedProcess:
    """:func:`_python` in a session of its own: past ``timeout`` the whole session (the ranks
    Lightning started too) is killed, and the test fails instead of blocking."""
    import signal

    env = _env()
    child = subprocess.Popen([sys.executable, script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env, cwd=ROOT, start_new_session=True)
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        out, err = child.communicate()
        pytest.fail(f"the ranks did not finish in {timeout} s (a hang): {err[-3000:]}")
    return subprocess.CompletedProcess(child.args, child.returncode, out, err)


@needs_lightning
def test_under_ddp_a_batch_short_of_readable_images_on_one_rank_is_skipped_by_every_rank(tmp_path):
    from _data_fixtures import write_collection
    from contrastkit.data import open_data

    photos = write_collection(tmp_path / "photos", 40, damaged=())
    train = open_data(photos).train
    assert len(train) >= 16
    # Unshuffled, rank r loads items r, r + 2, ... of the training split: rank 1's first batch is
    # items 1, 3, 5, 7. Three of them emptied leave it one readable image; rank 0's batch has 4.
    for index in (1, 3, 5):
        Path(train.path(index)).write_bytes(b"")
    script = tmp_path / "ddp_short_batch.py"
    script.write_text(_DDP_SHORT_BATCH_SCRIPT, encoding="utf-8")
    out = tmp_path / "short.pt"
    result = _bounded_python(str(script), str(photos), str(out), timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    run = torch.load(out)
    # Rank 1's first batch was skipped on both ranks: no update (the weights after it are the
    # initial ones, exactly); the second batch trained.
    first, second = run["after"]
    assert all(torch.equal(first[key], value) for key, value in run["initial"].items())
    assert max(float((second[key] - value).abs().max()) for key, value in run["initial"].items()) > 1e-4
    assert run["steps"] == 2


# ------------------------------------------------------------- one step protocol, every method

def _registered_runs():
    """Every registered method, and every temperature method with each method that takes one."""
    from contrastkit.methods import get_method, method_names
    from contrastkit.temperature_methods import temperature_method_names

    runs = [(name, None) for name in method_names()]
    runs += [(name, spec) for name in method_names() if get_method(name).temperature_methods for spec in temperature_method_names()]
    return runs


@needs_lightning
@pytest.mark.parametrize("name, spec", _registered_runs())
def test_every_method_trains_under_lightning_or_is_refused_before_training(tiny, tmp_path, name, spec):
    """Each registered method and temperature method either trains (its sanity validation, two
    optimizer steps and an epoch's validation included) or is refused when the module is built,
    with one error naming it: never a failure inside the trainer."""
    from contrastkit.integrations.lightning import ContrastiveDataModule, ContrastiveModule
    from contrastkit.methods import get_method
    from contrastkit.train import PretrainConfig

    # A paired method's configuration names its own kind of data (else the configuration refuses it).
    config = PretrainConfig(method=name, data="glyphlab-text" if get_method(name).paired else "glyphlab",
                            batch_size=16, temperature_method=spec, seed=0)
    data = ContrastiveDataModule(tiny, batch_size=16)
    try:
        module = ContrastiveModule(config, data)
    except ValueError as err:
        message = str(err)
        assert re.search(rf"\b{name}\b", message) and "\n" not in message, message
        # What Lightning cannot run is what docs/lightning.md lists: the image-text methods.
        assert get_method(name).paired, f"{name} (schedule {spec}) refused: {message}"
        return
    trainer = _trainer(tmp_path, max_steps=2, limit_val_batches=1, val_check_interval=2)
    trainer.fit(module, data)
    assert trainer.global_step == 2
    assert math.isfinite(float(trainer.callback_metrics["loss"]))
    assert math.isfinite(float(trainer.callback_metrics["val_loss"]))


def _step_losses(out):
    import json

    with open(out / "metrics.jsonl", encoding="utf-8") as handle:
        return [record["loss"] for record in map(json.loads, handle) if record.get("kind") == "step"]


@needs_lightning
@pytest.mark.parametrize("spec", ["individual", "network"])
def test_a_per_sample_temperature_method_trains_under_lightning_as_in_pretrain(tmp_path, spec):
    """Lightning and ``contrastkit pretrain`` run the same step: on the same configuration (the
    whole training split as the batch, identity views, no batch statistics, SGD) their step
    losses and the per-sample state they leave agree to float32 rounding."""
    from contrastkit.integrations.lightning import ContrastiveDataModule, ContrastiveModule

    from _tiny_run import tiny_config, train_only

    epochs = 3
    config = tiny_config(tmp_path / "run", temperature_method=spec, epochs=epochs, batch_size=16, norm="group",
                         view_strength=0.0, optimizer="sgd", lr=0.05, warmup_fraction=0.0, seed=4)
    train_only(config)
    looped = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)["model"]
    loop_losses = _step_losses(tmp_path / "run")

    data = ContrastiveDataModule.from_config(config)
    module = ContrastiveModule(config, data)
    initial = {key: value.clone() for key, value in module.model.state_dict().items()}
    record = _Record()
    _trainer(tmp_path, max_epochs=epochs, callbacks=[record], limit_val_batches=0).fit(module, data)
    state = module.model.state_dict()

    assert len(record.losses) == len(loop_losses) == epochs  # one batch of 16 an epoch
    # The two runs differ only in the order of the batch's rows (the loop's and the
    # DistributedSampler's shuffles), hence in the order of the sums over its 32 anchors:
    # relative differences of a few float32 ulps (1.2e-7) per sum, over 3 steps. A loss that is
    # a difference of terms of size ~1 cancelling near 0 (TempNet's: -0.005 at step 2) keeps
    # their absolute rounding instead, at most one ulp of each of the 32 anchors' terms.
    eps = torch.finfo(torch.float32).eps
    assert record.losses == pytest.approx(loop_losses, rel=1e-5, abs=32 * eps)
    per_sample = [key for key in state if key.startswith("temperature_method.") and state[key].shape == (16,)]
    assert "temperature_method.log_u" in per_sample
    assert bool(torch.isfinite(state["temperature_method.log_u"]).all())  # every scene's estimate written
    if spec == "individual":
        assert {"temperature_method.tau", "temperature_method.momentum"} <= set(per_sample)
        assert not torch.equal(state["temperature_method.tau"], initial["temperature_method.tau"])
    # The per-sample temperatures follow their gradients, each the difference of two such sums
    # over the batch (the positive's similarity and the softmax-weighted mean of all) that
    # nearly cancel: the order's rounding comes back ~10x larger relative to it (measured
    # 4e-5 for iSogCLR's momentum and tau, 2e-6 for the moving estimates).
    for key in per_sample:
        assert torch.allclose(state[key], looped[key], rtol=1e-4, atol=0), key
    assert module.temperature == pytest.approx(float(looped["temperature.log_scale"].neg().exp()), rel=1e-5)


@needs_lightning
def test_the_training_loader_gives_each_batch_its_global_sample_indices(tiny):
    """The data module's training batches carry their items' indices in the training split (the
    per-sample state's), the global ones under several processes."""
    import types

    from contrastkit.integrations.lightning import ContrastiveDataModule

    seen = []
    for rank in (0, 1):
        data = ContrastiveDataModule(tiny, batch_size=8, seed=3)
        data.trainer = types.SimpleNamespace(world_size=2, global_rank=rank,
                                             strategy=types.SimpleNamespace(root_device=torch.device("cpu")))
        for images, labels, indices in data.train_dataloader():
            assert torch.equal(images, tiny.train.images[indices]) and torch.equal(labels, tiny.train.labels[indices])
            seen.append(indices)
    everyone = torch.cat(seen)
    assert sorted(everyone.tolist()) == list(range(len(tiny.train)))  # 48 = 2 ranks x 6 batches of 4


@needs_lightning
def test_the_module_ignores_online_probe_it_trains_no_head_and_the_same_weights(tiny, tmp_path):
    """``online_probe`` is pretrain's (the module's docstring says so): on or off, the module has
    the same parameters, logs the same names and trains to the same weights."""
    from contrastkit.integrations.lightning import ContrastiveDataModule, ContrastiveModule
    from contrastkit.train import PretrainConfig

    trained = []
    for online_probe in (True, False):
        config = PretrainConfig(method="simclr", batch_size=16, norm="group", seed=1, online_probe=online_probe)
        data = ContrastiveDataModule(tiny, batch_size=16)
        module = ContrastiveModule(config, data)
        trainer = _trainer(tmp_path / str(online_probe), max_steps=2, limit_val_batches=0)
        torch.manual_seed(0)  # the views
        trainer.fit(module, data)
        assert not any(name.startswith("online") for name in trainer.callback_metrics)
        trained.append(module.state_dict())
    assert trained[0].keys() == trained[1].keys()
    for key, value in trained[0].items():
        assert torch.equal(value, trained[1][key]), key

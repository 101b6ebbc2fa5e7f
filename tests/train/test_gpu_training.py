"""Training that uses a GPU well, checked on the CPU: --precision (autocast, the fp16 gradient
scaler and its checkpointed state), --channels-last, --data-on-device (the CPU as the device).

Exactness claims (a resumed run ends where an uninterrupted one does; images held on the
device give the same run as images read from the host) are checked bit for bit here, on the
CPU; tests/train/test_device_training.py runs the same paths on --test-device with tolerances.
"""

import json

import numpy as np
import pytest
import torch

from contrastkit.cli import main
from contrastkit.data import OnDevicePlan, choose_on_device, hold_on_device
from contrastkit.data.on_device import AUTO_SHARE, DeviceImages, compact_images
from contrastkit.data.streaming import unit_float
from contrastkit.methods import PretrainConfig, StepPrecision, build_optimizer, channels_last_batch, check_precision
from contrastkit.methods import precision as precision_module
from contrastkit.train import pretrain

from _tiny_run import TINY_ARGS, tiny_config, train_only


class _Interrupt(Exception):
    pass


def _stop_after_first_epoch(epoch, record):
    if epoch == 1:
        raise _Interrupt


def _state(out):
    return torch.load(out / "checkpoints" / "last.pt", weights_only=True)


def _same(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _same(a[key], b[key])
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    else:
        assert a == b


class RGBImages(torch.utils.data.Dataset):
    """24 uint8 RGB images of 12x12 in 3 classes (a user's map-style data set: it is streamed)."""

    def __init__(self, n=24, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (n, 3, 12, 12), dtype=torch.uint8, generator=g)
        self.targets = [i % 3 for i in range(n)]

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        return self.images[index], self.targets[index]


# -- precision ------------------------------------------------------------------------------

@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precision_trains_and_resumes_exactly(tmp_path, precision, one_torch_thread):
    train_only(tiny_config(tmp_path / "straight", epochs=2, precision=precision))
    config = tiny_config(tmp_path / "resumed", epochs=2, precision=precision)
    with pytest.raises(_Interrupt):
        pretrain(config, progress=False, on_epoch_end=_stop_after_first_epoch)
    first = _state(tmp_path / "resumed")
    if precision == "fp16":  # the gradient scaler's state is part of the checkpoint
        assert first["precision"]["scaler"]["scale"] > 0
    else:
        assert first["precision"] == {}
    train_only(config, resume=True)
    a, b = _state(tmp_path / "straight"), _state(tmp_path / "resumed")
    assert a["epoch"] == b["epoch"] == 2 and np.isfinite(a["epoch_losses"]).all()
    assert a["epoch_losses"] == b["epoch_losses"]
    _same(a["model"], b["model"])
    _same(a["optimizer"]["state"], b["optimizer"]["state"])
    _same(a["precision"], b["precision"])
    stored = json.loads((tmp_path / "resumed" / "config.json").read_text())
    assert stored["config"]["precision"] == precision


def test_half_precision_changes_the_arithmetic_not_the_result(tmp_path, capsys, one_torch_thread):
    train_only(tiny_config(tmp_path / "32", epochs=1))
    # the default on the CPU holds nothing and says so in config.json only
    assert "data on device" not in capsys.readouterr().err
    derived = json.loads((tmp_path / "32" / "config.json").read_text())["derived"]
    assert not derived["data_on_device"]["held"] and "the device is the CPU" in derived["data_on_device"]["reason"]
    train_only(tiny_config(tmp_path / "bf16", epochs=1, precision="bf16"))
    full, half = _state(tmp_path / "32")["epoch_losses"][0], _state(tmp_path / "bf16")["epoch_losses"][0]
    assert half != full  # the forward pass really ran in bfloat16
    assert half == pytest.approx(full, rel=0.05)


def test_the_loss_stays_float32_under_autocast(tmp_path, monkeypatch, one_torch_thread):
    """The losses compute in float32 under the step's autocast; the encoder's output does not."""
    from contrastkit.methods import SimCLR

    seen = []
    objective = SimCLR.objective

    def recording(self, model, embeddings, labels):
        loss = objective(self, model, embeddings, labels)
        seen.append((embeddings[0].dtype, loss.dtype, torch.is_autocast_enabled("cpu")))
        return loss

    monkeypatch.setattr(SimCLR, "objective", recording)
    train_only(tiny_config(tmp_path / "run", precision="bf16"))
    assert seen and all(item == (torch.bfloat16, torch.float32, True) for item in seen)


def test_precision_is_checked_before_any_work(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="precision must be one of 32, bf16, fp16"):
        PretrainConfig(precision="half").resolved()
    assert PretrainConfig(precision=32).resolved().precision == "32"  # a config file's number
    monkeypatch.setattr(precision_module, "autocast_supported", lambda device, dtype: dtype == torch.bfloat16)
    with pytest.raises(ValueError, match=r"--precision fp16: .* cannot autocast to torch.float16 on cpu; "
                                         r"use --precision 32 or --precision bf16"):
        pretrain(tiny_config(tmp_path / "run", precision="fp16"), progress=False)
    assert not (tmp_path / "run").exists()


def test_autocast_support_is_read_from_torch():
    assert precision_module.autocast_supported(torch.device("cpu"), torch.bfloat16)
    check_precision("bf16", torch.device("cpu"))  # this torch autocasts the CPU to bfloat16
    # float16 on the CPU: supported or refused, never silently float32
    if precision_module.autocast_supported(torch.device("cpu"), torch.float16):
        check_precision("fp16", torch.device("cpu"))
    else:
        with pytest.raises(ValueError, match="--precision fp16"):
            check_precision("fp16", torch.device("cpu"))


def test_fp16_steps_through_the_scaler_with_the_fused_optimizer():
    model = torch.nn.Linear(4, 2)
    optimizer = build_optimizer(model, PretrainConfig(precision="fp16").resolved())
    assert optimizer.defaults["fused"] is True  # the scaler's overflow flag stays on the device
    assert build_optimizer(model, PretrainConfig().resolved()).defaults.get("fused") in (None, False)
    step = StepPrecision("fp16", torch.device("cpu"))
    before = model.weight.detach().clone()
    with step.autocast():
        loss = model(torch.full((3, 4), 1e4)).float().pow(2).sum() * 1e30  # overflows: the step is skipped
    optimizer.zero_grad()
    step.backward(loss)
    scale = step.scaler.get_scale()
    step.step(optimizer)
    assert torch.equal(model.weight, before) and step.scaler.get_scale() < scale
    with pytest.raises(ValueError, match="no gradient scaler state"):
        step.load_state_dict({})


# -- channels last ---------------------------------------------------------------------------

def test_channels_last_runs_the_same_numbers_within_rounding(tmp_path, one_torch_thread):
    train_only(tiny_config(tmp_path / "plain", epochs=1))
    train_only(tiny_config(tmp_path / "last", epochs=1, channels_last=True))
    plain, last = _state(tmp_path / "plain"), _state(tmp_path / "last")
    assert last["epoch_losses"][0] == pytest.approx(plain["epoch_losses"][0], rel=1e-4)
    kernels = [name for name, w in last["model"].items() if w.ndim == 4]
    assert kernels and all(last["model"][name].is_contiguous(memory_format=torch.channels_last) for name in kernels)


@pytest.mark.parametrize("encoder", ["small", "resnet18"])
def test_a_channels_last_step_has_the_loss_and_gradients_of_nchw(encoder, one_torch_thread):
    """One step's loss and gradients, in float64: in float32 the two layouts round differently,
    and where a ReLU's input lies within that rounding of 0 the gradient takes the other side of
    the kink (and BatchNorm spreads it over the channel); Adam's first update would magnify it."""
    from contrastkit.methods import build_model, get_method

    config = PretrainConfig(encoder=encoder).resolved()
    torch.manual_seed(0)
    images = torch.rand(8, 3, 16, 16, dtype=torch.float64)
    batch = (images, images.flip(-1))
    results = []
    for memory_format in (torch.contiguous_format, torch.channels_last):
        model = build_model(config, (3, 16, 16)).double().to(memory_format=memory_format)
        step_batch = channels_last_batch(batch) if memory_format == torch.channels_last else batch
        loss = get_method("simclr").loss(model, step_batch)
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert any(p.ndim == 4 for p in model.parameters())
    torch.testing.assert_close(loss_b, loss_a, rtol=1e-12, atol=1e-12)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-9, atol=1e-12)


def test_channels_last_batch_converts_images_only():
    images, ids = torch.rand(2, 3, 4, 5), torch.ones(2, 7, dtype=torch.long)
    views = channels_last_batch((images, (ids, ids)))
    assert views[0].is_contiguous(memory_format=torch.channels_last) and torch.equal(views[0], images)
    assert views[1][0] is ids
    assert channels_last_batch([images])[0].is_contiguous(memory_format=torch.channels_last)


# -- data on device --------------------------------------------------------------------------

@pytest.mark.parametrize("options", [{}, {"method": "moco", "views": "A"}, {"method": "siglip", "data": "glyphlab-text",
                                                                            "views": "paired"}],
                         ids=["simclr", "moco-realisations", "siglip-pairs"])
def test_images_held_on_the_device_give_the_same_run(tmp_path, options, capsys, one_torch_thread):
    train_only(tiny_config(tmp_path / "off", epochs=2, data_on_device="off", **options))
    train_only(tiny_config(tmp_path / "on", epochs=2, data_on_device="on", **options))
    off, on = _state(tmp_path / "off"), _state(tmp_path / "on")
    assert on["epoch_losses"] == off["epoch_losses"]
    _same(off["model"], on["model"])
    err = capsys.readouterr().err
    assert "data on device: off (--data-on-device off)" in err
    assert "data on device: on (asked for: " in err and "free on cpu" in err
    derived = json.loads((tmp_path / "on" / "config.json").read_text())["derived"]
    assert derived["data_on_device"]["held"] is True and derived["data_on_device"]["bytes"] > 0


def test_a_streamed_data_set_is_decoded_once_and_gives_the_same_run(tmp_path, monkeypatch, one_torch_thread):
    data = RGBImages()
    reads = []
    original = RGBImages.__getitem__
    monkeypatch.setattr(RGBImages, "__getitem__", lambda self, i: reads.append(i) or original(self, i))
    train_only(tiny_config(tmp_path / "off", epochs=3, data_on_device="off"), dataset=data)
    streamed_reads = len(reads)
    reads.clear()
    train_only(tiny_config(tmp_path / "on", epochs=3, data_on_device="on"), dataset=data)
    off, on = _state(tmp_path / "off"), _state(tmp_path / "on")
    assert on["epoch_losses"] == off["epoch_losses"]
    _same(off["model"], on["model"])
    assert len(reads) < streamed_reads  # the training split was decoded once, not every epoch


def test_auto_holds_on_an_accelerator_when_a_quarter_of_the_free_memory_holds_them():
    gib = 2**30
    assert choose_on_device("auto", gib, "cuda", 8 * gib).hold
    assert not choose_on_device("auto", gib, "cuda", 3 * gib).hold  # more than a quarter
    assert "more than a quarter" in choose_on_device("auto", gib, "cuda", 3 * gib).reason
    assert AUTO_SHARE == 0.25
    assert not choose_on_device("auto", gib, "cuda", None).hold  # free memory unknown
    assert choose_on_device("on", gib, "cuda", None).hold
    assert choose_on_device("on", gib, "cuda", 2 * gib).hold  # asked for: more than a quarter is fine
    with pytest.raises(ValueError, match="--data-on-device on: the training images take 1.00 GiB, more than"):
        choose_on_device("on", gib, "cuda", gib // 2)
    plan = choose_on_device("auto", None, "cpu", None)
    assert not plan.hold and "the device is the CPU" in plan.message
    assert not choose_on_device("off", None, "cuda", None).hold
    with pytest.raises(ValueError, match="data_on_device must be auto, on or off"):
        choose_on_device("always", 1, "cuda", 2)
    with pytest.raises(ValueError, match="data_on_device must be one of auto, on, off"):
        PretrainConfig(data_on_device="yes").resolved()


def test_held_images_are_uint8_only_where_that_is_lossless():
    eight_bit = torch.randint(0, 256, (5000, 1, 2, 2), dtype=torch.uint8)  # over one chunk of rows
    images = unit_float(eight_bit)
    assert compact_images(images).dtype == torch.uint8 and torch.equal(compact_images(images), eight_bit)
    generated = images.clone()
    generated[4999, 0, 1, 1] = 0.3  # not k / 255
    assert compact_images(generated) is generated
    assert compact_images(images.double()).dtype == torch.float64
    held = DeviceImages(images, "cpu")
    assert held.nbytes == images.numel() and torch.equal(held.load(), eight_bit)


def test_a_caller_s_own_views_hold_nothing(tmp_path):
    class OwnViews:
        def __call__(self, split, indices):
            return split.images[indices], split.images[indices]

    plan = hold_on_device("auto", OwnViews(), None, "cuda")
    assert plan == OnDevicePlan(False, plan.reason, 0) and "views=" in plan.reason
    with pytest.raises(ValueError, match=r"--data-on-device on: the batch maker given to pretrain \(views=\)"):
        hold_on_device("on", OwnViews(), None, "cpu")


def test_a_damaged_file_keeps_a_streamed_split_off_the_device(tmp_path, monkeypatch):
    from PIL import Image

    from contrastkit.data import on_device, open_data, training_views

    folder = tmp_path / "photos"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(20):
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(folder / f"{i:02d}.png")
    (folder / "broken.png").write_bytes(b"not an image")
    common = dict(data=str(folder), data_options={"size": 8}, unlabeled=True, batch_size=4, epochs=1)
    with pytest.raises(ValueError, match=r"--data-on-device on: 1 image\(s\) of the training split could not be read"):
        pretrain(tiny_config(tmp_path / "on", data_on_device="on", **common), progress=False, baselines=False)
    # auto (on an accelerator, which the CPU stands in for here) streams around the damaged file
    monkeypatch.setattr(on_device, "needs_size", lambda setting, device: True)
    monkeypatch.setattr(on_device, "choose_on_device",
                        lambda setting, nbytes, device, free: OnDevicePlan(True, "auto: it fits", nbytes))
    dataset = open_data(str(folder), unlabeled=True, size=8)
    plan = hold_on_device("auto", training_views(dataset, device="cpu"), dataset.train, "cpu")
    assert not plan.hold and plan.reason.startswith("auto: 1 image(s) of the training split could not be read")


# -- the command line ------------------------------------------------------------------------

def test_the_options_on_the_command_line(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["pretrain", *TINY_ARGS, "--epochs", "1", "--out", str(out), "--precision", "bf16", "--channels-last",
            "--data-on-device", "on", "--no-baselines"]
    assert main(args) == 0
    assert "data on device: on" in capsys.readouterr().err
    stored = json.loads((out / "config.json").read_text())
    assert (stored["config"]["precision"], stored["config"]["channels_last"], stored["config"]["data_on_device"]) == \
        ("bf16", True, "on")
    # precision may not change on resume; where the images are held may
    assert main(["pretrain", "--out", str(out), "--resume", "--epochs", "2", "--precision", "32", "--quiet"]) == 2
    assert "precision: checkpoint 'bf16' vs now '32'" in capsys.readouterr().err
    assert main(["pretrain", "--out", str(out), "--resume", "--epochs", "2", "--data-on-device", "off", "--quiet",
                 "--no-report", "--no-baselines"]) == 0

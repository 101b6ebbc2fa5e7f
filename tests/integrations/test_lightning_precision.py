"""The Lightning module and the GPU options of its config: mixed precision is the trainer's
(a config asking for it under a trainer that does not run it is refused), channels-last is
honoured, data-on-device is contrastkit pretrain's."""

import pytest
import torch

lightning = pytest.importorskip("lightning", reason="the lightning extra is not installed (pip install -e '.[lightning]')")

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec")  # inside Lightning 2.6


@pytest.fixture(scope="module")
def tiny():
    from contrastkit.data import load_dataset

    return load_dataset("glyphlab", train_scenes=16, val_scenes=8, test_scenes=8, size=28)


def _fit(module, data, tmp_path, **options):
    trainer = lightning.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False, max_steps=2,
                                limit_val_batches=0, default_root_dir=str(tmp_path), **options)
    trainer.fit(module, data)
    return trainer


def test_a_config_s_mixed_precision_needs_the_trainer_s(tiny, tmp_path):
    from contrastkit.integrations.lightning import ContrastiveDataModule, ContrastiveModule
    from contrastkit.methods import PretrainConfig

    data = ContrastiveDataModule(tiny, batch_size=8)
    module = ContrastiveModule(PretrainConfig(batch_size=8, precision="bf16"), data)
    with pytest.raises(ValueError, match=r"config.precision 'bf16' .*Trainer\(precision='bf16-mixed'\)"):
        _fit(module, data, tmp_path)
    seen = []
    module = ContrastiveModule(PretrainConfig(batch_size=8, precision="bf16"), data)
    module.model.head.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    trainer = _fit(module, data, tmp_path, precision="bf16-mixed")
    assert trainer.global_step == 2 and seen and set(seen) == {torch.bfloat16}


def test_channels_last_and_data_on_device(tiny, tmp_path):
    from contrastkit.integrations.lightning import ContrastiveDataModule, ContrastiveModule
    from contrastkit.methods import PretrainConfig

    data = ContrastiveDataModule(tiny, batch_size=8)
    module = ContrastiveModule(PretrainConfig(batch_size=8, channels_last=True), data)
    inputs = []
    module.model.encoder.register_forward_pre_hook(lambda m, args: inputs.append(args[0]))
    _fit(module, data, tmp_path)
    kernels = [p for p in module.model.parameters() if p.ndim == 4]
    assert kernels and all(p.is_contiguous(memory_format=torch.channels_last) for p in kernels)
    assert inputs and all(x.is_contiguous(memory_format=torch.channels_last) for x in inputs)
    with pytest.raises(ValueError, match="data_on_device='on' is contrastkit pretrain's"):
        ContrastiveModule(PretrainConfig(batch_size=8, data_on_device="on"), data)

"""Worker for the two-process test of ``--method siglip`` (imported by spawned processes):
each rank takes its half of a batch, runs the method's loss through DDP, as the training loop
does under torchrun, and saves the averaged gradients."""

from __future__ import annotations

import torch

from contrastkit.data import load_paired
from contrastkit.methods.convirt import PairedBatches, build_tokenizer
from contrastkit.methods import SiglipModel, get_method
from contrastkit.train.parallel import LossForward

PAIRS = 12
DATA = dict(seed=3, train_scenes=PAIRS, val_scenes=3, test_scenes=3)


def model_and_batch():
    """The same eval-mode model (BatchNorm on running statistics, so that the ranks' halves
    see what the whole batch sees) and batch on every process."""
    dataset = load_paired("glyphlab-text", **DATA)
    tokenizer = build_tokenizer(dataset)
    torch.manual_seed(0)
    model = SiglipModel("small", 1, tokenizer, projection_dim=16).eval()
    batch = PairedBatches(tokenizer, torch.device("cpu"))(dataset.train, torch.arange(PAIRS))
    return model, batch


def gradients(model) -> dict:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def ddp_worker(rank: int, world: int) -> dict:
    model, (images, (ids, mask)) = model_and_batch()
    model.distributed = True
    share = slice(rank * PAIRS // world, (rank + 1) * PAIRS // world)
    step = torch.nn.parallel.DistributedDataParallel(LossForward(model, get_method("siglip")))
    loss = step((images[share], (ids[share], mask[share])), None)
    loss.backward()
    return {"loss": float(loss.detach()), "grads": gradients(model)}

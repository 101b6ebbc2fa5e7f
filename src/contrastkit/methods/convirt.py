"""ConVIRT (Zhang et al. 2020; the ConVIRT tutorial): an image encoder and a text encoder
trained on paired data with InfoNCE in both directions, weighted by ``lambda`` (image->text) and
``1 - lambda`` (text->image): :func:`contrastkit.losses.bidirectional_info_nce`.

The pieces the ``convirt`` method (:class:`contrastkit.methods.Convirt`: its data, batch,
loss and evaluation hooks) puts together:

* :class:`ConvirtModel` -- image encoder (the pipeline's) + :class:`~contrastkit.models.text.TextEncoder`,
  a projection head to the joint space ``d`` on each side, a fixed or learnable temperature.
* :class:`PairedBatches` -- the batch maker of paired data: for a batch of pair indices, the
  images (a random noise realisation when the data have them; no crops or flips, which would
  make position and orientation statements in the texts false) and the token ids of the texts.
  Paired data held in memory and streamed pairs
  (:func:`~contrastkit.data.as_streaming_pairs`: the images decoded in ``DataLoader`` workers,
  the texts held) give the same batches.
* :func:`evaluate_convirt` -- held-out retrieval (image->text, text->image Recall@1/5/10 with
  chance level) and zero-shot classification from class prompts.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np
import torch
from torch import Tensor, nn

from contrastkit import layout
from contrastkit import losses
from contrastkit.data import DataSplit, DataSplits, PairedImages
from contrastkit.data.sources import check_paired_source
from contrastkit.losses import validation
from contrastkit.losses.validation import check_probability
from contrastkit.metrics.batch import IMAGE, TEXT, BatchProblem
from contrastkit.metrics.readout import extract_features
from contrastkit.models import ProjectionHead, build_encoder
from contrastkit.models.text import TEXT_ENCODERS, TextEncoder, WordTokenizer

from .base import Batch, EvalContext, Method, across_ranks

if TYPE_CHECKING:
    from .config import PretrainConfig

__all__ = ["Convirt", "ConvirtModel", "PairedBatches", "build_tokenizer", "run_tokenizer", "encode_pairs",
           "evaluate_convirt", "val_retrieval", "fact_ceiling", "retrieval_table",
           "DEFAULT_WEIGHT", "DEFAULT_TEMPERATURE", "DEFAULT_DIM", "DEFAULT_TEXT_ENCODER"]

#: ConVIRT's lambda, tau and joint-space size (the ConVIRT tutorial).
DEFAULT_WEIGHT, DEFAULT_TEMPERATURE, DEFAULT_DIM = 0.75, 0.1, 512
#: Mean-pooled word embeddings: on glyphlab-text they retrieved as well as the 2-layer
#: transformer after the same number of steps, at about a quarter of the CPU time per step.
DEFAULT_TEXT_ENCODER = "mean"


def build_tokenizer(dataset: DataSplits) -> WordTokenizer:
    """The word tokenizer of ``dataset.train.texts`` (deterministic: the same texts give the
    same vocabulary), so rebuilding it for a baseline or a resumed run gives the same ids."""
    return WordTokenizer.build(dataset.train.texts)


def run_tokenizer(dataset: DataSplits, out: str, resume: bool) -> WordTokenizer:
    """The run's tokenizer (the loop writes it to ``out/tokenizer.json``); on resume, the stored
    one, which must equal the one the training texts give, else the data changed under the run."""
    path = layout.RunFolder(out).tokenizer
    built = build_tokenizer(dataset)
    if resume and os.path.isfile(path):
        stored = WordTokenizer.load(path)
        if stored.to_dict() != built.to_dict():
            raise ValueError(f"{path} differs from the tokenizer of the training texts: the data changed "
                             "since the run started; start over with --force")
        return stored
    return built


def load_run_tokenizer(run_dir: str) -> WordTokenizer:
    """The tokenizer a convirt run saved in ``run_dir``."""
    return WordTokenizer.load(layout.RunFolder(run_dir).tokenizer)


class ConvirtModel(nn.Module):
    """Images -> ``encoder`` -> ``h_v`` -> ``image_head`` -> ``v``; texts -> ``text_encoder`` ->
    ``h_u`` -> ``text_head`` -> ``u``; loss ``bidirectional_info_nce(v, u, tau, weight)``.

    Args:
        encoder: the pipeline's image encoder: a built-in name, or a module with ``out_dim``.
        in_channels: image channels.
        tokenizer: the text tokenizer (its size fixes the embedding table).
        temperature: initial ``tau`` (ConVIRT 0.1); ``learnable_temperature`` trains it.
        weight: ``lambda`` on the image->text direction (ConVIRT 0.75).
        projection_dim: ``d`` of the joint space (ConVIRT 512).
        text_encoder: ``"transformer"`` or ``"mean"`` (see :class:`TextEncoder`).
        text_width: the text encoder's width.
        norm: the image encoder's and heads' normalisation, ``None``/``"batch"`` or ``"group"``
            (:func:`~contrastkit.models.build_encoder`).

    ``encoder`` / ``embed`` are the image side evaluated by the linear probe, like the other
    methods' models.
    """

    def __init__(self, encoder: Union[str, nn.Module], in_channels: int, tokenizer: WordTokenizer, *,
                 temperature: float = DEFAULT_TEMPERATURE, learnable_temperature: bool = False,
                 weight: float = DEFAULT_WEIGHT, projection_dim: int = DEFAULT_DIM,
                 text_encoder: str = DEFAULT_TEXT_ENCODER, text_width: int = 128, norm: Optional[str] = None) -> None:
        super().__init__()
        self.method = "convirt"
        # The method object itself (stateless): the model asks it for its loss, never the registry.
        self.training_method: Method = Convirt()
        self.weight = float(check_probability(weight, "weight"))
        self.tokenizer = tokenizer
        self.encoder = encoder if isinstance(encoder, nn.Module) else build_encoder(encoder, in_channels, norm=norm)
        self.text_encoder = TextEncoder(len(tokenizer), width=text_width, kind=text_encoder,
                                        max_length=tokenizer.max_length)
        self.image_head = ProjectionHead(self.encoder.out_dim, hidden_dim=self.encoder.out_dim,
                                         out_dim=projection_dim, norm=norm)
        self.text_head = ProjectionHead(text_width, hidden_dim=text_width, out_dim=projection_dim, norm=norm)
        self.temperature = losses.Temperature(temperature, learnable=learnable_temperature)
        # Set by the training loop under torchrun: the loss then takes every rank's pairs as
        # negatives (bidirectional_info_nce / sigmoid_loss with distributed=True).
        self.distributed = False

    def embed(self, images: Tensor) -> Tensor:
        """``(N, C, H, W)`` -> ``h`` ``(N, encoder.out_dim)`` (what the probe reads)."""
        return self.encoder(images)

    def image_embeddings(self, images: Tensor) -> Tensor:
        """``(N, C, H, W)`` -> ``v`` ``(N, d)`` (not normalised)."""
        return self.image_head(self.encoder(images))

    def text_embeddings(self, ids: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        """``(N, L)`` token ids (+ mask of real tokens) -> ``u`` ``(N, d)`` (not normalised)."""
        return self.text_head(self.text_encoder(ids, mask))

    def loss(self, images: Tensor, tokens: Tuple[Tensor, Tensor], labels: Optional[Tensor] = None) -> Tensor:
        """Mean ConVIRT loss over the ``N`` pairs of the batch: ``images`` ``(N, C, H, W)`` and
        ``tokens = (ids, mask)`` ``(N, L)``, row ``i`` of each forming pair ``i``; ``labels``
        are ignored. The ``convirt`` method's :meth:`~contrastkit.methods.Method.loss`."""
        return self.training_method.loss(self, (images, tokens), labels)


class PairedBatches:
    """Batches of paired data for the training loop: ``batches(split, indices)`` ->
    ``(images (b, C, H, W), (ids (b, L), mask (b, L)))`` on ``device``.

    Images: when the split has noise realisations, each pair draws one at random (torch's
    global generator, so a checkpointed RNG state reproduces it); otherwise the canonical
    image. A streamed split's images (uint8 scaled to ``[0, 1]``, or float) are those of the
    training batch the loop hands over (:meth:`hold`), else read for the batch; with
    ``--data-on-device`` all of them held on the device (:meth:`hold_split`). Texts are
    tokenised once per split and cached; a stream's (its training batch's captions, handed
    over with its images) are tokenised per batch. A batch's token columns are trimmed to its longest
    text when its indices are on the host (read there, without waiting for the device); indices
    on an accelerator keep the split's width (the padding is masked), so that nothing is read
    back from the device.
    """

    def __init__(self, tokenizer: WordTokenizer, device: torch.device) -> None:
        self.tokenizer = tokenizer
        self.device = device
        self._cache: Dict[int, Tuple[Any, Tensor, Tensor, Tensor]] = {}
        self._images = PairedImages()
        self._texts: Optional[List[str]] = None

    def hold(self, split: DataSplit, batch: Any) -> None:
        """The training ``split``'s streamed batch ``batch`` (a
        :class:`~contrastkit.data.batch_source.StepBatch`: the images the loader decoded and, from
        a stream of pairs, the captions, ``texts``)."""
        self._images.hold(split, batch.indices, batch.images)
        self._texts = getattr(batch, "texts", None)

    def device_images(self, split: DataSplit, workers: int = 0) -> Any:
        """What :meth:`hold_split` would hold for ``split`` (:meth:`PairedImages.device_images
        <contrastkit.data.PairedImages.device_images>`)."""
        return self._images.device_images(split, self.device, workers)

    def hold_split(self, split: DataSplit, images: Tensor) -> None:
        """Read the images of ``split`` from ``images``, all of them held on the device."""
        self._images.hold_split(split, images)

    def _tokens(self, split: DataSplit) -> Tuple[Tensor, Tensor, Tensor]:
        key = id(split)
        if key not in self._cache or self._cache[key][0] is not split:
            ids, mask = self.tokenizer.encode(split.texts)
            self._cache[key] = (split, ids.to(self.device), mask.to(self.device), mask.sum(1))  # lengths on the host
        return self._cache[key][1:]

    def __call__(self, split: DataSplit, indices: Tensor) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
        images = self._images(split, indices, self.device)
        rows = self._images.held_rows(split, indices) if self._texts is not None else None
        if rows is not None:  # a stream's batch: its own captions (encode pads to the longest)
            assert self._texts is not None
            held_ids, held_mask = self.tokenizer.encode([self._texts[row] for row in rows.tolist()])
            return images, (held_ids.to(self.device, non_blocking=True), held_mask.to(self.device, non_blocking=True))
        ids, mask, lengths = self._tokens(split)
        on = indices.to(self.device, non_blocking=True)
        batch_ids, batch_mask = ids[on], mask[on]
        if not validation.reads_are_free(indices):
            return images, (batch_ids, batch_mask)
        width = max(1, int(lengths[indices].max()))  # trim padding columns nobody uses
        return images, (batch_ids[:, :width], batch_mask[:, :width])


@torch.no_grad()
def encode_texts(model: ConvirtModel, texts: List[str], device: torch.device, batch_size: int = 256) -> np.ndarray:
    """``u`` of ``texts`` in eval mode: ``(n, d)`` float64."""
    was_training = model.training
    model.eval()
    try:
        chunks = []
        for i in range(0, len(texts), batch_size):
            ids, mask = model.tokenizer.encode(texts[i:i + batch_size])
            chunks.append(model.text_embeddings(ids.to(device), mask.to(device)).double().cpu())
    finally:
        model.train(was_training)
    return torch.cat(chunks).numpy()


class _ImageSide(nn.Module):
    """``v`` of a model's images as a module (what :func:`~contrastkit.metrics.readout.extract_features`
    reads), in the model's train/eval mode."""

    def __init__(self, model: ConvirtModel) -> None:
        super().__init__()
        self.model = model
        self.training = model.training  # not .train(): the model's own modes stay as they are

    def forward(self, images: Tensor) -> Tensor:
        return self.model.image_embeddings(images)


def encode_images(model: ConvirtModel, images: Any, device: torch.device, batch_size: int = 256, *,
                  workers: int = 0) -> np.ndarray:
    """``v`` of ``images`` in eval mode: ``(n, d)`` float64. ``images`` is a split of any
    storage or an ``(n, C, H, W)`` float tensor in ``[0, 1]`` (read in batches of
    ``batch_size``, decoded in ``workers`` processes; :func:`contrastkit.data.image_batches`)."""
    return extract_features(_ImageSide(model), images, device, batch_size, workers=workers).astype(np.float64)


def encode_pairs(model: ConvirtModel, split: DataSplit, device: torch.device) -> Tuple[np.ndarray, np.ndarray]:
    """``(v, u)``: joint-space embeddings ``(n, d)`` of a split's canonical images (held, or
    streamed in batches) and texts."""
    return encode_images(model, split, device), encode_texts(model, split.texts, device)


def fact_ceiling(facts: List[Dict[str, Any]], ks: Tuple[int, ...] = (1, 5, 10)) -> Dict[str, float]:
    """Recall@K of an ideal model that knows every fact and nothing else: pairs stating the
    same facts are indistinguishable to it, so with ``m`` pairs sharing pair ``i``'s facts the
    partner's expected Recall@K is ``min(1, K / m)`` (the retrieval tie rule). The instance-level
    retrieval numbers of glyphlab-text are bounded by this."""
    keys = [tuple(sorted(f.items())) for f in facts]
    counts: Dict[Any, int] = {}
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    return {f"fact_ceiling_recall@{k}": float(np.mean([min(1.0, k / counts[key]) for key in keys])) for k in ks}


def val_retrieval(model: ConvirtModel, dataset: DataSplits, device: torch.device) -> Dict[str, float]:
    """Image->text and text->image Recall@1 on the val pairs (for model selection / logs)."""
    from contrastkit.metrics.retrieval import retrieval_metrics

    val = retrieval_metrics(*encode_pairs(model, dataset.val, device), ks=(1,))
    return {"val_retrieval_i2t_recall@1": val["i2t_recall@1"], "val_retrieval_t2i_recall@1": val["t2i_recall@1"]}


def evaluate_convirt(model: ConvirtModel, dataset: DataSplits, device: torch.device,
                     ks: Tuple[int, ...] = (1, 5, 10)) -> Dict[str, Any]:
    """Held-out read-outs of a ConVIRT model, flat keys for ``summary.json``.

    * ``retrieval_*``: :func:`contrastkit.metrics.retrieval.retrieval_metrics` on the test
      pairs (``i2t_recall@K``, ``t2i_recall@K``, ``chance_recall@K``, mean ranks, ``pairs``),
      ``fact_ceiling_recall@K`` when the split records its facts (:func:`fact_ceiling`),
      and ``val_retrieval_i2t_recall@1`` / ``val_retrieval_t2i_recall@1``.
    * ``zero_shot_accuracy`` on the test images from ``dataset.class_prompts`` (class
      embedding = mean of its prompts' normalised text embeddings), with
      ``zero_shot_chance`` = 1 / classes, ``zero_shot_majority`` = the most frequent test
      class's share and ``zero_shot_prompt_unknown_fraction`` = share of prompt tokens unseen
      in training (``<unk>``). Absent when the data carry no labels or prompts.
    """
    from contrastkit.metrics.retrieval import class_embeddings, retrieval_metrics, zero_shot_accuracy

    v, u = encode_pairs(model, dataset.test, device)
    out: Dict[str, Any] = {f"retrieval_{k}": value for k, value in retrieval_metrics(v, u, ks).items()}
    if getattr(dataset.test, "facts", None) is not None:
        out.update({f"retrieval_{k}": value for k, value in fact_ceiling(dataset.test.facts, ks).items()})
    out.update(val_retrieval(model, dataset, device))
    prompts = getattr(dataset, "class_prompts", {}) or {}
    if dataset.class_names and all(name in prompts and prompts[name] for name in dataset.class_names):
        texts, classes = [], []
        for c, name in enumerate(dataset.class_names):
            texts += prompts[name]
            classes += [c] * len(prompts[name])
        centres = class_embeddings(encode_texts(model, texts, device), np.asarray(classes), len(dataset.class_names))
        labels = dataset.test.labels.cpu().numpy()
        out["zero_shot_accuracy"] = zero_shot_accuracy(v, centres, labels)
        out["zero_shot_chance"] = 1.0 / len(dataset.class_names)
        out["zero_shot_majority"] = float(np.bincount(labels, minlength=len(dataset.class_names)).max() / len(labels))
        out["zero_shot_prompt_unknown_fraction"] = model.tokenizer.unknown_fraction(texts)
    return out


class Convirt(Method):
    """ConVIRT (Zhang et al. 2020; the ConVIRT tutorial) on image-text pairs, trained as a
    :class:`ConvirtModel`: a batch is images and the token ids of their texts
    (``PairedBatches`` of this module), the loss :func:`~contrastkit.losses.bidirectional_info_nce`
    weighted by ``lambda``, the numbers retrieval and zero-shot classification
    (``evaluate_convirt`` of this module)."""

    name = "convirt"
    paired = True
    cached_gradients = True
    default_temperature = DEFAULT_TEMPERATURE
    default_projection_dim = DEFAULT_DIM
    #: Whether the loss weighs its two directions (ConVIRT's lambda, ``weight``).
    weighted = True

    def complete(self, config: "PretrainConfig") -> None:
        """The image-text options: ``views`` is ``"paired"`` (no augmentation: crops and flips
        would falsify the texts), ``data`` names paired data, ``weight`` (lambda, when the loss
        is :attr:`weighted`) and ``text_encoder`` get their defaults."""
        name = self.name
        if config.views not in ("augment", "paired"):
            raise ValueError(f"{name} pairs each image with its text; views {config.views!r} does not apply")
        config.views = "paired"
        if config.view_strength is not None:
            raise ValueError(f"{name} uses no augmentation (crops and flips would falsify the texts); "
                             "view_strength does not apply")
        check_paired_source(config.data, name)
        if not self.weighted:
            if config.weight is not None:
                raise ValueError(f"weight (convirt's lambda) does not apply to {name}: its loss is symmetric")
        else:
            config.weight = DEFAULT_WEIGHT if config.weight is None else config.weight
            if isinstance(config.weight, bool) or not isinstance(config.weight, (int, float)) \
                    or not (0.0 <= float(config.weight) <= 1.0):
                raise ValueError(f"weight (lambda) must be a number in [0, 1], got {config.weight!r}")
            config.weight = float(config.weight)
        config.text_encoder = DEFAULT_TEXT_ENCODER if config.text_encoder is None else config.text_encoder
        if config.text_encoder not in TEXT_ENCODERS:
            raise ValueError(f"text_encoder must be one of {TEXT_ENCODERS}, got {config.text_encoder!r}")

    def run_tokenizer(self, dataset: DataSplits, out: str, resume: bool) -> Any:
        return run_tokenizer(dataset, out, resume)

    def saved_tokenizer(self, run_dir: str) -> Any:
        return load_run_tokenizer(run_dir)

    def save_run_files(self, model: nn.Module, folder: layout.RunFolder) -> None:
        model.tokenizer.save(folder.tokenizer)

    def batches(self, dataset: DataSplits, config: "PretrainConfig", device: torch.device,
                tokenizer: Any = None, *, transform: Optional[Callable[[Tensor], Any]] = None
                ) -> Callable[[Any, Tensor], Batch]:
        if transform is not None:
            raise ValueError(f"{self.name} trains on (image, text) pairs, one image each; a transform makes two "
                             "views of each image (the two-view methods: simclr, moco, supcon, ...)")
        return PairedBatches(tokenizer, device)

    def build_model(self, config: "PretrainConfig", in_channels: int, tokenizer: Any = None, *,
                    encoder: Optional[nn.Module] = None) -> nn.Module:
        if tokenizer is None:
            raise ValueError("convirt needs the run's text tokenizer to build its model")
        return ConvirtModel(config.encoder if encoder is None else encoder, in_channels, tokenizer,
                            temperature=config.temperature, learnable_temperature=config.learnable_temperature,
                            weight=config.weight, projection_dim=config.projection_dim,
                            text_encoder=config.text_encoder, norm=config.norm)

    def embed(self, model: nn.Module, batch: Batch) -> Tuple[Tensor, ...]:
        images, (ids, mask) = batch
        return model.image_embeddings(images), model.text_embeddings(ids, mask)

    def objective(self, model: nn.Module, embeddings: Tuple[Tensor, ...], labels: Optional[Tensor]) -> Tensor:
        # labels are ignored: pairs, not classes, define the positives.
        v, u = embeddings
        return losses.bidirectional_info_nce(v, u, temperature=model.temperature, weight=model.weight,
                                             **across_ranks(model))

    def batch_problem(self, model: nn.Module, embeddings: Tuple[Tensor, ...]) -> Optional[BatchProblem]:
        """The image-to-text direction: each image against every text of the batch, its own text
        the positive (the diagonal). For SigLIP, whose loss takes every pair as its own binary
        decision, the softmax view of the same similarities."""
        v, u = embeddings
        dtype = torch.float32 if v.device.type == "mps" else torch.float64
        v = torch.nn.functional.normalize(v.to(dtype), dim=1)
        u = torch.nn.functional.normalize(u.to(dtype), dim=1)
        n, device = v.shape[0], v.device
        items = torch.arange(n, device=device)
        return BatchProblem.computed(lambda index: v[index] @ u.T, (n, n), items, False, items,
                                     torch.full((n,), IMAGE, device=device), items, torch.full((n,), TEXT, device=device),
                                     "each image against every text of the batch")

    def val_metrics(self, run: EvalContext) -> Dict[str, Any]:
        return val_retrieval(run.model, run.dataset, run.device)

    def readout(self, model: nn.Module, dataset: DataSplits, device: torch.device) -> Dict[str, Any]:
        return evaluate_convirt(model, dataset, device)


def retrieval_table(summary: Dict[str, Any]) -> Any:
    """A rich table of a convirt summary's retrieval and zero-shot numbers."""
    from rich.table import Table

    ks = sorted(int(key.split("@")[1]) for key in summary if key.startswith("retrieval_i2t_recall@"))
    table = Table(title=f"held-out retrieval ({summary.get('retrieval_pairs')} test pairs)")
    for column in ["read-out"] + [f"R@{k}" for k in ks]:
        table.add_column(column, justify="left" if column == "read-out" else "right")
    rows = [("image -> text", "retrieval_i2t_recall@"), ("text -> image", "retrieval_t2i_recall@"),
            ("chance", "retrieval_chance_recall@"), ("fact ceiling", "retrieval_fact_ceiling_recall@")]
    for name, prefix in rows:
        if f"{prefix}{ks[0]}" in summary:
            table.add_row(name, *(f"{summary[f'{prefix}{k}']:.3f}" for k in ks))
    if "zero_shot_accuracy" in summary:
        table.caption = (f"zero-shot accuracy {summary['zero_shot_accuracy']:.3f} "
                         f"(chance {summary['zero_shot_chance']:.3f}, majority {summary['zero_shot_majority']:.3f})")
    return table

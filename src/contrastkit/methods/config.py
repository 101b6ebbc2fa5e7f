"""The resolved configuration of a pretraining run (what ``OUT/config.json`` holds).

A record with field checks: it knows no method by name. What depends on the method (its default
temperature and schedule, whether it reads image-text pairs, its own options) is asked of the
method registered under ``method`` (:meth:`~contrastkit.methods.base.Method.complete`)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from contrastkit.data.base import check_positive_int
from contrastkit.layout import check_cache_setting

from .registry import METHOD_REGISTRY, get_method

if TYPE_CHECKING:
    from contrastkit.temperature import TemperatureSchedule

__all__ = ["PretrainConfig", "OPTIMIZERS", "LOGGER_NAMES", "RESUME_MAY_CHANGE", "check_positive_int",
           "check_positive_float"]

OPTIMIZERS = ("adamw", "sgd")
DEFAULT_LR = {"adamw": 2e-3, "sgd": 0.1}
DEFAULT_WEIGHT_DECAY = {"adamw": 1e-4, "sgd": 5e-4}
#: The loggers a run may write beyond metrics.jsonl (``contrastkit.train.loggers`` writes them).
LOGGER_NAMES = ("csv", "tensorboard")
TENSORBOARD_MISSING = ("--logger tensorboard needs the tensorboard package: pip install 'contrastkit[tensorboard]' "
                       "(or pip install tensorboard)")

# Keys a resumed run may change without invalidating the checkpoint. Changing ``epochs``
# stretches the cosine schedule from the resumed step on.
# ``threads`` and ``device`` may change too, at the price of bit-exactness (reduction order).
# ``workers`` only decode images (no randomness), so any number resumes exactly.
# ``baseline_cache`` only says where baselines are kept (their numbers are the same).
RESUME_MAY_CHANGE = frozenset({"epochs", "device", "threads", "out", "log_every", "eval_every", "loggers",
                               "workers", "baseline_cache"})


def check_positive_float(value: Any, name: str, *, allow_zero: bool = False) -> float:
    """``value`` as a finite float ``> 0`` (``>= 0`` with ``allow_zero``); a ``TypeError`` /
    ``ValueError`` naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'} and finite, got {value}")
    return value


def _resolve_loggers(loggers: Any) -> List[str]:
    """``loggers`` as a list of known names (a comma-separated string is split); ``tensorboard``
    needs its package (refused before a run does any work)."""
    import importlib.util

    if isinstance(loggers, str):
        loggers = [part.strip() for part in loggers.split(",") if part.strip()]
    if not isinstance(loggers, (list, tuple)) or not all(isinstance(name, str) for name in loggers):
        raise TypeError(f"loggers must be a list of logger names, got {loggers!r}")
    for name in loggers:
        if name not in LOGGER_NAMES:
            raise ValueError(f"unknown logger {name!r}; choose from {', '.join(LOGGER_NAMES)}")
    if "tensorboard" in loggers and importlib.util.find_spec("tensorboard") is None:
        raise ValueError(TENSORBOARD_MISSING)
    return list(dict.fromkeys(loggers))


def _resolve_schedule(c: "PretrainConfig") -> "TemperatureSchedule":
    """Parse ``temperature_schedule`` (the one place a run's schedule is parsed), check it
    against :data:`~contrastkit.losses.MIN_TEMPERATURE`, make ``learnable`` and
    ``learnable_temperature`` agree, and return the schedule the trainer follows."""
    from contrastkit.losses import MIN_TEMPERATURE
    from contrastkit.temperature import LearnableSchedule, parse_schedule

    schedule = parse_schedule(c.temperature_schedule, c.temperature).bind(epochs=c.epochs)
    if schedule.adaptive:
        # A temperature method computes its own temperatures inside the method's loss.
        if not get_method(c.method).temperature_methods:
            takers = ", ".join(name for name, m in METHOD_REGISTRY.items() if m.temperature_methods)
            raise ValueError(f"the temperature method {schedule.kind!r} applies to the methods whose loss is "
                             f"NT-Xent on two views ({takers}), not {c.method!r}")
        if c.learnable_temperature:
            raise ValueError(f"the temperature method {schedule.kind!r} sets its own temperatures: drop "
                             "learnable_temperature")
    learnable = schedule.kind == "learnable" or bool(c.learnable_temperature)
    if learnable and schedule.kind not in ("constant", "learnable"):
        raise ValueError(f"a learnable temperature cannot follow the schedule {c.temperature_schedule!r}")
    if learnable and schedule.lowest < MIN_TEMPERATURE:
        raise ValueError(f"a learnable temperature must start at >= {MIN_TEMPERATURE}, got {schedule.lowest}")
    if schedule.lowest < MIN_TEMPERATURE:
        # The model's Temperature caps 1 / tau at 1 / MIN_TEMPERATURE; a lower tau is refused.
        raise ValueError(f"temperature schedule {c.temperature_schedule!r} goes down to {schedule.lowest}, "
                         f"below the supported minimum {MIN_TEMPERATURE}")
    c.learnable_temperature = learnable
    if learnable:
        c.temperature_schedule = "learnable"
        if schedule.kind != "learnable":
            schedule = LearnableSchedule(schedule.lowest)
    elif schedule.kind == "constant":
        c.temperature_schedule = "constant"
    # ``temperature`` is the tau the model starts with (a schedule's first value).
    c.temperature = schedule.initial if schedule.kind == "learnable" else schedule.value(0, 1)
    return schedule


@dataclass
class PretrainConfig:
    """Everything that determines a pretraining run. ``None`` fields get method/optimizer
    defaults in :meth:`resolved`; the resolved config is what gets saved and compared."""

    data: str = "glyphlab"
    data_options: Dict[str, Any] = field(default_factory=dict)
    # Stratified, seeded subsets of the loaded splits (None: the whole split);
    # contrastkit.data.stratified_subset with ``subset_seed``, the same for every training seed.
    train_limit: Optional[int] = None
    val_limit: Optional[int] = None
    test_limit: Optional[int] = None
    subset_seed: int = 0
    # An unlabeled image collection (contrastkit.data.collection): read a class tree as one,
    # what a damaged file does ("skip" / "fail"; None: skip for collections), and a labelled
    # data set the trained encoder is judged on by the probe and kNN.
    unlabeled: bool = False
    bad_files: Optional[str] = None
    eval_data: Optional[str] = None
    method: str = "simclr"
    encoder: str = "small"          # a built-in name, "package.module:factory" or "object:..." (models.encoders)
    encoder_options: Dict[str, Any] = field(default_factory=dict)  # the factory's keyword arguments
    views: str = "augment"
    view_strength: Optional[float] = None  # make_views strength; None: its per-mode default
    temperature: Optional[float] = None
    learnable_temperature: bool = False
    # contrastkit.temperature.parse_schedule form; None: "constant", for siglip "learnable"
    # (SigLIP trains its scale; "constant" fixes it).
    temperature_schedule: Optional[str] = None
    epochs: int = 60
    batch_size: int = 60             # divides glyphlab's 120 training scenes (the last partial batch is dropped)
    optimizer: str = "adamw"
    lr: Optional[float] = None
    weight_decay: Optional[float] = None
    warmup_fraction: float = 0.05
    momentum: float = 0.99          # MoCo key-encoder momentum
    queue_size: Optional[int] = None  # MoCo queue length (a multiple of batch_size)
    projection_dim: Optional[int] = None  # None: 64, convirt 512
    weight: Optional[float] = None        # convirt's lambda on image->text (None: 0.75)
    text_encoder: Optional[str] = None    # convirt's text encoder (None: mean)
    micro_batch: Optional[int] = None     # cached-gradient accumulation in micro-batches of this many (None: off)
    norm: Optional[str] = None            # the built-in networks' normalisation: None (BatchNorm) or "group"
    seed: int = 0
    device: str = "auto"
    threads: int = 0                # CPU threads; 0: the cores this process may use (setup.resolve_threads)
    workers: int = 0                # DataLoader worker processes decoding streamed images (0: in this process)
    baseline_cache: str = "auto"    # where the read-out's baselines are kept: "auto" (train.baselines), "off", a folder
    log_every: int = 10             # steps between step records / progress updates
    eval_every: int = 0             # epochs between val read-outs that pick the reported epoch (0: never)
    knn_k: int = 20
    knn_temperature: float = 0.07
    out: str = os.path.join("runs", "pretrain")
    loggers: List[str] = field(default_factory=list)  # beyond metrics.jsonl: "csv", "tensorboard"

    def resolved(self) -> "PretrainConfig":
        """A validated copy with every default filled in (queue size needs the data: see
        :meth:`with_queue`)."""
        c = PretrainConfig(**asdict(self))
        method = get_method(c.method)
        if c.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {c.optimizer!r}")
        _check_encoder_spec(c)
        method.complete(c)
        if c.view_strength is not None:
            c.view_strength = check_positive_float(c.view_strength, "view_strength", allow_zero=True)
        if not isinstance(c.data, str) or not c.data:
            raise ValueError(f"data must be 'glyphlab', 'digits' or a path, got {c.data!r}")
        if c.data not in ("glyphlab", "digits") and os.path.exists(c.data):
            c.data = os.path.abspath(c.data)  # so `contrastkit probe` works from any folder
        if not isinstance(c.data_options, dict):
            raise TypeError(f"data_options must be a dict, got {type(c.data_options).__name__}")
        if not isinstance(c.unlabeled, bool):
            raise ValueError(f"unlabeled must be true or false, got {c.unlabeled!r}")
        if c.bad_files is not None and c.bad_files not in ("skip", "fail"):
            raise ValueError(f"bad_files must be 'skip' or 'fail', got {c.bad_files!r}")
        if c.eval_data is not None:
            if not isinstance(c.eval_data, str) or not c.eval_data:
                raise ValueError(f"eval_data must be a labelled data set's name or path, got {c.eval_data!r}")
            if os.path.exists(c.eval_data):
                c.eval_data = os.path.abspath(c.eval_data)
        if method.needs_labels and c.unlabeled:
            raise ValueError(f"{c.method} needs class labels; an unlabeled collection has none")
        for name in ("train_limit", "val_limit", "test_limit"):
            if getattr(c, name) is not None:
                check_positive_int(getattr(c, name), name, 2 if name == "train_limit" else 1)
        check_positive_int(c.subset_seed, "subset_seed", 0)
        c.temperature = check_positive_float(
            method.default_temperature if c.temperature is None else c.temperature, "temperature")
        if c.temperature_schedule is None:
            c.temperature_schedule = method.default_schedule
        check_positive_int(c.epochs, "epochs")
        c._schedule = _resolve_schedule(c)
        check_positive_int(c.batch_size, "batch_size", 2)
        c.lr = check_positive_float(DEFAULT_LR[c.optimizer] if c.lr is None else c.lr, "lr")
        c.weight_decay = check_positive_float(
            DEFAULT_WEIGHT_DECAY[c.optimizer] if c.weight_decay is None else c.weight_decay,
            "weight_decay", allow_zero=True)
        c.warmup_fraction = check_positive_float(c.warmup_fraction, "warmup_fraction", allow_zero=True)
        if c.warmup_fraction >= 1:
            raise ValueError(f"warmup_fraction must be < 1, got {c.warmup_fraction}")
        c.momentum = check_positive_float(c.momentum, "momentum", allow_zero=True)
        if c.momentum >= 1:
            raise ValueError(f"momentum must be in [0, 1), got {c.momentum}")
        if c.queue_size is not None:
            check_positive_int(c.queue_size, "queue_size")
        c.projection_dim = check_positive_int(method.default_projection_dim if c.projection_dim is None
                                              else c.projection_dim, "projection_dim")
        if isinstance(c.seed, bool) or not isinstance(c.seed, int) or c.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {c.seed!r}")
        check_positive_int(c.threads, "threads", 0)
        check_positive_int(c.workers, "workers", 0)
        c.baseline_cache = check_cache_setting(c.baseline_cache)
        check_positive_int(c.log_every, "log_every")
        check_positive_int(c.eval_every, "eval_every", 0)
        check_positive_int(c.knn_k, "knn_k")
        c.knn_temperature = check_positive_float(c.knn_temperature, "knn_temperature")
        _resolve_accumulation(c)
        c.loggers = _resolve_loggers(c.loggers)
        return c

    @property
    def schedule(self) -> "TemperatureSchedule":
        """The temperature schedule, parsed once by :meth:`resolved` and kept by
        :meth:`with_queue`: what the trainer follows."""
        schedule = self.__dict__.get("_schedule")
        if schedule is None:
            raise ValueError("the temperature schedule is parsed by PretrainConfig.resolved(): resolve the "
                             "configuration first")
        return schedule

    @property
    def paired(self) -> bool:
        """Whether the run trains on image-text pairs (its method's :attr:`~contrastkit.methods.base.Method.paired`)."""
        return get_method(self.method).paired

    def with_queue(self, batch_size: int, train_size: int) -> "PretrainConfig":
        """Fill in the MoCo queue size (a multiple of the effective batch size), and keep the
        training set's size for a temperature method's per-sample state.

        Default: up to 16 batches, but fewer than the training set holds, so that the queue
        does not mostly hold older keys of the very images in the batch.
        """
        c = PretrainConfig(**asdict(self))
        if "_schedule" in self.__dict__:
            c._schedule = self._schedule
        # The size a temperature method's per-sample state needs (not saved: a run rebuilt
        # without its data takes it from the checkpoint).
        c._train_size = int(train_size)
        if c.method != "moco":
            c.queue_size = None
            return c
        if c.queue_size is None:
            c.queue_size = batch_size * max(1, min(16, train_size // batch_size - 1))
        elif c.queue_size % batch_size:
            raise ValueError(f"queue_size ({c.queue_size}) must be a multiple of the batch size ({batch_size})")
        return c

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "PretrainConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown configuration keys {unknown}")
        return cls(**data)


def _check_encoder_spec(c: PretrainConfig) -> None:
    """``encoder`` is a built-in name or a factory path (whether the factory exists is checked
    when the model is built); ``encoder_options`` a dict of JSON values (saved in config.json)."""
    from contrastkit.models import ENCODERS

    if not isinstance(c.encoder, str) or not (c.encoder in ENCODERS or ":" in c.encoder):
        raise ValueError(f"encoder must be one of {tuple(ENCODERS)} or 'package.module:factory', got {c.encoder!r}")
    if not isinstance(c.encoder_options, dict):
        raise TypeError(f"encoder_options must be a dict, got {type(c.encoder_options).__name__}")
    try:
        json.dumps(c.encoder_options)
    except (TypeError, ValueError) as err:
        raise ValueError(f"encoder_options must hold JSON values (they are saved with the run): {err}") from None


def _resolve_accumulation(c: PretrainConfig) -> None:
    """``micro_batch`` (it divides this process's share of the batch; the method must take it)
    and ``norm`` (``"batch"`` is stored as ``None``, what runs before the option wrote)."""
    from contrastkit.models import NORMS

    if c.norm is not None and c.norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {c.norm!r}")
    if c.norm == "batch":
        c.norm = None
    if c.micro_batch is None:
        return
    from .accumulation import check_micro_batch

    get_method(c.method).require_cached_gradients()
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)  # torchrun: the check is per process
    share = c.batch_size // world if world > 1 and c.batch_size % world == 0 else c.batch_size
    where = f"this process's share of the batch under torchrun ({share} of {c.batch_size})" if share != c.batch_size \
        else f"the batch size ({c.batch_size})"
    check_micro_batch(c.micro_batch, share, batch=where)

"""The resolved configuration of a pretraining run (what ``OUT/config.json`` holds).

A record with field checks: it knows no method by name. What depends on the method (its default
temperature and schedule, whether it reads image-text pairs, its own options) is asked of the
method registered under ``method`` (:meth:`~contrastkit.methods.base.Method.complete`)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from contrastkit.data.base import check_positive_int
from contrastkit.data.sources import is_data_name
from contrastkit.layout import check_cache_setting

from .registry import METHOD_REGISTRY, get_method

if TYPE_CHECKING:
    from contrastkit.temperature import TemperatureSchedule

__all__ = ["PretrainConfig", "DataChoices", "resolve_for_data", "OPTIMIZERS", "LOGGER_NAMES", "RESUME_MAY_CHANGE",
           "OPTION_GROUPS", "option_facts",
           "LIGHTNING_APPLIES", "PRECISIONS", "DATA_ON_DEVICE", "ON_NAN", "SELECT_BY", "ABSENT_FROM_OLD_RECORDS",
           "check_positive_int",
           "check_positive_float", "default_batch_size", "SMALLEST_DEFAULT_BATCH", "LARGEST_DEFAULT_BATCH",
           "IMAGES_PER_BATCH_ROW"]

OPTIMIZERS = ("adamw", "sgd")
#: The training step's arithmetic: float32, or autocast to bfloat16 / float16 (float16 with a
#: gradient scaler); :mod:`contrastkit.methods.precision`.
PRECISIONS = ("32", "bf16", "fp16")
#: Whether the training images are held whole on the training device (``auto``: when they fit;
#: :mod:`contrastkit.data.on_device`).
DATA_ON_DEVICE = ("auto", "on", "off")
DEFAULT_LR = {"adamw": 2e-3, "sgd": 0.1}
DEFAULT_WEIGHT_DECAY = {"adamw": 1e-4, "sgd": 5e-4}
#: The loggers a run may write beyond metrics.jsonl (``contrastkit.train.loggers`` writes them).
LOGGER_NAMES = ("csv", "tensorboard")
TENSORBOARD_MISSING = ("--logger tensorboard needs the tensorboard package: pip install 'contrastkit[tensorboard]' "
                       "(or pip install tensorboard)")

#: What a non-finite training loss does: stop the run, or skip that step's update (``on_nan``).
ON_NAN = ("stop", "skip")
#: What may pick the reported epoch among the ``eval_every`` epochs (``select_by``), the val
#: linear probe refitted at each of them or a number the online read-out measured at that epoch's
#: end (``contrastkit.train.selection`` says each rule).
SELECT_BY = ("val_probe", "online_probe", "online_knn", "online_view_retrieval")
#: What a configuration recorded before a field existed meant by leaving it out, where that is
#: not the field's default (a run recorded before the online read-out had none).
ABSENT_FROM_OLD_RECORDS: Dict[str, Any] = {"online_probe": False}


# The batch a run takes when none is given grows with the training set (default_batch_size).
#: The floor: divides GlyphLab's 120 training scenes (two steps an epoch), and digits' 1,078
#: training images keep it too.
SMALLEST_DEFAULT_BATCH = 60
#: The ceiling: SimCLR's smallest recipe batch (Chen et al. 2020), 510 negatives an anchor.
LARGEST_DEFAULT_BATCH = 256
#: Between the two, one pair for every this many training images (an epoch keeps >= 32 steps).
IMAGES_PER_BATCH_ROW = 32


def default_batch_size(train_size: int, *, world_size: int = 1) -> Tuple[int, str]:
    """The batch (source images a step) of a run on ``train_size`` training images when none is
    given, and why, in words: ``train_size / 32`` rounded down to a multiple of 8, at least
    ``SMALLEST_DEFAULT_BATCH`` (60) and at most ``LARGEST_DEFAULT_BATCH`` (256), never more
    than the training set; under ``world_size`` processes a multiple of it.

    Small sets keep 60 (GlyphLab's 120 scenes, digits' 1,078 images); from about 2,000 images
    the batch grows, so that each anchor meets more negatives and a step costs less per image,
    while an epoch keeps at least 32 optimizer steps; from 8,192 images it is 256, SimCLR's
    batch (a 60,000-image set trains 234 steps an epoch)."""
    n = check_positive_int(train_size, "train_size")
    world = check_positive_int(world_size, "world_size")
    grown = 8 * (n // (8 * IMAGES_PER_BATCH_ROW))
    batch = min(LARGEST_DEFAULT_BATCH, max(SMALLEST_DEFAULT_BATCH, grown))
    if batch == LARGEST_DEFAULT_BATCH:
        why = f"{n:,} training images: the largest default batch, SimCLR's {LARGEST_DEFAULT_BATCH}"
    elif batch == SMALLEST_DEFAULT_BATCH:
        why = (f"{n:,} training images: the smallest default batch, which sets of fewer than "
               f"{8 * IMAGES_PER_BATCH_ROW * (SMALLEST_DEFAULT_BATCH // 8 + 1):,} images keep")
    else:
        why = (f"{n:,} training images: one pair per {IMAGES_PER_BATCH_ROW} images, rounded down to a multiple of "
               f"8, between {SMALLEST_DEFAULT_BATCH} and {LARGEST_DEFAULT_BATCH}")
    if batch > n:
        batch, why = n, f"{n:,} training images: the whole training set, fewer than {batch}"
    if world > 1 and batch % world:
        batch = max(world, batch - batch % world)
        why += f", rounded down to a multiple of the {world} processes"
    return batch, why


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
    """Parse ``temperature_method`` or else ``temperature_schedule`` (the one place a run's
    temperature is parsed), check it
    against :data:`~contrastkit.losses.MIN_TEMPERATURE`, make ``learnable`` and
    ``learnable_temperature`` agree, and return the schedule the trainer follows."""
    from contrastkit.losses import MIN_TEMPERATURE
    from contrastkit.temperature import ConstantSchedule, LearnableSchedule, parse_schedule
    from contrastkit.temperature_methods import parse_temperature_method

    if c.temperature_method is not None:
        # A temperature method computes its own temperatures inside the method's loss.
        method = parse_temperature_method(c.temperature_method)
        if not get_method(c.method).temperature_methods:
            takers = ", ".join(name for name, m in METHOD_REGISTRY.items() if m.temperature_methods)
            raise ValueError(f"the temperature method {method.kind!r} applies to the methods whose loss is "
                             f"NT-Xent on two views ({takers}), not {c.method!r}")
        if c.learnable_temperature:
            raise ValueError(f"the temperature method {method.kind!r} sets its own temperatures: drop "
                             "learnable_temperature")
        if c.temperature_schedule not in (None, "constant"):
            raise ValueError(f"the temperature method {method.kind!r} sets its own temperatures: drop "
                             f"temperature_schedule {c.temperature_schedule!r}")
        if method.lowest < MIN_TEMPERATURE:
            raise ValueError(f"temperature method {c.temperature_method!r} goes down to {method.lowest}, "
                             f"below the supported minimum {MIN_TEMPERATURE}")
        c.temperature_method = c.temperature_method.strip()
        c.temperature_schedule = None  # no schedule of one tau
        c.temperature = method.initial  # the tau a run reports before its first step
        return ConstantSchedule(method.initial)  # nothing sets the model's tau during the run
    if c.temperature_schedule is None:
        c.temperature_schedule = get_method(c.method).default_schedule
    schedule = parse_schedule(c.temperature_schedule, c.temperature).bind(epochs=c.epochs)
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


#: The groups of a run's options, in the order ``contrastkit pretrain --help`` and
#: docs/pretrain.md show them (each field's ``metadata["group"]``).
OPTION_GROUPS = {
    "data": "what the run reads: the data set, its subsets, its views",
    "model": "the method, the networks and what the method adds to them",
    "optimization": "the optimizer and its schedule, the batch, the seed",
    "temperature": "the temperature: its value, schedule or method",
    "run": "where and how the run computes, logs, checkpoints and evaluates (the trainer's part)",
}


def _option(default: Any = MISSING, *, group: str, resume: bool = False, lightning: bool = False,
            default_factory: Any = MISSING) -> Any:
    """A :class:`PretrainConfig` field with its facts as metadata: its ``group``
    (:data:`OPTION_GROUPS`), whether a resumed run may change it (``resume``: the checkpoint
    stays valid) and whether :class:`~contrastkit.integrations.lightning.ContrastiveModule`
    applies it (``lightning``; the others are the trainer's or the data module's to decide)."""
    metadata = {"group": group, "resume": resume, "lightning": lightning}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class DataChoices:
    """What the data decided of a run, beside its configuration (made by
    :func:`resolve_for_data`, the one place it is decided): the training split's size, the
    batch size (source images a step, the global batch; given, or chosen for the data), why it
    was chosen (``batch_reason``; ``None`` when ``batch_size`` was given) and the length of the
    method's queue of earlier keys (``queue_size``; ``None`` for a method without one)."""

    train_size: int
    batch_size: int
    batch_reason: Optional[str] = None
    queue_size: Optional[int] = None

    @property
    def step_batch(self) -> int:
        """The global batch a step takes, ``batch_size`` or the whole training split when that
        is smaller (a given batch larger than the split takes all of it)."""
        return min(self.batch_size, self.train_size)

    def record(self) -> Dict[str, Any]:
        """``config.json``'s ``derived.defaults``: ``{"train_size": n, "batch_size": {"value": b,
        "reason": ...}}``, or ``{}`` when every such option was given."""
        if self.batch_reason is None:
            return {}
        return {"train_size": self.train_size, "batch_size": {"value": self.batch_size, "reason": self.batch_reason}}

    def describe(self) -> Optional[str]:
        """One line saying what the data chose and why (``None`` when nothing was chosen): what
        a run prints at its start."""
        if self.batch_reason is None:
            return None
        return f"batch size {self.batch_size}, chosen for {self.batch_reason}; --batch-size sets it"


@dataclass
class PretrainConfig:
    """Everything that determines a pretraining run. ``None`` fields get method/optimizer
    defaults in :meth:`resolved`; the resolved config is what gets saved and compared. Each
    field's group, and whether ``--resume`` may change it, are its metadata (``option_facts()``)."""

    # ------------------------------------------------------------------ data
    data: str = _option("glyphlab", group="data")
    data_options: Dict[str, Any] = _option(group="data", default_factory=dict)
    # Stratified, seeded subsets of the loaded splits (None: the whole split);
    # contrastkit.data.stratified_subset with ``subset_seed``, the same for every training seed.
    train_limit: Optional[int] = _option(None, group="data")
    val_limit: Optional[int] = _option(None, group="data")
    test_limit: Optional[int] = _option(None, group="data")
    subset_seed: int = _option(0, group="data")
    # An unlabeled image collection (contrastkit.data.collection): read a class tree as one,
    # what a damaged file does ("skip" / "fail"; None: skip for collections), and a labelled
    # data set the trained encoder is judged on by the probe and kNN (for labelled tar shards:
    # the held-out shards val and test come from).
    unlabeled: bool = _option(False, group="data")
    bad_files: Optional[str] = _option(None, group="data")
    eval_data: Optional[str] = _option(None, group="data")
    views: str = _option("augment", group="data", lightning=True)
    view_strength: Optional[float] = _option(None, group="data", lightning=True)  # make_views strength; None: the mode's
    # ------------------------------------------------------------------ model
    method: str = _option("simclr", group="model", lightning=True)
    # a built-in name, "timm:NAME", "torchvision:NAME", "package.module:factory" or "object:..." (models.encoders)
    encoder: str = _option("small", group="model", lightning=True)
    encoder_options: Dict[str, Any] = _option(group="model", lightning=True, default_factory=dict)  # its keywords
    # A local weights file the encoder starts from (models.weights; None: its initialisation).
    encoder_weights: Optional[str] = _option(None, group="model")
    norm: Optional[str] = _option(None, group="model", lightning=True)  # built-in networks: None (BatchNorm), "group"
    projection_dim: Optional[int] = _option(None, group="model", lightning=True)  # None: 64, convirt 512
    momentum: float = _option(0.99, group="model", lightning=True)  # MoCo key-encoder momentum
    queue_size: Optional[int] = _option(None, group="model", lightning=True)  # MoCo queue (a multiple of batch_size)
    weight: Optional[float] = _option(None, group="model")  # convirt's lambda on image->text (None: 0.75)
    text_encoder: Optional[str] = _option(None, group="model")  # convirt's text encoder (None: mean)
    # ------------------------------------------------------------------ optimization
    # Changing ``epochs`` on resume stretches the cosine schedule from the resumed step on.
    epochs: int = _option(60, group="optimization", resume=True)
    # Source images a step (the global batch under torchrun; the last partial batch is dropped).
    # None: chosen from the training set's size (default_batch_size) by resolve_for_data.
    batch_size: Optional[int] = _option(None, group="optimization")
    optimizer: str = _option("adamw", group="optimization", lightning=True)
    lr: Optional[float] = _option(None, group="optimization", lightning=True)
    weight_decay: Optional[float] = _option(None, group="optimization", lightning=True)
    warmup_fraction: float = _option(0.05, group="optimization", lightning=True)
    micro_batch: Optional[int] = _option(None, group="optimization")  # cached-gradient accumulation (None: off)
    seed: int = _option(0, group="optimization", lightning=True)
    # ------------------------------------------------------------------ temperature
    temperature: Optional[float] = _option(None, group="temperature", lightning=True)
    learnable_temperature: bool = _option(False, group="temperature", lightning=True)
    # contrastkit.temperature.parse_schedule form; None: "constant", for siglip "learnable"
    # (SigLIP trains its scale; "constant" fixes it). None with a temperature method.
    temperature_schedule: Optional[str] = _option(None, group="temperature", lightning=True)
    # A temperature method, NAME[:VALUES] (contrastkit.temperature_methods): the loss decides its
    # own temperatures (simclr); None: the schedule's tau.
    temperature_method: Optional[str] = _option(None, group="temperature", lightning=True)
    # ------------------------------------------------------------------ run
    # What may change on resume: ``threads``, ``device`` and ``compile`` at the price of
    # bit-exactness (other kernels, another reduction order; with the same setting a resumed run
    # is exact); ``workers`` only decode images (no randomness); ``baseline_cache`` only says
    # where baselines are kept; ``checkpoint_every`` when the state is saved; ``on_nan`` what a
    # non-finite loss does (resuming a run that stopped on one with "skip" is how to go past
    # it); ``channels_last`` and ``data_on_device`` how the same numbers are laid out (a change
    # may round differently, as ``device`` does). ``precision`` changes the arithmetic and the
    # checkpoint's state (the gradient scaler's), so it must stay.
    device: str = _option("auto", group="run", resume=True)
    threads: int = _option(0, group="run", resume=True)  # CPU threads; 0: the cores this process may use
    workers: int = _option(0, group="run", resume=True)  # DataLoader worker processes (0: in this process)
    # torch.compile the encoder for the training steps (inductor; the read-out runs it eagerly).
    # Speed only: the losses equal the eager run's within float rounding, not bit for bit.
    compile: bool = _option(False, group="run", resume=True)
    precision: str = _option("32", group="run")  # "32", "bf16" or "fp16" (autocast; methods.precision)
    channels_last: bool = _option(False, group="run", resume=True)  # the channels-last memory format
    data_on_device: str = _option("auto", group="run", resume=True)  # training images on the device: auto, on, off
    baseline_cache: str = _option("auto", group="run", resume=True)  # the read-out's baselines: auto, off, a folder
    log_every: int = _option(10, group="run", resume=True)  # steps between step records / progress updates
    eval_every: int = _option(0, group="run", resume=True)  # epochs between val read-outs picking the epoch (0: never)
    checkpoint_every: int = _option(0, group="run", resume=True)  # steps between checkpoints in an epoch (0: ends)
    on_nan: str = _option("stop", group="run", resume=True)  # a non-finite loss: "stop" the run, or "skip" the update
    select_by: str = _option("val_probe", group="run")  # the score that picks the epoch (SELECT_BY)
    # The online read-out (contrastkit.train.online), logged every epoch: the online linear probe
    # and kNN monitor on labelled data, the view retrieval of held-out images without labels;
    # the encoder trains the same with or without it, so a resumed run may turn it on or off
    # (turned on, its head starts at the resumed step).
    online_probe: bool = _option(True, group="run", resume=True)
    knn_k: int = _option(20, group="run")
    knn_temperature: float = _option(0.07, group="run")
    out: str = _option(os.path.join("runs", "pretrain"), group="run", resume=True)
    loggers: List[str] = _option(group="run", resume=True, default_factory=list)  # beyond metrics.jsonl: csv, tensorboard

    def resolved(self) -> "PretrainConfig":
        """A validated copy with every default filled in but those that need the data: the
        batch size and the queue size (:func:`resolve_for_data`)."""
        c = PretrainConfig(**asdict(self))
        method = get_method(c.method)
        if c.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {c.optimizer!r}")
        _check_encoder_spec(c)
        method.complete(c)
        if c.view_strength is not None:
            c.view_strength = check_positive_float(c.view_strength, "view_strength", allow_zero=True)
        if not isinstance(c.data, str) or not c.data:
            raise ValueError(f"data must be a data set's name or a path, got {c.data!r}")
        if not is_data_name(c.data) and os.path.exists(c.data):
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
        check_positive_int(c.epochs, "epochs")
        _resolve_schedule(c)  # checks the schedule and writes its resolved form into the fields
        if c.batch_size is not None:
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
        if not isinstance(c.compile, bool):
            raise ValueError(f"compile must be true or false, got {c.compile!r}")
        _resolve_device_options(c)
        c.baseline_cache = check_cache_setting(c.baseline_cache)
        check_positive_int(c.log_every, "log_every")
        check_positive_int(c.eval_every, "eval_every", 0)
        check_positive_int(c.checkpoint_every, "checkpoint_every", 0)
        if c.on_nan not in ON_NAN:
            raise ValueError(f"on_nan must be one of {ON_NAN}, got {c.on_nan!r}")
        if not isinstance(c.online_probe, bool):
            raise ValueError(f"online_probe must be true or false, got {c.online_probe!r}")
        if c.select_by not in SELECT_BY:
            raise ValueError(f"select_by must be one of {', '.join(SELECT_BY)}, got {c.select_by!r}")
        if c.select_by != "val_probe" and not c.eval_every:
            raise ValueError(f"select_by {c.select_by} picks among the eval_every epochs: give eval_every "
                             "(--eval-every N), or leave select_by at val_probe")
        if c.select_by.startswith("online_") and not c.online_probe:
            raise ValueError(f"select_by {c.select_by} reads the online read-out, which online_probe false "
                             "(--no-online-probe) turns off")
        check_positive_int(c.knn_k, "knn_k")
        c.knn_temperature = check_positive_float(c.knn_temperature, "knn_temperature")
        _resolve_accumulation(c)
        c.loggers = _resolve_loggers(c.loggers)
        return c

    @property
    def schedule(self) -> "TemperatureSchedule":
        """The temperature schedule the trainer follows, a function of the resolved fields
        (``temperature_method``, ``temperature_schedule``, ``temperature``, ``epochs``), so that a
        copy made any way (``dataclasses.replace``, :meth:`from_dict` of :meth:`to_dict`) has it too."""
        if self.temperature is None or (self.temperature_schedule is None and self.temperature_method is None):
            raise ValueError("the temperature schedule is a resolved configuration's: call "
                             "PretrainConfig.resolved() first")
        return _schedule_of(self.temperature_method, self.temperature_schedule, float(self.temperature),
                            int(self.epochs))

    @property
    def paired(self) -> bool:
        """Whether the run trains on image-text pairs (its method's :attr:`~contrastkit.methods.base.Method.paired`)."""
        return get_method(self.method).paired

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "PretrainConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown configuration keys {unknown}")
        return cls(**data)

    @classmethod
    def from_record(cls, data: Dict[str, Any]) -> "PretrainConfig":
        """The configuration a run recorded (its config.json or checkpoint): :meth:`from_dict`,
        with a field the record predates at what its absence meant then
        (``contrastkit.methods.config.ABSENT_FROM_OLD_RECORDS``), else at its default."""
        return cls.from_dict({**ABSENT_FROM_OLD_RECORDS, **data})


def resolve_for_data(config: PretrainConfig, train_size: int, *,
                     world_size: int = 1) -> Tuple[PretrainConfig, DataChoices]:
    """What the data decide of a run, decided in this one place: for a resolved ``config``
    (:meth:`PretrainConfig.resolved`) and a training split of ``train_size`` images read by
    ``world_size`` processes, the :class:`DataChoices` record and the configuration fitted to it
    (a copy with its ``batch_size`` and ``queue_size``, what ``config.json`` records).

    The batch size is the given one, else :func:`default_batch_size`'s (and ``micro_batch``
    is then checked against it); a step takes at most the whole split
    (:attr:`DataChoices.step_batch`), which must hold at least 2 images and, under
    ``world_size`` processes, be a multiple of it. The queue's length is the method's
    (:meth:`~contrastkit.methods.base.Method.queue_size`: MoCo's default and checks) for that
    step batch. ``pretrain``, the Lightning module and the Lightning data module call it."""
    train_size, world = int(train_size), check_positive_int(world_size, "world_size")
    reason: Optional[str] = None
    if config.batch_size is not None:
        batch_size = int(config.batch_size)
    else:
        batch_size, reason = default_batch_size(train_size, world_size=world)
    fitted = replace(config, batch_size=batch_size)
    if reason is not None:
        _check_micro_batch(fitted, f"chosen for {reason}; --batch-size sets it", world)
    step_batch = min(batch_size, train_size)
    # checked before the queue, which divides by the step batch
    if step_batch < 2:
        raise ValueError(f"the training split of {config.data} has {train_size} image(s); at least 2 are needed")
    if world > 1 and step_batch % world:
        raise ValueError(f"the batch size {step_batch} must be a multiple of the number of processes ({world})")
    queue_size = get_method(config.method).queue_size(config.queue_size, step_batch, train_size)
    choices = DataChoices(train_size, batch_size, reason, queue_size)
    return replace(fitted, queue_size=queue_size), choices


def _check_encoder_spec(c: PretrainConfig) -> None:
    """``encoder`` is a built-in name, a timm or torchvision model or a factory path (whether it
    exists is checked when the model is built); ``encoder_options`` a dict of JSON values (saved
    in config.json); ``encoder_weights`` a path, made absolute (read when the model is built)."""
    from contrastkit.models import ENCODERS, EXTERNAL_PREFIXES

    if not isinstance(c.encoder, str) or not (c.encoder in ENCODERS or ":" in c.encoder):
        raise ValueError(f"encoder must be one of {tuple(ENCODERS)}, timm:NAME, torchvision:NAME or "
                         f"'package.module:factory', got {c.encoder!r}")
    if c.encoder in EXTERNAL_PREFIXES:
        raise ValueError(f"encoder {c.encoder!r} needs a model name, e.g. {c.encoder}resnet18")
    if c.encoder_weights is not None:
        if not isinstance(c.encoder_weights, str) or not c.encoder_weights:
            raise ValueError(f"encoder_weights must be the path of a weights file, got {c.encoder_weights!r}")
        c.encoder_weights = os.path.abspath(c.encoder_weights)  # so `contrastkit probe` finds it from any folder
    if not isinstance(c.encoder_options, dict):
        raise TypeError(f"encoder_options must be a dict, got {type(c.encoder_options).__name__}")
    try:
        json.dumps(c.encoder_options)
    except (TypeError, ValueError) as err:
        raise ValueError(f"encoder_options must hold JSON values (they are saved with the run): {err}") from None


def _resolve_device_options(c: PretrainConfig) -> None:
    """``precision`` one of :data:`PRECISIONS` (a config file's number 32 is read as ``"32"``),
    ``channels_last`` a bool, ``data_on_device`` one of :data:`DATA_ON_DEVICE`. Whether the
    device supports the precision is checked when the run has its device
    (:func:`contrastkit.methods.precision.check_precision`)."""
    if c.precision == 32 and not isinstance(c.precision, bool):
        c.precision = "32"
    if c.precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {c.precision!r}")
    if not isinstance(c.channels_last, bool):
        raise ValueError(f"channels_last must be true or false, got {c.channels_last!r}")
    if c.data_on_device not in DATA_ON_DEVICE:
        raise ValueError(f"data_on_device must be one of {', '.join(DATA_ON_DEVICE)}, got {c.data_on_device!r}")


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
    get_method(c.method).require_cached_gradients()
    if c.batch_size is None:  # checked once the data have sized the batch (resolve_for_data)
        check_positive_int(c.micro_batch, "micro_batch")
        return
    _check_micro_batch(c, "", int(os.environ.get("WORLD_SIZE", "1") or 1))  # torchrun: the check is per process


def _check_micro_batch(c: PretrainConfig, chosen: str, world: int) -> None:
    """``micro_batch`` divides this process's share of the batch (``chosen``: why the batch is
    what it is, when the data chose it)."""
    if c.micro_batch is None:
        return
    from .accumulation import check_micro_batch

    share = c.batch_size // world if world > 1 and c.batch_size % world == 0 else c.batch_size
    where = f"this process's share of the batch under torchrun ({share} of {c.batch_size})" if share != c.batch_size \
        else f"the batch size ({c.batch_size})"
    check_micro_batch(c.micro_batch, share, batch=f"{where}, {chosen}" if chosen else where)


def _schedule_of(temperature_method: Optional[str], temperature_schedule: Optional[str], temperature: float,
                 epochs: int) -> "TemperatureSchedule":
    """The schedule of resolved fields (what :func:`_resolve_schedule` checked and wrote): a
    temperature method's constant start, else the schedule's form bound to the run's epochs."""
    from contrastkit.temperature import ConstantSchedule, parse_schedule
    from contrastkit.temperature_methods import parse_temperature_method

    if temperature_method is not None:
        return ConstantSchedule(parse_temperature_method(temperature_method).initial)
    return parse_schedule(temperature_schedule, temperature).bind(epochs=epochs)


def option_facts() -> Dict[str, Dict[str, Any]]:
    """Each :class:`PretrainConfig` field's facts, in field order: ``{"group", "resume",
    "lightning"}`` (:func:`_option`)."""
    return {f.name: dict(f.metadata) for f in fields(PretrainConfig)}


#: The fields a resumed run may change without invalidating its checkpoint (their metadata).
RESUME_MAY_CHANGE = frozenset(name for name, facts in option_facts().items() if facts["resume"])
#: The fields :class:`~contrastkit.integrations.lightning.ContrastiveModule` applies (their
#: metadata); the trainer and the data module decide the others.
LIGHTNING_APPLIES = tuple(name for name, facts in option_facts().items() if facts["lightning"])

"""A run folder read back: its configuration and a checkpoint (``contrastkit probe``, ``embed``
and ``pretrain --resume`` read runs through it; ``config.json`` itself is read by
:func:`contrastkit.layout.read_run_record`)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from typing import Any, Dict, Optional, Tuple

import torch
from torch import nn

from contrastkit import layout
from contrastkit.manifest import file_sha256
from contrastkit.methods import PretrainConfig, build_model, get_method, load_data

from .checkpoint import load_checkpoint

__all__ = ["read_run_config", "SavedRun", "load_run", "tell_index_note"]


def tell_index_note(dataset: Any) -> None:
    """Say on stderr, in one line, what a changed unlabeled collection's listing became
    (``dataset.index_note``: re-indexed, or the recorded files kept), if anything."""
    note = getattr(dataset, "index_note", None)
    if note:
        print(note, file=sys.stderr, flush=True)


def read_run_config(run_dir: str, record: Optional[Dict[str, Any]] = None) -> PretrainConfig:
    """The configuration recorded in ``run_dir/config.json`` (``record``: that file as
    :func:`contrastkit.layout.read_run_record` returned it, not read again); a file that holds
    no valid configuration is a ``ValueError`` naming it."""
    path = layout.RunFolder(run_dir).config
    try:
        stored = layout.read_run_record(run_dir) if record is None else record
        return PretrainConfig.from_record(_with_temperature_method(stored["config"]))
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path} is not a valid run configuration: {err}") from None


def _with_temperature_method(config: Dict[str, Any]) -> Dict[str, Any]:
    """A configuration that contrastkit recorded before temperature methods had their own field
    held the method in ``temperature_schedule`` (``"macl"``): read it as ``temperature_method``."""
    from contrastkit.temperature_methods import temperature_method_of

    if isinstance(config, dict) and "temperature_method" not in config \
            and temperature_method_of(config.get("temperature_schedule")) is not None:
        return {**config, "temperature_method": config["temperature_schedule"], "temperature_schedule": None}
    return config


@dataclass
class SavedRun:
    """A run folder read back: its configuration, a checkpoint's state and where they came from
    (:func:`load_run`)."""

    folder: str
    config: PretrainConfig
    state: Dict[str, Any]
    checkpoint: str
    config_path: str
    image_shape: Optional[Tuple[int, ...]] = None  # (C, H, W) of the training images, if recorded
    # The SHA-256 of the encoder weights file the run started from, as the run read it (if any).
    encoder_weights_sha256: Optional[str] = None
    data_source: Optional[str] = None  # the data's kind (``source``), if recorded

    def load_data(self, data: Optional[str] = None, data_options: Optional[Dict[str, Any]] = None, *,
                  collection_changed: str = "stop") -> Any:
        """The run's own data set (its loader and options, as it trained), or ``data`` (with
        ``data_options``) read by the run's method. An unlabeled collection the run recorded
        (``collection-index.npz``) is read from its record while it is unchanged;
        ``collection_changed`` says what one that changed does (``"stop"``, ``"reindex"``,
        ``"keep"``: :func:`contrastkit.data.collection.open_collection`). The record is never
        written here (the run that holds the folder does: ``pretrain``, ``--resume``)."""
        config = self.config if data is None else replace(self.config, data=data,
                                                          data_options=dict(data_options or {}))
        dataset = load_data(config, index=layout.RunFolder(self.folder).collection_index,
                            collection_changed=collection_changed)
        tell_index_note(dataset)
        return dataset

    def build_model(self, image_shape: Any, device: torch.device, encoder: Optional[nn.Module] = None) -> nn.Module:
        """The run's model for images of ``image_shape`` ``(C, H, W)`` with the checkpoint's
        weights, on ``device``; ``encoder``: the architecture of a run given its encoder as a
        module (see :func:`~contrastkit.train.evaluate_run`). A weights file the run started from is not read
        (the checkpoint holds the weights)."""
        tokenizer = get_method(self.config.method).saved_tokenizer(self.folder)
        model = build_model(self.config, image_shape, tokenizer, encoder=encoder, initial_weights=False)
        try:
            model.load_state_dict(self.state["model"])
        except RuntimeError as err:
            hint = ("; the run's encoder was given as a module: pass the same architecture again (encoder=...)"
                    if ":" in self.config.encoder and encoder is None else "")
            raise ValueError(f"checkpoint {self.checkpoint} does not match the model (encoder "
                             f"{self.config.encoder!r}) in {self.config_path}: {str(err).splitlines()[0]}{hint}") from None
        return model.to(device)

    def build_untrained(self, image_shape: Any, encoder: Optional[nn.Module] = None) -> nn.Module:
        """The run's model at its initialisation (the random-init baseline's network); for a run
        that started from a weights file (``encoder_weights``), from that file, which must still
        be there and unchanged."""
        self._check_weights_file()
        tokenizer = get_method(self.config.method).saved_tokenizer(self.folder)
        return build_model(self.config, image_shape, tokenizer, encoder=encoder)

    def _check_weights_file(self) -> None:
        path = self.config.encoder_weights
        if path is None or self.encoder_weights_sha256 is None:
            return
        remedy = "restore it, or leave out the baselines (--no-baselines)"
        if not os.path.isfile(path):
            raise FileNotFoundError(f"the run in {self.folder} started from the encoder weights {path}, which are "
                                    f"gone; the baseline at those weights needs them: {remedy}")
        if file_sha256(path) != self.encoder_weights_sha256:
            raise ValueError(f"the run in {self.folder} started from the encoder weights {path}, which changed since "
                             f"(SHA-256 differs); the baseline at those weights needs the file as it was: {remedy}")


def load_run(run_dir: str, *, checkpoint: Optional[str] = None) -> SavedRun:
    """Read the run folder ``run_dir`` (``config.json`` and ``checkpoint``, by default
    ``checkpoints/last.pt``); a folder that is not a run, or a checkpoint of another run, is
    refused naming the file."""
    if not os.path.isdir(run_dir):
        raise FileNotFoundError(f"run folder {run_dir} does not exist")
    config_path = layout.RunFolder(run_dir).config
    config = read_run_config(run_dir)
    stored = layout.read_run_record(run_dir)
    path = checkpoint or layout.RunFolder(run_dir).last_checkpoint
    state = load_checkpoint(path)
    # Compared as configurations, so that a field added since the run was written (at its default) matches.
    try:
        same = PretrainConfig.from_record(_with_temperature_method(state["config"])).to_dict() == config.to_dict()
    except (TypeError, ValueError):
        same = False
    if not same:
        raise ValueError(f"checkpoint {path} does not belong to the run in {run_dir} (configurations differ)")
    derived = stored.get("derived") or {}
    shape = derived.get("dataset", {}).get("image_shape")
    weights = derived.get("encoder_weights") or {}
    source = derived.get("dataset", {}).get("source")
    return SavedRun(run_dir, config, state, path, config_path, tuple(shape) if isinstance(shape, list) else None,
                    weights.get("sha256") if isinstance(weights, dict) else None,
                    source if isinstance(source, str) else None)

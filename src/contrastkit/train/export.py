"""A run's encoder for deployment (``contrastkit export RUN --format F --out FILE``).

Formats (:data:`contrastkit.layout.MODEL_FORMATS`):

* ``safetensors``: the encoder's state dict under the keys of the module as it was built (a
  timm model's, a torchvision model's, a factory's), so that ``load_state_dict`` of the same
  architecture reads it, and so does ``--encoder-weights`` of another run; with the projection
  head, the keys are ``encoder.*`` and ``head.*``. Needs the safetensors package.
* ``onnx``: the encoder as an ONNX graph (input ``images`` ``(batch, C, H, W)``, output ``h``
  ``(batch, D)``, and ``z`` with the head; the batch size is free), written by torch's
  TorchScript-based exporter (``dynamo=False``, which needs no onnxscript), opset 17 by default.
* ``torchscript``: ``torch.jit.trace`` of the encoder (same inputs and outputs), for
  ``torch.jit.load`` without contrastkit. torch deprecates TorchScript in favour of
  ``torch.export``; its deprecation warnings are not repeated here.

Every export is read back and compared with the PyTorch encoder on a batch of 3 random images
(another batch size than the one traced): the ONNX file through onnxruntime when it is
installed (``pip install 'contrastkit[onnx]'``), the TorchScript file through ``torch.jit.load``,
the safetensors file loaded into a copy of the architecture whose tensors were zeroed first. An
export that disagrees by more than ``1e-4 * (1 + |value|)`` anywhere is not kept.

Next to the file, ``FILE.contrastkit.json`` holds its input contract: how an image file
becomes the model's input as the run's data made it (:meth:`contrastkit.data.ImagePreprocessing.contract`
of :func:`contrastkit.data.preprocessing_of`: the resize and crop rule, the interpolation, the
colour and channel order, the pixel scale, float32 in ``[0, 1]``, and the normalisation, none),
channels, height and width, the run's data kind, data and options, the encoder's spec and options (to
rebuild its architecture), the outputs' sizes and the check. Files are guarded as every export's
(:mod:`contrastkit.train.export_files`): nothing a user wrote is replaced.
"""

from __future__ import annotations

import copy
import inspect
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import torch
from torch import Tensor, nn

from contrastkit import layout
from contrastkit.data import preprocessing_of
from contrastkit.extras import import_extra
from contrastkit.models import PooledEncoder, unwrap_encoder

from .export_files import check_targets, finish_export, mark_export, projection_head, remove_earlier_export
from .runs import load_run
from .setup import limit_threads

__all__ = ["ModelExport", "export_model", "DEFAULT_OPSET", "TOLERANCE"]

#: The ONNX opset written by default (onnxruntime has run it for years).
DEFAULT_OPSET = 17
#: The largest disagreement an export may have with the PyTorch encoder: ``|a - b| <= TOLERANCE * (1 + |b|)``.
TOLERANCE = 1e-4
_CHECK_BATCH = 3
_TRACE_BATCH = 2


@dataclass
class ModelExport:
    """What :func:`export_model` wrote: ``files`` by role (``model``, ``marker``: the input
    contract), the ``format``, the images' ``input_shape`` ``(C, H, W)``, the widths of ``h``
    and ``z`` (``None`` without the head), and the check: the largest absolute difference
    between the export read back and the PyTorch encoder (``max_abs_diff``) and what read it
    back (``checked_with``; both ``None`` when nothing could: an ONNX file without onnxruntime)."""

    files: Dict[str, str]
    format: str
    input_shape: Tuple[int, int, int]
    h_dim: int
    z_dim: Optional[int]
    max_abs_diff: Optional[float]
    checked_with: Optional[str]


class _EncoderAndHead(nn.Module):
    """``images`` -> ``(h, z)``: the encoder, then the projection head on its output."""

    def __init__(self, encoder: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.encoder, self.head = encoder, head

    def forward(self, images: Tensor) -> Tuple[Tensor, Tensor]:
        h = self.encoder(images)
        return h, self.head(h)


def export_model(run_dir: str, out: str, *, format: Optional[str] = None, projection: bool = False,
                 checkpoint: Optional[str] = None, force: bool = False, opset: int = DEFAULT_OPSET,
                 threads: Optional[int] = None) -> ModelExport:
    """Write the encoder of the run in ``run_dir`` (and, with ``projection``, its projection
    head) to ``out`` in ``format`` with its input contract (see the module's description).

    Args:
        run_dir: a ``contrastkit pretrain`` output folder.
        out: the file to write; without a suffix it gets the format's (``.safetensors``,
            ``.onnx``, ``.pt``).
        format: ``safetensors``, ``onnx`` or ``torchscript``; ``None``: the one ``out``'s
            suffix names.
        projection: also export the projection head (a second output, ``z``).
        checkpoint: another checkpoint of the run (default ``checkpoints/last.pt``).
        force: replace the files of an earlier export (only files its marker lists).
        opset: the ONNX opset.
        threads: CPU threads (default: the run's setting).

    Raises:
        FileNotFoundError: ``run_dir`` is not a run, or the folder of ``out`` does not exist.
        FileExistsError: an output file exists (without ``force``, or not written by an export).
        ValueError: a bad option, an export that disagrees with the encoder, or a missing
            optional package (:class:`~contrastkit.extras.MissingExtraError` names its extra).
    """
    fmt = layout.model_format(out) if format is None else format
    files = layout.model_export_files(out, fmt)
    if fmt == "onnx" and (isinstance(opset, bool) or not isinstance(opset, int) or opset < 7):
        raise ValueError(f"opset must be an ONNX opset number >= 7, got {opset!r}")
    check_targets(files, force, "contrastkit export")
    saved = load_run(run_dir, checkpoint=checkpoint)
    with limit_threads(saved.config.threads if threads is None else threads):
        dataset = None if saved.image_shape and saved.data_source else saved.load_data()  # older runs record neither
        shape = tuple(int(s) for s in (saved.image_shape or dataset.image_shape))
        source = saved.data_source or str(getattr(dataset, "source", "") or dataset.name)
        model = saved.build_model(shape, torch.device("cpu")).eval()
        head = projection_head(model) if projection else None
        module = (_EncoderAndHead(model.encoder, head) if head is not None else model.encoder).eval()
        check = torch.rand((_CHECK_BATCH, *shape), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            expected = _outputs(module(check))
        work = tempfile.mkdtemp(prefix=".export-", dir=os.path.dirname(os.path.abspath(files["model"])))
        try:
            written = os.path.join(work, "model")
            writer = {"safetensors": _write_safetensors, "onnx": _write_onnx, "torchscript": _write_torchscript}[fmt]
            got, checked_with = writer(module, head, written, shape, check, opset)
            diff, close = _difference(got, expected) if got is not None else (None, True)
            if not close:
                raise ValueError(f"the {fmt} export of {run_dir} read back with {checked_with} disagrees with the "
                                 f"PyTorch encoder by up to {diff:.3g} (more than {TOLERANCE:g} * (1 + |value|)); "
                                 "not written")
            os.chmod(written, 0o666 & ~_umask())  # as a file the user wrote (some writers make it private)
            remove_earlier_export(files)
            marked = mark_export(files)
            os.replace(written, files["model"])
        finally:
            shutil.rmtree(work, ignore_errors=True)
    h_dim = int(expected[0].shape[1])
    z_dim = int(expected[1].shape[1]) if head is not None else None
    finish_export(files, marked, {
        "written_by": "contrastkit export", "format": fmt, "run": os.path.abspath(run_dir),
        "checkpoint": os.path.abspath(saved.checkpoint), "epoch": int(saved.state.get("epoch", 0)),
        "encoder": saved.config.encoder, "encoder_options": saved.config.encoder_options,
        "input": _input_contract(shape, source, saved.config.data, saved.config.data_options),
        "outputs": _output_contract(h_dim, z_dim, model.encoder, fmt),
        "check": {"max_abs_diff": diff, "tolerance": TOLERANCE, "read_back_with": checked_with,
                  "batch": _CHECK_BATCH} if checked_with is not None else None,
    })
    return ModelExport(files, fmt, shape, h_dim, z_dim, diff, checked_with)  # type: ignore[arg-type]


def _outputs(value: Any) -> Tuple[Tensor, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _difference(got: Tuple[Any, ...], expected: Tuple[Tensor, ...]) -> Tuple[float, bool]:
    """The largest ``|got - expected|`` over the outputs, and whether every element is within
    ``TOLERANCE * (1 + |expected|)``; outputs of another number or shape are infinitely far."""
    if len(got) != len(expected):
        return float("inf"), False
    worst, close = 0.0, True
    for a, b in zip(got, expected):
        a = torch.as_tensor(a, dtype=torch.float32)
        if tuple(a.shape) != tuple(b.shape):
            return float("inf"), False
        error = (a - b).abs()
        worst = max(worst, float(error.max()) if error.numel() else 0.0)
        close = close and bool((error <= TOLERANCE * (1 + b.abs())).all())
    return worst, close


def _input_contract(shape: Tuple[int, ...], source: str, data: str, data_options: Dict[str, Any]) -> Dict[str, Any]:
    """The model's input, and how an image file becomes it: the preprocessing the run's data
    applied (:func:`contrastkit.data.preprocessing_of`, its one definition), so that code
    without contrastkit feeds the model what ``contrastkit embed`` feeds the encoder."""
    channels, height, width = shape
    preprocessing = preprocessing_of(shape, source)
    stated = preprocessing.contract() if preprocessing is not None else {
        "layout": "NCHW", "height": height, "width": width, "dtype": "float32", "range": [0.0, 1.0],
        "mean": [0.0] * channels, "std": [1.0] * channels,
        "normalisation": "none (what the encoder trained on): mean 0 and std 1 per channel"}
    return {"name": "images", "shape": ["batch", channels, height, width], "channels": channels, **stated,
            "data_source": source,
            "data": data if not os.path.isabs(data) else os.path.basename(data), "data_options": data_options}


def _output_contract(h_dim: int, z_dim: Optional[int], encoder: nn.Module, fmt: str) -> Dict[str, Any]:
    pooled = isinstance(encoder, PooledEncoder)
    h = {"name": "h", "shape": ["batch", h_dim],
         "what": "the representation (the encoder's output, what the linear probe reads)"}
    if pooled:
        h["pooling"] = ("the encoder outputs (N, D, ...), averaged over the trailing dimensions"
                        + ("; the safetensors file holds the encoder before that pooling" if fmt == "safetensors"
                           else ""))
    outputs = {"h": h}
    if z_dim is not None:
        outputs["z"] = {"name": "z", "shape": ["batch", z_dim],
                        "what": "the projection head's output (not normalised), what the loss compared"}
    return outputs


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# -- the formats: each writes ``path`` and returns the outputs of the file read back on ``check``
# (``None`` when nothing here can read it) and what read it ------------------------------------

Written = Tuple[Optional[Tuple[Tensor, ...]], Optional[str]]


def _write_safetensors(module: nn.Module, head: Optional[nn.Module], path: str, shape: Tuple[int, ...],
                       check: Tensor, opset: int) -> Written:
    """The state dict (see the module's description), read back into a copy of ``module`` whose
    every tensor was zeroed first: the file alone must give the outputs."""
    library = import_extra("safetensors.torch", "safetensors", "--format safetensors", "safetensors")
    parts = {"encoder.": module.encoder, "head.": module.head} if head is not None else {"": module}
    state = {f"{prefix}{key}": value for prefix, part in parts.items()
             for key, value in unwrap_encoder(part).state_dict().items()}
    # contiguous copies: safetensors refuses views and tensors that share storage (tied weights)
    library.save_file({key: value.detach().to("cpu").contiguous().clone() for key, value in state.items()}, path,
                      metadata={"written_by": "contrastkit export",
                                "keys": "encoder.*, head.*" if head is not None else "the encoder's own"})
    back = library.load_file(path)
    restored = copy.deepcopy(module)
    with torch.no_grad():
        for tensor in restored.state_dict().values():
            tensor.zero_()
        restored_parts = {"encoder.": restored.encoder, "head.": restored.head} if head is not None else {"": restored}
        for prefix, part in restored_parts.items():
            unwrap_encoder(part).load_state_dict({key[len(prefix):]: value for key, value in back.items()
                                                  if key.startswith(prefix)}, strict=True)
        return _outputs(restored.eval()(check)), "safetensors (loaded into the architecture)"


def _write_onnx(module: nn.Module, head: Optional[nn.Module], path: str, shape: Tuple[int, ...],
                check: Tensor, opset: int) -> Written:
    import_extra("onnx", "onnx", "--format onnx")
    outputs = ["h", "z"] if head is not None else ["h"]
    options: Dict[str, Any] = {}
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        options["dynamo"] = False  # the TorchScript-based exporter: no onnxscript needed
    example = torch.rand((_TRACE_BATCH, *shape), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation and tracer notes
        try:
            torch.onnx.export(module, (example,), path, input_names=["images"], output_names=outputs,
                              dynamic_axes={name: {0: "batch"} for name in ["images", *outputs]},
                              opset_version=opset, **options)
        except Exception as err:  # the exporter's errors name an operator the opset lacks, and so on
            raise ValueError(f"the encoder cannot be exported to ONNX (opset {opset}): {_line(err)}") from None
    try:
        runtime = import_extra("onnxruntime", "onnx", "checking the ONNX export")
    except ImportError:
        return None, None
    session = runtime.InferenceSession(path, providers=["CPUExecutionProvider"])
    got = session.run(outputs, {"images": check.numpy()})
    return tuple(torch.from_numpy(values) for values in got), f"onnxruntime {runtime.__version__}"


def _write_torchscript(module: nn.Module, head: Optional[nn.Module], path: str, shape: Tuple[int, ...],
                       check: Tensor, opset: int) -> Written:
    example = torch.rand((_TRACE_BATCH, *shape), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's TorchScript deprecation notes
        with torch.no_grad():
            try:
                traced = torch.jit.trace(module, example)
            except Exception as err:  # the tracer's errors name the Python construct it cannot follow
                raise ValueError(f"the encoder cannot be traced to TorchScript: {_line(err)}") from None
        traced.save(path)
        loaded = torch.jit.load(path, map_location="cpu")
        with torch.no_grad():
            return _outputs(loaded(check)), f"torch.jit.load (torch {torch.__version__})"


def _line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__

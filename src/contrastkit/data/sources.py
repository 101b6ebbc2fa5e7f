"""Data sources: what a ``--data`` string names, and how it is opened.

A :class:`DataSource` is a name, a ``detect(data) -> bool`` and an ``open(request)`` that
returns a data set (:class:`~contrastkit.data.DataSplits`, or an iterable data set,
:mod:`contrastkit.data.iterable`). :func:`~contrastkit.data.open_data` resolves a ``--data``
once (:func:`find_data_source`): it asks each registered source's ``detect``, in the order of
registration, and opens the first that says yes. A path's format is looked at once per
resolution, however many sources ask (:func:`path_format`).

The built-in sources, in their order: ``glyphlab`` and ``digits`` (names, which win over a
folder of the same name: write ``./digits`` for one), the labelled path formats ``npz``,
``cifar10``, ``mnist``, ``tar-shards`` (a folder of ``.tar`` shards, read as a stream:
:mod:`contrastkit.data.shards`) and ``imagefolder`` (class subfolders of images; streamed with
``workers > 0`` or ``stream=true``), ``collection`` (unlabeled images: a folder without class
structure, or a ``.txt`` / ``.csv`` list of image paths), and, for the image-text methods,
``glyphlab-text``, ``digits-text``, ``pair-csv`` and ``tar-shard-pairs`` (tar shards whose
samples have ``.txt`` captions, read as a stream).

A new storage kind is one file: a module that calls :func:`register_data_source`::

    from contrastkit.data import DataSource, register_data_source

    register_data_source(DataSource(
        "shards", detect=lambda data: data.startswith("shards:"),
        open=lambda request: open_my_shards(request.data[len("shards:"):], **request.options),
        description="shards:PATTERN, tar shards of images"))

The command line finds such a module through the entry-point group
:data:`ENTRY_POINT_GROUP` (``contrastkit.data_sources``) of the installed packages, as pytest
finds its plug-ins: in the package's ``pyproject.toml``::

    [project.entry-points."contrastkit.data_sources"]
    shards = "my_package.shards:SOURCE"

where the object named is a :class:`DataSource` (registered when first needed), a list of
them, or a module that registers its own on import. Plug-ins come after the built-ins, so a
plug-in never changes what an existing ``--data`` means.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

from .base import call_with_options

__all__ = ["DataSource", "DataRequest", "ENTRY_POINT_GROUP", "register_data_source", "unregister_data_source",
           "data_sources", "find_data_source", "open_source", "path_format", "check_paired_source", "is_data_name"]

#: The entry-point group through which installed packages add data sources.
ENTRY_POINT_GROUP = "contrastkit.data_sources"


@dataclass(frozen=True)
class DataRequest:
    """What a source's ``open`` is asked for: the ``--data`` string ``data``, the run's ``seed``
    (for generated data; real data ignore it), ``workers`` (``DataLoader`` processes the run
    will use), ``stream`` (the data option ``stream``: ``True``, ``False`` or ``None``, not
    given), ``bad_files`` (``"skip"``, ``"fail"`` or ``None``, not given), ``eval_data`` (the
    run's ``--eval-data``: held-out data for a source that can take its val and test from them,
    tar shards; the others leave it to the read-out), ``index`` (a file where a source that
    lists its files finds its listing recorded, a run's ``collection-index.npz``, and
    ``collection_changed``, what a collection that changed since does: see
    :func:`~contrastkit.data.collection.open_collection`; the other sources ignore both) and the
    other data options ``options`` (``--data-option KEY=VALUE``), which a source checks itself
    (an unknown one is a ``TypeError`` naming the accepted ones:
    :func:`~contrastkit.data.call_with_options`)."""

    data: str
    seed: int = 0
    workers: int = 0
    stream: Optional[bool] = None
    bad_files: Optional[str] = None
    options: Dict[str, Any] = field(default_factory=dict)
    eval_data: Optional[str] = None
    index: Optional[str] = None
    collection_changed: str = "stop"


@dataclass(frozen=True)
class DataSource:
    """One kind of data ``--data`` can name.

    Attributes:
        name: the source's name (unique), e.g. ``"imagefolder"``.
        detect: ``detect(data) -> bool``: whether the ``--data`` string is this source's. It
            must not open more than it needs to decide (a path's format:
            ``contrastkit.data.sources.path_format``)
            and must return ``False``, not raise, for data that are not its own.
        open: ``open(request: DataRequest)`` -> the data set: a
            :class:`~contrastkit.data.DataSplits` (splits read by sample index) or an iterable
            data set (:class:`~contrastkit.data.IterableDataSplits`).
        description: one line for users: what ``--data`` names this source.
        pairs: whether it gives image-text pairs (read by the image-text methods) rather than
            images.
        streams: whether it honours the data option ``stream=true`` (else that is an error).
        skips_bad_files: whether ``bad_files="skip"`` applies (its damaged files are dropped
            and named, :func:`~contrastkit.data.skipped_files`; else that is an error).
    """

    name: str
    detect: Callable[[str], bool]
    open: Callable[[DataRequest], Any]
    description: str = ""
    pairs: bool = False
    streams: bool = False
    skips_bad_files: bool = False


_SOURCES: Dict[str, DataSource] = {}
_plugins_loaded = False


def register_data_source(source: DataSource) -> DataSource:
    """Add ``source`` after those registered before it. A name registered twice (by another
    source) is a ``ValueError``: one source owns each name. Returns ``source``."""
    if not isinstance(source, DataSource):
        raise TypeError(f"register_data_source takes a contrastkit.data.DataSource, got {type(source).__name__}")
    if not isinstance(source.name, str) or not source.name:
        raise ValueError(f"a data source needs a non-empty string name, got {source.name!r}")
    if not callable(source.detect) or not callable(source.open):
        raise TypeError(f"data source {source.name!r}: detect and open must be callables")
    known = _SOURCES.get(source.name)
    if known is not None and known != source:
        raise ValueError(f"data source {source.name!r} is already registered ({known.description or known.name})")
    _SOURCES[source.name] = source
    return source


def unregister_data_source(name: str) -> None:
    """Remove the source ``name`` (one a test or a plug-in registered for a while)."""
    _SOURCES.pop(name, None)


def data_sources() -> Tuple[DataSource, ...]:
    """Every registered source, in the order ``--data`` asks them: the built-ins, then those of
    installed packages (the entry-point group ``contrastkit.data_sources``, loaded on the first
    call), then any registered since."""
    _load_plugins()
    return tuple(_SOURCES.values())


def _load_plugins() -> None:
    global _plugins_loaded
    if _plugins_loaded:
        return
    from importlib.metadata import entry_points

    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = point.load()
        except Exception as error:
            raise ValueError(f"the data source plug-in {point.name!r} ({point.value}, entry point group "
                             f"{ENTRY_POINT_GROUP}) failed to load: {type(error).__name__}: {error}") from error
        if isinstance(loaded, types.ModuleType):
            continue  # a module registers its own sources on import
        for source in loaded if isinstance(loaded, (list, tuple)) else (loaded,):
            if not isinstance(source, DataSource):
                raise ValueError(f"the data source plug-in {point.name!r} ({point.value}) names a "
                                 f"{type(source).__name__}, not a contrastkit.data.DataSource (or a list of them, "
                                 "or a module that registers them)")
            register_data_source(source)
    _plugins_loaded = True  # (a plug-in that failed to load fails every resolution, not only the first)


# -- one look at a path per resolution ------------------------------------------------------

_FORMATS: contextvars.ContextVar[Optional[Dict[str, Any]]] = contextvars.ContextVar("contrastkit_formats",
                                                                                    default=None)


@contextlib.contextmanager
def _one_look() -> Iterator[None]:
    token = _FORMATS.set({})
    try:
        yield
    finally:
        _FORMATS.reset(token)


def path_format(data: str) -> Optional[str]:
    """The format :func:`~contrastkit.data.files.detect_format` names for the path ``data``
    (``"npz"``, ``"cifar10"``, ``"mnist"``, ``"imagefolder"``, ``"collection"``), or ``None``
    when ``data`` is not an existing path or is of no format contrastkit reads. Within one
    resolution of a ``--data`` the path is looked at once, whichever sources ask."""
    from . import files

    path = Path(data).expanduser()
    if not os.path.exists(path):
        return None
    cache = _FORMATS.get()
    key = os.fspath(path)
    if cache is not None and key in cache:
        found = cache[key]
    else:
        try:
            found = files.detect_format(path)
        except (ValueError, OSError) as error:  # kept: the error a path of no known format gets
            found = error
        if cache is not None:
            cache[key] = found
    return None if isinstance(found, BaseException) else found


def _format_error(data: str) -> Optional[BaseException]:
    cache = _FORMATS.get() or {}
    found = cache.get(os.fspath(Path(data).expanduser()))
    return found if isinstance(found, BaseException) else None


def find_data_source(data: Union[str, os.PathLike], *, pairs: bool = False, unlabeled: bool = False) -> DataSource:
    """The source that opens ``data``: the first registered one (of images, or of image-text
    pairs with ``pairs``) whose ``detect`` says yes; with ``unlabeled``, the ``collection``
    source for any path. ``FileNotFoundError`` when nothing recognises ``data`` and no such
    path exists; the ``ValueError`` of the path's format otherwise."""
    with _one_look():
        return _find(_as_data_string(data), pairs, unlabeled)


def is_data_name(data: str) -> bool:
    """Whether ``data`` is the name of a built-in data set (``glyphlab``, ``digits`` and their
    image-text forms), which wins over a folder of that name (a run keeps it as it is, not as
    a path)."""
    return data in _NAMED


def _find(data: str, pairs: bool, unlabeled: bool) -> DataSource:
    if unlabeled and not pairs:
        if not os.path.exists(Path(data).expanduser()):
            raise ValueError(f"--unlabeled reads a folder or a list of image files; {data!r} is neither")
        return _SOURCES["collection"]
    candidates = [source for source in data_sources() if source.pairs == pairs]
    for source in candidates:
        if source.detect(data):
            return source
    names = [s.name for s in candidates if s.name in _NAMED]
    plugins = [s.name for s in candidates if s.name not in _BUILTIN_NAMES]
    also = f"; installed sources: {', '.join(plugins)}" if plugins else ""
    if pairs:
        if not os.path.exists(Path(data).expanduser()):
            raise FileNotFoundError(f"no paired data {data!r}: not a built-in name ({', '.join(names)}) and no such "
                                    f"file{also}")
        raise ValueError(f"paired data {data!r}: expected a .csv file of (image, text) rows or tar shards of "
                         f"images with .txt captions{also}")
    error = _format_error(data)
    if error is not None:
        raise error
    raise FileNotFoundError(f"no data set {data!r}: not a built-in name ({', '.join(names)}) and no such file or "
                            f"folder{also}")


def _as_data_string(data: Any) -> str:
    if isinstance(data, os.PathLike):
        data = os.fspath(data)
    if not isinstance(data, str):
        raise TypeError(f"data must be a data set name or a path, got {type(data).__name__}")
    return data


def open_source(source: DataSource, request: DataRequest) -> Any:
    """``source.open(request)``, after refusing what ``source`` does not do (``stream=true``,
    ``bad_files="skip"``) in one line naming it."""
    if request.bad_files == "skip" and not source.skips_bad_files:
        raise ValueError("bad_files=skip applies to unlabeled collections; a labelled data set stops at a "
                         "damaged file (fail)")
    if request.stream and not source.streams:
        raise ValueError(f"data option stream=true reads each image when a batch asks for it: a folder of class "
                         f"subfolders of images, an unlabeled collection or an image-text CSV; {request.data!r} is none "
                         f"of them (it is {source.description or source.name})")
    return source.open(request)


def check_paired_source(data: Any, method: str) -> None:
    """Refuse, naming ``method``, a ``data`` that cannot be paired image-text data: a built-in
    paired name, a ``.csv`` path (whether the file exists is checked when it is read) or what a
    registered source of pairs recognises (:mod:`contrastkit.data.sources`)."""
    from .paired import PAIRED_BUILTIN

    if not isinstance(data, str) or data.lower().endswith(".csv"):
        return
    if not any(source.pairs and source.detect(data) for source in data_sources()):
        raise ValueError(f"{method} needs paired data: {', '.join(PAIRED_BUILTIN)}, a .csv of image,text "
                         f"rows or tar shards of images with .txt captions, got {data!r}")


# -- the built-in sources --------------------------------------------------------------------

def _name_is(name: str) -> Callable[[str], bool]:
    return lambda data: data.lower() == name


def _format_is(kind: str) -> Callable[[str], bool]:
    return lambda data: path_format(data) == kind


def _open_glyphlab(request: DataRequest) -> Any:
    from .glyphlab import load_glyphlab

    return call_with_options(load_glyphlab, "glyphlab", request.options, seed=request.seed)


def _open_digits(request: DataRequest) -> Any:
    from .digits import load_digits

    return call_with_options(load_digits, "digits", request.options)


def _labelled(kind: str) -> Callable[[DataRequest], Any]:
    def open_kind(request: DataRequest) -> Any:
        from .files import load_labelled

        path = Path(request.data).expanduser()
        return call_with_options(load_labelled, str(path), request.options, kind=kind, path=path)

    return open_kind


def _open_imagefolder(request: DataRequest) -> Any:
    path = Path(request.data).expanduser()
    if request.stream or (request.stream is None and request.workers > 0):
        from .streaming import stream_image_folder

        return call_with_options(stream_image_folder, str(path), request.options, root=path)
    return _labelled("imagefolder")(request)


def _is_tar_shards(data: str) -> bool:
    from .shards import is_tar_shards

    return is_tar_shards(data)


def _tar_shards(paired: bool) -> Callable[[DataRequest], Any]:
    def open_shards(request: DataRequest) -> Any:
        from .shards import open_tar_shards

        return call_with_options(open_tar_shards, request.data, request.options, shards=request.data,
                                 seed=request.seed, bad_files=request.bad_files or "skip", held_out=request.eval_data,
                                 paired=paired)

    return open_shards


def _open_collection(request: DataRequest) -> Any:
    from .collection import open_collection

    path = Path(request.data).expanduser()
    options = dict(request.options)
    size = options.get("size")
    if isinstance(size, (tuple, list)):
        if len(size) != 2 or size[0] != size[1]:
            raise ValueError(f"{path}: an unlabeled collection's images are square crops; give size as one "
                             f"number, got {size!r}")
        options["size"] = size[0]
    return call_with_options(open_collection, str(path), options, source=path,
                             bad_files=request.bad_files or "skip", index=request.index,
                             collection_changed=request.collection_changed)


def _open_glyphlab_text(request: DataRequest) -> Any:
    from .paired_texts import load_glyphlab_text

    return call_with_options(load_glyphlab_text, "glyphlab-text", request.options, seed=request.seed)


def _open_digits_text(request: DataRequest) -> Any:
    from .paired_texts import load_digits_text

    return call_with_options(load_digits_text, "digits-text", request.options, seed=request.seed)


def _is_pair_csv(data: str) -> bool:
    path = Path(data).expanduser()
    return path.suffix.lower() == ".csv" and path.is_file()


def _open_pair_csv(request: DataRequest) -> Any:
    from .paired_csv import load_pair_csv

    path = Path(request.data).expanduser()
    return call_with_options(load_pair_csv, str(path), request.options, path=path, stream=bool(request.stream),
                             index=request.index, collection_changed=request.collection_changed)


_BUILTINS: List[DataSource] = [
    DataSource("glyphlab", _name_is("glyphlab"), _open_glyphlab,
               "glyphlab: generated grayscale scenes of a bar, three orientation classes"),
    DataSource("digits", _name_is("digits"), _open_digits, "digits: scikit-learn's handwritten digits, upsampled"),
    DataSource("npz", _format_is("npz"), _labelled("npz"), "a .npz file of x_train, y_train, x_test, y_test"),
    DataSource("cifar10", _format_is("cifar10"), _labelled("cifar10"), "a folder of CIFAR-10 python batches"),
    DataSource("mnist", _format_is("mnist"), _labelled("mnist"), "a folder of MNIST idx files"),
    DataSource("tar-shards", _is_tar_shards, _tar_shards(paired=False),
               "a folder of uncompressed tar shards of images (WebDataset's layout), read as a stream",
               skips_bad_files=True),
    DataSource("imagefolder", _format_is("imagefolder"), _open_imagefolder,
               "a folder of class subfolders of images", streams=True),
    DataSource("collection", _format_is("collection"), _open_collection,
               "an unlabeled image collection: a folder of images, or a .txt / .csv list of image paths",
               streams=True, skips_bad_files=True),
    DataSource("glyphlab-text", _name_is("glyphlab-text"), _open_glyphlab_text,
               "glyphlab-text: glyphlab scenes paired with generated reports", pairs=True),
    DataSource("digits-text", _name_is("digits-text"), _open_digits_text,
               "digits-text: the digits paired with short texts", pairs=True),
    DataSource("pair-csv", _is_pair_csv, _open_pair_csv, "a .csv of image, text rows", pairs=True, streams=True),
    DataSource("tar-shard-pairs", _is_tar_shards, _tar_shards(paired=True),
               "tar shards of images with .txt captions (img2dataset's layout), read as a stream", pairs=True,
               skips_bad_files=True),
]
_BUILTIN_NAMES = frozenset(source.name for source in _BUILTINS)
#: The built-in sources a user names by a word (the others detect a path's format).
_NAMED = ("glyphlab", "digits", "glyphlab-text", "digits-text")
for _source in _BUILTINS:
    register_data_source(_source)

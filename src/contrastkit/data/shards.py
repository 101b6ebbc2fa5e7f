"""Tar shards read as a stream: the reference iterable data source
(:mod:`contrastkit.data.iterable`), what ``--data`` opens for tar shards.

**Where.** A folder of ``.tar`` files (read in name order), a brace pattern of shard names
(``shards/train-{000000..000127}.tar``, expanded by ``braceexpand`` as WebDataset expands it),
a ``.txt`` file listing shards (one path or URL per line, relative paths from its folder), or
any of these as a URL read through fsspec (``s3://``, ``gs://``, ``hf://``, ``memory://``,
``file://``; a folder URL ends in ``/``): ``shard_urls``. ``classes.txt`` is looked for in
the folder, or next to the first shard.

**Layout.** Uncompressed POSIX tar files whose members
are grouped into samples by key as WebDataset groups them: a member ``dir/name.ext`` belongs to
the sample ``dir/name`` (its name up to the first dot of its base name), so ``000123.jpg`` and
``000123.cls`` are one sample. A sample has one image member (JPEG, PNG, WebP, BMP, TIFF, GIF,
PNM) and optionally ``.cls``, its class id as decimal text; ``classes.txt`` (one class
name per line, line ``i`` naming id ``i``) names the classes. Without any ``.cls`` member the
data are unlabeled. A sample's key is ``SHARD/name`` (``00042.tar/00042123``): by it a
sample is put in a split (:func:`~contrastkit.data.split_of_key`), skipped and named.
**Image-text shards** (img2dataset's, what the image-text methods ``convirt`` and ``siglip``
read: ``open_tar_shards(..., paired=True)``, the ``tar-shard-pairs`` source) give each image
the UTF-8 caption of its ``.txt`` member; a sample without one (or with an empty one) is
damaged. Other members (``.json`` metadata) are not read.

**Opening** reads the member headers (and the few bytes of each ``.cls``), not the images:
the sample count that the schedules use is counted once here and recorded in the run's
``config.json``. Images are read at the size used, by the unlabeled collections' rule
(colour, shorter side resized and centre-cropped to ``size``,
:class:`~contrastkit.data.preprocess.ImagePreprocessing`).

**Training** (:class:`TarShardStream`) reads whole shards front to back: each epoch the shards
are put in an order seeded by ``(seed, epoch)`` and dealt out, shard ``i`` of that order to
process ``i % world_size`` and within it to ``DataLoader`` worker ``(i // world_size) %
workers``; each worker passes its shards' samples through a shuffle buffer of
``shuffle_buffer`` samples seeded by ``(seed, epoch, pass, rank, worker)``, and starts another
pass (shuffled anew) when it has read them all, so that every process reads the same number of
samples per epoch, ``num_samples // world_size`` (a small share repeats samples, as
WebDataset's ``with_epoch`` does). Its position is what each worker has consumed; the buffer
holds sample references, not images, so resuming replays the references up to there without
decoding anything.

**Held out** (:class:`ShardSamples`): val and test are the samples whose keys
:func:`~contrastkit.data.split_of_key` sets aside, read by their offsets in the shards; so is
the read-out's training sample (:meth:`TarShards.readout`): a seeded sample of at most
``readout_samples`` training samples, the same for every epoch and every resume.
"""

from __future__ import annotations

import collections
import contextlib
import io
import os
import posixpath
import random
import tarfile
from pathlib import Path
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from contrastkit import layout
from contrastkit._io import one_line
from contrastkit.data.base import NO_LABEL, check_positive_int
from contrastkit.data.collection import DEFAULT_SIZE, check_image_size, check_unlabeled_options, hash_fraction
from contrastkit.data.iterable import DamagedSample, split_of_key
from contrastkit.data.streaming import BadItemError, UnreadableImageError

__all__ = ["TarShards", "TarShardStream", "ShardSamples", "ShardSample", "ShardReadout", "open_tar_shards", "is_tar_shards",
           "shard_urls", "SHARD_SUFFIX", "CLASSES_FILE", "DEFAULT_SHUFFLE_BUFFER", "DEFAULT_READOUT_SAMPLES"]

SHARD_SUFFIX = ".tar"
CLASSES_FILE = layout.SHARD_CLASSES
#: Samples a worker's shuffle buffer holds (references only: the images are read as they leave it).
DEFAULT_SHUFFLE_BUFFER = 5000
#: The largest training sample the read-out (kNN, linear probe) reads of a stream.
DEFAULT_READOUT_SAMPLES = 10_000
_LABEL_BYTES = 32  # a .cls member longer than this is not a class id
_COLOR_SAMPLE = 16


class ShardSample(NamedTuple):
    """Where one sample lies: its shard (an index into the data set's shard list), the offset
    and size of its image member's bytes, its label (:data:`~contrastkit.data.NO_LABEL` when
    unlabeled), its key and its caption (the ``.txt`` member, read when the shards are opened
    as image-text pairs; else ``None``)."""

    shard: int
    offset: int
    size: int
    label: int
    key: str
    text: Optional[str] = None


_SCHEME = "://"
_LIST_SUFFIX = ".txt"


def _is_url(data: str) -> bool:
    return _SCHEME in data


def _is_pattern(data: str) -> bool:
    """A brace pattern of shard names (``train-{000000..000127}.tar``, ``{a,b}.tar``)."""
    return "{" in data and "}" in data and data.endswith(SHARD_SUFFIX)


def _listed_shards(path: Path) -> Optional[List[str]]:
    """The shards a ``.txt`` file lists (one path or URL per line, ``#`` comments and blank lines
    skipped, relative paths from the file's folder), or ``None`` when a line is not a shard."""
    try:
        if path.suffix.lower() != _LIST_SUFFIX or not path.is_file():
            return None
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError):
        return None
    entries = [line for line in lines if line and not line.startswith("#")]
    if not entries or not all(entry.endswith(SHARD_SUFFIX) for entry in entries):
        return None
    return [entry if _is_url(entry) or os.path.isabs(entry) else str(path.parent / entry) for entry in entries]


def is_tar_shards(path: Union[str, os.PathLike]) -> bool:
    """Whether ``path`` names tar shards: a folder holding ``.tar`` files, a brace pattern of
    them, a ``.txt`` list of them, or a URL of one, of a pattern or of a folder (ending in ``/``)."""
    data = os.fspath(path)
    if _is_pattern(data) or (_is_url(data) and (data.endswith(SHARD_SUFFIX) or data.endswith("/"))):
        return True
    local = Path(data).expanduser()
    try:
        if local.is_file():
            return _listed_shards(local) is not None
        if not local.is_dir():
            return False
        with os.scandir(local) as listing:  # (the name first: a folder may hold a million images)
            return any(entry.name.endswith(SHARD_SUFFIX) and not entry.name.startswith(".") and entry.is_file()
                       for entry in listing)
    except OSError:
        return False


def shard_urls(data: Union[str, os.PathLike]) -> Tuple[List[str], str]:
    """``(shards, home)``: the shard paths or URLs ``data`` names (``is_tar_shards``'s forms,
    a folder's in name order) and the folder where ``classes.txt`` is looked for (the folder, or
    that of the first shard). URLs are read through fsspec (``s3://``, ``gs://``, ``hf://``, ...
    with their own fsspec packages); a brace pattern is expanded by ``braceexpand``."""
    data = os.fspath(data)
    if _is_pattern(data):
        try:
            from braceexpand import braceexpand
        except ImportError:
            raise ImportError(f"{data}: a brace pattern of shards needs braceexpand "
                              "(pip install 'contrastkit[shards]')") from None
        shards = list(braceexpand(data))
    elif _is_url(data):
        shards = [data] if data.endswith(SHARD_SUFFIX) else _remote_folder(data)
    else:
        local = Path(data).expanduser()
        listed = _listed_shards(local) if local.is_file() else None
        if listed is not None:
            shards = listed
        else:
            return [str(path) for path in _shard_files(local)], str(local)
    if not shards:
        raise ValueError(f"{data}: names no tar shards")
    return shards, shards[0].rsplit("/", 1)[0] if "/" in shards[0] else "."


def _filesystem(url: str) -> Tuple[Any, str]:
    try:
        import fsspec
    except ImportError:
        raise ImportError(f"{url}: shards at a URL are read through fsspec (pip install 'contrastkit[shards]')") from None
    try:
        return fsspec.core.url_to_fs(url)
    except Exception as err:  # fsspec raises many kinds (ValueError, ImportError for a missing protocol package)
        raise ValueError(f"shard {url} cannot be opened ({type(err).__name__}: {one_line(err)})") from None


def _remote_folder(url: str) -> List[str]:
    filesystem, path = _filesystem(url)
    try:
        names = sorted(entry for entry in filesystem.ls(path, detail=False) if entry.endswith(SHARD_SUFFIX))
    except Exception as err:
        raise ValueError(f"{url} cannot be listed ({type(err).__name__}: {one_line(err)})") from None
    if not names:
        raise ValueError(f"{url}: no tar shards (*{SHARD_SUFFIX}) in it")
    return [filesystem.unstrip_protocol(name) for name in names]


def _open_shard(url: str) -> Any:
    """A binary handle of the shard ``url`` (a path, or a URL through fsspec); a ``ValueError``
    naming it and the error in one line when it cannot be opened."""
    try:
        if not _is_url(url):
            return open(url, "rb")
        filesystem, path = _filesystem(url)
        return filesystem.open(path, "rb")
    except ValueError:
        raise
    except Exception as err:  # OSError, and the storage's own errors through fsspec
        detail = err.strerror if isinstance(err, OSError) and err.strerror else one_line(err)
        raise ValueError(f"shard {url} cannot be opened ({type(err).__name__}: {detail})") from None


#: Open handles of shards at URLs, per process (a forked DataLoader worker opens its own): a
#: stream reads a shard front to back, so its handle serves many samples in a row, where opening
#: a remote file costs a request. The least recently used is closed beyond this many.
_OPEN_LIMIT = 8
_open_handles: "collections.OrderedDict[Tuple[int, str], Any]" = collections.OrderedDict()


def _read_range(url: str, offset: int, size: int) -> bytes:
    """``size`` bytes of the shard ``url`` from ``offset``."""
    if not _is_url(url):
        with _open_shard(url) as handle:
            handle.seek(offset)
            return handle.read(size)
    slot = (os.getpid(), url)
    handle = _open_handles.pop(slot, None)
    if handle is None:
        handle = _open_shard(url)
    try:
        handle.seek(offset)
        data = handle.read(size)
    except Exception:
        with contextlib.suppress(Exception):
            handle.close()
        raise
    _open_handles[slot] = handle
    while len(_open_handles) > _OPEN_LIMIT:
        (pid, _), oldest = _open_handles.popitem(last=False)
        if pid == os.getpid():
            with contextlib.suppress(Exception):
                oldest.close()
    return data


def _shard_files(folder: Path) -> List[Path]:
    shards = sorted(Path(entry.path) for entry in os.scandir(folder)
                    if entry.name.endswith(SHARD_SUFFIX) and not entry.name.startswith(".") and entry.is_file())
    if not shards:
        raise ValueError(f"{folder}: no tar shards (*{SHARD_SUFFIX}) in it")
    return shards


#: A tar file ends with two zero blocks of 512 bytes; one without them was cut off.
_END_OF_ARCHIVE = 1024
#: The first bytes of the compressed files a shard might be by mistake (gzip, bzip2, xz, zstd).
_COMPRESSED_MAGIC = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00", b"\x28\xb5\x2f\xfd")


def _index_shard(url: str, number: int, captions: bool = False) -> Tuple[List[ShardSample], Dict[str, str]]:
    """The samples of the shard ``url`` (headers, and the bytes of its ``.cls`` members; with
    ``captions``, of its ``.txt`` members too), and what of it is damaged: ``{shard or key:
    reason}``; with ``captions`` a sample without a readable caption is damaged. A shard cut off (or damaged) part way keeps
    the samples whose bytes are all there; one that is not a tar at all is damaged whole; one
    that is compressed is a ``ValueError`` (a setting to change, not damage)."""
    from contrastkit.data.files import IMAGE_EXTENSIONS

    image_kinds = tuple(ext.lstrip(".") for ext in IMAGE_EXTENSIONS)
    shard_name = url.rstrip("/").rsplit("/", 1)[-1]
    damaged: Dict[str, str] = {}
    groups: Dict[str, Dict[str, tarfile.TarInfo]] = {}
    handle = _open_shard(url)
    try:
        with handle:
            start = handle.read(6)
            if start.startswith(_COMPRESSED_MAGIC):
                raise ValueError(f"shard {url} is compressed; contrastkit reads members by their offsets (write the "
                                 "shards without compression)")
            length = handle.seek(0, os.SEEK_END)
            handle.seek(0)
            try:
                with tarfile.open(fileobj=handle, mode="r:") as tar:
                    try:
                        for member in tar:
                            if member.isfile():
                                directory, base = posixpath.split(member.name)
                                stem, _, kind = base.partition(".")
                                groups.setdefault(posixpath.join(directory, stem), {})[kind.lower()] = member
                    except tarfile.ReadError as err:
                        damaged[shard_name] = (f"damaged after {len(groups)} sample(s) ({one_line(err)}); the samples "
                                               "before kept")
                    else:
                        if length - tar.offset < _END_OF_ARCHIVE:  # the reader stops quietly at a cut header
                            damaged[shard_name] = (f"cut off after {len(groups)} sample(s): it ends without the tar "
                                                   "end-of-archive blocks; the samples before kept")
                    samples = _shard_samples(tar, groups, url, number, shard_name, image_kinds, length, damaged,
                                             captions)
            except tarfile.ReadError as err:
                damaged[shard_name] = f"not a readable tar file ({one_line(err)}); none of its samples read"
                return [], damaged
    except OSError as err:
        raise ValueError(f"shard {url} cannot be read ({err.strerror or one_line(err)})") from None
    return samples, damaged


def _shard_samples(tar: tarfile.TarFile, groups: Dict[str, Dict[str, tarfile.TarInfo]], url: str, number: int,
                   shard_name: str, image_kinds: Tuple[str, ...], length: int,
                   damaged: Dict[str, str], captions: bool) -> List[ShardSample]:
    """The samples of a shard's member groups; one whose members end past the shard's
    ``length`` bytes (a cut-off shard) is damaged, and so is one without a readable caption
    when ``captions`` are read."""
    samples = []
    for name, members in groups.items():
        image = next((members[kind] for kind in image_kinds if kind in members), None)
        if image is None:
            continue  # e.g. a sample of texts only: nothing this source reads
        key = f"{shard_name}/{name}"
        if any(member.offset_data + member.size > length for member in members.values()):
            damaged[key] = "cut off: the shard ends within it"
            continue
        label = NO_LABEL
        if "cls" in members:
            label = _read_label(tar, members["cls"], url, key)
        text = None
        if captions:
            text, problem = _read_caption(tar, members.get("txt"))
            if problem is not None:
                damaged[key] = problem
                continue
        samples.append(ShardSample(number, image.offset_data, image.size, label, key, text))
    return samples


#: The longest caption read (a ``.txt`` member beyond it is not a caption).
_CAPTION_BYTES = 1 << 16


def _read_caption(tar: tarfile.TarFile, member: Optional[tarfile.TarInfo]) -> Tuple[Optional[str], Optional[str]]:
    """``(caption, None)`` of a sample's ``.txt`` member, or ``(None, why it is no caption)``."""
    if member is None:
        return None, "no caption: the sample has no .txt member"
    if member.size > _CAPTION_BYTES:
        return None, f"its .txt member of {member.size:,} bytes is too long for a caption (at most {_CAPTION_BYTES:,})"
    handle = tar.extractfile(member)
    try:
        text = (handle.read() if handle is not None else b"").decode("utf-8").strip()
    except UnicodeDecodeError as err:
        return None, f"its .txt member is not UTF-8 text (byte {err.start})"
    if not text:
        return None, "its .txt caption is empty"
    return text, None


def _read_label(tar: tarfile.TarFile, member: tarfile.TarInfo, path: str, key: str) -> int:
    handle = tar.extractfile(member)
    text = handle.read(_LABEL_BYTES + 1) if handle is not None else b""
    try:
        label = int(text.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        label = -1
    if label < 0 or len(text) > _LABEL_BYTES:
        raise ValueError(f"shard {path}: sample {key}'s .cls member is not a class id (a non-negative integer): "
                         f"{text[:_LABEL_BYTES]!r}")
    return label


def _read_sample(shards: Sequence[str], sample: ShardSample, preprocessing: Any) -> Tensor:
    """The image of ``sample`` as ``(C, H, W)`` uint8; an :class:`UnreadableImageError` naming its key."""
    try:
        data = _read_range(shards[sample.shard], sample.offset, sample.size)
        if len(data) != sample.size:
            raise ValueError(f"{sample.key}: cannot read image (the shard ends within it: changed since it was "
                             "indexed)")
        return torch.from_numpy(preprocessing.read_bytes(data, sample.key))
    except ValueError as err:
        raise UnreadableImageError(str(err)) from None
    except OSError as err:
        raise UnreadableImageError(f"{sample.key}: cannot read image ({type(err).__name__}: "
                                   f"{err.strerror or err})") from None


class ShardSamples(torch.utils.data.Dataset):
    """A map-style split of samples in tar shards, read by offset: item ``i`` is ``(image,
    label)``, ``image`` ``(C, size, size)`` uint8; ``labels`` ``(n,)`` int64 or ``None``
    (unlabeled); ``texts``: the captions of image-text shards (``paired``), item ``i``'s
    ``texts[i]``, else ``None``. A damaged image raises :class:`~contrastkit.data.BadItemError`
    naming its key; with ``bad_files="skip"`` the loaders drop it and record it (``skipped``:
    key -> reason)."""

    def __init__(self, shards: Sequence[str], samples: Sequence[ShardSample], preprocessing: Any, *,
                 labelled: bool, bad_files: str = "skip", paired: bool = False) -> None:
        self.shards, self.samples, self.preprocessing = list(shards), list(samples), preprocessing
        self.bad_files = bad_files
        self.labels = torch.tensor([s.label for s in self.samples], dtype=torch.int64) if labelled else None
        self.texts: Optional[List[str]] = [str(s.text) for s in self.samples] if paired else None
        self.skipped: Dict[str, str] = {}

    @property
    def image_shape(self) -> Tuple[int, int, int]:
        height, width = self.preprocessing.size
        return (self.preprocessing.channels, height, width)

    def __len__(self) -> int:
        return len(self.samples)

    def path(self, index: int) -> str:
        """The key of item ``index`` (``SHARD/name``), by which it is named."""
        return self.samples[index].key

    def __getitem__(self, index: int) -> Tuple[Tensor, int]:
        sample = self.samples[index]
        return _read_sample(self.shards, sample, self.preprocessing), int(sample.label)

    def record_skipped(self, index: int, reason: str) -> None:
        """Note that item ``index`` was dropped (``bad_files="skip"``)."""
        self.skipped[self.path(index)] = reason

    def readable(self, workers: int = 0) -> "ShardSamples":
        """This split without its damaged samples: every image read once (in ``workers``
        processes), those that cannot be read recorded in ``skipped`` (and named by the run) or,
        with ``bad_files="fail"``, a :class:`~contrastkit.data.BadItemError` naming the key. A
        labelled read-out then pairs each feature with its label, an image-text one each image
        with its caption."""
        from contrastkit.data.loader import make_loader

        for _ in make_loader(self, batch_size=256, workers=workers):
            pass
        kept = ShardSamples(self.shards, [s for s in self.samples if s.key not in self.skipped], self.preprocessing,
                            labelled=self.labels is not None, bad_files=self.bad_files, paired=self.texts is not None)
        kept.skipped = self.skipped
        return kept


class TarShardStream(torch.utils.data.IterableDataset):
    """The training split of :class:`TarShards`, read front to back (the module's rules): an
    :class:`~contrastkit.data.IterableSplit` whose iteration, in each ``DataLoader`` worker,
    yields that worker's samples ``(image, label, key)``, ``(image, label, key, caption)`` for
    image-text shards (``paired``), a damaged one as a :class:`~contrastkit.data.DamagedSample`,
    pass after pass without end, from the position :meth:`load_state_dict` set; the reader
    takes what an epoch needs. ``texts``: every training caption, in the shards' order (what
    a run's tokenizer is built from), or ``None``."""

    def __init__(self, shards: Sequence[str], samples: Sequence[ShardSample], preprocessing: Any, *, seed: int,
                 shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER, bad_files: str = "skip", paired: bool = False) -> None:
        self.shards, self.preprocessing, self.seed = list(shards), preprocessing, int(seed)
        self.paired = bool(paired)
        self.shuffle_buffer = check_positive_int(shuffle_buffer, "shuffle_buffer", 1)
        self.bad_files = bad_files
        self.by_shard: List[List[ShardSample]] = [[] for _ in self.shards]
        for sample in samples:
            self.by_shard[sample.shard].append(sample)
        self.num_samples = len(samples)
        self.skipped: Dict[str, str] = {}
        self.rank, self.world_size = 0, 1
        self.epoch = 0
        self.workers = 1
        self.consumed: List[int] = [0]   # per (logical) worker: samples taken this epoch
        self.first_worker = 0            # the logical worker the loader's worker 0 plays

    @property
    def image_shape(self) -> Tuple[int, int, int]:
        height, width = self.preprocessing.size
        return (self.preprocessing.channels, height, width)

    def readers_needed(self, readers: int) -> Optional[str]:
        """Why ``readers`` (processes x workers) cannot read this stream (each reads whole
        shards, so there must be one shard each at least), or ``None``."""
        nonempty = sum(1 for samples in self.by_shard if samples)
        if readers > nonempty:
            return f"{nonempty} shard(s) with training samples cannot feed {readers} reader(s) (each reads whole shards)"
        return None

    def set_share(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = int(rank), int(world_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self.consumed, self.first_worker = [0] * self.workers, 0

    def state_dict(self) -> Dict[str, Any]:
        """The position set last: ``epoch``, ``workers`` and each worker's ``consumed`` samples."""
        return {"epoch": self.epoch, "workers": self.workers, "consumed": list(self.consumed),
                "first_worker": self.first_worker}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue epoch ``state["epoch"]`` read by ``state["workers"]`` workers, each from its
        ``consumed`` samples; the loader's worker ``j`` plays worker ``(first_worker + j) % workers``."""
        self.epoch, self.workers = int(state["epoch"]), max(1, int(state["workers"]))
        consumed = [int(c) for c in state.get("consumed", [0] * self.workers)]
        if len(consumed) != self.workers:
            raise ValueError(f"a stream position of {len(consumed)} worker(s) for {self.workers} worker(s)")
        self.consumed, self.first_worker = consumed, int(state.get("first_worker", 0)) % self.workers

    def worker_shards(self, worker: int) -> List[int]:
        """The shards (indices) the logical ``worker`` of this process reads in the current epoch:
        those with training samples, in the epoch's order, dealt out to the readers."""
        nonempty = [shard for shard, samples in enumerate(self.by_shard) if samples]
        order = torch.randperm(len(nonempty), generator=torch.Generator().manual_seed(
            self.seed * 100_003 + self.epoch)).tolist()
        readers = self.world_size * self.workers
        reader = self.rank + self.world_size * worker
        return [nonempty[i] for position, i in enumerate(order) if position % readers == reader]

    def references(self, worker: int) -> Iterator[ShardSample]:
        """The samples of the logical ``worker``, pass after pass through its shuffle buffer,
        from the first (nothing read)."""
        shards = self.worker_shards(worker)
        if not shards:
            raise ValueError(self.readers_needed(self.world_size * self.workers) or "a reader without shards")
        passes = 0
        while True:
            rng = random.Random(f"{self.seed}/{self.epoch}/{passes}/{self.rank}/{worker}")
            buffer: List[ShardSample] = []
            for shard in shards:
                for sample in self.by_shard[shard]:
                    if len(buffer) < self.shuffle_buffer:
                        buffer.append(sample)
                        continue
                    slot = rng.randrange(len(buffer))
                    buffer[slot], sample = sample, buffer[slot]
                    yield sample
            rng.shuffle(buffer)
            yield from buffer
            passes += 1

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        loader_worker, loader_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if loader_workers != self.workers:
            raise RuntimeError(f"the stream's position is for {self.workers} worker(s); it is read by {loader_workers}")
        worker = (self.first_worker + loader_worker) % self.workers
        references = self.references(worker)
        for _ in range(self.consumed[worker]):  # the samples consumed before: replayed, not read
            next(references)
        for sample in references:
            try:
                image = _read_sample(self.shards, sample, self.preprocessing)
            except BadItemError as error:
                yield DamagedSample(sample.key, str(error))
                continue
            if self.paired:
                yield image, int(sample.label), sample.key, sample.text
            else:
                yield image, int(sample.label), sample.key

    @property
    def texts(self) -> Optional[List[str]]:
        return [str(sample.text) for samples in self.by_shard for sample in samples] if self.paired else None


class TarShards:
    """A folder of tar shards as a data set (the module's rules): ``train`` a
    :class:`TarShardStream`, ``val`` and ``test`` :class:`ShardSamples`; ``name``,
    ``class_names``, ``num_classes``, ``image_shape``; ``source`` ``"tar-shards"``;
    ``held_out``: the held-out shards val and test came from, or ``None`` (split by key).
    Image-text shards (``paired``): every split carries its captions (``texts``) and, with
    labels, each class name is its own zero-shot prompt (``class_prompts``), as a pair CSV's."""

    source = "tar-shards"
    streamed = True
    has_realisations = False
    held_out: Optional[str] = None

    def __init__(self, name: str, train: TarShardStream, val: ShardSamples, test: ShardSamples,
                 class_names: List[str], readout_train: ShardSamples) -> None:
        self.name, self.class_names = name, class_names
        self.train, self.val, self.test = train, val, test
        self.image_shape = train.image_shape
        self.readout_train = readout_train
        self.paired = train.paired
        self.class_prompts: Dict[str, List[str]] = {name: [name] for name in class_names} if self.paired else {}

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def shards(self) -> List[str]:
        return self.train.shards

    def splits(self) -> List[Tuple[str, Any]]:
        return [("val", self.val), ("test", self.test)]

    def readout(self, workers: int = 0) -> "ShardReadout":
        """The map-style data set the read-out reads: ``train`` the seeded training sample
        (``readout_train``), ``val`` and ``test``. With labels, each is read once first (in
        ``workers`` processes) and its damaged samples left out (:meth:`ShardSamples.readable`),
        so that a feature is always paired with its own label."""
        return ShardReadout(self, workers)

    def summary(self) -> str:
        c, h, w = self.image_shape
        labels = f"{self.num_classes} classes" if self.num_classes else "unlabeled"
        pairs = " paired with captions" if self.paired else ""
        return (f"{self.name}: {c}x{h}x{w} images{pairs} in {len(self.shards)} tar shard(s), {labels}; train "
                f"{self.train.num_samples} (streamed), val {len(self.val)}, test {len(self.test)}")


class ShardReadout:
    """A :class:`TarShards` as the read-out and the held-out evaluation read it: map-style
    splits (``train``: the seeded sample of :meth:`TarShards.readout`)."""

    streamed = True
    has_realisations = False

    def __init__(self, shards: TarShards, workers: int = 0) -> None:
        self.name, self.class_names, self.image_shape = shards.name, shards.class_names, shards.image_shape
        self.source, self.class_prompts = shards.source, shards.class_prompts
        self.train, self.val, self.test = shards.readout_train, shards.val, shards.test
        # Every held-out image was read once already, with labels or captions: to leave out the
        # damaged ones, so that each feature keeps its own label and caption.
        self.held_out_read = bool(shards.num_classes) or shards.paired
        if self.held_out_read:
            self.train, self.val, self.test = (split.readable(workers) for split in (self.train, self.val, self.test))
        self.stream = shards.train

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def splits(self) -> List[Tuple[str, Any]]:
        return [("train", self.train), ("val", self.val), ("test", self.test)]


def open_tar_shards(shards: Union[str, os.PathLike], *, size: Optional[int] = None, color: Optional[str] = None,
                    val_fraction: float = 0.1, test_fraction: float = 0.2, seed: int = 0,
                    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER, readout_samples: int = DEFAULT_READOUT_SAMPLES,
                    bad_files: str = "skip", held_out: Optional[Union[str, os.PathLike]] = None,
                    paired: bool = False) -> TarShards:
    """The tar shards ``shards`` names (a folder, a brace pattern, a ``.txt`` list, a URL:
    ``shard_urls``; the module's rules). ``size``: the side of the square images (default
    32); ``color`` ``"L"``, ``"RGB"`` or ``None`` (grayscale when the first samples all are);
    ``seed``: the epochs' shard orders and shuffle buffers, and the read-out's sample;
    ``bad_files``: ``"skip"`` a damaged image (named in the run's ``skipped.txt``) or ``"fail"``;
    ``held_out``: other shards (any form ``shards`` takes; ``--eval-data``) that val and test
    come from, split between them by key in the ratio ``val_fraction : test_fraction``, every
    sample of ``shards`` then training (labelled shards with the same classes; unlabeled
    training shards leave them to the run's read-out); ``paired``: read the shards as image-text
    pairs, each image with its ``.txt`` caption (a sample without one is damaged: skipped and
    named, or with ``bad_files="fail"`` an error). Only headers (and the class ids and captions)
    are read now."""
    from contrastkit.data.files import GRAY_MODES
    from contrastkit.data.preprocess import SHORTER_SIDE_THEN_CENTRE_CROP, ImagePreprocessing

    where = os.fspath(shards)
    size = DEFAULT_SIZE if size is None else check_image_size(size, "size")
    val_fraction, test_fraction = check_unlabeled_options(val_fraction, test_fraction, color, bad_files)
    readout_samples = check_positive_int(readout_samples, "readout_samples", 1)
    paths, home = shard_urls(where)
    samples, damaged = _index_shards(where, paths, bad_files, captions=paired)
    seen: Dict[str, int] = {}
    for sample in samples:
        if sample.key in seen:
            raise ValueError(f"{where}: the key {sample.key} names two samples (a sample's members must be "
                             "consecutive and its key unique within its shard; shards of one name in two folders "
                             "cannot be read together)")
        seen[sample.key] = 1
    labelled = any(sample.label != NO_LABEL for sample in samples)
    if labelled and any(sample.label == NO_LABEL for sample in samples):
        missing = next(sample.key for sample in samples if sample.label == NO_LABEL)
        raise ValueError(f"{where}: some samples have a .cls member and {missing} has none; give every sample "
                         "a class id, or none")
    class_names = _class_names(home, samples) if labelled else []
    parts: Dict[str, List[ShardSample]] = {"train": [], "val": [], "test": []}
    if held_out is not None and labelled:
        held_where = os.fspath(held_out)
        held_paths, held_home = shard_urls(held_where)
        both = sorted(set(map(_same_shard, paths)) & set(map(_same_shard, held_paths)))
        if both:
            raise ValueError(f"eval data {held_where}: the held-out shards include training shards ({both[0]}"
                             f"{' and others' if len(both) > 1 else ''}): give shards that do not train")
        first = len(paths)  # the held-out shards follow the training shards in the shard list
        held_samples, held_damage = _index_shards(held_where, held_paths, bad_files, first=first, captions=paired)
        _check_held_out(held_where, held_samples, _class_names(held_home, held_samples), class_names)
        parts["train"] = samples
        # The rule of split_of_key over the held-out samples alone: test below its share of the hash range.
        held_test = test_fraction / (val_fraction + test_fraction) if val_fraction + test_fraction > 0 else 0.5
        for sample in held_samples:
            parts["test" if hash_fraction(sample.key) < held_test else "val"].append(sample)
        paths, damaged = paths + held_paths, {**damaged, **held_damage}
        samples = samples + held_samples
    else:
        for sample in samples:
            parts[split_of_key(sample.key, val_fraction, test_fraction)].append(sample)
    for part, members in parts.items():
        if not members:
            raise ValueError(f"{where}: the {part} split is empty ({len(samples)} samples in all: too few for the "
                             "val and test fractions)")
    if color is None:
        color = _colour(paths, parts["train"][:_COLOR_SAMPLE], GRAY_MODES)
    preprocessing = ImagePreprocessing(color, (size, size), SHORTER_SIDE_THEN_CENTRE_CROP)
    held = {part: ShardSamples(paths, parts[part], preprocessing, labelled=labelled, bad_files=bad_files,
                               paired=paired) for part in ("val", "test")}
    drawn = random.Random(f"{seed}/readout").sample(range(len(parts["train"])),
                                                     min(readout_samples, len(parts["train"])))
    readout = ShardSamples(paths, [parts["train"][i] for i in sorted(drawn)], preprocessing, labelled=labelled,
                           bad_files=bad_files, paired=paired)
    stream = TarShardStream(paths, parts["train"], preprocessing, seed=seed, shuffle_buffer=shuffle_buffer,
                            bad_files=bad_files, paired=paired)
    # The damaged shards and cut-off samples found now: with the stream's and the read-out's
    # skipped samples (what the run names in skipped.txt).
    stream.skipped.update(damaged)
    readout.skipped.update(damaged)
    opened = TarShards(_set_name(home), stream, held["val"], held["test"], class_names, readout)
    if held_out is not None and labelled:
        opened.held_out = os.fspath(held_out)
    return opened


def _index_shards(where: str, paths: Sequence[str], bad_files: str, first: int = 0,
                  captions: bool = False) -> Tuple[List[ShardSample], Dict[str, str]]:
    """The samples of the shards ``paths`` (numbered from ``first``; with their ``captions``)
    and what is damaged."""
    samples: List[ShardSample] = []
    damaged: Dict[str, str] = {}
    for number, path in enumerate(paths, start=first):
        found, bad = _index_shard(path, number, captions)
        if bad and bad_files == "fail":
            what, reason = next(iter(bad.items()))
            raise ValueError(f"shard {path}: {what} is {reason} (bad_files=fail; skip leaves it out and names it)")
        samples += found
        damaged.update(bad)
    if not samples:
        raise ValueError(f"{where}: no sample could be read (e.g. {_some_damage(damaged)})")
    return samples, damaged


def _same_shard(url: str) -> str:
    """A shard's identity: its URL, or its resolved path."""
    return url if _is_url(url) else os.path.realpath(url)


def _check_held_out(where: str, samples: Sequence[ShardSample], names: Sequence[str],
                    class_names: Sequence[str]) -> None:
    """Held-out shards are judged by the training shards' classes: labelled, with the same names."""
    if any(sample.label == NO_LABEL for sample in samples):
        raise ValueError(f"eval data {where}: held-out shards of labelled training shards need a .cls member in "
                         "every sample")
    if list(names) != list(class_names)[:len(names)] or max(sample.label for sample in samples) >= len(class_names):
        raise ValueError(f"eval data {where}: its classes ({', '.join(names[:5])}{', ...' if len(names) > 5 else ''}) "
                         f"are not the training shards' ({', '.join(class_names[:5])}"
                         f"{', ...' if len(class_names) > 5 else ''})")


def _some_damage(damaged: Dict[str, str]) -> str:
    if not damaged:
        return "no shard holds an image"
    what, reason = next(iter(damaged.items()))
    return f"{what}: {reason}"


def _set_name(home: str) -> str:
    """The data set's name: the last part of the shards' folder."""
    if not _is_url(home):
        home = str(Path(home).expanduser().resolve())
    return home.rstrip("/").rsplit("/", 1)[-1].rsplit(os.sep, 1)[-1] or "shards"


def _class_names(home: str, samples: Sequence[ShardSample]) -> List[str]:
    largest = max(sample.label for sample in samples)
    listed = f"{home.rstrip('/')}/{CLASSES_FILE}" if _is_url(home) else os.path.join(home, CLASSES_FILE)
    try:
        with _open_shard(listed) as handle:
            text = handle.read().decode("utf-8")
    except ValueError:  # no classes.txt: the ids name the classes
        return [str(i) for i in range(largest + 1)]
    except UnicodeDecodeError as err:
        raise ValueError(f"{listed} cannot be read ({err})") from None
    names = [line.strip() for line in text.splitlines() if line.strip()]
    if largest >= len(names):
        raise ValueError(f"{listed} names {len(names)} classes; the shards have class id {largest}")
    return names


def _colour(shards: Sequence[str], samples: Sequence[ShardSample], gray_modes: Any) -> str:
    """``"L"`` when every one of ``samples`` that can be read is grayscale, else ``"RGB"``."""
    from PIL import Image

    modes = []
    for sample in samples:
        try:
            with Image.open(io.BytesIO(_read_range(shards[sample.shard], sample.offset, sample.size))) as image:
                modes.append(image.mode)
        except Exception:  # a damaged image decides nothing (PIL raises many kinds)
            continue
    return "L" if modes and all(mode in gray_modes for mode in modes) else "RGB"

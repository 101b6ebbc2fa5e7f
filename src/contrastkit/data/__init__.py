"""Data sets with train / val / test splits, and the view makers that form positive pairs.

>>> from contrastkit.data import load_dataset, make_views
>>> ds = load_dataset("glyphlab", seed=0)               # doctest: +SKIP
>>> views = make_views(ds, mode="A")                    # doctest: +SKIP
>>> view_a, view_b = views(ds.train, torch.arange(8))   # doctest: +SKIP

``load_dataset`` accepts a built-in name (``"glyphlab"``, ``"digits"``) or a filesystem path
(a folder of class subfolders of images, a folder of MNIST idx files, a folder of CIFAR-10
python batches, or a ``.npz`` file); see :func:`load_dataset`. What a ``--data`` names is
decided by the registered data sources (:class:`DataSource`, :func:`register_data_source`;
:mod:`contrastkit.data.sources`), asked in order by :func:`open_data`; a source may give an
iterable (sharded) data set (:mod:`contrastkit.data.iterable`). Nothing is downloaded unless
asked: :func:`download_mnist` and :func:`download_cifar10` fetch the official files into a
folder to load.

Data too large to hold are streamed (:mod:`contrastkit.data.streaming`): :func:`stream_image_folder`
keeps only the file index of a class-folder tree and decodes images in ``DataLoader`` workers;
:func:`as_streaming` wraps any map-style ``torch.utils.data.Dataset`` of ``(image, label)``,
:func:`as_streaming_pairs` one of ``(image, text)`` pairs (for ``convirt`` and ``siglip``).
Views are made by kornia on the training device (:func:`make_views`), or by a per-image
transform such as a torchvision ``transforms.v2`` pipeline in the ``DataLoader`` workers
(:class:`TransformViews`).

How an image file becomes the encoder's input (colour, the resize and crop rule of the data's
kind, the scale) is defined once, in :mod:`contrastkit.data.preprocess`; :func:`preprocess_image`
applies an export's input contract to an image.
"""

from __future__ import annotations


from contrastkit.data.base import (NO_LABEL, Dataset, Split, call_with_options, check_positive_int, stratified_subset,
                                   stratified_subset_indices)
from contrastkit.data.batches import PairedImages, reading_held_batches
from contrastkit.data.collection import (CollectionDataset, ImageCollection, add_skipped, open_collection,
                                         skipped_files, skipped_reason, skipped_reasons,
                                         skips_bad_files)
from contrastkit.data.collection_index import COLLECTION_CHANGED, CollectionChangedError, check_collection_changed
from contrastkit.data.contract import (DataSplit, DataSplits, as_data, data_record, image_batches, indexed_image_batches,
                                       item_dataset, limit_split, limit_splits, open_data, read_held_out_files,
                                       reads_files, training_views)
from contrastkit.data.download import download_cifar10, download_mnist
from contrastkit.data.loader import (DamagedItem, DeviceIndexBatches, EpochBatchSampler, SkippingItems, collate_skipping,
                                     make_loader, record_damaged)
from contrastkit.data.on_device import (DeviceImages, OnDevicePlan, choose_on_device, compact_images, device_free_bytes,
                                        hold_on_device)
from contrastkit.data.streaming import (BadItemError, CaptionedDataset, ImageFolderDataset, StreamingDataset,
                                        UnreadableImageError, as_streaming, as_streaming_pairs, stream_image_folder,
                                        subset_split, unit_float)
from contrastkit.data.loading import BUILTIN, load_dataset, load_paired
from contrastkit.data.sources import (DataRequest, DataSource, data_sources, find_data_source, register_data_source,
                                      unregister_data_source)
from contrastkit.data.batch_source import IndexBatchSource, StepBatch, StreamBatchSource
from contrastkit.data.iterable import (DamagedSample, IterableDataSplits, IterableSplit, check_indexed, is_iterable_data,
                                      split_of_key)
from contrastkit.data.shard_writer import ShardSetResult, ShardsWritten, write_shards
from contrastkit.data.shards import ShardReadout, ShardSample, ShardSamples, TarShards, TarShardStream, open_tar_shards
from contrastkit.data.paired import PairedDataset, PairedSplit
from contrastkit.data.preprocess import ImagePreprocessing, preprocess_image, preprocessing_of
from contrastkit.data.views import MODES, ViewMaker, make_views
from contrastkit.data.transform_views import TransformViews

__all__ = ["load_dataset", "load_paired", "PairedDataset", "PairedSplit", "make_views", "Dataset", "Split", "ViewMaker", "MODES", "BUILTIN",
           "download_mnist", "download_cifar10", "ImageFolderDataset", "StreamingDataset", "UnreadableImageError",
           "BadItemError", "CaptionedDataset", "EpochBatchSampler", "stream_image_folder", "as_streaming",
           "as_streaming_pairs", "make_loader", "subset_split",
           "stratified_subset", "stratified_subset_indices", "DataSplit", "DataSplits", "open_data", "as_data",
           "image_batches", "limit_split", "limit_splits", "item_dataset", "reads_files", "read_held_out_files", "training_views",
           "PairedImages", "reading_held_batches", "indexed_image_batches", "data_record", "call_with_options", "check_positive_int", "unit_float",
           "NO_LABEL", "CollectionDataset", "ImageCollection", "open_collection", "skipped_files", "skipped_reason", "skipped_reasons", "add_skipped", "skips_bad_files", "DamagedItem", "SkippingItems",
           "collate_skipping", "record_damaged", "DeviceIndexBatches",
           "DeviceImages", "OnDevicePlan", "choose_on_device", "compact_images", "device_free_bytes", "hold_on_device",
           "TransformViews", "ImagePreprocessing", "preprocess_image", "preprocessing_of",
           "DataSource", "DataRequest", "register_data_source", "unregister_data_source", "data_sources",
           "find_data_source", "IterableSplit", "IterableDataSplits", "IndexBatchSource", "StepBatch", "StreamBatchSource",
           "DamagedSample", "TarShards", "TarShardStream", "ShardSamples", "ShardSample", "ShardReadout",
           "open_tar_shards", "write_shards", "ShardsWritten", "ShardSetResult", "is_iterable_data", "check_indexed",
           "split_of_key", "COLLECTION_CHANGED", "CollectionChangedError", "check_collection_changed"]

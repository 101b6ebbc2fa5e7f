"""The reference stream, tar shards (``contrastkit.data.shards``): how a folder of shards is
opened and split, how a pass is shared among processes and workers, and how a position is
resumed; what is refused, by name."""

import gzip
import io
import itertools
import os
import shutil
import tarfile

import pytest
import torch

from contrastkit.data import DamagedSample, find_data_source, is_iterable_data, open_data, open_tar_shards, split_of_key

from _shards import add_damaged_shard, write_image_tree, write_shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("shards"), per_shard=8)


def _position(stream, worker, workers, consumed):
    stream.load_state_dict({"epoch": stream.epoch, "workers": workers,
                            "consumed": [consumed if w == worker else 0 for w in range(workers)],
                            "first_worker": worker})
    return stream


def test_a_folder_of_shards_is_a_stream_resolved_through_the_registry(shards):
    assert find_data_source(shards).name == "tar-shards"
    data = open_data(shards, seed=3, size=16)
    assert is_iterable_data(data)
    assert data.class_names == ["class0", "class1", "class2"]  # classes.txt, written with the shards
    keys = [s.key for s in data.train.by_shard[0]]
    assert keys and all(k.startswith("00000.tar/") for k in keys)
    # Every sample is in the split its key puts it in, once.
    held = {data.val.path(i): "val" for i in range(len(data.val))} | {data.test.path(i): "test" for i in
                                                                         range(len(data.test))}
    train = [s.key for samples in data.train.by_shard for s in samples]
    assert data.train.num_samples == len(train) and len(train) + len(held) == 60
    assert all(split_of_key(k) == "train" for k in train) and all(split_of_key(k) == p for k, p in held.items())
    image, label = data.val[0]
    assert image.shape == (3, 16, 16) and image.dtype == torch.uint8 and label in (0, 1, 2)


def test_adding_a_shard_moves_no_sample_between_splits(shards, tmp_path):
    before = open_tar_shards(shards)
    grown = str(tmp_path / "grown")
    shutil.copytree(shards, grown)
    add_damaged_shard(grown)
    after = open_tar_shards(grown)
    for name in ("val", "test"):
        old = {getattr(before, name).path(i) for i in range(len(getattr(before, name)))}
        new = {getattr(after, name).path(i) for i in range(len(getattr(after, name)))}
        assert old <= new and all(key.startswith("shard-damaged.tar/") for key in new - old)


@pytest.mark.parametrize("world_size, workers", [(1, 1), (2, 1), (1, 3), (2, 2)])
def test_the_readers_of_a_pass_read_each_training_sample_once(shards, world_size, workers):
    stream = open_tar_shards(shards, size=16, seed=5).train
    read = []
    for rank in range(world_size):
        stream.set_share(rank, world_size)
        stream.set_epoch(1)
        for worker in range(workers):
            references = _position(stream, worker, workers, 0).references(worker)
            own = sum(len(stream.by_shard[s]) for s in stream.worker_shards(worker))
            read += [sample.key for sample in itertools.islice(references, own)]
    assert sorted(read) == sorted(s.key for samples in stream.by_shard for s in samples)


def test_an_epoch_order_depends_on_the_seed_and_epoch_alone(shards):
    def first_keys(seed, epoch):
        stream = open_tar_shards(shards, size=16, seed=seed).train
        stream.set_epoch(epoch)
        torch.manual_seed(epoch * 7 + 1)  # the global RNG (the views') plays no part
        return [k for _, _, k in itertools.islice(iter(_position(stream, 0, 1, 0)), 12)]

    assert first_keys(0, 0) == first_keys(0, 0)
    assert first_keys(0, 0) != first_keys(0, 1) and first_keys(0, 0) != first_keys(1, 0)


def test_a_position_continues_exactly_where_the_samples_were_consumed(shards):
    stream = open_tar_shards(shards, size=16, shuffle_buffer=7).train
    stream.set_epoch(2)
    # Beyond one pass (every shard, one worker): the next pass, shuffled anew, continues it.
    whole = [k for _, _, k in itertools.islice(iter(_position(stream, 0, 1, 0)), stream.num_samples + 20)]
    assert sorted(whole[:stream.num_samples]) == sorted(s.key for samples in stream.by_shard for s in samples)
    assert whole[stream.num_samples:] != whole[:20]
    for consumed in (1, 13, stream.num_samples + 3):
        resumed = [k for _, _, k in itertools.islice(iter(_position(stream, 0, 1, consumed)), 10)]
        assert resumed == whole[consumed:consumed + 10]


def test_a_damaged_sample_is_yielded_in_its_place_naming_its_key(shards, tmp_path):
    folder = str(tmp_path / "with-damaged")
    shutil.copytree(shards, folder)
    damaged = add_damaged_shard(folder, train=3, held_out=0)
    stream = open_tar_shards(folder, size=16).train
    items = list(itertools.islice(iter(_position(stream, 0, 1, 0)), stream.num_samples))
    found = [item for item in items if isinstance(item, DamagedSample)]
    assert sorted(item.key for item in found) == sorted(damaged)
    assert all(item.reason.startswith(item.key) and "cannot read image" in item.reason for item in found)


def _tar_with(path, members):
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_what_a_folder_of_shards_cannot_be_is_refused_naming_the_file(shards, tmp_path):
    compressed = tmp_path / "compressed"
    compressed.mkdir()
    with open(os.path.join(shards, "00000.tar"), "rb") as source:
        (compressed / "shard-0.tar").write_bytes(gzip.compress(source.read()))
    with pytest.raises(ValueError, match="shard .*shard-0.tar is compressed; contrastkit reads members by their offsets"):
        open_tar_shards(compressed)
    png = open(os.path.join(write_image_tree(str(tmp_path / "tree"), classes=1, per_class=1), "class0", "000.png"),
               "rb").read()
    bad_label = tmp_path / "bad-label"
    bad_label.mkdir()
    _tar_with(bad_label / "a.tar", {"x.png": png, "x.cls": b"cat"})
    with pytest.raises(ValueError, match="a.tar: sample a.tar/x's .cls member is not a class id"):
        open_tar_shards(bad_label)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    _tar_with(mixed / "a.tar", {"x.png": png, "x.cls": b"0", "y.png": png})
    with pytest.raises(ValueError, match="a.tar/y has none"):
        open_tar_shards(mixed)
    assert not os.path.exists(tmp_path / "nothing") and find_data_source(str(tmp_path / "tree")).name != "tar-shards"


def test_more_readers_than_shards_is_refused_naming_workers(shards):
    stream = open_tar_shards(shards).train
    nonempty = sum(1 for samples in stream.by_shard if samples)
    assert stream.readers_needed(nonempty) is None
    assert f"{nonempty} shard(s) with training samples cannot feed {nonempty + 1} reader(s)" in \
        stream.readers_needed(nonempty + 1)


def test_cut_off_and_unreadable_shards_are_named_and_their_whole_samples_kept(shards, tmp_path):
    """A shard cut off in a member's bytes, one cut off at a header (where Python's tar reader
    stops without a word), and one that is no tar at all: the samples whose bytes are all there
    are kept, the rest named with the shard; ``bad_files="fail"`` stops naming the first."""
    folder = tmp_path / "damaged"
    shutil.copytree(shards, folder)
    names = sorted(name for name in os.listdir(folder) if name.endswith(".tar"))
    whole = open_tar_shards(shards)
    count = lambda data: data.train.num_samples + len(data.val) + len(data.test)  # noqa: E731
    with tarfile.open(folder / names[0]) as tar:
        members = tar.getmembers()
    in_bytes = members[4].offset_data + 3  # within the third member group's data
    at_header = members[6].offset  # at the header of a later member
    with tarfile.open(folder / names[3]) as tar:
        last = tar.getmembers()[-1]
    in_the_last = last.offset_data + 1  # within the last member's bytes: the reader then stops quietly
    for name, cut in ((names[0], in_bytes), (names[1], at_header), (names[3], in_the_last)):
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[:cut])
    (folder / names[2]).write_bytes(b"not a tar file" * 100)
    opened = open_tar_shards(folder)
    skipped = opened.train.skipped
    assert "cut off after" in skipped[names[1]] and "not a readable tar file" in skipped[names[2]]
    assert "damaged after 2 sample(s) (unexpected end of data)" in skipped[names[0]]
    last_key = f"{names[3]}/{last.name.split('.')[0]}"
    assert skipped[last_key] == "cut off: the shard ends within it" and names[3] in skipped
    assert last_key not in {s.key for samples in opened.train.by_shard for s in samples}
    per_shard = [len([s for s in whole.train.by_shard[i]]) for i in range(3)]
    assert count(opened) < count(whole) - per_shard[2]
    assert opened.readout_train.skipped == skipped
    with pytest.raises(ValueError, match=f"shard .*{names[0]}: .*bad_files=fail"):
        open_tar_shards(folder, bad_files="fail")


def test_held_out_shards_give_val_and_test_and_every_training_sample_trains(tmp_path):
    from contrastkit.data import write_shards as write_shard_sets

    tree = tmp_path / "tree"
    write_image_tree(str(tree / "train"), classes=3, per_class=10, size=12, seed=1)
    write_image_tree(str(tree / "test"), classes=3, per_class=6, size=12, seed=2)
    written = write_shard_sets(str(tree), str(tmp_path / "shards"), shard_size=6)
    train, held = written.parts["train"].folder, written.parts["test"].folder
    opened = open_tar_shards(train, held_out=held, val_fraction=0.1, test_fraction=0.2, size=12)
    assert opened.train.num_samples == 30 and len(opened.val) + len(opened.test) == 18
    assert opened.held_out == held and len(opened.test) > len(opened.val) > 0  # split 1 : 2 by key
    assert all(opened.val.path(i).split("/")[0] in os.listdir(held) for i in range(len(opened.val)))
    image, label = opened.test[0]
    assert image.shape == (3, 12, 12) and 0 <= label < 3
    assert open_data(train, eval_data=held, size=12).train.num_samples == 30  # what --eval-data passes
    with pytest.raises(ValueError, match="the held-out shards include training shards"):
        open_tar_shards(train, held_out=train)
    other = tmp_path / "other-classes"
    write_shard_sets(write_image_tree(str(tmp_path / "tree4"), classes=4, per_class=3, size=12), str(other))
    with pytest.raises(ValueError, match="its classes .* are not the training shards'"):
        open_tar_shards(train, held_out=str(other))

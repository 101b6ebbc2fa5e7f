"""The online probe under two processes (gloo, CPU): each rank trains the head on its share of
each batch (the gradients averaged) and reads its share of the val images and of the kNN's
memory; the head and the epoch's numbers are those of one process on the whole batches. The
online view retrieval (data without labels) reads each rank's share of each batch of views: its
numbers are one process's too, and those of the label-free read-out on the same views."""

from __future__ import annotations

import pytest
import torch

import distributed_workers as W
import online_probe_workers as O


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return W.spawn(O.worker, 2, tmp_path_factory.mktemp("online"))


def test_two_ranks_train_the_head_one_process_trains_and_read_its_numbers(two_ranks):
    alone = O.trained(0, 1)
    initial = O.OnlineProbe(O.FEATURES, O.CLASSES, torch.device("cpu"), seed=O.SEED, knn_k=3,
                            knn_temperature=0.1).head.state_dict()
    assert not torch.allclose(alone["head"]["weight"], initial["weight"])  # the steps moved it
    for result in two_ranks:
        for key, value in alone["head"].items():
            torch.testing.assert_close(result["head"][key], value, rtol=0, atol=1e-6)
        assert result["numbers"] == alone["numbers"]
    assert torch.equal(two_ranks[0]["head"]["weight"], two_ranks[1]["head"]["weight"])
    assert set(alone["numbers"]) == {"online_probe_accuracy", "online_knn_accuracy"}


def test_two_ranks_read_the_view_retrieval_of_one_process(two_ranks):
    from contrastkit.metrics.readout import extract_features, held_out_views, view_retrieval

    alone = O.retrieval(0, 1)
    assert set(alone) == {"online_view_retrieval_top1", "online_view_retrieval_top5"}
    for result in two_ranks:
        assert result["views"] == alone
    # The label-free read-out's own functions on all the views at once, in one process.
    net = O.encoder()
    view_a, view_b = held_out_views(O.data().val, O.NoisyViews(), seed=O.SEED, batch_size=O.VIEW_BATCH)
    expected = view_retrieval(torch.from_numpy(extract_features(net, view_a, torch.device("cpu"))),
                              torch.from_numpy(extract_features(net, view_b, torch.device("cpu"))))
    assert alone == {f"online_{key}": value for key, value in expected.items()}
    assert 0 < alone["online_view_retrieval_top1"] < 1  # (the noise makes some views miss: a real check)


def test_ranks_that_read_different_val_images_give_no_view_retrieval_rather_than_a_wrong_one(two_ranks):
    for result in two_ranks:
        assert result["mismatched"]["numbers"] == {}
        assert any("its processes read [6, 7] val images" in w for w in result["mismatched"]["warnings"])


def test_a_damaged_file_one_rank_reads_stops_every_rank(two_ranks):
    """Only rank 1 read it; rank 0 would otherwise wait for rank 1 in the kNN's gather."""
    assert two_ranks[1]["damaged"] == "photos/broken.jpg: cannot read image"
    assert "another process" in two_ranks[0]["damaged"]


def test_a_rank_alone_would_train_another_head():
    """What each rank sees alone is not the whole batch: the equality above can fail."""
    net = O.encoder()
    probe = O.OnlineProbe(O.FEATURES, O.CLASSES, torch.device("cpu"), seed=O.SEED, knn_k=3, knn_temperature=0.1)
    probe.attach(net)
    for view_a, view_b, labels in O.steps():
        with probe.capturing():
            net(torch.cat([view_a[:4], view_b[:4]]))
        probe.train_step(labels[:4])
    assert not torch.allclose(probe.head.weight, O.trained(0, 1)["head"]["weight"], atol=1e-6)

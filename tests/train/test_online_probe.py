"""The online probe and kNN monitor (``--online-probe``, :mod:`contrastkit.train.online`): they
leave the encoder's training as it was, their numbers are those of the checkpoint's head and
encoder, they reach metrics.jsonl, the CSV logger and the summary, a run preempted mid-epoch
resumes to the uninterrupted numbers and weights, and a stream's batches train the head."""

import csv
import json
import os

import numpy as np
import pytest
import torch

from _tiny_run import TIMINGS, preempted_at_backward, tiny_config, without_timings
from contrastkit import records
from contrastkit.methods import build_model
from contrastkit.metrics import knn_accuracy
from contrastkit.metrics.readout import extract_features
from contrastkit.train import pretrain
from contrastkit.train.faults import Preempted
from contrastkit.train.online import OnlineProbe, PROBE_LR

ONLINE = (records.ONLINE_PROBE_ACCURACY, records.ONLINE_KNN_ACCURACY)


def _records(out, kind="epoch"):
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as handle:
        return [r for r in map(json.loads, handle) if r["kind"] == kind]


def _checkpoint(out):
    return torch.load(os.path.join(out, "checkpoints", "last.pt"), map_location="cpu", weights_only=False)


def _run(out, **overrides):
    overrides.setdefault("epochs", 2)
    overrides.setdefault("online_probe", True)
    return pretrain(tiny_config(out, **overrides), progress=False, baselines=False)


@pytest.mark.parametrize("options", [{}, {"method": "moco"}, {"micro_batch": 4, "norm": "group"}])
def test_the_encoder_trains_bit_for_bit_the_same_with_and_without_the_online_probe(tmp_path, one_torch_thread,
                                                                                    options):
    with_probe = _run(tmp_path / "with", **options)
    without = _run(tmp_path / "without", online_probe=False, **options)
    assert all(key in with_probe for key in ONLINE) and not any(key in without for key in ONLINE)
    a, b = _checkpoint(tmp_path / "with"), _checkpoint(tmp_path / "without")
    assert a["model"].keys() == b["model"].keys()
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    assert "online_probe" in a and "online_probe" not in b
    # Every number the run had before keeps its value.
    assert {k: v for k, v in without_timings(with_probe).items() if k not in ONLINE} == without_timings(without)
    steps = [{k: v for k, v in r.items() if k != "images_per_second"} for r in _records(tmp_path / "with", "step")]
    assert steps == [{k: v for k, v in r.items() if k != "images_per_second"}
                     for r in _records(tmp_path / "without", "step")]


def test_the_epoch_numbers_are_those_of_the_checkpointed_head_and_encoder(tmp_path, one_torch_thread):
    out = tmp_path / "run"
    config = tiny_config(out, epochs=2, loggers=["csv"], online_probe=True)
    summary = pretrain(config, progress=False, baselines=False)
    epochs = _records(out)
    assert [sorted(k for k in r if k.startswith("online_")) for r in epochs] == [sorted(ONLINE)] * 2
    assert {key: summary[key] for key in ONLINE} == {key: epochs[-1][key] for key in ONLINE}
    # Recomputed from the final checkpoint: the whole (small) training split is the kNN's memory.
    state = _checkpoint(out)
    resolved = config.resolved()
    from contrastkit.data import open_data
    from contrastkit.methods import limit_data

    dataset = limit_data(open_data(resolved.data, seed=resolved.seed, **resolved.data_options), resolved)
    assert len(dataset.train) < 4096
    model = build_model(resolved, dataset.image_shape, initial_weights=False)
    model.load_state_dict(state["model"])
    train_x = extract_features(model.encoder, dataset.train, torch.device("cpu"))
    val_x = extract_features(model.encoder, dataset.val, torch.device("cpu"))
    val_y = dataset.val.labels.numpy()
    assert summary[records.ONLINE_KNN_ACCURACY] == knn_accuracy(
        train_x, dataset.train.labels.numpy(), val_x, val_y, k=resolved.knn_k, temperature=resolved.knn_temperature,
        num_classes=dataset.num_classes)
    head = torch.nn.Linear(train_x.shape[1], dataset.num_classes)
    head.load_state_dict(state["online_probe"]["head"])
    predicted = head(torch.from_numpy(val_x)).argmax(1).numpy()
    assert summary[records.ONLINE_PROBE_ACCURACY] == float(np.mean(predicted == val_y))
    assert state["online_probe"]["steps"] == summary["steps"]
    # The head trained: it is not its initialisation any more.
    initial = OnlineProbe(train_x.shape[1], dataset.num_classes, torch.device("cpu"), seed=config.seed,
                          knn_k=config.knn_k, knn_temperature=config.knn_temperature)
    assert not torch.equal(initial.head.weight, head.weight)
    # The CSV logger has them in their own group, per epoch.
    with open(out / "metrics.csv", newline="", encoding="utf-8") as handle:
        rows = [r for r in csv.DictReader(handle) if r["group"] == "online"]
    assert {(int(r["epoch"]), r["name"]): float(r["value"]) for r in rows} == {
        (r["epoch"], key[len("online_"):]): r[key] for r in epochs for key in ONLINE}


def test_the_head_trains_on_every_row_the_step_computed_with_the_labels_of_its_images():
    """Both views (``cat([view_a, view_b])``: the labels tiled), and a micro-batched step's
    parts, each with its own images' labels: one Adam step equals the one on those rows."""
    torch.manual_seed(0)
    encoder = torch.nn.Linear(5, 3)
    labels = torch.tensor([0, 1, 2, 1])
    view_a, view_b = torch.randn(4, 5), torch.randn(4, 5)

    def trained(calls):
        probe = OnlineProbe(3, 3, torch.device("cpu"), seed=1, knn_k=3, knn_temperature=0.1)
        probe.attach(encoder)
        with probe.capturing():
            for call in calls:
                encoder(call)
            with torch.no_grad():  # a pass without a graph (a micro-batched step's first) is not kept
                encoder(view_a)
        probe.train_step(labels)
        probe.detach()
        return probe.head

    expected = OnlineProbe(3, 3, torch.device("cpu"), seed=1, knn_k=3, knn_temperature=0.1).head
    optimizer = torch.optim.Adam(expected.parameters(), lr=PROBE_LR)
    with torch.no_grad():
        h = encoder(torch.cat([view_a, view_b]))
    torch.nn.functional.cross_entropy(expected(h), labels.repeat(2)).backward()
    optimizer.step()
    whole = trained([torch.cat([view_a, view_b])])
    parts = trained([torch.cat([view_a[:2], view_b[:2]]), torch.cat([view_a[2:], view_b[2:]])])
    for head in (whole, parts):
        torch.testing.assert_close(head.weight, expected.weight, rtol=0, atol=1e-7)
        torch.testing.assert_close(head.bias, expected.bias, rtol=0, atol=1e-7)
    # The same rows with the labels of the other view order: another head (the check can fail).
    wrong = OnlineProbe(3, 3, torch.device("cpu"), seed=1, knn_k=3, knn_temperature=0.1).head
    torch.nn.functional.cross_entropy(wrong(h), labels.repeat_interleave(2)).backward()
    torch.optim.Adam(wrong.parameters(), lr=PROBE_LR).step()
    assert not torch.allclose(wrong.weight, expected.weight)



def test_a_run_preempted_mid_epoch_resumes_to_the_uninterrupted_online_numbers_and_head(tmp_path, monkeypatch,
                                                                                        one_torch_thread):
    straight = _run(tmp_path / "straight")
    steps_per_epoch = straight["steps"] // 2
    restore = preempted_at_backward(monkeypatch, steps_per_epoch + 1)  # step 1 of epoch 2
    with pytest.raises(Preempted):
        _run(tmp_path / "stopped")
    restore()
    stopped = _checkpoint(tmp_path / "stopped")
    assert (stopped["epoch"], stopped["epoch_step"]) == (1, 1)
    assert stopped["online_probe"]["steps"] == steps_per_epoch + 1
    resumed = pretrain(tiny_config(tmp_path / "stopped", epochs=2, online_probe=True), resume=True, progress=False,
                       baselines=False)
    assert without_timings(resumed) == without_timings(straight)
    assert [{k: r[k] for k in ONLINE} for r in _records(tmp_path / "stopped")] == \
        [{k: r[k] for k in ONLINE} for r in _records(tmp_path / "straight")]
    a, b = _checkpoint(tmp_path / "straight"), _checkpoint(tmp_path / "stopped")
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    for key, value in a["online_probe"]["head"].items():
        assert torch.equal(value, b["online_probe"]["head"][key]), key


def test_a_resume_without_the_probe_state_would_end_elsewhere(tmp_path, monkeypatch, one_torch_thread):
    """The head's state is what the exact resume above rests on: dropped from the checkpoint,
    the resumed head starts again and the last epoch's probe number is not the straight run's
    head any more."""
    straight = _run(tmp_path / "straight")
    restore = preempted_at_backward(monkeypatch, straight["steps"] // 2 + 1)
    with pytest.raises(Preempted):
        _run(tmp_path / "stopped")
    restore()
    path = tmp_path / "stopped" / "checkpoints" / "last.pt"
    state = torch.load(path, map_location="cpu", weights_only=False)
    del state["online_probe"]
    from contrastkit.train.checkpoint import save_checkpoint

    save_checkpoint(str(path), state)
    pretrain(tiny_config(tmp_path / "stopped", epochs=2, online_probe=True), resume=True, progress=False,
             baselines=False)
    a, b = _checkpoint(tmp_path / "straight"), _checkpoint(tmp_path / "stopped")
    assert not torch.equal(a["online_probe"]["head"]["weight"], b["online_probe"]["head"]["weight"])


def test_it_is_on_by_default_and_off_with_no_online_probe(tmp_path, one_torch_thread):
    on = pretrain(tiny_config(tmp_path / "default"), progress=False, baselines=False)
    assert all(key in on for key in ONLINE) and all(key in _records(tmp_path / "default")[0] for key in ONLINE)
    _run(tmp_path / "off", online_probe=False, epochs=1)
    assert _records(tmp_path / "off") and not any(key.startswith("online_") for r in _records(tmp_path / "off")
                                                  for key in r)
    assert "online_probe" not in _checkpoint(tmp_path / "off")


def test_without_labels_it_is_the_view_retrieval_of_the_checkpointed_encoder_on_fixed_val_views(
        tmp_path, one_torch_thread):
    from _data_fixtures import write_collection
    from contrastkit.data import open_data
    from contrastkit.metrics.readout import held_out_views, view_retrieval
    from contrastkit.train.evaluate import readout_views

    write_collection(tmp_path / "images", damaged=())
    out = tmp_path / "unlabeled"
    config = tiny_config(out, data=str(tmp_path / "images"), data_options={"size": 16}, epochs=2,
                         loggers=["csv"])
    summary = pretrain(config, progress=False, baselines=False)
    keys = (records.ONLINE_VIEW_RETRIEVAL_TOP1, "online_view_retrieval_top5")
    epochs = _records(out)
    assert [sorted(k for k in r if k.startswith("online_")) for r in epochs] == [sorted(keys)] * 2
    assert {key: summary[key] for key in keys} == {key: epochs[-1][key] for key in keys}
    assert _checkpoint(out)["online_probe"] == {"last": {key: summary[key] for key in keys}}
    # Recomputed with the label-free read-out's own functions from the final checkpoint.
    resolved = config.resolved()
    dataset = open_data(resolved.data, seed=resolved.seed, **resolved.data_options)
    assert 2 <= len(dataset.val) < 2000
    model = build_model(resolved, dataset.image_shape, initial_weights=False)
    model.load_state_dict(_checkpoint(out)["model"])
    view_a, view_b = held_out_views(dataset.val, readout_views(resolved, dataset, torch.device("cpu")),
                                    seed=resolved.seed)
    expected = view_retrieval(*(torch.from_numpy(extract_features(model.encoder, v, torch.device("cpu")))
                                for v in (view_a, view_b)))
    assert {key: summary[key] for key in keys} == {f"online_{k}": v for k, v in expected.items()}
    with open(out / "metrics.csv", newline="", encoding="utf-8") as handle:
        rows = [r for r in csv.DictReader(handle) if r["group"] == "online"]
    assert {(int(r["epoch"]), r["name"]) for r in rows} == {(e, key[len("online_"):]) for e in (1, 2) for key in keys}


def test_a_stream_trains_the_head_on_its_batches(tmp_path, one_torch_thread):
    from _shards import write_shards

    shards = write_shards(tmp_path / "shards")
    out = tmp_path / "run"
    summary = pretrain(tiny_config(out, data=shards, data_options={"size": 16}, epochs=1, online_probe=True),
                       progress=False, baselines=False)
    state = _checkpoint(out)
    assert state["online_probe"]["steps"] == summary["steps"] > 0
    assert 0 <= summary[records.ONLINE_PROBE_ACCURACY] <= 1 and 0 <= summary[records.ONLINE_KNN_ACCURACY] <= 1


@pytest.mark.parametrize("select_by", ["online_probe", "online_knn"])
def test_select_by_an_online_number_picks_its_best_epoch_without_refitting_the_val_probe(tmp_path, one_torch_thread,
                                                                                         select_by):
    out = tmp_path / select_by
    summary = _run(out, epochs=3, eval_every=1, select_by=select_by)
    key = {"online_probe": records.ONLINE_PROBE_ACCURACY, "online_knn": records.ONLINE_KNN_ACCURACY}[select_by]
    epochs = _records(out)
    scores = [r[key] for r in epochs]
    assert summary["selection"]["metric"] == key and summary["selection"]["epochs"] == [1, 2, 3]
    assert summary["selection"]["scores"] == scores
    assert summary["selected_epoch"] == 1 + scores.index(max(scores))  # the earliest best
    assert not any("val_probe_accuracy" in r or "val_knn_accuracy" in r for r in epochs)
    assert _checkpoint(out)["selection"]["scores"] == scores  # a resumed run keeps them


def test_without_labels_the_online_view_retrieval_picks_the_epoch(tmp_path, one_torch_thread):
    from _data_fixtures import write_collection

    write_collection(tmp_path / "images", damaged=())
    out = tmp_path / "run"
    summary = _run(out, data=str(tmp_path / "images"), data_options={"size": 16}, epochs=3, eval_every=1,
                   select_by="online_view_retrieval")
    scores = [r[records.ONLINE_VIEW_RETRIEVAL_TOP1] for r in _records(out)]
    assert summary["selection"]["metric"] == records.ONLINE_VIEW_RETRIEVAL_TOP1
    assert summary["selection"]["scores"] == scores
    assert summary["selected_epoch"] == 1 + scores.index(max(scores))
    assert records.VIEW_RETRIEVAL_TOP1 in summary["selected"]  # the selected epoch's label-free read-out


@pytest.mark.parametrize("options, message", [
    ({"select_by": "online_knn"}, "picks among the eval_every epochs"),
    ({"select_by": "online_knn", "eval_every": 1, "online_probe": False}, "turns off"),
    ({"select_by": "knn"}, "select_by must be one of val_probe, online_probe"),
    ({"select_by": "online_view_retrieval", "eval_every": 1}, "is for images without labels; .* has class labels"),
])
def test_a_select_by_the_run_cannot_give_is_refused_by_name(tmp_path, options, message):
    with pytest.raises(ValueError, match=message):
        pretrain(tiny_config(tmp_path / "run", **options), progress=False, baselines=False)


def test_select_by_a_number_of_labels_on_images_without_them_is_refused(tmp_path):
    from _data_fixtures import write_collection

    write_collection(tmp_path / "images", count=12, damaged=())
    with pytest.raises(ValueError, match="online_probe needs class labels, and .* has none: select by "
                                         "online_view_retrieval"):
        pretrain(tiny_config(tmp_path / "run", data=str(tmp_path / "images"), data_options={"size": 16},
                             eval_every=1, select_by="online_probe"), progress=False, baselines=False)


def test_a_resumed_run_may_turn_the_online_read_out_on_or_off(tmp_path, one_torch_thread):
    """It does not change the encoder's training: the resumed run trains the same weights either
    way; turned on, the head starts at the resumed step."""
    class Stop(Exception):
        pass

    def stop(epoch, record):
        raise Stop

    straight = _run(tmp_path / "straight", online_probe=False)
    for first, then in ((False, True), (True, False)):
        out = tmp_path / f"{first}-{then}"
        with pytest.raises(Stop):  # after the first of 2 epochs, its checkpoint written
            pretrain(tiny_config(out, epochs=2, online_probe=first), progress=False, on_epoch_end=stop)
        steps = _checkpoint(out)["step"]
        summary = pretrain(tiny_config(out, epochs=2, online_probe=then), resume=True, progress=False,
                           baselines=False)
        assert [all(key in r for key in ONLINE) for r in _records(out)] == [first, then]
        assert all(key in summary for key in ONLINE) == then
        if then:
            assert 0 < _checkpoint(out)["online_probe"]["steps"] == summary["steps"] - steps
        assert summary["final_loss"] == straight["final_loss"]
        weights, resumed = _checkpoint(tmp_path / "straight")["model"], _checkpoint(out)["model"]
        for key, value in weights.items():
            assert torch.equal(value, resumed[key]), (first, then, key)

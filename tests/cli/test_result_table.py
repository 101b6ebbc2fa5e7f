"""The results table a run prints (``contrastkit pretrain`` / ``probe``): under each read-out, one
verdict line computed from the numbers in the table, naming the baselines the encoder beats and
those it does not: the label-free table (view retrieval top-1) as well as the labelled one."""

import pytest

from contrastkit.commands.common import print_result_table
from contrastkit.metrics.readout import LABEL_FREE_ROWS


def _label_free(top1, random_init, raw):
    summary = {"method": "simclr", "final_loss": 1.0}
    for prefix, value in (("", top1), ("random_init_", random_init), ("raw_pixel_", raw)):
        for _, key in LABEL_FREE_ROWS:
            summary[prefix + key] = 0.5
        summary[prefix + "view_retrieval_top1"] = value
    return summary


def _printed(capsys, summary):
    print_result_table(summary, "a run")
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("numbers, verdict", [
    ((0.412, 0.103, 0.25), "view retrieval top-1: the pretrained encoder (0.412) beats the random-init encoder "
                           "(0.103) and the raw pixels (0.250)"),
    ((0.2, 0.103, 0.25), "view retrieval top-1: the pretrained encoder (0.200) beats the random-init encoder "
                         "(0.103) but not the raw pixels (0.250)"),
    ((0.1, 0.103, 0.25), "view retrieval top-1: the pretrained encoder (0.100) beats neither the random-init "
                         "encoder (0.103) nor the raw pixels (0.250)"),
    ((0.25, 0.103, 0.25), "view retrieval top-1: the pretrained encoder (0.250) beats the random-init encoder "
                          "(0.103) but not the raw pixels (0.250)"),  # a tie is not a win
    ((0.2501, 0.103, 0.25), "view retrieval top-1: the pretrained encoder (0.2501) beats the random-init encoder "
                            "(0.103) and the raw pixels (0.25)"),  # equal at the table's digits: more of them
])
def test_the_label_free_table_has_a_verdict_line(capsys, numbers, verdict):
    lines = _printed(capsys, _label_free(*numbers))
    assert verdict in lines, "\n".join(lines)
    assert not any("linear probe accuracy:" in line for line in lines)  # no labels, no probe verdict


def test_both_tables_judge_a_collection_with_an_evaluation_set(capsys):
    summary = {**_label_free(0.4, 0.1, 0.2), "probe_accuracy": 0.5, "random_init_probe_accuracy": 0.6,
               "raw_pixel_probe_accuracy": 0.4}
    lines = _printed(capsys, summary)
    assert "view retrieval top-1: the pretrained encoder (0.400) beats the random-init encoder (0.100) and the " \
        "raw pixels (0.200)" in lines
    assert "linear probe accuracy: the pretrained encoder (0.500) beats the raw pixels (0.400) but not the " \
        "random-init encoder (0.600)" in lines


def test_without_baselines_there_is_no_verdict(capsys):
    summary = {"view_retrieval_top1": 0.4, "probe_accuracy": 0.5}
    lines = _printed(capsys, summary)
    assert not any("the pretrained encoder" in line for line in lines)

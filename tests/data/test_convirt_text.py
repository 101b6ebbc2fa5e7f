"""Word tokenizer (round trip, unknowns, save/load) and the text encoder's masking."""

import json

import pytest
import torch

from contrastkit.models.text import TextEncoder, WordTokenizer

TEXTS = ["a thin vertical bar in the top left, with 3 distractors.",
         "the scene shows a bold horizontal stroke; thickness medium-width.",
         "a thin bar"]


def test_vocabulary_order_and_specials():
    tok = WordTokenizer.build(TEXTS)
    assert tok.vocabulary[:2] == ["<pad>", "<unk>"]
    # "a" occurs 3 times; ".", "bar", "the", "thin" twice each; most frequent first, ties alphabetical.
    assert tok.vocabulary[2] == "a"
    assert tok.vocabulary[3:7] == [".", "bar", "the", "thin"]
    assert len(tok) == 2 + 21  # 13 distinct tokens in TEXTS[0], 8 new in TEXTS[1], none new in TEXTS[2]
    assert tok.max_length == 13  # the longest training text: a thin vertical bar in the top left , with 3 distractors .


def test_round_trip_and_unknowns():
    tok = WordTokenizer.build(TEXTS)
    for text in TEXTS:
        ids, mask = tok.encode([text])
        assert tok.decode(ids[0]) == " ".join(WordTokenizer.tokenize(text))
        assert int(mask.sum()) == len(WordTokenizer.tokenize(text))
    ids, mask = tok.encode(["A THIN zebra bar", ""])
    assert ids.shape == (2, 4)
    assert ids[0].tolist() == [tok.index["a"], tok.index["thin"], 1, tok.index["bar"]]
    assert ids[1].tolist() == [0, 0, 0, 0] and not mask[1].any()
    assert tok.decode(ids[0]) == "a thin <unk> bar"
    assert tok.unknown_fraction(["a zebra"]) == 0.5
    assert WordTokenizer.tokenize("medium-width, isn't it?") == ["medium-width", ",", "isn't", "it", "?"]


def test_truncation_to_max_length():
    tok = WordTokenizer.build(["a b c"], max_length=2)
    ids, _ = tok.encode(["a b c a b"])
    assert ids.shape == (1, 2)


def test_save_load_gives_identical_ids(tmp_path):
    tok = WordTokenizer.build(TEXTS)
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    loaded = WordTokenizer.load(path)
    assert loaded.vocabulary == tok.vocabulary and loaded.max_length == tok.max_length
    probe = TEXTS + ["unseen words here"]
    assert torch.equal(loaded.encode(probe)[0], tok.encode(probe)[0])
    assert json.loads(path.read_text())["vocabulary"][:2] == ["<pad>", "<unk>"]


def test_malformed_tokenizer_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json is malformed"):
        WordTokenizer.load(bad)
    bad.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ValueError, match="malformed"):
        WordTokenizer.load(bad)
    with pytest.raises(FileNotFoundError):
        WordTokenizer.load(tmp_path / "absent.json")
    with pytest.raises(ValueError, match="no texts"):
        WordTokenizer.build([])
    with pytest.raises(TypeError, match="single string"):
        WordTokenizer.build(TEXTS).encode("a thin bar")


@pytest.mark.parametrize("kind", ["transformer", "mean"])
def test_padding_does_not_change_the_encoding(kind):
    torch.manual_seed(0)
    tok = WordTokenizer.build(TEXTS)
    encoder = TextEncoder(len(tok), width=16, kind=kind, heads=2).eval()
    short, short_mask = tok.encode(["a thin bar"])
    batch, batch_mask = tok.encode(["a thin bar", TEXTS[0]])  # pads the first row to 13 tokens
    with torch.no_grad():
        alone = encoder(short, short_mask)
        padded = encoder(batch, batch_mask)[:1]
    assert alone.shape == (1, 16)
    assert torch.allclose(alone, padded, atol=1e-5)
    with torch.no_grad():
        empty = encoder(*tok.encode([""]))
    assert torch.equal(empty, torch.zeros(1, 16))


def test_mean_encoder_is_the_mean_of_embeddings():
    tok = WordTokenizer.build(TEXTS)
    encoder = TextEncoder(len(tok), width=8, kind="mean")
    ids, mask = tok.encode(["a thin bar"])
    expected = encoder.embedding.weight[ids[0]].mean(0)
    assert torch.allclose(encoder(ids, mask)[0], expected)

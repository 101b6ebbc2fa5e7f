"""The text side of image-text models: a word-level tokenizer and small text encoders.

* :class:`WordTokenizer` -- lower-cased words and punctuation marks, vocabulary built from
  training texts, ``<pad>`` = 0 and ``<unk>`` = 1, saved / loaded as JSON.
* :class:`TextEncoder` -- token embedding (+ learned positions) followed by either a small
  transformer encoder (``"transformer"``) or nothing (``"mean"``), then a masked mean over the
  real (non-pad) tokens: ``(N, L)`` ids -> ``(N, width)``.

Everything is trained from scratch; plain torch.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

__all__ = ["WordTokenizer", "TextEncoder", "TEXT_ENCODERS", "PAD", "UNK"]

PAD, UNK = "<pad>", "<unk>"
_TOKEN = re.compile(r"[a-z0-9]+(?:[-'][a-z0-9]+)*|[^\sa-z0-9]")
_FORMAT = "contrastkit-word-tokenizer"


class WordTokenizer:
    """Word-level tokenizer: ``text.lower()`` split into words (letters/digits, inner ``-``/``'``
    kept) and single punctuation marks; ids ``0 = <pad>``, ``1 = <unk>``, then the vocabulary
    in order of decreasing training frequency (ties alphabetical).

    Example:
        >>> tok = WordTokenizer.build(["a thin bar.", "a thick bar"])
        >>> tok.tokenize("A thin, bar")
        ['a', 'thin', ',', 'bar']
        >>> tok.decode(tok.encode(["a thin bar."])[0][0])
        'a thin bar .'
    """

    def __init__(self, vocabulary: Sequence[str], max_length: int = 48) -> None:
        vocabulary = list(vocabulary)
        if vocabulary[:2] != [PAD, UNK]:
            raise ValueError(f"vocabulary must start with {PAD!r}, {UNK!r}, got {vocabulary[:2]}")
        if len(set(vocabulary)) != len(vocabulary):
            raise ValueError("vocabulary holds duplicate tokens")
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
            raise ValueError(f"max_length must be an integer >= 1, got {max_length!r}")
        self.vocabulary = vocabulary
        self.index: Dict[str, int] = {token: i for i, token in enumerate(vocabulary)}
        self.max_length = max_length

    @staticmethod
    def tokenize(text: str) -> List[str]:
        """Lower-cased words and punctuation marks of ``text``."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a string, got {type(text).__name__}")
        return _TOKEN.findall(text.lower())

    @classmethod
    def build(cls, texts: Iterable[str], *, min_count: int = 1, max_size: Optional[int] = None,
              max_length: Optional[int] = None) -> "WordTokenizer":
        """Vocabulary of the tokens seen at least ``min_count`` times in ``texts`` (at most
        ``max_size`` of them, most frequent first). ``max_length`` (tokens per text after
        :meth:`encode` truncation) defaults to the longest training text, at least 1."""
        counts: Counter = Counter()
        longest = 1
        n = 0
        for text in texts:
            tokens = cls.tokenize(text)
            counts.update(tokens)
            longest = max(longest, len(tokens))
            n += 1
        if n == 0:
            raise ValueError("cannot build a vocabulary from no texts")
        if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
            raise ValueError(f"min_count must be an integer >= 1, got {min_count!r}")
        words = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
        if max_size is not None:
            if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1:
                raise ValueError(f"max_size must be an integer >= 1, got {max_size!r}")
            words = words[:max_size]
        return cls([PAD, UNK] + words, max_length=longest if max_length is None else max_length)

    def __len__(self) -> int:
        return len(self.vocabulary)

    @property
    def pad_id(self) -> int:
        return 0

    @property
    def unk_id(self) -> int:
        return 1

    def encode(self, texts: Sequence[str]) -> Tuple[Tensor, Tensor]:
        """``(ids, mask)``: ``(N, L)`` int64 token ids (unknown -> ``<unk>``, padded with
        ``<pad>``, truncated to ``max_length``) and the ``(N, L)`` bool mask of real tokens.
        ``L`` is the longest encoded text of the batch (at least 1)."""
        if isinstance(texts, str):
            raise TypeError("encode takes a list of texts, got a single string")
        rows = [[self.index.get(t, 1) for t in self.tokenize(text)][: self.max_length] for text in texts]
        width = max([1] + [len(r) for r in rows])
        ids = torch.zeros((len(rows), width), dtype=torch.int64)
        for i, row in enumerate(rows):
            if row:
                ids[i, : len(row)] = torch.tensor(row, dtype=torch.int64)
        return ids, ids != 0

    def decode(self, ids: Union[Tensor, Sequence[int]]) -> str:
        """Tokens of ``ids`` (pads dropped) joined by single spaces."""
        values = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        return " ".join(self.vocabulary[i] for i in values if i != 0)

    def unknown_fraction(self, texts: Sequence[str]) -> float:
        """Fraction of the tokens of ``texts`` that map to ``<unk>``."""
        tokens = [t for text in texts for t in self.tokenize(text)]
        return sum(t not in self.index for t in tokens) / max(1, len(tokens))

    def to_dict(self) -> dict:
        return {"format": _FORMAT, "version": 1, "max_length": self.max_length, "vocabulary": self.vocabulary}

    @classmethod
    def from_dict(cls, data: dict) -> "WordTokenizer":
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise ValueError("not a contrastkit word tokenizer")
        return cls(data["vocabulary"], max_length=int(data["max_length"]))

    def save(self, path: Union[str, os.PathLike]) -> None:
        """Write the tokenizer as JSON (atomically)."""
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(self.to_dict(), handle, indent=1)
            handle.write("\n")
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "WordTokenizer":
        """Read a tokenizer written by :meth:`save`; ``ValueError`` naming ``path`` if malformed."""
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no tokenizer file at {path}")
        try:
            with open(path, encoding="utf-8") as handle:
                return cls.from_dict(json.load(handle))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise ValueError(f"tokenizer file {path} is malformed: {err}") from None


TEXT_ENCODERS = ("transformer", "mean")


class TextEncoder(nn.Module):
    """Token ids -> text representation ``h``.

    Args:
        vocab_size: number of token ids (``len(tokenizer)``); id 0 is padding.
        width: embedding and output size.
        kind: ``"transformer"`` (pre-norm ``nn.TransformerEncoder``, ``layers`` layers,
            ``heads`` heads, feed-forward ``2 * width``, padding masked out) or ``"mean"``
            (the embeddings alone).
        max_length: number of learned positions (``"transformer"`` only).

    ``forward(ids, mask)`` with ``ids`` ``(N, L)`` int64 and ``mask`` ``(N, L)`` bool (real
    tokens) returns ``(N, width)``: the mean over real tokens (an all-pad row gives zeros).
    """

    def __init__(self, vocab_size: int, *, width: int = 128, kind: str = "transformer", layers: int = 2,
                 heads: int = 4, max_length: int = 64, dropout: float = 0.0) -> None:
        super().__init__()
        if kind not in TEXT_ENCODERS:
            raise ValueError(f"kind must be one of {TEXT_ENCODERS}, got {kind!r}")
        if min(vocab_size, width, layers, heads, max_length) < 1:
            raise ValueError("vocab_size, width, layers, heads and max_length must be >= 1")
        if kind == "transformer" and width % heads:
            raise ValueError(f"width ({width}) must be divisible by heads ({heads})")
        self.kind = kind
        self.out_dim = width
        self.max_length = max_length
        self.embedding = nn.Embedding(vocab_size, width, padding_idx=0)
        if kind == "transformer":
            self.position = nn.Parameter(torch.zeros(max_length, width))
            nn.init.normal_(self.position, std=0.02)
            layer = nn.TransformerEncoderLayer(width, heads, dim_feedforward=2 * width, dropout=dropout,
                                               batch_first=True, norm_first=True)
            self.transformer = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(width)

    def forward(self, ids: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        if ids.dim() != 2 or ids.dtype != torch.int64:
            raise ValueError(f"ids must be an (N, L) int64 tensor, got {ids.dtype} {tuple(ids.shape)}")
        mask = ids != 0 if mask is None else mask
        if ids.shape[1] > self.max_length:
            ids, mask = ids[:, : self.max_length], mask[:, : self.max_length]
        x = self.embedding(ids)
        if self.kind == "transformer":
            x = x + self.position[: ids.shape[1]]
            # Rows without any real token would make attention softmax over nothing (NaN):
            # let them attend to position 0; their pooled output is zeroed below anyway.
            attend = mask.clone()
            attend[:, 0] = True
            x = self.norm(self.transformer(x, src_key_padding_mask=~attend))
        weights = mask.unsqueeze(-1).to(x.dtype)
        return (x * weights).sum(1) / weights.sum(1).clamp(min=1.0)

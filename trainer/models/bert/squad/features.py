"""SQuAD features as Hugging Face's ``run_qa`` builds them: ``[CLS] question [SEP] context window [SEP]``, padded.

    tokenizer = build_tokenizer(TokenizerConfig(tokenizer_type="BertWordPieceLowerCase", vocab_file="vocab.txt"))
    features = build_features(examples, tokenizer.backend, FeatureOptions(max_seq_length=384, doc_stride=128))

The question is cut to ``max_query_length`` tokens; a long context is cut into windows that overlap by
``doc_stride`` tokens (``run_qa``'s ``stride``), each a feature. Every context token keeps its character
offsets in the context (the WordPiece tokenizer's own offsets: characters, so Chinese text without spaces
maps back exactly), so an answer span of tokens is a span of the original text. A training feature's
labels are the token positions of the first gold answer, or [CLS] (position 0) when the window does not
hold it whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainer.models.bert.squad.examples import QAExample, SquadFormatError

# [CLS] and the two [SEP].
SPECIAL_POSITIONS = 3
# Token types: question (with [CLS] and its [SEP]) 0, context window (with its [SEP]) 1.
QUESTION_TYPE, CONTEXT_TYPE = 0, 1
# A position outside the context (question, specials, padding) has no characters.
NO_OFFSET = (-1, -1)


@dataclass(frozen=True, kw_only=True, slots=True)
class FeatureOptions:
    """Feature sizes (``run_qa``'s flags and defaults)."""

    max_seq_length: int = 384
    doc_stride: int = 128
    """Tokens shared by consecutive windows of a long context."""
    max_query_length: int = 64

    def __post_init__(self) -> None:
        for name in ("max_seq_length", "doc_stride", "max_query_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_seq_length - self.max_query_length - SPECIAL_POSITIONS <= self.doc_stride:
            raise ValueError(f"max_seq_length ({self.max_seq_length}) leaves no more room for the context than "
                             f"doc_stride ({self.doc_stride}) after the question ({self.max_query_length}) and "
                             f"{SPECIAL_POSITIONS} special tokens")


@dataclass(frozen=True, slots=True)
class QAFeature:
    """One window of one example; arrays int64 [max_seq_length]."""

    example_index: int
    tokens: np.ndarray
    token_types: np.ndarray
    padding_mask: np.ndarray
    offsets: tuple[tuple[int, int], ...]
    """Per position: the (start, end) characters of its context token, `NO_OFFSET` elsewhere."""
    start_position: int
    end_position: int
    """Training labels: the gold answer's first and last token positions (0, 0: not in this window)."""


def _special_ids(backend) -> tuple[int, int, int]:
    ids = [backend.token_to_id(piece) for piece in ("[CLS]", "[SEP]", "[PAD]")]
    if None in ids:
        raise SquadFormatError("the WordPiece vocabulary needs [CLS], [SEP] and [PAD]")
    return ids[0], ids[1], ids[2]


def _windows(num_tokens: int, room: int, doc_stride: int) -> list[tuple[int, int]]:
    """[begin, end) token ranges of the context windows: ``room`` tokens each, overlapping by ``doc_stride``."""
    windows, begin = [], 0
    while True:
        end = min(begin + room, num_tokens)
        windows.append((begin, end))
        if end == num_tokens:
            return windows
        begin = end - doc_stride


def _answer_tokens(offsets: list[tuple[int, int]], answer: tuple[str, int]) -> tuple[int, int]:
    """The first and last context tokens overlapping the answer's characters."""
    text, start_char = answer
    end_char = start_char + len(text)
    covered = [i for i, (begin, end) in enumerate(offsets) if begin < end_char and end > start_char]
    return (covered[0], covered[-1]) if covered else (-1, -1)


def example_features(example: QAExample, example_index: int, backend, options: FeatureOptions) -> list[QAFeature]:
    """The features (windows) of one example; ``backend`` is a `tokenizers` BertWordPieceTokenizer."""
    cls_id, sep_id, pad_id = _special_ids(backend)
    question = backend.encode(example.question, add_special_tokens=False).ids[:options.max_query_length]
    context = backend.encode(example.context, add_special_tokens=False)
    offsets = [tuple(o) for o in context.offsets]
    room = options.max_seq_length - len(question) - SPECIAL_POSITIONS
    answer = _answer_tokens(offsets, example.answers[0]) if example.answers else (-1, -1)
    features = []
    for begin, end in _windows(len(context.ids), room, options.doc_stride):
        ids = [cls_id, *question, sep_id, *context.ids[begin:end], sep_id]
        first_context = len(question) + 2
        length = len(ids)
        pad = options.max_seq_length - length
        types = [QUESTION_TYPE] * first_context + [CONTEXT_TYPE] * (length - first_context)
        position_offsets = [NO_OFFSET] * first_context + offsets[begin:end] + [NO_OFFSET] * (pad + 1)
        start = end_position = 0
        if begin <= answer[0] and answer[1] < end:
            start, end_position = answer[0] - begin + first_context, answer[1] - begin + first_context
        features.append(QAFeature(
            example_index=example_index, tokens=np.array(ids + [pad_id] * pad, np.int64),
            token_types=np.array(types + [QUESTION_TYPE] * pad, np.int64),
            padding_mask=np.array([1] * length + [0] * pad, np.int64), offsets=tuple(position_offsets),
            start_position=start, end_position=end_position))
    return features


def build_features(examples: list[QAExample], backend, options: FeatureOptions) -> list[QAFeature]:
    """The features of every example, in order (an example's windows one after the other)."""
    return [feature for index, example in enumerate(examples)
            for feature in example_features(example, index, backend, options)]

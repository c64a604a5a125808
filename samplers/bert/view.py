"""The BERT sample kind of `inspect-index`'s training view: sample counts and masked-LM (+ sentence-order)
samples of each split of one sentence-split WordPiece dataset, as plain dicts and as text (see `samplers.view`).

A sample is shown as training reads it: [CLS] A [SEP] B [SEP] after masking, the masked positions with the
tokens they predict, and the sentence-order label (``is_random``: A and B swapped).
"""

from __future__ import annotations

import numpy as np

from ..view import TrainingViewConfig, ViewTokens, ViewVocabulary, format_view_splits
from .dataset import BertDataset, BertDatasetConfig, build_bert_datasets
from .masking import masking_options

PAD_PIECE = "[PAD]"
BERT_EXTRA_IDS = 0
"""BERT runs append no sentinels (Megatron's pretrain_bert.py: ``--vocab-extra-ids`` 0)."""
UNNAMED_PIECE = ""
"""The piece of an id the vocabulary does not name (never a ``##`` continuation)."""


def vocabulary_pieces(vocabulary: ViewVocabulary) -> list[str]:
    """The piece of every id < vocabulary.size, in id order (what `masking_options` takes)."""
    pieces = [UNNAMED_PIECE] * vocabulary.size
    for piece, token_id in vocabulary.names.items():
        if 0 <= token_id < vocabulary.size:
            pieces[token_id] = piece
    return pieces


def _sample_dict(dataset: BertDataset, sample_id: int, pieces: list[str]) -> dict:
    """Sample `sample_id` as training reads it, unpadded: int lists and the pieces as text."""
    item = dataset[sample_id]
    # Positions after the last real token are padding (a masked-in pad id inside the sample is not).
    length = int(np.flatnonzero(item["padding_mask"])[-1]) + 1
    positions = np.flatnonzero(item["loss_mask"]).tolist()
    tokens = item["text"][:length].tolist()
    labels = item["labels"][positions].tolist()
    return {"tokens": tokens, "types": item["types"][:length].tolist(), "masked_positions": positions,
            "labels": labels, "is_random": item["is_random"], "truncated": item["truncated"],
            "text": " ".join(pieces[t] for t in tokens),
            "predictions": " ".join(f"{p}:{pieces[label]}" for p, label in zip(positions, labels))}


def training_view(data: str, config: TrainingViewConfig, view_tokens: ViewTokens) -> list[dict | None]:
    """What a ``train --model bert`` run sees of each split: sample counts and masked samples.

    Args:
        data: sentence-split WordPiece dataset prefix.
        config: the sampling configuration (``model`` bert; ``mask_prob``, ``binary_head``).
        view_tokens: the run's tokenizer (its pieces: [CLS], [SEP], [MASK], [PAD] and ``##`` continuations).

    Returns:
        One entry per split: None when absent, else {"split", "document_range", "num_samples", "samples":
        {id: {"tokens", "types", "masked_positions", "labels", "is_random", "truncated", "text",
        "predictions"}}}: tokens and types unpadded, labels the ids the masked positions predict, text the
        pieces of the tokens, predictions "position:piece" of each label.

    Raises:
        TokenmillError: damaged dataset, or a tokenizer without a known special-token convention.
        ValueError: a vocabulary without [CLS], [SEP], [MASK] or [PAD], or bad sample options.
    """
    vocabulary = view_tokens.vocabulary(BERT_EXTRA_IDS)
    pieces = vocabulary_pieces(vocabulary)
    if PAD_PIECE not in vocabulary.names:
        raise ValueError(f"a BERT vocabulary needs the piece {PAD_PIECE}")
    dataset_config = BertDatasetConfig(data_prefix=data, masking=masking_options(pieces, config.mask_prob),
                                       pad_id=vocabulary.names[PAD_PIECE], split=config.split,
                                       sequence_length=config.sequence_length, binary_head=config.binary_head,
                                       random_seed=config.seed, path_to_cache=config.path_to_cache)
    view: list[dict | None] = []
    for dataset in build_bert_datasets(dataset_config, config.sizes):
        if dataset is None:
            view.append(None)
            continue
        samples = {i: _sample_dict(dataset, i, pieces) for i in config.sample_ids if -len(dataset) <= i < len(dataset)}
        view.append({"split": dataset.split, "document_range": list(dataset.document_range),
                     "num_samples": len(dataset), "samples": samples})
    return view


def format_training_view(view: list[dict | None], config: TrainingViewConfig) -> str:
    """The text `inspect-index --model bert` prints for a BERT training view."""
    head = "sentence order" if config.binary_head else "no binary head"
    title = (f"training view   bert, seq-length {config.sequence_length}, mask-prob {config.mask_prob}, {head}, "
             f"split {config.split}, seed {config.seed}")

    def render(name: str, sample_id: int, sample: dict) -> str:
        order = f"is_random {sample['is_random']}" if config.binary_head else "no sentence order"
        return (f"--- {name} sample {sample_id} ({order}, truncated {sample['truncated']}) ---\n"
                f"input:  {sample['text']}\nmasked: {sample['predictions']}")

    return format_view_splits(title, view, render)

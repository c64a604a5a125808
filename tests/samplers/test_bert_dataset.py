"""BERT samples are megatron-core 0.16.1's, sample for sample, and behave as its masking rules say."""

from __future__ import annotations

import numpy as np
import pytest
from bert_golden import (
    GOLDEN_FILE,
    ITEM_KEYS,
    MASK_PROB,
    SEED,
    SEQUENCE_LENGTH,
    SHORT_SEQ_PROB,
    SIZES,
    SPLIT,
    vocabulary,
    write_bert_corpus,
)

from samplers.bert.dataset import BertDatasetConfig, build_bert_datasets
from samplers.bert.masking import MaskingOptions, mask_tokens, masking_options, word_candidates
from samplers.t5.indices import build_t5_sample_index, shuffle_rows, t5_walk_reference

PIECES = vocabulary() + ["[BOS]", "[EOS]"]  # what Megatron's BertWordPieceLowerCase holds
PAD = 0


def bert_config(prefix: str, cache, binary_head: bool = True, **overrides) -> BertDatasetConfig:
    options = dict(data_prefix=prefix, masking=masking_options(PIECES, MASK_PROB), pad_id=PAD, split=SPLIT,
                   sequence_length=SEQUENCE_LENGTH, short_seq_prob=SHORT_SEQ_PROB, binary_head=binary_head,
                   random_seed=SEED, path_to_cache=str(cache))
    return BertDatasetConfig(**(options | overrides))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    return write_bert_corpus(tmp_path_factory.mktemp("bert") / "corpus")


@pytest.mark.parametrize("binary_head", [True, False])
def test_samples_are_megatron_cores_sample_for_sample(corpus, tmp_path, binary_head):
    golden = np.load(GOLDEN_FILE)
    datasets = build_bert_datasets(bert_config(corpus, tmp_path, binary_head), SIZES)
    for split, dataset in zip(("train", "valid"), datasets):
        key = f"{'binary' if binary_head else 'mlm'}-{split}"
        np.testing.assert_array_equal(dataset.sample_index, golden[f"{key}-sample_index"], err_msg=key)
        items = [dataset[i] for i in range(len(dataset))]
        for name in ITEM_KEYS:
            ours = np.stack([np.asarray(item[name]) for item in items])
            np.testing.assert_array_equal(ours, golden[f"{key}-{name}"], err_msg=f"{key} {name}")
    assert golden["binary-train-is_random"].any() and golden["binary-train-truncated"].any()


def test_sample_index_with_two_sentences_matches_the_reference_walk():
    rng = np.random.RandomState(3)
    counts = rng.randint(0, 6, size=30)
    document_indices = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    lengths = rng.randint(1, 30, size=int(counts.sum())).astype(np.int32)
    args = (document_indices, lengths, (0, 30), 50, 25, 0.2, 7)
    index = build_t5_sample_index(*args, min_sentences=2)
    expected = t5_walk_reference(*args, min_sentences=2)
    shuffle_rows(expected, 7)
    np.testing.assert_array_equal(index, expected)
    assert (index[:, 1] - index[:, 0] >= 2).all()


def options(**overrides) -> MaskingOptions:
    return masking_options(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "##b", "##c", "d", "e"], **overrides)


def test_whole_word_candidates_join_continuation_pieces_and_skip_cls_sep():
    tokens = [2, 5, 6, 7, 8, 3, 9, 6, 3]
    assert word_candidates(tokens, options()) == [[1, 2, 3], [4], [6, 7]]
    assert word_candidates(tokens, options(whole_word=False)) == [[1], [2], [3], [4], [6], [7]]


def test_masking_budget_whole_words_and_replacements():
    rng = np.random.RandomState(0)
    tokens = [2] + [5, 6, 7, 8, 9] * 20 + [3]
    counts = {"mask": 0, "kept": 0, "random": 0}
    for _ in range(50):
        masked, positions, labels = mask_tokens(tokens, len(tokens), options(), rng)
        assert len(positions) <= round(0.15 * len(tokens))
        assert positions == sorted(positions) and labels == [tokens[p] for p in positions]
        chosen = set(positions)
        for start in range(1, len(tokens) - 1, 5):  # a word is masked whole or not at all
            assert {start, start + 1, start + 2} <= chosen or not {start, start + 1, start + 2} & chosen
        for p in positions:
            kind = "mask" if masked[p] == 4 else "kept" if masked[p] == tokens[p] else "random"
            counts[kind] += 1
        assert all(masked[p] == tokens[p] for p in range(len(tokens)) if p not in chosen)
    total = sum(counts.values())
    assert 0.75 < counts["mask"] / total < 0.85 and 0.05 < counts["kept"] / total < 0.17


def test_items_are_cls_a_sep_b_sep_with_types_and_padding(corpus, tmp_path):
    train = build_bert_datasets(bert_config(corpus, tmp_path), SIZES)[0]
    for idx in range(len(train)):
        item = train[idx]
        length = int(item["padding_mask"].sum())
        text, types = item["text"], item["types"]
        assert text[0] == 2 and text[length - 1] == 3 and (text[length:] == PAD).all()
        first_sep = int(np.flatnonzero(text == 3)[0]) if (types[:length] == 0).all() else \
            int(np.flatnonzero(types == 1)[0]) - 1
        assert text[first_sep] == 3 and (types[: first_sep + 1] == 0).all() and (types[first_sep + 1 : length] == 1).all()
        assert length <= SEQUENCE_LENGTH and int(item["loss_mask"].sum()) == int((item["labels"] >= 0).sum())


def test_samples_are_deterministic_and_cached(corpus, tmp_path):
    first = build_bert_datasets(bert_config(corpus, tmp_path), SIZES)[0]
    cached = sorted(p.name for p in tmp_path.iterdir())
    assert any(name.endswith(".done") for name in cached)
    again = build_bert_datasets(bert_config(corpus, tmp_path), SIZES)[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == cached
    for idx in (0, 5, len(first) - 1):
        for name in ITEM_KEYS:
            np.testing.assert_array_equal(np.asarray(first[idx][name]), np.asarray(again[idx][name]))
    other_seed = build_bert_datasets(bert_config(corpus, tmp_path, random_seed=SEED + 1), SIZES)[0]
    assert not np.array_equal(other_seed.sample_index, first.sample_index)


def test_config_rejects_bad_values(corpus, tmp_path):
    with pytest.raises(ValueError, match="sequence_length must be >= 5"):
        bert_config(corpus, tmp_path, sequence_length=4)
    with pytest.raises(ValueError, match="short_seq_prob"):
        bert_config(corpus, tmp_path, short_seq_prob=1.5)
    with pytest.raises(ValueError, match=r"needs the pieces \[MASK\]"):
        masking_options(["[CLS]", "[SEP]"])

"""T5 span-corruption samples: packing of whole sentences, exact reconstruction, noise statistics, limits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from indexed_dataset import IndexedDatasetWriter
from samplers.t5.dataset import T5DatasetConfig, build_t5_datasets, format_t5_ids, inspect_t5_splits
from samplers.t5.indices import (
    LONG_SENTENCE_LEN,
    _mt32_next,
    _mt32_seed,
    _mt64_next,
    _mt64_seed,
    build_t5_sample_index,
    shuffle_rows,
    t5_walk_reference,
)
from samplers.t5.masking import corrupt_spans, random_spans_noise_mask

VOCAB_SIZE = 1000
NUM_SENTINELS = 100
# Megatron's vocab_extra_ids: sentinels appended after the vocabulary, <extra_id_k> = vocab + k.
SENTINELS = tuple(range(VOCAB_SIZE, VOCAB_SIZE + NUM_SENTINELS))
PAD, EOS = 0, 1
FIRST_WORD = 2


def write_sentence_dataset(prefix: Path, num_documents: int, seed: int) -> str:
    """A dataset of `num_documents` documents of 0-12 sentences of 1-60 random word ids."""
    rng = np.random.RandomState(seed)
    sentences_per_doc = rng.randint(0, 13, size=num_documents)
    lengths = rng.randint(1, 61, size=int(sentences_per_doc.sum()))
    tokens = rng.randint(FIRST_WORD, VOCAB_SIZE, size=int(lengths.sum()))
    with IndexedDatasetWriter(str(prefix), np.uint16) as writer:
        writer.add_documents(tokens.astype(np.uint16), lengths, sentences_per_doc)
    return str(prefix)


@pytest.fixture(scope="module")
def sentence_dataset(tmp_path_factory) -> str:
    return write_sentence_dataset(tmp_path_factory.mktemp("t5") / "corpus_text_sentence", 200, seed=0)


def make_config(prefix: str, tmp_path: Path, **overrides) -> T5DatasetConfig:
    options = dict(data_prefix=prefix, sentinel_ids=SENTINELS, pad_id=PAD, decoder_start_id=PAD, eos_id=EOS,
                   split="90,10,0", encoder_seq_length=128, decoder_seq_length=40, path_to_cache=str(tmp_path))
    return T5DatasetConfig(**(options | overrides))


def rebuild(encoder_input: np.ndarray, decoder_target: np.ndarray) -> np.ndarray:
    """The original tokens: every sentinel of the encoder input replaced by what follows it in the target."""
    sentinel_set = set(SENTINELS)
    spans: dict[int, list[int]] = {}
    current = None
    for token in decoder_target[:-1].tolist():  # the last target token is EOS
        if token in sentinel_set:
            current = token
            spans[current] = []
        else:
            spans[current].append(token)
    out: list[int] = []
    for token in encoder_input.tolist():
        out.extend(spans[token] if token in sentinel_set else [token])
    return np.array(out, dtype=np.int64)


@st.composite
def documents(draw):
    """(document_indices, sentence lengths) of up to 12 documents with up to 6 sentences each."""
    counts = draw(st.lists(st.integers(0, 6), min_size=1, max_size=12))
    lengths = draw(st.lists(st.integers(1, 40), min_size=sum(counts), max_size=sum(counts)))
    if draw(st.booleans()) and lengths:
        lengths[draw(st.integers(0, len(lengths) - 1))] = LONG_SENTENCE_LEN + 1
    return np.concatenate(([0], np.cumsum(counts))).astype(np.int64), np.array(lengths, dtype=np.int32)


@settings(max_examples=60, deadline=None)
@given(documents(), st.integers(2, 64), st.sampled_from([0.0, 0.1, 0.5, 1.0]), st.integers(0, 2**31),
       st.one_of(st.none(), st.integers(1, 40)))
def test_sample_index_kernel_matches_reference(docs, max_length, short_prob, seed, num_samples):
    document_indices, lengths = docs
    document_range = (0, len(document_indices) - 1)
    args = (document_indices, lengths, document_range, num_samples, max_length, short_prob, seed)
    expected = t5_walk_reference(*args)
    shuffle_rows(expected, seed)
    np.testing.assert_array_equal(build_t5_sample_index(*args), expected)


def test_generators_are_the_cpp_standard_ones():
    # [rand.predef]: the 10000th output of a default-constructed (seed 5489) engine.
    mt32, mt64 = _mt32_seed(5489), _mt64_seed(5489)
    assert [int(_mt32_next(mt32)) for _ in range(10000)][-1] == 4123659995
    assert [int(_mt64_next(mt64)) for _ in range(10000)][-1] == 9981545732273789042


# megatron-core 0.16.1's helpers_cpp.build_mapping(docs, sizes, 2**31 - 2, 30, 40, 0.25, 1234, False, 1)
# on the documents below (the compiled helpers of the megatron-core wheel, run once to record this).
MEGATRON_COUNTS = [1, 2, 0, 4, 4, 3, 4, 4, 2, 3, 0, 1]
MEGATRON_SIZES = [8, 1, 8, 16, 21, 2, 17, 7, 26, 5, 20, 17, 29, 18, 27, 10, 21, 16, 16, 21, 10, 7, 23, 26, 9, 22, 1, 16]
MEGATRON_ROWS = [[9, 11, 40], [18, 22, 40], [22, 24, 40], [7, 9, 11], [9, 11, 40], [14, 18, 40], [4, 7, 40],
                 [1, 3, 40], [0, 1, 40], [24, 27, 40], [18, 22, 40], [18, 22, 40], [3, 4, 11], [1, 3, 11],
                 [7, 9, 26], [27, 28, 40], [11, 14, 40], [7, 11, 40], [3, 7, 40], [27, 28, 40], [24, 27, 40],
                 [0, 1, 26], [22, 24, 40], [11, 14, 40], [24, 27, 26], [22, 24, 40], [0, 1, 40], [14, 18, 40],
                 [1, 3, 37], [14, 15, 10], [15, 18, 40], [27, 28, 40], [11, 14, 40], [3, 7, 40]]


def test_sample_index_is_megatrons_row_for_row():
    document_indices = np.concatenate(([0], np.cumsum(MEGATRON_COUNTS))).astype(np.int64)
    index = build_t5_sample_index(document_indices, np.array(MEGATRON_SIZES, np.int32), (0, len(MEGATRON_COUNTS)),
                                  num_samples=30, max_seq_length=40, short_seq_prob=0.25, seed=1234)
    assert index.tolist() == MEGATRON_ROWS


@settings(max_examples=40, deadline=None)
@given(documents(), st.integers(2, 64), st.integers(0, 1000))
def test_samples_are_whole_sentences_of_one_document(docs, max_length, seed):
    document_indices, lengths = docs
    document_range = (0, len(document_indices) - 1)
    index = build_t5_sample_index(document_indices, lengths, document_range, None, max_length, 0.1, seed)
    document_of = np.searchsorted(document_indices, np.arange(len(lengths)), side="right") - 1
    covered = np.zeros(len(lengths), dtype=int)
    for first, end, target in index:
        assert first < end and document_of[first] == document_of[end - 1]
        assert 2 <= target <= max_length
        covered[first:end] += 1
    # One epoch covers every sentence exactly once, except documents skipped for a long sentence.
    for doc in range(len(document_indices) - 1):
        sentences = slice(document_indices[doc], document_indices[doc + 1])
        skipped = document_indices[doc + 1] - document_indices[doc] > 1 and lengths[sentences].max() > LONG_SENTENCE_LEN
        assert set(covered[sentences]) <= ({0} if skipped else {1})


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 300), st.integers(0, 2**32 - 1))
def test_encoder_input_and_target_rebuild_the_tokens(length, seed):
    tokens = np.random.RandomState(seed).randint(FIRST_WORD, VOCAB_SIZE, size=length)
    noise = random_spans_noise_mask(length, 0.15, 3.0, np.random.RandomState(seed))
    encoder, target = corrupt_spans(tokens, noise, np.array(SENTINELS))
    np.testing.assert_array_equal(rebuild(encoder, np.append(target, EOS)), tokens)
    assert len(encoder) + len(target) == length + 2 * np.count_nonzero(encoder >= VOCAB_SIZE)


def test_noise_density_and_span_length_over_many_samples(sentence_dataset, tmp_path):
    config = make_config(sentence_dataset, tmp_path, short_seq_prob=0.0)
    train, _, _ = build_t5_datasets(config, sizes=(400, None, None))
    noise_tokens = total_tokens = 0
    span_lengths: list[int] = []
    for idx in range(len(train)):
        view = train.view(idx)
        n, noise = len(view.tokens), int(view.noise_mask.sum())
        if n >= 2:
            # Exact per sample up to rounding (and the clip to [1, n - 1]).
            assert abs(noise - 0.15 * n) <= max(0.5, 1 - 0.15 * n) + 1e-9
        noise_tokens += noise
        total_tokens += n
        edges = np.diff(np.concatenate(([0], view.noise_mask.astype(int), [0])))
        span_lengths += (np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)).tolist()
    assert abs(noise_tokens / total_tokens - 0.15) < 0.01
    assert abs(np.mean(span_lengths) - 3.0) < 0.3


def test_items_respect_limits_and_masks(sentence_dataset, tmp_path):
    config = make_config(sentence_dataset, tmp_path)
    train, valid, test = build_t5_datasets(config, sizes=(300, 20, None))
    assert test is None and len(train) >= 300 and len(valid) >= 20
    for dataset in (train, valid):
        for idx in range(0, len(dataset), 7):
            item, view = dataset[idx], dataset.view(idx)
            # Megatron keeps two positions free (its BOS/EOS budget): raw tokens <= Le - 2.
            assert len(view.tokens) <= config.encoder_seq_length - 2
            assert item["encoder_input_ids"].shape == (config.encoder_seq_length,)
            for key in ("decoder_input_ids", "labels", "loss_mask", "decoder_attention_mask"):
                assert item[key].shape == (config.decoder_seq_length,)
            num_encoder, num_decoder = len(view.encoder_input), len(view.decoder_target)
            assert item["encoder_attention_mask"].sum() == num_encoder
            assert item["decoder_attention_mask"].sum() == num_decoder == item["loss_mask"].sum()
            assert (item["encoder_input_ids"][num_encoder:] == PAD).all()
            assert (item["labels"][num_decoder:] == PAD).all()
            labels = item["labels"][:num_decoder].numpy()
            np.testing.assert_array_equal(labels, view.decoder_target)
            assert labels[-1] == EOS and item["decoder_input_ids"][0] == PAD
            np.testing.assert_array_equal(item["decoder_input_ids"][1:num_decoder].numpy(), labels[:-1])
            np.testing.assert_array_equal(rebuild(view.encoder_input, view.decoder_target), view.tokens)


def test_samples_are_deterministic_and_cached(sentence_dataset, tmp_path):
    first = build_t5_datasets(make_config(sentence_dataset, tmp_path), sizes=(50, None, None))[0]
    assert len(list(tmp_path.glob("*-t5-train-*.done"))) == 1
    again = build_t5_datasets(make_config(sentence_dataset, tmp_path), sizes=(50, None, None))[0]
    np.testing.assert_array_equal(first.sample_index, again.sample_index)
    for idx in (0, 13, len(first) - 1):
        for key, value in first[idx].items():
            assert (value == again[idx][key]).all(), key
    other_seed = build_t5_datasets(make_config(sentence_dataset, tmp_path, random_seed=7), sizes=(50, None, None))[0]
    assert not np.array_equal(first.sample_index, other_seed.sample_index)


def test_config_rejects_too_few_sentinels_and_short_decoder(sentence_dataset, tmp_path):
    with pytest.raises(ValueError, match="sentinel ids"):
        make_config(sentence_dataset, tmp_path, sentinel_ids=SENTINELS[:3])
    with pytest.raises(ValueError, match="decoder_seq_length 20 is too short"):
        make_config(sentence_dataset, tmp_path, decoder_seq_length=20)


def test_format_marks_sentinels_and_decodes_the_runs():
    decode = lambda ids: "-".join(map(str, ids))
    assert format_t5_ids([5, 6, SENTINELS[0], 7, SENTINELS[1]], SENTINELS, decode) == "5-6 <extra_id_0> 7 <extra_id_1>"


def test_inspection_reports_splits_and_decodable_samples(sentence_dataset, tmp_path):
    config = make_config(sentence_dataset, tmp_path)
    train, valid, test = inspect_t5_splits(config, sizes=(30, None, None), sample_ids=(0, -1, 10**6))
    assert test is None and train["split"] == "train" and valid["document_range"][0] == train["document_range"][1]
    assert sorted(train["samples"]) == [-1, 0]
    sample = train["samples"][0]
    rebuilt = rebuild(np.array(sample["encoder_input"]), np.array(sample["decoder_target"]))
    assert rebuilt.tolist() == sample["tokens"]
    assert len(sample["noise_positions"]) == sum(t not in SENTINELS for t in sample["decoder_target"][:-1])

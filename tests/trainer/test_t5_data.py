"""T5 special ids per tokenizer convention, and micro-batches from T5 dataset items."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from preprocess.errors import TokenizerError
from preprocess.tokenizers import TokenizerConfig, build_tokenizer
from preprocess.tokenizers.t5 import t5_special_ids
from trainer.errors import TrainConfigError
from trainer.models.t5.data import IGNORE_INDEX, collate_t5

TOKENIZERS = Path(__file__).resolve().parents[2] / "data_test" / "tokenizers"


def test_megatron_sentencepiece_appends_sentinels_in_order():
    tokenizer = build_tokenizer(TokenizerConfig(tokenizer_type="SentencePieceTokenizer",
                                                tokenizer_model=str(TOKENIZERS / "sp-unigram.model")))
    special = t5_special_ids(tokenizer, "SentencePieceTokenizer", vocab_extra_ids=100)
    assert special.sentinels == tuple(range(tokenizer.vocab_size, tokenizer.vocab_size + 100))
    assert special.vocab_size == tokenizer.vocab_size + 100
    assert special.pad == tokenizer.pad
    assert tokenizer.decode([special.eos]) == "</s>" and tokenizer.decode([special.decoder_start]) == "<s>"


def test_wordpiece_gets_megatron_bos_eos_then_sentinels():
    tokenizer = build_tokenizer(TokenizerConfig(tokenizer_type="BertWordPieceLowerCase",
                                                vocab_file=str(TOKENIZERS / "wordpiece-vocab.txt")))
    special = t5_special_ids(tokenizer, "BertWordPieceLowerCase", vocab_extra_ids=10)
    size = tokenizer.vocab_size
    assert (special.decoder_start, special.eos) == (size, size + 1)
    assert special.sentinels == tuple(range(size + 2, size + 12)) and special.vocab_size == size + 12
    assert special.pad == 0


def test_plain_sentencepiece_without_pad_is_refused():
    tokenizer = build_tokenizer(TokenizerConfig(tokenizer_type="GPTSentencePieceTokenizer",
                                                tokenizer_model=str(TOKENIZERS / "sp-unigram.model")))
    with pytest.raises(TokenizerError, match="pad and EOS"):
        t5_special_ids(tokenizer, "GPTSentencePieceTokenizer", vocab_extra_ids=100)


def test_gpt2_has_no_t5_convention(data_test):
    tokenizer = build_tokenizer(TokenizerConfig(tokenizer_type="GPT2BPETokenizer",
                                                vocab_file=str(data_test / "gpt2" / "gpt2-vocab.json"),
                                                merge_file=str(data_test / "gpt2" / "gpt2-merges.txt")))
    with pytest.raises(TokenizerError, match="SentencePiece or WordPiece"):
        t5_special_ids(tokenizer, "GPT2BPETokenizer", vocab_extra_ids=100)


def test_collate_masks_targets_and_checks_the_vocabulary():
    item = {"encoder_input_ids": torch.tensor([5, 9, 0]), "decoder_input_ids": torch.tensor([0, 9, 4, 0]),
            "labels": torch.tensor([9, 4, 1, 0]), "loss_mask": torch.tensor([1.0, 1.0, 1.0, 0.0]),
            "encoder_attention_mask": torch.tensor([1, 1, 0]), "decoder_attention_mask": torch.tensor([1, 1, 1, 0])}
    batch = collate_t5([item, item], vocab_size=10)
    assert batch.targets.tolist() == [[9, 4, 1, IGNORE_INDEX]] * 2
    assert batch.encoder_attention_mask.shape == (2, 3)
    with pytest.raises(TrainConfigError, match="token id 9 but vocab_size is 9"):
        collate_t5([item], vocab_size=9)


@pytest.fixture(scope="module")
def t5_style_spm(tmp_path_factory, data_test) -> str:
    """A SentencePiece model laid out like T5's spiece.model (pad 0, EOS 1, UNK 2, no BOS)."""
    import json

    import sentencepiece

    directory = tmp_path_factory.mktemp("spm")
    lines = [json.loads(line)["text"] for line in (data_test / "sample_en.jsonl").read_text().splitlines()]
    prefix = str(directory / "spiece")
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=prefix, vocab_size=400,
                                             pad_id=0, eos_id=1, unk_id=2, bos_id=-1, num_threads=1,
                                             minloglevel=2)
    return prefix + ".model"


@pytest.fixture(scope="module")
def sentence_prefix(t5_style_spm, data_test, tmp_path_factory) -> str:
    """`preprocess-data --split-sentences` of the sample documents with the T5-style model."""
    from preprocess.cli import main as preprocess_data

    prefix = tmp_path_factory.mktemp("en") / "en"
    assert preprocess_data(["--input", str(data_test / "sample_en.jsonl"), "--output-prefix", str(prefix),
                            "--split-sentences", "--tokenizer-type", "GPTSentencePieceTokenizer",
                            "--tokenizer-model", t5_style_spm, "--workers", "1"]) == 0
    return f"{prefix}_text_sentence"


def test_plain_sentencepiece_uses_hugging_face_t5_sentinels(t5_style_spm):
    tokenizer = build_tokenizer(TokenizerConfig(tokenizer_type="GPTSentencePieceTokenizer",
                                                tokenizer_model=t5_style_spm))
    special = t5_special_ids(tokenizer, "GPTSentencePieceTokenizer", vocab_extra_ids=100)
    # T5Tokenizer: <extra_id_0> is the last id, <extra_id_99> the first one after the model's pieces.
    assert special.sentinels[0] == 499 and special.sentinels[99] == 400 and special.vocab_size == 500
    assert (special.pad, special.eos, special.decoder_start) == (0, 1, 0)


def test_split_sentence_corpus_to_t5_samples_end_to_end(t5_style_spm, sentence_prefix, tmp_path):
    from samplers.t5.dataset import T5DatasetConfig, build_t5_datasets, format_t5_ids

    tokenizer = build_tokenizer(TokenizerConfig(tokenizer_type="GPTSentencePieceTokenizer",
                                                tokenizer_model=t5_style_spm))
    special = t5_special_ids(tokenizer, "GPTSentencePieceTokenizer", vocab_extra_ids=100)
    config = T5DatasetConfig(data_prefix=sentence_prefix, sentinel_ids=special.sentinels,
                             pad_id=special.pad, decoder_start_id=special.decoder_start, eos_id=special.eos,
                             split="99,1,0", path_to_cache=str(tmp_path / "cache"))
    train = build_t5_datasets(config, sizes=(100, None, None))[0]
    batch = collate_t5([train[i] for i in range(4)], special.vocab_size)
    assert batch.encoder_input_ids.shape == (4, 512) and batch.targets.shape == (4, 128)
    view = train.view(0)
    encoder_text = format_t5_ids(view.encoder_input, special.sentinels, tokenizer.decode)
    target_text = format_t5_ids(view.decoder_target[:-1], special.sentinels, tokenizer.decode)
    assert "<extra_id_0>" in encoder_text and target_text.startswith("<extra_id_0>")
    assert view.decoder_target[-1] == special.eos


def test_run_settings_build_the_model_shape_and_datasets(t5_style_spm, sentence_prefix, tmp_path):
    from trainer.config import DataConfig, ModelConfig
    from trainer.models.t5.config import build_t5_training_datasets, resolve_t5_special_ids, t5_shape
    from trainer.models.t5.settings import T5Config

    model = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, make_vocab_size_divisible_by=128,
                        untie_embeddings_and_output_weights=True, kv_channels=8)
    t5 = T5Config(encoder_seq_length=64, decoder_seq_length=24, decoder_num_layers=3, feed_forward_proj="gated-gelu")
    data = DataConfig(dataset=[sentence_prefix], split="98,2,0", tokenizer_type="GPTSentencePieceTokenizer",
                      tokenizer_model=t5_style_spm, data_cache_path=str(tmp_path / "cache"))
    special = resolve_t5_special_ids(data, t5.vocab_extra_ids)
    shape = t5_shape(model, t5, special.vocab_size, tp=2)
    assert shape.vocab_size == 512 and (shape.d_kv, shape.d_ff, shape.num_heads) == (8, 256, 4)
    assert (shape.num_encoder_layers, shape.num_decoder_layers) == (2, 3)
    assert not shape.tie_word_embeddings and not shape.scale_decoder_outputs
    train, valid, test = build_t5_training_datasets(data, t5, special, (40, 4, 0))
    assert len(train) >= 40 and len(valid) >= 4 and test is None
    assert train[0]["encoder_input_ids"].shape == (64,) and train[0]["labels"].shape == (24,)
    with pytest.raises(TrainConfigError, match="decoder_seq_length 5 is too short"):
        build_t5_training_datasets(data, T5Config(encoder_seq_length=64, decoder_seq_length=5), special, (1, 0, 0))

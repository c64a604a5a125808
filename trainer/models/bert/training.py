"""BERT's part in a training run: the WordPiece vocabulary's special ids, the shape, datasets and FLOPs per position.

``train --model bert --tokenizer-type BertWordPieceLowerCase --vocab-file vocab.txt --data-path X_text_sentence``
(one sentence-split dataset, as megatron's pretrain_bert.py takes it); ``--bert-no-binary-head`` trains the
masked LM alone; ``--mask-prob`` and ``--short-seq-prob`` are the sample options.
"""

from __future__ import annotations

import functools

from preprocess.tokenizers import TokenizerConfig, TokenizerError, build_tokenizer
from preprocess.tokenizers.config import BERT_TOKENIZER_TYPES
from preprocess.tokenizers.t5 import MEGATRON_BOS, MEGATRON_EOS
from samplers.bert.dataset import BertDatasetConfig, build_bert_datasets
from samplers.bert.masking import masking_options
from trainer.config import TrainConfig
from trainer.data.batches import Vocabulary
from trainer.errors import TrainConfigError
from trainer.metrics.writers import FORWARD_BACKWARD_FACTOR
from trainer.models.bert.data import collate_bert
from trainer.models.bert.model import BertShape
from trainer.models.bert.settings import bert_settings
from trainer.family.spec import TrainingParts
from trainer.parallel.plan import FamilyLayout
from trainer.parallel.dims import pad_vocab_size


def wordpiece_pieces(config: TrainConfig) -> list[str]:
    """The run's WordPiece pieces by id, as Megatron's BertWordPiece tokenizer holds them: the vocabulary file's,
    then [BOS] and [EOS] when the file lacks them (they count in its vocabulary size and its random
    replacements).

    Raises:
        TrainConfigError: no WordPiece vocabulary given, or it cannot be read.
    """
    data = config.data
    if data.tokenizer_type not in BERT_TOKENIZER_TYPES or data.vocab_file is None:
        raise TrainConfigError(f"model bert needs a WordPiece vocabulary: tokenizer_type one of "
                               f"{', '.join(BERT_TOKENIZER_TYPES)} and vocab_file (got {data.tokenizer_type})")
    try:
        tokenizer = build_tokenizer(TokenizerConfig(tokenizer_type=data.tokenizer_type, vocab_file=data.vocab_file))
    except (ValueError, TokenizerError) as error:
        raise TrainConfigError(str(error)) from error
    by_id = {i: piece for piece, i in tokenizer.backend.get_vocab().items()}
    pieces = [by_id[i] for i in range(len(by_id))]
    return pieces + [piece for piece in (MEGATRON_BOS, MEGATRON_EOS) if piece not in by_id]


def bert_shape(config: TrainConfig, vocab_size: int, tp: int) -> BertShape:
    """The model's dimensions with the vocabulary padded for ``tp``."""
    m = config.model
    return BertShape(num_layers=m.num_layers, hidden_size=m.hidden_size, num_attention_heads=m.num_attention_heads,
                     ffn_hidden_size=m.ffn_hidden_size, max_position_embeddings=m.positions(),
                     padded_vocab_size=pad_vocab_size(vocab_size, m.make_vocab_size_divisible_by, tp),
                     binary_head=not bert_settings(config).bert_no_binary_head, hidden_dropout=m.hidden_dropout,
                     attention_dropout=m.attention_dropout, init_method_std=m.init_method_std,
                     layernorm_epsilon=m.layernorm_epsilon)


def layout_rules(config: TrainConfig, tp: int) -> FamilyLayout:
    """No sequence parallelism; the pipeline splits the layers."""
    model = config.model
    rules = [(model.positions() >= model.seq_length,
              f"max_position_embeddings ({model.positions()}) is smaller than seq_length ({model.seq_length})"),
             (not config.parallelism.sequence_parallel, "sequence_parallel is not implemented for model bert")]
    cp = config.parallelism.context_parallel_size
    rules.append((cp == 1, f"context_parallel_size ({cp}) > 1 is not implemented for model bert (decoder models only)"))
    # Megatron's pretrain_bert.py loss_func returns no token count (masked-token mean plus sentence-order loss).
    rules.append((not config.training.calculate_per_token_loss,
                  "calculate_per_token_loss is not implemented for model bert: its loss (the masked tokens' mean "
                  "plus the sentence-order loss) is not a per-token mean, as in Megatron's pretrain_bert.py"))
    return FamilyLayout(rules, model.num_layers, f"num_layers ({model.num_layers})")


def flops_per_token(shape: BertShape, seq_length: int) -> float:
    """Training FLOPs per position: 3 x (q/k/v/o + MLP + attention scores + the MLM head's transform and
    decoder), 2 FLOPs per MAC (every position goes through the decoder, as Megatron computes it)."""
    h, ffn = shape.hidden_size, shape.ffn_hidden_size
    per_layer = 2 * (4 * h * h + 2 * h * ffn) + 2 * 2 * seq_length * h
    head = 2 * h * h + 2 * h * shape.padded_vocab_size
    return FORWARD_BACKWARD_FACTOR * (shape.num_layers * per_layer + head)


def build_training_datasets(config: TrainConfig, pieces: list[str], pad_id: int, sizes: tuple[int, int, int]):
    """The train, valid and test BERT datasets of the run (one sentence-split dataset prefix).

    Raises:
        TrainConfigError: a blend of several prefixes, or bad sample options.
    """
    prefixes, _ = config.data.blend
    if len(prefixes) != 1:
        raise TrainConfigError(f"BERT trains on one dataset prefix; got {len(prefixes)} ({' '.join(prefixes)})")
    try:
        dataset_config = BertDatasetConfig(
            data_prefix=prefixes[0], masking=masking_options(pieces, config.masking.mask_prob), pad_id=pad_id,
            split=config.data.split, sequence_length=config.model.seq_length,
            short_seq_prob=config.masking.short_seq_prob,
            binary_head=not bert_settings(config).bert_no_binary_head, random_seed=config.data.seed,
            path_to_cache=config.data.data_cache_path)
    except ValueError as error:
        raise TrainConfigError(str(error)) from error
    return build_bert_datasets(dataset_config, sizes)


def training_parts(config: TrainConfig, tp: int, sizes: tuple[int, int, int]) -> TrainingParts:
    """Masked-LM (+ sentence-order) samples of one sentence-split dataset over the WordPiece vocabulary."""
    pieces = wordpiece_pieces(config)
    ids = {piece: i for i, piece in enumerate(pieces)}
    if "[PAD]" not in ids:
        raise TrainConfigError(f"{config.data.vocab_file}: a BERT vocabulary needs a [PAD] piece")
    vocabulary = Vocabulary(size=config.model.vocab_size or len(pieces), eod_id=ids.get("[SEP]"), pad_id=ids["[PAD]"])
    shape = bert_shape(config, vocabulary.size, tp)
    datasets = build_training_datasets(config, pieces, vocabulary.pad_id, sizes)
    collate = functools.partial(collate_bert, binary_head=shape.binary_head)
    return TrainingParts(vocabulary=vocabulary, shape=shape, datasets=datasets, collate=collate,
                         tokens_per_sample=config.model.seq_length,
                         flops_per_token=flops_per_token(shape, config.model.seq_length))

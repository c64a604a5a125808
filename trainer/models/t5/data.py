"""What T5 training needs from the samplers: datasets and micro-batches.

    special = t5_special_ids(tokenizer, tokenizer_type="GPTSentencePieceTokenizer", vocab_extra_ids=100)
    train, valid, test = build_t5_datasets(T5DatasetConfig(data_prefix=..., sentinel_ids=special.sentinels,
                                           pad_id=special.pad, decoder_start_id=special.decoder_start,
                                           eos_id=special.eos), sizes)
    batch = collate_t5([train[i] for i in indices], vocab_size=special.vocab_size)

The special ids come from `preprocess.tokenizers.t5` (`t5_special_ids`, `T5SpecialIds`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.data.batches import IGNORE_INDEX, check_token_ids, stack_sample_ids, to_device


@dataclass(slots=True)
class T5MicroBatch:
    """One micro-batch: int64 [batch, Le] encoder ids and mask, int64 [batch, Ld] decoder ids and targets."""

    encoder_input_ids: torch.Tensor
    decoder_input_ids: torch.Tensor
    encoder_attention_mask: torch.Tensor
    targets: torch.Tensor
    """Labels with IGNORE_INDEX where the loss mask is 0."""
    sample_ids: torch.Tensor | None = None
    """int64 [batch]: the samples' ids in the run's global order (`trainer.data.batches.stack_sample_ids`)."""

    def to(self, device: torch.device) -> T5MicroBatch:
        return T5MicroBatch(*(t if t is None else to_device(t, device) for t in (
            self.encoder_input_ids, self.decoder_input_ids, self.encoder_attention_mask, self.targets,
            self.sample_ids)))


def collate_t5(items: list[dict[str, torch.Tensor]], vocab_size: int) -> T5MicroBatch:
    """Stack `samplers.t5.dataset.T5Dataset` items into a micro-batch.

    Raises:
        TrainConfigError: a token id does not fit the model's vocabulary.
    """
    stack = {key: torch.stack([item[key] for item in items]) for key in items[0]}
    check_token_ids(vocab_size, stack["encoder_input_ids"], stack["labels"])
    return T5MicroBatch(encoder_input_ids=stack["encoder_input_ids"], decoder_input_ids=stack["decoder_input_ids"],
                        encoder_attention_mask=stack["encoder_attention_mask"],
                        targets=stack["labels"].masked_fill(stack["loss_mask"] == 0, IGNORE_INDEX),
                        sample_ids=stack_sample_ids(items))

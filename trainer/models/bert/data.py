"""BERT's micro-batches and loss: the samplers room's BERT items stacked, and masked-LM + sentence-order loss.

    batch = collate_bert([train[i] for i in indices], vocab_size=1024)
    mlm_logits, binary_logits = model(*model_inputs(batch))
    loss = bert_loss((mlm_logits, binary_logits), batch.targets)

The sentence-order label travels packed into the targets as one extra last column (``targets[:, seq]``),
so the core's one ``targets`` tensor (what the pipeline schedule splits into micro-batches and hands
the last stage) carries both labels: ``targets[:, :seq]`` are the MLM labels (IGNORE_INDEX where no
token is predicted) and ``targets[:, seq]`` is 1 when segments A and B were swapped, 0 when in order
(IGNORE_INDEX without the binary head).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from trainer.data.batches import IGNORE_INDEX, check_token_ids, to_device

# The targets' last column holds the sentence-order label.
BINARY_LABEL_COLUMNS = 1


@dataclass(slots=True)
class BertMicroBatch:
    """One micro-batch: tokens, token types and padding mask int64 [batch, seq]; targets int64 [batch, seq + 1]."""

    tokens: torch.Tensor
    token_types: torch.Tensor
    padding_mask: torch.Tensor
    """1 for tokens, 0 for padding."""
    targets: torch.Tensor
    """MLM labels (IGNORE_INDEX where the loss mask is 0), then the sentence-order label (see module docstring)."""

    def to(self, device: torch.device) -> BertMicroBatch:
        return BertMicroBatch(*(to_device(t, device) for t in (
            self.tokens, self.token_types, self.padding_mask, self.targets)))


def model_inputs(mb: BertMicroBatch) -> tuple[torch.Tensor, ...]:
    """The tensors of a micro-batch `Bert.forward` takes, in its order."""
    return mb.tokens, mb.token_types, mb.padding_mask


def collate_bert(items: list[dict], vocab_size: int, binary_head: bool = True) -> BertMicroBatch:
    """Stack `samplers.bert.dataset.BertDataset` items into a micro-batch.

    Args:
        items: the dataset's items (Megatron's keys: text, types, labels, is_random, padding_mask, loss_mask).
        vocab_size: ids must be below it.
        binary_head: whether the sentence-order label is trained (else its column is IGNORE_INDEX).

    Raises:
        TrainConfigError: a token id does not fit the model's vocabulary.
    """
    stack = {key: torch.stack([torch.as_tensor(item[key]) for item in items]).long() for key in items[0]}
    labels = stack["labels"].masked_fill(stack["loss_mask"] == 0, IGNORE_INDEX)
    # IGNORE_INDEX entries are no ids: clamped to 0 they pass, the real labels are checked.
    check_token_ids(vocab_size, stack["text"], labels.clamp(min=0))
    order = stack["is_random"] if binary_head else torch.full_like(stack["is_random"], IGNORE_INDEX)
    return BertMicroBatch(tokens=stack["text"], token_types=stack["types"], padding_mask=stack["padding_mask"],
                          targets=torch.cat([labels, order[:, None]], dim=1))


def _mean_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (float32) over the labels that are not IGNORE_INDEX; 0 when there are none (a
    micro-batch of short samples may mask no token, which would otherwise make the step's loss NaN)."""
    total = F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX, reduction="sum")
    if isinstance(total, DTensor):
        # Vocabulary-parallel logits give a replicated scalar. Taken local, it adds to the binary head's
        # plain loss; left a DTensor, the sum would send DTensor gradients into that plain cross-entropy,
        # which loss_parallel's backward cannot take.
        total = total.to_local()
    return total / (labels != IGNORE_INDEX).sum().clamp(min=1)


def bert_loss(outputs: tuple[torch.Tensor, ...], targets: torch.Tensor) -> torch.Tensor:
    """Megatron's BERT loss of a micro-batch: mean MLM cross-entropy over the masked tokens, plus the mean
    sentence-order cross-entropy when the model has the binary head.

    Args:
        outputs: MLM logits [batch, seq, vocab] (under tensor parallelism a DTensor sharded over the
            vocabulary, inside ``loss_parallel``) and, with the binary head, its logits [batch, 2].
        targets: int64 [batch, seq + 1] (see the module docstring).
    """
    mlm_logits, *binary = outputs
    loss = _mean_cross_entropy(mlm_logits.flatten(0, 1), targets[:, :-BINARY_LABEL_COLUMNS].flatten())
    if binary:
        loss = loss + _mean_cross_entropy(binary[0], targets[:, -1])
    return loss


def span_loss(outputs: tuple[torch.Tensor, ...], targets: torch.Tensor) -> torch.Tensor:
    """Extractive QA's loss of a micro-batch (Hugging Face ``BertForQuestionAnswering``'s): the mean of the
    start and end positions' cross-entropies.

    Args:
        outputs: start and end logits, each float [batch, seq].
        targets: int64 [batch, 2]: the answer's first and last token positions (0, [CLS], when absent).
    """
    start_logits, end_logits = outputs
    return (F.cross_entropy(start_logits.float(), targets[:, 0])
            + F.cross_entropy(end_logits.float(), targets[:, 1])) / 2

"""Greedy encoder-decoder generation with a `trainer.t5_model.T5` (what HF ``generate(do_sample=False)`` does).

    ids = greedy_generate(model, encoder_input_ids, max_new_tokens=32, decoder_start_id=0, eos_id=1, pad_id=0)

The encoder runs once; the decoder runs incrementally with a key/value cache (self-attention keys
grow by one position per step, cross-attention keys are computed once). A sequence that produced
EOS is continued with the pad id until every sequence is done or ``max_new_tokens`` is reached.
"""

from __future__ import annotations

import torch

from trainer.t5_model import T5


@torch.no_grad()
def greedy_generate(model: T5, encoder_input_ids: torch.Tensor, max_new_tokens: int, decoder_start_id: int,
                    eos_id: int, pad_id: int, encoder_attention_mask: torch.Tensor | None = None,
                    use_cache: bool = True) -> torch.Tensor:
    """Decoder ids [batch, 1 + generated] starting with ``decoder_start_id``.

    Args:
        model: the model (evaluation mode is the caller's choice; dropout is off only in eval()).
        encoder_input_ids: int64 [batch, Le].
        max_new_tokens: most tokens generated after the start id.
        decoder_start_id: first decoder token (T5/mT5: the pad id).
        eos_id: end of sequence; a sequence stops after it.
        pad_id: fills the positions after a sequence's EOS.
        encoder_attention_mask: [batch, Le], 1 token, 0 padding; None: no padding.
        use_cache: decode incrementally (False recomputes the whole prefix each step; same result).
    """
    memory = model.encode(encoder_input_ids, encoder_attention_mask)
    batch = encoder_input_ids.shape[0]
    ids = torch.full((batch, 1), decoder_start_id, dtype=torch.long, device=encoder_input_ids.device)
    done = torch.zeros(batch, dtype=torch.bool, device=ids.device)
    cache: dict | None = {} if use_cache else None
    for _ in range(max_new_tokens):
        step_input = ids[:, -1:] if use_cache else ids
        logits = model.decode(step_input, memory, encoder_attention_mask, cache)[:, -1]
        next_ids = logits.argmax(dim=-1).masked_fill(done, pad_id)
        ids = torch.cat([ids, next_ids[:, None]], dim=1)
        done |= next_ids == eos_id
        if done.all():
            break
    return ids

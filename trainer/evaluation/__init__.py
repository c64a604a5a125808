"""Evaluation of GPT checkpoints and HF GPT-2 directories, in any tp x pp x dp layout.

- `evaluate`: the ``evaluate`` command's library (`EvaluateConfig`, `evaluate`).
- `lambada`: LAMBADA cloze accuracy, Megatron's protocol (``--strict-lambada``).
- `perplexity`: perplexity over Megatron's overlapping windows, and WikiText's adjusted perplexity.
- `detokenize`: Megatron's WikiText / PTB detokenisers.
- `scoring`: the model split over processes, and teacher-forced scoring of token rows.
- `harness`: lm-evaluation-harness's requests on our model; `trainer.cli.lm_eval` registers it with lm-eval
  (the optional ``eval`` extra; nothing else imports lm-eval).
"""

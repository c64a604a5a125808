"""lm-evaluation-harness's three request kinds on our model, with its causal-LM rules, and no lm-eval import.

`HarnessScorer` follows lm-eval 0.4's ``TemplateLM``/``HFLM`` exactly where the numbers depend on it:
trailing spaces of a context move to the continuation, ``context + continuation`` is encoded whole and
split at the context's length, an empty context becomes the prefix (EOT) token, inputs keep their last
``max_length + 1`` tokens, and rolling log-likelihoods use its disjoint windows with one token of
context. `trainer.cli.lm_eval` wraps it as lm-eval's ``tokenmill`` model; it also works on its own:

    with open_eval_model(EvalModelConfig(load="gpt2/"), resolve_scoring_source("gpt2/", 1)) as model:
        scorer = HarnessScorer(model)
        scorer.loglikelihood([("The capital of France is", " Paris")])  # -> [(log_prob, is_greedy)]
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from trainer.errors import TrainConfigError
from trainer.evaluation.scoring import EvalModel, ScoreRow, map_over_dp, score_rows
from trainer.generation.sampling import SamplingConfig

# lm-eval's default number of generated tokens when a task gives no ``max_gen_toks``.
DEFAULT_MAX_GEN_TOKS = 256
# Seed of the sampling generator when a task samples (``do_sample``); identical on every tp rank.
SAMPLING_SEED = 1234


def rolling_windows(tokens: list[int], prefix_token: int, max_length: int) -> Iterator[tuple[list[int], list[int]]]:
    """lm-eval's ``get_rolling_token_windows(context_len=1)`` followed by ``make_disjoint_window``:
    (context, continuation) pairs whose continuations tile ``tokens``, each window at most
    ``max_length`` inputs."""
    if not tokens:
        return
    first = min(max_length, len(tokens))
    yield [prefix_token], tokens[:first]
    predicted = first
    while predicted < len(tokens):
        count = min(len(tokens) - predicted, max_length)
        end = predicted + count
        window = tokens[max(0, end - max_length - 1):end - 1]
        yield window[:len(window) - (count - 1)], tokens[end - count:end]
        predicted += count


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One ``generate_until`` request, its options resolved."""

    context: str
    until: list[str]
    max_gen_toks: int
    sampling: SamplingConfig


class HarnessScorer:
    """lm-eval's requests answered by an `EvalModel` (collective: every rank calls every method alike)."""

    def __init__(self, model: EvalModel, max_length: int | None = None) -> None:
        self.model = model
        self.tokenizer = model.require_tokenizer("lm-eval")
        self.max_length = max_length or model.max_positions
        if not 1 <= self.max_length <= model.max_positions:
            raise TrainConfigError(f"max_length ({self.max_length}) must be in [1, {model.max_positions}] (the "
                                   "model's positions)")
        self.eot_token_id = self.tokenizer.eod if model.eod_id is None else model.eod_id

    def tok_encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""
        return self.tokenizer.encode(text)

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """lm-eval's split of a request into context and continuation ids (its ``loglikelihood``)."""
        if context == "":
            ids = self.tok_encode(continuation)
            return ([self.eot_token_id], ids) if ids[:1] != [self.eot_token_id] else (ids[:1], ids[1:])
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole, context_ids = self.tok_encode(context + continuation), self.tok_encode(context)
        return context_ids, whole[len(context_ids):]

    def loglikelihood_tokens(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(log-probability, all greedy) of each continuation after its context, both token ids; inputs
        keep their last ``max_length`` tokens, as lm-eval's HF model does."""
        rows = []
        for number, (context, continuation) in enumerate(pairs):
            if not continuation or len(continuation) > self.max_length:
                raise TrainConfigError(f"request {number}: a continuation of {len(continuation)} tokens; lm-eval "
                                       f"requests need 1 to max_length ({self.max_length})")
            ids = np.array((context + continuation)[-(self.max_length + 1):], dtype=np.int64)
            rows.append(ScoreRow(ids, first=len(ids) - 1 - len(continuation), last=len(ids) - 1))
        return [(s.log_prob, s.greedy) for s in score_rows(self.model, rows, "lm-eval requests")]

    def loglikelihood(self, requests: list[tuple[str, str]]) -> list[tuple[float, bool]]:
        """lm-eval's ``loglikelihood``: (log-probability, is greedy) of each (context, continuation)."""
        return self.loglikelihood_tokens([self.encode_pair(context, continuation) for context, continuation in requests])

    def loglikelihood_rolling(self, texts: list[str]) -> list[float]:
        """lm-eval's ``loglikelihood_rolling``: each text's total log-probability, from the EOT token on."""
        windows, owners = [], []
        for index, text in enumerate(texts):
            for window in rolling_windows(self.tok_encode(text), self.eot_token_id, self.max_length):
                windows.append(window)
                owners.append(index)
        totals = [0.0] * len(texts)
        for owner, (log_prob, _) in zip(owners, self.loglikelihood_tokens(windows)):
            totals[owner] += log_prob
        return totals

    def generation_request(self, context: str, options: dict) -> GenerationRequest:
        """A request's ``gen_kwargs`` read as lm-eval's HF model reads them (EOT's text is always a stop)."""
        until = options.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        eot_text = self.tokenizer.decode([self.eot_token_id])
        if eot_text not in until:
            until.append(eot_text)
        temperature = float(options.get("temperature", 0.0))
        greedy = not options.get("do_sample", False) or temperature == 0.0
        sampling = SamplingConfig(greedy=greedy, temperature=temperature if not greedy else 1.0,
                                  top_k=int(options.get("top_k") or 0), top_p=float(options.get("top_p") or 1.0))
        return GenerationRequest(context, until, int(options.get("max_gen_toks", DEFAULT_MAX_GEN_TOKS)), sampling)

    def _generate_one(self, request: GenerationRequest) -> str:
        if request.max_gen_toks >= self.max_length:
            raise TrainConfigError(f"max_gen_toks ({request.max_gen_toks}) leaves no room for a context in "
                                   f"max_length ({self.max_length})")
        # Left-truncated as lm-eval's HF model does: the context keeps its last (max_length - max_gen_toks).
        prompt = self.tok_encode(request.context)[-(self.max_length - request.max_gen_toks):] or [self.eot_token_id]
        generator = torch.Generator(device=self.model.sharded.device).manual_seed(SAMPLING_SEED)
        ids = self.model.source.generate_ids(self.model.sharded, [prompt], request.max_gen_toks, request.sampling,
                                             self.eot_token_id, generator)[0]
        text = self.tokenizer.decode(ids[:-1] if ids and ids[-1] == self.eot_token_id else ids)
        for stop in request.until:
            if stop:
                text = text.split(stop)[0]
        return text

    def generate_until(self, requests: list[tuple[str, dict]]) -> list[str]:
        """lm-eval's ``generate_until``: each context's continuation, cut before the first stop string."""
        resolved = [self.generation_request(context, options) for context, options in requests]
        # One request per forward pass: rows of a batch would differ in stops, lengths and sampling.
        return map_over_dp(self.model, len(resolved), lambda batch: [self._generate_one(resolved[i]) for i in batch],
                           "generating")

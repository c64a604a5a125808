"""``evaluate``'s library: one task on one model, in one process or split over tp x pp x dp processes.

    from trainer.evaluation.evaluate import EvaluateConfig, evaluate
    from trainer.evaluation.scoring import EvalModelConfig
    from trainer.models.dispatch import resolve_scoring_source
    record = evaluate(EvaluateConfig(model=EvalModelConfig(load="gpt2/"), task="perplexity",
                                     data="wiki.test.tokens", overlapping_eval=32), resolve_scoring_source("gpt2/", 1))
    record["ppl"], record["adjusted_ppl"]

Collective: under torchrun (or ``evaluate --nproc-per-node N``) every rank calls `evaluate` and every rank
gets the same record.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from trainer.errors import TrainConfigError
from trainer.evaluation.detokenize import AUTO
from trainer.evaluation.lambada import evaluate_lambada
from trainer.evaluation.perplexity import evaluate_perplexity
from trainer.evaluation.scoring import EvalModelConfig, ScoringSource, open_eval_model

TASKS = ("lambada", "perplexity")


@dataclass(kw_only=True, slots=True)
class EvaluateConfig:
    """One evaluation run."""

    model: EvalModelConfig
    task: str
    """lambada (cloze accuracy) or perplexity."""
    data: str
    """lambada: a JSON-lines file of {"text": ...}; perplexity: a text file or a .bin/.idx token file."""
    strict_lambada: bool = False
    """LAMBADA target: the last whitespace word (Megatron's --strict-lambada); else the last token."""
    seq_length: int | None = None
    """perplexity: inputs per window (default: the model's positions)."""
    overlapping_eval: int | None = None
    """perplexity: targets scored per window after the first (default: seq_length, disjoint windows)."""
    detokenizer: str = AUTO
    """perplexity of a text file: Megatron's detokeniser (auto: chosen by the file name, as Megatron)."""

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise TrainConfigError(f"unknown task {self.task!r}; known: {', '.join(TASKS)}")
        for name in ("seq_length", "overlapping_eval"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise TrainConfigError(f"{name} must be positive, got {value}")


def check_evaluation(config: EvaluateConfig, world_size: int, source: ScoringSource) -> None:
    """What every rank would reject, checked before any process starts (the layout of ``source``, the model
    as its family scores it: `trainer.models.dispatch.resolve_scoring_source` checks the family and source).

    Raises:
        TokenmillError: one clear message.
    """
    model = config.model
    source.layout(model.tensor_model_parallel_size, model.pipeline_model_parallel_size, world_size)


def evaluate(config: EvaluateConfig, source: ScoringSource) -> dict:
    """Run the task (collective over every process of the group) on ``source``, the model of
    ``config.model.load`` as its family scores it (`trainer.models.dispatch.resolve_scoring_source`).

    Returns:
        The result record (JSON-serialisable), identical on every rank.

    Raises:
        TokenmillError: a bad model, layout or data file (one clear message, on every rank).
    """
    record: dict = {"task": config.task, "data": config.data}
    with open_eval_model(config.model, source) as model:
        if config.task == "lambada":
            result = evaluate_lambada(model, config.data, config.strict_lambada)
            record |= {"strict_lambada": config.strict_lambada, "accuracy": result.accuracy,
                       "correct": result.correct, "count": result.count}
        else:
            seq_length = config.seq_length or model.max_positions
            result = evaluate_perplexity(model, config.data, seq_length, config.overlapping_eval, config.detokenizer)
            record |= {"seq_length": seq_length, "overlapping_eval": config.overlapping_eval or seq_length,
                       **asdict(result)}
    return record

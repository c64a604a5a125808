"""tokenmill as an lm-evaluation-harness model: ``tokenmill``, for ``lm-eval`` 0.4 (the ``eval`` extra).

lm-eval finds models in its own registry (``register_model``) and reads no entry points, so the model is
registered when this module is imported. Run lm-eval's own command line through it:

    python -m trainer.cli.lm_eval run --model tokenmill \\
        --model_args load=checkpoints/run1,tensor_model_parallel_size=2 --tasks lambada_openai --batch_size 8
    # any layout: every process runs lm-eval, the model splits itself over tp x pp x dp
    torchrun --nproc-per-node 4 -m trainer.cli.lm_eval run --model tokenmill \\
        --model_args load=gpt2/,tensor_model_parallel_size=2 --tasks wikitext --device cpu

or from Python: ``import trainer.cli.lm_eval`` and then ``lm_eval.simple_evaluate(model=
"tokenmill", model_args="load=...")``. Model arguments: ``load`` (checkpoint or HF directory),
``tensor_model_parallel_size``, ``pipeline_model_parallel_size``, ``max_length`` (default: the model's
positions), ``no_verify``; lm-eval's ``--batch_size`` and ``--device`` (cpu or cuda) are honoured.

Under several processes every rank reports itself as lm-eval's rank 0 of 1, as lm-eval expects of
tensor-parallel models (it then writes results from ``LOCAL_RANK`` 0 only): all ranks see every request and
`trainer.evaluation.harness.HarnessScorer` splits them over the data-parallel replicas itself.
"""

from __future__ import annotations

import sys
from contextlib import ExitStack

# lm-eval fills its registry with its own models only while the registry is empty: load them before
# adding ours, or ``--model hf`` would vanish from the same process.
import lm_eval.models  # noqa: F401
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from trainer.evaluation.harness import HarnessScorer
from trainer.evaluation.scoring import EvalModelConfig, open_eval_model
from trainer.models.dispatch import resolve_scoring_source

MODEL_NAME = "tokenmill"
# Rows per forward pass when lm-eval passes none, or "auto" (which we do not probe).
DEFAULT_BATCH_SIZE = 8


def _batch_size(value) -> int:
    return int(value) if str(value).isdigit() else DEFAULT_BATCH_SIZE


def _device(value: str | None) -> str | None:
    """lm-eval's ``--device`` (``cuda:0``, ``cpu``, None) as ours (cuda or cpu; None: cuda when available)."""
    return None if value is None else value.split(":")[0]


@register_model(MODEL_NAME)
class TokenmillLM(TemplateLM):
    """lm-eval's view of a tokenmill GPT checkpoint or HF GPT-2 directory, in any tp x pp x dp layout."""

    backend = "causal"

    def __init__(self, load: str, tensor_model_parallel_size: int = 1, pipeline_model_parallel_size: int = 1,
                 max_length: int | None = None, no_verify: bool = False, batch_size=DEFAULT_BATCH_SIZE,
                 device: str | None = None, **_lm_eval_options) -> None:
        super().__init__()
        self._resources = ExitStack()
        config = EvalModelConfig(load=str(load), no_verify=bool(no_verify), batch_size=_batch_size(batch_size),
                                 tensor_model_parallel_size=int(tensor_model_parallel_size),
                                 pipeline_model_parallel_size=int(pipeline_model_parallel_size),
                                 device=_device(device), progress=False)
        source = resolve_scoring_source(config.load, config.tensor_model_parallel_size)
        model = self._resources.enter_context(open_eval_model(config, source))
        self.scorer = HarnessScorer(model, int(max_length) if max_length else None)

    @property
    def eot_token_id(self) -> int:
        return self.scorer.eot_token_id

    @property
    def max_length(self) -> int:
        return self.scorer.max_length

    def tok_encode(self, string: str, **_options) -> list[int]:
        return self.scorer.tok_encode(string)

    def _loglikelihood_tokens(self, requests, **_options) -> list[tuple[float, bool]]:
        return self.scorer.loglikelihood_tokens([(context, continuation) for _, context, continuation in requests])

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        return self.scorer.loglikelihood_rolling([request.args[0] for request in requests])

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        return self.scorer.generate_until([request.args for request in requests])

    def close(self) -> None:
        """Leave the process group this model created (if it created one)."""
        self._resources.close()


def main() -> None:
    """lm-eval's command line, with ``--model tokenmill`` registered."""
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    sys.exit(main())

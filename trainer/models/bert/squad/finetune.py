"""Fine-tune a BERT with a span head on SQuAD-format data, evaluate it with the official v1.1 metric, predict.

    result = finetune(SquadConfig(train_file="train-v1.1.json", valid_file="dev-v1.1.json",
                                  load_hf="bert-base-uncased/", save="ckpt/squad", output_dir="out/"))
    result.metrics                       # {'exact_match': ..., 'f1': ...}; out/predictions.json, out/eval_results.json
    answers = predict(PredictConfig(load="ckpt/squad"), parse_predict_inputs(["Berlin is ... - What is ...?"]))

The model is `trainer.models.bert.model.Bert` with the span head (Hugging Face ``BertForQuestionAnswering``'s
layout), trained through the generic `trainer.parallel.runner.ParallelModel` (BERT's plan with the span loss) in any
tensor x data-parallel layout (under torchrun); the encoder comes from a HF BERT directory (``load_hf``), a
tokenmill BERT checkpoint (``load``: pre-trained or already fine-tuned) or, for tests, a fresh initialisation.
Evaluation and prediction run in one process.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from preprocess.tokenizers import TokenizerConfig, TokenizerError, build_tokenizer
from trainer.checkpoint.load import copy_into_parameter
from trainer.checkpoint.save import save_checkpoint
from trainer.checkpoint.store import MODEL_PREFIX, resolve_checkpoint
from trainer.config import DEFAULT_DIVISIBLE_BY, OptimizerConfig, ParallelismConfig, TrainingConfig
from trainer.data.batches import Vocabulary
from trainer.parallel.distributed import init_distributed, resolve_device_type
from trainer.errors import TrainConfigError
from trainer.optim.grads import reduce_loss
from trainer.checkpoint.hf_files import WORDPIECE_VOCAB, is_hf_directory, read_hf_config, write_json
from trainer.models.bert.convert import (
    bert_tokenizer_defaults,
    hf_bert_state,
    hf_shape,
    read_bert_checkpoint,
    save_model_config,
)
from trainer.models.bert.data import BertMicroBatch, model_inputs
from trainer.models.bert.hf import check_hf_config
from trainer.models.bert.model import SPAN_HEAD, Bert, BertShape
from trainer.models.bert.spec import SPAN_PLAN
from trainer.optim.optimizer import apply_schedule, build_optimizer
from trainer.parallel.dims import ParallelDims, pad_vocab_size
from trainer.parallel.runner import ParallelModel
from trainer.checkpoint.save_directory import check_save_directory, claim_save_directory
from trainer.models.bert.squad.decode import decode_answers
from trainer.models.bert.squad.examples import QAExample, read_squad_file
from trainer.models.bert.squad.features import FeatureOptions, QAFeature, build_features
from trainer.models.bert.squad.metric import squad_metric

logger = logging.getLogger(__name__)

PREDICTIONS_FILE = "predictions.json"
NBEST_FILE = "nbest_predictions.json"
EVAL_RESULTS_FILE = "eval_results.json"
# Features per forward pass in evaluation and prediction.
EVAL_BATCH_SIZE = 64


@dataclass(kw_only=True, slots=True)
class ScratchShape:
    """The encoder's size when it starts from a fresh initialisation (no ``load``/``load_hf``)."""

    num_layers: int = 2
    hidden_size: int = 64
    num_attention_heads: int = 4
    ffn_hidden_size: int = 256


@dataclass(kw_only=True, slots=True)
class SquadConfig:
    """One ``finetune --task squad`` run (no train_file: evaluation of ``load`` only)."""

    train_file: str | None = None
    valid_file: str | None = None
    load_hf: str | None = None
    """HF BERT directory (BertForPreTraining, BertModel or BertForQuestionAnswering) to start from."""
    load: str | None = None
    """tokenmill BERT checkpoint to start from (pre-trained: its encoder; fine-tuned: its span head too)."""
    save: str | None = None
    overwrite_save: bool = False
    """Fine-tune into ``save`` although it holds another run that this one does not continue (``load``): that
    run's checkpoints and files are deleted first (`trainer.checkpoint.save_directory`); without it such a save is refused."""
    output_dir: str | None = None
    """Where predictions.json, nbest_predictions.json and eval_results.json go (default: save)."""
    vocab_file: str | None = None
    """WordPiece vocab.txt (default: the one in load/load_hf)."""
    lower_case: bool | None = None
    """Lower-case the text (default: as the loaded directory says, else True)."""
    features: FeatureOptions = field(default_factory=FeatureOptions)
    scratch: ScratchShape = field(default_factory=ScratchShape)
    optimizer: OptimizerConfig = field(default_factory=lambda: OptimizerConfig(lr=3e-5, min_lr=0.0,
                                                                              weight_decay=0.01))
    epochs: float = 2.0
    micro_batch_size: int = 12
    num_microbatches: int = 1
    tensor_model_parallel_size: int = 1
    hidden_dropout: float | None = None
    """Dropout of the fine-tuning run (default: the loaded model's)."""
    n_best_size: int = 20
    max_answer_length: int = 30
    seed: int = 42
    device: str | None = None

    def __post_init__(self) -> None:
        if self.train_file is None and self.valid_file is None:
            raise ValueError("give train_file (fine-tune) and/or valid_file (evaluate)")
        if self.load is not None and self.load_hf is not None:
            raise ValueError("give load or load_hf, not both")
        if self.train_file is None and self.load is None and self.load_hf is None:
            raise ValueError("evaluating needs a model: give load or load_hf")
        for name in ("micro_batch_size", "num_microbatches", "tensor_model_parallel_size", "n_best_size",
                     "max_answer_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not (math.isfinite(self.epochs) and self.epochs > 0):
            raise ValueError(f"epochs must be a finite number > 0, got {self.epochs}")


@dataclass(slots=True)
class SquadResult:
    """What a run did."""

    losses: list[float] = field(default_factory=list)
    metrics: dict[str, float] | None = None
    answers: dict[str, list[dict]] | None = None


# -- model and tokenizer ------------------------------------------------------------------------------------

def _source_directory(load: str | None, load_hf: str | None) -> Path | None:
    if load_hf is not None:
        return Path(load_hf)
    return resolve_checkpoint(load)[0] if load is not None else None


def wordpiece_backend(vocab_file: str | None, lower_case: bool | None, source: Path | None):
    """The `tokenizers` BertWordPieceTokenizer of ``vocab_file`` or of the source directory's vocab.txt.

    Raises:
        TrainConfigError: no vocabulary, or it cannot be read.
    """
    defaults = bert_tokenizer_defaults(source).get("data", {}) if source is not None else {}
    stored = defaults.get("vocab_file") or ""
    vocab = vocab_file or (stored if stored.endswith(WORDPIECE_VOCAB) else None)
    if vocab is None:
        raise TrainConfigError("give the WordPiece vocabulary (vocab_file); the model directory holds no vocab.txt")
    if lower_case is None:
        lower_case = defaults.get("tokenizer_type", "BertWordPieceLowerCase") == "BertWordPieceLowerCase"
    kind = "BertWordPieceLowerCase" if lower_case else "BertWordPieceCase"
    try:
        return build_tokenizer(TokenizerConfig(tokenizer_type=kind, vocab_file=vocab)).backend, vocab, lower_case
    except (ValueError, TokenizerError) as error:
        raise TrainConfigError(str(error)) from error


def _loaded_state(load: str | None, load_hf: str | None, padded: int) -> tuple[BertShape | None, dict, Vocabulary]:
    """The shape (span head, vocabulary padded to ``padded``) and parameters of the model to start from."""
    if load_hf is not None:
        shape = hf_shape(load_hf, padded, head=SPAN_HEAD)
        state, _ = hf_bert_state(load_hf, shape)
        config = read_hf_config(load_hf)
        return shape, state, Vocabulary(config["vocab_size"], None, config.get("pad_token_id", 0))
    if load is not None:
        root, iteration = resolve_checkpoint(load)
        full, info = read_bert_checkpoint(root, iteration)
        vocab = info["vocab_size"]
        shape = dataclasses.replace(info["shape"], head=SPAN_HEAD, padded_vocab_size=padded, binary_head=False)
        state = {name: (t[:vocab] if t.shape[0] == info["shape"].padded_vocab_size and t.dim() == 2 and
                        name.endswith("word_embeddings.weight") else t) for name, t in full.items()}
        if "word_embeddings.weight" in state:
            rows = state["word_embeddings.weight"]
            state["word_embeddings.weight"] = torch.cat([rows, rows.new_zeros(padded - rows.shape[0], rows.shape[1])])
        return shape, state, Vocabulary(vocab, None, info.get("pad_id"))
    return None, {}, Vocabulary(0, None, None)


def _model_shape(config: SquadConfig, vocab_size: int, tp: int) -> tuple[BertShape, dict, Vocabulary]:
    padded = pad_vocab_size(vocab_size, DEFAULT_DIVISIBLE_BY, tp)
    shape, state, vocabulary = _loaded_state(config.load, config.load_hf, padded)
    if shape is None:
        s = config.scratch
        shape = BertShape(num_layers=s.num_layers, hidden_size=s.hidden_size, num_attention_heads=s.num_attention_heads,
                          ffn_hidden_size=s.ffn_hidden_size, max_position_embeddings=config.features.max_seq_length,
                          padded_vocab_size=padded, binary_head=False, head=SPAN_HEAD,
                          hidden_dropout=0.1, attention_dropout=0.1)
        vocabulary = Vocabulary(vocab_size, None, None)
    if config.hidden_dropout is not None:
        shape = dataclasses.replace(shape, hidden_dropout=config.hidden_dropout, attention_dropout=config.hidden_dropout)
    if shape.max_position_embeddings < config.features.max_seq_length:
        raise TrainConfigError(f"max_seq_length ({config.features.max_seq_length}) exceeds the model's "
                               f"{shape.max_position_embeddings} positions")
    return shape, state, vocabulary


# -- batches ------------------------------------------------------------------------------------------------

def feature_batch(features: list[QAFeature]) -> BertMicroBatch:
    """Stack features into a micro-batch; targets int64 [batch, 2] (start, end)."""
    def stack(name: str) -> torch.Tensor:
        return torch.from_numpy(np.stack([getattr(f, name) for f in features]))
    targets = torch.tensor([[f.start_position, f.end_position] for f in features], dtype=torch.int64)
    return BertMicroBatch(tokens=stack("tokens"), token_types=stack("token_types"),
                          padding_mask=stack("padding_mask"), targets=targets)


def span_logits(model: Bert, features: list[QAFeature], device: torch.device) -> tuple[np.ndarray, np.ndarray]:
    """Start and end logits, float32 [num_features, seq], of an unsharded span model."""
    model.eval()
    starts, ends = [], []
    with torch.no_grad():
        for begin in range(0, len(features), EVAL_BATCH_SIZE):
            batch = feature_batch(features[begin:begin + EVAL_BATCH_SIZE]).to(device)
            start, end = model(*model_inputs(batch))
            starts.append(start.float().cpu().numpy())
            ends.append(end.float().cpu().numpy())
    return np.concatenate(starts), np.concatenate(ends)


# -- fine-tuning ------------------------------------------------------------------------------------------

def _full_state(model: ParallelModel) -> dict[str, torch.Tensor]:
    return {name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu()
            for name, p in model.named_parameters()}


def _train(config: SquadConfig, model: ParallelModel, dims: ParallelDims, features: list[QAFeature], dp_rank: int,
           device: torch.device) -> list[float]:
    """AdamW steps over shuffled epochs of the training features; returns the mean loss of each step."""
    global_batch = dims.global_batch_size
    steps = max(1, int(config.epochs * len(features) / global_batch))
    optimizer = build_optimizer(model.named_parameters(), config.optimizer)
    scheduler = config.optimizer.scheduler(TrainingConfig(train_iters=steps), global_batch)
    rng = np.random.RandomState(config.seed)
    order: list[int] = []
    losses = []
    model.set_train(True)
    for step in range(1, steps + 1):
        while len(order) < global_batch:
            order.extend(rng.permutation(len(features)).tolist())
        batch, order = order[:global_batch], order[global_batch:]
        mine = batch[dp_rank * dims.micro_batch_size * dims.num_microbatches:][:dims.micro_batch_size * dims.num_microbatches]
        micro = [feature_batch([features[i] for i in mine[k:k + dims.micro_batch_size]]).to(device)
                 for k in range(0, len(mine), dims.micro_batch_size)]
        apply_schedule(optimizer, scheduler)  # the rates of the samples before this step, as Megatron
        optimizer.zero_grad(set_to_none=True)
        loss_sum, holds_loss = model.run(micro, train=True)
        optimizer.step()
        scheduler.step(global_batch)
        # The mean over the global batch, the same on every rank (`run` returns this rank's sum).
        losses.append(reduce_loss(loss_sum, holds_loss, len(micro), dims.dp * dims.tp))
        if step % max(1, steps // 10) == 0 or step == steps:
            logger.info("step %d/%d loss %.4f", step, steps, losses[-1])
    return losses


def _save(config: SquadConfig, model: ParallelModel, shape: BertShape, vocabulary: Vocabulary, vocab_file: str,
          rank: int, iteration: int) -> None:
    root = Path(config.save)
    if rank == 0:
        save_model_config(root, shape, vocabulary, "bert")
        if Path(vocab_file).resolve() != (root / WORDPIECE_VOCAB).resolve():
            shutil.copyfile(vocab_file, root / WORDPIECE_VOCAB)
    save_checkpoint(root, iteration, model.checkpoint_state({MODEL_PREFIX + n: p.detach()
                                                               for n, p in model.named_parameters()}))


def evaluate_answers(answers: dict[str, list[dict]], examples: list[QAExample], output_dir: str | None
                     ) -> dict[str, float]:
    """The official metric of the best answers; writes predictions.json (id -> text, the official format),
    nbest_predictions.json and eval_results.json into ``output_dir`` when given."""
    predictions = {qid: candidates[0]["text"] for qid, candidates in answers.items()}
    metrics = squad_metric(predictions, {e.id: [text for text, _ in e.answers] for e in examples})
    if output_dir is not None:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        write_json(Path(output_dir) / NBEST_FILE, answers)
        write_json(Path(output_dir) / PREDICTIONS_FILE, predictions)
        write_json(Path(output_dir) / EVAL_RESULTS_FILE, metrics)
    return metrics


def finetune(config: SquadConfig) -> SquadResult:
    """Fine-tune (when ``train_file``) and evaluate (when ``valid_file``) as ``config`` says.

    Raises:
        SquadFormatError: a malformed SQuAD file.
        TrainConfigError / CheckpointError / HFConversionError: the model or vocabulary cannot be used.
    """
    save = config.save if config.train_file is not None else None  # evaluation alone saves nothing
    check_save_directory(save, config.load, config.overwrite_save)
    device_type = resolve_device_type(config.device)
    ctx = init_distributed(device_type)
    try:
        with claim_save_directory(save, ctx.rank == 0, config.overwrite_save):
            return _finetune(config, ctx)
    finally:
        if ctx.owns_process_group:
            dist.destroy_process_group()


def _finetune(config: SquadConfig, ctx) -> SquadResult:
    if config.load_hf is not None:  # before its files are looked for: a GPT-2 directory is not a BERT
        check_hf_config(read_hf_config(config.load_hf), config.load_hf)
    # The files before the model: a bad one fails before anything is built or trained.
    train_examples = read_squad_file(config.train_file, training=True) if config.train_file is not None else None
    valid_examples = read_squad_file(config.valid_file) if config.valid_file is not None else None
    source = _source_directory(config.load, config.load_hf)
    backend, vocab_file, _ = wordpiece_backend(config.vocab_file, config.lower_case, source)
    tp = config.tensor_model_parallel_size
    if ctx.world_size % tp:
        raise TrainConfigError(f"tensor_model_parallel_size ({tp}) does not divide the {ctx.world_size} processes")
    shape, state, vocabulary = _model_shape(config, backend.get_vocab_size(), tp)
    result = SquadResult()
    dims = ParallelDims(pp=1, dp=ctx.world_size // tp, tp=tp, micro_batch_size=config.micro_batch_size,
                        num_microbatches=config.num_microbatches)
    mesh = dims.build_mesh(device_type=ctx.device.type) if ctx.world_size > 1 else None
    model = ParallelModel(SPAN_PLAN, shape, dims, mesh, ParallelismConfig(tensor_model_parallel_size=tp), ctx.device,
                          config.seed, False, None)
    for name, param in model.named_parameters():
        if name in state:
            copy_into_parameter(param, state[name].to(param.dtype))
    if train_examples is not None:
        features = build_features(train_examples, backend, config.features)
        dp_rank = mesh.get_local_rank("dp") if mesh is not None else 0
        result.losses = _train(config, model, dims, features, dp_rank, ctx.device)
        if config.save is not None:
            _save(config, model, shape, vocabulary, vocab_file, ctx.rank, len(result.losses))
    full = _full_state(model)
    if valid_examples is not None and ctx.rank == 0:
        evaluation = Bert(shape).to(ctx.device)
        evaluation.load_state_dict(full, strict=True)
        features = build_features(valid_examples, backend, config.features)
        result.answers = decode_answers(valid_examples, features, *span_logits(evaluation, features, ctx.device),
                                        config.n_best_size, config.max_answer_length)
        result.metrics = evaluate_answers(result.answers, valid_examples, config.output_dir or config.save)
        logger.info("%s: %s", config.valid_file, result.metrics)
    return result


# -- prediction ---------------------------------------------------------------------------------------------

@dataclass(kw_only=True, slots=True)
class PredictConfig:
    """One ``predict`` call: a fine-tuned span model (checkpoint or HF BertForQuestionAnswering directory)."""

    load: str
    vocab_file: str | None = None
    lower_case: bool | None = None
    features: FeatureOptions = field(default_factory=FeatureOptions)
    n_best_size: int = 20
    max_answer_length: int = 30
    top_k: int = 1
    """Answers printed per question."""
    device: str | None = None

    def __post_init__(self) -> None:
        for name in ("n_best_size", "max_answer_length", "top_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


def load_span_model(load: str) -> Bert:
    """The unsharded span model of a fine-tuned checkpoint or a HF BertForQuestionAnswering directory.

    Raises:
        TrainConfigError: the model has no span head.
    """
    if is_hf_directory(load):
        shape = hf_shape(load)
        state, absent = hf_bert_state(load, shape) if shape.head == SPAN_HEAD else ({}, [])
    else:
        state, info = read_bert_checkpoint(*resolve_checkpoint(load))
        shape, absent = info["shape"], []
    if shape.head != SPAN_HEAD or absent:
        raise TrainConfigError(f"{load}: not a question-answering model (no span head); fine-tune it with "
                               "finetune --task squad first")
    model = Bert(dataclasses.replace(shape, hidden_dropout=0.0, attention_dropout=0.0))
    model.load_state_dict(state, strict=True)
    return model.eval()


def predict(config: PredictConfig, examples: list[QAExample]) -> dict[str, list[dict]]:
    """The ``top_k`` best answers of each example: {'text', 'score', 'start', 'end'} (characters of its context)."""
    model = load_span_model(config.load)
    directory = Path(config.load) if is_hf_directory(config.load) else resolve_checkpoint(config.load)[0]
    backend, _, _ = wordpiece_backend(config.vocab_file, config.lower_case, directory)
    features = build_features(examples, backend, config.features)
    device = torch.device(resolve_device_type(config.device))
    answers = decode_answers(examples, features, *span_logits(model.to(device), features, device),
                             config.n_best_size, config.max_answer_length)
    return {qid: candidates[:config.top_k] for qid, candidates in answers.items()}

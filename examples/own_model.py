"""Train a model of your own on tokenmill's token files, with tokenmill's loop, data, optimizer and metrics.

    python examples/own_model.py data_test/megatron/sample_en_eod_text_document --steps 20 --data-cache-path /tmp/c

A model family is a `ModelSpec` (`trainer/family/spec.py`) registered under a name in
`trainer.models.FAMILIES` (name -> the module holding ``SPEC``); ``TrainConfig.model.model`` (``train
--model``) picks it. This file is such a module: its family ``tiny_mlp`` keeps everything of GPT's spec (the
GPT datasets over the token files, the vocabulary, the layout rules) except the model, which is its own
`TinyLM` (an embedding, residual MLP blocks, a tied output layer) in a `ParallelPlan` that runs it in one
process or data-parallel. With ``--own-dataset`` the training samples come from `ReaderWindows`, a dataset
of your own over any reader (``len(reader)``, ``reader[i]`` -> a document's ids: `indexed_dataset.open_reader`'s
readers of .bin/.idx, Arrow and MindRecord, or an object of yours), put in place by the family's
``training_parts`` (docs/architecture.md, "Bring your own model and data").
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os

import numpy as np
import torch
from torch import nn

from indexed_dataset import open_reader
from trainer.config import DataConfig, LoggingConfig, ModelConfig, OptimizerConfig, TrainConfig, TrainingConfig
from trainer.errors import TrainConfigError
from trainer.models import FAMILIES, model_spec
from trainer.parallel.plan import ParallelPlan
from trainer.train import train

FAMILY = "tiny_mlp"
# The GPT-2 vocabulary of the bundled token files; any vocabulary works (TrainConfig.model.vocab_size).
GPT2_VOCAB_SIZE = 50257
INIT_STD = 0.02


class TinyLM(nn.Module):
    """Token embedding -> ``num_layers`` residual MLP blocks -> logits through the tied embedding.

    What the runner asks of a model (`trainer.parallel.plan.ParallelPlan`): full-model parameter names,
    ``init_parameter`` (draw one full tensor), ``tie_weights`` and a ``checkpoint_activations`` attribute.
    The shape is GPT's (`trainer.models.gpt.model.GPTShape`), made by GPT's ``training_parts``.
    """

    def __init__(self, shape) -> None:
        super().__init__()
        self.embedding = nn.Embedding(shape.padded_vocab_size, shape.hidden_size)
        self.layers = nn.ModuleDict({str(i): nn.Sequential(nn.LayerNorm(shape.hidden_size),
                                                           nn.Linear(shape.hidden_size, shape.ffn_hidden_size),
                                                           nn.GELU(),
                                                           nn.Linear(shape.ffn_hidden_size, shape.hidden_size))
                                     for i in range(shape.num_layers)})
        self.checkpoint_activations = False

    def init_parameter(self, name: str, tensor: torch.Tensor) -> None:
        if name.endswith("bias"):
            tensor.zero_()
        elif tensor.dim() == 1:  # a LayerNorm's scale
            tensor.fill_(1.0)
        else:
            tensor.normal_(0.0, INIT_STD)

    def tie_weights(self) -> None:
        """Nothing to re-tie: the output layer is the embedding itself (see ``forward``)."""

    def forward(self, tokens: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """Logits float [batch, seq, padded_vocab] of int64 [batch, seq] tokens (positions unused: a bag of
        tokens per position, enough to show the loss fall)."""
        hidden = self.embedding(tokens)
        for block in self.layers.values():
            hidden = hidden + block(hidden)
        return hidden @ self.embedding.weight.T


def one_stage(model: nn.Module, stage: int, stages: int) -> nn.Module:
    if stages > 1:
        raise TrainConfigError(f"{FAMILY} runs unpipelined (pipeline_model_parallel_size 1), got {stages} stages")
    return model


def no_tensor_parallel(part: nn.Module, mesh, sequence_parallel: bool) -> None:
    raise TrainConfigError(f"{FAMILY} has no tensor-parallel plan: use tensor_model_parallel_size 1")


PLAN = ParallelPlan(build=TinyLM, num_layers=lambda shape: shape.num_layers, split_stage=one_stage,
                    apply_tp=no_tensor_parallel, blocks=lambda part: list(part.layers.values()),
                    tied_names=lambda shape: None, model_inputs=lambda mb: (mb.tokens, mb.position_ids))
# GPT's spec with this model: datasets, vocabulary and layout rules stay GPT's; its checkpoints, generation and
# scoring are GPT's model's, so a run of this family saves no checkpoint and is not evaluated here.
SPEC = dataclasses.replace(model_spec("gpt"), name=FAMILY, parallel_plan=PLAN, checkpoint_model=TinyLM,
                           vocab_rows=("embedding.weight",), scoring_source=None, tasks=())


class ReaderWindows:
    """Consecutive windows of ``seq_length + 1`` tokens over every document of ``reader`` (documents joined), as
    the items GPT's collate stacks: tokens, labels (the next tokens), loss_mask and position_ids."""

    def __init__(self, reader, seq_length: int) -> None:
        ids = np.concatenate([np.asarray(reader[i], dtype=np.int64) for i in range(len(reader))])
        self.seq_length = seq_length
        self.ids = torch.from_numpy(ids)

    def __len__(self) -> int:
        return (len(self.ids) - 1) // self.seq_length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        window = self.ids[index * self.seq_length:(index + 1) * self.seq_length + 1]
        return {"tokens": window[:-1], "labels": window[1:], "loss_mask": torch.ones(self.seq_length),
                "position_ids": torch.arange(self.seq_length)}


def own_dataset_parts(config, tp, sizes):
    """GPT's training parts with `ReaderWindows` over the first data path as the training set."""
    parts = model_spec("gpt").training_parts(config, tp, sizes)
    train_set = ReaderWindows(open_reader(config.data.data_path[0]), config.model.seq_length)
    return dataclasses.replace(parts, datasets=(train_set, None, None))


def register(own_dataset: bool = False) -> None:
    """Make ``model="tiny_mlp"`` name this module's SPEC (what one line in FAMILIES does for a built-in family);
    with ``own_dataset``, its training samples are `ReaderWindows`."""
    global SPEC
    if own_dataset:
        SPEC = dataclasses.replace(SPEC, training_parts=own_dataset_parts)
    FAMILIES[FAMILY] = __name__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_prefix", help="a .bin/.idx token file prefix (GPT-2 ids)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--data-cache-path", help="index cache folder (default: index-cache/ beside the data)")
    parser.add_argument("--own-dataset", action="store_true", help="train on ReaderWindows over the data")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    register(args.own_dataset)
    result = train(TrainConfig(
        model=ModelConfig(model=FAMILY, num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64,
                          seq_length=32, vocab_size=GPT2_VOCAB_SIZE, hidden_dropout=0.0, attention_dropout=0.0),
        data=DataConfig(data_path=[args.data_prefix], split="98,1,1", data_cache_path=args.data_cache_path),
        training=TrainingConfig(micro_batch_size=4, global_batch_size=8, train_iters=args.steps, device="cpu"),
        optimizer=OptimizerConfig(lr=1e-2, lr_warmup_iters=2),
        logging=LoggingConfig(log_interval=max(1, args.steps // 4), eval_iters=0, metrics_file=os.devnull),
    ))
    print(f"{FAMILY}: loss {result.losses[0]:.3f} -> {result.losses[-1]:.3f} over {result.iteration} steps")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

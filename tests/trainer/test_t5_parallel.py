"""T5 under tensor, pipeline and data parallelism follows the single-process loss curve (CPU, gloo).

One 2-process launch runs every layout in turn (process start-up dominates on CPU); each layout
trains the same tiny T5 with the trainer's `ParallelModel` (T5's plan) from the same seed on the same
span-corruption batches for STEPS AdamW steps, and its per-step losses must match a single-process
run within LOSS_TOLERANCE. Both the tied, scaled v1.0 variant and the untied gated-GELU mT5 variant run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from process_testing import run_jobs

from indexed_dataset import IndexedDatasetWriter
from samplers.t5.dataset import T5DatasetConfig, build_t5_datasets
from trainer.config import OptimizerConfig, ParallelismConfig
from trainer.optim.grads import reduce_loss
from trainer.optim.optimizer import build_optimizer
from trainer.parallel.dims import ParallelDims
from trainer.models.t5.data import collate_t5
from trainer.models.t5.model import T5Shape
from trainer.models.t5.pipeline import t5_stage_layers
from trainer.models.t5.spec import PLAN as T5_PLAN
from trainer.parallel.runner import ParallelModel

STEPS = 10
LOSS_TOLERANCE = 1e-4
WORDS, NUM_SENTINELS = 200, 100
VOCAB = WORDS + NUM_SENTINELS + 4  # divisible by the tensor-parallel size
MICRO_BATCH, NUM_MICROBATCHES = 2, 2
V1_0 = dict(feed_forward="relu", tie_word_embeddings=True, scale_decoder_outputs=True)
MT5 = dict(feed_forward="gated-gelu", tie_word_embeddings=False, scale_decoder_outputs=False)


def tiny_shape(variant: dict, layers: tuple[int, int] = (2, 2)) -> T5Shape:
    return T5Shape(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_heads=4, num_encoder_layers=layers[0],
                   num_decoder_layers=layers[1], relative_attention_num_buckets=8, relative_attention_max_distance=16,
                   **variant)


def make_batches(directory: Path) -> list[list[dict[str, torch.Tensor]]]:
    """STEPS global batches (NUM_MICROBATCHES x MICRO_BATCH samples) of T5 items from a small corpus."""
    rng = np.random.RandomState(0)
    counts = rng.randint(1, 6, size=40)
    lengths = rng.randint(3, 12, size=int(counts.sum()))
    with IndexedDatasetWriter(str(directory / "corpus"), np.uint16) as writer:
        writer.add_documents(rng.randint(2, WORDS, size=int(lengths.sum())).astype(np.uint16), lengths, counts)
    config = T5DatasetConfig(data_prefix=str(directory / "corpus"), split="1,0,0", encoder_seq_length=32,
                             decoder_seq_length=16, sentinel_ids=tuple(range(WORDS, WORDS + NUM_SENTINELS)),
                             pad_id=0, decoder_start_id=0, eos_id=1, path_to_cache=str(directory / "cache"))
    per_step = MICRO_BATCH * NUM_MICROBATCHES
    train = build_t5_datasets(config, sizes=(STEPS * per_step, None, None))[0]
    return [[train[step * per_step + i] for i in range(per_step)] for step in range(STEPS)]


def split_micro(items):
    return [items[i : i + MICRO_BATCH] for i in range(0, len(items), MICRO_BATCH)]


def run_parallel_t5(variant: dict, batches, layers: tuple[int, int] = (2, 2), pp: int = 1, dp: int = 1, tp: int = 1,
                    **parallelism) -> list[float]:
    """The trainer's way: `ParallelModel` with T5's plan on a (pp, dp, tp) mesh, `run` per step, the logged mean loss."""
    dims = ParallelDims(pp=pp, dp=dp, tp=tp, micro_batch_size=MICRO_BATCH,
                        num_microbatches=NUM_MICROBATCHES * MICRO_BATCH // (MICRO_BATCH * dp))
    mesh = dims.build_mesh("cpu") if dims.world_size > 1 else None
    config = ParallelismConfig(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, **parallelism)
    model = ParallelModel(T5_PLAN, tiny_shape(variant, layers), dims, mesh, config, torch.device("cpu"), seed=0,
                          checkpoint_activations=False, autocast_dtype=None)
    optimizer = build_optimizer(model.named_parameters(), OptimizerConfig(lr=3e-3, weight_decay=0.0), foreach=False)
    dp_rank = mesh.get_local_rank("dp") if mesh is not None else 0
    model.set_train(True)
    losses = []
    for step_items in batches:
        # Megatron's order: each micro-step takes MICRO_BATCH x dp samples, rank r the r-th slice.
        mine = [items for k, items in enumerate(split_micro(step_items)) if k % dp == dp_rank]
        optimizer.zero_grad(set_to_none=True)
        loss_sum, holds_loss = model.run([collate_t5(items, VOCAB) for items in mine], train=True)
        optimizer.step()
        losses.append(reduce_loss(loss_sum, holds_loss, dims.num_microbatches, dp * tp))
    return losses


def test_stage_layer_ranges_cover_encoder_then_decoder():
    assert t5_stage_layers(2, 2, 0, 2) == (range(0, 2), range(0, 0))
    assert t5_stage_layers(2, 2, 1, 2) == (range(2, 2), range(0, 2))
    assert t5_stage_layers(3, 3, 1, 3) == (range(2, 3), range(0, 1))
    with pytest.raises(ValueError, match="not divisible"):
        t5_stage_layers(3, 2, 0, 2)


LAYOUTS = {
    "tp2 v1.0": (V1_0, dict(tp=2)),
    "tp2 mt5": (MT5, dict(tp=2)),
    "pp2 v1.0": (V1_0, dict(pp=2)),
    "pp2 mt5": (MT5, dict(pp=2)),
    # The second stage ends the encoder and starts the decoder.
    "pp2 v1.0 3+1 layers": (V1_0, dict(pp=2, layers=(3, 1))),
    "pp2 interleaved v1.0": (V1_0, dict(pp=2, pipeline_schedule="interleaved",
                                        num_layers_per_virtual_pipeline_stage=1)),
    "dp2 ddp v1.0": (V1_0, dict(dp=2)),
    "dp2 fsdp v1.0": (V1_0, dict(dp=2, zero_stage=3)),
}


@pytest.mark.slow
def test_tp_pp_dp_follow_the_single_process_losses(tmp_path):
    batches = make_batches(tmp_path)
    references = {}
    for variant, layout in LAYOUTS.values():
        key = (variant["feed_forward"], layout.get("layers", (2, 2)))
        if key not in references:
            references[key] = run_parallel_t5(variant, batches, layers=key[1])
    assert all(losses[-1] < losses[0] for losses in references.values()), "the references should learn"
    results = run_jobs(2, [(run_parallel_t5, (variant, batches), layout) for variant, layout in LAYOUTS.values()],
                     tmp_path)
    for (name, (variant, layout)), losses in zip(LAYOUTS.items(), results):
        reference = references[(variant["feed_forward"], layout.get("layers", (2, 2)))]
        gap = np.max(np.abs(np.subtract(losses, reference)))
        print(f"{name}: max |loss - single process| over {STEPS} steps = {gap:.2e}")
        assert len(losses) == STEPS
        np.testing.assert_allclose(losses, reference, atol=LOSS_TOLERANCE, rtol=0, err_msg=name)

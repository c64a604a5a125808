"""How many samples of each split a training run reads, Megatron's rule, written once.

    run = RunLength(train_iters=500, global_batch_size=8, eval_interval=100, eval_iters=10)
    run.sizes()                         # (4000, 480, 80): train, valid, test samples
    run.consumed_valid_samples(300)     # 240: where the valid iterator resumes at iteration 300
    run.explain("valid")                # "--eval-iters 10 x (--train-iters 500 // --eval-interval 100 + 1) x ..."

Megatron keeps one validation iterator for the whole run: the evaluation at every multiple of
`eval_interval`, and the one after training, each read the next `eval_iters` global batches. So the
validation split is sized for `train_iters // eval_interval + 1` evaluations, and the test split (read
once, at the end) for one (megatron/training/training.py, `get_train_valid_test_num_samples`). `train`,
`build-indices` and `inspect-index` all take their sample counts from here, so their index caches match.
"""

from __future__ import annotations

from dataclasses import dataclass

# Spellings of the flags behind the counts, for messages (Megatron's, shared by train, build-indices and inspect-index).
TRAIN_ITERS_FLAG = "--train-iters"
TRAIN_SAMPLES_FLAG = "--train-samples"
GLOBAL_BATCH_FLAG = "--global-batch-size"
EVAL_INTERVAL_FLAG = "--eval-interval"
EVAL_ITERS_FLAG = "--eval-iters"
# Megatron's (and train's) defaults of the evaluation flags.
DEFAULT_EVAL_INTERVAL = 1000
DEFAULT_EVAL_ITERS = 100


@dataclass(frozen=True, kw_only=True)
class RunLength:
    """A run's length in Megatron's terms (steps and samples per step)."""

    train_iters: int
    """Optimiser steps of the whole run."""
    global_batch_size: int
    """Samples per step, over every data-parallel rank and micro-batch."""
    eval_interval: int
    """Steps between evaluations on the validation split."""
    eval_iters: int
    """Global batches per evaluation (0: no evaluation, no validation or test samples)."""
    train_samples: int | None = None
    """A run sized in samples (--train-samples): the train split's size, as in Megatron (the steps are its
    whole global batches)."""

    def __post_init__(self) -> None:
        for name in ("train_iters", "global_batch_size", "eval_interval"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.eval_iters < 0:
            raise ValueError(f"eval_iters must be >= 0, got {self.eval_iters}")

    @property
    def num_evaluations(self) -> int:
        """Evaluations on the validation split: one per multiple of `eval_interval`, one after training."""
        return self.train_iters // self.eval_interval + 1

    @property
    def samples_per_evaluation(self) -> int:
        return self.eval_iters * self.global_batch_size

    def sizes(self) -> tuple[int, int, int]:
        """Samples wanted of the train, valid and test splits."""
        train = self.train_samples if self.train_samples is not None else self.train_iters * self.global_batch_size
        return train, self.num_evaluations * self.samples_per_evaluation, self.samples_per_evaluation

    def consumed_valid_samples(self, iteration: int) -> int:
        """Validation samples read by the evaluations of steps 1..`iteration` (where a resumed run's
        validation iterator starts; Megatron's rebuild rule)."""
        return (iteration // self.eval_interval) * self.samples_per_evaluation

    def explain(self, split: str) -> str:
        """How the flags give `split`'s sample count, e.g. "--eval-iters 100 x --global-batch-size 8 = 800"."""
        batch = f"{GLOBAL_BATCH_FLAG} {self.global_batch_size}"
        size = dict(zip(("train", "valid", "test"), self.sizes()))[split]
        if split == "train" and self.train_samples is not None:
            formula = f"{TRAIN_SAMPLES_FLAG} {self.train_samples}"
        elif split == "train":
            formula = f"{TRAIN_ITERS_FLAG} {self.train_iters} x {batch}"
        elif split == "valid":
            formula = (f"{EVAL_ITERS_FLAG} {self.eval_iters} x ({TRAIN_ITERS_FLAG} {self.train_iters} // "
                       f"{EVAL_INTERVAL_FLAG} {self.eval_interval} + 1) x {batch}")
        elif split == "test":
            formula = f"{EVAL_ITERS_FLAG} {self.eval_iters} x {batch}"
        else:
            raise ValueError(f"unknown split {split!r}")
        return f"{formula} = {size}"

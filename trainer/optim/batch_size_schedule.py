"""The global batch size of each step as Megatron sets it from the samples consumed before it: constant,
--rampup-batch-size START INCR SAMPLES (megatron-core 0.16.1's `RampupBatchsizeNumMicroBatchesCalculator`), or
--step-batch-size-schedule "THRESHOLD:BS ..." (Megatron-LM HEAD's `StepBatchsizeNumMicroBatchesCalculator`).

    schedule = parse_step_batch_size_schedule("0:16 2.4B:320", seq_length=2048)
    schedule(consumed_samples)        # -> the global batch size (samples) of the next step
    train_iters_for_samples(train_samples, schedule, global_batch_size, rampup_samples=None)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trainer.errors import TrainConfigError

# Megatron's suffixes of a --step-batch-size-schedule threshold or batch size.
STEP_SUFFIXES = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}

BatchSizeSchedule = Callable[[int], int]
"""consumed samples -> the global batch size (samples) of the next step."""


@dataclass(frozen=True, slots=True)
class RampupBatchSize:
    """From ``start`` up by ``increment`` to ``final`` over ``samples`` samples, in equal intervals."""

    start: int
    increment: int
    samples: int
    final: int

    def __post_init__(self) -> None:
        if self.start <= 0 or self.increment <= 0 or self.samples < 0:
            raise TrainConfigError(f"rampup_batch_size ({self.start} {self.increment} {self.samples}): the start "
                                   "and the increment must be positive, the samples not negative")
        if self.final < self.start or (self.final - self.start) % self.increment:
            raise TrainConfigError(f"rampup_batch_size: global_batch_size ({self.final}) minus the start "
                                   f"({self.start}) must be a non-negative multiple of the increment "
                                   f"({self.increment})")

    def sizes(self) -> tuple[int, ...]:
        """Every global batch size the ramp takes."""
        return tuple(range(self.start, self.final + 1, self.increment))

    def __call__(self, consumed_samples: int) -> int:
        if consumed_samples > self.samples or self.final == self.start:
            return self.final
        per_increment = self.samples / ((self.final - self.start) // self.increment)
        return self.start + int(consumed_samples / per_increment) * self.increment


@dataclass(frozen=True, slots=True)
class StepBatchSize:
    """``(threshold samples, global batch size)`` pairs, thresholds increasing from 0."""

    steps: tuple[tuple[int, int], ...]

    def sizes(self) -> tuple[int, ...]:
        """Every global batch size the schedule takes."""
        return tuple(size for _, size in self.steps)

    def __call__(self, consumed_samples: int) -> int:
        batch_size = self.steps[0][1]
        for threshold, size in self.steps:
            if consumed_samples < threshold:
                break
            batch_size = size
        return batch_size


def _schedule_number(text: str, entry: str) -> int:
    text = text.strip().upper()
    multiplier = STEP_SUFFIXES.get(text[-1:], 1)
    if multiplier != 1:
        text = text[:-1]
    try:
        return int(float(text) * multiplier)
    except ValueError:
        raise TrainConfigError(f"step_batch_size_schedule: {entry!r} is not THRESHOLD:BATCH_SIZE "
                               "(numbers, optional K/M/B/T suffix)") from None


def parse_step_batch_size_schedule(text: str, seq_length: int | None) -> StepBatchSize:
    """Megatron's grammar: "THRESHOLD:BS ..." (spaces or commas), thresholds in tokens when ``seq_length`` is
    given (Megatron always gives it), converted to samples by floor division.

    Raises:
        TrainConfigError: an entry is malformed, the first threshold is not 0, the thresholds do not increase,
            or a batch size is not positive.
    """
    steps = []
    for entry in text.replace(",", " ").split():
        if ":" not in entry:
            raise TrainConfigError(f"step_batch_size_schedule: {entry!r} is not THRESHOLD:BATCH_SIZE")
        threshold_text, size_text = entry.split(":", 1)
        threshold, size = _schedule_number(threshold_text, entry), _schedule_number(size_text, entry)
        steps.append((threshold // seq_length if seq_length is not None else threshold, size))
    steps.sort(key=lambda step: step[0])
    if not steps or steps[0][0] != 0:
        raise TrainConfigError(f"step_batch_size_schedule {text!r}: the first threshold must be 0")
    for (before, _), (after, _) in zip(steps, steps[1:]):
        if after <= before:
            raise TrainConfigError(f"step_batch_size_schedule {text!r}: thresholds must increase "
                                   f"({before} then {after} samples)")
    if any(size <= 0 for _, size in steps):
        raise TrainConfigError(f"step_batch_size_schedule {text!r}: batch sizes must be positive")
    return StepBatchSize(tuple(steps))


def train_iters_for_samples(train_samples: int, schedule: BatchSizeSchedule | None, global_batch_size: int,
                            rampup_samples: int | None = None) -> int:
    """The steps of a --train-samples run (Megatron's `update_train_iters`): with a constant batch the whole
    batches; with a step schedule, steps until ``train_samples`` are reached (the last may pass it); with a ramp,
    the ramp's steps then the whole final batches that fit (``rampup_samples``: the ramp's length)."""
    if schedule is None:
        return train_samples // global_batch_size
    iterations = consumed = 0
    if rampup_samples is None:  # a step schedule: steps until train_samples are reached
        while consumed < train_samples:
            consumed += schedule(consumed)
            iterations += 1
        return iterations
    # A ramp: its steps up to and including its last sample, then the whole final batches that fit.
    while consumed <= min(rampup_samples, train_samples):
        consumed += schedule(consumed)
        iterations += 1
    return iterations + max(0, train_samples - consumed) // global_batch_size


def samples_after(schedule: BatchSizeSchedule, steps: int) -> int:
    """The samples ``steps`` steps of ``schedule`` consume from the start of a run."""
    consumed = 0
    for _ in range(steps):
        consumed += schedule(consumed)
    return consumed


def check_batch_sizes(schedule: RampupBatchSize | StepBatchSize, samples_per_microbatch: int) -> None:
    """Megatron's rule for a changing batch: each of its sizes is whole micro-batches on every data-parallel rank.

    Raises:
        TrainConfigError: naming the batch size.
    """
    name = "rampup_batch_size" if isinstance(schedule, RampupBatchSize) else "step_batch_size_schedule"
    for size in schedule.sizes():
        if size % samples_per_microbatch:
            raise TrainConfigError(f"{name}: the global batch size {size} is not a multiple of micro_batch_size x "
                                   f"data-parallel size ({samples_per_microbatch})")

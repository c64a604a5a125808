"""Megatron's learning-rate and weight-decay schedule (megatron.core.optimizer_param_scheduler), in plain Python.

The schedule counts *samples*, not steps: `ParamScheduler.step` adds the samples of each optimiser step that was
taken, and the rates of step i are those at the samples consumed before it. So with warm-up, step 1 runs at
``lr_warmup_init`` (default 0), as in Megatron; a skipped step (fp16 overflow) does not advance it. Warm-up, decay
and weight-decay lengths are in samples too: `trainer.config.OptimizerConfig.scheduler` converts the iteration
flags with the global batch size, as Megatron's `get_optimizer_param_scheduler` does.

    scheduler = config.optimizer.scheduler(config.training, global_batch_size=8)
    lr, wd = scheduler.lr(), scheduler.wd()       # the rates of the next step
    scheduler.step(8)                             # after the step: 8 more samples consumed

`state_dict` holds Megatron's keys, so a checkpoint carries the schedule and a resume continues it exactly.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from trainer.errors import TrainConfigError

logger = logging.getLogger(__name__)

# Megatron's --lr-decay-style, --lr-wsd-decay-style and --weight-decay-incr-style choices.
LR_DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root", "WSD")
LR_WSD_DECAY_STYLES = ("exponential", "linear", "cosine", "minus_sqrt")
WD_INCR_STYLES = ("constant", "linear", "cosine")

# The keys of Megatron's `OptimizerParamScheduler.state_dict` (a checkpoint holds them), numbers and names apart.
NUMERIC_STATE_KEYS = ("max_lr", "min_lr", "lr_warmup_steps", "lr_decay_steps", "num_steps", "start_wd", "end_wd",
                      "wd_incr_steps")
STYLE_STATE_KEYS = {"lr_decay_style": LR_DECAY_STYLES, "wd_incr_style": WD_INCR_STYLES}


def _cosine_down(ratio: float) -> float:
    """1 at ``ratio`` 0 down to 0 at 1, along half a cosine."""
    return 0.5 * (math.cos(math.pi * ratio) + 1.0)


@dataclass(slots=True)
class ParamScheduler:
    """Megatron's `OptimizerParamScheduler`: lengths in samples (float: a warm-up fraction need not be whole).

    Attributes:
        init_lr: the rate at sample 0 of the warm-up (--lr-warmup-init).
        max_lr, min_lr: the peak and the floor (--lr, --min-lr).
        lr_warmup_steps, lr_decay_steps: samples of linear warm-up, and up to the end of the decay.
        lr_decay_style: one of `LR_DECAY_STYLES`.
        start_wd, end_wd, wd_incr_steps, wd_incr_style: weight decay from ``start_wd`` to ``end_wd`` over
            ``wd_incr_steps`` samples (`WD_INCR_STYLES`).
        wsd_decay_steps, lr_wsd_decay_style: WSD's annealing, the last ``wsd_decay_steps`` samples of the decay.
        use_checkpoint, override: on `load_state_dict`, take the checkpoint's values, or this run's
            (--use-checkpoint-opt_param-scheduler, --override-opt_param-scheduler); default: they must agree,
            but for ``run_length_keys``, the lengths no flag gave (they follow train_iters/train_samples), which
            take this run's values.
        num_steps: samples consumed by the steps taken.
    """

    init_lr: float
    max_lr: float
    min_lr: float
    lr_warmup_steps: float
    lr_decay_steps: float
    lr_decay_style: str
    start_wd: float
    end_wd: float
    wd_incr_steps: float
    wd_incr_style: str
    wsd_decay_steps: float | None = None
    lr_wsd_decay_style: str = "exponential"
    use_checkpoint: bool = False
    override: bool = False
    run_length_keys: frozenset[str] = frozenset()
    num_steps: float = 0

    def __post_init__(self) -> None:
        # Megatron's asserts, as one line each.
        problems = (
            (self.min_lr < 0, f"min_lr ({self.min_lr}) is negative"),
            (self.max_lr < self.min_lr, f"min_lr ({self.min_lr}) is larger than lr ({self.max_lr})"),
            (self.init_lr > self.max_lr, f"lr_warmup_init ({self.init_lr}) is larger than lr ({self.max_lr})"),
            (self.lr_decay_steps <= 0, f"the decay is {self.lr_decay_steps} samples long: it must be positive"),
            (self.lr_warmup_steps >= self.lr_decay_steps,
             f"the warm-up ({count_text(self.lr_warmup_steps)} samples) must be shorter than the decay "
             f"({count_text(self.lr_decay_steps)} samples; lr_decay_iters/lr_decay_samples, default the run)"),
            (self.lr_decay_style == "WSD" and self.wsd_decay_steps is None,
             "lr_decay_style WSD needs lr_wsd_decay_iters or lr_wsd_decay_samples"),
            (self.start_wd < 0, f"start_weight_decay ({self.start_wd}) is negative"),
            (self.end_wd < self.start_wd,
             f"end_weight_decay ({self.end_wd}) is smaller than start_weight_decay ({self.start_wd})"),
            (self.override and self.use_checkpoint,
             "give either override_opt_param_scheduler or use_checkpoint_opt_param_scheduler, not both"),
        )
        for failed, message in problems:
            if failed:
                raise TrainConfigError(message)

    def step(self, increment: float) -> None:
        """Advance by the ``increment`` samples of an optimiser step that was taken."""
        self.num_steps += increment

    def wd(self) -> float:
        """The weight decay of the next step."""
        if self.num_steps > self.wd_incr_steps or self.wd_incr_style == "constant":
            return self.end_wd
        ratio = float(self.num_steps) / float(self.wd_incr_steps)
        coeff = ratio if self.wd_incr_style == "linear" else _cosine_down(1.0 - ratio)
        return self.start_wd + coeff * (self.end_wd - self.start_wd)

    def lr(self, max_lr: float | None = None, min_lr: float | None = None) -> float:
        """The learning rate of the next step; ``max_lr``/``min_lr`` replace the run's for one parameter group
        (--decoupled-lr, --decoupled-min-lr), as Megatron's per-group overrides do."""
        max_lr = self.max_lr if max_lr is None else max_lr
        min_lr = self.min_lr if min_lr is None else min_lr
        if self.lr_warmup_steps > 0 and self.num_steps <= self.lr_warmup_steps:
            return self.init_lr + (max_lr - self.init_lr) * float(self.num_steps) / float(self.lr_warmup_steps)
        if self.lr_decay_style == "constant":
            return max_lr
        if self.num_steps > self.lr_decay_steps:
            return min_lr
        if self.lr_decay_style == "inverse-square-root":
            warmup_steps, num_steps = max(self.lr_warmup_steps, 1), max(self.num_steps, 1)
            return max(min_lr, max_lr * warmup_steps**0.5 / (num_steps**0.5))
        ratio = float(self.num_steps - self.lr_warmup_steps) / float(self.lr_decay_steps - self.lr_warmup_steps)
        if self.lr_decay_style == "linear":
            coeff = 1.0 - ratio
        elif self.lr_decay_style == "cosine":
            coeff = _cosine_down(ratio)
        else:  # WSD: stable at max_lr, then anneal over the last wsd_decay_steps samples
            coeff = self._wsd_coeff()
        return min_lr + coeff * (max_lr - min_lr)

    def _wsd_coeff(self) -> float:
        anneal_start = self.lr_decay_steps - self.wsd_decay_steps
        if self.num_steps <= anneal_start:
            return 1.0
        ratio = float(self.num_steps - anneal_start) / float(self.wsd_decay_steps)
        if self.lr_wsd_decay_style == "linear":
            return 1.0 - ratio
        if self.lr_wsd_decay_style == "cosine":
            return _cosine_down(ratio)
        if self.lr_wsd_decay_style == "exponential":
            return 2.0 * math.pow(0.5, ratio) - 1.0
        return 1.0 - math.sqrt(ratio)  # minus_sqrt

    def state_dict(self) -> dict[str, float | str]:
        """Megatron's keys and values."""
        return {"max_lr": self.max_lr, "lr_warmup_steps": self.lr_warmup_steps, "num_steps": self.num_steps,
                "lr_decay_style": self.lr_decay_style, "lr_decay_steps": self.lr_decay_steps, "min_lr": self.min_lr,
                "start_wd": self.start_wd, "end_wd": self.end_wd, "wd_incr_style": self.wd_incr_style,
                "wd_incr_steps": self.wd_incr_steps}

    def load_state_dict(self, state: dict[str, float | str]) -> None:
        """Continue a saved schedule. Each setting comes from this run with ``override``, from the checkpoint
        with ``use_checkpoint``; otherwise the two must agree (Megatron's rule).

        Raises:
            TrainConfigError: a setting differs and neither flag is given; names the setting and both values.
        """
        settings = ("max_lr", "min_lr", "lr_warmup_steps", "lr_decay_steps", "lr_decay_style", "start_wd", "end_wd",
                    "wd_incr_steps", "wd_incr_style")
        for name in settings:
            setattr(self, name, self._check_and_set(name, getattr(self, name), state[name]))
        self.num_steps += state["num_steps"]

    def _check_and_set(self, name: str, ours: float | str, saved: float | str) -> float | str:
        if self.override:
            return ours
        if name in self.run_length_keys and ours != saved and not self.use_checkpoint:
            # A run extended (or shortened) on resume: where Megatron stops, the lengths that follow the run's
            # length follow the new one.
            logger.warning("the run's length changed since the checkpoint: the schedule's %s follows it "
                           "(%s samples, the checkpoint's %s)", name, count_text(ours), count_text(saved))
            return ours
        if not self.use_checkpoint and ours != saved:
            raise TrainConfigError(f"the checkpoint's learning-rate schedule has {name} {saved}, this run {ours}: "
                                   "give --override-opt_param-scheduler (this run's) or "
                                   "--use-checkpoint-opt_param-scheduler (the checkpoint's)")
        return saved


def count_text(samples: float) -> str:
    """``16`` for 16.0, ``3.75`` for 3.75: a length as the user reads it."""
    return str(int(samples)) if float(samples).is_integer() else str(samples)

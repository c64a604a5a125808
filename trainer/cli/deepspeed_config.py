"""``train --deepspeed-config ds_config.json``: a DeepSpeed JSON config read as ``train`` flags.

The keys that have one of our flags become its command-line words, placed before the command line's own
(flags given there win, as with ``--config``):

    train_batch_size                   --global-batch-size
    train_micro_batch_size_per_gpu     --micro-batch-size
    gradient_accumulation_steps        --num-accumulation-steps
    gradient_clipping                  --clip-grad
    steps_per_print                    --log-interval
    wall_clock_breakdown true          --timing-log-level 1 (forward-backward, clipping, optimiser, data ms per step)
    fp16.enabled                       --fp16 (loss_scale 0: dynamic; > 0: --loss-scale)
    fp16.{loss_scale_window, hysteresis, min_loss_scale}   the flags of the same names
    fp16.initial_scale_power           --initial-loss-scale 2**power
    bf16.enabled                       --bf16
    zero_optimization.stage            --zero-stage
    zero_optimization.offload_optimizer.device cpu (or the older cpu_offload: true)   --cpu-offload
    optimizer {type Adam/AdamW, params lr betas eps weight_decay}   --lr --adam-beta1/2 --adam-eps --weight-decay
    scheduler WarmupLR / WarmupDecayLR (warmup_type linear)          --lr-warmup-iters, constant / linear decay

DeepSpeed's consistency rule, train_batch_size = micro x accumulation x data parallel, is checked here as
far as the file tells (train_batch_size a multiple of micro x accumulation) and with the data-parallel
size by the layout check (`trainer.parallel.dims`). ``zero_allow_untested_optimizer`` is DeepSpeed's
permission to run ZeRO with an optimiser it has not tested with ZeRO: every optimiser tokenmill builds (AdamW,
on the device or offloaded, `trainer.parallel.zero.build_zero_optimizer`) is tested with every stage, so the permission
is always granted and the key (true or false) changes nothing. Any other key is refused with one line naming
the file and the key.
"""

from __future__ import annotations

import math
from typing import Any

from indexed_dataset.structured_files import read_json_file
from trainer.errors import TrainConfigError

# DeepSpeed's permission for optimisers untested with ZeRO: ours are all tested with every stage, so it is
# always granted (CPM-Pretrain's ds_config_t5.json sets it).
ALWAYS_GRANTED_KEY = "zero_allow_untested_optimizer"
# DeepSpeed's per-phase timers; Megatron's timing level 1 times the same phases.
BREAKDOWN_KEY, BREAKDOWN_FLAG = "wall_clock_breakdown", "--timing-log-level"
BREAKDOWN_LEVEL = 1
# Top-level keys whose value is one flag's value.
SCALAR_FLAGS = {"train_batch_size": "--global-batch-size", "train_micro_batch_size_per_gpu": "--micro-batch-size",
                "gradient_accumulation_steps": "--num-accumulation-steps", "gradient_clipping": "--clip-grad",
                "steps_per_print": "--log-interval"}
FP16_FLAGS = {"loss_scale_window": "--loss-scale-window", "hysteresis": "--hysteresis",
              "min_loss_scale": "--min-loss-scale"}
OPTIMIZER_FLAGS = {"lr": "--lr", "eps": "--adam-eps", "weight_decay": "--weight-decay"}
ADAM_TYPES = ("adam", "adamw")
SCHEDULER_DECAY = {"WarmupLR": "constant", "WarmupDecayLR": "linear"}
OFFLOAD_DEVICES = ("cpu", "none")


class _Reader:
    """Turns one parsed file into flag words; every refusal names the file and the dotted key."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.words: list[str] = []

    def fail(self, key: str, problem: str) -> TrainConfigError:
        return TrainConfigError(f"{self.path}: {key}: {problem}")

    def section(self, key: str, value: Any, allowed: tuple[str, ...]) -> dict:
        """``value`` as a JSON object whose keys are all in ``allowed``."""
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a JSON object, got {value!r}")
        for name in value:
            if name not in allowed:
                raise self.fail(f"{key}.{name}", "is not a key tokenmill reads (see trainer/cli/deepspeed_config.py)")
        return value

    def number(self, key: str, value: Any, integer: bool = False) -> str:
        kind = int if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kind):
            raise self.fail(key, f"expected {'an integer' if integer else 'a number'}, got {value!r}")
        if not math.isfinite(value):  # JSON's Infinity and NaN, which Python's json reads as floats
            raise self.fail(key, f"expected a finite number, got {value!r}")
        return str(value)

    def switch(self, key: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, f"expected true or false, got {value!r}")
        return value

    def add(self, flag: str, value: str | None = None) -> None:
        # --flag=VALUE keeps a negative number from being read as a flag.
        self.words.append(flag if value is None else f"{flag}={value}")


def read_deepspeed_config(path: str) -> list[str]:
    """The ``train`` words of DeepSpeed config ``path``.

    Raises:
        TrainConfigError: the file cannot be read, is not a JSON object, has a key without an equivalent or
            a value of the wrong kind, or its batch sizes disagree.
    """
    content = _read(path)
    reader = _Reader(path)
    for key, value in content.items():
        if key == ALWAYS_GRANTED_KEY:
            reader.switch(key, value)
        elif key == BREAKDOWN_KEY:
            if reader.switch(key, value):
                reader.add(BREAKDOWN_FLAG, str(BREAKDOWN_LEVEL))
        elif key in SCALAR_FLAGS:
            reader.add(SCALAR_FLAGS[key], reader.number(key, value, integer=key != "gradient_clipping"))
        elif key == "fp16":
            _fp16(reader, value)
        elif key == "bf16":
            if reader.switch("bf16.enabled", reader.section(key, value, ("enabled",)).get("enabled", False)):
                reader.add("--bf16")
        elif key == "zero_optimization":
            _zero(reader, value)
        elif key == "optimizer":
            _optimizer(reader, value)
        elif key == "scheduler":
            _scheduler(reader, value)
        else:
            raise reader.fail(key, "is not a key tokenmill reads (see trainer/cli/deepspeed_config.py)")
    _check_batch(reader, content)
    return reader.words


def _read(path: str) -> dict:
    try:
        content = read_json_file(path, error=TrainConfigError)
    except OSError as error:
        raise TrainConfigError(f"{path}: cannot read the DeepSpeed config ({error.strerror})") from None
    if not isinstance(content, dict):
        raise TrainConfigError(f"{path}: expected a JSON object, got a {type(content).__name__}")
    return content


def _fp16(reader: _Reader, value: Any) -> None:
    fp16 = reader.section("fp16", value, ("enabled", "loss_scale", "initial_scale_power", *FP16_FLAGS))
    if not reader.switch("fp16.enabled", fp16.get("enabled", False)):
        return
    reader.add("--fp16")
    scale = float(reader.number("fp16.loss_scale", fp16.get("loss_scale", 0)))
    if scale > 0:  # DeepSpeed: 0 means dynamic scaling
        reader.add("--loss-scale", str(scale))
    if "initial_scale_power" in fp16:
        power = int(reader.number("fp16.initial_scale_power", fp16["initial_scale_power"], integer=True))
        reader.add("--initial-loss-scale", str(float(2**power)))
    for key, flag in FP16_FLAGS.items():
        if key in fp16:
            reader.add(flag, reader.number(f"fp16.{key}", fp16[key], integer=key != "min_loss_scale"))


def _zero(reader: _Reader, value: Any) -> None:
    zero = reader.section("zero_optimization", value, ("stage", "offload_optimizer", "cpu_offload"))
    if "stage" in zero:
        reader.add("--zero-stage", reader.number("zero_optimization.stage", zero["stage"], integer=True))
    offload = False
    if "cpu_offload" in zero:  # DeepSpeed's older spelling
        offload = reader.switch("zero_optimization.cpu_offload", zero["cpu_offload"])
    if "offload_optimizer" in zero:
        options = reader.section("zero_optimization.offload_optimizer", zero["offload_optimizer"],
                                 ("device", "pin_memory"))
        device = options.get("device", "none")
        if device not in OFFLOAD_DEVICES:
            raise reader.fail("zero_optimization.offload_optimizer.device",
                              f"{device!r} is not one of {', '.join(OFFLOAD_DEVICES)}")
        offload = offload or device == "cpu"
    if offload:
        reader.add("--cpu-offload")


def _optimizer(reader: _Reader, value: Any) -> None:
    optimizer = reader.section("optimizer", value, ("type", "params"))
    kind = optimizer.get("type")
    if not isinstance(kind, str) or kind.lower() not in ADAM_TYPES:
        raise reader.fail("optimizer.type", f"{kind!r} is not Adam or AdamW (the one optimiser tokenmill has)")
    params = reader.section("optimizer.params", optimizer.get("params", {}), ("betas", *OPTIMIZER_FLAGS))
    for key, flag in OPTIMIZER_FLAGS.items():
        if key in params:
            reader.add(flag, reader.number(f"optimizer.params.{key}", params[key]))
    if "betas" in params:
        betas = params["betas"]
        if not (isinstance(betas, list) and len(betas) == 2):
            raise reader.fail("optimizer.params.betas", f"expected [beta1, beta2], got {betas!r}")
        reader.add("--adam-beta1", reader.number("optimizer.params.betas", betas[0]))
        reader.add("--adam-beta2", reader.number("optimizer.params.betas", betas[1]))


def _scheduler(reader: _Reader, value: Any) -> None:
    scheduler = reader.section("scheduler", value, ("type", "params"))
    kind = scheduler.get("type")
    if kind not in SCHEDULER_DECAY:
        raise reader.fail("scheduler.type", f"{kind!r} has no equivalent (WarmupLR and WarmupDecayLR map)")
    allowed = ("warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type")
    if kind == "WarmupDecayLR":
        allowed += ("total_num_steps",)
    params = reader.section("scheduler.params", scheduler.get("params", {}), allowed)
    # DeepSpeed warms up logarithmically by default; Megatron's (ours) warm-up is linear from 0.
    if params.get("warmup_type") != "linear":
        raise reader.fail("scheduler.params.warmup_type", f"{params.get('warmup_type', 'log')!r} has no "
                          "equivalent: tokenmill warms up linearly (set it to \"linear\")")
    if float(reader.number("scheduler.params.warmup_min_lr", params.get("warmup_min_lr", 0))) != 0:
        raise reader.fail("scheduler.params.warmup_min_lr", "tokenmill's warm-up starts at 0")
    reader.add("--lr-decay-style", SCHEDULER_DECAY[kind])
    if "warmup_max_lr" in params:
        reader.add("--lr", reader.number("scheduler.params.warmup_max_lr", params["warmup_max_lr"]))
    if "warmup_num_steps" in params:
        reader.add("--lr-warmup-iters",
                   reader.number("scheduler.params.warmup_num_steps", params["warmup_num_steps"], integer=True))
    if "total_num_steps" in params:
        reader.add("--lr-decay-iters",
                   reader.number("scheduler.params.total_num_steps", params["total_num_steps"], integer=True))
        reader.add("--min-lr", "0")


def _check_batch(reader: _Reader, content: dict) -> None:
    """DeepSpeed's rule as far as the file tells: train_batch_size is a multiple of micro x accumulation (of
    those of the two it gives; the values are integers, `read_deepspeed_config` checked)."""
    if "train_batch_size" not in content:
        return
    total = content["train_batch_size"]
    factors = {key: content[key] for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
               if key in content}
    if factors and (min(factors.values()) < 1 or total % math.prod(factors.values())):
        product = " x ".join(f"{key} ({value})" for key, value in factors.items())
        raise TrainConfigError(f"{reader.path}: train_batch_size ({total}) is not {product} x the data-parallel size")

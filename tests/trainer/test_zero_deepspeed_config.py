"""``train --deepspeed-config FILE.json``: DeepSpeed's batch, precision, ZeRO, optimiser and scheduler keys set our
flags, the command line wins, and any other key is one line naming the file and the key."""

import json

import pytest

from trainer.cli.train import main
from trainer.cli.train_args import build_parser, config_from_args
from trainer.cli.config_file import argv_with_config_file


def parse(argv):
    parser = build_parser()
    return config_from_args(parser.parse_args(argv_with_config_file(argv, parser)))


def write(tmp_path, content) -> str:
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(content) if not isinstance(content, str) else content)
    return str(path)


def test_cpm_pretrain_ds_config_t5_sets_batch_clipping_logging_and_fp16(data_test):
    path = str(data_test / "deepspeed" / "ds_config_t5.json")
    config = parse(["--deepspeed_config", path])
    assert config.training.global_batch_size == 128 and config.training.micro_batch_size == 4
    assert config.optimizer.clip_grad == 1.0 and config.logging.log_interval == 10
    precision = config.precision
    assert precision.fp16 and precision.loss_scale is None  # loss_scale 0: dynamic
    assert (precision.initial_loss_scale, precision.loss_scale_window, precision.hysteresis) == (2.0**16, 1000, 2)
    assert config.logging.timing_log_level == 1  # its wall_clock_breakdown: true


@pytest.mark.parametrize(("breakdown", "argv", "level"), [(True, [], 1), (False, [], 0),
                                                          (True, ["--timing-log-level", "0"], 0)])
def test_wall_clock_breakdown_is_timing_log_level_1_and_the_command_line_wins(tmp_path, breakdown, argv, level):
    path = write(tmp_path, {"wall_clock_breakdown": breakdown})
    assert parse(["--deepspeed-config", path, *argv]).logging.timing_log_level == level


@pytest.mark.parametrize("granted", [True, False])
def test_zero_allow_untested_optimizer_is_always_granted_so_it_changes_nothing(tmp_path, granted):
    """Every optimiser tokenmill builds is tested with every ZeRO stage: the permission changes no setting."""
    stage = {"zero_optimization": {"stage": 1}}
    without_key = parse(["--deepspeed-config", write(tmp_path, stage)])
    with_key = parse(["--deepspeed-config", write(tmp_path, stage | {"zero_allow_untested_optimizer": granted})])
    assert with_key == without_key and with_key.parallelism.zero_stage == 1


def test_zero_offload_optimizer_and_scheduler_keys_map_and_the_command_line_wins(tmp_path):
    path = write(tmp_path, {
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, "bf16": {"enabled": True},
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}},
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                                  "weight_decay": 0.1}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-4,
                                                          "warmup_num_steps": 100, "warmup_type": "linear",
                                                          "total_num_steps": 1000}}})
    config = parse(["--deepspeed-config", path, "--zero-stage", "1"])
    assert config.parallelism.zero_stage == 1 and config.parallelism.cpu_offload and config.precision.bf16
    assert (config.training.micro_batch_size, config.training.num_accumulation_steps) == (2, 4)
    optimizer = config.optimizer
    assert (optimizer.lr, optimizer.adam_beta2, optimizer.weight_decay) == (3e-4, 0.95, 0.1)
    assert (optimizer.lr_decay_style, optimizer.lr_warmup_iters, optimizer.lr_decay_iters, optimizer.min_lr) == \
        ("linear", 100, 1000, 0.0)


def test_deepspeed_s_older_cpu_offload_spelling_turns_offload_on(tmp_path):
    path = write(tmp_path, {"zero_optimization": {"stage": 3, "cpu_offload": True}})
    parallelism = parse(["--deepspeed-config", path]).parallelism
    assert (parallelism.zero_stage, parallelism.cpu_offload) == (3, True)


@pytest.mark.parametrize(("content", "expected"), [
    ({"train_batch_size": 8, "amp": {"enabled": True}}, "amp: is not a key tokenmill reads"),
    ({"zero_optimization": {"stage": 3, "overlap_comm": True}}, "zero_optimization.overlap_comm: is not a key"),
    ({"zero_optimization": {"offload_optimizer": {"device": "nvme"}}},
     "zero_optimization.offload_optimizer.device: 'nvme' is not one of cpu, none"),
    ({"optimizer": {"type": "Lamb"}}, "optimizer.type: 'Lamb' is not Adam or AdamW"),
    ({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}},
     "scheduler.params.warmup_type: 'log' has no equivalent"),
    ({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2},
     "train_batch_size (30) is not train_micro_batch_size_per_gpu (4) x gradient_accumulation_steps (2) x the "
     "data-parallel size"),
    ({"gradient_clipping": "1.0"}, "gradient_clipping: expected a number, got '1.0'"),
    ({"wall_clock_breakdown": 1}, "wall_clock_breakdown: expected true or false, got 1"),
    ({"zero_allow_untested_optimizer": "yes"}, "zero_allow_untested_optimizer: expected true or false, got 'yes'"),
    ("[1, 2]", "expected a JSON object, got a list"),
    ('{"fp16": {', "not valid JSON at line 1"),
])
def test_a_key_without_an_equivalent_or_a_bad_value_is_one_line_naming_the_file(tmp_path, capsys, content,
                                                                                  expected):
    path = write(tmp_path, content)
    assert main(["--deepspeed-config", path, "--dataset", "x"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and path in err[0] and expected in err[0], err


def test_deepspeed_s_flag_spellings_are_aliases():
    config = parse(["--zero_stage", "2", "--cpu_adam", "--print_memory"])
    assert (config.parallelism.zero_stage, config.parallelism.cpu_offload, config.logging.print_memory) == \
        (2, True, True)

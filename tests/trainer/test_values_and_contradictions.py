"""``train`` refuses values that are not numbers and settings that contradict each other, before anything starts.

What is promised (issues 26 and 34):

- ``inf`` and ``nan`` are never numbers: every float flag, a ``--config`` YAML's ``.inf``/``.nan`` and a DeepSpeed
  JSON's ``Infinity``/``NaN`` are refused in one line naming the flag (or the file and the key).
- A YAML's values go through the flags' checks even where the command line overrides them, and a YAML that sets
  one flag under two spellings (dash/underscore, alias) with different values is refused.
- Contradictions Megatron refuses, or gives no meaning, are refused in one line naming the flags:
  ``--min-loss-scale`` above ``--initial-loss-scale``, ``--loss-scale`` in fp32, MoE flags without
  ``--num-experts``, ``--moe-layer-offset`` past the layers, ``--load`` with ``--load-hf``, DeepSpeed batch sizes
  that disagree.
- What Megatron (or an existing tokenmill rule) accepts and gives a meaning is done so, with one warning line:
  ``--sequence-parallel`` at TP 1 is turned off; a static ``--loss-scale`` makes ``--initial-loss-scale`` moot;
  ``--split 100,0,0`` with ``--eval-iters`` evaluates nothing; ``--pipeline-model-parallel-size 0`` means 1
  (CPM-Pretrain's convention); ``--use-distributed-optimizer`` (stage 1) with ``--zero-stage 3`` runs stage 3.

Failures are checked without training: they happen while the flags are parsed.
"""

from __future__ import annotations

import json
import logging

import pytest
from cli_testing import refused as refused_command
from trainer_testing import argv_for, tiny_config

from trainer.cli.train import main

pytestmark = pytest.mark.timeout(120)


def refused(argv, capsys) -> str:
    """The one error line of a refused ``train`` run."""
    return refused_command(main, argv, capsys, "train")


def spelled(text: str) -> str:
    """``text`` with a key's underscores as dashes: train's messages show a file's key ``clip_grad`` as its flag."""
    return text.replace("_", "-")


@pytest.fixture()
def tiny_argv(tiny_prefix, cache_dir):
    return argv_for(tiny_config(tiny_prefix, cache_dir))


NON_FINITE_FLAGS = [
    (["--lr", "inf"], "--lr"),
    (["--lr", "nan"], "--lr"),
    (["--learning-rate", "-inf"], "--lr"),
    (["--min-lr", "nan"], "--min-lr"),
    (["--clip-grad", "inf"], "--clip-grad"),
    (["--weight-decay", "nan"], "--weight-decay"),
    (["--adam-eps", "inf"], "--adam-eps"),
    (["--adam-beta1", "nan"], "--adam-beta1"),
    (["--init-method-std", "inf"], "--init-method-std"),
    (["--layernorm-epsilon", "nan"], "--layernorm-epsilon"),
    (["--hidden-dropout", "nan"], "--hidden-dropout"),
    (["--lr-warmup-fraction", "nan"], "--lr-warmup-fraction"),
    (["--fp16", "--initial-loss-scale", "inf"], "--initial-loss-scale"),
    (["--fp16", "--loss-scale", "inf"], "--loss-scale"),
    (["--fp16", "--min-loss-scale", "nan"], "--min-loss-scale"),
    (["--moe-aux-loss-coeff", "inf"], "--moe-aux-loss-coeff"),
    (["--split", "inf,1,1"], "inf"),
    (["--split", "1,nan,1"], "nan"),
    (["--split", "1,2,x"], "'x'"),
]


@pytest.mark.parametrize(("flags", "named"), NON_FINITE_FLAGS)
def test_a_flag_that_is_not_a_finite_number_is_one_line(tiny_argv, flags, named, capsys):
    line = refused(tiny_argv + flags, capsys)
    assert named in line


def write(tmp_path, name, text) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(("text", "named"), [
    ("lr: .inf\n", "lr"),
    ("lr: .nan\n", "lr"),
    ("clip_grad: -.inf\n", "clip_grad"),
    ("hidden-dropout: .nan\n", "hidden-dropout"),
    ("split: 'inf,1,1'\n", "split"),
])
def test_a_yaml_value_that_is_not_a_finite_number_is_one_line_naming_the_file(tiny_argv, tmp_path, text, named,
                                                                               capsys):
    path = write(tmp_path, "run.yaml", text)
    line = refused(tiny_argv + ["--config", path], capsys)
    assert path in line and spelled(named) in spelled(line)


@pytest.mark.parametrize(("content", "named"), [
    ('{"gradient_clipping": Infinity}', "gradient_clipping"),
    ('{"gradient_clipping": NaN}', "gradient_clipping"),
    ('{"optimizer": {"type": "AdamW", "params": {"lr": Infinity}}}', "optimizer.params.lr"),
    ('{"optimizer": {"type": "AdamW", "params": {"betas": [0.9, NaN]}}}', "optimizer.params.betas"),
    ('{"fp16": {"enabled": true, "loss_scale": Infinity}}', "fp16.loss_scale"),
    ('{"fp16": {"enabled": true, "min_loss_scale": -Infinity}}', "fp16.min_loss_scale"),
    ('{"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "linear", "warmup_max_lr": NaN}}}',
     "scheduler.params.warmup_max_lr"),
])
def test_a_deepspeed_value_that_is_not_a_finite_number_is_one_line_naming_the_file(tiny_argv, tmp_path, content,
                                                                                   named, capsys):
    path = write(tmp_path, "ds.json", content)
    line = refused(tiny_argv + ["--deepspeed-config", path], capsys)
    assert path in line and spelled(named) in spelled(line)


@pytest.mark.parametrize(("text", "flags", "named"), [
    ("lr: -1\n", ["--lr", "1e-3"], "lr"),
    ("hidden_dropout: 5\n", ["--hidden-dropout", "0"], "hidden_dropout"),
    ("seed: -1\n", ["--seed", "3"], "seed"),
    ("lr: .inf\n", ["--lr", "1e-3"], "lr"),
])
def test_yaml_values_the_command_line_overrides_are_still_checked(tiny_argv, tmp_path, text, flags, named, capsys):
    path = write(tmp_path, "run.yaml", text)
    line = refused(tiny_argv + ["--config", path] + flags, capsys)
    assert path in line and spelled(named) in spelled(line)


@pytest.mark.parametrize(("text", "first", "second"), [
    ("num-layers: 2\nnum_layers: 4\n", "num-layers", "num_layers"),
    ("lr: 0.001\nlearning-rate: 0.002\n", "lr", "learning-rate"),
    ("micro_batch_size: 2\nbatch-size: 4\n", "micro_batch_size", "batch-size"),
])
def test_a_yaml_that_sets_one_flag_twice_with_different_values_is_one_line(tiny_argv, tmp_path, text, first, second,
                                                                           capsys):
    path = write(tmp_path, "run.yaml", text)
    line = refused(tiny_argv + ["--config", path], capsys)
    assert path in line and first in line and second in line


def test_a_yaml_that_sets_one_flag_twice_with_the_same_value_is_accepted(tmp_path):
    from trainer.cli.train_args import build_parser, config_from_args
    from trainer.cli.config_file import argv_with_config_file
    path = write(tmp_path, "run.yaml", "num-layers: 2\nnum_layers: 2\ndataset: p\n")
    parser = build_parser()
    assert config_from_args(parser.parse_args(argv_with_config_file(["--config", path], parser))).model.num_layers == 2


@pytest.mark.parametrize(("flags", "named"), [
    (["--fp16", "--initial-loss-scale", "1024", "--min-loss-scale", "2048"], "--min-loss-scale"),
    (["--loss-scale", "128"], "--loss-scale"),
    (["--moe-router-topk", "1"], "--num-experts"),
    (["--moe-aux-loss-coeff", "0.01"], "--moe-aux-loss-coeff"),
    (["--moe-layer-freq", "2"], "--moe-layer-freq"),
    (["--moe-router-pre-softmax"], "--moe-router-pre-softmax"),
    (["--num-experts", "2", "--moe-layer-offset", "4"], "--moe-layer-offset"),
    (["--num-experts", "2", "--moe-layer-offset", "9"], "--num-layers"),
    (["--load", "ckpt", "--load-hf", "hf"], "--load-hf"),
])
def test_contradicting_flags_are_one_line(tiny_argv, flags, named, capsys):
    line = refused(tiny_argv + flags, capsys)
    assert named in line


@pytest.mark.parametrize(("content", "named"), [
    # (the data-parallel size is the layout's: the flags the file set are named)
    ('{"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2}',
     "--global-batch-size (16)"),
    ('{"train_batch_size": 3, "train_micro_batch_size_per_gpu": 2}', "train_batch_size"),
    ('{"train_batch_size": 9, "gradient_accumulation_steps": 2}', "train_batch_size"),
])
def test_deepspeed_batch_sizes_that_disagree_are_one_line(tiny_argv, tmp_path, content, named, capsys):
    path = write(tmp_path, "ds.json", content)
    # The tiny run's own --global-batch-size and --micro-batch-size are left to the file.
    argv = [word for word in tiny_argv]
    for flag in ("--global-batch-size", "--micro-batch-size"):
        at = argv.index(flag)
        del argv[at:at + 2]
    line = refused(argv + ["--deepspeed-config", path, "--train-iters", "2"], capsys)
    assert named in line


def run_with_warning(argv, caplog, capsys) -> list[str]:
    """Run ``argv`` (it must succeed); the warning lines it logged."""
    with caplog.at_level(logging.WARNING):
        assert main(argv) == 0, capsys.readouterr().err
    return [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]


def test_sequence_parallel_at_tp_1_is_turned_off_with_one_warning(tiny_argv, caplog, capsys):
    warnings = run_with_warning(tiny_argv + ["--sequence-parallel", "--train-iters", "2"], caplog, capsys)
    assert [w for w in warnings if "--sequence-parallel" in w and "turned off" in w], warnings


def test_a_static_loss_scale_makes_the_initial_scale_moot_with_one_warning(tiny_argv, caplog, capsys):
    warnings = run_with_warning(tiny_argv + ["--fp16", "--loss-scale", "128", "--initial-loss-scale", "1024",
                                             "--train-iters", "2"], caplog, capsys)
    assert [w for w in warnings if "--initial-loss-scale" in w and "--loss-scale" in w], warnings


def test_an_empty_valid_split_with_eval_iters_evaluates_nothing_with_one_warning(tiny_argv, caplog, capsys):
    argv = tiny_argv + ["--split", "100,0,0", "--eval-iters", "5", "--eval-interval", "1", "--train-iters", "2"]
    warnings = run_with_warning(argv, caplog, capsys)
    assert [w for w in warnings if "--split 100,0,0" in w and "no evaluation" in w], warnings


@pytest.mark.parametrize("stage", ["2", "3"])
def test_the_distributed_optimizer_under_a_larger_zero_stage_runs_that_stage_with_one_warning(tiny_argv, stage,
                                                                                             caplog, capsys):
    warnings = run_with_warning(tiny_argv + ["--use-distributed-optimizer", "--zero-stage", stage,
                                             "--train-iters", "2"], caplog, capsys)
    assert [w for w in warnings if "--use-distributed-optimizer" in w and f"--zero-stage {stage}" in w], warnings


def test_pipeline_size_0_means_1_with_one_warning(tiny_argv, caplog, capsys):
    warnings = run_with_warning(tiny_argv + ["--pipeline-model-parallel-size", "0", "--train-iters", "2"],
                                caplog, capsys)
    assert [w for w in warnings if "--pipeline-model-parallel-size 0" in w], warnings


def test_a_deepspeed_batch_that_agrees_is_accepted(tmp_path):
    from trainer.cli.train_args import build_parser, config_from_args
    from trainer.cli.config_file import argv_with_config_file
    path = write(tmp_path, "ds.json", json.dumps({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2}))
    parser = build_parser()
    config = config_from_args(parser.parse_args(argv_with_config_file(["--deepspeed-config", path, "--dataset", "p"],
                                                                      parser)))
    assert (config.training.global_batch_size, config.training.micro_batch_size) == (8, 2)


@pytest.mark.parametrize(("flags", "named"), [
    (["--temperature", "nan"], "--temperature"),
    (["--temperature", "inf"], "--temperature"),
    (["--top-p", "nan"], "--top-p"),
    (["--seed", "-1"], "--seed"),
    (["--seed", str(2**32)], "--seed"),
])
def test_generate_flags_that_are_not_usable_numbers_are_one_line(tmp_path, flags, named, capsys):
    from trainer.cli.generate import main as generate

    try:
        code = generate(["--load", str(tmp_path / "absent"), "--prompt-ids", "1 2 3"] + flags)
    except SystemExit as exit_:  # argparse's refusal of a flag's value
        code = exit_.code
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("generate: error: ") and named in lines[0], lines


COMMAND_PARSERS = ["preprocess.cli", "preprocess.merge_cli", "preprocess.convert_cli", "trainer.cli.convert",
                   "trainer.cli.evaluate", "trainer.cli.plot", "trainer.cli.generate", "trainer.cli.inspect",
                   "samplers.cli", "trainer.models.bert.squad.finetune_cli", "trainer.models.bert.squad.predict_cli", "trainer.cli.train_args"]


@pytest.mark.parametrize("module", COMMAND_PARSERS)
def test_every_float_flag_of_every_command_takes_finite_numbers_only(module):
    """One type for every float flag (`finite_float`), so that no command reads "inf" or "nan" as a number."""
    import importlib

    parser = importlib.import_module(module).build_parser()
    plain = [action.option_strings[0] for action in parser._actions if action.type is float]
    assert not plain, f"{module}: {plain} take float (inf, nan); use finite_float"

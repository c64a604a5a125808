"""``--loss-scale 1024`` is Megatron's static loss scale, never a prefix of ``--loss-scale-window``; no tokenmill
command matches flag prefixes (evaluate included)."""

import pytest

from trainer.cli import evaluate as evaluate_cli
from trainer.cli.train_args import build_parser, config_from_args
from trainer.optim.optimizer import LossScaler


def precision_of(argv):
    return config_from_args(build_parser().parse_args(["--dataset", "p", *argv])).precision


def test_loss_scale_is_its_own_flag_not_the_window():
    precision = precision_of(["--fp16", "--loss-scale", "1024"])
    assert precision.loss_scale == 1024 and precision.loss_scale_window == 1000


def test_a_static_loss_scale_is_used_as_given_and_never_moves():
    scaler = LossScaler(precision_of(["--fp16", "--loss-scale", "1024", "--hysteresis", "1"]))
    assert scaler.scale == 1024 and not scaler.enabled  # enabled: the dynamic scaler's bookkeeping
    for found_inf in (True, True, False):
        scaler.update(found_inf)
    assert scaler.scale == 1024


@pytest.mark.parametrize("abbreviation", ["--loss-scale-w", "--loss-sc"])
def test_an_abbreviated_flag_is_refused(abbreviation):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--dataset", "p", abbreviation, "3"])


def test_evaluate_does_not_match_prefixes():
    assert evaluate_cli.build_parser().allow_abbrev is False

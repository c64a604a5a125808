"""A family's own flags live in its folder and reach the core from the registry (issue 28).

- Each family with flags of its own declares one section (`ModelSpec.settings`, the class the registry's
  `family_settings()` lists); ``train --help`` shows it as a group named for the family, where the t5 and bert
  groups always stood (after logging, before moe); the flags several families read are core sections.
- ``train`` keeps the run's own family section in `TrainConfig.families`; a config built in Python without one
  reads its defaults (`t5_settings(config)`), and a section no one declares is one line.
- The rules that depend on what a family can do come from its spec (`trainer.family.checks`), for the ``train``
  flags and for a Python caller alike: fused q/k/v, plain .bin reads, MoE layers counted per stack.
- A config file's value for a family's flag gets that flag's range check (one line naming the file and key).
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from trainer.cli.config_file import argv_with_config_file
from trainer.cli.train_args import _sections, build_parser, config_from_args
from trainer.config import DataConfig, MaskingConfig, ModelConfig, MoEConfig, TrainConfig
from trainer.errors import TrainConfigError
from trainer.family.checks import check_family_options
from trainer.models import FAMILIES, family_settings, length_sections, model_spec, unused_fields
from trainer.models.t5.settings import T5Config, t5_settings

pytestmark = pytest.mark.timeout(120)


def parse(argv: list[str]) -> TrainConfig:
    return config_from_args(build_parser().parse_args(["--dataset", "p", *argv]))


@pytest.mark.parametrize("name", list(FAMILIES))
def test_each_family_declares_the_section_the_registry_lists(name):
    assert model_spec(name).settings is family_settings().get(name)


def test_the_family_groups_stand_where_they_stood_in_the_flag_table():
    names = [name for name, _ in _sections()]
    assert names[names.index("logging") + 1:names.index("moe")] == ["masking", *family_settings()]
    groups = {group.title: [action.dest for action in group._group_actions] for group in build_parser()._action_groups}
    assert {name: groups[name] for name in family_settings()} == {
        name: [f.name for f in dataclasses.fields(section)] for name, section in family_settings().items()}
    # The flags several families read are core: a GPT's head width and untied head, BERT's and T5's masking.
    assert {"kv_channels", "untie_embeddings_and_output_weights"} <= set(groups["model"])
    assert groups["masking"] == [f.name for f in dataclasses.fields(MaskingConfig)]


@pytest.mark.parametrize(("argv", "families"), [
    ([], {}),
    (["--model", "t5", "--enc-seq-length", "64"], {"t5": T5Config(encoder_seq_length=64)}),
    (["--model", "bert"], {"bert": family_settings()["bert"]()}),
])
def test_train_keeps_the_run_s_own_family_section(argv, families):
    assert parse(argv).families == families


def test_a_config_built_without_its_section_reads_the_defaults_and_keeps_them():
    config = TrainConfig(model=ModelConfig(model="t5"))
    assert t5_settings(config) == T5Config() and t5_settings(config) is config.families["t5"]
    assert config.section("model") is config.model
    with pytest.raises(TrainConfigError, match="^the config has no section 'mystery'$"):
        config.section("mystery")


@pytest.mark.parametrize(("config", "family", "message"), [
    (TrainConfig(model=ModelConfig(model="t5", fused_qkv=True)), "t5", "fused_qkv applies to model gpt only, not t5"),
    (TrainConfig(model=ModelConfig(model="bert"), data=DataConfig(no_mmap_bin_files=True)), "bert",
     "no_mmap_bin_files applies to GPT data only; model bert reads its sentence-split data through memory maps"),
    (TrainConfig(model=ModelConfig(num_layers=2), moe=MoEConfig(num_experts=2, moe_layer_offset=3)), "gpt",
     r"moe_layer_offset \(3\) is past the last layer \(num_layers 2\): no layer would be a MoE layer"),
])
def test_a_python_caller_gets_the_family_rules_too(config, family, message):
    with pytest.raises(TrainConfigError, match=f"^{message}$"):
        check_family_options(config, model_spec(family))


def test_an_encoder_decoder_counts_moe_layers_in_its_deepest_stack():
    config = TrainConfig(model=ModelConfig(model="t5", num_layers=2), moe=MoEConfig(num_experts=2, moe_layer_offset=3),
                         families={"t5": T5Config(decoder_num_layers=4)})
    check_family_options(config, model_spec("t5"))  # the decoder's 4th layer is a MoE layer


def test_each_family_records_its_own_sequence_lengths():
    assert length_sections() == {"seq_length": "model", "encoder_seq_length": "t5", "decoder_seq_length": "t5"}
    assert not {field for _, field in model_spec("t5").sequence_lengths} & set(unused_fields("t5"))
    assert "encoder_seq_length" in unused_fields("gpt") and "seq_length" in unused_fields("t5")


def test_a_config_file_value_of_a_family_flag_is_range_checked(tmp_path):
    run = tmp_path / "run.yaml"
    run.write_text("model: t5\nvocab-extra-ids: -1\n")
    with pytest.raises(TrainConfigError, match=f"^{re.escape(str(run))}: vocab-extra-ids: must be >= 0, got -1$"):
        argv_with_config_file(["--config", str(run)], build_parser())

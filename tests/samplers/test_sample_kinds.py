"""The sample kinds `inspect-index`'s training view asks by name (`samplers.view`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from samplers.view import SAMPLE_KINDS, TrainingViewConfig, sample_kind


def test_each_kind_names_its_view_module_and_what_it_needs():
    assert list(SAMPLE_KINDS) == ["gpt", "t5", "bert"]
    for kind in SAMPLE_KINDS.values():
        module = kind.module()
        assert module.__name__ == f"samplers.{kind.name}.view"
        assert callable(module.training_view) and callable(module.format_training_view)
    assert sample_kind("gpt").blends and sample_kind("gpt").tokenizer_use is None
    assert not sample_kind("t5").blends and "sentinel" in sample_kind("t5").tokenizer_use
    assert not sample_kind("bert").blends and "WordPiece" in sample_kind("bert").tokenizer_use


def test_an_unknown_kind_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="model must be one of gpt, t5, bert, got 'roberta'"):
        sample_kind("roberta")
    with pytest.raises(ValueError, match="got 'roberta'"):
        TrainingViewConfig(sequence_length=8, model="roberta")


def test_the_gpt_view_loads_without_torch():
    code = "import sys, samplers.view as v; v.sample_kind('gpt').module(); print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"

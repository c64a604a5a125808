"""A crafted model size or value in a checkpoint's ``model_config.json`` or a Hugging Face ``config.json`` is
refused before anything is allocated, as one line naming the file and the field (issues 26 and 34).

Every field is checked for its type and range (the ranges ``train``'s flags declare), and the bytes the
model needs are estimated and compared with this machine's memory: a model that cannot fit is refused
instead of tracebacking in the allocator or building a million layers for minutes. The message names the
file and the field the user can go and fix, never a flag the user did not type. Each case runs against
every command that reads the file (``train --load``, ``generate --load``, ``convert-checkpoint --from``,
``evaluate --load``; for HF directories ``train --load-hf``, ``convert-checkpoint --from-hf``,
``generate --load``), under a short timeout: a hang fails fast.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from hf_testing import make_tiny_hf
from trainer_testing import argv_for, tiny_config

from trainer.checkpoint.store import MODEL_CONFIG_FILE
from trainer.cli.train import main as train_main
from trainer.cli.convert import main as convert_main
from trainer.cli.evaluate import main as evaluate_main
from trainer.cli.generate import main as generate_main

# Seconds one command may take to refuse a crafted file (a tiny model loads in about one).
REFUSAL_TIMEOUT_S = 60


def _shape(field: str, value) -> Callable[[dict], None]:
    def patch(config: dict) -> None:
        config["shape"][field] = value
    return patch


def _top(field: str, value) -> Callable[[dict], None]:
    def patch(config: dict) -> None:
        config[field] = value
    return patch


def _experts(count: int) -> Callable[[dict], None]:
    def patch(config: dict) -> None:
        config["shape"]["moe"] = {"num_experts": count, "top_k": 2}
    return patch


# name -> (how model_config.json is altered, what the one line must name)
CHECKPOINT_CASES = {
    "hidden 1e9": (_shape("hidden_size", 10**9), "hidden_size"),
    "ffn 1e12": (_shape("ffn_hidden_size", 10**12), "ffn_hidden_size"),
    "layers 1e6": (_shape("num_layers", 10**6), "num_layers"),
    "vocab 2^40": (lambda c: (c["shape"].update(padded_vocab_size=2**40), c.update(vocab_size=2**40)),
                   "vocab_size"),
    "1e6 experts": (_experts(10**6), "num_experts"),
    "heads 0": (_shape("num_attention_heads", 0), "num_attention_heads"),
    "heads not dividing hidden": (_shape("num_attention_heads", 5), "num_attention_heads"),
    "negative layers": (_shape("num_layers", -2), "num_layers"),
    "zero layers": (_shape("num_layers", 0), "num_layers"),
    "negative positions": (_shape("max_position_embeddings", -32), "max_position_embeddings"),
    "negative eps": (_shape("layernorm_epsilon", -1e-5), "layernorm_epsilon"),
    "NaN eps": (_shape("layernorm_epsilon", float("nan")), "layernorm_epsilon"),
    "negative vocab": (_top("vocab_size", -5), "vocab_size"),
    "vocab past the padded rows": (_top("vocab_size", 10**6), "vocab_size"),
    "dropout 5": (_shape("hidden_dropout", 5), "hidden_dropout"),
    "a string for a size": (_shape("hidden_size", "32"), "hidden_size"),
    "a float for a size": (_shape("num_layers", 2.5), "num_layers"),
    "a bool for a size": (_shape("num_layers", True), "num_layers"),
    "null for a size": (_shape("hidden_size", None), "hidden_size"),
    "an unknown shape key": (_shape("num_layerz", 2), "num_layerz"),
    "an unknown top-level key": (_top("vocab_sizes", 256), "vocab_sizes"),
    "eod id past the vocabulary": (_top("eod_id", 10**6), "eod_id"),
    "negative eod id": (_top("eod_id", -1), "eod_id"),
    "a missing size": (lambda c: c["shape"].pop("hidden_size"), "hidden_size"),
    "shape not an object": (_top("shape", [1, 2]), "shape"),
    "experts not an object": (_shape("moe", 7), "moe"),
}
COMMANDS = ("train", "generate", "convert-checkpoint", "evaluate")


@pytest.fixture(scope="module")
def saved_run(tiny_prefix, cache_dir, tmp_path_factory) -> Path:
    """A real one-step train checkpoint (with model_config.json)."""
    root = tmp_path_factory.mktemp("crafted_sizes") / "run"
    assert train_main(argv_for(tiny_config(tiny_prefix, cache_dir, train_iters=1, save=str(root),
                                           num_layers=2))) == 0
    return root


def _command(command: str, root: Path, tiny_prefix: str, cache_dir: str, out: Path) -> tuple:
    if command == "train":
        return train_main, argv_for(tiny_config(tiny_prefix, cache_dir, train_iters=2, load=str(root), num_layers=2))
    if command == "generate":
        return generate_main, ["--load", str(root), "--prompt-ids", "1 2 3", "--max-new-tokens", "2", "--greedy"]
    if command == "evaluate":
        data = out / "lambada.jsonl"
        data.write_text(json.dumps({"text": "one two three four"}) + "\n", encoding="utf-8")
        return evaluate_main, ["--task", "lambada", "--data", str(data), "--load", str(root)]
    return convert_main, ["--from", str(root), "--to-hf", str(out / "hf")]


def _listing(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def refusal_line(command: str, main, argv: list[str], capsys) -> str:
    """The one stderr line of a refused command (asserting non-zero exit, no traceback, one line)."""
    assert main(argv) != 0, f"{command} accepted it"
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{command}: error: "), err
    return lines[0]


@pytest.mark.timeout(REFUSAL_TIMEOUT_S)
@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", list(CHECKPOINT_CASES))
def test_a_crafted_checkpoint_model_config_is_one_line(case, command, saved_run, tiny_prefix, cache_dir, tmp_path,
                                                       capsys):
    root = tmp_path / "run"
    shutil.copytree(saved_run, root)
    path = root / MODEL_CONFIG_FILE
    config = json.loads(path.read_text(encoding="utf-8"))
    patch, field = CHECKPOINT_CASES[case]
    patch(config)
    path.write_text(json.dumps(config), encoding="utf-8")
    before = _listing(root)
    main, argv = _command(command, root, tiny_prefix, cache_dir, tmp_path)
    line = refusal_line(command, main, argv, capsys)
    assert f"{path}: " in line and field in line, line
    assert f"--{field.replace('_', '-')}" not in line, line  # the file's field, not a flag nobody typed
    assert _listing(root) == before


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# name -> (config.json changes, what the one line must name); None as a value removes the key
HF_CASES = {
    "n_embd 1e9": ({"n_embd": 10**9}, "n_embd"),
    "n_positions 1e9": ({"n_positions": 10**9}, "n_positions"),
    "n_layer 1e6": ({"n_layer": 10**6}, "n_layer"),
    "vocab 2^40": ({"vocab_size": 2**40}, "vocab_size"),
    "negative n_inner": ({"n_inner": -4}, "n_inner"),
    "huge n_inner": ({"n_inner": 10**12}, "n_inner"),
    "negative layer_norm_epsilon": ({"layer_norm_epsilon": -1e-5}, "layer_norm_epsilon"),
    "NaN layer_norm_epsilon": ({"layer_norm_epsilon": float("nan")}, "layer_norm_epsilon"),
    "dropout 5": ({"resid_pdrop": 5}, "resid_pdrop"),
    "a string for a size": ({"n_embd": "64"}, "n_embd"),
    "a float for a size": ({"n_layer": 2.5}, "n_layer"),
    "eos id past the vocabulary": ({"eos_token_id": 10**6}, "eos_token_id"),
    "negative initializer_range": ({"initializer_range": -0.02}, "initializer_range"),
}
HF_COMMANDS = ("train", "convert-checkpoint", "generate", "evaluate")


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory) -> Path:
    return make_tiny_hf(tmp_path_factory.mktemp("crafted_hf") / "hf")


def _hf_command(command: str, directory: Path, tiny_prefix: str, cache_dir: str, out: Path) -> tuple:
    if command == "train":
        argv = argv_for(tiny_config(tiny_prefix, cache_dir, train_iters=1))
        return train_main, [*argv, "--load-hf", str(directory)]
    if command == "generate":
        return generate_main, ["--load", str(directory), "--prompt-ids", "1 2 3", "--max-new-tokens", "2", "--greedy"]
    if command == "evaluate":
        data = out / "lambada.jsonl"
        data.write_text(json.dumps({"text": "one two three four"}) + "\n", encoding="utf-8")
        return evaluate_main, ["--task", "lambada", "--data", str(data), "--load-hf", str(directory)]
    return convert_main, ["--from-hf", str(directory), "--to", str(out / "checkpoint")]


@pytest.mark.timeout(REFUSAL_TIMEOUT_S)
@pytest.mark.parametrize("command", HF_COMMANDS)
@pytest.mark.parametrize("case", list(HF_CASES))
def test_a_crafted_hf_config_is_one_line(case, command, tiny_hf, tiny_prefix, cache_dir, tmp_path, capsys):
    directory = tmp_path / "hf"
    shutil.copytree(tiny_hf, directory)
    path = directory / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    changes, field = HF_CASES[case]
    config.update(changes)
    path.write_text(json.dumps(config), encoding="utf-8")
    before = _listing(directory)
    main, argv = _hf_command(command, directory, tiny_prefix, cache_dir, tmp_path)
    line = refusal_line(command, main, argv, capsys)
    assert f"{path}: " in line and field in line, line
    assert _listing(directory) == before


@pytest.mark.timeout(REFUSAL_TIMEOUT_S)
@pytest.mark.parametrize("command", HF_COMMANDS)
def test_a_deeply_nested_hf_config_is_one_line(command, tiny_hf, tiny_prefix, cache_dir, tmp_path, capsys):
    directory = tmp_path / "hf"
    shutil.copytree(tiny_hf, directory)
    path = directory / "config.json"
    config = path.read_text(encoding="utf-8").rstrip().removesuffix("}")
    path.write_text(config + ', "task_specific_params": ' + _nested(100_000) + "}", encoding="utf-8")
    main, argv = _hf_command(command, directory, tiny_prefix, cache_dir, tmp_path)
    line = refusal_line(command, main, argv, capsys)
    assert f"{path}: " in line and "nested" in line, line


# Other families' HF configs: a crafted size through convert-checkpoint --from-hf.
OTHER_FAMILY_CASES = {
    "t5 d_model 1e9": ("t5", {"d_model": 10**9}, "d_model"),
    "t5 num_layers 1e6": ("t5", {"num_layers": 10**6}, "num_layers"),
    "t5 negative d_ff": ("t5", {"d_ff": -4}, "d_ff"),
    "t5 NaN layer_norm_epsilon": ("t5", {"layer_norm_epsilon": float("nan")}, "layer_norm_epsilon"),
    "switch 1e8 experts": ("switch", {"num_experts": 10**8}, "num_experts"),
    "switch 1 expert": ("switch", {"num_experts": 1}, "num_experts"),
    "switch more sparse layers than layers": ("switch", {"num_sparse_encoder_layers": 5}, "num_sparse_encoder_layers"),
    "bert hidden 1e9": ("bert", {"hidden_size": 10**9}, "hidden_size"),
    "bert negative intermediate": ("bert", {"intermediate_size": -4}, "intermediate_size"),
    "bert NaN layer_norm_eps": ("bert", {"layer_norm_eps": float("nan")}, "layer_norm_eps"),
}


def _make_other(kind: str, directory: Path) -> Path:
    import torch
    from transformers import (BertConfig, BertForPreTraining, SwitchTransformersConfig,
                              SwitchTransformersForConditionalGeneration, T5Config, T5ForConditionalGeneration)

    torch.manual_seed(0)
    if kind == "t5":
        model = T5ForConditionalGeneration(T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=1,
                                                    num_heads=4, decoder_start_token_id=0))
    elif kind == "switch":
        model = SwitchTransformersForConditionalGeneration(SwitchTransformersConfig(
            vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_decoder_layers=2, num_heads=4,
            num_experts=2, expert_capacity=4, num_sparse_encoder_layers=1, num_sparse_decoder_layers=1,
            decoder_start_token_id=0))
    else:
        model = BertForPreTraining(BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1,
                                              num_attention_heads=4, intermediate_size=32,
                                              max_position_embeddings=32))
    model.save_pretrained(directory)
    return directory


@pytest.mark.timeout(REFUSAL_TIMEOUT_S)
@pytest.mark.parametrize("case", list(OTHER_FAMILY_CASES))
def test_a_crafted_t5_switch_or_bert_config_is_one_line(case, tmp_path, capsys):
    kind, changes, field = OTHER_FAMILY_CASES[case]
    directory = _make_other(kind, tmp_path / kind)
    path = directory / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config.update(changes)
    path.write_text(json.dumps(config), encoding="utf-8")
    capsys.readouterr()  # transformers' progress bars while saving the fixture
    line = refusal_line("convert-checkpoint", convert_main,
                        ["--from-hf", str(directory), "--to", str(tmp_path / "checkpoint")], capsys)
    assert f"{path}: " in line and field in line, line


# T5 and BERT checkpoints (imported from HF directories) with a crafted model_config.json: (family, patch, field)
OTHER_CHECKPOINT_CASES = {
    "t5 d_model 1e9": ("t5", _shape("d_model", 10**9), "d_model"),
    "t5 encoder layers 1e6": ("t5", _shape("num_encoder_layers", 10**6), "num_encoder_layers"),
    "t5 heads 0": ("t5", _shape("num_heads", 0), "num_heads"),
    "t5 a string for d_ff": ("t5", _shape("d_ff", "32"), "d_ff"),
    "t5 negative eps": ("t5", _shape("layer_norm_epsilon", -1.0), "layer_norm_epsilon"),
    "t5 unknown key": ("t5", _shape("d_modle", 16), "d_modle"),
    "t5 eos id past the vocabulary": ("t5", _top("eos_id", 10**6), "eos_id"),
    "switch 1e8 experts": ("switch", lambda c: c["shape"]["moe"].update(num_experts=10**8), "num_experts"),
    "bert layers 1e6": ("bert", _shape("num_layers", 10**6), "num_layers"),
    "bert heads not dividing hidden": ("bert", _shape("num_attention_heads", 5), "num_attention_heads"),
    "bert dropout 5": ("bert", _shape("hidden_dropout", 5), "hidden_dropout"),
    "bert negative vocab": ("bert", _top("vocab_size", -1), "vocab_size"),
}


@pytest.fixture(scope="module")
def imported_checkpoints(tmp_path_factory) -> dict[str, Path]:
    """A model-only checkpoint per family, imported from a tiny HF directory."""
    base = tmp_path_factory.mktemp("crafted_other_checkpoints")
    roots = {}
    for kind in ("t5", "switch", "bert"):
        roots[kind] = base / f"{kind}-checkpoint"
        assert convert_main(["--from-hf", str(_make_other(kind, base / kind)), "--to", str(roots[kind])]) == 0
    return roots


@pytest.mark.timeout(REFUSAL_TIMEOUT_S)
@pytest.mark.parametrize("case", list(OTHER_CHECKPOINT_CASES))
def test_a_crafted_t5_switch_or_bert_checkpoint_is_one_line(case, imported_checkpoints, tmp_path, capsys):
    kind, patch, field = OTHER_CHECKPOINT_CASES[case]
    root = tmp_path / "run"
    shutil.copytree(imported_checkpoints[kind], root)
    path = root / MODEL_CONFIG_FILE
    config = json.loads(path.read_text(encoding="utf-8"))
    patch(config)
    path.write_text(json.dumps(config), encoding="utf-8")
    capsys.readouterr()
    before = _listing(root)
    line = refusal_line("convert-checkpoint", convert_main, ["--from", str(root), "--to-hf", str(tmp_path / "hf")],
                        capsys)
    assert f"{path}: " in line and field in line, line
    assert f"--{field.replace('_', '-')}" not in line, line
    assert _listing(root) == before

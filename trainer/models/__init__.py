"""Model families, one folder each (`gpt/`, `t5/`), and the registry of their specs (`ModelSpec`).

The registry imports a family only when it is asked for, so that importing one family does not import them
all. Only the top asks it (the CLIs in `trainer.cli`, the Python API, `train()`; `trainer.models.dispatch` for
each command's dispatch by source) and hands the specs down: the core never imports the registry or a family
(`tests/test_import_rules.py`).
"""

from __future__ import annotations

import dataclasses
import importlib
import os

from trainer.errors import TrainConfigError

# Family name -> the module whose ``SPEC`` describes it.
FAMILIES = {"gpt": "trainer.models.gpt.spec", "t5": "trainer.models.t5.spec", "bert": "trainer.models.bert.spec"}
DEFAULT_FAMILY = "gpt"
# Family name -> the module whose ``SETTINGS`` is the family's own flag section (`ModelSpec.settings`, the same
# class): a light import, so that the flag table does not import every family's model code.
FAMILY_SETTINGS = {"t5": "trainer.models.t5.settings", "bert": "trainer.models.bert.settings"}


def model_spec(name: str):
    """The `trainer.family.spec.ModelSpec` of family ``name``.

    Raises:
        TrainConfigError: no such family.
    """
    if name not in FAMILIES:
        raise TrainConfigError(f"unknown model family {name!r}; known: {', '.join(FAMILIES)}")
    return importlib.import_module(FAMILIES[name]).SPEC


def family_settings() -> dict[str, type]:
    """Each family's own section class by the family's name (`trainer.config.TrainConfig.families`), in the
    registry's order."""
    return {name: importlib.import_module(module).SETTINGS for name, module in FAMILY_SETTINGS.items()}


def unused_fields(name: str) -> tuple[str, ...]:
    """The `TrainConfig` fields family ``name`` never reads: the other families' own sections, then the core
    fields of its `ModelSpec.unused_fields`.

    Raises:
        TrainConfigError: no such family.
    """
    spec = model_spec(name)
    others = [f.name for family, section in family_settings().items() if family != name
              for f in dataclasses.fields(section)]
    return (*others, *spec.unused_fields)


def length_sections() -> dict[str, str]:
    """Each sequence-length field of any family -> the `TrainConfig` section holding it
    (`ModelSpec.sequence_lengths`)."""
    return {field: section for name in FAMILIES for section, field in model_spec(name).sequence_lengths}


def trainer_task(task: str):
    """The class that runs `trainer.Trainer`'s ``task`` (its family's ``ModelSpec.tasks``).

    Raises:
        TrainConfigError: no family owns such a task.
    """
    owners = {name: module for family in FAMILIES for name, module in model_spec(family).tasks}
    if task not in owners:
        raise TrainConfigError(f"task: unknown task {task!r}; known: {', '.join(sorted(owners))}")
    return importlib.import_module(owners[task]).TASK


def spec_for_hf_directory(directory: str | os.PathLike):
    """The spec of the family that imports a Hugging Face directory (by its config.json's ``model_type``);
    GPT's, whose checks name what is wrong, when no family claims it."""
    from trainer.checkpoint.hf_files import read_hf_config

    model_type = read_hf_config(directory).get("model_type")
    for name in FAMILIES:
        spec = model_spec(name)
        if model_type in spec.hf_model_types:
            return spec
    return model_spec(DEFAULT_FAMILY)


def spec_for_checkpoint(root: str | os.PathLike):
    """The spec of the family that saved a checkpoint root (its model_config.json's ``model``); GPT's for a
    root without one (checkpoints saved before model configs existed were all GPT)."""
    from pathlib import Path

    from trainer.checkpoint.store import MODEL_CONFIG_FILE
    from trainer.checkpoint.hf_files import read_json

    path = Path(root) / MODEL_CONFIG_FILE
    return model_spec(read_json(path).get("model", DEFAULT_FAMILY) if path.is_file() else DEFAULT_FAMILY)


def spec_for_source(path: str | os.PathLike):
    """The spec of what ``generate --load PATH`` names: a HF directory, a checkpoint root or one of its
    ``iter_XXXXXXX`` directories."""
    from trainer.checkpoint.store import resolve_checkpoint
    from trainer.checkpoint.hf_files import is_hf_directory

    if is_hf_directory(path):
        return spec_for_hf_directory(path)
    root, _ = resolve_checkpoint(path)
    return spec_for_checkpoint(root)

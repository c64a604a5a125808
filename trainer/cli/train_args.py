"""Command-line flags generated from the `TrainConfig` dataclasses.

Every field ``foo_bar`` of a section becomes ``--foo-bar`` (plus the aliases given with
`trainer.config.flag`); its help text is the docstring written under the field, followed by the
field's valid range and the environment variables that give its default. Floats are finite
(`finite_float`: ``inf`` and ``nan`` are refused), booleans are switches,
``list`` fields take one or more values, ``X | None`` fields default to None. ``--config FILE.yaml``
(`trainer.cli.config_file`) reads flags from a file.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import os
import sys
import typing
from collections.abc import Mapping
from typing import Any

from indexed_dataset.cli_parser import CommandParser, finite_float
from trainer.config import FAMILIES_FIELD, TrainConfig
from trainer.cli.config_file import CONFIG_FLAG
from trainer.errors import TrainConfigError
from trainer.family.checks import check_family_options
from trainer.models import FAMILIES, family_settings, model_spec

# Choices of fields the registry knows (the config, core, cannot import it): field name -> choices.
REGISTRY_CHOICES = {"model": tuple(FAMILIES)}


def _field_docstrings(cls: type) -> dict[str, str]:
    """Docstrings written under the fields of a dataclass, read from its module's source."""
    return _module_field_docstrings(cls.__module__).get(cls.__qualname__, {})


@functools.cache
def _module_field_docstrings(module_name: str) -> dict[str, dict[str, str]]:
    """Class name -> {field name: the docstring under it}, for the module's top-level classes (the config
    sections all are).

    One parse per module, kept: ``inspect.getsource`` of each class parses its whole module again, which
    made every ``train`` start (it builds its parser up to three times) spend over a second on it.
    """
    tree = ast.parse(inspect.getsource(sys.modules[module_name]))
    return {node.name: _docstrings_under_fields(node.body) for node in tree.body if isinstance(node, ast.ClassDef)}


def _docstrings_under_fields(body: list[ast.stmt]) -> dict[str, str]:
    """``field: type`` statements followed by a string statement: field name -> that string, stripped."""
    docs = {}
    for node, following in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)):
            docs[node.target.id] = str(following.value.value).strip()
    return docs


def _scalar_type(annotation: Any) -> type:
    """The element type of ``int``, ``int | None`` or ``list[str]``."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if args else annotation


def option_name(field_name: str) -> str:
    """``num_layers`` -> ``--num-layers``."""
    return "--" + field_name.replace("_", "-")


def _sections() -> list[tuple[str, type]]:
    """The flag table's sections, in order: `TrainConfig`'s, with the registry's family sections in the place
    of its ``families`` field."""
    hints = typing.get_type_hints(TrainConfig)
    sections: list[tuple[str, type]] = []
    for f in dataclasses.fields(TrainConfig):
        sections += family_settings().items() if f.name == FAMILIES_FIELD else [(f.name, hints[f.name])]
    return sections


def _help(f: dataclasses.Field, doc: str) -> str:
    """The field's docstring (a Megatron switch of the same math: that it changes nothing here, and why), then
    its valid range and the environment variables behind its default."""
    text = " ".join(doc.split())
    if f.metadata.get("same_math"):
        text += f" Accepted for Megatron's scripts; changes nothing here: {f.metadata['same_math']}."
    if f.metadata.get("valid") is not None:
        text += f" Valid: {f.metadata['valid']}."
    if f.metadata.get("env"):
        variables = ", else ".join(f"${name}" for name in f.metadata["env"])
        text += f" Default: {variables}, else {f.default}."
    return text


def build_parser() -> argparse.ArgumentParser:
    """An argparse parser with one argument group per `TrainConfig` section."""
    parser = CommandParser(prog="train", description="Train a GPT or a T5 on tokenmill data.")
    parser.add_argument(CONFIG_FLAG, dest="config_file", metavar="FILE.yaml",
                        help="YAML mapping of flag names (with - or _) to values; flags on the command line "
                             "override the file")
    for section_name, section_cls in _sections():
        group = parser.add_argument_group(section_name, section_cls.__doc__)
        docs = _field_docstrings(section_cls)
        hints = typing.get_type_hints(section_cls)
        for f in dataclasses.fields(section_cls):
            names = [option_name(f.name), *f.metadata.get("aliases", ())]
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            # Field names are unique across sections, so they are the destinations (and error messages
            # naming a field can be rewritten as its flag, see `trainer.cli.flags`).
            kwargs: dict[str, Any] = {"dest": f.name, "default": default,
                                      "help": _help(f, docs.get(f.name, ""))}
            kind = _scalar_type(hints[f.name])
            if kind is bool:
                group.add_argument(*names, action="store_true", **kwargs)
                continue
            if typing.get_origin(kind) is list:
                kind = typing.get_args(kind)[0]
            if kind is float:
                kind = finite_float
            group.add_argument(*names, type=kind, nargs=f.metadata.get("nargs"),
                               choices=REGISTRY_CHOICES.get(f.name, f.metadata.get("choices")), **kwargs)
    return parser


def environment_defaults(environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """Field name -> default taken from the launch variables of CPM-Pretrain's and LiBai's scripts
    (``GPUS_PER_NODE``, ``NNODES``/``NODE``, ``NODE_RANK``, ``MASTER_ADDR``/``ADDR``, ``MASTER_PORT``/``PORT``)
    that are set; flags still win.

    Raises:
        TrainConfigError: a variable's value is not of the flag's type, or two variables for one flag disagree.
    """
    defaults: dict[str, Any] = {}
    for _, section_cls in _sections():
        hints = typing.get_type_hints(section_cls)
        for f in dataclasses.fields(section_cls):
            values = {name: environ[name].strip() for name in f.metadata.get("env", ())
                      if environ.get(name, "").strip()}
            if not values:
                continue
            if len(set(values.values())) > 1:
                given = " and ".join(f"{name}={value}" for name, value in values.items())
                raise TrainConfigError(f"the environment variables {given} disagree (both set {f.name})")
            name, value = next(iter(values.items()))
            kind = _scalar_type(hints[f.name])
            try:
                defaults[f.name] = kind(value)
            except ValueError:
                raise TrainConfigError(f"the environment variable {name}={value!r} is not a valid {f.name} "
                                       f"({kind.__name__})") from None
    return defaults


def config_from_args(namespace: argparse.Namespace) -> TrainConfig:
    """Build the `TrainConfig` from parsed flags (runs every section's validation, then the family's rules:
    `trainer.family.checks`).

    Raises:
        TrainConfigError: a section rejects its values, or the family an option.
    """
    parsed = vars(namespace)
    families = family_settings()
    sections = {name: cls(**{f.name: parsed[f.name] for f in dataclasses.fields(cls)}) for name, cls in _sections()}
    # Every family's section is checked; the config keeps the run's own (`refuse_unused_flags` refuses the
    # flags of the others).
    config = TrainConfig(**{name: section for name, section in sections.items() if name not in families},
                         families={name: sections[name] for name in families if name == parsed["model"]})
    check_family_options(config, model_spec(config.model.model))
    return config

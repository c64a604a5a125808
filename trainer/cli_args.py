"""Command-line flags generated from the `TrainConfig` dataclasses.

Every field ``foo_bar`` of a section becomes ``--foo-bar`` (plus the aliases given with
`trainer.config.flag`); its help text is the docstring written under the field. Booleans are
switches, ``list`` fields take one or more values, ``X | None`` fields default to None.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import textwrap
import typing
from typing import Any

from trainer.config import TrainConfig


def _field_docstrings(cls: type) -> dict[str, str]:
    """Docstrings written under the fields of a dataclass, read from its source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
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
    hints = typing.get_type_hints(TrainConfig)
    return [(f.name, hints[f.name]) for f in dataclasses.fields(TrainConfig)]


def build_parser() -> argparse.ArgumentParser:
    """An argparse parser with one argument group per `TrainConfig` section."""
    parser = argparse.ArgumentParser(prog="train", description="Train a GPT or a T5 on tokenmill data.",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for section_name, section_cls in _sections():
        group = parser.add_argument_group(section_name, section_cls.__doc__)
        docs = _field_docstrings(section_cls)
        hints = typing.get_type_hints(section_cls)
        for f in dataclasses.fields(section_cls):
            names = [option_name(f.name), *f.metadata.get("aliases", ())]
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            # Field names are unique across sections, so they are the destinations (and error messages
            # naming a field can be rewritten as its flag, see `trainer.cli_flags`).
            kwargs: dict[str, Any] = {"dest": f.name, "default": default,
                                      "help": docs.get(f.name, "")}
            kind = _scalar_type(hints[f.name])
            if kind is bool:
                group.add_argument(*names, action="store_true", **kwargs)
                continue
            if typing.get_origin(kind) is list:
                kind = typing.get_args(kind)[0]
            group.add_argument(*names, type=kind, nargs=f.metadata.get("nargs"),
                               choices=f.metadata.get("choices"), **kwargs)
    return parser


def config_from_args(namespace: argparse.Namespace) -> TrainConfig:
    """Build the `TrainConfig` from parsed flags (runs every section's validation).

    Raises:
        TrainConfigError: a section rejects its values.
    """
    parsed = vars(namespace)
    return TrainConfig(**{name: cls(**{f.name: parsed[f.name] for f in dataclasses.fields(cls)})
                          for name, cls in _sections()})

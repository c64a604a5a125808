"""``train --config run.yaml``: flags kept in a file, for people who keep their runs in files.

A flat YAML mapping whose keys are ``train``'s flag names, with ``-`` or ``_`` (aliases included):

    num-layers: 24
    hidden_size: 1024
    data-path: [0.3, data/a_text_document, 0.7, data/b_text_document]
    bf16: true

The file becomes command-line words placed *before* the command line's own, so a flag given on the
command line overrides the file (argparse keeps the last value). An unknown key, a value the flag or its
field's range would refuse (checked even where the command line overrides it), or one flag set under two
spellings (``num-layers`` and ``num_layers``, an alias) to different values, is one line naming the file and
the key. A ``--deepspeed-config`` file's values get the same checks.
"""

from __future__ import annotations

import argparse
from typing import Any

from indexed_dataset.cli_parser import CommandParser, nearest_option
from indexed_dataset.structured_files import read_yaml_file
from trainer.config import train_field_problem
from trainer.cli.deepspeed_config import read_deepspeed_config
from trainer.errors import TrainConfigError
from trainer.models import family_settings

CONFIG_FLAG = "--config"
# `trainer.config.TrainingConfig.deepspeed_config`'s spellings.
DEEPSPEED_CONFIG_FLAGS = ("--deepspeed-config", "--deepspeed_config")


def config_file_of(argv: list[str]) -> str | None:
    """The ``--config FILE`` of ``argv`` (the last one), or None."""
    finder = CommandParser(add_help=False)
    finder.add_argument(CONFIG_FLAG)
    known, _ = finder.parse_known_args(argv)
    return known.config


def deepspeed_config_of(argv: list[str]) -> str | None:
    """The ``--deepspeed-config FILE`` (or ``--deepspeed_config``) of ``argv`` (the last one), or None."""
    finder = CommandParser(add_help=False)
    finder.add_argument(*DEEPSPEED_CONFIG_FLAGS, dest="deepspeed_config")
    known, _ = finder.parse_known_args(argv)
    return known.deepspeed_config


def argv_with_config_file(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """``argv`` preceded by the flags of its ``--config`` file and, before those, of its
    ``--deepspeed-config`` file (`trainer.cli.deepspeed_config`); ``argv`` itself without either.

    Raises:
        TrainConfigError: the file cannot be read, is not a YAML mapping, has an unknown key, a value its flag
            or its field's range refuses, or one flag under two spellings with different values (a DeepSpeed
            file: a key without an equivalent, or a value its flag refuses).
    """
    actions = {option: action for action in parser._actions for option in action.option_strings}
    deepspeed = deepspeed_config_of(argv)
    if deepspeed is not None:
        deepspeed_words = read_deepspeed_config(deepspeed)
        for word in deepspeed_words:  # checked as the flags check them, even where the command line overrides
            option, _, text = word.partition("=")
            if text:
                _check_value(deepspeed, option, actions[option], text)
        argv = deepspeed_words + argv
    path = config_file_of(argv)
    if path is None:
        return argv
    words: list[str] = []
    spellings: dict[str, tuple[str, Any]] = {}  # flag destination -> the first key that set it, and its value
    for key, value in _read_mapping(path).items():
        option = "--" + str(key).lstrip("-").replace("_", "-")
        action = actions.get(option)
        if action is None or option == CONFIG_FLAG or action.dest == "help":
            suggestion = nearest_option(option, actions)
            hint = f" (did you mean {suggestion.lstrip('-')}?)" if suggestion and suggestion != CONFIG_FLAG else ""
            raise TrainConfigError(f"{path}: unknown key {key!r}{hint}")
        if action.dest in spellings:
            first, first_value = spellings[action.dest]
            if first_value != value:
                raise TrainConfigError(f"{path}: {first}={first_value!r} and {key}={value!r} set one flag, "
                                       f"{action.option_strings[0]}, to two values")
            continue
        spellings[action.dest] = (str(key), value)
        if value is not None:  # `key: null` leaves the flag's default
            words += _words(path, str(key), option, action, value)
    return words + argv


def _read_mapping(path: str) -> dict[Any, Any]:
    try:
        content = read_yaml_file(path, error=TrainConfigError)
    except OSError as error:
        raise TrainConfigError(f"{path}: cannot read the config file ({error.strerror})") from None
    if content is None:
        return {}
    if not isinstance(content, dict):
        raise TrainConfigError(f"{path}: expected a mapping of flag names to values, got a {type(content).__name__}")
    return content


def _words(path: str, key: str, option: str, action: argparse.Action, value: Any) -> list[str]:
    """The command-line words of one ``key: value``, checked as the flag would check them."""
    if action.nargs == 0:  # a switch: true turns it on
        if not isinstance(value, bool):
            raise TrainConfigError(f"{path}: {key} is a switch: true or false, got {value!r}")
        return [option] if value == action.const else []
    many = action.nargs in ("+", "*")
    items = value if isinstance(value, list) and many else [value]
    if not items or any(isinstance(item, (list, dict)) for item in items):
        expected = "a value or a list of values" if many else "one value"
        raise TrainConfigError(f"{path}: {key} takes {expected}, got {value!r}")
    texts = [_text(item) for item in items]
    for text in texts:
        _check_value(path, key, action, text)
    # --flag=VALUE keeps a negative number from being read as a flag.
    return [option, *texts] if many else [f"{option}={texts[0]}"]


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _check_value(path: str, key: str, action: argparse.Action, text: str) -> None:
    """``text`` as the flag of ``action`` would check it (type, choices), then its field's valid range."""
    converted: Any = text
    if action.type is not None:
        try:
            converted = action.type(text)
        except argparse.ArgumentTypeError as error:
            raise TrainConfigError(f"{path}: {key}: {error}") from None
        except (TypeError, ValueError):
            kind = getattr(action.type, "__name__", "valid")
            raise TrainConfigError(f"{path}: {key}: invalid {kind} value {text!r}") from None
    if action.choices is not None and converted not in action.choices:
        raise TrainConfigError(f"{path}: {key}: {text!r} is not one of {', '.join(map(str, action.choices))}")
    problem = (train_field_problem(action.dest, converted, family_settings().values()) if action.nargs is None
               else None)
    if problem is not None:
        raise TrainConfigError(f"{path}: {key}: {problem}")

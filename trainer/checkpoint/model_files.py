"""Checking the model a file describes (a checkpoint's ``model_config.json``, a Hugging Face ``config.json``)
before anything is built from it.

Every key must be one the model has, every value of the type and in the range that the matching ``train``
flag declares (`trainer.config.check_file_values`), the heads must divide the width, the ids must lie in
the vocabulary, and the model must fit in this machine's memory (`trainer.checkpoint.model_memory`). Each failure
is one line naming the file and the key, ``run/model_config.json: shape.num_layers=1000000: ...``:

    value = check_file_object(value, Keys(frozenset({"shape", "vocab_size"}), frozenset({"shape"})), source)
    shape = check_transformer_shape(value["shape"], GPTShape, source)   # ModelFileError: one line
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from typing import Any

from trainer.config import ModelConfig, MoEConfig, check_file_values
from trainer.errors import ModelFileError
from trainer.checkpoint.model_memory import check_model_fits, transformer_parameters
from trainer.moe.settings import MOE_CONFIG_NAMES, MoESettings

SHAPE_PREFIX = "shape."
# GPT's and BERT's shape fields spelled otherwise in `ModelConfig`.
SHAPE_SPELLINGS = {"padded_vocab_size": "vocab_size"}
# The expert count of a shape's ``moe`` object, as messages name it.
MOE_EXPERTS = "moe.num_experts"


@dataclasses.dataclass(frozen=True)
class Keys:
    """The keys a JSON object may hold, and those it must."""

    allowed: frozenset[str]
    required: frozenset[str]


def dataclass_keys(cls: type, *extra: str) -> Keys:
    """A dataclass's fields as JSON keys (those without a default required), plus ``extra`` optional ones."""
    fields = dataclasses.fields(cls)
    required = {f.name for f in fields
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    return Keys(frozenset({f.name for f in fields} | set(extra)), frozenset(required))


def check_file_object(value: Any, keys: Keys, source: str, prefix: str = "") -> dict[str, Any]:
    """``value`` as a JSON object holding no key outside ``keys.allowed`` and every one of ``keys.required``.

    Raises:
        ModelFileError: ``{source}: {prefix}...`` naming the first unknown or missing key.
    """
    where = prefix.removesuffix(".") or "the file"
    if not isinstance(value, dict):
        raise ModelFileError(f"{source}: {where} must be a JSON object, got {type(value).__name__}")
    unknown = sorted(str(key) for key in value if key not in keys.allowed)
    if unknown:
        raise ModelFileError(f"{source}: {prefix}{unknown[0]}: unknown key (known: {', '.join(sorted(keys.allowed))})")
    missing = sorted(keys.required - set(value))
    if missing:
        raise ModelFileError(f"{source}: {prefix}{missing[0]}: missing")
    return value


def check_divides(source: str, width_key: str, width: int, heads_key: str, heads: int) -> None:
    """Refuse attention heads that do not divide the width they split."""
    if width % heads:
        raise ModelFileError(f"{source}: {heads_key}={heads}: does not divide {width_key}={width}")


def check_vocabulary(source: str, vocab_size: Any, rows: int, rows_key: str) -> None:
    """Refuse a real vocabulary size (model_config.json's ``vocab_size``) out of range or past the ``rows``
    of the embedding it indexes."""
    check_file_values({"vocab_size": vocab_size}, ModelConfig, source)
    if vocab_size > rows:
        raise ModelFileError(f"{source}: vocab_size={vocab_size}: more than the {rows_key}={rows} embedding rows")


def check_token_id(source: str, key: str, value: Any, vocab_size: int) -> None:
    """Refuse a token id (an end-of-document id, say) that is not an integer in [0, vocab_size); None passes."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab_size):
        raise ModelFileError(f"{source}: {key}={value!r}: must be a token id in [0, {vocab_size})")


def check_moe_object(value: Any, source: str, prefix: str) -> int:
    """A JSON ``MoESettings`` (its `MoEConfig` ranges); returns its expert count (1 for null: dense)."""
    if value is None:
        return 1
    moe = check_file_object(value, dataclass_keys(MoESettings), source, prefix)
    check_file_values(moe, MoEConfig, source, prefix, spellings=MOE_CONFIG_NAMES)
    return moe["num_experts"]


def check_model_sizes(values: Mapping[str, Any], source: str, spellings: Mapping[str, str],
                      parameters: Callable[[Mapping[str, int]], int], sizes: Collection[str],
                      layer_keys: tuple[str, ...], prefix: str = "", defaults: Mapping[str, int] | None = None,
                      sections: tuple[type, ...] = (ModelConfig,)) -> None:
    """The values a model file gives (its keys named by ``spellings`` as fields of the config ``sections``:
    their types and ranges), then the memory of the model they describe.

    Args:
        values: the file's object (``prefix`` says where it sits in the file: ``"shape."``).
        parameters: the family's parameter count (`transformer_parameters`) of ``sizes``' values.
        sizes: the keys the count reads; each must be a positive integer (one the file leaves out or null
            takes ``defaults``' value, else 1).
        layer_keys: the keys of ``sizes`` that count blocks.

    Raises:
        ModelFileError: one line naming ``source`` and the key.
    """
    for section in sections:
        check_file_values(values, section, source, prefix, spellings)
    chosen = {key: values[key] if values.get(key) is not None else (defaults or {}).get(key, 1) for key in sizes}
    for key, value in chosen.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ModelFileError(f"{source}: {prefix}{key}={value!r}: must be a positive integer")
    check_model_fits(chosen, parameters, layer_keys, source, prefix)


def _decoder_parameters(sizes: Mapping[str, int]) -> int:
    return transformer_parameters(sizes["num_layers"], sizes["hidden_size"], sizes["ffn_hidden_size"],
                                  sizes["padded_vocab_size"], sizes["max_position_embeddings"],
                                  sizes[MOE_EXPERTS])


def check_transformer_shape(shape: Any, shape_type: type, source: str, prefix: str = SHAPE_PREFIX) -> dict[str, Any]:
    """GPT's or BERT's ``model_config.json`` shape (fields named as `ModelConfig`'s): keys, types, ranges,
    experts, heads dividing the width, and the memory the model needs.

    Raises:
        ModelFileError: one line naming ``source`` and the key.
    """
    shape = check_file_object(shape, dataclass_keys(shape_type), source, prefix)
    experts = check_moe_object(shape.get("moe"), source, f"{prefix}moe.")
    check_model_sizes({**shape, MOE_EXPERTS: experts}, source, SHAPE_SPELLINGS, _decoder_parameters,
                      ("num_layers", "hidden_size", "ffn_hidden_size", "padded_vocab_size", "max_position_embeddings",
                       MOE_EXPERTS), ("num_layers",), prefix)
    if shape.get("kv_channels") is None:  # given channels per head free the width from the head count
        check_divides(source, f"{prefix}hidden_size", shape["hidden_size"], f"{prefix}num_attention_heads",
                      shape["num_attention_heads"])
    return shape

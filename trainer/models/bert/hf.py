"""Hugging Face BERT <-> tokenmill `trainer.models.bert.model.Bert`: config mapping and tensor names (pure functions).

Names map one-to-one, HF's ``bert.`` prefix aside (a ``BertModel`` file has none):

    embeddings.{word,position,token_type}_embeddings, embeddings.LayerNorm  = {word,..}_embeddings, embedding_norm
    encoder.layer.{i}.attention.self.{query,key,value}                      = layers.{i}.attention.w{q,k,v}
    encoder.layer.{i}.attention.output.{dense,LayerNorm}                    = layers.{i}.attention.wo, attention_norm
    encoder.layer.{i}.{intermediate.dense,output.dense,output.LayerNorm}    = layers.{i}.feed_forward.w{1,2}, ffn_norm
    pooler.dense                                                            = pooler
    cls.predictions.transform.{dense,LayerNorm}, cls.predictions.bias       = lm_head.{dense,norm}, lm_head.decoder.bias
    cls.seq_relationship                                                    = binary_head
    qa_outputs                                                              = qa_outputs

Which architecture a directory holds is read from its tensors: ``qa_outputs`` is a ``BertForQuestionAnswering``,
``cls.predictions`` a ``BertForPreTraining`` (with ``cls.seq_relationship``) or ``BertForMaskedLM``, neither a
``BertModel``. Our vocabulary may be padded: import appends zero rows, export strips them.

    shape = shape_from_hf_config(config, padded_vocab_size=30592, head=SPAN_HEAD)
    ours, absent = state_from_hf(tensors, shape, source)      # absent: our heads the file does not hold
    tensors = state_to_hf(ours, shape, vocab_size=30522)
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.errors import HFConversionError
from trainer.checkpoint.model_files import check_model_sizes, check_token_id
from trainer.checkpoint.model_memory import transformer_parameters
from trainer.models.bert.model import NUM_TOKEN_TYPES, PRETRAINING_HEAD, SPAN_HEAD, VOCAB_ROWS, BertShape

HF_MODEL_TYPE = "bert"
HF_PREFIX = "bert."
PRETRAINING_ARCHITECTURE = "BertForPreTraining"
MASKED_LM_ARCHITECTURE = "BertForMaskedLM"
QA_ARCHITECTURE = "BertForQuestionAnswering"
# Buffers some files hold besides the weights (no parameters of ours).
_BUFFERS = ("embeddings.position_ids",)
# The MLM decoder's weight: tied to the word embedding in every HF BERT we import.
_HF_DECODER = "cls.predictions.decoder.weight"
_HF_DECODER_BIAS = "cls.predictions.decoder.bias"
# Config settings whose BERT default is the only behaviour our model implements.
_REQUIRED_SETTINGS = {"hidden_act": "gelu", "position_embedding_type": "absolute", "type_vocab_size": NUM_TOKEN_TYPES,
                      "is_decoder": False, "add_cross_attention": False, "tie_word_embeddings": True}
_LINEAR = ("weight", "bias")
_BLOCK_NAMES = {"attention.wq": "attention.self.query", "attention.wk": "attention.self.key",
                "attention.wv": "attention.self.value", "attention.wo": "attention.output.dense",
                "attention_norm": "attention.output.LayerNorm", "feed_forward.w1": "intermediate.dense",
                "feed_forward.w2": "output.dense", "ffn_norm": "output.LayerNorm"}
_EMBEDDING_NAMES = {"word_embeddings.weight": "embeddings.word_embeddings.weight",
                    "position_embeddings.weight": "embeddings.position_embeddings.weight",
                    "token_type_embeddings.weight": "embeddings.token_type_embeddings.weight",
                    "embedding_norm.weight": "embeddings.LayerNorm.weight",
                    "embedding_norm.bias": "embeddings.LayerNorm.bias"}
# Heads, by our module name -> HF module name (without the bert. prefix; the pooler lives inside BertModel).
_POOLER = {"pooler": "pooler.dense"}
_MLM_HEAD = {"lm_head.dense": "cls.predictions.transform.dense", "lm_head.norm": "cls.predictions.transform.LayerNorm"}
_BINARY_HEAD = {"binary_head": "cls.seq_relationship"}
_SPAN_HEAD = {"qa_outputs": "qa_outputs"}
_MLM_BIAS = ("lm_head.decoder.bias", "cls.predictions.bias")


def _linear_names(modules: dict[str, str]) -> dict[str, str]:
    return {f"{ours}.{kind}": f"{hf}.{kind}" for ours, hf in modules.items() for kind in _LINEAR}


def _is_encoder(hf_name: str) -> bool:
    """Whether an HF name (prefix stripped) belongs to ``BertModel`` (lives under ``bert.`` in a head model)."""
    return hf_name.startswith(("embeddings.", "encoder.", "pooler."))


def hf_bert_names(shape: BertShape) -> dict[str, str]:
    """Our parameter names -> HF names (``bert.``-prefixed inside BertModel) of ``Bert(shape)``; the tied MLM
    decoder weight is left out (it is the word embedding)."""
    names = dict(_EMBEDDING_NAMES)
    for i in range(shape.num_layers):
        names |= _linear_names({f"layers.{i}.{ours}": f"encoder.layer.{i}.{hf}" for ours, hf in _BLOCK_NAMES.items()})
    if shape.has_pooler:
        names |= _linear_names(_POOLER | _BINARY_HEAD)
    if shape.head == PRETRAINING_HEAD:
        names |= _linear_names(_MLM_HEAD) | dict([_MLM_BIAS])
    if shape.head == SPAN_HEAD:
        names |= _linear_names(_SPAN_HEAD)
    return {ours: HF_PREFIX + hf if _is_encoder(hf) else hf for ours, hf in names.items()}


def _all_head_names() -> set[str]:
    """Every HF head tensor of any BERT architecture (dropped on import when our head differs)."""
    heads = _linear_names(_POOLER | _MLM_HEAD | _BINARY_HEAD | _SPAN_HEAD)
    return {HF_PREFIX + hf if _is_encoder(hf) else hf for hf in heads.values()} | {
        _MLM_BIAS[1], _HF_DECODER, _HF_DECODER_BIAS}


def check_hf_config(config: dict[str, Any], source: str) -> None:
    """Reject configs our BERT cannot reproduce exactly.

    Raises:
        HFConversionError: not a BERT, a field is missing, or a setting differs from BERT's.
    """
    if config.get("model_type") != HF_MODEL_TYPE:
        raise HFConversionError(f"{source}: model_type is {config.get('model_type')!r}, not {HF_MODEL_TYPE!r}: "
                                "not a BERT")
    for name in ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size",
                 "max_position_embeddings", "vocab_size"):
        if not isinstance(config.get(name), int) or config[name] <= 0:
            raise HFConversionError(f"{source}: {name} must be a positive integer, found {config.get(name)!r}")
    if config["hidden_size"] % config["num_attention_heads"]:
        raise HFConversionError(f"{source}: hidden_size ({config['hidden_size']}) is not divisible by "
                                f"num_attention_heads ({config['num_attention_heads']})")
    for name, value in _REQUIRED_SETTINGS.items():
        if config.get(name, value) != value:
            raise HFConversionError(f"{source}: {name}={config[name]!r} is not supported (BERT uses {value!r})")
    # The settings above are HF BERT's own (its position_embedding_type "absolute" is not our field's value):
    # checked for their exact values, not as our fields of the same name.
    sizes = {key: value for key, value in config.items() if key not in _REQUIRED_SETTINGS}
    check_model_sizes(sizes, source, HF_SPELLINGS, _parameters, ("num_hidden_layers", "hidden_size",
                      "intermediate_size", "vocab_size", "max_position_embeddings"), ("num_hidden_layers",))
    check_token_id(source, "pad_token_id", config.get("pad_token_id"), config["vocab_size"])


# config.json keys -> the `train` config fields of the same meaning, whose types and ranges they get.
HF_SPELLINGS = {"num_hidden_layers": "num_layers", "intermediate_size": "ffn_hidden_size",
                "hidden_dropout_prob": "hidden_dropout", "attention_probs_dropout_prob": "attention_dropout",
                "initializer_range": "init_method_std", "layer_norm_eps": "layernorm_epsilon"}


def _parameters(sizes: dict[str, int]) -> int:
    return transformer_parameters(sizes["num_hidden_layers"], sizes["hidden_size"], sizes["intermediate_size"],
                                  sizes["vocab_size"], sizes["max_position_embeddings"])


def hf_head(tensors: dict[str, torch.Tensor]) -> tuple[str, bool]:
    """The head (`PRETRAINING_HEAD` or `SPAN_HEAD`) and whether there is a pooler + binary head, of a file's
    tensors; a ``BertModel`` reads as pre-training (its heads to be initialised), binary iff it has a pooler."""
    names = {name.removeprefix(HF_PREFIX) for name in tensors}
    if "qa_outputs.weight" in names:
        return SPAN_HEAD, False
    if "cls.predictions.bias" in names:
        return PRETRAINING_HEAD, "cls.seq_relationship.weight" in names
    return PRETRAINING_HEAD, "pooler.dense.weight" in names


def shape_from_hf_config(config: dict[str, Any], padded_vocab_size: int | None = None,
                         head: str = PRETRAINING_HEAD, binary_head: bool = True) -> BertShape:
    """Our dimensions for a (checked) BERT config; dropouts as in the config.

    Args:
        config: the parsed config.json.
        padded_vocab_size: rows of our embedding; default the config's ``vocab_size`` (no padding).
        head: the model's head; binary_head: whether a pre-training model has the pooler and binary head.
    """
    vocab = config["vocab_size"]
    padded = vocab if padded_vocab_size is None else padded_vocab_size
    if padded < vocab:
        raise HFConversionError(f"padded vocabulary size {padded} is smaller than the model's vocab_size {vocab}")
    return BertShape(num_layers=config["num_hidden_layers"], hidden_size=config["hidden_size"],
                     num_attention_heads=config["num_attention_heads"], ffn_hidden_size=config["intermediate_size"],
                     max_position_embeddings=config["max_position_embeddings"], padded_vocab_size=padded,
                     binary_head=binary_head, hidden_dropout=config.get("hidden_dropout_prob", 0.1),
                     attention_dropout=config.get("attention_probs_dropout_prob", 0.1),
                     init_method_std=config.get("initializer_range", 0.02),
                     layernorm_epsilon=config.get("layer_norm_eps", 1e-12), head=head)


def hf_config_from_shape(shape: BertShape, vocab_size: int, pad_id: int | None) -> dict[str, Any]:
    """A config.json for our shape with ``vocab_size`` (padding stripped): BertForPreTraining (BertForMaskedLM
    without the binary head) or BertForQuestionAnswering."""
    if shape.head == SPAN_HEAD:
        architecture = QA_ARCHITECTURE
    else:
        architecture = PRETRAINING_ARCHITECTURE if shape.has_pooler else MASKED_LM_ARCHITECTURE
    return {"architectures": [architecture], "model_type": HF_MODEL_TYPE, "vocab_size": vocab_size,
            "hidden_size": shape.hidden_size, "num_hidden_layers": shape.num_layers,
            "num_attention_heads": shape.num_attention_heads, "intermediate_size": shape.ffn_hidden_size,
            "max_position_embeddings": shape.max_position_embeddings, "hidden_dropout_prob": shape.hidden_dropout,
            "attention_probs_dropout_prob": shape.attention_dropout, "initializer_range": shape.init_method_std,
            "layer_norm_eps": shape.layernorm_epsilon, "pad_token_id": pad_id if pad_id is not None else 0,
            "dtype": "float32", **_REQUIRED_SETTINGS}


def _pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """``tensor`` with zero rows appended up to ``rows`` (the padded vocabulary)."""
    return torch.cat([tensor, tensor.new_zeros(rows - tensor.shape[0], *tensor.shape[1:])])


def _with_prefix(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF names with the ``bert.`` prefix on BertModel's tensors (a bare BertModel file has none)."""
    return {(HF_PREFIX + name if _is_encoder(name) else name): t for name, t in tensors.items()}


def state_from_hf(tensors: dict[str, torch.Tensor], config: dict[str, Any], shape: BertShape,
                  source: str) -> tuple[dict[str, torch.Tensor], list[str]]:
    """HF BERT weights -> our parameters (fp32, contiguous), vocabulary rows padded with zeros.

    The encoder must be complete; heads the file holds for another architecture are dropped (fine-tuning QA
    from a pre-trained BERT), and our heads the file lacks are reported (the caller keeps them initialised).

    Returns:
        (parameter name -> tensor, the names of our head parameters the file does not hold).

    Raises:
        HFConversionError: an encoder tensor is missing, a tensor has the wrong shape, is unknown, or the MLM
            decoder is not tied to the word embedding.
    """
    weights = _with_prefix(tensors)
    names = hf_bert_names(shape)
    known = set(names.values()) | _all_head_names() | {HF_PREFIX + b for b in _BUFFERS}
    unexpected = sorted(set(weights) - known)
    if unexpected:
        raise HFConversionError(f"{source}: unexpected tensor {unexpected[0]} ({len(unexpected)} unexpected; "
                                "not a BERT weight)")
    embedding_name = names["word_embeddings.weight"]
    if _HF_DECODER in weights and embedding_name in weights and not torch.equal(weights[_HF_DECODER],
                                                                                  weights[embedding_name]):
        raise HFConversionError(f"{source}: {_HF_DECODER} differs from {embedding_name}; our BERT ties the MLM "
                                "decoder to the word embedding")
    state, absent = {}, []
    for ours, hf in names.items():
        if hf not in weights:
            if _is_encoder(hf.removeprefix(HF_PREFIX)) and not ours.startswith("pooler."):
                raise HFConversionError(f"{source}: missing tensor {hf}")
            absent.append(ours)
            continue
        tensor = weights[hf].to(torch.float32)
        if ours in VOCAB_ROWS:
            if tensor.shape[0] != config["vocab_size"]:
                raise HFConversionError(f"{source}: tensor {hf} has {tensor.shape[0]} rows, the config's "
                                        f"vocab_size is {config['vocab_size']}")
            tensor = _pad_rows(tensor, shape.padded_vocab_size)
        state[ours] = tensor.contiguous().clone()
    return state, absent


def check_state_shapes(state: dict[str, torch.Tensor], expected: dict[str, torch.Size], shape: BertShape,
                       source: str) -> None:
    """Every converted tensor has the shape ``Bert(shape)`` gives it.

    Raises:
        HFConversionError: naming the HF tensor and both shapes.
    """
    names = hf_bert_names(shape)
    for name, tensor in state.items():
        if tensor.shape != expected[name]:
            raise HFConversionError(f"{source}: tensor {names[name]} has shape {tuple(tensor.shape)}, "
                                    f"config.json needs {tuple(expected[name])}")


def state_to_hf(state: dict[str, torch.Tensor], shape: BertShape, vocab_size: int) -> dict[str, torch.Tensor]:
    """Our full parameters -> HF tensors of the shape's architecture, padded vocabulary rows dropped (the tied
    MLM decoder weight is left out, as transformers saves it)."""
    return {hf: (state[ours][:vocab_size] if ours in VOCAB_ROWS else state[ours]).contiguous().clone()
            for ours, hf in hf_bert_names(shape).items()}

"""The `TrainConfig` rules that depend on the family: what its `ModelSpec` declares it can do. The top (the
``train`` flags, `train()`) runs them with the spec the registry gives, right after the config is built.

    check_family_options(config, model_spec(config.model.model))
"""

from __future__ import annotations

from trainer.config import TrainConfig
from trainer.errors import TrainConfigError
from trainer.family.spec import ModelSpec


def check_family_options(config: TrainConfig, spec: ModelSpec) -> None:
    """Refuse the options family ``spec`` cannot run: fused q/k/v, plain (not memory-mapped) data reads, a MoE
    layer offset past its deepest stack.

    Raises:
        TrainConfigError: the first such option, naming its field.
    """
    model = config.model.model
    if config.model.fused_qkv and not spec.fused_qkv:
        raise TrainConfigError(f"fused_qkv applies to model gpt only, not {model}")
    if config.data.no_mmap_bin_files and not spec.plain_bin_reads:
        raise TrainConfigError(f"no_mmap_bin_files applies to GPT data only; model {model} reads its "
                               "sentence-split data through memory maps")
    # Every stack (an encoder and a decoder) counts its MoE layers from moe_layer_offset.
    layers = spec.stack_layers(config) if spec.stack_layers is not None else config.model.num_layers
    if config.moe.num_experts is not None and config.moe.moe_layer_offset >= layers:
        raise TrainConfigError(f"moe_layer_offset ({config.moe.moe_layer_offset}) is past the last layer "
                               f"(num_layers {layers}): no layer would be a MoE layer")

"""Will a model fit? An estimate of its bytes from its sizes, checked before anything is allocated.

A crafted config (``hidden_size: 1e9``, a million layers, 2**40 vocabulary rows) would otherwise fail deep
in the allocator with a traceback, or build modules for hours. The estimate is a lower bound: the weights
of the embeddings, the attention and MLP matrices of every block, and the Python objects of each block's
modules; a model the bound already puts past this machine's memory is refused, naming the size that
makes it so:

    sizes = {"n_layer": 10**6, "n_embd": 32, "n_inner": 128, "vocab_size": 256}
    check_model_fits(sizes, lambda s: transformer_parameters(s["n_layer"], ...), ("n_layer",), "hf/config.json")
    # ModelFileError: hf/config.json: n_layer=1000000: the model needs at least 95.4 GiB ...
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from indexed_dataset.machine import GIB, physical_memory_bytes
from trainer.errors import ModelFileError

FLOAT32_BYTES = 4
"""Checkpoints and conversions hold float32 weights; a lower bound for any other dtype's training too."""
LAYER_OVERHEAD_BYTES = 50 * 2**10
"""Host memory of one transformer block's module objects, whatever its width: ~57 KiB measured for a
GPT block on the meta device (torch 2.x); this is what a million-layer config exhausts, for hours."""
# Attention's four [hidden, hidden] projections (q, k, v, out) per block.
ATTENTION_MATRICES = 4
# An MLP's two matrices (in and out; a gated one has three: a lower bound either way).
MLP_MATRICES = 2


def transformer_parameters(num_layers: int, hidden_size: int, ffn_hidden_size: int, vocab_rows: int,
                           position_rows: int = 0, experts: int = 1, attention_width: int | None = None) -> int:
    """A lower bound on a transformer's parameter count (biases and norms left out).

    Args:
        num_layers: blocks of all stacks (T5: encoder plus decoder).
        attention_width: the q/k/v projections' output width (T5: heads x d_kv); default ``hidden_size``.
        experts: MLPs per block (a mixture of experts; a lower bound when only some blocks have them
            is the caller's, by passing 1).
    """
    width = hidden_size if attention_width is None else attention_width
    block = ATTENTION_MATRICES * hidden_size * width + experts * MLP_MATRICES * hidden_size * ffn_hidden_size
    return (vocab_rows + position_rows) * hidden_size + num_layers * block


def check_model_fits(sizes: Mapping[str, int], parameters: Callable[[Mapping[str, int]], int],
                     layer_keys: tuple[str, ...], source: str, prefix: str = "", available_bytes: int | None = None) -> None:
    """Refuse a model whose float32 weights and block objects cannot fit in ``available_bytes``.

    Args:
        sizes: the file's size keys -> values (positive integers, already checked).
        parameters: the family's parameter count of ``sizes`` (`transformer_parameters` of them).
        layer_keys: the keys of ``sizes`` that count blocks (each costs `LAYER_OVERHEAD_BYTES`).
        source: the file, first in the message; ``prefix``: where the keys sit in it (``"shape."``).
        available_bytes: default this machine's memory (`indexed_dataset.machine.physical_memory_bytes`).

    Raises:
        ModelFileError: naming the key the estimate owes most to (the one that, set to 1, leaves the
            smallest model), the estimate and the memory.
    """
    def needed(values: Mapping[str, int]) -> int:
        return (parameters(values) * FLOAT32_BYTES
                + sum(values[key] for key in layer_keys) * LAYER_OVERHEAD_BYTES)

    available = physical_memory_bytes() if available_bytes is None else available_bytes
    if needed(sizes) <= available:
        return
    culprit = min(sizes, key=lambda key: needed({**sizes, key: 1}))
    raise ModelFileError(f"{source}: {prefix}{culprit}={sizes[culprit]}: the model needs at least "
                           f"{needed(sizes) / GIB:.3g} GiB ({parameters(sizes):.3g} float32 parameters and "
                           f"the modules of its layers), more than this machine's {available / GIB:.3g} GiB "
                           "of memory")

"""The rotary-embedding golden arrays: megatron-core 0.16.1's own `RotaryEmbedding` (frequencies, with Llama 3.1
scaling, linear interpolation and a partial rotary dimension) and `_apply_rotary_pos_emb_bshd` (what
``apply_rotary_pos_emb`` runs without fusion), written to ``data_test/trainer/megatron_rope.npz``.

    python3 -m venv /tmp/mcore && /tmp/mcore/bin/pip install torch megatron-core==0.16.1 numpy
    /tmp/mcore/bin/python tests/trainer/make_llama_rope_golden.py          # rewrites the .npz

megatron-core computes the same frequencies as Megatron-LM HEAD (d98e8a6) ``rotary_pos_embedding.py``. The
embedding's ``get_emb`` moves its frequencies to CUDA, so this script repeats its two CPU lines: the
non-interleaved ``cat((freqs, freqs))`` of ``get_freqs_non_repeated``. The test
(`test_llama_options.py`) needs only numpy and the .npz.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

ROOT = Path(__file__).resolve().parents[2]
GOLDEN_FILE = ROOT / "data_test" / "trainer" / "megatron_rope.npz"
SEQ, HEADS, SEED = 24, 2, 1234
# name -> RotaryEmbedding arguments (kv_channels = head dim).
CASES = {
    "llama2": dict(kv_channels=16, rotary_percent=1.0, rotary_base=10000),
    "llama3_1": dict(kv_channels=16, rotary_percent=1.0, rotary_base=500000, rope_scaling=True,
                     rope_scaling_factor=8.0),
    "llama3_1_factor32": dict(kv_channels=32, rotary_percent=1.0, rotary_base=500000, rope_scaling=True,
                              rope_scaling_factor=32.0),
    "linear_interpolation": dict(kv_channels=16, rotary_percent=1.0, rotary_base=10000,
                                 seq_len_interpolation_factor=4),
    "partial_half": dict(kv_channels=16, rotary_percent=0.5, rotary_base=1000000),
}


def main() -> None:
    arrays: dict[str, np.ndarray] = {}
    generator = torch.Generator().manual_seed(SEED)
    for name, kwargs in CASES.items():
        rope = RotaryEmbedding(use_cpu_initialization=True, **kwargs)
        freqs = rope.get_freqs_non_repeated(SEQ)
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, None, :]  # [seq, 1, 1, rot]: get_emb on the CPU
        x = torch.randn(SEQ, 1, HEADS, kwargs["kv_channels"], generator=generator)  # [s, b, h, d]
        arrays[f"{name}.inv_freq"] = rope.inv_freq.numpy()
        arrays[f"{name}.input"] = x[:, 0].permute(1, 0, 2).numpy()  # [heads, seq, d]
        arrays[f"{name}.rotated"] = _apply_rotary_pos_emb_bshd(x, emb)[:, 0].permute(1, 0, 2).numpy()
    arrays["cases"] = np.frombuffer(json.dumps(CASES).encode(), dtype=np.uint8)
    GOLDEN_FILE.parent.mkdir(parents=True, exist_ok=True)
    temporary = GOLDEN_FILE.with_suffix(".tmp.npz")
    np.savez_compressed(temporary, **arrays)
    temporary.replace(GOLDEN_FILE)


if __name__ == "__main__":
    main()

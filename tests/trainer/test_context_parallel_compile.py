"""``--compile`` with ``--context-parallel-size``: a CP 2 run with compiled blocks follows the CP 2 eager run.

The attention that gathers keys and values over the cp group stays eager (its collectives and its recomputation
are no graph of their own); everything else of each block is compiled. The runs are `test_compile_and_kernels`'s
short ones (one layer, 3 steps, no evaluation: compiling is slow on a CPU), with the GPT-2 and the Llama-class
shapes, and the same tolerance: inductor's fused norms, softmax and GELU sum in another order than the eager
kernels (a few fp32 ulps), which AdamW turns into relative differences of ~1e-7 over the steps; a block left out
of the graph, or a wrong graph, moves the loss by percents.

Compiling on a CPU takes minutes: these run with ``pytest -m campaign``.
"""

from __future__ import annotations

import pytest
from test_compile_and_kernels import COMPILE_RTOL, STEPS, compiled, short_run
from test_llama_parity import llama_config, with_parallelism
from trainer_testing import run_in_processes, tiny_config

CP = 2


@pytest.mark.campaign
@pytest.mark.timeout(900)
@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_compiled_cp2_run_follows_the_eager_one(model, tiny_prefix, cache_dir, workdir, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # the spawned processes inherit it
    base = tiny_config(tiny_prefix, cache_dir) if model == "gpt2" else llama_config(tiny_prefix, cache_dir)
    eager = with_parallelism(short_run(base), context_parallel_size=CP)
    compiled_result, eager_result = run_in_processes(CP, [compiled(eager), eager], workdir)
    pairs = [*zip(compiled_result["losses"], eager_result["losses"]),
             *zip(compiled_result["grad_norms"], eager_result["grad_norms"])]
    print(f"{model}: largest relative gap compiled vs eager {max(abs(a - b) / abs(b) for a, b in pairs):.1e}")
    assert len(compiled_result["losses"]) == STEPS
    assert compiled_result["losses"] == pytest.approx(eager_result["losses"], rel=COMPILE_RTOL)
    assert compiled_result["grad_norms"] == pytest.approx(eager_result["grad_norms"], rel=COMPILE_RTOL)

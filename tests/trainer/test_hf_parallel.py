"""HF GPT-2 weights under parallel layouts (gloo, CPU processes):

- `generate` split over processes gives transformers' greedy tokens: tensor, pipeline and data parallel,
  and through the CLI's elastic launcher, as ``train`` starts its workers;
- a checkpoint imported from HF trains under tensor parallelism and exports back to transformers
  with the same logits as ours;
- HF weights loaded straight into a tp x pp or FSDP2 x tp layout (``train --load-hf``) are exact,
  and after training export and re-import exactly.

The two-process jobs share one launch (starting processes costs more than the jobs).
"""

import json

import pytest
import torch
from hf_testing import (
    LOGIT_TOLERANCE,
    TINY_VOCAB,
    hf_greedy,
    hf_model,
    job_generate,
    job_train,
    make_tiny_hf,
    prompt_batch,
)
from process_testing import free_port, run_jobs

from trainer.cli.generate import main
from trainer.models.gpt.convert import checkpoint_model, export_hf_checkpoint, import_hf_checkpoint, read_checkpoint_state
from trainer.checkpoint.hf_files import read_hf_weights
from trainer.models.gpt.model import GPT

NEW_TOKENS = 10
TRAIN_STEPS = 3
GENERATION_LAYOUTS = {"tp2": (2, 1), "pp2": (1, 2)}
# train's own checkpoints hold no model_config.json yet: export is told the head count and vocabulary.
TINY_MODEL = {"num_attention_heads": 4, "vocab_size": TINY_VOCAB}


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    return make_tiny_hf(tmp_path_factory.mktemp("hf") / "tiny")


@pytest.fixture(scope="module")
def expected(tiny_hf):
    return hf_greedy(hf_model(tiny_hf), prompt_batch(), NEW_TOKENS)


@pytest.fixture(scope="module")
def two_process_run(tiny_hf, tmp_path_factory):
    """Greedy generation in each two-process layout, and TRAIN_STEPS tp=2 steps from an imported checkpoint."""
    workdir = tmp_path_factory.mktemp("runs")
    import_hf_checkpoint(tiny_hf, workdir / "imported", make_vocab_size_divisible_by=64, tensor_model_parallel_size=2)
    jobs = [(job_generate, (tp, pp, str(tiny_hf), prompt_batch(), NEW_TOKENS), {})
            for tp, pp in GENERATION_LAYOUTS.values()]
    jobs.append((job_train, (2, 1, str(workdir / "imported"), str(workdir / "trained"), TRAIN_STEPS), {}))
    results = run_jobs(2, jobs, workdir)
    return {"generated": dict(zip(GENERATION_LAYOUTS, results)), "trained": workdir / "trained"}


def our_logits(path, tokens: torch.Tensor) -> torch.Tensor:
    root, iteration, info = checkpoint_model(path, **TINY_MODEL)
    model = GPT(info.shape)
    model.load_state_dict(read_checkpoint_state(root, iteration, info.shape), strict=False)
    with torch.no_grad():
        return model.eval()(tokens, torch.arange(tokens.shape[1]).expand_as(tokens))[..., :info.vocab_size]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("layout", list(GENERATION_LAYOUTS))
def test_two_process_greedy_equals_transformers(layout, two_process_run, expected):
    assert two_process_run["generated"][layout] == expected


@pytest.mark.timeout(400)
def test_checkpoint_trained_with_tp2_exports_to_transformers(tiny_hf, two_process_run, tmp_path):
    export_hf_checkpoint(two_process_run["trained"], tmp_path / "exported", **TINY_MODEL)
    tokens = torch.tensor(prompt_batch((10,) * 4))
    with torch.no_grad():
        theirs = hf_model(tmp_path / "exported")(tokens).logits
        before = hf_model(tiny_hf)(tokens).logits
    ours = our_logits(two_process_run["trained"], tokens)
    assert not torch.allclose(ours, before, atol=1e-3), "training changed nothing"
    assert torch.allclose(theirs, ours, rtol=0, atol=LOGIT_TOLERANCE)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_cli_launches_tensor_parallel_workers(tiny_hf, expected, capsys):
    argv = ["--load", str(tiny_hf), "--greedy", "--max-new-tokens", str(NEW_TOKENS), "--json", "--nproc-per-node", "2",
            "--device", "cpu", "--tensor-model-parallel-size", "2", "--master-port", str(free_port())]
    for ids in prompt_batch():
        argv += ["--prompt-ids", " ".join(map(str, ids))]
    assert main(argv) == 0
    assert [json.loads(line)["ids"] for line in capsys.readouterr().out.splitlines()] == expected


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_four_processes_generate_and_round_trip_training_exactly(tiny_hf, expected, tmp_path):
    jobs = [(job_generate, (2, 2, str(tiny_hf), prompt_batch(), NEW_TOKENS), {}),
            (job_generate, (2, 1, str(tiny_hf), prompt_batch(), NEW_TOKENS), {}),  # tp 2 x dp 2
            (job_train, (2, 2, str(tiny_hf), str(tmp_path / "trained"), 5), {}),
            (job_train, (2, 1, str(tiny_hf), str(tmp_path / "fsdp_loaded"), 0), {})]  # FSDP2 x tp: load, save
    tp2_pp2, tp2_dp2, _, _ = run_jobs(4, jobs, tmp_path)
    assert tp2_pp2 == expected and tp2_dp2 == expected
    export_hf_checkpoint(tmp_path / "fsdp_loaded", tmp_path / "fsdp_exported", **TINY_MODEL)
    original, exported = read_hf_weights(tiny_hf), read_hf_weights(tmp_path / "fsdp_exported")
    assert all(torch.equal(exported[name], original[name]) for name in exported)
    export_hf_checkpoint(tmp_path / "trained", tmp_path / "exported", **TINY_MODEL)
    import_hf_checkpoint(tmp_path / "exported", tmp_path / "reimported", make_vocab_size_divisible_by=64,
                         tensor_model_parallel_size=2)
    root, iteration, info = checkpoint_model(tmp_path / "trained", **TINY_MODEL)
    trained = read_checkpoint_state(root, iteration, info.shape)
    root, iteration, info = checkpoint_model(tmp_path / "reimported")
    reimported = read_checkpoint_state(root, iteration, info.shape)
    assert trained.keys() == reimported.keys()
    for name, tensor in trained.items():
        other = reimported[name]
        if name == "tok_embeddings.weight":  # padded rows are no part of a HF model: dropped, then zeros
            assert torch.count_nonzero(other[TINY_VOCAB:]) == 0
            tensor, other = tensor[:TINY_VOCAB], other[:TINY_VOCAB]
        assert torch.equal(tensor, other), name
    assert not torch.equal(read_hf_weights(tiny_hf)["transformer.h.0.attn.c_attn.weight"],
                           read_hf_weights(tmp_path / "exported")["transformer.h.0.attn.c_attn.weight"])

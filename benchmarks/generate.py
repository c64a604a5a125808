"""Generation speed: our `generate` (KV cache, batched prompts) vs transformers' `generate`, on CPU.

    python -m benchmarks.generate                     # every family, tiny and small-shaped models, batch 1 and 4
    python -m benchmarks.generate --families llama mixtral --models tiny --new-tokens 128 --repeats 5

GPT: a GPT2LMHeadModel made locally (transformers' init under a fixed seed) and saved with
save_pretrained; prompts left-padded. Llama and Mixtral: the same with a LlamaForCausalLM (grouped-query
attention, 4 heads over 2 kv groups at the tiny size, 8 over 2 at the small one, vocabulary 32000) and a
MixtralForCausalLM (8 SwiGLU experts, top-2), both run by our GPT decoder with its Llama-class options and
its grouped KV cache. T5: a T5 v1.0 (ReLU, tied head) drawn by our own `T5` init under a
fixed seed and written with `save_hf_t5`, loaded by T5ForConditionalGeneration; encoder prompts
right-padded; tiny (d_model 64, 2+2 layers) and T5-small's shape (d_model 512, d_ff 2048, 8 heads, 6+6
layers, vocabulary 32128). Both sides run greedy decoding in this process on the same weights, the same
prompts (batch 4: lengths 32, 24, 16 and 8, with an attention mask for transformers) and the same number
of new tokens (EOS stopping off on both sides), with the same torch thread count (``--threads``, default
1: one intra-op thread, as torchrun gives each process; on a shared machine busy OpenMP threads make
multi-threaded timings vary several-fold). The runs alternate ours/theirs; figures are medians of
``--repeats`` timed runs after one warm-up. Model loading is not timed. The two outputs are checked to be
the same tokens before anything is reported.

T5 is also timed split over two pipeline stages (``--pp2``, on by default): two gloo CPU processes of one
thread each, the same prompts, the median of ``--repeats`` runs after a warm-up (each run starts at a
barrier), its tokens checked against the one-process run's. A single batch moves through the stages one
after the other, so this measures what the split costs (sends, broadcasts), not a speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainer.generation.sampling import SamplingConfig, next_tokens
from trainer.checkpoint.hf_files import read_hf_config
from trainer.models.gpt.convert import load_hf_weights
from trainer.models.gpt.generate import generate_ids
from trainer.models.gpt.hf_decoders import decoder_shape
from trainer.models.gpt.sharded import ShardedGPT, sharded_layout
from trainer.models.t5 import generate as t5_generate
from trainer.models.t5.convert import load_hf_t5_weights
from trainer.models.t5.hf import save_hf_t5
from trainer.models.t5.model import T5, T5Shape
from trainer.models.t5.sharded import ShardedT5, sharded_t5_layout

MODELS = {
    "gpt": {
        "tiny": {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 1024, "vocab_size": 50257},
        "small": {"n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024, "vocab_size": 50257},
    },
    "llama": {
        "tiny": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                 "intermediate_size": 172, "max_position_embeddings": 1024, "vocab_size": 32000},
        "small": {"num_hidden_layers": 8, "hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 2,
                  "intermediate_size": 1408, "max_position_embeddings": 1024, "vocab_size": 32000},
    },
    "mixtral": {
        "tiny": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                 "intermediate_size": 128, "max_position_embeddings": 1024, "vocab_size": 32000,
                 "num_local_experts": 8, "num_experts_per_tok": 2},
        "small": {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 2,
                  "intermediate_size": 512, "max_position_embeddings": 1024, "vocab_size": 32000,
                  "num_local_experts": 8, "num_experts_per_tok": 2},
    },
    "t5": {
        "tiny": {"d_model": 64, "d_kv": 16, "d_ff": 256, "num_heads": 4, "num_encoder_layers": 2,
                 "num_decoder_layers": 2, "vocab_size": 32128},
        "small": {"d_model": 512, "d_kv": 64, "d_ff": 2048, "num_heads": 8, "num_encoder_layers": 6,
                  "num_decoder_layers": 6, "vocab_size": 32128},
    },
}
PROMPT_LENGTHS = {1: (32,), 4: (32, 24, 16, 8)}
SEED = 1234
GREEDY = SamplingConfig(greedy=True)
PAD = 0
# Two pipeline stages, one process each.
PP_STAGES = 2
PP_WORKER_TIMEOUT_S = 600


def prompts_of(batch: int, vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(SEED)
    # From 2 up: no pad (0) or EOS (1) id inside a T5 prompt.
    return [torch.randint(2, vocab, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS[batch]]


# -- GPT ------------------------------------------------------------------------------------------------

def save_random_gpt2(directory: Path, dims: dict) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(SEED)
    GPT2LMHeadModel(GPT2Config(**dims)).save_pretrained(directory)


def save_random_llama(directory: Path, dims: dict) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    LlamaForCausalLM(LlamaConfig(**dims)).save_pretrained(directory)


def save_random_mixtral(directory: Path, dims: dict) -> None:
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(SEED)
    MixtralForCausalLM(MixtralConfig(**dims)).save_pretrained(directory)


def gpt_ours(directory: Path):
    """Our GPT decoder (GPT-2 or Llama-class options, `trainer.models.gpt.hf_decoders`) of a HF directory."""
    config = read_hf_config(directory)
    shape = decoder_shape(config)
    model = ShardedGPT(shape, config["vocab_size"], sharded_layout(shape, 1, 1, 1), None, torch.device("cpu"))
    load_hf_weights(model.named_parameters(), directory, shape)
    model.finish_loading()
    return lambda prompts, new: generate_ids(model, prompts, new, GREEDY, eod_id=None, generator=None)


def gpt_theirs(directory: Path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory).eval()

    def run(prompts: list[list[int]], new: int) -> list[list[int]]:
        longest = max(map(len, prompts))
        ids = torch.tensor([[PAD] * (longest - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new, min_new_tokens=new,
                                 eos_token_id=None, pad_token_id=PAD)
        return out[:, longest:].tolist()

    return run


# -- T5 -------------------------------------------------------------------------------------------------

def save_random_t5(directory: Path, dims: dict) -> None:
    torch.manual_seed(SEED)
    save_hf_t5(T5(T5Shape(**dims)), directory, model_type="t5")


def t5_model(directory: Path, layout_pp: int, mesh) -> tuple[ShardedT5, t5_generate.SpecialIds]:
    """Our T5 of ``directory`` over ``layout_pp`` stages (this process's one), loaded; ids that never stop."""
    source = t5_generate.resolve_t5_source(str(directory), 1)
    layout = sharded_t5_layout(source.shape, 1, layout_pp, layout_pp)
    model = ShardedT5(source.shape, source.vocab_size, layout, mesh, torch.device("cpu"))
    load_hf_t5_weights(model.named_parameters(), directory, source.shape)
    model.finish_loading()
    return model, t5_generate.SpecialIds(source.special.decoder_start, None, source.special.pad)


def t5_runner(model: ShardedT5, special: t5_generate.SpecialIds):
    choose = lambda logits: next_tokens(logits, GREEDY, None)  # noqa: E731
    return lambda prompts, new: t5_generate.generate_ids(model, prompts, new, choose, special)


def t5_ours(directory: Path):
    return t5_runner(*t5_model(directory, 1, None))


def t5_theirs(directory: Path):
    from transformers import T5ForConditionalGeneration

    model = T5ForConditionalGeneration.from_pretrained(directory).eval()

    def run(prompts: list[list[int]], new: int) -> list[list[int]]:
        ids, mask = t5_generate.right_pad(prompts, PAD, torch.device("cpu"))
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new, min_new_tokens=new,
                                 eos_token_id=None, decoder_start_token_id=PAD, pad_token_id=PAD)
        return out[:, 1:].tolist()

    return run


def _pp_worker(rank: int, port: int, directory: str, prompts: list[list[int]], new: int, repeats: int,
               out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=PP_STAGES)
    try:
        from torch.distributed.device_mesh import init_device_mesh

        from trainer.parallel.dims import MESH_DIM_NAMES

        mesh = init_device_mesh("cpu", (PP_STAGES, 1, 1), mesh_dim_names=MESH_DIM_NAMES)
        run = t5_runner(*t5_model(Path(directory), PP_STAGES, mesh))
        tokens = run(prompts, new)  # warm-up
        seconds = []
        for _ in range(repeats):
            dist.barrier()
            seconds.append(timed(run, prompts, new)[0])
    finally:
        dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps({"tokens": tokens, "seconds": statistics.median(seconds)}))


def time_t5_pp2(directory: Path, prompts: list[list[int]], new: int, repeats: int) -> tuple[float, list[list[int]]]:
    """Median seconds of a run over two pipeline stages (two processes), and its tokens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = directory / "pp2.json"
    context = mp.start_processes(_pp_worker, args=(port, str(directory), prompts, new, repeats, str(out)),
                                 nprocs=PP_STAGES, join=False, start_method="spawn")
    deadline = time.monotonic() + PP_WORKER_TIMEOUT_S
    try:
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the pipeline run did not finish in {PP_WORKER_TIMEOUT_S} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    result = json.loads(out.read_text())
    return result["seconds"], result["tokens"]


# -- comparison -----------------------------------------------------------------------------------------

RUNNERS = {"gpt": (save_random_gpt2, gpt_ours, gpt_theirs), "llama": (save_random_llama, gpt_ours, gpt_theirs),
           "mixtral": (save_random_mixtral, gpt_ours, gpt_theirs), "t5": (save_random_t5, t5_ours, t5_theirs)}


def timed(run, prompts, new) -> tuple[float, list[list[int]]]:
    start = time.perf_counter()
    out = run(prompts, new)
    return time.perf_counter() - start, out


def compare(ours, theirs, prompts: list[list[int]], new: int, repeats: int) -> tuple[float, float, list] | None:
    """(our tokens/s, transformers' tokens/s, our tokens), or None when the outputs differ."""
    _, ours_out = timed(ours, prompts, new)
    _, theirs_out = timed(theirs, prompts, new)
    if ours_out != theirs_out:
        return None
    ours_s, theirs_s = [], []
    for _ in range(repeats):
        ours_s.append(timed(ours, prompts, new)[0])
        theirs_s.append(timed(theirs, prompts, new)[0])
    tokens = len(prompts) * new
    return tokens / statistics.median(ours_s), tokens / statistics.median(theirs_s), ours_out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--models", nargs="+", choices=["tiny", "small"], default=["tiny", "small"])
    parser.add_argument("--batches", nargs="+", type=int, choices=list(PROMPT_LENGTHS), default=list(PROMPT_LENGTHS))
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (both sides)")
    parser.add_argument("--no-pp2", dest="pp2", action="store_false", help="skip the T5 two-stage pipeline run")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, greedy, {args.new_tokens} new tokens, "
          f"medians of {args.repeats}")
    print(f"{'family':<6} {'model':<6} {'batch':>5} {'ours tok/s':>11} {'HF tok/s':>10} {'ratio':>6} "
          f"{'PP 2 tok/s':>11}")
    worst = float("inf")
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.families:
            save, ours_runner, theirs_runner = RUNNERS[family]
            for name in args.models:
                directory = Path(tmp) / f"{family}-{name}"
                save(directory, MODELS[family][name])
                ours, theirs = ours_runner(directory), theirs_runner(directory)
                for batch in args.batches:
                    prompts = prompts_of(batch, MODELS[family][name]["vocab_size"])
                    result = compare(ours, theirs, prompts, args.new_tokens, args.repeats)
                    if result is None:
                        print(f"{family} {name} batch {batch}: outputs differ", file=sys.stderr)
                        return 1
                    ours_rate, theirs_rate, tokens = result
                    worst = min(worst, ours_rate / theirs_rate)
                    pp2 = "-"
                    if family == "t5" and args.pp2:
                        seconds, pp2_tokens = time_t5_pp2(directory, prompts, args.new_tokens, args.repeats)
                        if pp2_tokens != tokens:
                            print(f"{family} {name} batch {batch}: the PP 2 output differs", file=sys.stderr)
                            return 1
                        pp2 = f"{batch * args.new_tokens / seconds:.1f}"
                    print(f"{family:<6} {name:<6} {batch:>5} {ours_rate:>11.1f} {theirs_rate:>10.1f} "
                          f"{ours_rate / theirs_rate:>6.2f} {pp2:>11}", flush=True)
    print(f"lowest ratio (ours / transformers): {worst:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

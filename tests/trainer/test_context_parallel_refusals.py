"""What ``--context-parallel-size`` does not combine with is refused in one line, before any process starts:
the encoder families (t5, bert: decoder models only), a sequence that does not cut into 2 x cp chunks (or,
under sequence parallelism, whose cp share does not split over tp), a world size that cp does not divide,
--reset-attention-mask, expert capacity (tokens would be dropped per rank's share) and keyed dropout. The layout
it accepts: (pp, dp, cp, tp) with the data-parallel size excluding cp, the micro and global batch keeping their
meaning; mixture of experts with the expert-parallel groups drawn from the dp x cp ranks (Megatron's folding)."""

from __future__ import annotations

import pytest

from trainer.cli.train import main
from trainer.cli.train_args import build_parser, config_from_args
from trainer.errors import TrainConfigError
from trainer.models import model_spec
from trainer.parallel.dims import resolve_parallel_dims


def config_of(argv):
    return config_from_args(build_parser().parse_args(["--dataset", "p", *argv]))


def dims_of(argv, world_size):
    config = config_of(argv)
    return resolve_parallel_dims(config, world_size, model_spec(config.model.model).layout_rules)


@pytest.mark.parametrize(("argv", "world_size", "expected"), [
    (["--model", "t5", "--context-parallel-size", "2"], 2,
     "context_parallel_size (2) > 1 is not implemented for model t5 (decoder models only)"),
    (["--model", "bert", "--context-parallel-size", "2"], 2,
     "context_parallel_size (2) > 1 is not implemented for model bert (decoder models only)"),
    (["--seq-length", "1020", "--context-parallel-size", "4"], 4,
     "seq_length (1020) is not divisible by 2 x context_parallel_size (4)"),
    (["--context-parallel-size", "2", "--tensor-model-parallel-size", "4", "--num-attention-heads", "4",
      "--sequence-parallel", "--seq-length", "36", "--max-position-embeddings", "64"], 8,
     "seq_length (36) / context_parallel_size (2) is not divisible by tensor_model_parallel_size (4), which "
     "sequence_parallel needs"),
    (["--context-parallel-size", "2"], 3,
     "world size 3 (num_gpus_per_node x num_nodes) is not divisible by tensor_model_parallel_size (1) x "
     "pipeline_model_parallel_size (1) x context_parallel_size (2)"),
    (["--context-parallel-size", "2", "--reset-attention-mask"], 2,
     "reset_attention_mask does not combine with context_parallel_size (2) > 1 yet"),
    (["--context-parallel-size", "2", "--num-experts", "4", "--moe-expert-capacity-factor", "1.0"], 2,
     "context_parallel_size (2) > 1 does not combine with moe_expert_capacity_factor or moe_expert_capacity yet "
     "(tokens would be dropped per rank's share of the sequence): use dropless routing"),
    (["--context-parallel-size", "2", "--num-experts", "4", "--moe-expert-capacity", "8"], 2,
     "context_parallel_size (2) > 1 does not combine with moe_expert_capacity_factor or moe_expert_capacity yet "
     "(tokens would be dropped per rank's share of the sequence): use dropless routing"),
    (["--context-parallel-size", "2", "--num-experts", "8", "--expert-model-parallel-size", "8"], 4,
     "the data-parallel size (2) x context_parallel_size (2) is not divisible by expert_model_parallel_size (8)"),
    (["--context-parallel-size", "2", "--keyed-dropout"], 2,
     "keyed_dropout does not combine with context_parallel_size (2) > 1: its masks index whole sequences"),
])
def test_a_layout_cp_cannot_run_is_one_line(argv, world_size, expected):
    with pytest.raises(TrainConfigError) as raised:
        dims_of(argv, world_size)
    assert str(raised.value) == expected


def test_cp_ranks_share_the_data_parallel_rank_and_batch():
    dims = dims_of(["--context-parallel-size", "2", "--tensor-model-parallel-size", "2", "--micro-batch-size", "2",
                    "--global-batch-size", "8", "--num-attention-heads", "4"], 8)
    assert (dims.pp, dims.dp, dims.cp, dims.tp) == (1, 2, 2, 2)
    assert dims.world_size == 8 and dims.replicas == 4 and dims.replica_dim == "dp_cp"
    assert dims.global_batch_size == 8 and dims.num_microbatches == 2


@pytest.mark.parametrize(("world_size", "ep"), [(2, 2), (4, 2), (4, 4)])
def test_experts_take_their_parallel_groups_from_the_dp_x_cp_ranks(world_size, ep):
    dims = dims_of(["--context-parallel-size", "2", "--num-experts", "4", "--expert-model-parallel-size", str(ep)],
                   world_size)
    assert (dims.dp, dims.cp, dims.ep) == (world_size // 2, 2, ep) and dims.replicas == world_size


def test_the_cli_refuses_in_one_line_without_a_traceback(capsys):
    assert main(["--dataset", "p", "--device", "cpu", "--model", "t5", "--context-parallel-size", "0"]) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "context-parallel-size" in lines[0] and "Traceback" not in lines[0], lines

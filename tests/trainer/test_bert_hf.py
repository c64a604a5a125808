"""Hugging Face BERT in and out: ``convert-checkpoint --from-hf/--to-hf`` and ``train --load-hf``.

Tiny random BertForPreTraining, BertModel and BertForQuestionAnswering directories are made locally
(transformers builds the structure, `hf_testing.seed_weights` draws every weight); after import the
tokenmill model gives their logits within LOGIT_TOLERANCE, and after export transformers loads the
directory and gives them again.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from hf_testing import LOGIT_TOLERANCE, seed_weights
from test_bert_train import bert_config

from trainer.checkpoint.store import resolve_checkpoint
from trainer.cli.convert import main as convert_main
from trainer.models.bert.convert import hf_bert_train_defaults, read_bert_checkpoint
from trainer.models.bert.model import Bert
from trainer.train import train

# The WordPiece test vocabulary's 1000 pieces, and the [BOS]/[EOS] Megatron's tokenizer appends.
VOCAB = 1002
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
        "max_position_embeddings": 64, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
STD = 0.2
BATCH, SEQ = 3, 12


def make_hf_bert(directory, architecture: str, seed: int = 0):
    """A random HF BERT of ``architecture`` saved with save_pretrained, with the WordPiece test vocab.txt."""
    import transformers

    config = transformers.BertConfig(vocab_size=VOCAB, **TINY)
    model = seed_weights(getattr(transformers, architecture)(config), seed, STD).eval()
    model.save_pretrained(directory)
    return model


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids, token types and a padding mask [BATCH, SEQ] (the rows of different lengths)."""
    generator = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
    types = (torch.arange(SEQ) >= SEQ // 2).long().expand(BATCH, SEQ)
    mask = (torch.arange(SEQ)[None] < torch.tensor([[SEQ], [SEQ - 3], [5]])).long()
    return tokens, types, mask


def hf_outputs(model, architecture: str) -> list[torch.Tensor]:
    tokens, types, mask = batch()
    with torch.no_grad():
        out = model(input_ids=tokens, token_type_ids=types, attention_mask=mask)
    if architecture == "BertForPreTraining":
        return [out.prediction_logits, out.seq_relationship_logits]
    if architecture == "BertForQuestionAnswering":
        return [out.start_logits, out.end_logits]
    return [out.last_hidden_state]


def our_outputs(root, architecture: str) -> list[torch.Tensor]:
    """The outputs of a tokenmill BERT checkpoint, the padded vocabulary columns dropped."""
    state, info = read_bert_checkpoint(*resolve_checkpoint(root))
    model = Bert(info["shape"]).eval()
    model.load_state_dict(state, strict=False)
    model.tie_weights()
    with torch.no_grad():
        if architecture == "BertModel":
            return [model.encode(*batch())]
        outputs = model(*batch())
    if architecture == "BertForPreTraining":
        return [outputs[0][..., :VOCAB], outputs[1]]
    return list(outputs)


def assert_close(ours: list[torch.Tensor], theirs: list[torch.Tensor], where: torch.Tensor | None = None) -> None:
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape
        assert torch.allclose(a, b, atol=LOGIT_TOLERANCE, rtol=0), (a - b).abs().max()


@pytest.mark.parametrize("architecture", ["BertForPreTraining", "BertForQuestionAnswering", "BertModel"])
def test_import_then_export_keeps_the_logits(architecture, tmp_path):
    import transformers

    hf_dir, ckpt, out = tmp_path / "hf", tmp_path / "ckpt", tmp_path / "out"
    reference = hf_outputs(make_hf_bert(hf_dir, architecture), architecture)
    assert convert_main(["--from-hf", str(hf_dir), "--to", str(ckpt), "--tensor-model-parallel-size", "2"]) == 0
    assert_close(our_outputs(ckpt, architecture), reference)

    assert convert_main(["--from", str(ckpt), "--to-hf", str(out)]) == 0
    exported = getattr(transformers, architecture).from_pretrained(out).eval()
    assert_close(hf_outputs(exported, architecture), reference)


def test_pretrained_bert_becomes_a_question_answering_model_and_back(tmp_path):
    """A BertForQuestionAnswering exported from a checkpoint loads, through BertModel, the pre-trained encoder."""
    import transformers

    hf_dir = tmp_path / "hf"
    pretrained = make_hf_bert(hf_dir, "BertForPreTraining")
    qa = transformers.BertForQuestionAnswering.from_pretrained(hf_dir)
    assert torch.equal(qa.bert.encoder.layer[0].attention.self.query.weight,
                       pretrained.bert.encoder.layer[0].attention.self.query.weight)


def test_unsupported_configs_and_tensors_refuse_in_one_line(tmp_path, capsys):
    hf_dir = tmp_path / "hf"
    make_hf_bert(hf_dir, "BertForPreTraining")
    config = (hf_dir / "config.json").read_text()
    (hf_dir / "config.json").write_text(config.replace('"hidden_act": "gelu"', '"hidden_act": "relu"'))
    assert convert_main(["--from-hf", str(hf_dir), "--to", str(tmp_path / "a")]) != 0
    assert "hidden_act='relu' is not supported" in capsys.readouterr().err
    (hf_dir / "config.json").write_text(config.replace('"num_hidden_layers": 2', '"num_hidden_layers": 3'))
    assert convert_main(["--from-hf", str(hf_dir), "--to", str(tmp_path / "b")]) != 0
    assert "missing tensor bert.encoder.layer.2.attention.self.query.weight" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b" / "latest_checkpointed_iteration.txt").exists()


def test_train_load_hf_starts_from_the_directory_weights(wordpiece_sentences, data_test, tmp_path):  # noqa: F811
    """``train --load-hf DIR`` takes the shape and the tokenizer (vocab.txt) from DIR and starts from its weights:
    its first loss is the one of the same weights converted into a checkpoint and loaded with ``--load``."""
    hf_dir = tmp_path / "hf"
    make_hf_bert(hf_dir, "BertForPreTraining")
    shutil.copyfile(data_test / "tokenizers" / "wordpiece-vocab.txt", hf_dir / "vocab.txt")
    assert convert_main(["--from-hf", str(hf_dir), "--to", str(tmp_path / "ckpt"),
                         "--make-vocab-size-divisible-by", "64"]) == 0
    losses = []
    for source in ({"load_hf": str(hf_dir)}, {"load": str(tmp_path / "ckpt")}):
        config = bert_config(wordpiece_sentences, data_test, str(tmp_path / "cache"), train_iters=1)
        config.model.max_position_embeddings, config.model.layernorm_epsilon = 64, 1e-12
        for name, value in source.items():
            setattr(config.checkpoint, name, value)
        losses.append(train(config).losses[0])
    assert losses[0] == pytest.approx(losses[1], abs=1e-6)
    defaults = hf_bert_train_defaults(hf_dir)
    assert defaults["model"] | {"model": "bert", "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
                                "ffn_hidden_size": 64, "max_position_embeddings": 64, "vocab_size": VOCAB,
                                "layernorm_epsilon": 1e-12} == defaults["model"]
    assert defaults["data"]["tokenizer_type"] == "BertWordPieceLowerCase"
    assert defaults["data"]["vocab_file"] == str(hf_dir / "vocab.txt")

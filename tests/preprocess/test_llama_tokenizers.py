"""Llama-class tokenizers (issue 30, point 4).

Promised:
- ``--tokenizer-type Llama2Tokenizer --tokenizer-model tokenizer.model`` follows Megatron's ``_Llama2Tokenizer``:
  every text is the model's BOS then ``encode_as_ids(text)`` (no EOS; ``--append-eod`` appends the model's EOS),
  eod = EOS, no pad when the model has none, vocabulary = the model's pieces; the same ids on the gigatoken fast
  path (BPE with byte fallback, Llama 2's kind) and the sentencepiece one; ``preprocess-data`` writes them;
  a checkpoint records it and ``transformers.AutoTokenizer`` reads the record back with the same ids; a model
  without a BOS piece is refused in one line naming the file.
- A Llama-3 / Qwen-style ``tokenizer.json`` (byte-level BPE with the regex pre-tokenizer, a vocabulary past
  65,500 ids, Llama 3's ``<|begin_of_text|>`` added by its post-processor; Qwen's NFC normalizer and no BOS)
  goes through ``HuggingFaceTokenizer`` on the gigatoken path and ``preprocess-data`` writes int32 token files
  holding the `tokenizers` library's ids. The tokenizers are built here, nothing is downloaded.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import sentencepiece
from cli_testing import assert_one_line, run_cli

from indexed_dataset import IndexedDataset
from preprocess import cli
from preprocess.tokenizers import TokenizerConfig, build_tokenizer
from preprocess.tokenizers.giga import GigatokenTokenizer
from preprocess_testing import SAMPLE, TOKENIZERS, sample_texts

SP_BPE = os.path.join(TOKENIZERS, "sp-bpe.model")  # byte-fallback BPE: gigatoken's path
SP_UNIGRAM = os.path.join(TOKENIZERS, "sp-unigram.model")  # the sentencepiece path
TEXTS = ["Hello world", "", "  two  spaces\n\nand lines", "émoji 😀 日本語", "<s> literal </s>"]
# Llama 3's and Qwen2's vocabulary sizes: both past uint16, so their token files are int32.
LLAMA3_VOCAB, QWEN_VOCAB = 128000, 151643
INT32 = np.dtype(np.int32)
# Llama 3's pre-tokenizer pattern (Qwen2 uses the same one).
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def megatron_llama2_ids(model_file: str, text: str) -> list[int]:
    """Megatron's `_Llama2Tokenizer.tokenize(text)` (bos=True, eos=False)."""
    model = sentencepiece.SentencePieceProcessor(model_file=model_file)
    return [model.bos_id(), *model.encode(text)]


@pytest.mark.parametrize("model_file, fast", [(SP_BPE, True), (SP_UNIGRAM, False)])
def test_llama2_tokenizer_follows_megatron(model_file, fast):
    tokenizer = build_tokenizer(TokenizerConfig(tokenizer_type="Llama2Tokenizer", tokenizer_model=model_file))
    model = sentencepiece.SentencePieceProcessor(model_file=model_file)
    assert isinstance(tokenizer, GigatokenTokenizer) == fast
    assert (tokenizer.vocab_size, tokenizer.eod, tokenizer.pad) == (model.get_piece_size(), model.eos_id(), None)
    assert tokenizer.affixes == ((model.bos_id(),), ())
    for text in TEXTS:
        assert tokenizer.encode(text) == megatron_llama2_ids(model_file, text), text
        assert tokenizer.encode_plain(text) == model.encode(text)
    batch = tokenizer.encode_batch(TEXTS)
    assert [batch.tokens[a:b].tolist() for a, b in zip(batch.offsets[:-1], batch.offsets[1:])] == [
        megatron_llama2_ids(model_file, text) for text in TEXTS]


def test_preprocess_data_writes_bos_text_eos(tmp_path):
    assert cli.main(["--input", SAMPLE, "--output-prefix", str(tmp_path / "out"), "--append-eod",
                     "--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model", SP_BPE]) == 0
    dataset = IndexedDataset(str(tmp_path / "out_text_document"))
    model = sentencepiece.SentencePieceProcessor(model_file=SP_BPE)
    texts = sample_texts()
    assert len(dataset) == len(texts)
    for index, text in enumerate(texts):
        assert dataset[index].tolist() == [*megatron_llama2_ids(SP_BPE, text), model.eos_id()]


def test_checkpoint_record_reads_back_in_transformers(tmp_path):
    import transformers

    from trainer.checkpoint.hf_files import tokenizer_config_for_directory
    from trainer.checkpoint.tokenizer import record_tokenizer

    config = TokenizerConfig(tokenizer_type="Llama2Tokenizer", tokenizer_model=SP_BPE)
    record_tokenizer(tmp_path, config)
    assert tokenizer_config_for_directory(tmp_path).tokenizer_type == "Llama2Tokenizer"
    ours = build_tokenizer(config)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert (theirs.bos_token, theirs.eos_token) == ("<s>", "</s>")
    for text in TEXTS[:4]:
        assert theirs(text).input_ids == ours.encode(text), text


def test_bare_tokenizer_model_is_read_as_llama2(tmp_path):
    from trainer.checkpoint.hf_files import tokenizer_config_for_directory

    (tmp_path / "tokenizer.model").write_bytes(open(SP_BPE, "rb").read())
    assert tokenizer_config_for_directory(tmp_path).tokenizer_type == "Llama2Tokenizer"


def test_model_without_bos_is_refused_in_one_line(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(sample_texts()), encoding="utf-8")
    prefix = str(tmp_path / "nobos")
    sentencepiece.SentencePieceTrainer.train(input=str(corpus), model_prefix=prefix, vocab_size=120, bos_id=-1,
                                             num_threads=1, minloglevel=2)
    before = sorted(os.listdir(tmp_path))
    code, err = run_cli("preprocess-data", "--input", SAMPLE, "--output-prefix", str(tmp_path / "out"),
                        "--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model", prefix + ".model", cwd=tmp_path)
    assert_one_line(code, err, prefix + ".model", "BOS")
    assert sorted(os.listdir(tmp_path)) == before


def _byte_level_bpe(directory, vocab_size: int, specials: list[str], bos: str | None, nfc: bool) -> str:
    """A Llama-3 (``bos``) or Qwen2 (``nfc``, no BOS) style tokenizer.json: byte-level BPE trained on the sample
    texts, its vocabulary filled with unreachable tokens up to ``vocab_size``, then the special tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizer
    trained.train_from_iterator(sample_texts(), trainers.BpeTrainer(
        vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    spec = json.loads(trained.to_str())
    vocab = spec["model"]["vocab"]
    vocab.update({f"<filler_{i}>": i for i in range(len(vocab), vocab_size)})
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in spec["model"]["merges"]]
    tokenizer = Tokenizer(models.BPE(vocab, merges, ignore_merges=True))
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    if nfc:
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.add_special_tokens(specials)
    if bos is not None:
        tokenizer.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, tokenizer.token_to_id(bos))])])
    directory.mkdir()
    tokenizer.save(str(directory / "tokenizer.json"))
    return str(directory)


STYLES = {
    "llama3": dict(vocab_size=LLAMA3_VOCAB, specials=["<|begin_of_text|>", "<|end_of_text|>"],
                   bos="<|begin_of_text|>", nfc=False, eos="<|end_of_text|>"),
    "qwen2": dict(vocab_size=QWEN_VOCAB, specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], bos=None,
                  nfc=True, eos="<|endoftext|>"),
}


@pytest.mark.parametrize("style", STYLES)
def test_llama3_and_qwen_tokenizer_json_write_int32_files(tmp_path, style):
    from tokenizers import Tokenizer

    settings = dict(STYLES[style])
    eos = settings.pop("eos")
    directory = _byte_level_bpe(tmp_path / style, **settings)
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"eos_token": eos}, f)
    tokenizer = build_tokenizer(TokenizerConfig(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=directory))
    reference = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
    assert isinstance(tokenizer, GigatokenTokenizer)  # the fast path, as for GPT-2's byte-level BPE
    assert tokenizer.vocab_size == settings["vocab_size"] + len(settings["specials"])
    assert tokenizer.eod == reference.token_to_id(eos) == settings["vocab_size"] + settings["specials"].index(eos)
    assert cli.main(["--input", SAMPLE, "--output-prefix", str(tmp_path / "out"), "--append-eod",
                     "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", directory]) == 0
    dataset = IndexedDataset(str(tmp_path / "out_text_document"))
    assert dataset.dtype == INT32
    texts = sample_texts()
    for index, text in enumerate(texts):
        want = reference.encode(text).ids + [tokenizer.eod]
        assert dataset[index].tolist() == want, index
    if settings["bos"] is not None:
        assert all(dataset[i][0] == reference.token_to_id(settings["bos"]) for i in range(len(texts)))

"""Run in a checkout of the code BEFORE the model-family redesign: writes checkpoints at iteration 2 of a tiny GPT
and a tiny T5 run, and the losses that run then logged for iterations 3 and 4."""
import dataclasses, json, os, shutil, sys
from pathlib import Path
sys.path[:0] = [os.getcwd(), "tests/trainer", "tests"]
from trainer_testing import tiny_config, t5_config, write_tiny_dataset, result_record
from preprocess.cli import main as preprocess_data

out = Path(sys.argv[1]); work = Path("/tmp/legacy_work")
data_test = Path("data_test").resolve()
prefix = write_tiny_dataset(str(data_test / "megatron/sample_en_eod_text_document"), str(work / "tiny_text_document"))
sentence = work / "en"
assert preprocess_data(["--input", str(data_test / "sample_en.jsonl"), "--output-prefix", str(sentence),
                        "--split-sentences", "--tokenizer-type", "SentencePieceTokenizer",
                        "--tokenizer-model", str(data_test / "tokenizers" / "sp-unigram.model"), "--workers", "1"]) == 0
sentence_prefix = str(sentence) + "_text_sentence"
runs = {"gpt": lambda save: tiny_config(prefix, str(work / "cache"), train_iters=4, save=save, save_interval=2, num_layers=2),
        "t5": lambda save: t5_config(sentence_prefix, data_test, str(work / "cache"), train_iters=4, save=save)}
record = {}
for name, make in runs.items():
    ckpt = out / name
    config = make(str(ckpt))
    config = dataclasses.replace(config, checkpoint=dataclasses.replace(config.checkpoint, save_interval=2))
    result = result_record(config)
    record[name] = result
    shutil.rmtree(ckpt / "iter_0000004")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("2")
(out / "losses_before.json").write_text(json.dumps(record, indent=1, default=str))

"""``preprocess-data --log-interval N`` logs a progress line each time N more documents are done."""

import logging
import re

from preprocess.cli import main

LOG_INTERVAL = 50
# Small chunks (a few documents each): lines are counted when a chunk finishes.
CHUNK_BYTES = 20_000


def test_a_progress_line_every_n_documents(data_test, tmp_path, caplog):
    argv = ["--input", str(data_test / "sample_en.jsonl"), "--output-prefix", str(tmp_path / "out"),
            "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", str(data_test / "gpt2" / "gpt2-vocab.json"),
            "--merge-file", str(data_test / "gpt2" / "gpt2-merges.txt"),
            "--log-interval", str(LOG_INTERVAL), "--chunk-bytes", str(CHUNK_BYTES)]
    with caplog.at_level(logging.INFO):
        assert main(argv) == 0
    counts = [int(m.group(1)) for m in (re.match(r"Processed (\d+) documents", r.getMessage()) for r in caplog.records)
              if m]
    # 232 documents: one line past each multiple of 50, never two for the same multiple
    assert [count // LOG_INTERVAL for count in counts] == [1, 2, 3, 4]

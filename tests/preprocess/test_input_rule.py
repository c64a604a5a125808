"""One input-validity rule, whatever the chunking and the parser path (issue 18 §4).

A line is valid when it is valid UTF-8 (all of it), one JSON object nested at most MAX_JSON_DEPTH
levels, with a string (or list of strings) under each key. The same files are run under several
`--chunk-bytes`: the fast (Arrow) path takes chunks of good lines, the exact (json.loads) path the
chunks with a bad line, and both must keep and refuse the same lines with the same messages.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from indexed_dataset import TokenmillError
from preprocess import PreprocessConfig, cli, preprocess_data
from preprocess.jsonl import MAX_JSON_DEPTH, json_depth
from preprocess.tokenizers import TokenizerConfig
from preprocess_testing import GPT2_VOCAB, GPT2_MERGES, read_bytes

GPT2 = TokenizerConfig(tokenizer_type="GPT2BPETokenizer", vocab_file=GPT2_VOCAB, merge_file=GPT2_MERGES)
# From one line per chunk to the whole file in one chunk.
CHUNK_SIZES = (1, 90, 700, 1 << 20)


def _nested(depth: int) -> str:
    """Arrays `depth` deep; inside a line's object they reach depth + 1."""
    return "[" * depth + "]" * depth


# (line, the reason it is refused: the message after `file:line: `).
BAD_LINES = [
    (b'{"text": "ignored field with bad UTF-8", "meta": "\xff\xfe"}', "invalid UTF-8 at byte 50"),
    (('{"text": "deep", "meta": ' + _nested(1500) + "}").encode(), f"JSON nested deeper than {MAX_JSON_DEPTH} levels"),
    (('{"text": "just too deep", "meta": ' + _nested(MAX_JSON_DEPTH) + "}").encode(),
     f"JSON nested deeper than {MAX_JSON_DEPTH} levels"),
    (b"", "empty line, expected a JSON object"),
    (b" \t", "empty line, expected a JSON object"),
    (b'{"text": "two"} {"text": "objects"}', "not valid JSON: Extra data at column 17"),
    (b'{"text": "unterminated', "not valid JSON: Unterminated string starting at column 10"),
    (b'{"other": "no text key"}', "missing key 'text'"),
    (b'["an array"]', "expected a JSON object, got an array"),
]
GOOD_LINES = [
    b'{"text": "plain document one"}',
    ('{"text": "nested as deep as allowed", "meta": ' + _nested(MAX_JSON_DEPTH - 1) + "}").encode(),
    b'{"text": "brackets in a string do not nest: ' + b"[" * 2000 + b'"}',
    b'{"text": "a lone surrogate escape outside the keys we read is valid JSON", "meta": "\\ud800"}',
    b'{"text": "NaN is accepted as Python\'s json accepts it", "score": NaN}',
    '{"text": "unicode ünïcödé 日本語"}'.encode(),
]


def _mixed_file(path) -> tuple[str, list[tuple[int, str]]]:
    """Good and bad lines interleaved (each bad line between good ones); returns the path and the
    expected (line number, reason) of every bad line."""
    lines, expected = [], []
    for index, (bad, reason) in enumerate(BAD_LINES):
        lines.append(GOOD_LINES[index % len(GOOD_LINES)])
        lines.append(bad)
        expected.append((len(lines), reason))
    lines.extend(GOOD_LINES)
    path.write_bytes(b"\n".join(lines) + b"\n")
    return str(path), expected


def _config(tmp_path, source: str, chunk_bytes: int, name: str, **overrides) -> PreprocessConfig:
    return PreprocessConfig(input=source, output_prefix=str(tmp_path / name), tokenizer=GPT2,
                            chunk_bytes=chunk_bytes, **overrides)


def test_the_depth_limit_counts_nesting_not_brackets_inside_strings():
    assert json_depth(b'{"a": "[[[[{{", "b": [[1], {"c": [2]}]}') == 4
    assert json_depth(b'{"a": "\\"[[[", "b": []}') == 2


def test_skip_invalid_keeps_and_skips_the_same_lines_under_every_chunk_size(tmp_path):
    source, expected = _mixed_file(tmp_path / "mixed.jsonl")
    outcomes = []
    for chunk_bytes in CHUNK_SIZES:
        name = f"out{chunk_bytes}"
        summary = preprocess_data(_config(tmp_path, source, chunk_bytes, name, skip_invalid=True))
        outcomes.append((summary.documents, summary.skipped_lines,
                         read_bytes(str(tmp_path / f"{name}_text_document.bin")),
                         read_bytes(str(tmp_path / f"{name}_text_document.idx"))))
        assert summary.skipped_lines == len(BAD_LINES)
        assert [(line, reason) for _, line, reason in summary.skipped] == expected[: len(summary.skipped)]
    assert all(outcome == outcomes[0] for outcome in outcomes)
    assert outcomes[0][0] == len(BAD_LINES) + len(GOOD_LINES)


@pytest.mark.parametrize("bad_index", range(len(BAD_LINES)))
def test_a_bad_line_is_refused_with_the_same_message_under_every_chunk_size(tmp_path, bad_index):
    bad, reason = BAD_LINES[bad_index]
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join([*GOOD_LINES, bad, *GOOD_LINES]) + b"\n")
    messages = set()
    for chunk_bytes in CHUNK_SIZES:
        with pytest.raises(TokenmillError) as caught:
            preprocess_data(_config(tmp_path, str(path), chunk_bytes, "out"))
        messages.add(str(caught.value))
    assert messages == {f"{path}:{len(GOOD_LINES) + 1}: {reason}"}


def test_deep_nesting_is_one_line_on_the_command_line_also_when_skipping(tmp_path, capsys):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join([BAD_LINES[1][0], *GOOD_LINES]) + b"\n")
    flags = ["--input", str(path), "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", GPT2_VOCAB,
             "--merge-file", GPT2_MERGES, "--chunk-bytes", "100000"]
    assert cli.main([*flags, "--output-prefix", str(tmp_path / "strict")]) == 1
    assert capsys.readouterr().err == (f"preprocess-data: error: {path}:1: JSON nested deeper than "
                                       f"{MAX_JSON_DEPTH} levels\n")
    assert cli.main([*flags, "--output-prefix", str(tmp_path / "skipping"), "--skip-invalid"]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_a_parquet_dictionary_string_text_column_is_valid_input(tmp_path):
    texts = ["first document", "second document", "first document"]
    plain, encoded = tmp_path / "plain.parquet", tmp_path / "dictionary.parquet"
    pq.write_table(pa.table({"text": pa.array(texts)}), plain)
    pq.write_table(pa.table({"text": pa.array(texts).dictionary_encode()}), encoded)
    assert pq.read_schema(encoded).field("text").type == pa.dictionary(pa.int32(), pa.string())
    for source, name in ((plain, "plain"), (encoded, "dictionary")):
        preprocess_data(_config(tmp_path, str(source), 1 << 20, name))
    for suffix in (".bin", ".idx"):
        assert read_bytes(str(tmp_path / f"plain_text_document{suffix}")) == \
            read_bytes(str(tmp_path / f"dictionary_text_document{suffix}"))

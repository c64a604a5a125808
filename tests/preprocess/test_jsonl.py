"""The Arrow fast path and the exact per-line path read the same texts as Python's json."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from preprocess.jsonl import JsonLinesChunk
from preprocess.jsonl import _parse_exact, _parse_fast, parse_json_lines

texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30)
documents = st.lists(st.fixed_dictionaries({"text": texts, "src": texts}, optional={"other": st.integers()}),
                     min_size=1, max_size=8)


def chunk_of(lines: list[bytes], first_line: int = 1) -> JsonLinesChunk:
    data = b"".join(lines)
    return JsonLinesChunk("in.jsonl", first_line, data, len(data))


@settings(max_examples=150, deadline=None)
@given(documents=documents, ensure_ascii=st.booleans(), final_newline=st.booleans())
def test_fast_and_exact_paths_agree_with_json_loads(documents, ensure_ascii, final_newline):
    lines = [json.dumps(d, ensure_ascii=ensure_ascii).encode() + b"\n" for d in documents]
    if not final_newline:
        lines[-1] = lines[-1].rstrip(b"\n")
    chunk = chunk_of(lines, first_line=10)
    keys, fields = ("text",), ("src",)
    fast = _parse_fast(chunk.data, keys, fields)
    exact = _parse_exact(chunk, keys, False, fields)
    assert fast is not None
    assert fast[0]["text"].to_pylist() == exact.columns["text"].pieces.to_pylist() == [d["text"] for d in documents]
    assert fast[1]["src"].to_pylist() == exact.fields["src"].to_pylist() == [d["src"] for d in documents]
    assert exact.line_numbers.tolist() == list(range(10, 10 + len(documents)))


def test_doubtful_chunks_take_the_exact_path():
    assert _parse_fast(b'{"text": "a"}\n\n{"text": "b"}\n', ("text",), ()) is None  # Arrow skips blank lines
    assert _parse_fast(b'{"text": "a", "text": "b"}\n', ("text",), ()) is None  # duplicate key
    parsed = parse_json_lines(chunk_of([b'{"text": "a", "text": "b"}\n']), ("text",))
    assert parsed.columns["text"].pieces.to_pylist() == ["b"]  # Python's rule: the last one wins


def test_skipping_records_line_numbers_and_reasons():
    parsed = parse_json_lines(chunk_of([b'{"text": "a"}\n', b"{\n", b'{"text": 1}\n', b'{"text": "d"}\n'], 7),
                              ("text",), skip_invalid=True)
    assert parsed.columns["text"].pieces.to_pylist() == ["a", "d"]
    assert parsed.line_numbers.tolist() == [7, 10]
    assert [number for number, _ in parsed.skipped] == [8, 9]


def test_a_byte_order_mark_at_the_start_of_a_file_is_accepted_by_both_paths():
    for lines in ([b'\xef\xbb\xbf{"text": "a"}\n'], [b'\xef\xbb\xbf{"text": "a"}\n', b"\n", b'{"text": "b"}\n']):
        parsed = parse_json_lines(chunk_of(lines), ("text",), skip_invalid=True)
        assert parsed.columns["text"].pieces.to_pylist()[0] == "a"

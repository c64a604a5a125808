"""Benchmark corpora that grow a caching tokenizer's memory (issue 19), deterministic (fixed seeds).

    python -m benchmarks.make_adversarial_corpus random bench_data/corpus_random_words.jsonl 500000000
    python -m benchmarks.make_adversarial_corpus varied bench_data/corpus_en.jsonl \
        bench_data/corpus_en_1g.jsonl 1000000000

* `random OUT BYTES`: JSON lines of {"text": ...} made only of distinct random words (6-12 ASCII letters,
  mixed case, one space apart; ~4 KB per document): what URLs, numbers, hashes and typos look like to a
  pre-token cache, with no word ever repeated (52^6 > 10^10 words of the shortest length).
* `varied SOURCE OUT BYTES`: SOURCE's lines (make_corpus.py's `{"text": "...` lines) repeated until BYTES,
  each copy after the first with VARIED_LETTER_RATE of its lowercase letters replaced by other random
  lowercase letters (typo-like new words at a realistic rate), so every copy brings new vocabulary, as more
  real text would. Only letters inside the text are touched (never the key, nor a `\\n` or `\\uXXXX`
  escape): every line stays valid JSON.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

SEED = 19
LETTERS = np.frombuffer(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", dtype=np.uint8)
LOWERCASE = LETTERS[:26]
SHORTEST_WORD, LONGEST_WORD = 6, 12
DOCUMENT_BYTES = 4096
# Documents generated per numpy batch (~16 MB of text).
BATCH_DOCUMENTS = 4096
VARIED_LETTER_RATE = 0.02
# Bytes at the start of a line that are never changed: the `{"text": "` of make_corpus.py's lines.
LINE_PREFIX_BYTES = 10
# Bytes after a backslash that are never changed: the longest JSON escape is `\uXXXX`.
ESCAPE_BYTES = 6
_PREFIX, _SUFFIX = b'{"text": "', b'"}\n'


def random_words(rng: np.random.Generator, size: int) -> np.ndarray:
    """uint8 [<= size]: whole words of SHORTEST..LONGEST_WORD random letters, one space apart."""
    text = LETTERS[rng.integers(0, len(LETTERS), size)]
    lengths = rng.integers(SHORTEST_WORD, LONGEST_WORD + 1, size // SHORTEST_WORD + 1)
    spaces = np.cumsum(lengths + 1) - 1
    spaces = spaces[spaces < size]
    text[spaces] = ord(" ")
    return text[: spaces[-1]]


def write_random(out: str, target_bytes: int) -> None:
    rng = np.random.default_rng(SEED)
    written = 0
    with open(out, "wb") as f:
        while written < target_bytes:
            text = random_words(rng, BATCH_DOCUMENTS * DOCUMENT_BYTES).tobytes()
            start = 0
            while start < len(text) and written < target_bytes:
                end = text.rfind(b" ", start, start + DOCUMENT_BYTES)  # documents end between words
                end = len(text) if end <= start or start + DOCUMENT_BYTES >= len(text) else end
                line = _PREFIX + text[start:end] + _SUFFIX
                f.write(line)
                written += len(line)
                start = end + 1
    print(f"wrote {out}: {written} bytes of distinct random words")


def changeable_letters(data: np.ndarray) -> np.ndarray:
    """bool [len(data)]: lowercase letters of JSON-lines bytes outside keys and escapes."""
    mask = (data >= ord("a")) & (data <= ord("z"))
    line_starts = np.concatenate(([0], np.flatnonzero(data == ord("\n")) + 1))
    backslashes = np.flatnonzero(data == ord("\\"))
    for starts, width in ((line_starts, LINE_PREFIX_BYTES), (backslashes, ESCAPE_BYTES + 1)):
        for offset in range(width):
            mask[np.minimum(starts + offset, len(data) - 1)] = False
    return mask


def write_varied(source: str, out: str, target_bytes: int) -> None:
    with open(source, "rb") as f:
        original = np.frombuffer(f.read(), dtype=np.uint8)
    line_starts = np.concatenate(([0], np.flatnonzero(original[:-1] == ord("\n")) + 1))
    prefix = np.frombuffer(_PREFIX, dtype=np.uint8)
    if (not len(original) or original[-1] != ord("\n")
            or not all((original[line_starts + i] == byte).all() for i, byte in enumerate(prefix))):
        raise SystemExit(f"{source}: expected make_corpus.py's lines ({_PREFIX.decode()}...), "
                         "each ending with a newline")
    changeable = np.flatnonzero(changeable_letters(original))
    rng = np.random.default_rng(SEED)
    written, copy = 0, 0
    with open(out, "wb") as f:
        while written < target_bytes:
            data = original.copy()
            if copy:
                chosen = changeable[rng.random(len(changeable)) < VARIED_LETTER_RATE]
                data[chosen] = LOWERCASE[rng.integers(0, len(LOWERCASE), len(chosen))]
            if written + len(data) > target_bytes:  # cut the last copy after a whole line
                ends = np.flatnonzero(data[: target_bytes - written] == ord("\n"))
                if not len(ends):
                    break
                data = data[: ends[-1] + 1]
            f.write(data.tobytes())
            written += len(data)
            copy += 1
    print(f"wrote {out}: {written} bytes, {copy} copies of {source} with varied words")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    modes = parser.add_subparsers(dest="mode", required=True)
    random_mode = modes.add_parser("random", help="distinct random words")
    random_mode.add_argument("out")
    random_mode.add_argument("bytes", type=int)
    varied = modes.add_parser("varied", help="real text repeated with varied words")
    varied.add_argument("source")
    varied.add_argument("out")
    varied.add_argument("bytes", type=int)
    args = parser.parse_args()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    if args.mode == "random":
        write_random(args.out, args.bytes)
    else:
        write_varied(args.source, args.out, args.bytes)


if __name__ == "__main__":
    main()

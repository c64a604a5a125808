"""A fault-injection campaign over the bundled golden token files: damage them every way we can think of
and run `inspect-index`, `merge-datasets` and `convert` on each, in-process (their `main(argv)`).

    python tests/indexed_dataset/damage_campaign.py            # the full campaign, counts printed
    python tests/indexed_dataset/damage_campaign.py --fast     # the subset the default test run uses

A damage is a `Damage(name, source, apply, must_fail)`: `source` is the clean dataset it starts from
("mmap", "arrow", "mindrecord"), `apply(dataset_path)` damages a private copy, and `must_fail` says what a
correct tool must do: True (the files are inconsistent: every command must refuse them), None (the
damage may leave consistent files, such as a flipped token byte: either outcome is right). For mmap the
verdict comes from `reference_problem`, a slow, plain-Python reading of the format written from its
specification, independent of the reader under test.

Every run must end in exit 0 or one `prog: error: ...` line naming a file and a non-zero exit: never a
traceback (any other exception escaping `main`), never a hang (an alarm per run), never an exit 0 on
must-fail damage, and never an output left behind by a failed run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import random
import shutil
import signal
import sqlite3
import struct
import sys
from collections import Counter
from collections.abc import Callable

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLDEN_MMAP = os.path.join(REPO, "data_test", "megatron", "sample_en_keys_src_document")
GOLDEN_MINDRECORD = os.path.join(REPO, "data_test", "mindrecord", "tokens_1shard.mindrecord")
# A run that takes longer than this is a hang (each takes milliseconds on the small golden files).
RUN_SECONDS = 30
SEED = 20240518
# Random byte flips per region in the full campaign; the fast subset (the default test run's, over 200
# damages of every kind in a few seconds) keeps every FAST_STRIDE-th damage.
FLIPS_PER_REGION = 40
FAST_STRIDE = 2
HEADER_SIZE = 34
OUTCOMES = ("clean_error", "accepted", "traceback", "hang", "silent_success", "messy_error", "unnamed_error",
            "leftover")


@dataclasses.dataclass(frozen=True)
class Damage:
    name: str
    source: str
    apply: Callable[[str], None]
    must_fail: bool | None


# ------------------------------------------------------------------------------------------ byte helpers
def _write_at(path: str, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _xor_byte(path: str, offset: int, mask: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ mask]))


def _append(path: str, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


# ----------------------------------------------------------------------------- the mmap reference check
def reference_problem(prefix: str) -> str | None:
    """What is inconsistent in a `.bin/.idx` pair, read with `struct` alone (None: consistent)."""
    try:
        idx = open(prefix + ".idx", "rb").read()
        bin_size = os.path.getsize(prefix + ".bin")
    except OSError as error:
        return str(error)
    if len(idx) < HEADER_SIZE:
        return "short header"
    magic, version, code, s, d = struct.unpack("<9sQBQQ", idx[:HEADER_SIZE])
    itemsizes = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 8, 7: 4, 8: 2}
    if magic != b"MMIDIDX\x00\x00" or version != 1 or code not in itemsizes or d < 1:
        return "header"
    if len(idx) != HEADER_SIZE + 12 * s + 8 * d:
        return "index size"
    lengths = struct.unpack(f"<{s}i", idx[HEADER_SIZE : HEADER_SIZE + 4 * s])
    pointers = struct.unpack(f"<{s}q", idx[HEADER_SIZE + 4 * s : HEADER_SIZE + 12 * s])
    documents = struct.unpack(f"<{d}q", idx[HEADER_SIZE + 12 * s :])
    position = 0
    for length, pointer in zip(lengths, pointers):
        if length < 0 or pointer != position:
            return "lengths and pointers"
        position += length * itemsizes[code]
    if documents[0] != 0 or documents[-1] != s or any(b < a for a, b in zip(documents, documents[1:])):
        return "document indices"
    if bin_size != position:
        return "data size"
    return None


# ---------------------------------------------------------------------------------------- the damages
def _mmap_damages(rng: random.Random, flips: int) -> list[Damage]:
    idx_size = os.path.getsize(GOLDEN_MMAP + ".idx")
    bin_size = os.path.getsize(GOLDEN_MMAP + ".bin")
    s = (idx_size - HEADER_SIZE - 8) // 20  # 34 + 12 S + 8 (S + 1)
    lengths_at, pointers_at, documents_at = HEADER_SIZE, HEADER_SIZE + 4 * s, HEADER_SIZE + 12 * s
    damages = []

    def idx(name, apply, must_fail=None):
        damages.append(Damage(f"mmap/{name}", "mmap", apply, must_fail))

    for offset in range(HEADER_SIZE):
        mask = rng.randrange(1, 256)
        idx(f"header byte {offset} ^ {mask:#x}", lambda p, o=offset, m=mask: _xor_byte(p + ".idx", o, m))
    for region, start, end in (("lengths", lengths_at, pointers_at), ("pointers", pointers_at, documents_at),
                               ("document indices", documents_at, idx_size), ("data", 0, bin_size)):
        for _ in range(flips):
            offset, mask = rng.randrange(start, end), rng.randrange(1, 256)
            suffix = ".bin" if region == "data" else ".idx"
            idx(f"{region} byte {offset} ^ {mask:#x}", lambda p, o=offset, m=mask, x=suffix: _xor_byte(p + x, o, m))
    for value in (2**31 - 1, -1, -262732):
        for entry in (0, s // 2, s - 1):
            idx(f"length {entry} = {value}",
                lambda p, e=entry, v=value: _write_at(p + ".idx", lengths_at + 4 * e, struct.pack("<i", v)))
    for value in (2**62, -8, 1):
        for entry in (1, s // 2, s - 1):
            idx(f"pointer {entry} = {value}",
                lambda p, e=entry, v=value: _write_at(p + ".idx", pointers_at + 8 * e, struct.pack("<q", v)))
    for value in (2**62, -1, s + 1):
        for entry in (0, s // 2, s):
            idx(f"document index {entry} = {value}",
                lambda p, e=entry, v=value: _write_at(p + ".idx", documents_at + 8 * e, struct.pack("<q", v)))
    for entry in (0, s // 3, s - 2):
        def shift(p, e=entry):  # a length moved by one between neighbours: the pointers no longer agree
            raw = bytearray(open(p + ".idx", "rb").read())
            a, b = struct.unpack_from("<ii", raw, lengths_at + 4 * e)
            struct.pack_into("<ii", raw, lengths_at + 4 * e, a + 1, b - 1)
            open(p + ".idx", "wb").write(raw)
        idx(f"length {entry} +1, {entry + 1} -1", shift)
    for field, offset in (("sequence count", 18), ("document index count", 26)):
        for value in (0, 1, s - 1, s + 1, 2**32, 2**63 - 1, 2**64 - 1):
            idx(f"{field} = {value}", lambda p, o=offset, v=value: _write_at(p + ".idx", o, struct.pack("<Q", v)))
    for suffix, size in ((".idx", idx_size), (".bin", bin_size)):
        for cut in sorted({0, 1, 9, 33, HEADER_SIZE, size // 2, size - 8, size - 1}):
            if cut < size:
                idx(f"{suffix} truncated to {cut}", lambda p, x=suffix, c=cut: os.truncate(p + x, c))
        for extra in (1, 2, 8, 12, 4096):
            idx(f"{suffix} extended by {extra}", lambda p, x=suffix, e=extra: _append(p + x, b"\x07" * e))
        idx(f"{suffix} removed", lambda p, x=suffix: os.remove(p + x))
    return damages


def _arrow_damages(rng: random.Random, flips: int, data_size: int) -> list[Damage]:
    damages = []

    def add(name, apply, must_fail):
        damages.append(Damage(f"arrow/{name}", "arrow", apply, must_fail))

    def state(content):
        def apply(p):
            with open(os.path.join(p, "state.json"), "w") as f:
                f.write(content if isinstance(content, str) else json.dumps(content))
        return apply

    shard = "data-00000-of-00001.arrow"
    for name, content in (("_data_files []", {"_data_files": []}), ("no _data_files", {}),
                          ("filename 5", {"_data_files": [{"filename": 5}]}),
                          ("filename missing file", {"_data_files": [{"filename": "data-9.arrow"}]}),
                          ("filename outside", {"_data_files": [{"filename": "../" + shard}]}),
                          ("entry not a dict", {"_data_files": [shard]}), ("list", [1, 2]),
                          ("not JSON", "{\"_data_files\": ["), ("empty", ""), ("deep", "[" * 5000)):
        add(f"state.json {name}", state(content), True)
    data = lambda p: os.path.join(p, shard)  # noqa: E731
    for cut in sorted({0, 4, 8, 100, data_size // 3, data_size // 2, data_size - 9, data_size - 1}):
        add(f"data truncated to {cut}", lambda p, c=cut: os.truncate(data(p), c), True)
    # The 8-byte end-of-stream marker is optional in Arrow's stream format: without it the data is whole.
    add("end-of-stream marker cut off", lambda p: os.truncate(data(p), data_size - 8), None)
    for extra in (1, 8, 100):
        add(f"data extended by {extra}", lambda p, e=extra: _append(data(p), b"\x05" * e), True)
    for _ in range(flips):
        offset, mask = rng.randrange(0, min(data_size, 1024)), rng.randrange(1, 256)
        add(f"schema/metadata byte {offset} ^ {mask:#x}", lambda p, o=offset, m=mask: _xor_byte(data(p), o, m), None)
    for _ in range(flips):
        offset, mask = rng.randrange(0, data_size), rng.randrange(1, 256)
        add(f"data byte {offset} ^ {mask:#x}", lambda p, o=offset, m=mask: _xor_byte(data(p), o, m), None)
    add("data removed", lambda p: os.remove(data(p)), True)
    return damages


def _mindrecord_damages(rng: random.Random, flips: int) -> list[Damage]:
    damages = []
    size = os.path.getsize(GOLDEN_MINDRECORD)

    def add(name, apply, must_fail):
        damages.append(Damage(f"mindrecord/{name}", "mindrecord", apply, must_fail))

    def header(change):
        def apply(p):
            raw = open(p, "rb").read()
            (length,) = struct.unpack_from("<Q", raw)
            content = json.loads(raw[8 : 8 + length])
            change(content)
            encoded = json.dumps(content).encode()
            open(p, "wb").write(struct.pack("<Q", len(encoded)) + encoded + raw[8 + len(encoded) :])
        return apply

    for key, value in (("page_size", None), ("page_size", "abc"), ("page_size", 0), ("page_size", 2**40),
                       ("page_size", True), ("header_size", "65536"), ("header_size", 8),
                       ("shard_addresses", [5]), ("shard_addresses", []), ("shard_addresses", "x"),
                       ("shard_addresses", ["other.mindrecord"]), ("page", None), ("page", [1]),
                       ("schema", None), ("version", "9.9")):
        add(f"header {key} = {value!r}", header(lambda h, k=key, v=value: h.__setitem__(k, v)), True)
    add("header without page_size", header(lambda h: h.pop("page_size")), True)
    add("header first page rows 0..54", header(lambda h: h["page"][0].__setitem__("end_row_id", 54)), True)
    add("header page 1 used bytes - 1",
        header(lambda h: h["page"][1].__setitem__("page_size", h["page"][1]["page_size"] - 1)), True)
    add("header page id string", header(lambda h: h["page"][0].__setitem__("page_id", "0")), True)

    def sql(statement):
        def apply(p):
            with sqlite3.connect(p + ".db") as db:
                db.execute(statement)
            db.close()
        return apply

    for name, statement in (("delete 33 rows", "DELETE FROM INDEXES WHERE ROW_ID >= 199 AND ROW_ID < 232"),
                            ("delete the last row", "DELETE FROM INDEXES WHERE ROW_ID = 299"),
                            ("delete row 0", "DELETE FROM INDEXES WHERE ROW_ID = 0"),
                            ("move a row's offset", "UPDATE INDEXES SET PAGE_OFFSET_BLOB = 8 WHERE ROW_ID = 3"),
                            ("offset negative", "UPDATE INDEXES SET PAGE_OFFSET_BLOB = -100 WHERE ROW_ID = 3"),
                            ("end past the page", "UPDATE INDEXES SET PAGE_OFFSET_BLOB_END = 99999999 WHERE ROW_ID = 54"),
                            ("page id wrong", "UPDATE INDEXES SET PAGE_ID_BLOB = 1 WHERE ROW_ID = 0"),
                            ("page id huge", "UPDATE INDEXES SET PAGE_ID_BLOB = 9223372036854775807 WHERE ROW_ID = 0"),
                            ("row id gap", "UPDATE INDEXES SET ROW_ID = 1000 WHERE ROW_ID = 150"),
                            ("text offset", "UPDATE INDEXES SET PAGE_OFFSET_BLOB = 'abc' WHERE ROW_ID = 7"),
                            ("blob offset", "UPDATE INDEXES SET PAGE_OFFSET_BLOB_END = X'0102' WHERE ROW_ID = 7"),
                            ("float offset", "UPDATE INDEXES SET PAGE_OFFSET_BLOB = 1.5 WHERE ROW_ID = 7"),
                            ("drop INDEXES", "DROP TABLE INDEXES")):
        add(f".db {name}", sql(statement), True)
    add(".db removed", lambda p: os.remove(p + ".db"), True)
    add(".db garbage", lambda p: open(p + ".db", "wb").write(b"not sqlite" * 100), True)
    add(".db truncated", lambda p: os.truncate(p + ".db", 2048), True)
    for cut in sorted({0, 7, 100, 65536, 65536 + 1000, size // 2, size - 1}):
        add(f"data truncated to {cut}", lambda p, c=cut: os.truncate(p, c), True)
    for extra in (1, 4096):
        add(f"data extended by {extra}", lambda p, e=extra: _append(p, b"\x03" * e), True)
    add("header length huge", lambda p: _write_at(p, 0, struct.pack("<Q", 2**63)), True)
    add("header length short", lambda p: _write_at(p, 0, struct.pack("<Q", 100)), True)
    for _ in range(flips):  # inside the pages: framing, counts, width codes and token bytes
        offset, mask = rng.randrange(65536, size), rng.randrange(1, 256)
        add(f"page byte {offset} ^ {mask:#x}", lambda p, o=offset, m=mask: _xor_byte(p, o, m), None)
    for row in (0, 54, 55, 150, 299):  # a row's own length prefix, read from the .db
        def framing(p, r=row):
            with sqlite3.connect(p + ".db") as db:
                page, start = db.execute(
                    "SELECT PAGE_ID_BLOB, PAGE_OFFSET_BLOB FROM INDEXES WHERE ROW_ID = ?", (r,)).fetchone()
            db.close()
            _xor_byte(p, 65536 + page * 32768 + start, 0x01)
        add(f"row {row} length prefix ^ 1", framing, True)
    return damages


def all_damages(flips: int, arrow_size: int) -> list[Damage]:
    """Every damage of the campaign, in a fixed order (seeded)."""
    rng = random.Random(SEED)
    return _mmap_damages(rng, flips) + _arrow_damages(rng, flips, arrow_size) + _mindrecord_damages(rng, flips)


# ---------------------------------------------------------------------------------------- running them
class _Hang(Exception):
    pass


def _on_alarm(signum, frame):
    raise _Hang()


def _run(main: Callable[[list[str]], int], argv: list[str]) -> tuple[str, str]:
    """(kind, stderr) of one in-process command: kind is "ok", "error", "traceback" or "hang"."""
    err, out = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(RUN_SECONDS)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(argv)
    except _Hang:
        return "hang", err.getvalue()
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException as error:  # noqa: BLE001 - anything else escaping main is a traceback
        return "traceback", f"{type(error).__name__}: {error}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return ("ok" if code == 0 else "error"), err.getvalue()


def _commands(source: str, dataset: str, work: str) -> list[tuple[str, Callable, list[str], list[str]]]:
    """(name, main, argv, outputs it may write) of every command run on one damaged dataset."""
    from preprocess import convert_cli, merge_cli
    from trainer.cli import inspect as inspect_cli

    merged = os.path.join(work, "merged")
    suffix = {"mmap": "", "arrow": "_arrow", "mindrecord": ".mindrecord"}[source]
    target = "arrow" if source == "mmap" else "mmap"
    converted = os.path.join(work, "converted" + ("_arrow" if target == "arrow" else ""))
    return [
        ("inspect", inspect_cli.main, [dataset], []),
        ("inspect --validate", inspect_cli.main, [dataset, "--validate"], []),
        ("inspect --json", inspect_cli.main, [dataset, "--json"], []),
        ("merge", merge_cli.main, ["--inputs", dataset, "--output-prefix", merged], [merged + suffix]),
        ("convert", convert_cli.main, ["--from", source, "--to", target, dataset, converted], [converted]),
    ]


def _outputs_left(paths: list[str]) -> list[str]:
    return [p for path in paths for p in (path, path + ".bin", path + ".idx", path + ".db") if os.path.exists(p)]


def _clean_sources(root: str) -> dict[str, str]:
    """The clean datasets, one per format, under `root` (Arrow is made from the golden mmap pair)."""
    from indexed_dataset import convert

    os.makedirs(root, exist_ok=True)
    for ext in (".bin", ".idx"):
        shutil.copy(GOLDEN_MMAP + ext, os.path.join(root, "golden" + ext))
    for ext in ("", ".db"):
        shutil.copy(GOLDEN_MINDRECORD + ext, os.path.join(root, "tokens_1shard.mindrecord" + ext))
    convert(os.path.join(root, "golden"), os.path.join(root, "golden_arrow"), target_format="arrow")
    return {"mmap": os.path.join(root, "golden"), "arrow": os.path.join(root, "golden_arrow"),
            "mindrecord": os.path.join(root, "tokens_1shard.mindrecord")}


def _copy_source(source: str, clean: str, case_dir: str) -> str:
    os.makedirs(case_dir)
    if source == "arrow":
        shutil.copytree(clean, os.path.join(case_dir, os.path.basename(clean)))
    else:
        extensions = (".bin", ".idx") if source == "mmap" else ("", ".db")
        for ext in extensions:
            shutil.copy(clean + ext, os.path.join(case_dir, os.path.basename(clean) + ext))
    return os.path.join(case_dir, os.path.basename(clean))


def run_campaign(root: str, fast: bool) -> tuple[Counter, list[str]]:
    """Run every damage (every FAST_STRIDE-th with `fast`) through every command under `root`.

    Returns:
        (outcome counts over all runs, one line per run that went wrong).
    """
    sources = _clean_sources(os.path.join(root, "clean"))
    arrow_size = os.path.getsize(os.path.join(sources["arrow"], "data-00000-of-00001.arrow"))
    damages = all_damages(FLIPS_PER_REGION, arrow_size)
    if fast:
        damages = damages[::FAST_STRIDE]
    counts: Counter = Counter(damages=len(damages))
    failures = []
    for number, damage in enumerate(damages):
        case_dir = os.path.join(root, f"case{number:04d}")
        dataset = _copy_source(damage.source, sources[damage.source], case_dir)
        damage.apply(dataset)
        must_fail = damage.must_fail
        if damage.source == "mmap":
            must_fail = reference_problem(dataset) is not None
        for name, main, argv, outputs in _commands(damage.source, dataset, case_dir):
            kind, stderr = _run(main, argv)
            outcome = _judge(kind, stderr, must_fail, _outputs_left(outputs), case_dir)
            counts[outcome] += 1
            counts["runs"] += 1
            if outcome not in ("clean_error", "accepted"):
                failures.append(f"{outcome}: {damage.name}: {name}: {stderr.strip()[-300:]}")
            for path in outputs:  # the next command starts from a clean work folder
                for left in _outputs_left([path]):
                    shutil.rmtree(left) if os.path.isdir(left) else os.remove(left)
        shutil.rmtree(case_dir, ignore_errors=True)
    return counts, failures


def _judge(kind: str, stderr: str, must_fail: bool | None, left: list[str], case_dir: str) -> str:
    """One run's outcome (see `OUTCOMES`): an error must be one `prog: error:` line naming a file of the
    damaged dataset (the only files under `case_dir`), and leave no output."""
    if kind in ("traceback", "hang"):
        return kind
    if kind == "ok":
        return "silent_success" if must_fail else "accepted"
    errors = [line for line in stderr.splitlines() if ": error: " in line]
    if len(errors) != 1 or "Traceback" in stderr:
        return "messy_error"
    if case_dir not in errors[0]:
        return "unnamed_error"
    return "leftover" if left else "clean_error"


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        counts, failures = run_campaign(directory, fast="--fast" in sys.argv)
    for line in failures:
        print(line)
    print(", ".join(f"{key} {counts[key]}" for key in ("damages", "runs", *OUTCOMES)))

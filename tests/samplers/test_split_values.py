"""``build-indices`` and ``inspect-index`` refuse values they would otherwise ignore, in one line naming the flag.

What is promised (issues 26 and 34):

- A ``--split`` is numbers and separators only: ``1,2,x`` is not silently ``1,2``, and ``inf`` or ``nan`` are not
  numbers (``inf,1,1`` would silently be ``1,1``).
- A sample count for a split the ``--split`` leaves empty (``--split 100,0,0 --test-samples 5``) is refused, naming
  the split and the count.
- ``inspect-index --show -5`` and ``--samples`` ids that no split has are refused, as is a negative ``--seed``.

Each case is the command as a user types it; nothing is built when it is refused.
"""

from __future__ import annotations

import pytest
from cli_testing import refused

from samplers.cli import main as build_indices
from samplers.errors import SplitFormatError
from samplers.splits import parse_split
from trainer.cli.inspect import main as inspect_index

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("split", ["1,2,x", "inf,1,1", "1,nan,1", "1e3,1,1", "90,10,abc", "x"])
def test_a_split_that_is_not_numbers_is_refused(split):
    with pytest.raises(SplitFormatError):
        parse_split(split)


@pytest.mark.parametrize("split", ["949,50,1", "99/1", "1", "98, 1, 1", "0.5,0.5"])
def test_megatron_split_strings_still_parse(split):
    assert abs(sum(parse_split(split)) - 1.0) < 1e-12


@pytest.fixture()
def base_argv(golden, tmp_path) -> list[str]:
    return ["--data-path", str(golden / "sample_en_eod_text_document"), "--seq-length", "64",
            "--data-cache-path", str(tmp_path / "cache")]


@pytest.mark.parametrize(("flags", "named"), [
    (["--split", "1,2,x"], "'x'"),
    (["--split", "inf,1,1"], "inf"),
    (["--split", "100,0,0", "--test-samples", "5"], "5 test samples"),
    (["--split", "100,0,0", "--valid-samples", "5"], "5 valid samples"),
    (["--split", "0,100,0", "--train-samples", "5"], "5 train samples"),
    (["--seed", "-1"], "--seed"),
    (["--train-samples", "-5"], "--train-samples"),
])
def test_build_indices_refuses_values_it_would_ignore(base_argv, tmp_path, flags, named, capsys):
    line = refused(build_indices, base_argv + flags, capsys, "build-indices")
    assert named in line
    assert not (tmp_path / "cache").exists()


@pytest.fixture()
def dataset(golden) -> str:
    return str(golden / "sample_en_eod_text_document")


@pytest.mark.parametrize(("flags", "named"), [
    (["--show", "-5"], "--show"),
    (["--seq-length", "64", "--samples", "999999"], "--samples"),
    (["--seq-length", "64", "--samples", "0,-999999"], "--samples"),
    (["--seq-length", "64", "--seed", "-1"], "--seed"),
    (["--seq-length", "64", "--split", "1,2,x"], "'x'"),
    (["--seq-length", "64", "--split", "100,0,0", "--test-samples", "5"], "5 test samples"),
    (["--seq-length", "64", "--model", "bert", "--mask-prob", "nan"], "--mask-prob"),
])
def test_inspect_index_refuses_values_it_would_ignore(dataset, tmp_path, flags, named, capsys):
    line = refused(inspect_index, [dataset, "--data-cache-path", str(tmp_path / "cache")] + flags, capsys,
                   "inspect-index")
    assert named in line


def test_inspect_index_shows_a_sample_id_that_one_split_has(dataset, tmp_path, capsys):
    """Ids outside *some* splits stay as they were (shown where they exist); only ids no split has are refused."""
    assert inspect_index([dataset, "--seq-length", "64", "--samples", "0,-1", "--data-cache-path",
                          str(tmp_path / "cache")]) == 0

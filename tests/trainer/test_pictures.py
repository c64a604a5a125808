"""Pictures and TensorBoard: `plot-metrics`, `inspect-index --plot`, and `train --tensorboard-dir`.

- Every picture is drawn from the shipped data (a tiny `train` run on the golden sample documents, and the
  golden token file itself) and is a valid PNG of sensible size, or an SVG that parses as XML.
- The panels follow the records: a key no run has gives no panel, an unknown numeric key (a later MoE
  aux loss, an expert-load list) gives one of its own.
- `metrics.jsonl` carries the consumed tokens, and TensorBoard holds the same series as the file.
- Bad input is one line and a non-zero exit: no matplotlib, a damaged metrics line, a wrong suffix.
"""

from __future__ import annotations

import json
import struct
import sys
import xml.etree.ElementTree as ElementTree

import pytest
from trainer_testing import argv_for, tiny_config

from trainer.cli.train import main as train_main
from trainer.cli.inspect import main as inspect_main
from trainer.metrics.inspect_plot import split_layouts
from trainer.metrics.records import MetricsRun, consumed_tokens, read_run
from trainer.cli.plot import main as plot_main
from trainer.metrics.plot import panels_for

pytest.importorskip("matplotlib", reason="pictures need matplotlib (the test extra installs it)")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# A picture smaller than this is not a readable chart; larger is not a README picture.
MIN_PIXELS, MAX_PIXELS = 400, 4000
MAX_PNG_BYTES = 2_000_000
TINY_SEQ_LENGTH = 32  # tiny_config's --seq-length
STEPS = 10


def png_size(path) -> tuple[int, int]:
    """(width, height) of a PNG, from its IHDR chunk (PIL's reading is checked too when installed)."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    try:
        from PIL import Image
    except ImportError:
        return width, height
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.size == (width, height)
    return width, height


def assert_sensible_png(path) -> None:
    width, height = png_size(path)
    assert MIN_PIXELS <= width <= MAX_PIXELS and MIN_PIXELS <= height <= MAX_PIXELS, (width, height)
    assert path.stat().st_size < MAX_PNG_BYTES


def assert_svg(path) -> None:
    root = ElementTree.parse(path).getroot()
    assert root.tag.endswith("svg")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_prefix, cache_dir):
    """A 10-step run with evaluations: its folder holds metrics.jsonl (and TensorBoard events when
    tensorboard is installed)."""
    directory = tmp_path_factory.mktemp("pictures_run")
    config = tiny_config(tiny_prefix, cache_dir, eval_iters=1, metrics_file=str(directory / "metrics.jsonl"))
    argv = argv_for(config) + ["--log-interval", "1", "--eval-interval", "5"]
    try:
        import tensorboard  # noqa: F401
        argv += ["--tensorboard-dir", str(directory / "tensorboard")]
    except ImportError:
        pass
    assert train_main(argv) == 0
    return directory


def test_metrics_records_carry_the_consumed_tokens(tiny_run):
    run = read_run(tiny_run)
    assert [record["iteration"] for record in run.train] == list(range(1, STEPS + 1))
    for record in run.train:
        assert record["consumed_tokens"] == record["consumed_samples"] * TINY_SEQ_LENGTH
        # Files written before the key existed: the same number, derived from the other fields.
        assert consumed_tokens({k: v for k, v in record.items() if k != "consumed_tokens"}) == record["consumed_tokens"]
    assert [(r["iteration"], r["split"]) for r in run.evaluations] == [(5, "valid"), (10, "valid"), (10, "test")]


def test_plot_metrics_draws_a_png_and_an_svg_of_several_runs(tiny_run, tmp_path):
    png, svg = tmp_path / "pictures" / "loss.png", tmp_path / "loss.svg"
    assert plot_main([str(tiny_run), str(tiny_run / "metrics.jsonl"), "--labels", "a", "b", "--out", str(png)]) == 0
    assert_sensible_png(png)
    assert plot_main([str(tiny_run), "--x", "tokens", "--out", str(svg)]) == 0
    assert_svg(svg)
    assert sorted(path.name for path in tmp_path.rglob("*")) == ["loss.png", "loss.svg", "pictures"]  # no temporaries


def test_the_panels_follow_the_records(tiny_run):
    run = read_run(tiny_run)
    keys = [panel.key for panel in panels_for([run])]
    # An fp32 CPU run: no MFU (the device's peak is unknown), so TFLOP/s instead; no MoE panels; no loss-scale
    # panel (a flat 1.0, nothing skipped: see tests/trainer/test_new_user_evaluation.py).
    assert keys == ["loss", "perplexity", "lr", "grad_norm", "tokens_per_second", "tflops_per_device"]
    moe = MetricsRun(name="moe", path=run.path, evaluations=run.evaluations,
                     train=[{**record, "mfu": 0.4, "moe_aux_loss": 0.01, "expert_load": [0.5, 0.25, 0.25],
                             "router_z_loss": 0.002} for record in run.train])
    keys = [panel.key for panel in panels_for([run, moe])]
    assert keys[-4:] == ["mfu", "moe_aux_loss", "expert_load", "router_z_loss"]
    assert "tflops_per_device" not in keys


def test_moe_panels_are_drawn(tiny_run, tmp_path):
    records = [json.loads(line) for line in (tiny_run / "metrics.jsonl").read_text().splitlines()]
    for record in records:
        if "split" not in record:
            record.update(moe_aux_loss=0.01 * record["iteration"], expert_load=[0.5, 0.3, 0.2])
    moe = tmp_path / "moe.jsonl"
    moe.write_text("".join(json.dumps(record) + "\n" for record in records))
    out = tmp_path / "moe.png"
    assert plot_main([str(moe), str(tiny_run), "--out", str(out)]) == 0
    assert_sensible_png(out)


def test_bad_inputs_are_one_line(tiny_run, tmp_path, capsys):
    damaged = tmp_path / "metrics.jsonl"
    damaged.write_text((tiny_run / "metrics.jsonl").read_text() + "{not json\n")
    lines = (tiny_run / "metrics.jsonl").read_text().count("\n")
    cases = [
        ([str(damaged)], f"{damaged}:{lines + 1}: not JSON"),
        ([str(tmp_path / "missing")], "no such metrics file"),
        ([str(tiny_run), "--out", str(tmp_path / "loss.jpg")], "must end in .png or .svg"),
        ([str(tiny_run), str(tiny_run), "--labels", "one"], "--labels names 1 runs, but 2 were given"),
    ]
    for argv, message in cases:
        assert plot_main(argv) != 0
        err = capsys.readouterr().err.strip()
        assert err.startswith("plot-metrics: error: ") and message in err and "\n" not in err, err
    assert not (tmp_path / "loss.jpg").exists()


def test_without_matplotlib_one_line_says_how_to_install_it(tiny_run, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    assert plot_main([str(tiny_run), "--out", str(tmp_path / "loss.png")]) == 1
    err = capsys.readouterr().err.strip()
    assert err == ("plot-metrics: error: drawing pictures needs matplotlib: pip install 'tokenmill[plot]' "
                   "(or: pip install matplotlib)")
    assert list(tmp_path.iterdir()) == []


def test_tensorboard_holds_the_series_of_metrics_jsonl(tiny_run):
    pytest.importorskip("tensorboard", reason="tensorboard is optional (pip install tensorboard)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tiny_run / "tensorboard"))
    events.Reload()
    logged = {tag: [(event.step, event.value) for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    expected: dict[str, list] = {}
    run = read_run(tiny_run)
    for section, records in [("train", run.train)] + [(r["split"], [r]) for r in run.evaluations]:
        for record in records:
            for key, value in record.items():
                if key not in ("iteration", "split") and isinstance(value, (int, float)):
                    expected.setdefault(f"{section}/{key}", []).append((record["iteration"], value))
    assert set(logged) == set(expected)
    for tag in ("train/skipped_iterations", "train/consumed_tokens", "valid/perplexity", "test/loss"):
        assert tag in logged
    for tag, points in expected.items():
        assert [step for step, _ in logged[tag]] == [step for step, _ in points], tag
        assert [value for _, value in logged[tag]] == pytest.approx([value for _, value in points], rel=1e-6), tag


def test_inspect_index_plots_the_histograms_and_the_training_layout(golden, tmp_path):
    prefix = str(golden / "sample_en_eod_text_document")
    histograms = tmp_path / "data.png"
    assert inspect_main([prefix, "--plot", str(histograms)]) == 0
    assert_sensible_png(histograms)
    layout = tmp_path / "layout.svg"
    assert inspect_main([prefix, "--seq-length", "64", "--split", "90,5,5", "--train-samples", "10000",
                         "--data-cache-path", str(tmp_path / "cache"), "--plot", str(layout)]) == 0
    assert_svg(layout)
    blend = tmp_path / "blend.png"
    assert inspect_main(["--data-path", "0.3", prefix, "0.7", prefix, "--seq-length", "64", "--split", "90,5,5",
                         "--num-samples", "1000", "100", "10", "--data-cache-path", str(tmp_path / "cache"),
                         "--plot", str(blend)]) == 0
    assert_sensible_png(blend)


def test_the_split_layout_reads_the_epochs_of_the_view():
    """Megatron's rule read back: E epochs of T tokens give (E*T - 1) // L samples; the first E - 1 come
    first, and training takes only what it asks of the last epoch."""
    gpt = {"split": "train", "sequence_range": [0, 209], "num_tokens_per_epoch": 253460, "num_epochs": 3,
           "separate_final_epoch": True, "num_samples": 11880}
    t5 = {"split": "valid", "document_range": [209, 220], "num_samples": 57}
    train, valid = split_layouts([gpt, t5, None], 64, "corpus", wanted=(10000, None, None))
    assert (train.num_samples, train.num_indexed, train.samples_shuffled_apart) == (10000, 11880, 10000 - 7920)
    assert train.final_epoch_fraction == pytest.approx(2080 / 3960)
    assert (valid.unit, valid.unit_range, valid.num_samples, valid.num_epochs) == ("documents", (209, 220), 57, None)


def test_inspect_index_without_matplotlib_is_one_line(golden, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert inspect_main([str(golden / "sample_en_eod_text_document"), "--plot", str(tmp_path / "x.png")]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("inspect-index: error: drawing pictures needs matplotlib: pip install")

"""`inspect_splits` reports epochs, sample counts and the tokens of chosen samples."""

from __future__ import annotations

from samplers.gpt.inspect import inspect_splits


def test_one_epoch_report_matches_megatron(golden, manifest, tmp_path):
    case = manifest["single_one_epoch"]
    report = inspect_splits(str(golden / "sample_en_noeod_text_document"), sequence_length=64, split="90,10,0",
                            seed=7, sample_ids=(0, 1, -1, 10**9), path_to_cache=str(tmp_path))
    train, valid, test = report
    assert test is None
    assert (train.num_samples, valid.num_samples) == (3957, 277)
    assert train.num_epochs == 1 and not train.separate_final_epoch
    assert train.sequence_range == (0, 209) and valid.sequence_range == (209, 232)
    tokens = case["first_16_tokens_of_samples"]
    assert train.samples[0][:16].tolist() == tokens["split0[0]"]
    assert train.samples[-1][:16].tolist() == tokens["split0[3956]"]
    assert valid.samples[1][:16].tolist() == tokens["split1[1]"]
    assert 10**9 not in train.samples
    assert len(train.samples[0]) == 65


def test_requested_sizes_set_the_epochs(golden, tmp_path):
    train = inspect_splits(str(golden / "sample_en_eod_text_document"), 128, "90,8,2", 1234,
                           sizes=(4000, 200, 20), path_to_cache=str(tmp_path))[0]
    assert (train.num_epochs, train.separate_final_epoch, train.num_samples) == (3, True, 5940)

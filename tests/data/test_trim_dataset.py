"""TrimDataset (issue 13): the fields shrink in place to the largest
multiple of multiple_of top-level records; nested fields keep exactly the
rows of the kept records (computed by hand from the lengths)."""

import numpy as np
import pytest

from ferrocaffe import core, errors, workspace

FIELDS = ["a", "b:lengths", "b:values:c", "b:values:d:lengths", "b:values:d:values"]


def feed_nested():
    # 5 records; record r has lengths[r] "b" entries; each "b" entry has
    # inner lengths of values.
    workspace.FeedBlob("a", np.arange(5, dtype=np.int64))
    workspace.FeedBlob("bl", np.array([2, 0, 1, 3, 1], np.int32))
    workspace.FeedBlob("bv", np.arange(7, dtype=np.float32))
    workspace.FeedBlob("bvl", np.array([1, 2, 0, 1, 1, 2, 1], np.int32))
    workspace.FeedBlob("bvv", np.arange(8, dtype=np.int32) * 10)
    return ["a", "bl", "bv", "bvl", "bvv"]


def test_trims_nested_fields_to_whole_records(fresh):
    blobs = feed_nested()
    workspace.RunOperatorOnce(core.CreateOperator(
        "TrimDataset", blobs, blobs, fields=FIELDS, multiple_of=2))
    # 4 records kept: b entries 2+0+1+3 = 6, their values 1+2+0+1+1+2 = 7.
    assert workspace.FetchBlob("a").tolist() == [0, 1, 2, 3]
    assert workspace.FetchBlob("bl").tolist() == [2, 0, 1, 3]
    assert workspace.FetchBlob("bv").tolist() == [0, 1, 2, 3, 4, 5]
    assert workspace.FetchBlob("bvl").tolist() == [1, 2, 0, 1, 1, 2]
    assert workspace.FetchBlob("bvv").tolist() == [0, 10, 20, 30, 40, 50, 60]


def test_a_multiple_already_is_left_alone_and_the_dataset_helper_uses_it(fresh):
    blobs = feed_nested()
    workspace.RunOperatorOnce(core.CreateOperator(
        "TrimDataset", blobs, blobs, fields=FIELDS, multiple_of=5))
    assert workspace.FetchBlob("bvv").tolist() == list(range(0, 80, 10))
    workspace.RunOperatorOnce(core.CreateOperator(
        "TrimDataset", blobs, blobs, fields=FIELDS, multiple_of=3))
    assert workspace.FetchBlob("a").tolist() == [0, 1, 2]
    assert workspace.FetchBlob("bv").tolist() == [0, 1, 2]
    workspace.RunOperatorOnce(core.CreateOperator(
        "TrimDataset", blobs, blobs, fields=FIELDS, multiple_of=4))
    assert workspace.FetchBlob("a").tolist() == []
    assert workspace.FetchBlob("bvv").tolist() == []


def test_bad_definitions(fresh):
    blobs = feed_nested()
    with pytest.raises(errors.InvalidArgumentError, match="multiple_of"):
        workspace.RunOperatorOnce(core.CreateOperator("TrimDataset", blobs, blobs, fields=FIELDS))
    with pytest.raises(errors.InvalidArgumentError):
        workspace.RunOperatorOnce(core.CreateOperator(
            "TrimDataset", blobs, blobs, fields=FIELDS, multiple_of=0))
    with pytest.raises(errors.InvalidArgumentError):
        workspace.RunOperatorOnce(core.CreateOperator(
            "TrimDataset", blobs, blobs[::-1], fields=FIELDS, multiple_of=2))

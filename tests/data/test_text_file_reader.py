"""TextFileReader (issue 13): tab-separated rows read in batches over
several passes, strings and numbers; bad files and rows are typed errors
naming the file."""

import numpy as np
import pytest

import ferrocaffe
from ferrocaffe import core, errors, workspace
from ferrocaffe.schema import FetchRecord, Scalar, Struct
from ferrocaffe.text_file_reader import TextFileReader

COLS = [["a1", "b1", "c\tx", "d1"], ["k", "l", "m", "n"], [0.5, -1.25, 3.0, 1e3]]


def write(tmp_path):
    path = tmp_path / "rows.txt"
    lines = ["\t".join([COLS[0][i].replace("\t", "\\\t"), COLS[1][i], repr(COLS[2][i])])
             for i in range(4)]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def schema():
    return Struct(("f1", Scalar(dtype=str)), ("f2", Scalar(dtype=str)),
                  ("f3", Scalar(dtype=np.float32)))


@pytest.mark.parametrize("num_passes,batch_size", [(1, 1), (1, 3), (2, 3), (2, 5), (3, 4)])
def test_reads_every_row_each_pass(fresh, tmp_path, num_passes, batch_size):
    path = write(tmp_path)
    init = core.Net("init")
    reader = TextFileReader(init, filename=path, schema=schema(),
                            batch_size=batch_size, num_passes=num_passes)
    workspace.RunNetOnce(init)
    net = core.Net("read")
    should_stop, record = reader.read_record(net)
    got = [[], [], []]
    sizes = []
    while True:
        workspace.RunNetOnce(net)
        arrays = FetchRecord(record).field_blobs()
        sizes.append(len(arrays[0]))
        for i in range(3):
            got[i].extend(arrays[i].tolist())
        if workspace.FetchBlob(should_stop):
            break
    total = 4 * num_passes
    assert sizes == [batch_size] * (total // batch_size) + ([total % batch_size] if total % batch_size else []) + [0]
    assert got[0] == COLS[0] * num_passes
    assert got[1] == COLS[1] * num_passes
    np.testing.assert_allclose(got[2], np.tile(np.float32(COLS[2]), num_passes))


def test_the_alias_imports_it():
    ferrocaffe.register_caffe2_alias()
    from caffe2.python import text_file_reader
    assert text_file_reader.TextFileReader is TextFileReader


def test_bad_files_and_rows(fresh, tmp_path):
    init = core.Net("init")
    TextFileReader(init, filename=str(tmp_path / "missing.txt"), schema=schema())
    with pytest.raises(errors.FerrocaffeIOError, match="missing.txt"):
        workspace.RunNetOnce(init)
    short = tmp_path / "short.txt"
    short.write_text("a\tb\n")
    init = core.Net("init2")
    TextFileReader(init, filename=str(short), schema=schema())
    with pytest.raises(errors.InvalidArgumentError, match="short.txt"):
        workspace.RunNetOnce(init)
    words = tmp_path / "words.txt"
    words.write_text("a\tb\tnot-a-number\n")
    init = core.Net("init3")
    reader = TextFileReader(init, filename=str(words), schema=schema())
    workspace.RunNetOnce(init)
    net = core.Net("read3")
    reader.read_record(net)
    with pytest.raises(errors.InvalidArgumentError, match="not-a-number"):
        workspace.RunNetOnce(net)
    with pytest.raises(TypeError):
        TextFileReader(core.Net("x"), filename=str(words), schema=Scalar(dtype=str))

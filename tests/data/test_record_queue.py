"""Tests of ferrocaffe.record_queue (Caffe2's RecordQueue): every record a
reader yields goes through the producers, the queue and the queue's reader
exactly once, at any producer thread count."""

import numpy as np
import pytest

from ferrocaffe import core, workspace
from ferrocaffe.dataset import Dataset
from ferrocaffe.record_queue import RecordQueue
from ferrocaffe.schema import FeedRecord, NewRecord, Scalar, Struct


def doubled_named(net, record):
    # Every producer names its output alike.
    with core.NameScope('doubled'):
        out = NewRecord(net, record)
    net.Add([record.uid(), record.uid()], [out.uid()])
    return out


@pytest.mark.parametrize('threads', [1, 2, 4])
@pytest.mark.parametrize('process', [None, doubled_named])
def test_records_pass_through_the_queue_exactly_once(fresh, threads, process):
    n = 200
    values = Struct(('uid', np.arange(n, dtype=np.int64)))
    init = core.Net('src_init')
    with core.NameScope('src'):
        src_blobs = NewRecord(init, values)
    FeedRecord(src_blobs, values)
    src = Dataset(src_blobs)
    src_reader = src.reader(init_net=init)
    dst = Dataset(Struct(('uid', Scalar(np.int64))), name='dst')
    dst_init = core.Net('dst_init')
    dst.init_empty(dst_init)
    writer = dst.writer()
    writer.setup_ex(dst_init, core.Net('unused_exit'))
    workspace.RunNetOnce(init)
    workspace.RunNetOnce(dst_init)

    rq = RecordQueue(['uid'], capacity=7, num_threads=threads)
    reader, producer_step, exit_step, schema = rq.build(src_reader, process)
    assert schema.field_names() == ['uid']

    read_nets, status, record = reader.read_record_ex(core.Net('ci'),
                                                      core.Net('ce'))
    write_net = core.Net('consume_write')
    writer.write(write_net, record.field_blobs())
    consumer = core.execution_step('consumer', list(read_nets) + [write_net],
                                   should_stop_blob=status)
    everything = core.execution_step('all', [
        core.execution_step('produce', [producer_step, exit_step]),
        consumer], concurrent_substeps=True)
    workspace.RunPlan(core.Plan(everything))
    got = workspace.FetchBlob(str(dst.get_blobs()[0]))
    factor = 2 if process else 1
    assert sorted(got.tolist()) == [factor * i for i in range(n)]


def test_fields_must_be_a_struct_or_names(fresh):
    with pytest.raises(TypeError):
        RecordQueue('uid')

"""Rebatching queues (issue 13): CreateRebatchingQueue,
EnqueueRebatchingQueue (one element, or one per row with enqueue_batch),
DequeueRebatchingQueue (num_elements stacked along a new first dim),
CloseRebatchingQueue; Caffe2's close semantics; producers and consumers of
different batch sizes on threads pass every row exactly once."""

import numpy as np
import pytest

from ferrocaffe import core, errors, workspace


def test_single_elements_come_out_one_at_a_time(fresh):
    net = core.Net("net")
    q = net.CreateRebatchingQueue([], 1, capacity=10, num_blobs=1)
    for v in (1.0, 2.0, 3.0):
        t = net.ConstantFill([], 1, shape=[2], value=v)
        net.EnqueueRebatchingQueue([q, t], [])
    outs = [net.DequeueRebatchingQueue([q], 1) for _ in range(3)]
    workspace.RunNetOnce(net)
    for out, v in zip(outs, (1.0, 2.0, 3.0)):
        got = workspace.FetchBlob(out)
        assert got.shape == (1, 2) and got.tolist() == [[v, v]]


def test_a_batch_is_split_into_rows_and_rebatched(fresh):
    workspace.FeedBlob("x", np.arange(10, dtype=np.int32))
    workspace.FeedBlob("y", np.arange(20, dtype=np.float64).reshape(10, 2))
    net = core.Net("net")
    q = net.CreateRebatchingQueue([], 1, capacity=10, num_blobs=2)
    net.EnqueueRebatchingQueue([q, "x", "y"], [], enqueue_batch=True)
    a = net.DequeueRebatchingQueue([q], 2, num_elements=3)
    b = net.DequeueRebatchingQueue([q], 2, num_elements=7)
    workspace.RunNetOnce(net)
    assert workspace.FetchBlob(a[0]).tolist() == [0, 1, 2]
    np.testing.assert_array_equal(workspace.FetchBlob(a[1]), np.arange(6.0).reshape(3, 2))
    assert workspace.FetchBlob(b[0]).tolist() == list(range(3, 10))
    assert workspace.FetchBlob(b[0]).dtype == np.int32


def test_closing_drains_then_fails(fresh):
    workspace.FeedBlob("x", np.arange(7, dtype=np.int64))
    net = core.Net("net")
    q = net.CreateRebatchingQueue([], 1, capacity=10, num_blobs=1)
    net.EnqueueRebatchingQueue([q, "x"], [], enqueue_batch=True)
    net.CloseRebatchingQueue([q], [])
    a = net.DequeueRebatchingQueue([q], 1, num_elements=5)
    b = net.DequeueRebatchingQueue([q], 1, num_elements=5)  # the last 2
    workspace.RunNetOnce(net)
    assert workspace.FetchBlob(a).tolist() == [0, 1, 2, 3, 4]
    assert workspace.FetchBlob(b).tolist() == [5, 6]
    more = core.Net("more")
    more.EnqueueRebatchingQueue([q, "x"], [], enqueue_batch=True)
    with pytest.raises(RuntimeError):
        workspace.RunNetOnce(more)
    empty = core.Net("empty")
    empty.DequeueRebatchingQueue([q], 1)
    with pytest.raises(RuntimeError):
        workspace.RunNetOnce(empty)


def test_producers_and_consumers_on_threads_pass_every_row_once(fresh):
    producers, per_producer, batch = 3, 6, 4
    init = core.Net("init")
    q = init.CreateRebatchingQueue([], 1, capacity=5, num_blobs=1)
    workspace.RunNetOnce(init)
    prod_steps = []
    for i in range(producers):
        name = "p%d" % i
        workspace.FeedBlob(name, np.arange(i * 100, i * 100 + 3, dtype=np.int32))
        net = core.Net("prod_%d" % i)
        net.EnqueueRebatchingQueue([q, name], [], enqueue_batch=True)
        prod_steps.append(core.execution_step("ps%d" % i, net, num_iter=per_producer))
    total = producers * per_producer * 3
    consume = core.Net("consume")
    out = consume.DequeueRebatchingQueue([q], 1, num_elements=batch)
    workspace.FeedBlob("acc", np.zeros(0, np.int32))
    consume.Concat(["acc", out], ["acc_next", "_info"], axis=0)
    consume.Copy(["acc_next"], ["acc"])
    close = core.Net("close")
    close.CloseRebatchingQueue([q], [])
    plan = core.Plan("p")
    plan.AddStep(core.execution_step("all", [
        core.execution_step("producers", [
            core.execution_step("prod", prod_steps, concurrent_substeps=True),
            core.execution_step("close", close),
        ]),
        core.execution_step("consumer", consume, num_iter=(total + batch - 1) // batch),
    ], concurrent_substeps=True))
    workspace.RunPlan(plan)
    got = sorted(workspace.FetchBlob("acc").tolist())
    want = sorted(v for i in range(producers) for _ in range(per_producer)
                  for v in range(i * 100, i * 100 + 3))
    assert got == want


def test_errors_are_typed_and_name_the_queue(fresh):
    with pytest.raises(errors.InvalidArgumentError, match="capacity"):
        workspace.RunOperatorOnce(core.CreateOperator("CreateRebatchingQueue", [], ["q"], capacity=0))
    workspace.RunOperatorOnce(core.CreateOperator("CreateRebatchingQueue", [], ["q"], num_blobs=2, capacity=4))
    workspace.FeedBlob("x", np.zeros((2, 3), np.float32))
    workspace.FeedBlob("y", np.zeros((3,), np.float32))
    with pytest.raises(errors.InvalidArgumentError) as e:
        workspace.RunOperatorOnce(core.CreateOperator("EnqueueRebatchingQueue", ["q", "x"], []))
    assert e.value.blob == "q"
    with pytest.raises(errors.ShapeError):
        workspace.RunOperatorOnce(core.CreateOperator(
            "EnqueueRebatchingQueue", ["q", "x", "y"], [], enqueue_batch=True))
    workspace.FeedBlob("s", np.float32(1.0))
    with pytest.raises(errors.ShapeError):
        workspace.RunOperatorOnce(core.CreateOperator(
            "EnqueueRebatchingQueue", ["q", "s", "s"], [], enqueue_batch=True))
    # Elements of different shapes cannot be stacked together.
    workspace.RunOperatorOnce(core.CreateOperator("EnqueueRebatchingQueue", ["q", "x", "x"], []))
    workspace.RunOperatorOnce(core.CreateOperator("EnqueueRebatchingQueue", ["q", "y", "y"], []))
    with pytest.raises(errors.ShapeError) as e:
        workspace.RunOperatorOnce(core.CreateOperator(
            "DequeueRebatchingQueue", ["q"], ["a", "b"], num_elements=2))
    assert e.value.blob == "q"
    with pytest.raises(errors.DataTypeError):
        workspace.RunOperatorOnce(core.CreateOperator("CloseRebatchingQueue", ["x"], []))

"""Names and behaviour Caffe2 programs and tests rely on at the module level:
process set-up, CPU-only build flags, engine preferences, the current
workspace, nets as objects, and running serialised nets."""

import numpy as np
import pytest

from ferrocaffe import core, errors, utils, workspace
from ferrocaffe import proto as caffe2_pb2


def test_a_cpu_only_build_says_so():
    assert workspace.has_gpu_support is False
    assert workspace.has_cuda_support is False
    assert workspace.has_hip_support is False
    assert workspace.is_asan is False
    assert workspace.has_fbgemm is False and workspace.C.has_fbgemm is False
    assert workspace.GpuDeviceType == caffe2_pb2.CUDA
    assert workspace.NumGpuDevices() == 0 and workspace.NumCudaDevices() == 0
    assert workspace.C.has_mkldnn is False and workspace.C.use_mkldnn is False
    assert core.workspace is workspace and core.utils is utils


def test_global_init_records_flags_and_refuses_other_words():
    before = workspace.GetGlobalInitArgs()
    assert workspace.GlobalInit(['prog', '--caffe2_log_level=0', '--caffe2_omp']) is True
    assert workspace.GetGlobalInitArgs() == before + ['--caffe2_log_level=0', '--caffe2_omp']
    assert core.GetGlobalInitArgs() == workspace.GetGlobalInitArgs()
    with pytest.raises(errors.InvalidArgumentError, match='stray'):
        core.GlobalInit(['prog', 'stray'])
    with pytest.raises(TypeError):
        workspace.GlobalInit('--caffe2_log_level=0')
    assert workspace.GetGlobalInitArgs() == before + ['--caffe2_log_level=0', '--caffe2_omp']


def test_engine_preferences_are_checked_and_change_nothing(fresh):
    core.SetEnginePref({caffe2_pb2.CPU: {'Add': ['FAST']}}, {caffe2_pb2.CPU: ['EIGEN']})
    core.SetOpEnginePref('Mul', {caffe2_pb2.CPU: ['FAST']})
    core.SetGlobalEnginePref({})
    with pytest.raises(TypeError):
        core.SetGlobalEnginePref({caffe2_pb2.CPU: 'EIGEN'})
    net = core.Net('prefs')
    net.ConstantFill([], ['x'], shape=[2], value=3.0)
    net.Add(['x', 'x'], ['y'])
    workspace.RunNetOnce(net)
    assert workspace.FetchBlob('y').tolist() == [6.0, 6.0]


def test_running_a_serialised_net_whose_bytes_are_not_text(fresh):
    net = core.Net('bytes_net')
    # 1.5 as a float is 00 00 c0 3f: not UTF-8.
    net.ConstantFill([], ['x'], shape=[3], value=1.5)
    data = net.Proto().SerializeToString()
    with pytest.raises(UnicodeDecodeError):
        data.decode('utf-8')
    assert workspace.RunNetOnce(data) is True
    assert workspace.FetchBlob('x').tolist() == [1.5, 1.5, 1.5]
    assert workspace.CreateNet(data) is True
    assert workspace.Nets() == ['bytes_net']
    assert workspace.GetNetName(data) == 'bytes_net'


def test_current_workspace_on_the_class_and_on_instances(fresh):
    current = workspace.C.Workspace.current
    assert current is workspace.current_workspace()
    assert workspace.Workspace().current is current
    current.feed_blob('seen', np.int64(4))
    assert workspace.FetchBlob('seen') == 4


def test_nets_are_objects_in_a_dict():
    ws = workspace.Workspace()
    ws.feed_blob('n', np.zeros(1, np.int64))
    net = core.Net('counting')
    net.ConstantFill([], ['one'], shape=[1], value=1, dtype=core.DataType.INT64)
    net.Add(['n', 'one'], ['n'])
    made = ws.create_net(net)
    assert isinstance(ws.nets, dict) and list(ws.nets) == ['counting']
    assert made == ws.nets['counting'] and made.name == 'counting'
    assert made.run() is True
    ws.nets['counting'].run()
    assert ws.fetch_blob('n').tolist() == [2]


def test_module_level_blobs_feed_and_fetch(fresh):
    workspace.blobs['a'] = np.arange(3, dtype=np.int32)
    assert 'a' in workspace.blobs and 'b' not in workspace.blobs
    assert workspace.blobs['a'].tolist() == [0, 1, 2]
    assert list(workspace.blobs) == ['a'] and len(workspace.blobs) == 1


@pytest.mark.parametrize('call', [
    lambda: workspace.FetchBlob(12),
    lambda: workspace.FeedBlob(3.5, np.zeros(1)),
    lambda: workspace.HasBlob(['x']),
    lambda: workspace.RunNet(7),
])
def test_a_name_of_the_wrong_type_is_a_type_error(fresh, call):
    with pytest.raises(TypeError):
        call()


def test_populate_proto_with_file_name_names_ops_after_user_code():
    import inspect
    net = core.Net('traced')
    a, b = net.AddExternalInput('a', 'b')
    net.Mul([a, b], 'c'); frame = inspect.currentframe(); line = frame.f_lineno  # noqa: E702
    with core.NameScope('inner'):
        net.Add(['c', 'c'], 'd')
    net.PopulateProtoWithFileName()
    assert net.Proto().op[0].name == '{}:{}:{}'.format(
        inspect.getframeinfo(frame).filename, line,
        'test_populate_proto_with_file_name_names_ops_after_user_code')
    assert net.Proto().op[1].name.endswith(':{}:{}'.format(
        line + 2, 'test_populate_proto_with_file_name_names_ops_after_user_code'))


def test_a_net_with_recorded_creation_sites_still_pickles():
    import pickle
    net = core.Net('pickled')
    net.ConstantFill([], ['x'], shape=[1], value=1.0)
    line = test_a_net_with_recorded_creation_sites_still_pickles.__code__.co_firstlineno + 3
    back = pickle.loads(pickle.dumps(net))
    back.PopulateProtoWithFileName()
    assert back.Proto().op[0].name.endswith(
        ':{}:test_a_net_with_recorded_creation_sites_still_pickles'.format(line))


def test_immediate_mode_runs_ops_as_they_are_made(fresh, capsys):
    workspace.StartImmediate()
    assert 'Immediate mode' in capsys.readouterr().out
    try:
        assert workspace.IsImmediate()
        net = core.Net('imm')
        net.ConstantFill([], ['x'], shape=[2], value=2.0)
        net.Mul(['x', 'x'], ['y'])
        assert workspace.FetchImmediate('y').tolist() == [4.0, 4.0]
        assert sorted(workspace.ImmediateBlobs()) == ['x', 'y']
        # The current workspace saw nothing.
        assert not workspace.HasBlob('y')
        workspace.FeedImmediate('z', np.array([3.0], np.float32))
        net.Add(['z', 'z'], ['w'])
        assert workspace.FetchImmediate('w').tolist() == [6.0]
        with pytest.raises(errors.BlobNotFoundError):
            net.Add(['missing', 'z'], ['v'])
        assert workspace.CurrentWorkspace() == fresh
    finally:
        workspace.StopImmediate()
    assert not workspace.IsImmediate()
    core.Net('after').ConstantFill([], ['q'], shape=[1], value=1.0)
    workspace.StartImmediate(i_know=True)
    assert capsys.readouterr().out == ''
    assert workspace.ImmediateBlobs() == []
    workspace.StopImmediate()


@pytest.mark.parametrize('array', [
    np.arange(6, dtype=np.float32).reshape(2, 3),
    np.array([-1, 2**40], dtype=np.int64),
    np.array([True, False]),
    np.array([b'ab', b''], dtype=object),
])
def test_serialized_blobs_are_caffe2_blob_protos(fresh, array):
    workspace.FeedBlob('t', array)
    data = workspace.SerializeBlob('t')
    proto = caffe2_pb2.BlobProto()
    proto.ParseFromString(data)
    assert proto.name == 't' and proto.type == 'Tensor'
    decoded = utils.Caffe2TensorToNumpyArray(proto.tensor)
    assert decoded.tolist() == array.tolist() and decoded.shape == array.shape
    workspace.DeserializeBlob('copy', data)
    assert workspace.FetchBlob('copy').tolist() == array.tolist()
    renamed = workspace.C.Workspace.current.blobs['t'].serialize('other')
    proto.ParseFromString(renamed)
    assert proto.name == 'other'


def test_objects_serialize_and_bad_bytes_are_refused(fresh):
    workspace.RunOperatorOnce(core.CreateOperator('CreateCounter', [], ['c'], init_count=5))
    blob = workspace.C.Workspace.current.blobs['c']
    data = blob.serialize()
    workspace.C.Workspace.current.create_blob('d').deserialize(data)
    workspace.RunOperatorOnce(core.CreateOperator('RetrieveCount', ['d'], ['n']))
    assert workspace.FetchBlob('n') == 5
    workspace.FeedBlob('keep', np.array([1.0], np.float32))
    with pytest.raises(errors.CorruptCheckpointError) as info:
        workspace.DeserializeBlob('keep', b'\xff\xff')
    assert info.value.blob == 'keep'
    assert workspace.FetchBlob('keep').tolist() == [1.0]


def test_blob_tensor_handle(fresh):
    workspace.FeedBlob('m', np.ones((2, 2), np.float32))
    tensor = workspace.C.Workspace.current.blobs['m'].tensor()
    assert tensor.shape == (2, 2) and tensor._shape == [2, 2]
    tensor.data[0, 0] = 5.0  # reaches the blob, as Caffe2's view did
    assert workspace.FetchBlob('m').tolist() == [[5.0, 1.0], [1.0, 1.0]]
    row = tensor.data[1]  # a view of the array handed out
    row[1] = -2.0
    assert workspace.FetchBlob('m').tolist() == [[5.0, 1.0], [1.0, -2.0]]
    copy = tensor.data.copy()  # a copy does not write back
    copy[0, 0] = 99.0
    assert workspace.FetchBlob('m')[0, 0] == 5.0
    tensor.data += 1  # augmented assignment feeds the result
    assert workspace.FetchBlob('m').tolist() == [[6.0, 2.0], [2.0, -1.0]]
    tensor.feed(np.zeros(3, np.int32))
    assert tensor.fetch().tolist() == [0, 0, 0]
    fetched = tensor.fetch()
    fetched[0] = 4
    assert tensor.fetch().tolist() == [0, 0, 0]  # fetch is a plain copy


def test_tensor_init_and_reshape(fresh):
    workspace.FeedBlob('t', np.arange(6, dtype=np.int64))
    tensor = workspace.C.Workspace.current.blobs['t'].tensor()
    tensor.reshape((2, 3))
    assert workspace.FetchBlob('t').tolist() == [[0, 1, 2], [3, 4, 5]]
    tensor._reshape([4])  # another count: zeros of the same dtype
    got = workspace.FetchBlob('t')
    assert got.dtype == np.int64 and got.tolist() == [0, 0, 0, 0]
    tensor.init([2, 3], core.DataType.INT32)
    tensor.data[1, 1] = 100
    want = np.zeros((2, 3), np.int32)
    want[1, 1] = 100
    np.testing.assert_array_equal(workspace.FetchBlob('t'), want)
    tensor.init([2], core.DataType.FLOAT16)
    assert workspace.FetchBlob('t').dtype == np.float16
    with pytest.raises(RuntimeError):
        tensor.init([3, 4], core.DataType.STRING)
    workspace.FeedBlob('s', b'bytes')
    with pytest.raises(errors.DataTypeError):
        workspace.C.Workspace.current.blobs['s'].tensor().data


def test_blob_size_bytes(fresh):
    for dtype in (np.float16, np.float32, np.float64, np.bool_, np.int8, np.int16,
                  np.int32, np.int64, np.uint8, np.uint16):
        workspace.FeedBlob('b', np.zeros((2, 3), dtype))
        assert workspace.GetBlobSizeBytes('b') == 6 * np.dtype(dtype).itemsize
    workspace.FeedBlob('s1', np.array([b'Hello World!', b'abcd'], dtype=object))
    workspace.FeedBlob('s2', np.array([b'element1', b'element2'], dtype=object))
    assert workspace.GetBlobSizeBytes('s1') - workspace.GetBlobSizeBytes('s2') == 16 - 16
    assert workspace.GetBlobSizeBytes('s1') == 2 * 32 + 16
    workspace.FeedBlob('raw', b'abc')
    assert workspace.GetBlobSizeBytes('raw') == 0


def test_op_blob_devices_follow_the_op():
    op = core.CreateOperator('Add', ['a', 'b'], ['c'])
    inputs, outputs = core.InferOpBlobDevicesAsDict(op)
    assert set(inputs) == {'a', 'b'} and set(outputs) == {'c'}
    assert all(d.device_type == caffe2_pb2.CPU for d in list(inputs.values()) + list(outputs.values()))
    seeded = core.CreateOperator('Add', ['a', 'b'], ['c'],
                                 device_option=core.DeviceOption(caffe2_pb2.CPU, 0, random_seed=7))
    ins, outs = core.InferOpBlobDevices(seeded)
    assert len(ins) == 2 and len(outs) == 1
    assert ins[0].random_seed == 7 and outs[0].random_seed == 7
    ins[0].random_seed = 9  # copies: changing one changes nothing else
    assert ins[1].random_seed == 7 and seeded.device_option.random_seed == 7
    assert core.C is workspace.C


@pytest.mark.parametrize('threads', [1, 4])
def test_build_unique_mutex_iter_counts_every_run(fresh, threads):
    init, step_net = core.Net('init'), core.Net('step')
    iteration = utils.BuildUniqueMutexIter(init, step_net, iter_val=10)
    again = utils.BuildUniqueMutexIter(init, step_net)
    assert str(iteration) == str(again) == utils.OPTIMIZER_ITERATION_NAME
    assert [op.type for op in step_net.Proto().op] == ['AtomicIter']
    for op in list(init.Proto().op) + list(step_net.Proto().op):
        assert list(op.device_option.extra_info) == ['device_type_override:cpu']
    workspace.RunNetOnce(init)
    runs = 25
    loop = core.execution_step('loop', [step_net], num_iter=runs)
    parallel = core.execution_step('par', [loop], num_concurrent_instances=threads)
    workspace.RunPlan(core.Plan(parallel))
    assert workspace.FetchBlob(iteration).tolist() == [10 + runs * threads]


def test_op_schemas_as_caffe2_exposed_them():
    schema = workspace.C.OpSchema.get('Add')
    assert (schema.min_input, schema.max_input, schema.min_output, schema.max_output) == (2, 2, 1, 1)
    assert schema.num_inputs_outputs_allowed(2, 1) and not schema.num_inputs_allowed(3)
    assert 'broadcast' in [a.name for a in schema.args] and not schema.private
    unbounded = workspace.C.OpSchema.get('Sum')
    assert unbounded.max_input == workspace.OpSchema.inf and unbounded.num_inputs_allowed(1000)
    assert workspace.C.OpSchema.get('NoSuchOp') is None


@pytest.mark.parametrize('call', [
    lambda ws: ws.create_net('...'),
    lambda ws: workspace.RunNetOnce('...'),
    lambda ws: workspace.RunPlan('...'),
    lambda ws: workspace.CreateNet('...'),
])
def test_text_where_a_serialised_proto_goes_is_a_type_error(fresh, call):
    with pytest.raises(TypeError):
        call(workspace.C.Workspace())


def test_registered_operators_are_a_set_as_soon_as_core_is_imported():
    # Caffe2 programs read core._REGISTERED_OPERATORS at import time (its
    # workspace_test does, in a decorator); a fresh interpreter shows
    # whether the set is there before any op was made.
    import os
    import subprocess
    import sys
    import textwrap

    from _support import PKG_PARENT

    code = textwrap.dedent("""
        from ferrocaffe import core
        ops = core._REGISTERED_OPERATORS
        print(type(ops).__name__, "Add" in ops, "NoSuchOp" in ops)
    """)
    env = dict(os.environ, PYTHONPATH=PKG_PARENT)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["set", "True", "False"]


def test_clone_renames_blobs_inside_the_nets_of_control_ops():
    then_net = core.Net("then_part")
    then_net.Copy(["cond_in"], "then_out")
    else_net = core.Net("else_part")
    else_net.Copy(["other_in"], "else_out")
    cond = core.Net("cond_part")
    cond.Copy(["cond_in"], "c")
    body = core.Net("body_part")
    body.Copy(["cond_in"], "b")
    n = core.Net("with_control")
    n.If(["flag"], [], then_net=then_net.Proto(), else_net=else_net.Proto())
    n.While([], [], loop_net=body.Proto(), cond_net=cond.Proto())
    copied = n.Clone("with_control_copy", blob_remap={"cond_in": "renamed", "flag": "flag2"})
    if_op, while_op = copied.Proto().op
    assert list(if_op.input) == ["flag2"]
    nets = {a.name: a.n for a in if_op.arg}
    assert [list(o.input) for o in nets["then_net"].op] == [["renamed"]]
    assert [list(o.input) for o in nets["else_net"].op] == [["other_in"]]
    assert nets["then_net"].name.startswith("then_part_remapped")
    loops = {a.name: a.n for a in while_op.arg}
    assert [list(o.input) for o in loops["loop_net"].op] == [["renamed"]]
    assert [list(o.input) for o in loops["cond_net"].op] == [["renamed"]]
    # The original is untouched, and an explicit empty table turns it off.
    assert [list(o.input) for o in n.Proto().op[0].arg[0].n.op] == [["cond_in"]]
    plain = n.Clone("with_control_plain", blob_remap={"cond_in": "renamed"}, remap_funcs={})
    assert [list(o.input) for o in plain.Proto().op[0].arg[0].n.op] == [["cond_in"]]

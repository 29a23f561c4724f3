"""data_parallel_model on one machine: replicas as concurrent substeps.

Caffe2's test_equiv, with expected values from an independent numpy model
(_dp_models.reference): after k steps, 1, 2 and 4 replicas given the same
global batch hold the parameters of one model trained on the whole batch,
with SGD, momentum and Adam, for dense and sparse (Gather) parameters.
"""

import numpy as np
import pytest

import ferrocaffe
from ferrocaffe import (core, data_parallel_model as dpm, errors,
                        model_helper, workspace)

from _dp_models import (batches, build, initial_params, param_names,
                        reference, replica_feeds)

STEPS, BATCH = 4, 16


def feed_initial_params(devices, sparse):
    for name, value in initial_params().items():
        if name == 'emb' and not sparse:
            continue
        for d in devices:
            workspace.FeedBlob('cpu_%d/%s' % (d, name), value)


def train(devices, opt, sparse, steps):
    workspace.ResetWorkspace()
    model = build(model_helper.ModelHelper(name='dp'), devices, opt, sparse)
    workspace.RunNetOnce(model.param_init_net)
    feed_initial_params(devices, sparse)
    for batch in steps:
        for blob, value in replica_feeds(batch, devices).items():
            workspace.FeedBlob(blob, value)
        dpm.RunNet(model, 1)
    return model


@pytest.mark.parametrize('sparse', [False, True], ids=['dense', 'sparse'])
@pytest.mark.parametrize('opt', ['sgd', 'momentum', 'adam'])
@pytest.mark.parametrize('devices', [[0], [0, 1], [0, 1, 2, 3]],
                         ids=['1', '2', '4'])
def test_replicas_match_one_model_on_the_whole_batch(devices, opt, sparse):
    steps = batches(STEPS, BATCH)
    want = reference(steps, opt, sparse)
    model = train(devices, opt, sparse, steps)
    if len(devices) > 1:
        assert model._dpm_concurrency == 'concurrent: %d replicas' % len(devices)
    for name in param_names(sparse):
        for d in devices:
            got = workspace.FetchBlob('cpu_%d/%s' % (d, name))
            np.testing.assert_allclose(got, want[name], rtol=1e-4, atol=2e-6,
                                       err_msg='cpu_%d/%s' % (d, name))


def test_concurrent_step_and_model_net_give_the_same_bits():
    steps = batches(STEPS, BATCH, seed=3)
    train([0, 1], 'momentum', True, steps)
    via_step = {n: workspace.FetchBlob('cpu_0/' + n) for n in param_names(True)}
    workspace.ResetWorkspace()
    model = build(model_helper.ModelHelper(name='dp'), [0, 1], 'momentum', True)
    workspace.RunNetOnce(model.param_init_net)
    feed_initial_params([0, 1], True)
    for i, batch in enumerate(steps):
        for blob, value in replica_feeds(batch, [0, 1]).items():
            workspace.FeedBlob(blob, value)
        if i == 0:
            workspace.CreateNet(model.net)
        workspace.RunNet(model.net)
    for n in param_names(True):
        np.testing.assert_array_equal(workspace.FetchBlob('cpu_0/' + n), via_step[n])


def test_loss_scale_is_one_over_replicas_times_shards():
    seen = []

    def forward(m, loss_scale):
        seen.append(loss_scale)
        return []

    for devices, rv, want in (([0, 1], None, 0.5),
                              ([0, 1, 2], {'num_shards': 2, 'shard_id': 0,
                                           'engine': 'GLOO', 'kv_handler': None},
                               1.0 / 6)):
        seen.clear()
        dpm.Parallelize(model_helper.ModelHelper(name='s'),
                        input_builder_fun=lambda m: None,
                        forward_pass_builder_fun=forward, devices=devices,
                        cpu_device=True, rendezvous=rv)
        assert seen == [pytest.approx(want)] * len(devices)


def test_checkpoint_params_are_the_first_replica_and_the_iteration():
    model = build(model_helper.ModelHelper(name='ck'), [1, 2, 3], 'momentum',
                  False)
    got = {str(b) for b in dpm.GetCheckpointParams(model)}
    assert got == {'cpu_1/fc_w', 'cpu_1/fc_b', 'cpu_1/fc_w_momentum',
                   'cpu_1/fc_b_momentum', 'optimizer_iteration'}
    names = dpm.GetLearningRateBlobNames(model)
    assert len(names) == 1 and names[0].endswith('_lr_cpu')


def test_finalize_after_checkpoint_copies_the_first_replica():
    workspace.ResetWorkspace()
    model = build(model_helper.ModelHelper(name='fin'), [0, 1, 2], 'momentum',
                  False)
    workspace.RunNetOnce(model.param_init_net)
    w = np.arange(24, dtype=np.float32).reshape(3, 8)
    workspace.FeedBlob('cpu_0/fc_w', w)
    workspace.FeedBlob('cpu_0/fc_w_momentum', w * 2)
    dpm.FinalizeAfterCheckpoint(model)
    for d in (1, 2):
        np.testing.assert_array_equal(workspace.FetchBlob('cpu_%d/fc_w' % d), w)
        np.testing.assert_array_equal(
            workspace.FetchBlob('cpu_%d/fc_w_momentum' % d), w * 2)


def test_the_init_net_copies_the_first_replicas_parameters():
    workspace.ResetWorkspace()
    model = model_helper.ModelHelper(name='init')
    from ferrocaffe import brew, optimizer

    def forward(m, scale):
        fc = brew.fc(m, 'data', 'fc', dim_in=4, dim_out=2)
        return [m.net.AveragedLoss(fc, 'loss')]

    dpm.Parallelize_CPU(model, input_builder_fun=lambda m: None,
                        forward_pass_builder_fun=forward,
                        optimizer_builder_fun=lambda m: optimizer.build_sgd(m, 0.1),
                        devices=[0, 1, 2])
    workspace.RunNetOnce(model.param_init_net)
    w0 = workspace.FetchBlob('cpu_0/fc_w')
    assert np.abs(w0).sum() > 0  # a random (Xavier) fill
    for d in (1, 2):
        np.testing.assert_array_equal(workspace.FetchBlob('cpu_%d/fc_w' % d), w0)


def test_a_failing_replica_fails_the_step_naming_op_and_net():
    workspace.ResetWorkspace()
    model = build(model_helper.ModelHelper(name='bad'), [0, 1], 'sgd', False)
    workspace.RunNetOnce(model.param_init_net)
    batch = batches(1, 8)[0]
    for blob, value in replica_feeds(batch, [0, 1]).items():
        workspace.FeedBlob(blob, value)
    workspace.FeedBlob('cpu_1/label', np.array([0, 1, 7, 0], np.int32))  # 7: no such class
    with pytest.raises(errors.FerrocaffeError) as info:
        dpm.RunNet(model, 1)
    assert isinstance(info.value, RuntimeError)
    assert info.value.net == 'dp/cpu_1' or 'cpu_1' in str(info.value)


def test_gpu_or_ideep_is_refused_with_advice():
    with pytest.raises(errors.InvalidArgumentError, match='cpu_device=True'):
        dpm.Parallelize_GPU(model_helper.ModelHelper(name='g'),
                            input_builder_fun=lambda m: None,
                            forward_pass_builder_fun=lambda m, s: [],
                            devices=[0])


def test_convert_net_for_device_prefixes_every_blob():
    net = core.Net('other')
    net.FC(['data', 'w', 'b'], 'y')
    converted = dpm.ConvertNetForDevice(net, core.DeviceOption(0, 2))
    op = converted.Proto().op[0]
    assert list(op.input) == ['cpu_2/data', 'cpu_2/w', 'cpu_2/b']
    assert list(op.output) == ['cpu_2/y']


def test_alias_module_is_this_one():
    ferrocaffe.register_caffe2_alias()
    from caffe2.python import data_parallel_model, dyndep
    assert data_parallel_model is dpm
    dyndep.InitOpsLibrary('@/caffe2/caffe2/contrib/gloo:gloo_ops')


@pytest.mark.parametrize('before, after', [([0, 1], [0, 1, 2, 3]), ([0, 1, 2, 3], [0])],
                         ids=['2to4', '4to1'])
@pytest.mark.parametrize('opt', ['momentum', 'adam'])
def test_a_checkpoint_resumes_with_another_replica_count(tmp_path, before, after, opt):
    # Half the steps on `before` replicas, a checkpoint of GetCheckpointParams
    # in a real db file, then the rest on `after` replicas of a fresh model
    # that loads it and calls FinalizeAfterCheckpoint: the same parameters as
    # the numpy model trained on every step (the global batch is the same).
    steps = batches(STEPS, BATCH, seed=5)
    want = reference(steps, opt, True)
    half = STEPS // 2
    model = train(before, opt, True, steps[:half])
    saved = sorted(str(b) for b in dpm.GetCheckpointParams(model))
    db = str(tmp_path / 'dp.minidb')
    workspace.RunOperatorOnce(core.CreateOperator(
        'Save', saved, [], db=db, db_type='minidb', absolute_path=1))

    workspace.ResetWorkspace()
    model = build(model_helper.ModelHelper(name='dp'), after, opt, True)
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunOperatorOnce(core.CreateOperator(
        'Load', [], saved, db=db, db_type='minidb', absolute_path=1))
    dpm.FinalizeAfterCheckpoint(model)
    for batch in steps[half:]:
        for blob, value in replica_feeds(batch, after).items():
            workspace.FeedBlob(blob, value)
        dpm.RunNet(model, 1)
    for name in param_names(True):
        for d in after:
            np.testing.assert_allclose(
                workspace.FetchBlob('cpu_%d/%s' % (d, name)), want[name],
                rtol=1e-4, atol=2e-6, err_msg='cpu_%d/%s' % (d, name))

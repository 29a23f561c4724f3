"""Data-parallel training: Caffe2's ``data_parallel_model`` on ferrocaffe.

``Parallelize(model, input_builder_fun, forward_pass_builder_fun,
optimizer_builder_fun=..., devices=[0, 1], cpu_device=True)`` builds one
replica of the model per device under the name scope ``cpu_<d>/``, scales
each replica's loss by ``1 / (replicas x shards)``, adds the gradient
operators, sums every parameter's gradient over the replicas once per
iteration (a tree of ``Sum`` ops into the first replica's gradient, then a
``Copy`` to the others), across machines too when a ``rendezvous`` with
``num_shards`` > 1 is given (``Allreduce`` over a common world of the
Nodes of a :class:`~ferrocaffe.distributed.RaySession`), and the updates;
the first replica's parameters are copied (and broadcast across shards) to
the others after the init net ran.

``model.net`` holds all of it, in Caffe2's order, so ``workspace.RunNet(
model.net)`` runs one iteration. ``RunNet(model, n)`` and
:func:`ParallelStep` run the replicas' forward and backward passes as
concurrent substeps of one execution step (the plan scheduler's threads),
then the gradient sums and the updates: the same ops, the same results.

Differences from Caffe2 are listed in docs/porting.md ("data_parallel_model").
"""

from __future__ import annotations

import copy
import logging
import os
import warnings
from collections import OrderedDict

from . import core, errors, model_helper, scope, utils, workspace
from . import collective  # noqa: F401  (the collective op types' kernels)
from .checkpoint import manager as _manager
from .net_builder import ops as _ops
from .proto import caffe2_pb2
from .task import Node as _Node, Task as _Task

log = logging.getLogger(__name__)

_DEFAULT_TIMEOUT_SEC = 30
_DEFAULT_BARRIER_NET_TIMEOUT_SEC = 300

__all__ = [
    'Parallelize', 'Parallelize_CPU', 'Parallelize_GPU', 'Parallelize_iDeep',
    'Parallelize_BMUF', 'Parallelize_CPU_BMUF', 'Parallelize_GPU_BMUF',
    'CreateNet', 'RunInitNet', 'RunWarmup', 'RunNet', 'ParallelStep',
    'Synchronize', 'ConvertNetForDevice', 'ExtractPredictorNet',
    'GetCheckpointParams', 'FinalizeAfterCheckpoint', 'CheckpointSyncNet',
    'CheckpointManager',
    'GetLearningRateBlobNames', 'AddBlobSync', 'AddDistributedBlobSync',
    'OptimizeGradientMemory', 'stripBlobName', 'CollectivesConcurrencyControl',
]


def Parallelize_GPU(*args, **kwargs):
    kwargs['cpu_device'] = False
    Parallelize(*args, **kwargs)


def Parallelize_CPU(*args, **kwargs):
    kwargs['cpu_device'] = True
    Parallelize(*args, **kwargs)


def Parallelize_iDeep(*args, **kwargs):
    kwargs['ideep'] = True
    Parallelize(*args, **kwargs)


def _check_device_scope():
    current = scope.CurrentDeviceScope()
    assert current is None or current.device_type == caffe2_pb2.CPU, (
        'Parallelize must be called outside a device scope (or in a CPU '
        'one); the device scope is %s' % current)


def _set_device(model, cpu_device, ideep, shared_model):
    if not cpu_device or ideep:
        raise errors.InvalidArgumentError(
            'data_parallel_model: ferrocaffe runs on the CPU only; pass '
            'cpu_device=True (Parallelize_CPU) to train replicas on CPU '
            'threads (%s was asked for)' % ('iDeep' if ideep else 'GPUs'))
    model._device_type = caffe2_pb2.CPU
    model._device_prefix = 'cpu'
    model._shared_model = shared_model


def _num_shards(rendezvous):
    return 1 if rendezvous is None else int(rendezvous['num_shards'])


def Parallelize(
    model_helper_obj,
    input_builder_fun,
    forward_pass_builder_fun,
    param_update_builder_fun=None,
    optimizer_builder_fun=None,
    post_sync_builder_fun=None,
    pre_grad_net_transformer_fun=None,
    net_transformer_fun=None,
    devices=None,
    rendezvous=None,
    net_type='dag',
    broadcast_computed_params=True,
    optimize_gradient_memory=False,
    dynamic_memory_management=False,
    blobs_to_keep=None,
    use_nccl=False,
    max_concurrent_distributed_ops=16,
    cpu_device=False,
    ideep=False,
    num_threads_per_device=4,
    shared_model=False,
    combine_spatial_bn=False,
    barrier_net_timeout_sec=_DEFAULT_BARRIER_NET_TIMEOUT_SEC,
):
    """Builds a data-parallel model (see the module documentation).

    The builder functions are Caffe2's: ``input_builder_fun(model)`` adds
    each replica's input ops, ``forward_pass_builder_fun(model,
    loss_scale)`` its layers and returns its losses (scaled by
    ``loss_scale``), and either ``param_update_builder_fun(model)`` (called
    per replica, in its scopes) or ``optimizer_builder_fun(model)`` (called
    once, outside them) adds the updates; without either the model is a
    forward-only (test) model. ``rendezvous`` (``{'num_shards': S,
    'shard_id': s, 'engine': 'GLOO', 'kv_handler': None}``) spreads
    training over S shards, the Nodes of a RaySession.
    """
    _check_device_scope()
    model = model_helper_obj
    if devices is None:
        devices = list(range(os.cpu_count() or 1))
    devices = list(devices)
    assert len(devices) > 0, 'Parallelize needs at least one device'
    _set_device(model, cpu_device, ideep, shared_model)
    assert isinstance(model, model_helper.ModelHelper)
    log.info('Parallelizing model %s for devices %s', model.name, devices)

    extra_workers = 8 if rendezvous is not None else 0
    num_workers = len(devices) * num_threads_per_device + extra_workers
    max_concurrent_distributed_ops = min(max_concurrent_distributed_ops,
                                         num_workers - 1)
    model.net.Proto().num_workers = num_workers
    model.net.Proto().type = net_type

    model._devices = devices
    model._rendezvous = rendezvous
    model._sync_barrier_net = None
    model._broadcast_context = None
    model._grad_names = []
    model._optimizer = getattr(model, '_optimizer', None)
    model._dpm_phases = None

    non_datapar_params = copy.copy(model.params)
    num_shards = _num_shards(rendezvous)
    loss_scale = 1.0 / (len(devices) * num_shards)

    has_parameter_updates = (param_update_builder_fun is not None
                             or optimizer_builder_fun is not None)
    assert not (param_update_builder_fun is not None
                and optimizer_builder_fun is not None), (
        'Give only one of param_update_builder_fun and optimizer_builder_fun')
    if not has_parameter_updates and model.init_params:
        log.warning('model %s has no parameter updates (a test model) but '
                    'init_params=True: running its param_init_net would '
                    'overwrite the trained parameters; use '
                    'ModelHelper(init_params=False)', model.name)

    losses_by_device = {}
    for device in devices:
        with _replica_scope(model, device):
            input_builder_fun(model)
            losses = forward_pass_builder_fun(model, loss_scale)
            if has_parameter_updates:
                assert isinstance(losses, list), (
                    'forward_pass_builder_fun must return a list of losses')
                for loss in losses:
                    assert isinstance(loss, core.BlobReference), (
                        'forward_pass_builder_fun must return a list of loss '
                        'blob references, got %r' % (loss,))
            losses_by_device[device] = losses
    _ValidateParams(model.params)

    model._device_grouped_blobs = _GroupByDevice(
        model, devices, model.params, non_datapar_params)
    computed = _GroupByDevice(model, devices, model.GetComputedParams(''), [])
    model._device_grouped_blobs.update(computed)
    model._param_names = list(model._device_grouped_blobs)
    model._computed_param_names = list(computed)

    if pre_grad_net_transformer_fun:
        pre_grad_net_transformer_fun(model)
    if has_parameter_updates:
        _AddGradientOperators(devices, model, losses_by_device)
    if net_transformer_fun:
        net_transformer_fun(model, len(devices), model._device_prefix,
                            model._device_type)
    if not has_parameter_updates:
        _InferBlobDevice(model)
        return

    if combine_spatial_bn:
        _InterleaveOps(model)
        _CPUInterDeviceBatchNormalization(model)
    _ValidateParams(model.params)

    param_to_grad = model.param_to_grad
    grads_ordered = [param_to_grad[p] for p in model.params if p in param_to_grad]
    non_datapar_grads = [param_to_grad[p] for p in non_datapar_params
                         if p in param_to_grad]
    gradients_grouped = _GroupByDevice(model, devices, grads_ordered,
                                       non_datapar_grads)
    model._device_grouped_blobs.update(gradients_grouped)
    model._grad_names = list(gradients_grouped)
    model._losses_by_gpu = losses_by_device
    _InferBlobDevice(model)

    replica_end = len(model.net.Proto().op)
    if broadcast_computed_params:
        _BroadcastComputedParams(devices, model, rendezvous)
    if model._grad_names:
        _AllReduceBlobs(list(reversed(model._grad_names)), devices, model,
                        model.net, rendezvous, max_concurrent_distributed_ops)
    sync_end = len(model.net.Proto().op)

    all_params = set(model.GetParams(''))
    if shared_model:
        _PruneParametersForSharing(model)

    if param_update_builder_fun is not None:
        for device in devices:
            with _replica_scope(model, device):
                param_update_builder_fun(model)
    else:
        model._optimizer = optimizer_builder_fun(model)

    sync_blobs, sync_names = _ComputeBlobsToSync(model)
    model._device_grouped_blobs.update(
        _GroupByDevice(model, devices, sync_blobs, []))
    _InferBlobDevice(model)

    # Caffe2 ran the first iteration of its DAG net with one worker.
    arg = model.Proto().arg.add()
    arg.name = 'first_iter_only_one_worker'
    arg.i = 1

    _SyncAllParams(devices, model, model.param_init_net,
                   model.param_init_net, rendezvous, sync_names,
                   max_concurrent_distributed_ops=1)
    if post_sync_builder_fun is not None:
        for device in devices:
            with _replica_scope(model, device):
                post_sync_builder_fun(model)

    assert not (optimize_gradient_memory and dynamic_memory_management), (
        'optimize_gradient_memory and dynamic_memory_management exclude '
        'each other')
    if optimize_gradient_memory or dynamic_memory_management:
        log.info('data_parallel_model: optimize_gradient_memory and '
                 'dynamic_memory_management are accepted and change nothing '
                 '(ferrocaffe frees a blob\'s buffer when it is replaced)')

    model._data_parallel_model_init_nets = [model.param_init_net]
    model._data_parallel_model_nets = [model.net]
    _AddBarrierToModelNets(model, barrier_net_timeout_sec)
    if shared_model:
        before = len(model.net.Proto().op)
        _RemapParameterBlobsForSharedModel(model, all_params)
        removed = before - len(model.net.Proto().op)
        sync_end -= removed
    model._dpm_phases = (replica_end, sync_end)


class _replica_scope(object):
    """The device and name scope of one replica (``cpu_<d>/``)."""

    def __init__(self, model, device):
        self._device = core.DeviceScope(core.DeviceOption(model._device_type, device))
        self._name = core.NameScope('%s_%d' % (model._device_prefix, device))

    def __enter__(self):
        self._device.__enter__()
        self._name.__enter__()

    def __exit__(self, *exc):
        self._name.__exit__(*exc)
        self._device.__exit__(*exc)


# ------------------------------------------------------------------- BMUF --

def Parallelize_GPU_BMUF(*args, **kwargs):
    kwargs['cpu_device'] = False
    Parallelize_BMUF(*args, **kwargs)


def Parallelize_CPU_BMUF(*args, **kwargs):
    kwargs['cpu_device'] = True
    Parallelize_BMUF(*args, **kwargs)


def Parallelize_BMUF(
    model_helper_obj,
    input_builder_fun,
    forward_pass_builder_fun,
    param_update_builder_fun,
    block_learning_rate=1.0,
    block_momentum=None,
    devices=None,
    rendezvous=None,
    net_type='dag',
    master_device=None,
    use_nccl=False,
    nesterov=False,
    optimize_gradient_memory=False,
    reset_momentum_sgd=False,
    warmup_iterations=None,
    max_concurrent_distributed_ops=4,
    add_blobs_to_sync=None,
    num_threads_per_device=4,
    cpu_device=False,
    barrier_net_timeout_sec=_DEFAULT_BARRIER_NET_TIMEOUT_SEC,
):
    """Block-wise model update filtering (Chen and Huo, ICASSP 2016): the
    replicas train independently (``model.net``, no gradient sums); a
    second net (``model._global_model_param_updates_net``, run once per
    block) averages their parameters and applies the block momentum."""
    _check_device_scope()
    model = model_helper_obj
    assert isinstance(model, model_helper.ModelHelper)
    devices = list(devices if devices is not None else range(os.cpu_count() or 1))
    master_device = devices[0] if master_device is None else master_device
    _set_device(model, cpu_device, False, False)
    model._devices = devices
    model._rendezvous = rendezvous
    model._sync_barrier_net = None
    model._broadcast_context = None
    model._optimizer = None
    model._dpm_phases = None
    master_opt = core.DeviceOption(model._device_type, master_device)

    num_devices = len(devices) * _num_shards(rendezvous)
    num_workers = num_threads_per_device * len(devices) + (8 if rendezvous else 0)
    max_concurrent_distributed_ops = min(max_concurrent_distributed_ops,
                                         num_workers - 1)
    loss_scale = 1.0 / num_devices
    if block_momentum is None:
        block_momentum = 1.0 - 1.0 / num_devices
    model.net.Proto().num_workers = num_workers
    model.net.Proto().type = net_type
    init_net = model._global_model_init_net = core.Net('global_model_init')
    update = model._global_model_param_updates_net = core.Net('global_model')
    for n in (init_net, update):
        n.Proto().type = net_type
        n.Proto().num_workers = num_workers

    non_datapar_params = copy.copy(model.params)
    model._losses_by_gpu = {}
    for device in devices:
        with _replica_scope(model, device):
            input_builder_fun(model)
            model._losses_by_gpu[device] = forward_pass_builder_fun(model, loss_scale)
    _ValidateParams(model.params)
    model._device_grouped_blobs = _GroupByDevice(model, devices, model.params,
                                                 non_datapar_params)
    model._param_names = list(model._device_grouped_blobs)
    _AddGradientOperators(devices, model, model._losses_by_gpu)
    _ValidateParams(model.params)
    _InferBlobDevice(model)
    for device in devices:
        with _replica_scope(model, device):
            param_update_builder_fun(model)

    names = list(model._device_grouped_blobs)

    def master(name):
        return model._device_grouped_blobs[name][master_device]

    if warmup_iterations is not None:
        model._warmup_iterations = warmup_iterations
        warm = model._warmup_broadcast = core.Net('warmup-broadcast')
        warm.Proto().type = net_type
        warm.Proto().num_workers = num_workers
        _SyncAllParams(devices, model, model.param_init_net, warm, rendezvous,
                       names, max_concurrent_distributed_ops)
        for name in names:
            with core.DeviceScope(master_opt):
                warm.Copy(master(name), '%s_g' % master(name))

    # The block momentum (_v), the block's starting point (_g) and, for
    # Nesterov, the previous momentum (_prev), on the master replica.
    for name in names:
        p = master(name)
        with core.DeviceScope(master_opt):
            init_net.ConstantFill(p, '%s_v' % p, value=0.0)
            init_net.Copy(p, '%s_g' % p)
            if nesterov:
                init_net.ConstantFill(p, '%s_prev' % p, value=0.0)

    _AllReduceBlobs(names, devices, model, update, rendezvous,
                    max_concurrent_distributed_ops)
    for name in names:
        p = master(name)
        v, g, prev = '%s_v' % p, '%s_g' % p, '%s_prev' % p
        with core.DeviceScope(master_opt):
            # p <- mean of the replicas; step = block_lr * (mean - start)
            update.Scale(p, p, scale=1.0 / num_devices)
            update.Sub([p, g], p)
            update.Scale(p, p, scale=block_learning_rate)
            # v <- block_momentum * v + step;  start <- start + v
            update.Scale(v, v, scale=block_momentum)
            update.Add([v, p], v)
            update.Add([g, v], g)
            if nesterov:
                update.Sub([v, prev], prev)
                update.Scale(prev, prev, scale=block_momentum)
                update.Sub([g, prev], g)
                update.Copy(v, prev)
            update.Copy(g, p)
    _SyncAllParams(devices, model, model.param_init_net, update, rendezvous,
                   names, max_concurrent_distributed_ops)
    if add_blobs_to_sync is not None:
        AddBlobSync(model, add_blobs_to_sync, net=update)
    if reset_momentum_sgd:
        for op in [o for o in model.net.Proto().op
                   if o.type == 'MomentumSGDUpdate']:
            with core.DeviceScope(op.device_option):
                update.ConstantFill([op.input[1]], op.input[1], value=0.0)
    if optimize_gradient_memory:
        log.info('data_parallel_model: optimize_gradient_memory is accepted '
                 'and changes nothing')
    model._data_parallel_model_init_nets = [model.param_init_net, init_net]
    model._data_parallel_model_nets = [model.net, (update, 1)]
    _AddBarrierToModelNets(model, barrier_net_timeout_sec)


# ------------------------------------------------------------ running it --

def CreateNet(model, overwrite=False):
    for entry in model._data_parallel_model_nets:
        net = entry[0] if isinstance(entry, tuple) else entry
        workspace.CreateNet(net, overwrite=overwrite)


def RunInitNet(model):
    for init_net in model._data_parallel_model_init_nets:
        workspace.RunNetOnce(init_net)
    CreateNet(model)


def RunWarmup(model):
    workspace.RunNet(model.net, model._warmup_iterations)
    workspace.RunNetOnce(model._warmup_broadcast)


def RunNet(model, num_iterations):
    """Runs ``num_iterations`` iterations of the model's nets (a BMUF
    model's block net once after them). The training net's replicas run as
    concurrent substeps (:func:`ParallelStep`) where they can."""
    for entry in model._data_parallel_model_nets:
        if isinstance(entry, tuple):
            workspace.RunNet(entry[0].Proto().name, entry[1])
        elif entry is model.net and getattr(model, '_dpm_phases', None):
            workspace.RunPlan(_plan_of(ParallelStep(model, num_iterations)))
        else:
            workspace.RunNet(entry, num_iterations)


def _plan_of(step):
    plan = core.Plan(step.Proto().name)
    plan.AddStep(step)
    return plan


def ParallelStep(model, num_iter=1, name=None):
    """An execution step running ``num_iter`` iterations of a model made by
    ``Parallelize``: each iteration runs the replicas' forward and backward
    passes as concurrent substeps (one thread each), then the gradient sums
    (and collectives), the updates and any ops added to ``model.net``
    later (``AddBlobSync``). Same ops, same order of updates, same results
    as running ``model.net``.

    When the replicas' ops cannot run apart (a replica's op reads or writes
    another replica's blob before the sums, as ``combine_spatial_bn`` makes
    them), the step runs ``model.net`` itself; ``model._dpm_concurrency``
    says which, and why.
    """
    nets = _split_net(model)
    name = name or '%s_parallel' % model.net.Proto().name
    if nets is None:
        return core.execution_step(name, [model.net], num_iter=num_iter)
    replicas, rest = nets
    inner = core.execution_step(
        name + '_replicas',
        [core.execution_step('%s_%s' % (name, n.Proto().name.split('/')[-1]), [n])
         for n in replicas],
        concurrent_substeps=True)
    return core.execution_step(name, [inner, core.execution_step(
        name + '_sync_and_update', [rest])], num_iter=num_iter)


def _replica_of(blob, prefix):
    head = blob.split(scope._NAMESCOPE_SEPARATOR, 1)[0]
    if head.startswith(prefix + '_') and '/' in blob:
        tail = head[len(prefix) + 1:]
        if tail.isdigit():
            return int(tail)
    return None


def _split_net(model):
    """``([replica nets], rest net)`` of ``model.net``, or None (with the
    reason in ``model._dpm_concurrency``) when the replicas' part cannot
    be split."""
    phases = getattr(model, '_dpm_phases', None)
    proto = model.net.Proto()
    if not phases:
        model._dpm_concurrency = 'sequential: not a Parallelize model'
        return None
    end, _ = phases
    ops = list(proto.op)
    devices = list(model._devices)
    if len(devices) < 2:
        model._dpm_concurrency = 'sequential: one replica'
        return None
    owned = {d: [] for d in devices}
    writes = {d: set() for d in devices}
    reads = {d: set() for d in devices}
    for op in ops[:end]:
        homes = {_replica_of(b, model._device_prefix) for b in op.output}
        homes.discard(None)
        if not homes:
            homes = {_replica_of(b, model._device_prefix) for b in op.input}
            homes.discard(None)
        if len(homes) != 1 or next(iter(homes)) not in owned:
            model._dpm_concurrency = (
                'sequential: op %s (%s -> %s) before the gradient sums '
                'belongs to no single replica' % (
                    op.type, list(op.input), list(op.output)))
            return None
        d = homes.pop()
        owned[d].append(op)
        writes[d].update(op.output)
        reads[d].update(op.input)
    for d in devices:
        for e in devices:
            if d != e:
                clash = writes[d] & (writes[e] | reads[e])
                if clash:
                    model._dpm_concurrency = (
                        'sequential: replicas %d and %d share blob %s before '
                        'the gradient sums' % (d, e, sorted(clash)[0]))
                    return None
    base = proto.name
    replica_nets = []
    for d in devices:
        net = core.Net('%s/%s_%d' % (base, model._device_prefix, d))
        net.Proto().op.extend(owned[d])
        replica_nets.append(net)
    rest = core.Net('%s/sync_and_update' % base)
    rest.Proto().op.extend(ops[end:])
    model._dpm_concurrency = 'concurrent: %d replicas' % len(devices)
    return replica_nets, rest


# -------------------------------------------------------------- barriers --

def _AddBarrierToModelNets(model, barrier_net_timeout_sec):
    rv = model._rendezvous
    if rv is not None and rv.get('engine') == 'GLOO' and _num_shards(rv) > 1:
        # Shards meet before each run of the model's nets, so that a shard
        # that starts early waits for slow ones with the barrier's long
        # timeout, not the collectives' short one.
        model._barrier_init_net = core.Net('barrier_init_net')
        model._barrier_net = _CreateBarrierNet(
            model, model._barrier_init_net, 'pre_training',
            barrier_net_timeout_sec)
        model._data_parallel_model_init_nets.insert(0, model._barrier_init_net)
        model._data_parallel_model_nets.insert(0, model._barrier_net)


def _CreateBarrierNet(model, init_net, name_prefix, timeout_sec):
    cw = _CreateOrCloneCommonWorld(init_net, name_prefix + '_barrier_cw',
                                   rendezvous=model._rendezvous,
                                   timeout_sec=timeout_sec)
    net = core.Net(name_prefix + '_barrier_net')
    net.Barrier(inputs=[cw], outputs=[], engine=model._rendezvous['engine'])
    return net


def Synchronize(model, timeout_sec=_DEFAULT_BARRIER_NET_TIMEOUT_SEC):
    """Deprecated in Caffe2 (a barrier net now runs before training): waits
    until every shard reached it."""
    warnings.warn('Synchronize is deprecated: Parallelize adds a barrier net '
                  'that runs before training (barrier_net_timeout_sec)',
                  category=DeprecationWarning, stacklevel=2)
    rv = model._rendezvous
    if rv is None or _num_shards(rv) <= 1:
        return
    if model._sync_barrier_net is None:
        init = core.Net('sync_barrier_init_net')
        model._sync_barrier_net = _CreateBarrierNet(model, init, 'sync',
                                                    timeout_sec)
        workspace.RunNetOnce(init)
        workspace.CreateNet(model._sync_barrier_net)
        model._sync_barrier_net_timeout = timeout_sec
    assert model._sync_barrier_net_timeout == timeout_sec, (
        'Synchronize needs the same timeout every time (%s, then %s)'
        % (model._sync_barrier_net_timeout, timeout_sec))
    workspace.RunNet(model._sync_barrier_net)


# ----------------------------------------------------------- conversions --

def ConvertNetForDevice(net, device=None):
    """A copy of ``net`` whose blobs are under the device's name scope
    (``cpu_<d>/``) and whose ops carry the device option, for appending a
    net built elsewhere to a replica."""
    mnet = copy.deepcopy(net)
    if device is None:
        device = scope.CurrentDeviceScope()
    if device is None:
        device = core.DeviceOption(caffe2_pb2.CPU, 0)
    if core.IsGPUDeviceType(device.device_type):
        prefix = 'gpu'
    elif device.device_type == caffe2_pb2.IDEEP:
        prefix = 'ideep'
    else:
        prefix = 'cpu'
    ns = '%s_%d/' % (prefix, device.device_id)
    proto = mnet.Proto()
    for op in proto.op:
        if 'RecurrentNetwork' in op.type:
            raise NotImplementedError(
                'ConvertNetForDevice: RecurrentNetwork ops are not converted')
        op.input[:] = [ns + b for b in op.input]
        op.output[:] = [ns + b for b in op.output]
        op.control_input[:] = [ns + b for b in op.control_input]
        op.device_option.CopyFrom(device)
    proto.external_input[:] = [ns + b for b in proto.external_input]
    proto.external_output[:] = [ns + b for b in proto.external_output]
    return mnet


def _ForEachDevice(devices, f, device_type, device_prefix, scoped=False,
                   *args, **kwargs):
    for device in devices:
        with core.DeviceScope(core.DeviceOption(device_type, device)):
            if scoped:
                with core.NameScope('%s_%d' % (device_prefix, device)):
                    f(device, *args, **kwargs)
            else:
                f(device, *args, **kwargs)


def _AddGradientOperators(devices, model, losses_by_device):
    loss_grad = {}
    for device in devices:
        with core.DeviceScope(core.DeviceOption(model._device_type, device)):
            for loss in losses_by_device[device]:
                grad = model.ConstantFill(loss, str(loss) + '_grad', value=1.0)
                loss_grad[str(loss)] = str(grad)
    model.AddGradientOperators(loss_grad)


def ExtractPredictorNet(model, inputs, outputs, device):
    """``(predict net, parameters)`` of the first replica, with its blobs
    renamed without the replica's scope."""
    prefix = '%s_%d/' % (model._device_prefix, model._devices[0])
    prefixed_in = [prefix + str(b) for b in inputs]
    prefixed_out = [prefix + str(b) for b in outputs]
    return model_helper.ExtractPredictorNet(
        net_proto=model.net.Proto(), input_blobs=prefixed_in,
        output_blobs=prefixed_out, device=device,
        renames=dict(zip(prefixed_in + prefixed_out,
                         list(map(str, inputs)) + list(map(str, outputs)))))


# ----------------------------------------------------------- checkpoints --

def GetCheckpointParams(model):
    """The blobs a checkpoint needs: the first replica's parameters and the
    other blobs its init net makes (momentum, Adam's moments, ...), and the
    iteration counters outside the replicas' scopes."""
    all_blobs, _ = _ComputeBlobsToSync(model)
    first = '%s_%d/' % (model._device_prefix, model._devices[0])
    blobs = {b for b in all_blobs if str(b).startswith(first)}
    for op in model.net.Proto().op:
        if op.type in ('Iter', 'AtomicIter'):
            if not op.output[0].startswith(model._device_prefix + '_'):
                blobs.add(core.BlobReference(op.output[0]))
    return blobs


def _checkpoint_sync(model, blobs=None):
    if blobs is None:
        _, names = _ComputeBlobsToSync(model)
    else:
        names = [stripBlobName(b) for b in blobs]
    for name in names:
        if name not in model._device_grouped_blobs:
            model._device_grouped_blobs[name] = {
                d: core.BlobReference('%s_%d%s%s' % (
                    model._device_prefix, d, scope._NAMESCOPE_SEPARATOR, name))
                for d in model._devices}
    net = core.Net('checkpoint_sync_net')
    init = None
    if model._rendezvous is not None and _num_shards(model._rendezvous) > 1:
        init = core.Net('checkpoint_init_net')
    _SyncAllParams(model._devices, model, init, net, model._rendezvous,
                   names, max_concurrent_distributed_ops=1)
    return init, net


def CheckpointSyncNet(model, blobs=None):
    """The net a data-parallel Job runs at the start of every epoch: it
    (re)creates the model's common worlds (a resumed Job skips its init
    group, and worlds are not in checkpoints), broadcasts the first
    replica's blobs (``GetCheckpointParams``) from shard 0 to the other
    shards and copies them to the other replicas, as
    ``FinalizeAfterCheckpoint`` does after a load. So every replica of
    every shard starts each epoch equal, whatever the checkpoint held and
    however many replicas the resumed Job has."""
    if blobs is None:
        _, names = _ComputeBlobsToSync(model)
    else:
        names = [stripBlobName(b) for b in blobs]
    prefix, devices = model._device_prefix, model._devices
    net = core.Net('%s_epoch_sync' % model.net.Proto().name)
    net.Proto().op.extend(op for op in model.param_init_net.Proto().op
                          if op.type in ('CreateCommonWorld', 'CloneCommonWorld'))
    rv = model._rendezvous
    first = ['%s_%d/%s' % (prefix, devices[0], n) for n in sorted(names)]
    if rv is not None and _num_shards(rv) > 1:
        cw = _CreateOrCloneCommonWorld(net, 'epoch_sync_cw', rendezvous=rv)
        for b in first:
            net.Broadcast([cw, b], [b], engine=rv['engine'])
    for name, b in zip(sorted(names), first):
        for d in devices[1:]:
            net.Copy(b, '%s_%d/%s' % (prefix, d, name))
    return net


def FinalizeAfterCheckpoint(model, blobs=None, cpu_mode=False):
    """Copies the first replica's blobs (loaded from a checkpoint made of
    ``GetCheckpointParams``) to the other replicas and shards; call it
    after loading."""
    if not hasattr(model, '_checkpoint_net'):
        init, model._checkpoint_net = _checkpoint_sync(model, blobs)
        if init is not None:
            workspace.RunNetOnce(init)
        workspace.CreateNet(model._checkpoint_net)
    workspace.RunNet(model._checkpoint_net.Proto().name)


def GetLearningRateBlobNames(model):
    """The optimizer's learning-rate blobs (or the outputs of the model's
    ``LearningRate`` ops, with a ``param_update_builder_fun``)."""
    if getattr(model, '_optimizer', None) is not None:
        return [model._optimizer.get_cpu_blob_name('lr')]
    return [op.output[0] for op in model.net.Proto().op
            if op.type == 'LearningRate']


# ---------------------------------------------------------- syncs (local) --

def _Broadcast(devices, model, net, param):
    master = model._device_grouped_blobs[param][devices[0]]
    for d in devices[1:]:
        with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU, 0)):
            net.Copy(master, model._device_grouped_blobs[param][d])


def _AllReduce(devices, model, net, param):
    """Sums the replicas' blobs into the first one's (a tree of ``Sum``
    ops, as Caffe2's), then copies the sum to the others."""
    group = [model._device_grouped_blobs[param][d] for d in devices]

    def sum_into_first(*idx):
        with core.DeviceScope(core.DeviceOption(model._device_type, devices[idx[0]])):
            net.Sum([group[i] for i in idx], [group[idx[0]]], name='dpm')

    n = len(devices)
    if n in (4, 8, 16):
        step = 1
        while step < n:
            for j in range(0, n, 2 * step):
                sum_into_first(j, j + step)
            step *= 2
    else:
        sum_into_first(*range(n))
    _Broadcast(devices, model, net, param)


def _SyncAllParams(devices, model, init_net, net, rendezvous, unique_param_names,
                   max_concurrent_distributed_ops=4):
    if rendezvous is None or _num_shards(rendezvous) <= 1:
        for param in unique_param_names:
            _Broadcast(devices, model, net, param)
    else:
        _SyncAllParamsDistributed(devices, model, init_net, net, rendezvous,
                                  unique_param_names,
                                  max_concurrent_distributed_ops)


def AddBlobSync(model, blobs, net=None):
    """Keeps ``blobs`` (names without a replica's scope) equal on every
    replica and shard: the first replica's value is copied (broadcast) to
    the others at the end of each iteration of ``net`` (``model.net``)."""
    if len(blobs) == 0:
        return
    net = model.net if net is None else net
    for b in blobs:
        assert not b.startswith(model._device_prefix), (
            'AddBlobSync takes blob names without the replica scope: %s' % b)
        model._device_grouped_blobs[b] = {
            d: core.BlobReference('%s_%d/%s' % (model._device_prefix, d, b))
            for d in model._devices}
    _SyncAllParams(model._devices, model, model.param_init_net, net,
                   model._rendezvous, set(blobs))


def AddDistributedBlobSync(model, blobs):
    """Sums ``blobs`` across shards (not across replicas) in every
    iteration."""
    if model._rendezvous is None:
        return
    cw = _CreateOrCloneCommonWorld(
        model.param_init_net, 'blob_sync_cw_' + '_'.join(str(b) for b in blobs),
        rendezvous=model._rendezvous)
    model.net.Allreduce(inputs=[cw] + list(blobs), outputs=list(blobs),
                        engine=model._rendezvous['engine'])


# ---------------------------------------------------- syncs (distributed) --

class CollectivesConcurrencyControl(object):
    """Common worlds for collectives, up to ``max_concurrent_context`` of
    them, reused in turn (Caffe2 chained the collectives sharing a world by
    control inputs; ferrocaffe's nets run their ops in order, which does
    the same)."""

    def __init__(self, name, max_concurrent_context, param_init_net, rendezvous):
        self.name = name
        self.param_init_net = param_init_net
        self.max_concurrent_context = max(1, int(max_concurrent_context))
        self.counter = 0
        self.common_worlds = []
        self.control_inputs = []
        self.rendezvous = rendezvous

    def get_control_and_context(self, control_output_blob):
        slot = self.counter % self.max_concurrent_context
        control_input = None
        if len(self.common_worlds) < self.max_concurrent_context:
            cw = _CreateOrCloneCommonWorld(
                self.param_init_net, '%s_%d_cw' % (self.name, slot),
                rendezvous=self.rendezvous)
            self.common_worlds.append(cw)
            self.control_inputs.append(control_output_blob)
        else:
            cw = self.common_worlds[slot]
            control_input = self.control_inputs[slot]
            self.control_inputs[slot] = control_output_blob
        self.counter += 1
        return cw, control_input


def _SyncAllParamsDistributed(devices, model, init_net, net, rendezvous,
                              unique_param_names, max_concurrent_distributed_ops):
    assert _num_shards(rendezvous) > 1
    if model._broadcast_context is None:
        model._broadcast_context = CollectivesConcurrencyControl(
            'broadcast', max_concurrent_distributed_ops, init_net, rendezvous)
    context = model._broadcast_context
    for name in sorted(unique_param_names):
        group = [model._device_grouped_blobs[name][d] for d in devices]
        cw, _ = context.get_control_and_context(group[0])
        with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU)):
            net.Broadcast(inputs=[cw] + group, outputs=group, name=name,
                          engine=rendezvous['engine'])


def _AllReduceBlobs(blob_names, devices, model, net, rendezvous,
                    max_concurrent_distributed_ops):
    if rendezvous is None or _num_shards(rendezvous) <= 1:
        _AllReduceBlobsSingleHost(blob_names, devices, model, net)
    else:
        _AllReduceBlobsDistributed(blob_names, devices, model, net, rendezvous,
                                   max_concurrent_distributed_ops)


def _AllReduceBlobsDistributed(blob_names, devices, model, net, rendezvous,
                               max_concurrent_distributed_ops):
    context = CollectivesConcurrencyControl(
        'allreduce', max_concurrent_distributed_ops, model.param_init_net,
        rendezvous)
    concatenated = set()
    for name in blob_names:
        group = [model._device_grouped_blobs[name][d] for d in devices]
        with core.DeviceScope(core.DeviceOption(model._device_type, devices[0])):
            if isinstance(group[0], core.GradientSlice):
                _GatherSlices(name, group, devices, model, net, concatenated,
                              context, rendezvous)
                continue
            cw, _ = context.get_control_and_context(group[0])
            # One op sums the replicas' gradients and the shards' (Gloo's
            # semantics: every input is a local copy).
            net.Allreduce(inputs=[cw] + group, outputs=group, name=name,
                          engine=rendezvous['engine'])


def _AllReduceBlobsSingleHost(blob_names, devices, model, net):
    if len(devices) == 1:
        return
    concatenated = set()
    for name in blob_names:
        group = [model._device_grouped_blobs[name][d] for d in devices]
        if len(group) == 1:
            continue
        assert len(group) == len(devices), (
            'every replica of %s needs a copy of %s' % (devices, name))
        if isinstance(group[0], core.GradientSlice):
            _GatherSlices(name, group, devices, model, net, concatenated)
        else:
            with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU)):
                net.Sum(group, [group[0]], name='dpm')
                if not model._shared_model:
                    _Broadcast(devices, model, net, name)


def _GatherSlices(name, group, devices, model, net, concatenated,
                  context=None, rendezvous=None):
    """A sparse gradient: every replica gets the rows of all of them
    (indices and values concatenated in replica order, then in shard
    order), so that every replica's sparse update applies all the rows,
    as one replica given the whole batch would."""
    master = '%s_%d' % (model._device_prefix, devices[0])
    pieces = []
    for part in ('indices', 'values'):
        blobs = [getattr(g, part) for g in group]
        if part == 'indices' and any(str(b) in concatenated for b in blobs):
            continue  # gathered already (a parameter sharing these indices)
        tag = 'index' if part == 'indices' else 'val'
        out = '%s/%s_%s_concat' % (master, name, tag)
        if len(blobs) > 1:
            out, _ = net.Concat(blobs, [out, '%s/%s_%s_splitinfo' % (master, name, tag)],
                                axis=0, name='note:data_parallel_model')
        else:
            out = net.Copy(blobs[0], out)
        if rendezvous is not None:
            cw, _ = context.get_control_and_context(out)
            gathered = net.Allgather([cw, out], [str(out) + '_gathered'],
                                     engine=rendezvous['engine'])
            shape = ([-1] if part == 'indices' else
                     [-1] + list(_value_row_shape(model, blobs[0])))
            out, _ = net.Reshape([gathered], [str(out) + '_all',
                                              str(out) + '_all_old_shape'],
                                 shape=shape)
        pieces.append((part, out, blobs))
    for part, out, blobs in pieces:
        for b in blobs:
            net.Copy(out, b)
            if part == 'indices':
                concatenated.add(str(b))


def _value_row_shape(model, values_blob):
    """The shape of one row of a sparse gradient's values: the gathered
    parameter's row (its dims after the first)."""
    for p, g in model.param_to_grad.items():
        if isinstance(g, core.GradientSlice) and str(g.values) == str(values_blob):
            ws_shape = _param_shape(model, p)
            if ws_shape is not None:
                return ws_shape[1:]
    raise NotImplementedError(
        'data_parallel_model: cannot tell the row shape of sparse gradient '
        '%s for an Allgather across shards' % values_blob)


def _param_shape(model, param):
    for op in model.param_init_net.Proto().op:
        if str(param) in op.output:
            for a in op.arg:
                if a.name == 'shape':
                    return list(a.ints)
    return None


def _BroadcastComputedParams(devices, model, rendezvous):
    if len(devices) == 1:
        return
    if (rendezvous is not None and _num_shards(rendezvous) > 1
            and model._computed_param_names):
        log.warning('data_parallel_model: computed params are copied between '
                    'replicas, not broadcast across shards (as in Caffe2)')
    for name in model._computed_param_names:
        _Broadcast(devices, model, model.net, name)


def _CreateOrCloneCommonWorld(net, common_world_blob, rendezvous, name=None,
                              timeout_sec=None):
    timeout_ms = int((_DEFAULT_TIMEOUT_SEC if timeout_sec is None
                      else timeout_sec) * 1000)
    existing = None
    for op in net.Proto().op:
        if op.type != 'CreateCommonWorld':
            continue
        op_timeout = next((a.i for a in op.arg if a.name == 'timeout_ms'), -1)
        if op_timeout == timeout_ms:
            existing = op.output[0]
            break
    name = name or '%s_op' % common_world_blob
    if existing is not None:
        return net.CloneCommonWorld([existing], common_world_blob, name=name,
                                    engine=rendezvous['engine'])
    kwargs = {k: rendezvous[k] for k in ('transport', 'interface', 'mpi_rendezvous')
              if k in rendezvous}
    return net.CreateCommonWorld(
        rendezvous.get('kv_handler') or [], common_world_blob, name=name,
        size=_num_shards(rendezvous), rank=int(rendezvous['shard_id']),
        engine=rendezvous['engine'], timeout_ms=timeout_ms, **kwargs)


# ------------------------------------------------------ shared parameters --

def _PruneParametersForSharing(model):
    assert model._shared_model
    master = '%s_%d/' % (model._device_prefix, model._devices[0])
    model.params = model.GetParams(master)
    kept = set(model.params)
    model.param_to_grad = {p: g for p, g in model.param_to_grad.items() if p in kept}
    model.weights = [w for w in model.weights if w in kept]
    model.biases = [b for b in model.biases if b in kept]


def _RemapParameterBlobsForSharedModel(model, all_params):
    assert model._shared_model
    master = '%s_%d/' % (model._device_prefix, model._devices[0])
    all_params = {str(p) for p in all_params}
    master_params = {str(p) for p in model.GetParams()}

    def remap(net):
        kept = []
        for op in net.Proto().op:
            if any(o in all_params and o not in master_params for o in op.output):
                continue
            for i, b in enumerate(op.input):
                if b in all_params and b not in master_params:
                    op.input[i] = master + stripBlobName(b)
            kept.append(op)
        del net.Proto().op[:]
        net.Proto().op.extend(kept)

    remap(model.param_init_net)
    remap(model.net)


# ---------------------------------------------------------------- helpers --

def stripBlobName(param):
    """A blob's name without its first scope (``cpu_0/fc_w`` -> ``fc_w``)."""
    if isinstance(param, core.GradientSlice):
        return stripBlobName(param.indices) + ':' + stripBlobName(param.values)
    name = str(param)
    return name[name.index(scope._NAMESCOPE_SEPARATOR) + 1:]


def _InferBlobDevice(model):
    mapping = {}

    def visit(proto):
        for op in proto.op:
            option = op.device_option
            if op.type == 'Iter':
                option = caffe2_pb2.DeviceOption()
                option.device_type = caffe2_pb2.CPU
            for b in list(op.input) + list(op.output):
                mapping.setdefault(b, option)
    visit(model.param_init_net.Proto())
    visit(model.net.Proto())
    model._blob_to_device = mapping


def _IsGPUBlob(model, blob_name):
    return False


def _IsIDEEPBlob(model, blob_name):
    return False


def _GroupByDevice(model, devices, params, non_data_params):
    """``{name without scope: {device: blob}}`` of the data-parallel blobs
    (those after ``non_data_params``), in order."""
    grouped = OrderedDict()
    prefix = model._device_prefix
    for p in params[len(non_data_params):]:
        assert isinstance(p, (core.BlobReference, core.GradientSlice)), (
            'Param %s is not a BlobReference or GradientSlice' % (p,))
        ref = p.indices if isinstance(p, core.GradientSlice) else p
        device = _replica_of(str(ref), prefix)
        assert device is not None, (
            "Param %s has no replica scope '%s_<d>/'" % (p, prefix))
        if isinstance(p, core.GradientSlice):
            assert _replica_of(str(p.values), prefix) == device, (
                'the indices and values of %s are in different replicas' % (p,))
        grouped.setdefault(stripBlobName(p), {})[device] = p
    return grouped


def _ValidateParams(params):
    seen, dupes = set(), []
    for p in params:
        if p in seen:
            dupes.append(p)
        seen.add(p)
    assert not dupes, 'Duplicate entries in params: %s' % dupes


def _ComputeBlobsToSync(model):
    """The data-parallel blobs the param init net makes (parameters,
    momentum, ...), first replica first, and their names without scope."""
    prefix = model._device_prefix + '_'
    if model._shared_model:
        blobs = [str(p) for p in model.GetComputedParams('')]
        names = [stripBlobName(b) for b in blobs]
    else:
        blobs, names = [], set()
        for op in model.param_init_net.Proto().op:
            outs = [o for o in op.output if o.startswith(prefix)]
            names.update(stripBlobName(o) for o in outs)
            blobs.extend(outs)
        missing = set(model._param_names) - names
        assert not missing, ('parameters not made by the param init net: %s'
                             % sorted(missing))

    def key(b):
        return (int(b[len(prefix):b.index(scope._NAMESCOPE_SEPARATOR)]), b)

    return [core.BlobReference(b) for b in sorted(set(blobs), key=key)], names


def OptimizeGradientMemory(model, input_shapes, excluded_blobs,
                           recycle_activations):
    """Caffe2 shared gradient buffers (memonger); accepted, changes nothing
    here (a replaced blob's buffer is freed at once)."""
    log.info('data_parallel_model.OptimizeGradientMemory changes nothing on '
             'ferrocaffe')


def _InterleaveOps(model):
    """Puts the replicas' ops side by side (op j of every replica, then op
    j + 1 ...), so that ops that combine the replicas find their inputs."""
    ops = list(model.net.Proto().op)
    n = len(model._devices)
    per = len(ops) // n
    assert per * n == len(ops), (
        'the replicas have different numbers of ops; cannot interleave them')
    by_device = {d: [] for d in range(n)}
    for op in ops:
        by_device[op.device_option.device_id].append(op)
    interleaved = []
    for j in range(per):
        kind = None
        for d in model._devices:
            op = by_device[d][j]
            kind = kind or op.type
            assert op.type == kind, 'op type mismatch: %s / %s' % (kind, op.type)
            interleaved.append(op)
    del model.net.Proto().op[:]
    model.net.Proto().op.extend(interleaved)


def _CPUInterDeviceBatchNormalization(model):
    """``combine_spatial_bn``: SpatialBN and its gradient use the
    statistics of all the replicas' batches (``ChannelStats`` /
    ``ChannelBackpropStats`` per replica, summed, and ``num_batches``)."""
    n = len(model._devices)
    out, pending, bn_ops = [], [], []
    stats_sums, stats_sumsq = [], []
    scale_grads, bias_grads = [], []
    first_input = None
    phase = None

    def flush():
        nonlocal pending, bn_ops, stats_sums, stats_sumsq, scale_grads, \
            bias_grads, first_input, phase
        out.extend(pending)
        if phase == 'bn':
            out.append(core.CreateOperator('Sum', stats_sums, first_input + '_sums_combined'))
            out.append(core.CreateOperator('Sum', stats_sumsq, first_input + '_sumsq_combined'))
        elif phase == 'grad':
            for grads in (scale_grads, bias_grads):
                combined = 'cpu_0/' + stripBlobName(grads[0]) + '_combined'
                out.append(core.CreateOperator('Sum', grads, combined))
                out.extend(core.CreateOperator('Copy', combined, g) for g in grads)
        out.extend(bn_ops)
        pending, bn_ops, stats_sums, stats_sumsq = [], [], [], []
        scale_grads, bias_grads, first_input, phase = [], [], None, None

    for op in list(model.net.Proto().op):
        if op.type == 'SpatialBN':
            if phase == 'grad':
                flush()
            phase = 'bn'
            first_input = first_input or op.input[0]
            x = op.input[0]
            pending.append(core.CreateOperator('ChannelStats', x, [x + '_sums', x + '_sumsq']))
            stats_sums.append(x + '_sums')
            stats_sumsq.append(x + '_sumsq')
            op.input.extend([first_input + '_sums_combined',
                             first_input + '_sumsq_combined'])
            op.arg.extend([utils.MakeArgument('num_batches', n)])
            bn_ops.append(op)
        elif op.type == 'SpatialBNGradient':
            if phase == 'bn':
                flush()
            phase = 'grad'
            pending.append(core.CreateOperator(
                'ChannelBackpropStats',
                [op.input[0], op.input[3], op.input[4], op.input[2]],
                [op.output[1], op.output[2]]))
            scale_grads.append(op.output[1])
            bias_grads.append(op.output[2])
            op.arg.extend([utils.MakeArgument('num_batches', n)])
            op.input.extend([op.output[1], op.output[2]])
            bn_ops.append(op)
        else:
            if phase is not None:
                flush()
            out.append(op)
    if phase is not None:
        flush()
    del model.net.Proto().op[:]
    model.net.Proto().op.extend(out)


# ------------------------------------------------------------------- jobs --

def _job_checkpoint_blobs(model):
    """GetCheckpointParams, and what the init net makes outside the
    replicas' scopes (the iteration mutex, constants), which a resumed Job
    (no init group) needs too; common worlds are made again instead."""
    names = {str(b) for b in GetCheckpointParams(model)}
    prefix = model._device_prefix + '_'
    for op in model.param_init_net.Proto().op:
        if op.type in ('CreateCommonWorld', 'CloneCommonWorld'):
            continue
        names.update(o for o in op.output if not o.startswith(prefix))
    return sorted(names)


def CheckpointManager(models, db_prefix, db_type='ferro', metadata_handler=None):
    """A checkpoint manager for a data-parallel Job whose nodes each train
    a shard: ``models`` is ``{node name: its model}`` (Parallelize with
    ``rendezvous['shard_id']``; one node and ``rendezvous=None`` for one
    machine). The node of shard 0 saves ``GetCheckpointParams(model)``, one
    copy of the parameters and optimizer state and the iteration counter;
    Every model's node saves ``GetCheckpointParams(model)``: one copy of
    the parameters, the optimizer's state and the iteration counter (the
    first replica's), not one per replica, and the few blobs its init net
    makes outside the replicas (the iteration's mutex, constants). The Job runs
    ``CheckpointSyncNet(model)`` at the start of every epoch, which
    broadcasts shard 0's copy and copies it to every replica: so a Job
    resumes exactly, and with another number of replicas per node too.
    Nodes without a model (the Job's own) are checkpointed whole."""
    names = {str(node): _job_checkpoint_blobs(model)
             for node, model in models.items()}

    class _Fixed(_manager.CheckpointManager):
        def __init__(self, blob_names, **kwargs):
            _manager.CheckpointManager.__init__(self, **kwargs)
            self._fixed = list(blob_names)

        def init(self, nodes=None, retrieve_from_epoch=None, path_prefix=None,
                 path_type=None):
            # The same list from scratch and when resuming (its names do
            # not depend on the number of replicas).
            with _Task(outputs=[self._blob_names]) as task:
                _ops.GivenTensorStringFill([], [self._blob_names],
                                          shape=[len(self._fixed)],
                                          values=self._fixed)
            self._names_output = task.outputs()[0]
            return task

    class _Manager(_manager.MultiNodeCheckpointManager):
        def _create_managers(self, nodes):
            self._node_managers = []
            for node in nodes:
                kwargs = dict(db_prefix=self._db_prefix, node_name=str(node),
                              db_type=self._db_type, _names_blob='%s/%s' % (
                                  node, _manager.CheckpointManager.BLOB_NAMES))
                with _Node(node):
                    # A node without a model (the Job's own 'local' node)
                    # is checkpointed whole, as usual.
                    manager = (_Fixed(names[str(node)], **kwargs)
                               if str(node) in names else
                               _manager.CheckpointManager(**kwargs))
                    self._node_managers.append((node, manager))

    return _Manager(db_prefix, db_type, metadata_handler)

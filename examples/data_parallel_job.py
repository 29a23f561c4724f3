"""The main job's model (examples/train_job.py) trained data-parallel:
two Ray nodes, started by this script on loopback addresses, each run one
Node of a RaySession; each Node trains two replicas of the network
(Caffe2's ``data_parallel_model.Parallelize_CPU`` with a ``rendezvous`` of
two shards), and the gradients are summed over the 4 replicas every
iteration (``Allreduce`` over Ray). Same data, network, global batch (64),
optimizer and 20 epochs as the main job, in a checkpointed Job; the exit
group evaluates the 360 held-out digits; at least 95% is required.

    python examples/data_parallel_job.py             # resumes if it can
    python examples/data_parallel_job.py --fresh     # start over
    python examples/data_parallel_job.py --replicas 1   # resume with 1 replica per node

Ctrl-C and rerun: it resumes from the last checkpoint, with any number of
replicas (the checkpoint holds one copy of the parameters,
``GetCheckpointParams``). ``--ray-address HOST:PORT`` joins an existing
cluster instead of starting one.
"""

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
try:
    import ferrocaffe  # noqa: F401
except ImportError:  # run from a checkout
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), 'python'))

import train_job  # noqa: E402
from ferrocaffe import (  # noqa: E402
    brew, core, data_parallel_model as dpm, model_helper, optimizer)
from ferrocaffe.checkpoint import (  # noqa: E402
    FileMetadataHandler, Job, JobRunner, epoch_limiter)
from ferrocaffe.file_reader import NpyReader  # noqa: E402
from ferrocaffe.net_builder import ops  # noqa: E402
from ferrocaffe.task import Node, Task  # noqa: E402

SHARDS = 2
DEFAULT_WORKDIR = os.path.join(tempfile.gettempdir(), 'ferrocaffe_dp_job')


def shard_path(workdir, shard, field):
    return os.path.join(workdir, 'data', 'shard%d_%s.npy' % (shard, field))


def make_data(cfg):
    """The main job's split, the training rows dealt to the shards."""
    train_job.make_data(cfg)
    x = np.load(cfg.data_path('train', 'data'))
    y = np.load(cfg.data_path('train', 'label'))
    for s in range(SHARDS):
        for field, a in (('data', x[s::SHARDS]), ('label', y[s::SHARDS])):
            path = shard_path(cfg.workdir, s, field)
            if not os.path.exists(path):
                np.save(path + '.partial.npy', a)
                os.replace(path + '.partial.npy', path)


def build_model(cfg, shard, replicas, iters_per_epoch):
    model = model_helper.ModelHelper(name='dp_train')
    reader = NpyReader([('data', shard_path(cfg.workdir, shard, 'data')),
                        ('label', shard_path(cfg.workdir, shard, 'label'))],
                       batch_size=cfg.batch_size // (SHARDS * replicas),
                       name='train_reader')
    # The reader is made again at the start of every epoch (a fresh pass;
    # a resumed Job, which skips its init group, has one too).
    setup = core.Net('train_reader_setup')
    reader.setup_ex(setup, None)

    def add_input(m):  # each replica reads its own batch of the shard
        _, (data, label) = reader.read(m.net)
        m.net.StopGradient(data, 'data')
        m.net.StopGradient(label, 'label')

    def forward(m, loss_scale):
        pred = cfg.network.add_layers(m, core.ScopedBlobReference('data'))
        softmax, loss = m.net.SoftmaxWithLoss([pred, 'label'], ['softmax', 'loss'])
        m.Accuracy([softmax, 'label'], 'accuracy')
        return [m.net.Scale(loss, 'scaled_loss', scale=loss_scale)]

    def add_optimizer(m):
        return optimizer.build_sgd(m, base_learning_rate=cfg.lr,
                                   momentum=cfg.momentum, policy='step',
                                   stepsize=10 * iters_per_epoch, gamma=0.1)

    dpm.Parallelize_CPU(
        model, input_builder_fun=add_input, forward_pass_builder_fun=forward,
        optimizer_builder_fun=add_optimizer, devices=list(range(replicas)),
        rendezvous={'num_shards': SHARDS, 'shard_id': shard, 'engine': 'GLOO',
                    'kv_handler': None})
    for i, op in enumerate(model.param_init_net.Proto().op):
        op.device_option.random_seed = cfg.seed * 1000 + i + 1
    return model, setup


def build_job(cfg, replicas):
    make_data(cfg)
    rows = len(np.load(shard_path(cfg.workdir, SHARDS - 1, 'label'), mmap_mode='r'))
    iters = rows // (cfg.batch_size // SHARDS)
    models = {}
    with Job() as job:
        for s in range(SHARDS):
            node = 'trainer_%d' % s
            with Node(node, num_cpus=1):
                model, reader_setup = build_model(cfg, s, replicas, iters)
                with job.init_group, Task(name='init_%d' % s):
                    ops.net(model.param_init_net)
                with job.epoch_group, Task(name='epoch_%d' % s):
                    ops.net(reader_setup)
                    ops.net(dpm.CheckpointSyncNet(model))
                    ops.net(dpm.ParallelStep(model, iters))
                models[node] = model
        epoch_limiter(job, cfg.epochs)
        with Node('trainer_0'), job.exit_group, Task(name='evaluate'):
            test_reader = train_job.make_reader(cfg, 'test', train_job.TEST_IMAGES,
                                                'test_reader')
            net = core.Net('read_test_data')
            test_reader.setup_ex(net, None)
            _, (data, label) = test_reader.read(net)
            test = model_helper.ModelHelper(name='test', init_params=False)
            with core.NameScope('cpu_0'):  # the first replica's parameters
                pred = cfg.network.add_layers(test, data)
                softmax = brew.softmax(test, pred, 'test_softmax')
            test.Accuracy([softmax, label], 'test_accuracy')
            ops.net(net)
            ops.net(test.net)
            params = sorted(str(b) for b in dpm.GetCheckpointParams(models['trainer_0'])
                            if not str(b).endswith('_momentum')
                            and str(b).startswith('cpu_0/'))
            ops.Save(params + ['test_accuracy'], [], db=cfg.model_path,
                     db_type='ferro', absolute_path=True)
    return job, models


def start_ray_nodes():
    """A head on 127.0.0.3 and a second Ray node on 127.0.0.2 (Ray keeps
    these loopback addresses; it would swap 127.0.0.1 for the public one),
    each started with ``ray start --block`` and stopped by ending it."""
    ray_bin = os.path.join(os.path.dirname(sys.executable), 'ray')
    ray_bin = ray_bin if os.path.exists(ray_bin) else shutil.which('ray')
    with socket.socket() as sock:
        sock.bind(('127.0.0.3', 0))
        port = sock.getsockname()[1]
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(ferrocaffe.__file__)))
    env = dict(os.environ, PYTHONPATH=pkg + os.pathsep + os.environ.get('PYTHONPATH', ''))
    address = '127.0.0.3:%d' % port
    procs = []
    for args in (['--head', '--node-ip-address=127.0.0.3', '--port=%d' % port,
                  '--include-dashboard=false'],
                 ['--address=' + address, '--node-ip-address=127.0.0.2']):
        procs.append(subprocess.Popen(
            [ray_bin, 'start', '--block', '--disable-usage-stats',
             '--num-cpus=1'] + args, env=env, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL))
        time.sleep(3 if len(procs) == 1 else 0)
    return address, procs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--workdir', default=DEFAULT_WORKDIR)
    p.add_argument('--epochs', type=int, default=20)
    p.add_argument('--replicas', type=int, default=2, help='per node')
    p.add_argument('--fresh', action='store_true')
    p.add_argument('--ray-address', default=None)
    args = p.parse_args(argv)
    cfg = train_job.Config(workdir=args.workdir, epochs=args.epochs)
    if args.fresh and os.path.isdir(cfg.workdir):
        shutil.rmtree(cfg.workdir)
    import ray
    from ferrocaffe.distributed import RaySession
    procs = []
    address = args.ray_address
    try:
        if address is None:
            address, procs = start_ray_nodes()
        deadline = time.time() + 90
        while True:
            try:
                ray.init(address=address, _node_ip_address='127.0.0.3',
                         log_to_driver=False)
                if len([n for n in ray.nodes() if n['Alive']]) >= 2:
                    break
                ray.shutdown()
            except Exception:
                if time.time() > deadline:
                    raise
            time.sleep(1)
        job, models = build_job(cfg, args.replicas)
        runner = JobRunner(job, dpm.CheckpointManager(
            models, cfg.checkpoint_dir,
            metadata_handler=FileMetadataHandler(max_to_keep=3)),
            resume_from_epoch='latest')
        session = RaySession()
        start = time.time()
        try:
            last = runner.train(session)
            where = {n: session.node_info(n)['ray_node_id'][:8] for n in models}
        finally:
            session.close()
        model = train_job.read_model(cfg.model_path)
        acc = float(model['test_accuracy'])
        if runner.resumed_from_epoch is not None:
            print('resumed from epoch %d' % runner.resumed_from_epoch)
        print('trained through epoch %d in %.1fs on %d nodes x %d replicas '
              '(Ray nodes %s)' % (last, time.time() - start, SHARDS,
                                  args.replicas, where))
        print('test accuracy %.2f%% on %d held-out digits' % (
            100 * acc, train_job.TEST_IMAGES), flush=True)
        return 0 if acc >= 0.95 else 1
    except KeyboardInterrupt:
        print('interrupted: run the same command again to resume',
              file=sys.stderr)
        return 130
    finally:
        if ray.is_initialized():
            ray.shutdown()
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        if procs:
            # `ray start` records its cluster for later ray.init() calls to
            # join; ours is gone, so is the record (as `ray stop` does).
            record = os.path.join(tempfile.gettempdir(), 'ray', 'ray_current_cluster')
            try:
                with open(record) as f:
                    if f.read().strip() == address:
                        os.unlink(record)
            except OSError:
                pass


if __name__ == '__main__':
    sys.exit(main())

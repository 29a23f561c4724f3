"""Data-parallel training figures (BENCHMARKS.md, "Data-parallel training"):

* all-reduce of 1, 16 and 64 MB of float32 between two RaySession nodes
  (the ``Allreduce`` op, over Ray actor calls), against the raw transport
  (one Ray actor call carrying the array to the other process); with
  ``--torch-gloo`` (run with a Python that has torch), the same sizes with
  ``ray.util.collective``'s gloo backend (torch.distributed), the measured
  alternative;
* samples/s of the MLP training step (examples/train_job.py's network,
  global batch 64): 1 replica, 2 replicas (concurrent substeps), 2 Ray
  nodes x 1 replica.

    PYTHONPATH=python python benches/bench_data_parallel.py
"""

import argparse
import os
import sys
import time

import numpy as np
import ray

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), 'python'))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), 'examples'))

SIZES_MB = (1, 16, 64)


def gbps(nbytes, seconds):
    return nbytes / seconds / 1e9


def raw_transport(reps):
    @ray.remote
    class Sink(object):
        def take(self, a):
            return a.nbytes

    sink = Sink.remote()
    ray.get(sink.take.remote(np.zeros(1, np.float32)))
    out = {}
    for mb in SIZES_MB:
        a = np.ones(mb * (1 << 20) // 4, np.float32)
        ray.get(sink.take.remote(a))
        t = time.perf_counter()
        for _ in range(reps):
            ray.get(sink.take.remote(a))
        out[mb] = gbps(a.nbytes, (time.perf_counter() - t) / reps)
    ray.kill(sink)
    return out


def ferro_allreduce(reps):
    from ferrocaffe.distributed import RaySession
    from ferrocaffe.net_builder import ops
    from ferrocaffe.task import Node, Task, TaskGroup, WorkspaceType
    session = RaySession()
    out = {}
    try:
        with TaskGroup(WorkspaceType.GLOBAL) as init:
            for r in range(2):
                with Node('ar%d' % r), Task(name='cw%d' % r):
                    ops.CreateCommonWorld([], 'cw', size=2, rank=r)
        session.run(init)
        for mb in SIZES_MB:
            n = mb * (1 << 20) // 4
            with TaskGroup(WorkspaceType.GLOBAL) as tg:
                for r in range(2):
                    with Node('ar%d' % r), Task(name='ar%d_%d' % (r, mb)):
                        x = ops.Const(np.ones(n, np.float32), 'x%d' % mb)
                        with ops.loop(reps):
                            ops.Allreduce(['cw', x], [x])
            session.run(tg)  # warm (and checks it runs)
            t = time.perf_counter()
            session.run(tg)
            out[mb] = gbps(n * 4, (time.perf_counter() - t) / reps)
    finally:
        session.close()
    return out


def torch_gloo(reps):
    import ray.util.collective as col

    @ray.remote
    class Worker(object):
        def setup(self, world, rank):
            col.init_collective_group(world, rank, backend='gloo', group_name='b')
            return True

        def run(self, n, reps):
            import torch
            x = torch.ones(n, dtype=torch.float32)
            col.allreduce(x, group_name='b')
            t = time.perf_counter()
            for _ in range(reps):
                col.allreduce(x, group_name='b')
            return (time.perf_counter() - t) / reps

    ws = [Worker.remote() for _ in range(2)]
    ray.get([w.setup.remote(2, i) for i, w in enumerate(ws)])
    out = {}
    for mb in SIZES_MB:
        n = mb * (1 << 20) // 4
        secs = max(ray.get([w.run.remote(n, reps) for w in ws]))
        out[mb] = gbps(n * 4, secs)
    for w in ws:
        ray.kill(w)
    return out


def training_rates(iters):
    from ferrocaffe import data_parallel_model as dpm, workspace
    from ferrocaffe import model_helper, optimizer
    import train_job

    cfg = train_job.Config()
    rng = np.random.RandomState(0)
    batch = 64

    def build(devices, rendezvous=None):
        model = model_helper.ModelHelper(name='bench')

        def forward(m, scale):
            from ferrocaffe import core
            pred = cfg.network.add_layers(m, core.ScopedBlobReference('data'))
            _, loss = m.net.SoftmaxWithLoss([pred, 'label'], ['sm', 'loss'])
            return [m.net.Scale(loss, 'sl', scale=scale)]

        dpm.Parallelize_CPU(model, input_builder_fun=lambda m: None,
                            forward_pass_builder_fun=forward,
                            optimizer_builder_fun=lambda m: optimizer.build_sgd(
                                m, 0.1, momentum=0.9),
                            devices=devices, rendezvous=rendezvous)
        return model

    def feeds(devices, shards=1):
        per = batch // (len(devices) * shards)
        return {'cpu_%d/%s' % (d, k): v for d in devices for k, v in (
            ('data', rng.rand(per, 64).astype(np.float32)),
            ('label', rng.randint(0, 10, per).astype(np.int32)))}

    out = {}
    for devices in ([0], [0, 1]):
        workspace.ResetWorkspace()
        model = build(devices)
        workspace.RunNetOnce(model.param_init_net)
        for k, v in feeds(devices).items():
            workspace.FeedBlob(k, v)
        dpm.RunNet(model, 5)
        t = time.perf_counter()
        dpm.RunNet(model, iters)
        out['%d replica%s' % (len(devices), 's' if len(devices) > 1 else '')] = \
            batch * iters / (time.perf_counter() - t)

    from ferrocaffe.distributed import RaySession
    from ferrocaffe.net_builder import ops
    from ferrocaffe.task import Node, Task, TaskGroup, WorkspaceType
    session = RaySession()
    try:
        models = []
        with TaskGroup(WorkspaceType.GLOBAL) as init:
            for s in range(2):
                with Node('tr%d' % s), Task(name='init%d' % s):
                    m = build([0], {'num_shards': 2, 'shard_id': s,
                                    'engine': 'GLOO', 'kv_handler': None})
                    ops.net(m.param_init_net)
                    models.append(m)
        session.run(init)
        for s in range(2):
            for k, v in feeds([0], 2).items():
                session.feed_blob('tr%d' % s, k, v)
        with TaskGroup(WorkspaceType.GLOBAL) as tg:
            for s in range(2):
                with Node('tr%d' % s):
                    Task(step=dpm.ParallelStep(models[s], iters), name='tr_%d' % s)
        session.run(tg)
        t = time.perf_counter()
        session.run(tg)
        out['2 Ray nodes x 1 replica'] = batch * iters / (time.perf_counter() - t)
    finally:
        session.close()
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--reps', type=int, default=10)
    p.add_argument('--iters', type=int, default=300)
    p.add_argument('--torch-gloo', action='store_true')
    args = p.parse_args()
    pkg = os.path.join(os.path.dirname(HERE), 'python')
    ray.init(address='local', num_cpus=2, include_dashboard=False,
             log_to_driver=False,
             _node_ip_address='127.0.0.3',
             runtime_env={'env_vars': {'PYTHONPATH': pkg}})
    try:
        if args.torch_gloo:
            print('torch gloo (ray.util.collective) all-reduce GB/s:',
                  {k: round(v, 2) for k, v in torch_gloo(args.reps).items()})
            return
        print('raw transport (one Ray actor call) GB/s:',
              {k: round(v, 2) for k, v in raw_transport(args.reps).items()})
        print('ferrocaffe Allreduce (2 nodes) GB/s:',
              {k: round(v, 2) for k, v in ferro_allreduce(args.reps).items()})
        print('MLP training step, samples/s (global batch 64):',
              {k: round(v) for k, v in training_rates(args.iters).items()})
    finally:
        ray.shutdown()


if __name__ == '__main__':
    main()

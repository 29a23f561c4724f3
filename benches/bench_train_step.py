"""One training step of the main job's network (examples/train_job.py:
64 -> 128 -> 64 -> 10, ReLU, softmax cross-entropy, SGD with Nesterov
momentum 0.9): forward, backward and update, ferrocaffe against PyTorch
eager on the CPU, at batch 64 and 256, with 1 and 2 threads.

ferrocaffe runs the net that ``model_helper``/``brew``/``build_sgd`` build
(the same ops the job runs per batch, with the optimizer's iteration
counter and learning rate), ``workspace.RunNet(net, num_iter=K)`` on fed
blobs. PyTorch runs ``nn.Sequential`` of the same layers with
``CrossEntropyLoss`` and ``optim.SGD(momentum=0.9, nesterov=True)``:
``zero_grad``, forward, ``backward``, ``step``. Threads: ferrocaffe's kernel
pool (``_core.set_num_threads``) and ``torch.set_num_threads``. Each
(framework, batch, threads) is measured in a fresh child process, one after
the other, so an idle pool of one cannot take the CPU from the other.

    python benches/bench_train_step.py [--steps 2000] [--repeats 5]

PyTorch comes from the ``bench`` extra (``pip install ".[bench]"``), or
from the folders named in ``BENCH_TORCH_PATH`` (see torch_peer.py).
Prints the median time per step of each, and PyTorch / ferrocaffe (above 1:
ferrocaffe is faster).
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_peer import import_torch  # noqa: E402
HIDDEN = (128, 64)
PIXELS, CLASSES = 64, 10


def data(batch):
    import numpy as np
    rng = np.random.default_rng(0)
    x = rng.random((batch, PIXELS), dtype=np.float32)
    y = rng.integers(0, CLASSES, batch).astype(np.int32)
    return x, y


def time_steps(step, steps, repeats):
    """Median seconds per step over ``repeats`` runs of ``steps`` steps."""
    step(max(steps // 10, 10))  # warm up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step(steps)
        times.append((time.perf_counter() - t0) / steps)
    times.sort()
    return times[len(times) // 2]


def bench_ferrocaffe(batch, threads, steps, repeats):
    try:
        import ferrocaffe  # noqa: F401
    except ImportError:
        sys.path.insert(0, os.path.join(os.path.dirname(HERE), 'python'))
    from ferrocaffe import _core, brew, model_helper, optimizer, workspace
    _core.set_num_threads(threads)
    model = model_helper.ModelHelper(name='train_step')
    h, dim = 'data', PIXELS
    for i, width in enumerate(HIDDEN):
        h = brew.fc(model, h, 'fc%d' % (i + 1), dim_in=dim, dim_out=width)
        h = brew.relu(model, h, h)
        dim = width
    pred = brew.fc(model, h, 'pred', dim_in=dim, dim_out=CLASSES)
    _, loss = model.net.SoftmaxWithLoss([pred, 'label'], ['softmax', 'loss'])
    model.AddGradientOperators([loss])
    optimizer.build_sgd(model, base_learning_rate=0.01, momentum=0.9)
    x, y = data(batch)
    workspace.FeedBlob('data', x)
    workspace.FeedBlob('label', y)
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateNet(model.net)
    name = model.net.Proto().name
    return time_steps(lambda k: workspace.RunNet(name, num_iter=k),
                      steps, repeats)


def bench_torch(batch, threads, steps, repeats):
    torch = import_torch()
    torch.set_num_threads(threads)
    layers, dim = [], PIXELS
    for width in HIDDEN:
        layers += [torch.nn.Linear(dim, width), torch.nn.ReLU()]
        dim = width
    layers.append(torch.nn.Linear(dim, CLASSES))
    net = torch.nn.Sequential(*layers)
    loss_fn = torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9,
                          nesterov=True)
    x, y = data(batch)
    x, y = torch.from_numpy(x), torch.from_numpy(y.astype('int64'))

    def steps_of(k):
        for _ in range(k):
            opt.zero_grad()
            loss = loss_fn(net(x), y)
            loss.backward()
            opt.step()

    return time_steps(steps_of, steps, repeats)


def child(args):
    fn = bench_ferrocaffe if args.child == 'ferrocaffe' else bench_torch
    sec = fn(args.batch, args.threads, args.steps, args.repeats)
    print(json.dumps({'seconds_per_step': sec}))


def measure(framework, batch, threads, steps, repeats):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads),
               OPENBLAS_NUM_THREADS='1', RAYON_NUM_THREADS=str(threads))
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), '--child', framework,
         '--batch', str(batch), '--threads', str(threads),
         '--steps', str(steps), '--repeats', str(repeats)],
        env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit('%s failed:\n%s' % (framework, done.stderr[-3000:]))
    return json.loads(done.stdout.strip().splitlines()[-1])['seconds_per_step']


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--steps', type=int, default=2000)
    p.add_argument('--repeats', type=int, default=5)
    p.add_argument('--batches', type=int, nargs='*', default=[64, 256])
    p.add_argument('--thread-counts', type=int, nargs='*', default=[1, 2])
    p.add_argument('--child', choices=['ferrocaffe', 'torch'])
    p.add_argument('--batch', type=int)
    p.add_argument('--threads', type=int)
    args = p.parse_args()
    if args.child:
        return child(args)
    torch = import_torch()
    if torch is None:
        raise SystemExit('torch does not import: pip install ".[bench]", '
                         'or set BENCH_TORCH_PATH (torch_peer.py)')
    print('network %s, SGD momentum 0.9 (Nesterov); torch %s' % (
        ' -> '.join(map(str, (PIXELS,) + HIDDEN + (CLASSES,))),
        torch.__version__))
    print('%5s %7s %16s %16s %18s' % ('batch', 'threads', 'ferrocaffe us',
                                       'pytorch us', 'pytorch/ferrocaffe'))
    for batch in args.batches:
        for threads in args.thread_counts:
            f = measure('ferrocaffe', batch, threads, args.steps,
                        args.repeats)
            t = measure('torch', batch, threads, args.steps, args.repeats)
            print('%5d %7d %16.1f %16.1f %18.2f' % (
                batch, threads, f * 1e6, t * 1e6, t / f), flush=True)


if __name__ == '__main__':
    main()

"""Two CNN workloads of issue 15 against PyTorch eager (and ONNX Runtime):

* LeNet training step: forward, backward and SGD update (momentum 0.9,
  Nesterov, as ``optimizer.build_sgd`` builds it; PyTorch's
  ``optim.SGD(momentum=0.9, nesterov=True)``; the two are the same update
  at a fixed learning rate), batch 64, softmax cross-entropy. Two shapes:
  ``digits8``, the LeNet of examples/lenet_digits.py (its ``LeNet`` class,
  shared: 8x8 input, conv 3x3 pad 1 to 20 and 50 channels, max pools,
  FC 500, ReLU, FC 10) and ``mnist28``, Caffe2's MNIST tutorial LeNet
  (28x28, conv 5x5 to 20 and 50, max pools, FC 800 -> 500, ReLU, FC 10).
  ferrocaffe runs the net ``model_helper``/``brew``/``build_sgd`` build
  (``RunNet(num_iter=K)`` on fed blobs); PyTorch ``zero_grad``, forward,
  ``backward``, ``step``. Both start from the same weights (drawn with
  numpy and fed), and the loss of the first step and the parameters after
  three are compared across the two before timing.
* ResNet basic block inference: conv 3x3 - BN - ReLU - conv 3x3 - BN, plus
  the identity, ReLU (torchvision's BasicBlock, stride 1, no downsample),
  64 channels at 56x56 (ResNet-18's first stage), batch 1 and 8. Ours: a
  ``core.Net`` of Conv (no bias), SpatialBN (is_test), Relu, Sum; PyTorch:
  the same ``torch.nn.functional`` calls under ``no_grad``; ONNX Runtime:
  the block as an ONNX graph built with the ``onnx`` helper API (Conv,
  BatchNormalization, Relu, Add). Outputs are compared before timing.

Each (framework, thread count) runs in a fresh child process, one after
the other (ours: ``RAYON_NUM_THREADS``; PyTorch ``torch.set_num_threads``
and ``OMP_NUM_THREADS``; ONNX Runtime ``intra_op_num_threads``), so an
idle pool of one cannot take the CPU from another; ``--rounds`` rounds
(default 2) of the three children, interleaved, per thread count. Time =
median over ``--repeats`` runs of ``--iters`` iterations, the best such
median over the rounds; ratio = peer time / ours (above 1: ferrocaffe is
faster).

    pip install ".[bench]"             # torch, onnxruntime, onnx
    PROFILE=release bash scripts/dev_build.sh
    PYTHONPATH=python python benches/bench_cnn.py [--iters 50] [--repeats 5]
    # torch installed with pip --target into folders (see torch_peer.py):
    BENCH_TORCH_PATH=/tmp/torchenv:/tmp/torchenv-cuda:/tmp/torchenv-cuda2 PYTHONPATH=python python benches/bench_cnn.py
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from torch_peer import import_torch  # noqa: E402

CLASSES = 10
LR, MOMENTUM = 0.05, 0.9
BLOCK_C, BLOCK_HW, EPS = 64, 56, 1e-5
# name: (side, kernel, pad, c1, c2, fc)
LENETS = {'digits8': (8, 3, 1, 20, 50, 500), 'mnist28': (28, 5, 0, 20, 50, 500)}


def lenet_dims(name):
    side, k, p, c1, c2, fc = LENETS[name]
    s1 = (side + 2 * p - k + 1) // 2
    s2 = (s1 + 2 * p - k + 1) // 2
    return side, k, p, c1, c2, fc, c2 * s2 * s2


def lenet_params(name):
    """Weights for both frameworks, by Caffe2's blob names."""
    import numpy as np
    side, k, p, c1, c2, fc, flat = lenet_dims(name)
    rng = np.random.default_rng(1)
    shapes = {'conv1_w': (c1, 1, k, k), 'conv1_b': (c1,), 'conv2_w': (c2, c1, k, k), 'conv2_b': (c2,),
              'fc3_w': (fc, flat), 'fc3_b': (fc,), 'pred_w': (CLASSES, fc), 'pred_b': (CLASSES,)}
    out = {}
    for n, shp in shapes.items():
        fan_in = int(np.prod(shp[1:])) if len(shp) > 1 else 1
        out[n] = (rng.standard_normal(shp) * (1.0 / np.sqrt(fan_in) if len(shp) > 1 else 0.01)).astype(np.float32)
    return out


def lenet_data(name, batch):
    import numpy as np
    side = LENETS[name][0]
    rng = np.random.default_rng(0)
    x = rng.random((batch, 1, side, side), dtype=np.float32)
    y = rng.integers(0, CLASSES, batch).astype(np.int32)
    return x, y


def block_params():
    import numpy as np
    rng = np.random.default_rng(2)
    c = BLOCK_C
    p = {}
    for i in (1, 2):
        p['w%d' % i] = (rng.standard_normal((c, c, 3, 3)) * (1.0 / np.sqrt(9 * c))).astype(np.float32)
        p['s%d' % i] = (1 + 0.1 * rng.standard_normal(c)).astype(np.float32)
        p['b%d' % i] = (0.1 * rng.standard_normal(c)).astype(np.float32)
        p['m%d' % i] = (0.1 * rng.standard_normal(c)).astype(np.float32)
        p['v%d' % i] = (1 + 0.1 * rng.random(c)).astype(np.float32)
    return p


def block_input(batch):
    import numpy as np
    return np.random.default_rng(3).standard_normal((batch, BLOCK_C, BLOCK_HW, BLOCK_HW), dtype=np.float32)


def median_time(run, iters, repeats):
    """Median seconds per iteration; ``run(k)`` does k iterations."""
    run(max(iters // 5, 2))  # warm up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run(iters)
        times.append((time.perf_counter() - t0) / iters)
    times.sort()
    return times[len(times) // 2]


# ---------------------------------------------------------------- ferrocaffe

def ours(args):
    sys.path.insert(0, os.path.join(ROOT, 'python'))
    sys.path.insert(0, os.path.join(ROOT, 'examples'))
    import numpy as np
    from ferrocaffe import _core, brew, core, model_helper, optimizer, workspace
    _core.set_num_threads(args.threads)
    res = {}
    for name in args.lenets:
        workspace.ResetWorkspace()
        side, k, p, c1, c2, fc, flat = lenet_dims(name)
        model = model_helper.ModelHelper(name='lenet_' + name)
        if name == 'digits8':
            from lenet_digits import LeNet  # the example's network, shared
            pred = LeNet((c1, c2), fc).add_layers(model, 'data')
        else:
            conv1 = brew.conv(model, 'data', 'conv1', dim_in=1, dim_out=c1, kernel=k, pad=p,
                              no_gradient_to_input=1)
            pool1 = brew.max_pool(model, conv1, 'pool1', kernel=2, stride=2)
            conv2 = brew.conv(model, pool1, 'conv2', dim_in=c1, dim_out=c2, kernel=k, pad=p)
            pool2 = brew.max_pool(model, conv2, 'pool2', kernel=2, stride=2)
            fc3 = brew.fc(model, pool2, 'fc3', dim_in=flat, dim_out=fc)
            relu = brew.relu(model, fc3, fc3)
            pred = brew.fc(model, relu, 'pred', fc, CLASSES)
        _, loss = model.net.SoftmaxWithLoss([pred, 'label'], ['softmax', 'loss'])
        model.AddGradientOperators([loss])
        optimizer.build_sgd(model, base_learning_rate=LR, momentum=MOMENTUM)
        x, y = lenet_data(name, args.batch)
        workspace.FeedBlob('data', x.reshape(args.batch, -1) if name == 'digits8' else x)
        workspace.FeedBlob('label', y)
        workspace.RunNetOnce(model.param_init_net)
        params = lenet_params(name)
        for n, v in params.items():
            workspace.FeedBlob(n, v)
        workspace.CreateNet(model.net)
        net = model.net.Proto().name
        workspace.RunNet(net)
        loss1 = float(workspace.FetchBlob('loss'))
        workspace.RunNet(net, num_iter=2)
        after = {n: workspace.FetchBlob(n).tolist() for n in ('conv1_w', 'fc3_w', 'pred_b')}
        sec = median_time(lambda k: workspace.RunNet(net, num_iter=k), args.iters, args.repeats)
        res['lenet.' + name] = dict(sec=sec, loss1=loss1, after=after)
    for batch in args.block_batches:
        workspace.ResetWorkspace()
        for n, v in block_params().items():
            workspace.FeedBlob(n, v)
        workspace.FeedBlob('x', block_input(batch))
        net = core.Net('block_%d' % batch)
        net.Conv(['x', 'w1'], 'c1', kernel=3, pad=1)
        net.SpatialBN(['c1', 's1', 'b1', 'm1', 'v1'], 'n1', is_test=1, epsilon=EPS)
        net.Relu('n1', 'r1')
        net.Conv(['r1', 'w2'], 'c2', kernel=3, pad=1)
        net.SpatialBN(['c2', 's2', 'b2', 'm2', 'v2'], 'n2', is_test=1, epsilon=EPS)
        net.Sum(['n2', 'x'], 'sum')
        net.Relu('sum', 'out')
        workspace.CreateNet(net)
        workspace.RunNet(net.Name())
        np.save(os.path.join(args.tmp, 'ours_block_%d.npy' % batch), workspace.FetchBlob('out'))
        sec = median_time(lambda k: workspace.RunNet(net.Name(), num_iter=k), args.iters, args.repeats)
        res['block.%d' % batch] = dict(sec=sec)
    return res


# ---------------------------------------------------------------- PyTorch

def torch_side(args):
    import numpy as np
    torch = import_torch()
    torch.set_num_threads(args.threads)
    F = torch.nn.functional
    res = {}
    for name in args.lenets:
        side, k, p, c1, c2, fc, flat = lenet_dims(name)
        net = torch.nn.Sequential(
            torch.nn.Conv2d(1, c1, k, padding=p), torch.nn.MaxPool2d(2, 2),
            torch.nn.Conv2d(c1, c2, k, padding=p), torch.nn.MaxPool2d(2, 2),
            torch.nn.Flatten(), torch.nn.Linear(flat, fc), torch.nn.ReLU(),
            torch.nn.Linear(fc, CLASSES))
        params = lenet_params(name)
        with torch.no_grad():
            for mod, pre in ((net[0], 'conv1'), (net[2], 'conv2'), (net[5], 'fc3'), (net[7], 'pred')):
                mod.weight.copy_(torch.from_numpy(params[pre + '_w']))
                mod.bias.copy_(torch.from_numpy(params[pre + '_b']))
        loss_fn = torch.nn.CrossEntropyLoss()
        opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM, nesterov=True)
        x, y = lenet_data(name, args.batch)
        x, y = torch.from_numpy(x), torch.from_numpy(y.astype('int64'))
        x.requires_grad_(False)

        def steps(kk):
            for _ in range(kk):
                opt.zero_grad()
                loss = loss_fn(net(x), y)
                loss.backward()
                opt.step()
            return loss

        loss1 = float(steps(1))
        steps(2)
        after = {'conv1_w': net[0].weight.detach().numpy().tolist(),
                 'fc3_w': net[5].weight.detach().numpy().tolist(),
                 'pred_b': net[7].bias.detach().numpy().tolist()}
        sec = median_time(steps, args.iters, args.repeats)
        res['lenet.' + name] = dict(sec=sec, loss1=loss1, after=after)
    bp = {n: torch.from_numpy(v) for n, v in block_params().items()}

    def block(x):
        h = F.conv2d(x, bp['w1'], padding=1)
        h = F.relu(F.batch_norm(h, bp['m1'], bp['v1'], bp['s1'], bp['b1'], False, 0.0, EPS))
        h = F.conv2d(h, bp['w2'], padding=1)
        h = F.batch_norm(h, bp['m2'], bp['v2'], bp['s2'], bp['b2'], False, 0.0, EPS)
        return F.relu(h + x)

    for batch in args.block_batches:
        x = torch.from_numpy(block_input(batch))

        def run(kk):
            with torch.no_grad():
                for _ in range(kk):
                    block(x)

        with torch.no_grad():
            np.save(os.path.join(args.tmp, 'torch_block_%d.npy' % batch), block(x).numpy())
        res['block.%d' % batch] = dict(sec=median_time(run, args.iters, args.repeats))
    return res


# ---------------------------------------------------------------- ONNX Runtime

def ort_side(args):
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    p = block_params()
    nodes = []
    for i, inp in ((1, 'x'), (2, 'r1')):
        nodes.append(helper.make_node('Conv', [inp, 'w%d' % i], ['c%d' % i], kernel_shape=[3, 3],
                                      pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node('BatchNormalization', ['c%d' % i, 's%d' % i, 'b%d' % i, 'm%d' % i,
                                                             'v%d' % i], ['n%d' % i], epsilon=EPS))
    nodes.insert(2, helper.make_node('Relu', ['n1'], ['r1']))
    nodes += [helper.make_node('Add', ['n2', 'x'], ['sum']), helper.make_node('Relu', ['sum'], ['out'])]
    res = {}
    for batch in args.block_batches:
        x = block_input(batch)
        graph = helper.make_graph(
            nodes, 'basic_block',
            [helper.make_tensor_value_info('x', TensorProto.FLOAT, list(x.shape))],
            [helper.make_tensor_value_info('out', TensorProto.FLOAT, None)],
            [numpy_helper.from_array(v, n) for n, v in p.items()])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid('', 13)])
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=['CPUExecutionProvider'])
        feeds = {'x': x}
        np.save(os.path.join(args.tmp, 'ort_block_%d.npy' % batch), sess.run(None, feeds)[0])

        def run(kk):
            for _ in range(kk):
                sess.run(None, feeds)

        res['block.%d' % batch] = dict(sec=median_time(run, args.iters, args.repeats))
    return res


# ---------------------------------------------------------------- driver

def measure(framework, threads, args):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS='1',
               RAYON_NUM_THREADS=str(threads))
    cmd = [sys.executable, os.path.abspath(__file__), '--child', framework, '--threads', str(threads),
           '--iters', str(args.iters), '--repeats', str(args.repeats), '--batch', str(args.batch),
           '--tmp', args.tmp, '--lenets', *args.lenets,
           '--block-batches', *map(str, args.block_batches)]
    if framework == 'ort':
        cmd[cmd.index('--lenets') + 1:cmd.index('--block-batches')] = []
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit('%s failed:\n%s' % (framework, done.stderr[-3000:]))
    return json.loads(done.stdout.strip().splitlines()[-1])


def rel_err(a, b):
    import numpy as np
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-12))


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--iters', type=int, default=50)
    p.add_argument('--repeats', type=int, default=5)
    p.add_argument('--batch', type=int, default=64, help='LeNet batch')
    p.add_argument('--lenets', nargs='*', default=list(LENETS), choices=list(LENETS))
    p.add_argument('--block-batches', type=int, nargs='*', default=[1, 8])
    p.add_argument('--thread-counts', type=int, nargs='*', default=[1, 2])
    p.add_argument('--rounds', type=int, default=2,
                   help='rounds of (ours, torch, ORT) children per thread count; each keeps its best median')
    p.add_argument('--child', choices=['ours', 'torch', 'ort'])
    p.add_argument('--threads', type=int)
    p.add_argument('--tmp')
    args = p.parse_args()
    if args.child:
        fn = {'ours': ours, 'torch': torch_side, 'ort': ort_side}[args.child]
        print(json.dumps(fn(args)))
        return
    import tempfile

    import numpy as np
    import onnxruntime
    torch = import_torch()
    if torch is None:
        raise SystemExit('torch does not import: pip install ".[bench]", or set BENCH_TORCH_PATH (torch_peer.py)')
    print('torch %s, onnxruntime %s; LeNet batch %d, SGD lr %g momentum %g (Nesterov); block %d ch %dx%d'
          % (torch.__version__, onnxruntime.__version__, args.batch, LR, MOMENTUM, BLOCK_C, BLOCK_HW, BLOCK_HW))
    print('load average %.1f %.1f' % os.getloadavg()[:2], flush=True)
    print('%-14s %3s %11s %11s %11s %7s %7s  %s' % ('case', 'thr', 'ours us', 'torch us', 'ORT us',
                                                   'xtorch', 'xORT', 'agreement'))
    with tempfile.TemporaryDirectory() as tmp:
        args.tmp = tmp
        for threads in args.thread_counts:
            o, t, r = {}, {}, {}
            for _ in range(args.rounds):
                got = [(o, measure('ours', threads, args)), (t, measure('torch', threads, args))]
                if args.block_batches:
                    got.append((r, measure('ort', threads, args)))
                for best, res in got:
                    for case, v in res.items():
                        if case not in best or v['sec'] < best[case]['sec']:
                            best[case] = v
            for case in o:
                if case.startswith('lenet'):
                    errs = [abs(o[case]['loss1'] - t[case]['loss1']) / abs(t[case]['loss1'])]
                    errs += [rel_err(o[case]['after'][n], t[case]['after'][n]) for n in o[case]['after']]
                    agree = 'loss/params after 3 steps vs torch: %.1e' % max(errs)
                    peer = '%11s %7s' % ('-', '-')
                else:
                    b = case.split('.')[1]
                    mine = np.load(os.path.join(tmp, 'ours_block_%s.npy' % b))
                    agree = 'vs torch %.1e, vs ORT %.1e' % (
                        rel_err(mine, np.load(os.path.join(tmp, 'torch_block_%s.npy' % b))),
                        rel_err(mine, np.load(os.path.join(tmp, 'ort_block_%s.npy' % b))))
                    peer = '%11.1f %7.2f' % (r[case]['sec'] * 1e6, r[case]['sec'] / o[case]['sec'])
                ts, os_ = t[case]['sec'], o[case]['sec']
                pr = peer.split()
                print('%-14s %3d %11.1f %11.1f %11s %7.2f %7s  %s' % (
                    case, threads, os_ * 1e6, ts * 1e6, pr[0], ts / os_, pr[1], agree), flush=True)
    print('load average %.1f %.1f' % os.getloadavg()[:2], flush=True)


if __name__ == '__main__':
    main()

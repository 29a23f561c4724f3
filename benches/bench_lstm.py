"""One LSTM layer, forward and backward (issue 30), against PyTorch's
``nn.LSTM`` on the CPU; and the transcendental activations against numpy.

LSTM: ``rnn_cell.LSTM`` (a ``RecurrentNetwork`` op over ``LSTMUnit``
steps, the input projection outside the recurrence, as Caffe2 built it)
over an input of shape (seq, batch, input), then the gradients of the sum
of its output (``AddGradientOperators``) with respect to the input, the
weights and the initial states; PyTorch: ``nn.LSTM(input, hidden)``,
``out.sum().backward()``. Both start from the same weights (PyTorch's
i, f, g, o gate order mapped onto Caffe2's i, f, o, g) and the outputs and
input gradients are compared before timing. Shapes: (seq 50, batch 32,
input 128, hidden 256) and (seq 100, batch 1, input 64, hidden 64).

Activations: the ``Sigmoid``, ``Tanh``, ``Exp`` and ``Log`` ops on 1M
float32 values against numpy's ``1 / (1 + exp(-x))``, ``tanh``, ``exp``,
``log`` on the same array, in the same process.

Each (framework, thread count) runs in a fresh child process, one after
the other (ours: ``_core.set_num_threads``; PyTorch
``torch.set_num_threads`` and ``OMP_NUM_THREADS``), ``--rounds`` rounds,
interleaved. Time = median of ``--repeats`` timed runs (after one warm-up),
the best such median over the rounds; ratio = peer time / ours (above 1:
ferrocaffe is faster).

    PROFILE=release bash scripts/dev_build.sh
    PYTHONPATH=python python benches/bench_lstm.py [--repeats 7] [--rounds 2]
    # torch installed with pip --target into folders (see torch_peer.py):
    BENCH_TORCH_PATH=/tmp/torchenv:/tmp/torchenv-cuda PYTHONPATH=python python benches/bench_lstm.py
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_peer import import_torch  # noqa: E402

import numpy as np  # noqa: E402

SHAPES = [(50, 32, 128, 256), (100, 1, 64, 64)]
MARK = 'RESULT '


def weights(d, h, seed=0):
    """Caffe2's layout: i2h (4H, D) and recurrent (4H, H) weights and
    biases, gates in the order i, f, o, g."""
    rng = np.random.default_rng(seed)
    s = 1.0 / np.sqrt(h)
    return {
        'i2h_w': rng.uniform(-s, s, (4 * h, d)).astype(np.float32),
        'i2h_b': rng.uniform(-s, s, 4 * h).astype(np.float32),
        'gates_t_w': rng.uniform(-s, s, (4 * h, h)).astype(np.float32),
        'gates_t_b': rng.uniform(-s, s, 4 * h).astype(np.float32),
    }


def inputs(t, n, d, h, seed=1):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((t, n, d)).astype(np.float32),
            (0.1 * rng.standard_normal((1, n, h))).astype(np.float32),
            (0.1 * rng.standard_normal((1, n, h))).astype(np.float32))


def time_it(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def ours(threads, repeats):
    from ferrocaffe import _core, core, model_helper, rnn_cell, workspace
    _core.set_num_threads(threads)
    results, check = {}, {}
    for t, n, d, h in SHAPES:
        key = '%dx%dx%dx%d' % (t, n, d, h)
        ws = workspace.Workspace()
        model = model_helper.ModelHelper(name='lstm_' + key)
        x = model.net.AddExternalInput('x')
        lengths = model.net.AddExternalInput('lengths')
        h0 = model.net.AddExternalInput('h0')
        c0 = model.net.AddExternalInput('c0')
        out, _, _, _ = rnn_cell.LSTM(model, x, lengths, (h0, c0), d, h, scope='L')
        loss = model.net.SumElements(out, 'loss')
        model.AddGradientOperators([loss])
        ws.run(model.param_init_net)
        for name, value in weights(d, h).items():
            ws.feed_blob('L/' + name, value)
        xv, hv, cv = inputs(t, n, d, h)
        ws.feed_blob('x', xv)
        ws.feed_blob('h0', hv)
        ws.feed_blob('c0', cv)
        ws.feed_blob('lengths', np.full(n, t, dtype=np.int32))
        ws.create_net(model.net)
        name = model.net.Name()
        results[key] = time_it(lambda: ws.run_net(name), repeats)
        check[key] = [float(ws.fetch_blob(str(out)).sum()), float(np.abs(ws.fetch_blob('x_grad')).sum())]
    size = 1 << 20
    a = np.random.default_rng(2).uniform(-8, 8, size).astype(np.float32)
    ws = workspace.Workspace()
    ws.feed_blob('a', a)
    ws.feed_blob('pos', np.abs(a) + 1e-3)
    for op, src in (('Sigmoid', 'a'), ('Tanh', 'a'), ('Exp', 'a'), ('Log', 'pos')):
        net = core.Net('act_' + op)
        getattr(net, op)(src, 'y')
        ws.create_net(net)
        results[op] = time_it(lambda: ws.run_net(net.Name()), repeats)
    return results, check


def torch_side(threads, repeats):
    torch = import_torch()
    results, check = {}, {}
    if torch is not None:
        torch.set_num_threads(threads)
    for t, n, d, h in SHAPES if torch is not None else []:
        key = '%dx%dx%dx%d' % (t, n, d, h)
        lstm = torch.nn.LSTM(d, h)
        w = weights(d, h)
        # Caffe2's gates i, f, o, g -> PyTorch's i, f, g, o.
        order = np.concatenate([np.arange(0, 2 * h), np.arange(3 * h, 4 * h), np.arange(2 * h, 3 * h)])
        with torch.no_grad():
            lstm.weight_ih_l0.copy_(torch.from_numpy(w['i2h_w'][order]))
            lstm.bias_ih_l0.copy_(torch.from_numpy(w['i2h_b'][order]))
            lstm.weight_hh_l0.copy_(torch.from_numpy(w['gates_t_w'][order]))
            lstm.bias_hh_l0.copy_(torch.from_numpy(w['gates_t_b'][order]))
        xv, hv, cv = inputs(t, n, d, h)
        x = torch.from_numpy(xv).requires_grad_()
        h0 = torch.from_numpy(hv).requires_grad_()
        c0 = torch.from_numpy(cv).requires_grad_()

        def step():
            lstm.zero_grad()
            x.grad = None
            out, _ = lstm(x, (h0, c0))
            out.sum().backward()
            return out
        results[key] = time_it(step, repeats)
        out = step()
        check[key] = [float(out.detach().sum()), float(x.grad.abs().sum())]
    size = 1 << 20
    a = np.random.default_rng(2).uniform(-8, 8, size).astype(np.float32)
    pos = np.abs(a) + 1e-3
    results['Sigmoid'] = time_it(lambda: 1.0 / (1.0 + np.exp(-a)), repeats)
    results['Tanh'] = time_it(lambda: np.tanh(a), repeats)
    results['Exp'] = time_it(lambda: np.exp(a), repeats)
    results['Log'] = time_it(lambda: np.log(pos), repeats)
    return results, check


def child(which, threads, repeats):
    fn = ours if which == 'ours' else torch_side
    results, check = fn(threads, repeats)
    print(MARK + json.dumps({'results': results, 'check': check}), flush=True)


def run_child(which, threads, repeats):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS='1',
               MKL_NUM_THREADS=str(threads))
    done = subprocess.run([sys.executable, __file__, '--child', which, '--threads', str(threads),
                           '--repeats', str(repeats)], env=env, capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    raise SystemExit('child %s failed:\n%s%s' % (which, done.stdout, done.stderr))


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--child')
    p.add_argument('--threads', type=int, nargs='*', default=[1, 2])
    p.add_argument('--repeats', type=int, default=7)
    p.add_argument('--rounds', type=int, default=2)
    args = p.parse_args()
    if args.child:
        return child(args.child, args.threads[0], args.repeats)
    print('load average %.1f/%.1f/%.1f' % os.getloadavg())
    for threads in args.threads:
        best = {'ours': {}, 'peer': {}}
        for _ in range(args.rounds):
            for which in ('ours', 'peer'):
                got = run_child(which, threads, args.repeats)
                for k, v in got['results'].items():
                    best[which][k] = min(v, best[which].get(k, v))
                if which == 'ours':
                    ours_check = got['check']
                else:
                    for k, (s, g) in got['check'].items():
                        so, go = ours_check[k]
                        assert abs(s - so) <= 1e-3 * max(1.0, abs(s)), (k, s, so)
                        assert abs(g - go) <= 1e-3 * max(1.0, abs(g)), (k, g, go)
        print('\n%d thread(s): ms (median of %d runs, best of %d rounds)' % (
            threads, args.repeats, args.rounds))
        print('%-22s %10s %10s %8s' % ('case', 'ours', 'peer', 'peer/ours'))
        for k, v in best['ours'].items():
            peer = best['peer'].get(k)
            label = ('LSTM ' + k) if k[0].isdigit() else (k + ' 1M (numpy)')
            print('%-22s %10.2f %10s %8s' % (
                label, 1e3 * v, '-' if peer is None else '%.2f' % (1e3 * peer),
                '-' if peer is None else '%.2fx' % (peer / v)))


if __name__ == '__main__':
    main()

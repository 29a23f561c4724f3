"""A small data-parallel model for the tests, and an independent numpy
model of its training (forward, gradients and the optimizers' updates,
written here from the formulas, on the whole batch at once).

The model: ``x = Gather(emb, idx)`` (sparse) or ``x = data`` (dense), then
one fully connected layer to 3 classes and a softmax loss averaged over the
replica's rows and scaled by ``loss_scale``.
"""

import numpy as np

from ferrocaffe import brew, core, data_parallel_model as dpm, optimizer

IN, CLASSES, VOCAB = 8, 3, 40
LR = 0.1


def initial_params():
    w = np.linspace(-1.0, 1.0, CLASSES * IN).reshape(CLASSES, IN)
    b = np.array([0.1, -0.2, 0.05])
    emb = np.cos(np.arange(VOCAB * IN)).reshape(VOCAB, IN) * 0.5
    return {'fc_w': w.astype(np.float32), 'fc_b': b.astype(np.float32),
            'emb': emb.astype(np.float32)}


def batches(steps, batch, seed=0):
    rng = np.random.RandomState(seed)
    out = []
    for _ in range(steps):
        out.append({
            'data': rng.rand(batch, IN).astype(np.float32),
            # distinct rows per batch: a sparse update sees each row once
            'idx': rng.permutation(VOCAB)[:batch].astype(np.int32),
            'label': rng.randint(0, CLASSES, batch).astype(np.int32),
        })
    return out


def build(model, devices, opt, sparse, rendezvous=None):
    """Parallelizes ``model``; ``opt`` is 'sgd', 'momentum' or 'adam'."""
    def add_input(m):
        pass

    def forward(m, loss_scale):
        if sparse:
            emb = m.param_init_net.ConstantFill([], 'emb', shape=[VOCAB, IN],
                                                value=0.0)
            m.AddParameter(emb)
            x = m.net.Gather([emb, 'idx'], 'x')
        else:
            x = core.ScopedBlobReference('data')
        fc = brew.fc(m, x, 'fc', dim_in=IN, dim_out=CLASSES)
        _, loss = m.net.SoftmaxWithLoss([fc, 'label'], ['softmax', 'loss'])
        return [m.net.Scale(loss, 'scaled_loss', scale=loss_scale)]

    def add_optimizer(m):
        if opt == 'sgd':
            return optimizer.build_sgd(m, LR)
        if opt == 'momentum':
            return optimizer.build_sgd(m, LR, momentum=0.9)
        return optimizer.build_adam(m, LR)

    dpm.Parallelize(model, input_builder_fun=add_input,
                    forward_pass_builder_fun=forward,
                    optimizer_builder_fun=add_optimizer, devices=devices,
                    cpu_device=True, rendezvous=rendezvous)
    return model


def replica_feeds(batch, devices, shard=0, shards=1):
    """``{blob: rows}`` of one shard's replicas for one global batch: the
    rows are cut in (shard, replica) order."""
    n = len(devices) * shards
    rows = len(batch['label']) // n
    feeds = {}
    for j, d in enumerate(devices):
        k = shard * len(devices) + j
        for name, value in batch.items():
            feeds['cpu_%d/%s' % (d, name)] = value[k * rows:(k + 1) * rows]
    return feeds


def param_names(sparse):
    return ['fc_w', 'fc_b'] + (['emb'] if sparse else [])


# ------------------------------------------------------------ the model --

def reference(steps, opt, sparse):
    """The parameters after training on each whole batch, in float64."""
    p = {k: v.astype(np.float64) for k, v in initial_params().items()}
    state = {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in p.items()}
    for t, batch in enumerate(steps):
        x = p['emb'][batch['idx']] if sparse else batch['data'].astype(np.float64)
        y = batch['label']
        logits = x @ p['fc_w'].T + p['fc_b']
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        prob = e / e.sum(axis=1, keepdims=True)
        dlogits = prob.copy()
        dlogits[np.arange(len(y)), y] -= 1.0
        dlogits /= len(y)
        grads = {'fc_w': dlogits.T @ x, 'fc_b': dlogits.sum(axis=0)}
        rows = None
        if sparse:
            rows = batch['idx']
            grads['emb'] = dlogits @ p['fc_w']  # one row per index
        for name in param_names(sparse):
            g = grads[name]
            m, v = state[name]
            where = rows if (name == 'emb') else slice(None)
            if opt == 'sgd':
                p[name][where] -= LR * g
            elif opt == 'momentum':  # build_sgd's default: Nesterov
                new = 0.9 * m[where] + LR * g
                p[name][where] -= 1.9 * new - 0.9 * m[where]
                m[where] = new
            else:
                b1, b2, eps = 0.9, 0.999, 1e-8
                m[where] = b1 * m[where] + (1 - b1) * g
                v[where] = b2 * v[where] + (1 - b2) * g * g
                # The iteration counter is advanced before the update
                # (AtomicIter), and Caffe2's Adam corrects with iter + 1.
                k = t + 2
                corr = np.sqrt(1 - b2 ** k) / (1 - b1 ** k)
                p[name][where] -= LR * corr * m[where] / (np.sqrt(v[where]) + eps)
    return p

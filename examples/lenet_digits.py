"""LeNet (Caffe2's MNIST tutorial model) trained on scikit-learn's 8x8
digits in the checkpointed training Job of examples/train_job.py, then
exported as init/predict nets and reloaded in a Predictor.

The tutorial's LeNet (conv 5x5 -> 20, max pool 2, conv 5x5 -> 50, max pool
2, FC 500, ReLU, FC 10, softmax) takes 28x28 images; for 8x8 digits its
convolutions are 3x3 with pad 1, so the two poolings leave 2x2 maps:

    data (N, 64) -> reshape (N, 1, 8, 8) -> conv1 (20, 8x8) -> pool1 (20, 4x4)
      -> conv2 (50, 4x4) -> pool2 (50, 2x2) -> fc3 (500) -> relu -> pred (10)

Everything else is train_job.py's job, shared (not copied): the digits
written to ``.npy`` files (1,437 training and 360 held-out test images),
piped into the training net each epoch, SGD with momentum 0.9 (learning
rate 0.05 by default, divided by 10 after 10 epochs), a checkpoint after
every epoch, the exit group evaluating the test images and writing the
model. Ctrl-C and the same command again resumes from the last complete
checkpoint; ``--fresh`` starts over; ``--threads 1`` is deterministic.

With the defaults (12 epochs, 2 threads) the test accuracy is 99.4%
(at least 0.95: the script exits 1 below that, after checking it again on
the exported nets in a ``workspace.Predictor``)::

    pip install ".[examples]"         # ferrocaffe and scikit-learn
    python examples/lenet_digits.py [--epochs 12] [--fresh]

``--channels C1 C2`` and ``--fc N`` make a smaller LeNet (the tests train
one with ``--channels 6 16 --fc 64``).
"""

import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # train_job.py, which also finds ferrocaffe

import train_job  # noqa: E402
from train_job import CLASSES  # noqa: E402

from ferrocaffe import brew, core, model_helper, workspace  # noqa: E402

TARGET = 0.95
SIDE = 8  # the digits are 8x8


class LeNet(object):
    """The network train_job.Config takes: ``add_layers`` goes from the
    input rows (N, 64) to the 10 class scores."""

    def __init__(self, channels=(20, 50), fc=500):
        self.channels = tuple(channels)
        self.fc = fc

    def add_layers(self, model, data):
        c1, c2 = self.channels
        image = model.net.Reshape(
            [data], ['image', 'image_old_shape'], shape=[-1, 1, SIDE, SIDE])[0]
        # The pixels need no gradient (conv1 skips computing it).
        conv1 = brew.conv(model, image, 'conv1', dim_in=1, dim_out=c1,
                          kernel=3, pad=1, no_gradient_to_input=1)
        pool1 = brew.max_pool(model, conv1, 'pool1', kernel=2, stride=2)
        conv2 = brew.conv(model, pool1, 'conv2', dim_in=c1, dim_out=c2,
                          kernel=3, pad=1)
        pool2 = brew.max_pool(model, conv2, 'pool2', kernel=2, stride=2)
        side = SIDE // 4
        fc3 = brew.fc(model, pool2, 'fc3', dim_in=c2 * side * side,
                      dim_out=self.fc)
        relu = brew.relu(model, fc3, fc3)
        return brew.fc(model, relu, 'pred', self.fc, CLASSES)

    def describe(self):
        c1, c2 = self.channels
        return ('LeNet: conv 3x3 %d, pool, conv 3x3 %d, pool, fc %d, fc %d'
                % (c1, c2, self.fc, CLASSES))

    @classmethod
    def add_arguments(cls, parser, default):
        parser.add_argument('--channels', type=int, nargs=2,
                            default=list(default.channels),
                            help='channels of conv1 and conv2 (default: '
                                 '%(default)s)')
        parser.add_argument('--fc', type=int, default=default.fc,
                            help='width of fc3 (default: %(default)s)')

    @classmethod
    def from_args(cls, args):
        return cls(args.channels, args.fc)


DEFAULTS = train_job.Config(
    workdir=os.path.join(tempfile.gettempdir(), 'ferrocaffe_lenet_job'),
    epochs=12, lr=0.05, network=LeNet())


def predictor_accuracy(network, model, x, y):
    """Exports the trained LeNet as an init net (``GivenTensorFill`` of
    each parameter) and a predict net (the layers and a softmax, no loss),
    runs them in a ``workspace.Predictor`` on ``x`` and returns the
    accuracy on ``y``."""
    deploy = model_helper.ModelHelper(name='lenet_deploy', init_params=False)
    scores = network.add_layers(deploy, 'data')
    softmax = brew.softmax(deploy, scores, 'softmax')
    deploy.net.AddExternalOutput(softmax)
    init = core.Net('lenet_init')
    for param in deploy.params:
        value = model[str(param)]
        init.GivenTensorFill([], str(param), shape=list(value.shape),
                             values=value.reshape(-1).tolist())
    predictor = workspace.Predictor(init.Proto().SerializeToString(),
                                    deploy.net.Proto().SerializeToString())
    (probs,) = predictor.run([x])
    return float(np.mean(np.argmax(probs, axis=1) == y))


def main(argv=None):
    args = train_job.parse_args(argv, DEFAULTS, __doc__.split('\n\n')[0])
    cfg = train_job.config_from_args(args, DEFAULTS)
    model = train_job.train(cfg, args)
    if model is None:  # Ctrl-C: run again to resume
        return 130
    _, _, x_test, y_test = train_job.digits_split(cfg.seed)
    acc = predictor_accuracy(cfg.network, model, x_test, y_test)
    print('test accuracy of the exported nets (Predictor, %d images): %.4f '
          '(target %s)' % (len(y_test), acc, TARGET))
    return 0 if acc >= TARGET else 1


if __name__ == '__main__':
    sys.exit(main())

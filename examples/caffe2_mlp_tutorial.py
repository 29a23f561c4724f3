"""Caffe2's MNIST tutorial, MLP version, on scikit-learn's 8x8 digits.

Written as a Caffe2 program: the only ferrocaffe lines are the two below
that register the alias (ferrocaffe installed, or python/ on
PYTHONPATH), so that ``from caffe2.python import ...`` imports
ferrocaffe's modules. The data are written to minidb files of TensorProtos
records (as Caffe2's "create your own dataset" tutorial did), read back with
``brew.db_input``, and an MLP (the tutorial's LeNet needs convolutions) is
trained with ``AddGradientOperators`` and ``build_sgd`` in a loop of
``workspace.RunNet``, then tested by a second model built with
``init_params=False`` that shares the trained parameters.

    python examples/caffe2_mlp_tutorial.py [--iters 300] [--root-folder DIR]

It reaches about 98% accuracy on the 360 held-out digits (at least 95%).
"""

import argparse
import os
import tempfile

import numpy as np

import ferrocaffe
ferrocaffe.register_caffe2_alias()

from caffe2.proto import caffe2_pb2  # noqa: E402
from caffe2.python import (  # noqa: E402
    brew, core, model_helper, optimizer, utils, workspace)


def write_db(db_type, db_name, features, labels):
    db = core.C.create_db(db_type, db_name, core.C.Mode.new)
    transaction = db.new_transaction()
    for i in range(features.shape[0]):
        feature_and_label = caffe2_pb2.TensorProtos()
        feature_and_label.protos.extend([
            utils.NumpyArrayToCaffe2Tensor(features[i]),
            utils.NumpyArrayToCaffe2Tensor(labels[i])])
        transaction.put('%s_%04d' % (os.path.basename(db_name), i),
                        feature_and_label.SerializeToString())
    # Close the transaction, and then close the db.
    del transaction
    del db


def make_dbs(folder):
    """The digits as uint8 images [1, 8, 8] (pixel values 0 to 16) and int32
    labels, shuffled, 1,437 for training and 360 for testing."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    images = digits.images.astype(np.uint8).reshape(-1, 1, 8, 8)
    labels = digits.target.astype(np.int32)
    order = np.random.RandomState(0).permutation(len(labels))
    images, labels = images[order], labels[order]
    train_db = os.path.join(folder, 'digits_train.minidb')
    test_db = os.path.join(folder, 'digits_test.minidb')
    write_db('minidb', train_db, images[:-360], labels[:-360])
    write_db('minidb', test_db, images[-360:], labels[-360:])
    return train_db, test_db


def AddInput(model, batch_size, db, db_type):
    # Load the data and labels from the db.
    data_uint8, label = brew.db_input(
        model, blobs_out=['data_uint8', 'label'], batch_size=batch_size,
        db=db, db_type=db_type)
    # Cast the data to float and scale it to [0, 1].
    data = model.Cast(data_uint8, 'data', to=core.DataType.FLOAT)
    data = model.Scale(data, data, scale=float(1. / 16))
    # No gradient is computed for the data.
    data = model.StopGradient(data, data)
    return data, label


def AddMLPModel(model, data):
    size = 8 * 8
    sizes = [size, size * 2, size * 2, 10]
    layer = data
    for i in range(len(sizes) - 1):
        layer = brew.fc(model, layer, 'dense_{}'.format(i),
                        dim_in=sizes[i], dim_out=sizes[i + 1])
        if i < len(sizes) - 2:  # no ReLU on the class scores
            layer = brew.relu(model, layer, 'relu_{}'.format(i))
    softmax = brew.softmax(model, layer, 'softmax')
    return softmax


def AddAccuracy(model, softmax, label):
    accuracy = brew.accuracy(model, [softmax, label], 'accuracy')
    return accuracy


def AddTrainingOperators(model, softmax, label):
    xent = model.LabelCrossEntropy([softmax, label], 'xent')
    loss = model.AveragedLoss(xent, 'loss')
    AddAccuracy(model, softmax, label)
    model.AddGradientOperators([loss])
    optimizer.build_sgd(model, base_learning_rate=0.1, policy='step',
                        stepsize=1, gamma=0.999, momentum=0.9)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--iters', type=int, default=300)
    parser.add_argument('--root-folder', default=None)
    args = parser.parse_args(argv)
    root_folder = args.root_folder or tempfile.mkdtemp(
        prefix='caffe2_mlp_tutorial_')
    os.makedirs(root_folder, exist_ok=True)
    workspace.ResetWorkspace(root_folder)
    train_db, test_db = make_dbs(root_folder)

    arg_scope = {'order': 'NCHW'}
    train_model = model_helper.ModelHelper(name='mlp_train',
                                           arg_scope=arg_scope)
    data, label = AddInput(train_model, batch_size=64, db=train_db,
                           db_type='minidb')
    softmax = AddMLPModel(train_model, data)
    AddTrainingOperators(train_model, softmax, label)
    for i, op in enumerate(train_model.param_init_net.Proto().op):
        op.device_option.random_seed = 1 + i  # a repeatable run

    test_model = model_helper.ModelHelper(name='mlp_test',
                                          arg_scope=arg_scope,
                                          init_params=False)
    data, label = AddInput(test_model, batch_size=90, db=test_db,
                           db_type='minidb')
    softmax = AddMLPModel(test_model, data)
    AddAccuracy(test_model, softmax, label)

    # Train.
    workspace.RunNetOnce(train_model.param_init_net)
    workspace.CreateNet(train_model.net, overwrite=True)
    total_iters = args.iters
    accuracy = np.zeros(total_iters)
    loss = np.zeros(total_iters)
    for i in range(total_iters):
        workspace.RunNet(train_model.net)
        accuracy[i] = workspace.blobs['accuracy']
        loss[i] = workspace.blobs['loss']
        if i % 50 == 0 or i == total_iters - 1:
            print('iter %4d  loss %.4f  accuracy %.3f' % (
                i, loss[i], accuracy[i]))

    # Test: 4 batches of 90 cover the 360 test digits once.
    workspace.RunNetOnce(test_model.param_init_net)
    workspace.CreateNet(test_model.net, overwrite=True)
    test_accuracy = np.zeros(4)
    for i in range(4):
        workspace.RunNet(test_model.net.Proto().name)
        test_accuracy[i] = workspace.FetchBlob('accuracy')
    print('test_accuracy: %f' % test_accuracy.mean())
    return test_accuracy.mean()


if __name__ == '__main__':
    main()

"""LeNet (Caffe2's MNIST tutorial model) trained on scikit-learn's 8x8
digits, then exported as init/predict nets and reloaded in a Predictor.

The tutorial's LeNet (conv 5x5 -> 20, max pool 2, conv 5x5 -> 50, max pool
2, FC 500, ReLU, FC 10, softmax) takes 28x28 images; for 8x8 digits its
convolutions are 3x3 with pad 1, so the two poolings leave 2x2 maps:

    data (N, 1, 8, 8) -> conv1 (20, 8x8) -> pool1 (20, 4x4)
      -> conv2 (50, 4x4) -> pool2 (50, 2x2) -> fc3 (500) -> relu -> pred (10)

Training: SGD with momentum 0.9, learning rate 0.05, batches of 64, on
1,437 of the 1,797 images; the other 360 are the test set. With the
default 12 epochs the test accuracy is at least 0.95 (it prints it; the
script exits non-zero below that): 0.99 in 1.4 s of training with a
release build, seed 0.

    pip install scikit-learn          # the digits data set
    PYTHONPATH=python python examples/lenet_digits.py [--epochs 12]
"""

import argparse
import sys
import time

import numpy as np

from ferrocaffe import brew, core, model_helper, optimizer, workspace

TARGET = 0.95


def lenet(model, data):
    conv1 = brew.conv(model, data, "conv1", dim_in=1, dim_out=20, kernel=3, pad=1)
    pool1 = brew.max_pool(model, conv1, "pool1", kernel=2, stride=2)
    conv2 = brew.conv(model, pool1, "conv2", dim_in=20, dim_out=50, kernel=3, pad=1)
    pool2 = brew.max_pool(model, conv2, "pool2", kernel=2, stride=2)
    fc3 = brew.fc(model, pool2, "fc3", dim_in=50 * 2 * 2, dim_out=500)
    relu = brew.relu(model, fc3, fc3)
    pred = brew.fc(model, relu, "pred", 500, 10)
    return brew.softmax(model, pred, "softmax")


def load_digits(seed):
    from sklearn.datasets import load_digits as sk_digits

    d = sk_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None, :, :]
    y = d.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(y))
    x, y = x[order], y[order]
    return (x[:1437], y[:1437]), (x[1437:], y[1437:])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    (xtr, ytr), (xte, yte) = load_digits(args.seed)

    train = model_helper.ModelHelper(name="lenet_train")
    softmax = lenet(train, "data")
    xent = train.LabelCrossEntropy([softmax, "label"], "xent")
    loss = train.AveragedLoss(xent, "loss")
    train.Accuracy([softmax, "label"], "accuracy")
    train.AddGradientOperators([loss])
    optimizer.build_sgd(train, base_learning_rate=0.05, momentum=0.9)
    for i, op in enumerate(train.param_init_net.Proto().op):
        op.device_option.random_seed = args.seed * 1000 + i

    workspace.ResetWorkspace()
    workspace.RunNetOnce(train.param_init_net)
    workspace.FeedBlob("data", xtr[: args.batch])
    workspace.FeedBlob("label", ytr[: args.batch])
    workspace.CreateNet(train.net)
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        order = rng.permutation(len(ytr))
        losses = []
        for s in range(0, len(order) - args.batch + 1, args.batch):
            idx = order[s:s + args.batch]
            workspace.FeedBlob("data", xtr[idx])
            workspace.FeedBlob("label", ytr[idx])
            workspace.RunNet(train.net)
            losses.append(float(workspace.FetchBlob("loss")))
        print(f"epoch {epoch + 1:2d}: loss {np.mean(losses):.4f}")
    print(f"trained in {time.perf_counter() - t0:.1f} s")

    # Export: the deploy net (same names, no loss, no gradients) and an init
    # net that fills the trained parameters with GivenTensorFill.
    deploy = model_helper.ModelHelper(name="lenet_deploy", init_params=False)
    lenet(deploy, "data")
    deploy.net.AddExternalOutput(core.BlobReference("softmax"))
    init = core.Net("lenet_init")
    for p in train.GetParams():
        v = workspace.FetchBlob(p)
        init.GivenTensorFill([], str(p), shape=list(v.shape), values=v.reshape(-1).tolist())
    predictor = workspace.Predictor(init.Proto().SerializeToString(), deploy.net.Proto().SerializeToString())
    (probs,) = predictor.run([xte])
    acc = float(np.mean(probs.argmax(axis=1) == yte))
    print(f"test accuracy (Predictor, {len(yte)} images): {acc:.4f} (target {TARGET})")
    return 0 if acc >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())

"""A small ResNet-style network exported as init/predict nets (protobuf
files, binary and text) and reloaded through ``workspace.Predictor``: the
predictor gives the model's own outputs.

    conv 3x3 (3 -> 16) -> SpatialBN -> ReLU
      -> 2 residual blocks (conv 3x3, BN, ReLU, conv 3x3, BN, + identity, ReLU)
      -> global average pool -> FC 10 -> softmax

    PYTHONPATH=python python examples/resnet_predictor.py [--outdir DIR]
"""

import argparse
import os
import sys
import tempfile

import numpy as np

from ferrocaffe import brew, core, model_helper, workspace
from google.protobuf import text_format


def build(width=16, blocks=2):
    m = model_helper.ModelHelper(name="resnet_small")
    x = brew.conv(m, "data", "conv1", 3, width, kernel=3, pad=1, no_bias=1)
    x = brew.spatial_bn(m, x, "bn1", width, is_test=1)
    x = brew.relu(m, x, x)
    for b in range(blocks):
        r = brew.conv(m, x, f"res{b}_a", width, width, kernel=3, pad=1, no_bias=1)
        r = brew.spatial_bn(m, r, f"res{b}_a_bn", width, is_test=1)
        r = brew.relu(m, r, r)
        r = brew.conv(m, r, f"res{b}_b", width, width, kernel=3, pad=1, no_bias=1)
        r = brew.spatial_bn(m, r, f"res{b}_b_bn", width, is_test=1)
        x = brew.sum(m, [x, r], f"res{b}_sum")
        x = brew.relu(m, x, x)
    x = brew.average_pool(m, x, "pool", global_pooling=1)
    x = brew.fc(m, x, "fc", width, 10)
    m.net.AddExternalOutput(brew.softmax(m, x, "prob"))
    return m


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--outdir", default=os.path.join(tempfile.gettempdir(), "ferrocaffe_resnet_small"))
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    m = build()
    for i, op in enumerate(m.param_init_net.Proto().op):
        op.device_option.random_seed = 100 + i
    workspace.RunNetOnce(m.param_init_net)
    # Trained-looking batch-norm statistics, so that BN is not the identity.
    rng = np.random.default_rng(0)
    for name in workspace.Blobs():
        if name.endswith(("_rm", "_riv", "_s", "_b")) and "bn" in name:
            v = workspace.FetchBlob(name)
            workspace.FeedBlob(name, (np.abs(rng.standard_normal(v.shape)) + 0.5).astype(np.float32))
    x = rng.standard_normal((4, 3, 16, 16)).astype(np.float32)
    workspace.FeedBlob("data", x)
    workspace.RunNetOnce(m.net)
    expected = workspace.FetchBlob("prob")

    # The init net: one GivenTensorFill per parameter and statistic.
    init = core.Net("resnet_small_init")
    for p in m.GetParams() + m.GetComputedParams():
        v = workspace.FetchBlob(p)
        init.GivenTensorFill([], str(p), shape=list(v.shape), values=v.reshape(-1).tolist())
    paths = {
        "init.pb": init.Proto().SerializeToString(),
        "predict.pb": m.net.Proto().SerializeToString(),
        "init.pbtxt": text_format.MessageToString(init.Proto()).encode(),
        "predict.pbtxt": text_format.MessageToString(m.net.Proto()).encode(),
    }
    for name, data in paths.items():
        with open(os.path.join(args.outdir, name), "wb") as f:
            f.write(data)

    ok = True
    for kind in ("pb", "pbtxt"):
        with open(os.path.join(args.outdir, "init." + kind), "rb") as f:
            init_bytes = f.read()
        with open(os.path.join(args.outdir, "predict." + kind), "rb") as f:
            pred_bytes = f.read()
        workspace.SwitchWorkspace("predictor_" + kind, True)
        (prob,) = workspace.Predictor(init_bytes, pred_bytes).run([x])
        diff = float(np.max(np.abs(prob - expected)))
        print(f"{kind:6}: outputs {prob.shape}, max difference from the model {diff:.2e}")
        ok &= diff < 1e-5
    print("nets written to", args.outdir)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

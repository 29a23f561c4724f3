"""ferrocaffe's cases in the shared peer benchmark harness (issue #2).

    python benches/peerbench_ferrocaffe.py --only W1,W2,W3,W4,W5
    python benches/peerbench_ferrocaffe.py --only ferrocaffe      # our cases alone
    python benches/peerbench_ferrocaffe.py --list
    python benches/peerbench_ferrocaffe.py --markdown             # tables from the results file

The harness (``peers.py`` in $PEERBENCH_DIR, by default ``shared/peerbench``
beside this repository) is imported, not edited: this script registers
ferrocaffe's cases with its ``case`` decorator, reuses its ``w1_measure`` ..
``w5_measure`` drivers and workload sizes, and then hands over to its
``main()``.  The harness runs every trial in a child process started as
``python <peers module file> --child CASE``; ``peers.__file__`` is pointed at
this script, so each child re-imports the harness, re-registers these cases
and finds them.  Every option of the harness works (``--only``, ``--trials``,
``--fresh``, ``--list``, ``--markdown``, ``--verbose``).

Results go to ``benches/peerbench_results.json`` unless ``--out`` is given,
so the shared ``results.json`` is left alone.  ferrocaffe is imported only
inside its own cases (peers' children never load it); run this with a
Python where ferrocaffe and the peers are installed (see BENCHMARKS.md,
"Side by side with peers").
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PEERBENCH_DIR = os.path.abspath(os.environ.get(
    "PEERBENCH_DIR", os.path.join(REPO, "..", "shared", "peerbench")))
DEFAULT_OUT = os.path.join(HERE, "peerbench_results.json")

if not os.path.isfile(os.path.join(PEERBENCH_DIR, "peers.py")):
    sys.exit(f"peers.py not found in {PEERBENCH_DIR} (set PEERBENCH_DIR)")
sys.path.insert(0, PEERBENCH_DIR)
import peers  # noqa: E402

sys.path.insert(0, HERE)
import workloads  # noqa: E402

PEER = "ferrocaffe"


def _ferrocaffe():
    """Import ferrocaffe (or mark the case unavailable) and describe it."""
    fc = peers.need("ferrocaffe")
    from ferrocaffe import _core, core, workspace
    info = {"ferrocaffe": fc.__version__, "extension": _core.__file__,
            "RAYON_NUM_THREADS": os.environ.get("RAYON_NUM_THREADS")}
    if hasattr(_core, "num_threads"):
        info["kernel_threads"] = _core.num_threads()
    return core, workspace, info


# ---------------------------------------------------------------------------
# W1: one net of 1000 scalar float32 Add ops, x = x + one
# ---------------------------------------------------------------------------
@peers.case("W1.ferrocaffe", "W1", PEER,
            "Workspace.run_net of a created net of 1000 scalar float32 Add ops (x = x + one, in place); "
            "a run is feed x=0, run_net, fetch x",
            "ns/op", "ns_per_op", ["best_ns_per_op", "marginal_ns_per_op", "run_overhead_us"])
def w1_ferrocaffe():
    np = peers.need("numpy")
    core, workspace, info = _ferrocaffe()
    return peers.w1_measure(lambda n: workloads.chain(np, core, workspace, n), info)


# ---------------------------------------------------------------------------
# W2: an ExecutionStep with num_iter = n over a 1-op net, run as a plan
# ---------------------------------------------------------------------------
@peers.case("W2.ferrocaffe", "W2", PEER,
            "plan with one ExecutionStep, num_iter=100,000, over a 1-op net (scalar float32 Add x = x + one); "
            "a run is feed x=0, Workspace.run(plan), fetch x",
            "ns/iter", "ns_per_iter", ["best_ns_per_iter"])
def w2_ferrocaffe():
    np = peers.need("numpy")
    core, workspace, info = _ferrocaffe()
    return peers.w2_measure(lambda n: workloads.loop(np, core, workspace, n), info)


# ---------------------------------------------------------------------------
# W3: Add of 2^24 float32 into an existing output blob
# ---------------------------------------------------------------------------
@peers.case("W3.ferrocaffe_add", "W3", PEER,
            "Add(a, b) -> c of 2^24 float32, c an existing blob of the same shape (written in place); "
            "Workspace.run_net of a created 1-op net; kernel on rayon's default pool (2 threads here)",
            "GB/s", "GBps", ["best_GBps", "ms_per_op"])
def w3_ferrocaffe_add():
    np = peers.need("numpy")
    core, workspace, info = _ferrocaffe()
    ws = workspace.Workspace()
    ws.feed_blob("a", np.full(peers.W3_N, 1.0, np.float32))
    ws.feed_blob("b", np.full(peers.W3_N, 2.0, np.float32))
    c = np.zeros(peers.W3_N, np.float32)
    c[:] = 0.0
    ws.feed_blob("c", c)            # a copy: the blob's own pages are written here
    del c
    net = core.Net("w3_add")
    net.Add(["a", "b"], ["c"])
    ws.create_net(net)
    name = net.Name()
    res = peers.w3_measure(lambda: ws.run_net(name), 3, info)
    out = ws.fetch_blob("c")
    assert float(out[12345]) == 3.0 and out.shape == (peers.W3_N,)
    return res


# ---------------------------------------------------------------------------
# W4: a compute-bound body, one vs two concurrent instances
# ---------------------------------------------------------------------------
W4_BODY_FLOPS = 2 * peers.W4_DIM ** 2 * peers.W4_ITERS   # Mul + Add per element per iteration


def _w4(iters):
    np = peers.need("numpy")
    core, workspace, info = _ferrocaffe()
    dim = peers.W4_DIM
    flops = W4_BODY_FLOPS * iters // peers.W4_ITERS
    made = []

    def make_body():
        rng = np.random.default_rng(len(made))
        ws = workspace.Workspace()
        ws.feed_blob("a", rng.random((dim, dim), dtype=np.float32))
        ws.feed_blob("b", rng.random((dim, dim), dtype=np.float32))
        ws.feed_blob("tmp", np.zeros((dim, dim), np.float32))
        ws.feed_blob("acc", np.zeros((dim, dim), np.float32))
        net = core.Net(f"w4_body_{len(made)}")
        net.Mul(["a", "b"], ["tmp"])
        net.Add(["acc", "tmp"], ["acc"])
        ws.create_net(net)
        name = net.Name()
        made.append(ws)
        return lambda: ws.run_net(name, iters)

    res = peers.w4_measure(make_body, dict(info, body_flops=flops, num_iter=iters))
    m = res["metrics"]
    # w4_measure counts matmul flops; this body does elementwise work.
    m["GFLOPs_1thread"] = flops / (m["T1_ms"] * 1e6)
    m["GFLOPs_2threads"] = 2 * flops / (m["T2_ms"] * 1e6)
    return res


W4_DESC = ("no MatMul op in ferrocaffe: body = one net [Mul(a,b)->tmp; Add(acc,tmp)->acc] on 256^2 float32 "
           "(L2-resident elementwise work, below the kernel pool's threshold, so each instance runs on its "
           "own runner thread), Workspace.run_net(num_iter={}); each instance its own workspace, 2 Python "
           "threads (GIL released); GFLOPs count 1 flop per element per op")


@peers.case("W4.ferrocaffe", "W4", PEER, W4_DESC.format(peers.W4_ITERS),
            "x", "speedup", ["T1_ms", "T2_ms", "GFLOPs_1thread", "GFLOPs_2threads"])
def w4_ferrocaffe():
    return _w4(peers.W4_ITERS)


@peers.case("W4.ferrocaffe_x10", "W4", PEER,
            W4_DESC.format(10 * peers.W4_ITERS) + "; 10x the harness's iterations, so that a body lasts "
            "~30 ms like the matmul peers' bodies instead of ~3 ms, where thread start-up and GIL hand-offs "
            "weigh on T2",
            "x", "speedup", ["T1_ms", "T2_ms", "GFLOPs_1thread", "GFLOPs_2threads"])
def w4_ferrocaffe_x10():
    return _w4(10 * peers.W4_ITERS)


# ---------------------------------------------------------------------------
# W5: Save then Load of the 64 tensors (512 MiB) through the Save/Load ops
# ---------------------------------------------------------------------------
def _w5(case_name, mapped):
    peers.need("numpy")
    core, workspace, info = _ferrocaffe()
    # The tensors a runtime checkpoints live in its workspace: feed them
    # before timing. make_checkpoint_arrays is seeded, so these are the very
    # arrays that w5_measure makes and verifies against.
    src = workspace.Workspace()
    arrays = peers.make_checkpoint_arrays()
    names = list(arrays)
    for k, v in arrays.items():
        src.feed_blob(k, v)
    del arrays
    load_split = []

    def save(arrays, path):
        assert list(arrays) == names
        src.run(core.CreateOperator("Save", names, [], db=path, db_type="ferro",
                                    absolute_path=True))

    def load_op(path):
        ws = workspace.Workspace()
        t0 = time.perf_counter_ns()
        ws.run(core.CreateOperator("Load", [], names, db=path, db_type="ferro",
                                   absolute_path=True))
        t1 = time.perf_counter_ns()
        out = {k: ws.fetch_blob(k) for k in names}
        load_split.append({"load_op_s": round((t1 - t0) / 1e9, 4),
                           "fetch_s": round((time.perf_counter_ns() - t1) / 1e9, 4)})
        return out

    def load_mapped(path):
        from ferrocaffe import checkpoint
        return checkpoint.mmap_db(path)

    res = peers.w5_measure(case_name, save, load_mapped if mapped else load_op,
                           dict(info, db_type="ferro"))
    if load_split:
        res["info"]["load_split_cold_warm"] = load_split[:2]
    return res


@peers.case("W5.ferrocaffe", "W5", PEER,
            "Save op (db_type 'ferro': temp file, fsync, rename, dir fsync) of the 64 blobs, fed into the "
            "workspace before timing; load = Load op into a new workspace + FetchBlob of each (a copy) into numpy",
            "GB/s", "save_GBps", peers.W5_SECONDARY)
def w5_ferrocaffe():
    return _w5("ferrocaffe", mapped=False)


@peers.case("W5.ferrocaffe_mmap", "W5", PEER,
            "as W5.ferrocaffe, load = checkpoint.mmap_db (read-only numpy views of the mapped file; "
            "the harness's page-touch pass does the reading)",
            "GB/s", "save_GBps", peers.W5_SECONDARY)
def w5_ferrocaffe_mmap():
    return _w5("ferrocaffe-mmap", mapped=True)


# ---------------------------------------------------------------------------
# Hand-over to the harness
# ---------------------------------------------------------------------------
_harness_versions = peers.versions_main


def _versions_main():
    """The harness's version report, plus ferrocaffe's."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        _harness_versions()
    out = buf.getvalue()
    i = out.rfind(peers.RESULT_MARK)
    v = json.loads(out[i + len(peers.RESULT_MARK):]) if i >= 0 else {}
    try:
        import ferrocaffe
        v["ferrocaffe"] = ferrocaffe.__version__
    except Exception as exc:
        v["ferrocaffe"] = f"unavailable ({type(exc).__name__})"
    print(peers.RESULT_MARK + json.dumps(v, default=str), flush=True)


def main():
    # Children run this script (they re-register the cases above).
    peers.__file__ = os.path.abspath(__file__)
    peers.versions_main = _versions_main
    argv = sys.argv[1:]
    if not any(a == "--out" or a.startswith("--out=") for a in argv):
        sys.argv[1:] = argv + ["--out", DEFAULT_OUT]
    peers.main()


if __name__ == "__main__":
    main()

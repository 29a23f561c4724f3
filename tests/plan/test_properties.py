"""Property tests (hypothesis).

(a) Random small plans, valid or not, either succeed or raise a
    FerrocaffeError subclass: never crash, never raise anything else, never
    hang (a plan that loops forever by construction is cancelled after a
    short while and must then finish promptly).
(b) Random, mutated and truncated protobuf bytes at every entry point that
    accepts them (plans, nets, ops, BlobProtos, TensorProto feeds, the
    Python parser of every message): only FerrocaffeError subclasses, no
    hang, a usable workspace, round trips that agree.
(c) Random counter-op sequences in one net, compared with a plain-Python
    model of Caffe2's counter semantics.
(d) Mostly valid random plans whose in-place adds are each paired with a
    count: totals exact, and equal to a model of the step rules.

The fuzzers run a bounded number of examples here; FERROCAFFE_FUZZ_SECONDS
runs them longer (scripts/fuzz.sh).
"""

import os
import signal
import time

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import assume as hypothesis_assume
from hypothesis import strategies as st

from ferrocaffe import _core, core, errors, proto, workspace

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
RUN_BUDGET_S = 0.4  # a plan still running after this is cancelled
CANCEL_BOUND_S = 15.0  # ... and must then finish within this (hang check)

# The fuzzers below run a bounded number of examples in CI; for longer runs
# set FERROCAFFE_FUZZ_SECONDS (keep drawing fresh examples that long) and/or
# FERROCAFFE_FUZZ_EXAMPLES (examples per round): see scripts/fuzz.sh.
FUZZ_SECONDS = float(os.environ.get("FERROCAFFE_FUZZ_SECONDS", "0") or 0)


def run_fuzz(test):
    """Runs a hypothesis test once (bounded, for CI), or again and again
    with fresh random examples until FERROCAFFE_FUZZ_SECONDS have passed."""
    deadline = time.monotonic() + FUZZ_SECONDS
    test()
    while time.monotonic() < deadline:
        test()


BLOBS = ["a", "b", "c", "stop", "m", "it"]
NET_NAMES = ["n0", "n1", "n2", "n3"]


# ------------------------------------------------------- random plans --


def op_strategy(blobs, allow_fills=True):
    b = st.sampled_from(blobs)
    small = st.integers(-1, 3)
    choices = [
        st.builds(lambda o, i: ("CreateCounter", [], [o], {"init_count": i}), b, small),
        st.builds(lambda x, o: ("CountUp", [x], [o], {}), b, b),
        st.builds(lambda x, o: ("CountDown", [x], [o], {}), b, b),
        st.builds(lambda x, o: ("CheckCounterDone", [x], [o], {}), b, b),
        st.builds(lambda x, i: ("ResetCounter", [x], [], {"init_count": i}), b, small),
        st.builds(lambda x, o: ("RetrieveCount", [x], [o], {}), b, b),
        st.builds(lambda x: ("Iter", [x], [x], {}), b),
        st.builds(lambda x: ("Iter", [], [x], {}), b),
        st.builds(lambda x, o: ("Copy", [x], [o], {}), b, b),
        st.builds(lambda x, o: ("IsEmpty", [x], [o], {}), b, b),
        st.builds(lambda o: ("CreateMutex", [], [o], {}), b),
        st.builds(lambda m, x, o: ("AtomicIter", [m, x], [o], {}), b, b, b),
        st.builds(lambda o: ("Bogus", [], [o], {}), b),
    ]
    if allow_fills:
        choices += [
            st.builds(
                lambda o, n, v: ("ConstantFill", [], [o], {"shape": [n], "value": v}),
                b,
                st.integers(0, 3),
                st.floats(-2, 2, allow_nan=False),
            ),
            st.builds(lambda o, v: ("ConstantFill", [], [o], {"dtype": core.DataType.BOOL, "value": v}), b, st.booleans()),
        ]
    return st.one_of(choices)


def net_strategy(allow_fills=True):
    return st.builds(
        lambda name, ops: (name, ops),
        st.sampled_from(NET_NAMES),
        st.lists(op_strategy(BLOBS, allow_fills), max_size=4),
    )


ANY_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "num_iter": st.integers(-1, 3),
        "should_stop_blob": st.sampled_from(BLOBS + ["missing"]),
        "only_once": st.booleans(),
        "concurrent_substeps": st.booleans(),
        "create_workspace": st.booleans(),
        "num_concurrent_instances": st.integers(-1, 3),
        "run_every_ms": st.integers(-1, 3),
        "report_net": st.sampled_from(NET_NAMES + ["undefined"]),
        "report_interval": st.integers(-1, 1),
    },
)


def chance(draw, one_in):
    return draw(st.integers(0, one_in - 1)) == 0


def draw_fields(draw, defined):
    """Step fields: mostly a valid combination, sometimes anything at all."""
    if chance(draw, 8):
        return draw(ANY_FIELDS)
    f = {}
    if chance(draw, 3):
        f["should_stop_blob"] = draw(st.sampled_from(["stop", "stop", "a", "b"]))
        if draw(st.booleans()):
            f["only_once"] = draw(st.booleans())
    elif draw(st.booleans()):
        f["num_iter"] = draw(st.integers(0, 3))
    if draw(st.booleans()):
        f["concurrent_substeps"] = draw(st.booleans())
    if chance(draw, 3):
        f["create_workspace"] = True
    if chance(draw, 3):
        f["num_concurrent_instances"] = draw(st.integers(0, 3))
    if chance(draw, 5):
        f["run_every_ms"] = draw(st.integers(0, 3))
    if defined and chance(draw, 8):
        f["report_net"] = draw(st.sampled_from(defined))
        f["report_interval"] = 0
    return f


def draw_net_ref(draw, defined):
    if defined and not chance(draw, 12):
        return draw(st.sampled_from(defined))
    return "undefined"


def draw_step(draw, depth, defined):
    fields = draw_fields(draw, defined)
    if depth >= 2 or draw(st.booleans()):
        nets = [draw_net_ref(draw, defined) for _ in range(draw(st.integers(0, 3)))]
        return ("leaf", fields, nets)
    subs = [draw_step(draw, depth + 1, defined) for _ in range(draw(st.integers(1, 3)))]
    extra = [draw_net_ref(draw, defined)] if chance(draw, 12) else []  # invalid
    return ("inner", fields, subs, extra)


@st.composite
def plan_strategy(draw, allow_fills=True):
    n = draw(st.integers(0, len(NET_NAMES)))
    names = NET_NAMES[:n]
    if names and chance(draw, 12):
        names = names + [names[-1]]  # a duplicate definition (invalid)
    nets = [(name, draw(st.lists(op_strategy(BLOBS, allow_fills), max_size=4))) for name in names]
    defined = NET_NAMES[:n]
    steps = [draw_step(draw, 0, defined) for _ in range(draw(st.integers(0, 3)))]
    # Blobs fed before the plan runs (name -> kind).
    pre = draw(
        st.dictionaries(st.sampled_from(BLOBS), st.sampled_from(["bool", "false", "float", "int64", "empty"]), max_size=4)
    )
    return nets, steps, pre


_step_ids = iter(range(10**9))


def to_step_proto(spec):
    s = proto.ExecutionStep(name=f"s{next(_step_ids)}")
    fields = spec[1]
    for k, v in fields.items():
        setattr(s, k, v)
    if spec[0] == "leaf":
        s.network.extend(spec[2])
    else:
        for sub in spec[2]:
            s.substep.add().CopyFrom(to_step_proto(sub))
        s.network.extend(spec[3])
    return s


def to_net_proto(name, ops):
    n = proto.NetDef(name=name)
    for op_type, ins, outs, kw in ops:
        n.op.add().CopyFrom(core.CreateOperator(op_type, ins, outs, **kw))
    return n


def build_plan(spec):
    nets, steps, _ = spec
    p = proto.PlanDef(name="random")
    for name, ops in nets:
        p.network.add().CopyFrom(to_net_proto(name, ops))
    for s in steps:
        p.execution_step.add().CopyFrom(to_step_proto(s))
    return p


def prefeed(ws, pre):
    values = {
        "bool": np.array(True),
        "false": np.array(False),
        "float": np.array([1.0], np.float32),
        "int64": np.array([0], np.int64),
    }
    for name, kind in pre.items():
        if kind == "empty":
            ws.create_blob(name)
        else:
            ws.feed_blob(name, values[kind])


def run_bounded(handle):
    """Waits for a background plan; cancels it after RUN_BUDGET_S. Returns
    ("ok", result) or ("error", exception). A plan that does not finish
    within CANCEL_BOUND_S of its cancellation is a hang."""
    start = time.monotonic()
    while not handle.is_done() and time.monotonic() - start < RUN_BUDGET_S:
        time.sleep(0.002)
    if not handle.is_done():
        handle.cancel()
        cancelled_at = time.monotonic()
        while not handle.is_done():
            assert time.monotonic() - cancelled_at < CANCEL_BOUND_S, "the plan hangs after cancellation"
            time.sleep(0.005)
    try:
        return "ok", handle.wait()
    except BaseException as e:  # classified by the caller
        return "error", e


def assert_ferrocaffe_error(e):
    assert isinstance(e, errors.FerrocaffeError), f"{type(e).__name__}: {e}"
    assert type(e).__module__ == "ferrocaffe.errors", type(e)
    str(e)  # the message renders


def assert_error_of(target, e):
    """The error of feeding bytes to ``target`` is typed: the protobuf
    package's DecodeError where it parses (caffe2_pb2 are its classes: the
    "py:" targets, and the TensorProto a "tensor" feed parses first), else a
    ferrocaffe error."""
    if (target.startswith("py:") or target == "tensor") and isinstance(e, proto.DecodeError):
        str(e)
        return
    assert_ferrocaffe_error(e)


def assert_usable(ws):
    ok = proto.NetDef(name="__usable")
    ok.op.add().CopyFrom(core.CreateOperator("CreateCounter", [], ["__u"], init_count=5))
    ok.op.add().CopyFrom(core.CreateOperator("CountUp", ["__u"], ["__u_prev"]))
    assert ws.run(ok) is True
    assert ws.blobs["__u_prev"].fetch().item() == 5


@settings(max_examples=60, **SETTINGS)
@given(plan_strategy())
def test_random_plans_succeed_or_raise_ferrocaffe_errors(spec):
    ws = workspace.Workspace()
    prefeed(ws, spec[2])
    plan = build_plan(spec)
    handle = _core.run_plan_in_background(ws._core, plan.SerializeToString())
    outcome, value = run_bounded(handle)
    event(f"outcome: {outcome} {value if outcome == 'ok' else type(value).__name__}")
    if outcome == "ok":
        assert value in (True, False)
        assert handle.is_succeeded() == value
    else:
        assert_ferrocaffe_error(value)
        assert handle.is_succeeded() is False
    assert handle.is_done()
    assert_usable(ws)


@settings(max_examples=40, **SETTINGS)
@given(plan_strategy())
def test_random_plans_through_workspace_run_plan(spec):
    """The same through workspace.RunPlan in the current workspace; a plan
    still running after the budget is interrupted with a timer signal,
    which the runtime turns into a cancellation."""
    prev = workspace.CurrentWorkspace()
    workspace.SwitchWorkspace("__properties", True)
    workspace.ResetWorkspace()
    try:
        prefeed(workspace.current_workspace(), spec[2])
        outcome, value = run_with_alarm(lambda: workspace.RunPlan(build_plan(spec)))
        event(f"outcome: {outcome} {type(value).__name__}")
        if outcome == "error":
            assert_ferrocaffe_error(value)
        assert_usable(workspace.current_workspace())
    finally:
        workspace.SwitchWorkspace(prev)


# ------------------------------------------------- random serialised bytes --


class Budget(Exception):
    """Raised by the timer signal handler when a run exceeds its budget."""


def _on_alarm(signum, frame):
    raise Budget()


def run_with_alarm(fn):
    """Runs fn() on this (the main) thread; after RUN_BUDGET_S a SIGALRM
    handler raises Budget, which the runtime must deliver after cancelling
    the run. Returns ("ok", result), ("budget", None) or ("error", e)."""
    old = signal.signal(signal.SIGALRM, _on_alarm)
    start = time.monotonic()
    try:
        signal.setitimer(signal.ITIMER_REAL, RUN_BUDGET_S)
        try:
            result = fn()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        return "ok", result
    except Budget:
        assert time.monotonic() - start < RUN_BUDGET_S + CANCEL_BOUND_S, "the run hangs after cancellation"
        return "budget", None
    except BaseException as e:
        return "error", e
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def mutate(data, draw_ops):
    data = bytearray(data)
    for kind, pos, byte in draw_ops:
        if not data and kind != "insert":
            continue
        p = pos % (len(data) + 1)
        if kind == "flip" and p < len(data):
            data[p] ^= byte or 1
        elif kind == "set" and p < len(data):
            data[p] = byte
        elif kind == "insert":
            data[p:p] = bytes([byte])
        elif kind == "delete" and p < len(data):
            del data[p]
        elif kind == "truncate":
            del data[p:]
    return bytes(data)


MUTATIONS = st.lists(
    st.tuples(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]), st.integers(0, 10**6), st.integers(0, 255)),
    min_size=1,
    max_size=4,
)

SEED_OPS = [
    core.CreateOperator("CreateCounter", [], ["c"], init_count=2),
    core.CreateOperator("CountUp", ["c"], ["p"]),
    core.CreateOperator("CountDown", ["c"], ["stop"]),
    core.CreateOperator("Iter", ["it"], ["it"]),
    core.CreateOperator("IsEmpty", ["x"], ["e"]),
    core.CreateOperator("Copy", ["x"], ["y"]),
    core.CreateOperator("Concat", ["x", "x"], ["cat", "split"], axis=0),
    core.CreateOperator("ResetCounter", ["c"], ["old"], init_count=1),
    core.CreateOperator("CreateMutex", [], ["m"]),
    core.CreateOperator("AtomicIter", ["m", "it"], ["it"]),
]


def seeded_ws():
    ws = workspace.Workspace()
    ws.feed_blob("x", np.arange(4, dtype=np.float32).reshape(2, 2))
    ws.feed_blob("it", np.array([0], np.int64))
    ws.run(core.CreateOperator("CreateCounter", [], ["c"], init_count=3))
    return ws


# Every entry point that accepts serialised protos: the runtime's (plans,
# nets, ops, BlobProtos; a TensorProto feed goes through the BlobProto
# decoder) and the Python parsers of every message class. A call must
# succeed or raise a FerrocaffeError; a plan that runs past its budget is
# cancelled and must then stop; the workspace must stay usable; and what
# Python parses must serialise to bytes that parse back to the same bytes.

PY_MESSAGES = [proto.PlanDef, proto.NetDef, proto.OperatorDef, proto.ExecutionStep,
               proto.Argument, proto.DeviceOption, proto.TensorProto, proto.TensorProtos,
               proto.BlobProto, proto.DBReaderProto]
RUNTIME_TARGETS = ["plan", "background", "net", "net_once", "op", "blob", "tensor"]
TARGETS = RUNTIME_TARGETS + ["py:" + c.__name__ for c in PY_MESSAGES]


def feed_bytes(ws, target, data):
    """Hands ``data`` to one entry point; returns ("ok", value),
    ("budget", None) or ("error", exception)."""
    core_ws = ws._core
    if target == "plan":
        return run_with_alarm(lambda: core_ws.run_plan(data))
    if target == "background":
        try:
            handle = _core.run_plan_in_background(core_ws, data)
        except BaseException as e:
            return "error", e
        return run_bounded(handle)
    if target == "net":
        return run_with_alarm(lambda: core_ws.create_net(data, True))
    if target == "net_once":
        return run_with_alarm(lambda: core_ws.run_net_once(data))
    if target == "op":
        return run_with_alarm(lambda: core_ws.run_operator_once(data))
    if target == "blob":
        return run_with_alarm(lambda: core_ws.deserialize_blob("fuzzed", data))
    if target == "tensor":
        def feed():
            ws.feed_blob("fuzzed_tensor", proto.TensorProto.FromString(data))
        return run_with_alarm(feed)
    cls = getattr(proto, target[len("py:"):])

    def parse():
        msg = cls.FromString(data)
        again = msg.SerializePartialToString()
        # Parsing what was serialised gives the same bytes back.
        assert cls.FromString(again).SerializePartialToString() == again, (target, data)
        return msg
    try:
        return "ok", parse()
    except AssertionError:
        raise
    except BaseException as e:
        return "error", e


def check_outcome(ws, target, outcome, value):
    event(f"{target}: {outcome} {type(value).__name__ if outcome == 'error' else ''}")
    if outcome == "error":
        assert_error_of(target, value)
    if target in RUNTIME_TARGETS:
        assert_usable(ws)


@settings(max_examples=int(os.environ.get("FERROCAFFE_FUZZ_EXAMPLES", "150")), **SETTINGS)
@given(st.binary(max_size=120), st.sampled_from(TARGETS))
def _random_bytes_give_only_ferrocaffe_errors(data, target):
    ws = seeded_ws()
    check_outcome(ws, target, *feed_bytes(ws, target, data))


def test_random_bytes_give_only_ferrocaffe_errors():
    run_fuzz(_random_bytes_give_only_ferrocaffe_errors)


@settings(max_examples=int(os.environ.get("FERROCAFFE_FUZZ_EXAMPLES", "120")), **SETTINGS)
@given(plan_strategy(allow_fills=False), MUTATIONS, st.sampled_from(["plan", "background", "py:PlanDef"]))
def _mutated_plans_give_only_ferrocaffe_errors(spec, mutations, target):
    ws = seeded_ws()
    prefeed(ws, spec[2])
    data = mutate(build_plan(spec).SerializeToString(), mutations)
    check_outcome(ws, target, *feed_bytes(ws, target, data))


def test_mutated_plans_give_only_ferrocaffe_errors():
    run_fuzz(_mutated_plans_give_only_ferrocaffe_errors)


@settings(max_examples=int(os.environ.get("FERROCAFFE_FUZZ_EXAMPLES", "120")), **SETTINGS)
@given(st.lists(st.sampled_from(range(len(SEED_OPS))), min_size=1, max_size=5), MUTATIONS, st.booleans())
def _mutated_nets_and_ops_give_only_ferrocaffe_errors(indices, mutations, as_net):
    ws = seeded_ws()
    if as_net:
        n = proto.NetDef(name="mutant")
        for i in indices:
            n.op.add().CopyFrom(SEED_OPS[i])
        data = mutate(n.SerializeToString(), mutations)
        targets = ["net", "net_once", "py:NetDef"]
    else:
        data = mutate(SEED_OPS[indices[0]].SerializeToString(), mutations)
        targets = ["op", "py:OperatorDef"]
    for target in targets:
        check_outcome(ws, target, *feed_bytes(ws, target, data))


def test_mutated_nets_and_ops_give_only_ferrocaffe_errors():
    run_fuzz(_mutated_nets_and_ops_give_only_ferrocaffe_errors)


def seed_blobs():
    """Serialised BlobProtos of every kind of blob, and TensorProtos."""
    ws = seeded_ws()
    ws.feed_blob("s", np.array([b"ab", b"", b"xyz"], dtype=object))
    ws.feed_blob("b", np.array([True, False]))
    ws.feed_blob("e", np.zeros((0, 3), np.int32))
    ws.feed_blob("raw", b"raw bytes")
    ws.run(core.CreateOperator("CreateMutex", [], ["m"]))
    blobs = [ws.serialize_blob(n) for n in ("x", "it", "c", "s", "b", "e", "raw", "m")]
    tensors = [
        proto.TensorProto(dims=[2, 2], data_type=proto.TensorProto.FLOAT, float_data=[1, 2, 3, 4]),
        proto.TensorProto(dims=[3], data_type=proto.TensorProto.INT32, int32_data=[1, -2, 3],
                          segment=proto.TensorProto.Segment(begin=0, end=3)),
        proto.TensorProto(dims=[2], data_type=proto.TensorProto.STRING, string_data=[b"a", b"bc"]),
        proto.TensorProto(dims=[1], data_type=proto.TensorProto.UINT16, int32_data=[65535]),
        proto.TensorProto(dims=[], data_type=proto.TensorProto.DOUBLE, double_data=[0.5]),
    ]
    return blobs, [t.SerializeToString() for t in tensors]


SEED_BLOBS, SEED_TENSORS = seed_blobs()


@settings(max_examples=int(os.environ.get("FERROCAFFE_FUZZ_EXAMPLES", "120")), **SETTINGS)
@given(st.booleans(), st.integers(0, 100), MUTATIONS)
def _mutated_blobs_and_tensors_give_only_ferrocaffe_errors(as_blob, k, mutations):
    ws = seeded_ws()
    if as_blob:
        data = mutate(SEED_BLOBS[k % len(SEED_BLOBS)], mutations)
        targets = ["blob", "py:BlobProto"]
    else:
        data = mutate(SEED_TENSORS[k % len(SEED_TENSORS)], mutations)
        targets = ["tensor", "py:TensorProto"]
    for target in targets:
        check_outcome(ws, target, *feed_bytes(ws, target, data))


def test_mutated_blobs_and_tensors_give_only_ferrocaffe_errors():
    run_fuzz(_mutated_blobs_and_tensors_give_only_ferrocaffe_errors)


def seed_messages():
    """(targets, bytes) of a valid message per kind, for truncation."""
    spec = ([("n0", [("CreateCounter", [], ["c0"], {"init_count": 2}), ("CountDown", ["c0"], ["stop"], {})])],
            [("inner", {"num_iter": 2}, [("leaf", {"should_stop_blob": "stop"}, ["n0"])], [])], {})
    plan = build_plan(spec).SerializeToString()
    net = proto.NetDef(name="seed")
    for op in SEED_OPS[:4]:
        net.op.add().CopyFrom(op)
    out = [(["plan", "background", "py:PlanDef"], plan),
           (["net", "net_once", "py:NetDef"], net.SerializeToString()),
           (["op", "py:OperatorDef"], SEED_OPS[6].SerializeToString())]
    out += [(["blob", "py:BlobProto"], b) for b in SEED_BLOBS]
    out += [(["tensor", "py:TensorProto"], t) for t in SEED_TENSORS]
    return out


def test_every_truncation_of_valid_messages_gives_only_ferrocaffe_errors():
    ws = seeded_ws()
    for targets, data in seed_messages():
        for cut in range(len(data)):
            for target in targets:
                outcome, value = feed_bytes(ws, target, data[:cut])
                if outcome == "error":
                    assert_error_of(target, value)
        assert_usable(ws)


# ----------------------------------------------- differential: counters --

COUNTERS = ["c0", "c1", "c2"]
OUTPUTS = ["o0", "o1", "o2"]


def counter_op_strategy():
    c = st.sampled_from(COUNTERS)
    anyin = st.sampled_from(COUNTERS + COUNTERS + OUTPUTS[:1])  # mostly counters
    o = st.sampled_from(OUTPUTS)
    init = st.sampled_from([0, 1, 2, 3, 4, 0, 1, 2, -1])
    return st.one_of(
        st.tuples(st.just("CreateCounter"), c, init),
        st.tuples(st.just("CountUp"), anyin, o),
        st.tuples(st.just("CountDown"), anyin, o),
        st.tuples(st.just("ResetCounter"), anyin, init, st.one_of(st.none(), o)),
        st.tuples(st.just("RetrieveCount"), anyin, o),
        st.tuples(st.just("CheckCounterDone"), anyin, o),
    )


def to_op(t):
    kind = t[0]
    if kind == "CreateCounter":
        return core.CreateOperator(kind, [], [t[1]], init_count=t[2])
    if kind == "ResetCounter":
        return core.CreateOperator(kind, [t[1]], [t[3]] if t[3] else [], init_count=t[2])
    return core.CreateOperator(kind, [t[1]], [t[2]])


def model_counters(ops, num_iter):
    """Caffe2's counter semantics in plain Python. Returns (error class or
    None, state) where state maps blob name -> ("counter", v) |
    ("int64", v) | ("bool", v) | ("empty",)."""
    # Net creation: ops are built in order; an input must exist already
    # (outputs of earlier ops do); a negative init_count is refused.
    existing = set()
    for t in ops:
        kind = t[0]
        inputs = [] if kind == "CreateCounter" else [t[1]]
        outputs = [t[1]] if kind == "CreateCounter" else ([t[3]] if t[3] else []) if kind == "ResetCounter" else [t[2]]
        # Schema checks come first: no counter op may run in place.
        if set(inputs) & set(outputs):
            return errors.InvalidArgumentError, None
        if any(i not in existing for i in inputs):
            return errors.BlobNotFoundError, None
        if kind in ("CreateCounter", "ResetCounter") and t[2] < 0:
            return errors.InvalidArgumentError, None
        if kind == "CreateCounter":
            existing.add(t[1])
        elif kind == "ResetCounter":
            if t[3]:
                existing.add(t[3])
        else:
            existing.add(t[2])
    state = {name: ("empty",) for name in existing}
    for _ in range(num_iter):
        for t in ops:
            kind = t[0]
            if kind == "CreateCounter":
                state[t[1]] = ("counter", t[2])
                continue
            cur = state[t[1]]
            if cur[0] != "counter":
                return errors.DataTypeError, state
            v = cur[1]
            if kind == "CountUp":
                state[t[1]] = ("counter", v + 1)
                state[t[2]] = ("int64", v)
            elif kind == "CountDown":
                state[t[1]] = ("counter", v - 1)
                state[t[2]] = ("bool", v <= 0)
            elif kind == "ResetCounter":
                state[t[1]] = ("counter", t[2])
                if t[3]:
                    state[t[3]] = ("int64", v)
            elif kind == "RetrieveCount":
                state[t[2]] = ("int64", v)
            elif kind == "CheckCounterDone":
                state[t[2]] = ("bool", v <= 0)
    return None, state


def observed(ws, name):
    value = ws.blobs[name].fetch()
    if isinstance(value, np.ndarray):
        assert value.shape == ()
        if value.dtype == np.int64:
            return ("int64", int(value))
        assert value.dtype == np.bool_
        return ("bool", bool(value))
    if ws.blobs[name].kind() == "Counter":
        tmp = "__retrieved"
        ws.run(core.CreateOperator("RetrieveCount", [name], [tmp]))
        return ("counter", int(ws.blobs[tmp].fetch()))
    return ("empty",)


@st.composite
def counter_programs(draw):
    """Usually creates the counters first, then random ops on them."""
    prefix = []
    for c in COUNTERS:
        if not chance(draw, 6):
            prefix.append(("CreateCounter", c, draw(st.sampled_from([0, 1, 2, 3, 4, 0, 1, 2, -1]))))
    body = draw(st.lists(counter_op_strategy(), min_size=1, max_size=10))
    return prefix + body


@settings(max_examples=200, **SETTINGS)
@given(counter_programs(), st.integers(1, 3))
def test_counter_ops_match_the_model(ops, num_iter):
    ws = workspace.Workspace()
    n = proto.NetDef(name="counters")
    for t in ops:
        n.op.add().CopyFrom(to_op(t))
    expected_error, expected_state = model_counters(ops, num_iter)
    try:
        ws.create_net(n)
        ws.run_net("counters", num_iter)
        error = None
    except errors.FerrocaffeError as e:
        error = type(e)
    event(f"outcome: {error.__name__ if error else 'ran'}")
    assert error is expected_error
    if expected_state is None:
        # Creation failed: nothing ran, at most empty blobs were created.
        for name in COUNTERS + OUTPUTS:
            if ws.has_blob(name):
                assert observed(ws, name) == ("empty",)
        assert "counters" not in ws.nets
    else:
        for name, value in expected_state.items():
            assert observed(ws, name) == value, name
    assert_usable(ws)


# ------------------------------------- valid plans with exact counts --
#
# (d) Mostly valid random plans (nested steps, concurrent substeps and
#     instances, child workspaces, report steps and report nets, stop-blob
#     loops) built from "worker" nets. Worker net k adds 1 to its int64
#     accumulator in place and counts up its counter, so after any run,
#     failed or not, every accumulator equals its counter (an add lost or
#     doubled under concurrency would show), and the counts equal what a
#     plain-Python model of the step rules predicts (a lower bound for
#     report steps and nets, which run on a timer and once more at the end;
#     an upper bound when a fault was injected and the plan stopped early).
#
# Bounded in CI; FERROCAFFE_FUZZ_SECONDS=<s> keeps drawing new examples for
# that long (scripts/fuzz.sh), see docs/testing.md.

HANG_S = 120.0  # a valid plan still running after this is a hang
MAX_NET_RUNS = 300  # examples predicted to run longer are redrawn


class Worker:
    """Names of worker net k's blobs."""

    def __init__(self, k):
        self.net = f"w{k}"
        self.acc = f"acc{k}"
        self.ctr = f"ctr{k}"


def worker_net(w):
    n = proto.NetDef(name=w.net)
    n.op.add().CopyFrom(core.CreateOperator("Add", [w.acc, "one"], [w.acc]))
    n.op.add().CopyFrom(core.CreateOperator("CountUp", [w.ctr], [w.ctr + "_prev"]))
    return n


class Fuzz:
    """What a drawn plan uses; filled while its steps are drawn."""

    def __init__(self):
        self.workers = []
        self.gadgets = 0  # stop-loop counters and blobs
        self.faulty = False
        self.steps = 0

    def worker(self, draw):
        if self.workers and draw(st.booleans()):
            return draw(st.sampled_from(self.workers))  # a net run by several steps
        w = Worker(len(self.workers))
        self.workers.append(w)
        return w

    def name(self, kind):
        self.steps += 1
        return f"{kind}{self.steps}"


# A step spec is a dict: kind ("nets", "loop", "inner"), name, the step's
# fields, and its children (worker nets; or substeps). Models return, per
# worker net, (low, high) counts per execution of the step (high None:
# unbounded).

def draw_leaf(draw, fz, replicated):
    if not replicated and draw(st.integers(0, 3)) == 0:
        # A stop-blob loop: its own counter counts down from n, the body runs
        # n + 1 times (once with only_once); reset before every execution.
        g = fz.gadgets
        fz.gadgets += 1
        return {"kind": "loop", "name": fz.name("loop"), "gadget": g,
                "n": draw(st.integers(0, 3)), "only_once": draw(st.booleans()),
                "worker": fz.worker(draw)}
    nets = [fz.worker(draw) for _ in range(draw(st.integers(1, 2)))]
    fault = not fz.faulty and draw(st.integers(0, 11)) == 0
    if fault:
        fz.faulty = True
    return {"kind": "nets", "name": fz.name("leaf"), "nets": nets, "fault": fault,
            "num_iter": draw(st.one_of(st.none(), st.integers(0, 3)))}


def draw_inner(draw, fz, depth, replicated):
    spec = {"kind": "inner", "name": fz.name("inner"),
            "num_iter": draw(st.one_of(st.none(), st.integers(0, 2))),
            "concurrent": draw(st.booleans()),
            "instances": draw(st.one_of(st.none(), st.integers(0, 3))),
            "create_workspace": draw(st.integers(0, 2)) == 0,
            "report_net": None}
    replicated = replicated or (spec["instances"] or 0) > 1
    subs = []
    for _ in range(draw(st.integers(1, 3))):
        sub = draw_spec(draw, fz, depth + 1, replicated)
        sub["every_ms"] = draw(st.sampled_from([None] * 6 + [1, 5]))
        subs.append(sub)
    spec["subs"] = subs
    if draw(st.integers(0, 4)) == 0:
        spec["report_net"] = fz.worker(draw)
    return spec


def draw_spec(draw, fz, depth, replicated):
    if depth >= 3 or draw(st.integers(0, 2)) == 0:
        return draw_leaf(draw, fz, replicated)
    return draw_inner(draw, fz, depth, replicated)


@st.composite
def valid_plans(draw):
    fz = Fuzz()
    tops = []
    for _ in range(draw(st.integers(1, 2))):
        s = draw_spec(draw, fz, 0, False)
        s["every_ms"] = None  # ignored at the top level anyway
        tops.append(s)
    return fz, tops


def add(counts, more, times=1, unbounded=False):
    for net, (lo, hi) in more.items():
        a, b = counts.get(net, (0, 0))
        counts[net] = (a + lo * times,
                       None if unbounded or b is None or hi is None else b + hi * times)


def model(spec):
    """Counts of each worker net per execution of ``spec``."""
    counts = {}
    kind = spec["kind"]
    if kind == "loop":
        runs = 1 if spec["only_once"] else spec["n"] + 1
        add(counts, {spec["worker"].net: (1, 1)}, runs)
        return counts
    iters = spec["num_iter"] if spec["num_iter"] is not None else 1
    iters = max(iters, 0)
    if kind == "nets":
        for w in spec["nets"]:
            add(counts, {w.net: (1, 1)}, iters)
        return counts
    recurring = [s for s in spec["subs"] if s["every_ms"] is None]
    reports = [s for s in spec["subs"] if s["every_ms"] is not None]
    nci = spec["instances"]
    concurrent = spec["concurrent"] and len(recurring) + len(reports) > 1
    sequential = not concurrent and (nci is None or nci <= 1)
    per_sub = 1 if sequential else (nci if nci is not None else 1)
    for s in recurring:
        add(counts, model(s), iters * per_sub)
    # Report substeps and the report net run on a timer while the step runs
    # and once more after it: at least once per execution.
    for s in reports:
        add(counts, model(s), 1, unbounded=True)
    if spec["report_net"] is not None:
        add(counts, {spec["report_net"].net: (1, 1)}, 1, unbounded=True)
    return counts


def step_proto(spec):
    s = proto.ExecutionStep(name=spec["name"])
    if spec.get("every_ms") is not None:
        s.run_every_ms = spec["every_ms"]
    kind = spec["kind"]
    if kind == "loop":
        g = spec["gadget"]
        init = s.substep.add(name=spec["name"] + "_init")
        init.network.append(f"reset{g}")
        loop = s.substep.add(name=spec["name"] + "_body")
        loop.network.extend([spec["worker"].net, f"countdown{g}"])
        loop.should_stop_blob = f"stop{g}"
        if spec["only_once"]:
            loop.only_once = True
        return s
    if spec["num_iter"] is not None:
        s.num_iter = spec["num_iter"]
    if kind == "nets":
        s.network.extend(w.net for w in spec["nets"])
        if spec["fault"]:
            s.network.append("fault")
        return s
    if spec["concurrent"]:
        s.concurrent_substeps = True
    if spec["instances"] is not None:
        s.num_concurrent_instances = spec["instances"]
    if spec["create_workspace"]:
        s.create_workspace = True
    if spec["report_net"] is not None:
        s.report_net = spec["report_net"].net
        s.report_interval = 0
    for sub in spec["subs"]:
        s.substep.add().CopyFrom(step_proto(sub))
    return s


def fuzz_plan(fz, tops):
    p = proto.PlanDef(name="fuzz")
    for w in fz.workers:
        p.network.add().CopyFrom(worker_net(w))
    for g in range(fz.gadgets):
        reset = p.network.add(name=f"reset{g}")
        reset.op.add().CopyFrom(core.CreateOperator("ResetCounter", [f"cd{g}"], [], init_count=tops_n(tops, g)))
        reset.op.add().CopyFrom(core.CreateOperator("ConstantFill", [], [f"stop{g}"], value=False,
                                                    dtype=core.DataType.BOOL, shape=[]))
        cd = p.network.add(name=f"countdown{g}")
        cd.op.add().CopyFrom(core.CreateOperator("CountDown", [f"cd{g}"], [f"stop{g}"]))
    if fz.faulty:
        # Fails when it runs (a counter op on a tensor): a typed error that
        # cancels the rest of the plan.
        fault = p.network.add(name="fault")
        fault.op.add().CopyFrom(core.CreateOperator("CountUp", ["one"], ["fault_out"]))
    for s in tops:
        p.execution_step.add().CopyFrom(step_proto(s))
    return p


def tops_n(tops, g):
    """The countdown start of stop loop ``g``."""
    todo = list(tops)
    while todo:
        s = todo.pop()
        if s["kind"] == "loop" and s["gadget"] == g:
            return s["n"]
        todo.extend(s.get("subs", []))
    raise AssertionError(g)


def prepared_workspace(fz):
    ws = workspace.Workspace()
    ws.feed_blob("one", np.array([1], np.int64))
    init = proto.NetDef(name="fuzz_init")
    for w in fz.workers:
        ws.feed_blob(w.acc, np.array([0], np.int64))
        init.op.add().CopyFrom(core.CreateOperator("CreateCounter", [], [w.ctr], init_count=0))
    for g in range(fz.gadgets):
        # The stop blob must exist when the loop's step is compiled.
        ws.feed_blob(f"stop{g}", np.array(False))
        init.op.add().CopyFrom(core.CreateOperator("CreateCounter", [], [f"cd{g}"], init_count=0))
    ws.run(init)
    return ws


def expected_counts(tops):
    counts = {}
    for s in tops:
        add(counts, model(s))
    return counts


@settings(max_examples=int(os.environ.get("FERROCAFFE_FUZZ_EXAMPLES", "25")),
          **dict(SETTINGS, suppress_health_check=SETTINGS["suppress_health_check"]
                 + [HealthCheck.filter_too_much]))
@given(valid_plans())
def _valid_plans_keep_exact_counts(drawn):
    fz, tops = drawn
    expected = expected_counts(tops)
    hypothesis_assume(all(hi is not None and hi <= MAX_NET_RUNS or hi is None and lo <= MAX_NET_RUNS
                          for lo, hi in expected.values()))
    ws = prepared_workspace(fz)
    plan = fuzz_plan(fz, tops)
    handle = _core.run_plan_in_background(ws._core, plan.SerializeToString())
    start = time.monotonic()
    while not handle.is_done():
        if time.monotonic() - start > HANG_S:
            handle.cancel()
            raise AssertionError("a valid plan did not finish: a hang")
        time.sleep(0.002)
    try:
        outcome = handle.wait()
        error = None
    except BaseException as e:
        outcome, error = None, e
    event("fault injected" if fz.faulty else "valid")
    if fz.faulty:
        if error is not None:
            assert_ferrocaffe_error(error)
    else:
        assert error is None, f"a valid plan failed: {type(error).__name__}: {error}"
        assert outcome is True
    for w in fz.workers:
        acc = int(ws.blobs[w.acc].fetch()[0])
        runs = ws._core.fetch_counter(w.ctr)
        # Exactness: every in-place add was paired with one count.
        assert acc == runs, (w.net, acc, runs)
        lo, hi = expected.get(w.net, (0, 0))
        if fz.faulty and error is not None:
            assert hi is None or runs <= hi, (w.net, runs, hi)
        else:
            assert runs >= lo and (hi is None or runs <= hi), (w.net, runs, (lo, hi))
    assert_usable(ws)


def test_valid_plans_keep_exact_counts():
    run_fuzz(_valid_plans_keep_exact_counts)

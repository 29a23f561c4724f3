"""Property tests (hypothesis).

(a) Random small plans, valid or not, either succeed or raise a
    FerrocaffeError subclass: never crash, never raise anything else, never
    hang (a plan that loops forever by construction is cancelled after a
    short while and must then finish promptly).
(b) Random and mutated serialised plans, nets and ops given to the core:
    only FerrocaffeError subclasses.
(c) Random counter-op sequences in one net, compared with a plain-Python
    model of Caffe2's counter semantics.
"""

import signal
import time

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ferrocaffe import _core, core, errors, proto, workspace

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
RUN_BUDGET_S = 0.4  # a plan still running after this is cancelled
CANCEL_BOUND_S = 15.0  # ... and must then finish within this (hang check)

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
    assert type(e).__module__ == "ferrocaffe.errors"
    str(e)  # the message renders


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


@settings(max_examples=150, **SETTINGS)
@given(st.binary(max_size=80), st.sampled_from(["plan", "net", "op"]))
def test_random_bytes_give_only_ferrocaffe_errors(data, target):
    ws = seeded_ws()
    if target == "plan":
        outcome, value = run_with_alarm(lambda: ws._core.run_plan(data))
    else:
        fn = ws._core.create_net if target == "net" else ws._core.run_operator_once
        try:
            outcome, value = "ok", fn(data)
        except BaseException as e:
            outcome, value = "error", e
    if outcome == "error":
        assert_ferrocaffe_error(value)
    assert_usable(ws)


@settings(max_examples=120, **SETTINGS)
@given(plan_strategy(allow_fills=False), MUTATIONS)
def test_mutated_plans_give_only_ferrocaffe_errors(spec, mutations):
    ws = seeded_ws()
    prefeed(ws, spec[2])
    data = mutate(build_plan(spec).SerializeToString(), mutations)
    outcome, value = run_with_alarm(lambda: ws._core.run_plan(data))
    event(f"outcome: {outcome} {type(value).__name__}")
    if outcome == "error":
        assert_ferrocaffe_error(value)
    assert_usable(ws)


@settings(max_examples=120, **SETTINGS)
@given(st.lists(st.sampled_from(range(len(SEED_OPS))), min_size=1, max_size=5), MUTATIONS, st.booleans())
def test_mutated_nets_and_ops_give_only_ferrocaffe_errors(indices, mutations, as_net):
    ws = seeded_ws()
    if as_net:
        n = proto.NetDef(name="mutant")
        for i in indices:
            n.op.add().CopyFrom(SEED_OPS[i])
        data = mutate(n.SerializeToString(), mutations)
        calls = [ws._core.create_net, lambda d: ws._core.run_net_once(d)]
    else:
        data = mutate(SEED_OPS[indices[0]].SerializeToString(), mutations)
        calls = [ws._core.run_operator_once]
    for fn in calls:
        try:
            fn(data)
        except BaseException as e:
            assert_ferrocaffe_error(e)
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

"""Random small programs built with ferrocaffe.net_builder, compared with a
plain-Python evaluator of the same program.

A program works on a few int64 variables.  Statements:

    ('const', dst, c)                      dst = c
    ('add', dst, a, b) / ('sub', ...)      dst = a + b / a - b  (int64, wrapping)
    ('loop', count, body)                  with ops.loop(count) as loop: body
    ('if', [(cond, body), ...], else_body) ops.If(...) / .Elif(...) / .Else()
    ('stop_if', cond)                      ops.stop_if(cond)
    ('mark', k)                            h = h * 31 + k

An operand is ('var', name), ('const', c) or ('iter', k), the iteration
counter of the k-th enclosing loop (outermost first).  A condition is
(cmp, a, b) with cmp one of EQ NE LT LE GT GE.  A loop count is ('const', n)
or ('var', name); a variable count is re-read at the start of every
iteration (the loop's stop condition is `iter >= count`, evaluated there).

`ops.stop_if` ends the innermost enclosing block: the body of an If / Elif /
Else branch, or a loop (the remaining statements of the iteration are
skipped and no further iteration runs).  It is never generated at the top
level, where the builder's step would loop until its stop blob is set.

Besides the data variables v0..v3, the variable h hashes the path taken:
every block body starts with a 'mark' (numbered in program order) and a
stop_if is followed by one, so any difference in control flow shows in h,
even when the data variables happen to end equal.
"""

import itertools
import operator

import numpy as np
from hypothesis import HealthCheck, assume, event, given, note, settings
from hypothesis import strategies as st

from ferrocaffe import core, workspace
from ferrocaffe.net_builder import NetBuilder, ops
from ferrocaffe.session import LocalSession
from ferrocaffe.task import Task, final_output

VARS = ('v0', 'v1', 'v2', 'v3')     # the data variables
TRACE = 'h'                         # the path hash (see 'mark')
ALL = VARS + (TRACE,)
CMPS = {
    'EQ': operator.eq, 'NE': operator.ne, 'LT': operator.lt,
    'LE': operator.le, 'GT': operator.gt, 'GE': operator.ge,
}
MAX_DEPTH = 3          # nesting of loop / if blocks
MAX_ITERS = 8          # a loop running more often than this is rejected
MAX_STEPS = 400        # as is a program executing more statements


# ------------------------------------------------------------ evaluator --

def wrap64(x):
    return (x + 2 ** 63) % 2 ** 64 - 2 ** 63


class Rejected(Exception):
    """The program runs too long to be a useful example."""


class Model:
    def __init__(self, init):
        self.env = dict(init)
        self.steps = 0

    def operand(self, o, iters):
        kind, x = o
        if kind == 'var':
            return self.env[x]
        if kind == 'iter':
            return iters[x]
        return x

    def cond(self, c, iters):
        cmp, a, b = c
        return CMPS[cmp](self.operand(a, iters), self.operand(b, iters))

    def block(self, stmts, iters):
        """Runs the statements; returns True if a stop_if ended the block."""
        for s in stmts:
            self.steps += 1
            if self.steps > MAX_STEPS:
                raise Rejected()
            kind = s[0]
            if kind == 'const':
                self.env[s[1]] = s[2]
            elif kind == 'add':
                self.env[s[1]] = wrap64(
                    self.operand(s[2], iters) + self.operand(s[3], iters))
            elif kind == 'sub':
                self.env[s[1]] = wrap64(
                    self.operand(s[2], iters) - self.operand(s[3], iters))
            elif kind == 'loop':
                _, count, body = s
                i = 0
                while i < self.operand(count, iters):
                    if i >= MAX_ITERS:
                        raise Rejected()
                    if self.block(body, iters + [i]):
                        break
                    i += 1
            elif kind == 'if':
                _, branches, else_body = s
                for c, body in branches:
                    if self.cond(c, iters):
                        self.block(body, iters)
                        break
                else:
                    if else_body is not None:
                        self.block(else_body, iters)
            elif kind == 'stop_if':
                if self.cond(s[1], iters):
                    return True
            elif kind == 'mark':
                self.env[TRACE] = wrap64(self.env[TRACE] * 31 + s[1])
            else:
                raise AssertionError(kind)
        return False


def evaluate(init, program):
    m = Model(init)
    m.block(program, [])
    return m.env


# -------------------------------------------------------------- builder --

def build_program(init, program):
    """Adds the program to the active builder; returns {name: blob}."""
    blobs = {v: ops.Const(init[v]) for v in ALL}

    def operand(o, loops):
        kind, x = o
        if kind == 'var':
            return blobs[x]
        if kind == 'iter':
            return loops[x].iter()
        return ops.Const(x)

    def cond(c, loops):
        cmp, a, b = c
        return getattr(ops, cmp)([operand(a, loops), operand(b, loops)])

    def block(stmts, loops):
        for s in stmts:
            kind = s[0]
            if kind == 'const':
                ops.Const(s[2], blob_out=blobs[s[1]])
            elif kind in ('add', 'sub'):
                op = ops.Add if kind == 'add' else ops.Sub
                op([operand(s[2], loops), operand(s[3], loops)],
                   [blobs[s[1]]])
            elif kind == 'loop':
                _, count, body = s
                n = blobs[count[1]] if count[0] == 'var' else count[1]
                with ops.loop(n) as lp:
                    block(body, loops + [lp])
            elif kind == 'if':
                _, branches, else_body = s
                (c0, body0), rest = branches[0], branches[1:]
                with ops.If(cond(c0, loops)) as br:
                    block(body0, loops)
                for c, body in rest:
                    with br.Elif(cond(c, loops)) as br:
                        block(body, loops)
                if else_body is not None:
                    with br.Else():
                        block(else_body, loops)
            elif kind == 'stop_if':
                ops.stop_if(cond(s[1], loops))
            elif kind == 'mark':
                h = blobs[TRACE]
                ops.Add([ops.Mul([h, ops.Const(31)]), ops.Const(s[1])], [h])
            else:
                raise AssertionError(kind)

    block(program, [])
    return blobs


def run_in_plan(init, program):
    with NetBuilder('prog') as nb:
        blobs = build_program(init, program)
    plan = core.Plan('prog_plan')
    plan.AddStep(core.to_execution_step(nb))
    ws = workspace.Workspace()
    ws.run(plan)
    return {v: ws.fetch_blob(str(b)) for v, b in blobs.items()}


def run_in_task(init, program):
    with Task() as task:
        blobs = build_program(init, program)
        outs = {v: final_output(b) for v, b in blobs.items()}
    with LocalSession(workspace.Workspace()) as session:
        session.run(task)
        return {v: o.fetch() for v, o in outs.items()}


def as_int64_scalars(values):
    got = {}
    for v, value in values.items():
        arr = np.asarray(value)
        assert arr.dtype == np.int64, (v, arr.dtype)
        assert arr.shape == (), (v, arr.shape)
        got[v] = int(arr)
    return got


# ------------------------------------------------------------ rendering --

def render(init, program):
    """Python-like text of the program, for failure reports."""
    lines = ['%s = %d' % (v, init[v]) for v in ALL]

    def opnd(o):
        kind, x = o
        if kind == 'iter':
            return 'i%d' % x
        return str(x)

    def cnd(c):
        return '%s %s %s' % (opnd(c[1]), c[0], opnd(c[2]))

    def block(stmts, indent, depth):
        pad = '    ' * indent
        if not stmts:
            lines.append(pad + 'pass')
        for s in stmts:
            if s[0] == 'const':
                lines.append('%s%s = %d' % (pad, s[1], s[2]))
            elif s[0] in ('add', 'sub'):
                lines.append('%s%s = %s %s %s' % (
                    pad, s[1], opnd(s[2]), '+' if s[0] == 'add' else '-',
                    opnd(s[3])))
            elif s[0] == 'loop':
                lines.append('%sfor i%d in loop(%s):' % (pad, depth,
                                                         opnd(s[1])))
                block(s[2], indent + 1, depth + 1)
            elif s[0] == 'if':
                for k, (c, body) in enumerate(s[1]):
                    lines.append('%s%s %s:' % (pad, 'if' if k == 0 else 'elif',
                                               cnd(c)))
                    block(body, indent + 1, depth)
                if s[2] is not None:
                    lines.append(pad + 'else:')
                    block(s[2], indent + 1, depth)
            elif s[0] == 'mark':
                lines.append('%sh = h * 31 + %d' % (pad, s[1]))
            else:
                lines.append('%sstop_if %s' % (pad, cnd(s[1])))

    block(program, 0, 0)
    return '\n'.join(lines)


# ----------------------------------------------------------- strategies --

small_ints = st.integers(-4, 6)


def operands(n_loops):
    choices = [st.tuples(st.just('var'), st.sampled_from(VARS)),
               st.tuples(st.just('const'), small_ints)]
    if n_loops:
        choices.append(st.tuples(st.just('iter'),
                                 st.integers(0, n_loops - 1)))
    return st.one_of(*choices)


def conditions(n_loops):
    general = st.tuples(st.sampled_from(sorted(CMPS)), operands(n_loops),
                        operands(n_loops))
    if not n_loops:
        return general
    # a loop counter against a small constant: true in some iterations only
    on_iter = st.tuples(st.sampled_from(sorted(CMPS)),
                        st.tuples(st.just('iter'),
                                  st.integers(0, n_loops - 1)),
                        st.tuples(st.just('const'), st.integers(0, 3)))
    return st.one_of(general, on_iter)


@st.composite
def assignments(draw, n_loops):
    kind = draw(st.sampled_from(['const', 'add', 'sub', 'accumulate']))
    dst = draw(st.sampled_from(VARS))
    if kind == 'const':
        return ('const', dst, draw(small_ints))
    if kind == 'accumulate':
        return ('add', dst, ('var', dst), draw(operands(n_loops)))
    return (kind, dst, draw(operands(n_loops)), draw(operands(n_loops)))


@st.composite
def blocks(draw, depth, n_loops, allow_stop, min_size=0):
    stmts = []
    if depth and draw(st.integers(0, 3)):
        stmts.append(('mark', 0))         # numbered by number_marks
    size = draw(st.integers(min_size, 4 if depth < 2 else 3))
    for _ in range(size):
        kinds = ['assign', 'assign']
        if depth < MAX_DEPTH:
            kinds += ['loop', 'if']
        if allow_stop:
            kinds.append('stop_if')
            if n_loops:
                kinds.append('stop_if')
        kind = draw(st.sampled_from(kinds))
        if kind == 'assign':
            stmts.append(draw(assignments(n_loops)))
        elif kind == 'loop':
            count = draw(st.one_of(
                st.tuples(st.just('const'), st.integers(0, 3)),
                st.tuples(st.just('var'), st.sampled_from(VARS))))
            body = draw(blocks(depth + 1, n_loops + 1, True))
            stmts.append(('loop', count, body))
        elif kind == 'if':
            n_branches = draw(st.integers(1, 3))
            branches = [(draw(conditions(n_loops)),
                         draw(blocks(depth + 1, n_loops, True)))
                        for _ in range(n_branches)]
            else_body = draw(st.one_of(
                st.none(), blocks(depth + 1, n_loops, True)))
            stmts.append(('if', branches, else_body))
        else:
            # with something after it for the stop to skip
            stmts += [('stop_if', draw(conditions(n_loops))), ('mark', 0),
                      draw(assignments(n_loops))]
    return stmts


def number_marks(prog):
    """Numbers the marks 1, 2, ... in program order."""
    init, program = prog
    numbers = itertools.count(1)

    def renumber(stmts):
        out = []
        for s in stmts:
            if s[0] == 'mark':
                out.append(('mark', next(numbers)))
            elif s[0] == 'loop':
                out.append(('loop', s[1], renumber(s[2])))
            elif s[0] == 'if':
                out.append(('if', [(c, renumber(b)) for c, b in s[1]],
                            None if s[2] is None else renumber(s[2])))
            else:
                out.append(s)
        return out

    return init, renumber(program)


programs = st.tuples(
    st.fixed_dictionaries(dict({v: small_ints for v in VARS},
                               **{TRACE: st.just(0)})),
    blocks(0, 0, False, min_size=1)).map(number_marks)


# --------------------------------------------------------- the property --

@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow,
                                 HealthCheck.filter_too_much,
                                 HealthCheck.data_too_large])
@given(programs, st.booleans())
def test_random_programs_match_python_model(prog, via_task):
    init, program = prog
    try:
        expected = evaluate(init, program)
    except Rejected:
        assume(False)
    text = render(init, program)
    note(text)
    for word in ('for ', 'elif ', 'else:', 'stop_if '):
        event('has %r' % word.strip(), word in text)
    runner = run_in_task if via_task else run_in_plan
    got = as_int64_scalars(runner(init, program))
    assert got == expected


# --------------------------------------------- the evaluator on its own --

def test_model_semantics():
    # stop_if ends only the innermost block: here the If branch
    prog = [('loop', ('const', 3), [
        ('if', [(('GE', ('iter', 0), ('const', 1)), [
            ('add', 'v0', ('var', 'v0'), ('const', 10)),
            ('stop_if', ('EQ', ('const', 0), ('const', 0))),
            ('add', 'v0', ('var', 'v0'), ('const', 1000)),
        ])], None),
        ('add', 'v1', ('var', 'v1'), ('const', 1)),
    ])]
    init = dict.fromkeys(ALL, 0)
    env = evaluate(init, prog)
    assert env['v0'] == 20 and env['v1'] == 3
    # a variable count is re-read every iteration
    prog = [('loop', ('var', 'v0'), [('sub', 'v0', ('var', 'v0'),
                                      ('const', 1)),
                                     ('add', 'v1', ('var', 'v1'),
                                      ('const', 1))])]
    env = evaluate(dict(init, v0=6), prog)
    # iter 0: v0=5, iter 1: v0=4, iter 2: v0=3, then 3 >= 3 stops
    assert env == dict(init, v0=3, v1=3)
    # marks hash the path
    env = evaluate(init, [('mark', 2), ('loop', ('const', 2), [('mark', 5)])])
    assert env['h'] == ((0 * 31 + 2) * 31 + 5) * 31 + 5
    assert wrap64(2 ** 63) == -2 ** 63
    assert wrap64(-2 ** 63 - 1) == 2 ** 63 - 1


# ----------------------------------------------------- hand-written cases --

def nested_totals_program():
    """Nested loops with If/Elif/Else accumulating into several totals,
    written directly against the builder."""
    with NetBuilder('nested') as nb:
        total = ops.Const(0)
        big = ops.Const(0)
        mid = ops.Const(0)
        small = ops.Const(0)
        evens = ops.Const(0)
        with ops.loop(5) as outer:
            with ops.loop(4) as inner:
                v = ops.Sub([ops.Add([outer.iter(), outer.iter()]),
                             inner.iter()])           # v = 2i - j
                with ops.If(ops.GE([v, ops.Const(5)])) as br:
                    ops.Add([big, v], [big])
                with br.Elif(ops.GE([v, ops.Const(2)])) as br:
                    ops.Add([mid, v], [mid])
                with br.Elif(ops.EQ([v, ops.Const(1)])) as br:
                    ops.Add([mid, ops.Const(100)], [mid])
                with br.Else():
                    ops.Sub([small, v], [small])
                ops.Add([total, v], [total])
            # after the inner loop: evens counts outer iterations i with
            # i == 0, 2, 4 (i - 2 * (i // 2) is computed by a second loop)
            r = ops.Const(0)
            with ops.loop(outer.iter()):
                with ops.If(ops.EQ([r, ops.Const(0)])) as br:
                    ops.Const(1, blob_out=r)
                with br.Else():
                    ops.Const(0, blob_out=r)
            with ops.If(ops.EQ([r, ops.Const(0)])):
                ops.Add([evens, ops.Const(1)], [evens])
    blobs = (total, big, mid, small, evens)
    return nb, blobs


def nested_totals_model():
    total = big = mid = small = evens = 0
    for i in range(5):
        for j in range(4):
            v = 2 * i - j
            if v >= 5:
                big += v
            elif v >= 2:
                mid += v
            elif v == 1:
                mid += 100
            else:
                small -= v
            total += v
        if i % 2 == 0:
            evens += 1
    return total, big, mid, small, evens


def test_nested_loops_if_elif_else_totals():
    nb, blobs = nested_totals_program()
    plan = core.Plan('nested_plan')
    plan.AddStep(core.to_execution_step(nb))
    ws = workspace.Workspace()
    ws.run(plan)
    got = tuple(int(ws.fetch_blob(str(b))) for b in blobs)
    assert got == nested_totals_model() == (50, 37, 218, 7, 3)


def test_nested_loops_with_stop_if_and_branches_via_ast():
    # for i in range(4):
    #     for j in loop(3):
    #         stop_if j > i          (ends the inner loop)
    #         v3 = i + j
    #         if v3 == 3: v1 += 1
    #         elif j == 0: v2 += i
    #         else: v0 -= 100
    #         v0 += 1
    prog = [('loop', ('const', 4), [
        ('loop', ('const', 3), [
            ('stop_if', ('GT', ('iter', 1), ('iter', 0))),
            ('add', 'v3', ('iter', 0), ('iter', 1)),      # scratch: i + j
            ('if', [(('EQ', ('var', 'v3'), ('const', 3)),
                     [('add', 'v1', ('var', 'v1'), ('const', 1))]),
                    (('EQ', ('iter', 1), ('const', 0)),
                     [('add', 'v2', ('var', 'v2'), ('iter', 0))])],
             [('sub', 'v0', ('var', 'v0'), ('const', 100))]),
            ('add', 'v0', ('var', 'v0'), ('const', 1)),
        ]),
    ])]
    init = dict.fromkeys(ALL, 0)
    # by hand: (i, j) pairs run: j <= min(i, 2):
    # i=0: (0,0); i=1: (1,0) (1,1); i=2: (2,0) (2,1) (2,2);
    # i=3: (3,0) (3,1) (3,2)   -> 9 body runs, v0 += 1 each
    # i+j == 3: (2,1) (3,0)    -> v1 = 2
    # else j == 0: i = 0, 1, 2 -> v2 = 3
    # else: (1,1) (2,2) (3,1) (3,2) -> v0 -= 400
    # v3 ends as the last i + j = 5
    expected = {'v0': 9 - 400, 'v1': 2, 'v2': 3, 'v3': 5, 'h': 0}
    assert evaluate(init, prog) == expected
    assert as_int64_scalars(run_in_plan(init, prog)) == expected
    assert as_int64_scalars(run_in_task(init, prog)) == expected


def test_loop_counted_by_a_variable_changed_in_its_body():
    # the count is re-read each iteration: v0 starts at 6 and shrinks
    prog = [('loop', ('var', 'v0'), [
        ('sub', 'v0', ('var', 'v0'), ('const', 1)),
        ('add', 'v1', ('var', 'v1'), ('iter', 0)),
    ])]
    init = dict(dict.fromkeys(ALL, 0), v0=6)
    expected = {'v0': 3, 'v1': 0 + 1 + 2, 'v2': 0, 'v3': 0, 'h': 0}
    assert as_int64_scalars(run_in_plan(init, prog)) == expected


def test_uncounted_loop_with_stop_if_and_elif_chain():
    with NetBuilder('uncounted') as nb:
        x = ops.Const(10)
        a = ops.Const(0)
        b = ops.Const(0)
        c = ops.Const(0)
        with ops.loop():
            ops.stop_if(ops.LE([x, ops.Const(0)]))
            with ops.If(ops.GT([x, ops.Const(7)])) as br:
                ops.Add([a, x], [a])
            with br.Elif(ops.GT([x, ops.Const(3)])) as br:
                ops.Add([b, x], [b])
            with br.Else():
                ops.Add([c, x], [c])
            ops.Sub([x, ops.Const(3)], [x])
    plan = core.Plan('uncounted_plan')
    plan.AddStep(core.to_execution_step(nb))
    ws = workspace.Workspace()
    ws.run(plan)
    # x = 10, 7, 4, 1 enter the body; then x = -2 stops the loop
    got = [int(ws.fetch_blob(str(v))) for v in (x, a, b, c)]
    assert got == [-2, 10, 7 + 4, 1]


def test_int64_wraparound_matches_model():
    big = 2 ** 62
    prog = [('add', 'v0', ('var', 'v0'), ('var', 'v0')),     # 2**63 wraps
            ('sub', 'v1', ('var', 'v0'), ('const', 1)),      # wraps back
            ('loop', ('const', 3), [
                ('mark', 3),
                ('add', 'v2', ('var', 'v2'), ('var', 'v2'))])]
    init = {'v0': big, 'v1': 0, 'v2': 3 * 2 ** 61, 'v3': 7, 'h': big + 5}
    h = np.int64(big + 5)
    with np.errstate(over='ignore'):
        for _ in range(3):
            h = h * np.int64(31) + np.int64(3)
    expected = {'v0': -2 ** 63, 'v1': 2 ** 63 - 1,
                'v2': wrap64(3 * 2 ** 64), 'v3': 7, 'h': int(h)}
    assert expected['v2'] == 0
    assert evaluate(init, prog) == expected
    assert as_int64_scalars(run_in_plan(init, prog)) == expected

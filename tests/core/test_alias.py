"""Tests of ferrocaffe.register_caffe2_alias(): unmodified Caffe2 scripts
(``from caffe2.python import ...``) run on ferrocaffe.

Every script runs in a clean interpreter (a subprocess) so that the alias
never leaks into the other tests; results are printed and compared with
values computed by hand."""

import os
import subprocess
import sys
import textwrap

from _support import PKG_PARENT


def run_script(source, timeout=120):
    # PYTHONPATH passes through; the directory this process imported
    # ferrocaffe from goes first, so the child finds the same build.
    env = dict(os.environ)
    paths = [PKG_PARENT]
    if os.environ.get('PYTHONPATH'):
        paths.append(os.environ['PYTHONPATH'])
    env['PYTHONPATH'] = os.pathsep.join(paths)
    proc = subprocess.run(
        [sys.executable, '-c', textwrap.dedent(source)],
        env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        'script failed (%d)\nstdout:\n%s\nstderr:\n%s'
        % (proc.returncode, proc.stdout, proc.stderr))
    results = {}
    for line in proc.stdout.splitlines():
        if '=' in line:
            key, _, value = line.partition('=')
            results[key.strip()] = value.strip()
    return results


CAFFE2_SCRIPT = """
import numpy as np

import ferrocaffe
ferrocaffe.register_caffe2_alias()

from caffe2.python import core, workspace, net_builder, task, session, context
from caffe2.proto import caffe2_pb2

ops = net_builder.ops

# -- a plain net on the global workspace
workspace.ResetWorkspace()
workspace.FeedBlob('x', np.array([1.0, 2.0, 3.0], dtype=np.float32))
net = core.Net('alias_net')
with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU)):
    y = net.Add(['x', 'x'], 'y')
    z = net.Mul([y, 'x'], 'z')
    w = net.Sub([z, net.Const(np.array([1.0, 1.0, 1.0], dtype=np.float32))],
                'w')
print('netdef_type =', isinstance(net.Proto(), caffe2_pb2.NetDef))
print('device =', net.Proto().op[0].device_option.device_type)
workspace.RunNetOnce(net)
print('y =', workspace.FetchBlob('y').tolist())
print('z =', workspace.FetchBlob('z').tolist())
print('w =', workspace.FetchBlob(str(w)).tolist())

# -- a hand-built NetDef proto
nd = caffe2_pb2.NetDef()
nd.name = 'proto_net'
nd.op.extend([core.CreateOperator('Add', ['y', 'y'], ['yy'])])
workspace.RunNetOnce(nd)
print('yy =', workspace.FetchBlob('yy').tolist())

# -- a created net run several times, then a plan
init = core.Net('counter_init')
counter = init.CreateCounter([], ['counter'], init_count=0)
workspace.RunNetOnce(init)
count = core.Net('count_net')
count.CountUp([counter], ['prev'])
workspace.CreateNet(count)
workspace.RunNet(count.Proto().name, 5)
plan = core.Plan('alias_plan')
more = core.Net('count_more_net')
more.CountUp([counter], ['prev'])
plan.AddStep(core.execution_step('count_more', more, num_iter=4))
workspace.RunPlan(plan)
read = core.Net('read_net')
read.RetrieveCount([counter], ['count_value'])
workspace.RunNetOnce(read)
print('count =', int(workspace.FetchBlob('count_value')))
print('prev =', int(workspace.FetchBlob('prev')))

# -- a NetBuilder step in a plan
with net_builder.NetBuilder('nb') as nb:
    acc = ops.Const(0)
    with ops.loop(4) as loop:
        with ops.If(ops.GE([loop.iter(), ops.Const(2)])) as branch:
            ops.Add([acc, ops.Const(10)], [acc])
        with branch.Else():
            ops.Add([acc, ops.Const(1)], [acc])
plan = core.Plan('nb_plan')
plan.AddStep(core.to_execution_step(nb))
workspace.RunPlan(plan)
print('acc =', int(workspace.FetchBlob(str(acc))))

# -- a TaskGroup of two tasks run by a LocalSession
with task.Cluster():
    with task.Node('local'):
        with task.TaskGroup() as tg:
            with task.Task():
                total = ops.Const(0)
                with ops.loop(5) as loop:
                    ops.Add([total, loop.iter()], [total])
                out_total = task.final_output(total)
            with task.Task():
                c = ops.CreateCounter([], init_count=7)
                ops.CountDown(c)
                ops.CountDown(c)
                out_count = task.final_output(ops.RetrieveCount(c))
sess = session.LocalSession()
sess.run(tg)
print('task_total =', int(out_total.fetch()))
print('task_count =', int(out_count.fetch()))

# -- context: the old decorator API still works
@context.define_context()
class Config(object):
    def __init__(self, value):
        self.value = value

with Config(3):
    with Config(4) as inner:
        print('ctx_inner =', Config.current().value, Config.current() is inner)
    print('ctx_outer =', Config.current().value)
"""


def test_caffe2_script_runs_on_ferrocaffe():
    r = run_script(CAFFE2_SCRIPT)
    assert r['netdef_type'] == 'True'
    assert r['device'] == '0'                       # caffe2_pb2.CPU
    assert r['y'] == str([2.0, 4.0, 6.0])           # x + x
    assert r['z'] == str([2.0, 8.0, 18.0])          # y * x
    assert r['w'] == str([1.0, 7.0, 17.0])          # z - 1
    assert r['yy'] == str([4.0, 8.0, 12.0])         # y + y
    assert r['count'] == '9'                        # 5 runs, then 4 more
    assert r['prev'] == '8'                         # CountUp returns the old count
    assert r['acc'] == str(1 + 1 + 10 + 10)
    assert r['task_total'] == str(0 + 1 + 2 + 3 + 4)
    assert r['task_count'] == str(7 - 2)
    assert r['ctx_inner'] == '4 True'
    assert r['ctx_outer'] == '3'


MODULES = ('core', 'workspace', 'net_builder', 'task', 'session', 'context',
           'scope', 'control_ops_util', 'checkpoint', 'dataio', 'pipeline',
           'schema', 'dataset', 'queue_util', 'utils', 'control',
           'record_queue', 'db_file_reader', 'cached_reader', 'model_helper',
           'brew', 'optimizer', 'gradient_checker', 'control_ops_grad')

IDENTITY_SCRIPT = """
import sys
import ferrocaffe

print('before =', 'caffe2' in sys.modules, 'caffe2.python.core' in sys.modules)
ferrocaffe.register_caffe2_alias()

import caffe2.python.core
import ferrocaffe.core
print('core_is =', caffe2.python.core is ferrocaffe.core)

from caffe2.python import core, workspace, net_builder, task, session, context
import importlib
same = []
for name in %(modules)r:
    a = importlib.import_module('caffe2.python.' + name)
    b = importlib.import_module('ferrocaffe.' + name)
    same.append(a is b)
print('all_same =', all(same), len(same))
from caffe2.proto import caffe2_pb2
import ferrocaffe.proto
print('pb2_is =', caffe2_pb2 is ferrocaffe.proto.caffe2_pb2)
print('from_is =', core is ferrocaffe.core and task is sys.modules['ferrocaffe.task'])

try:
    import caffe2.python.no_such_module
    print('missing = imported')
except ImportError as e:
    print('missing =', type(e).__name__)
"""


def test_aliased_modules_are_the_ferrocaffe_modules():
    r = run_script(IDENTITY_SCRIPT % {'modules': MODULES})
    assert r['before'] == 'False False'
    assert r['core_is'] == 'True'
    assert r['all_same'] == 'True %d' % len(MODULES)
    assert r['pb2_is'] == 'True'
    assert r['from_is'] == 'True'
    assert r['missing'] == 'ModuleNotFoundError'


TWICE_SCRIPT = """
import sys
import numpy as np
import ferrocaffe

ferrocaffe.register_caffe2_alias()
ferrocaffe.register_caffe2_alias()
from caffe2.python import core, workspace
first = core
ferrocaffe.register_caffe2_alias()     # again, after the imports
from caffe2.python import core, workspace
finders = [f for f in sys.meta_path if type(f).__name__ == '_AliasFinder']
print('finders =', len(finders))
print('same_core =', first is core)

net = core.Net('twice')
a = net.Const(np.array([3, 4], dtype=np.int64))
b = net.Add([a, a], 'b')
workspace.RunNetOnce(net)
print('b =', workspace.FetchBlob('b').tolist())
"""


def test_registering_twice_is_harmless():
    r = run_script(TWICE_SCRIPT)
    assert r['finders'] == '1'
    assert r['same_core'] == 'True'
    assert r['b'] == str([6, 8])


def test_the_package_namespace_shows_its_api_only():
    # No helper modules (sys, types, importlib) or __future__ names leak
    # into dir(ferrocaffe).
    import ferrocaffe

    import types

    public = {n for n in dir(ferrocaffe) if not n.startswith('_')
              and not (isinstance(getattr(ferrocaffe, n), types.ModuleType)
                       and getattr(ferrocaffe, n).__name__ == 'ferrocaffe.' + n)}
    # (submodules appear once imported, as in any package)
    assert public == {'profile', 'register_caffe2_alias'}
    assert set(ferrocaffe.__all__) <= public | {'__version__', 'errors'}

"""RaySession on a cluster of two Ray nodes, started the way a real cluster
is: ``ray start --head`` and a second ``ray start --address=...`` joining
it, both on loopback addresses, each with one CPU, a custom resource and a label of
its own. The cluster is stopped at the end of the module by ending the two
``ray start --block`` processes (only its own Ray processes: never ``ray stop``).
"""

import os
import shutil
import socket
import subprocess
import tempfile
import sys
import time

import numpy as np
import pytest
import ray

from ferrocaffe import workspace
from ferrocaffe.net_builder import ops
from ferrocaffe.session import LocalSession
from ferrocaffe.task import Cluster, Node, Task, TaskGroup, final_output

# The session and default-cluster fixtures are test_distributed's; its
# `session` fixture asks for this module's `cluster`.
from test_distributed import (  # noqa: F401
    _fresh_cluster, instances_reports_and_queues, run_on, session)
from _support import PKG_PARENT


def ray_cli():
    here = os.path.join(os.path.dirname(sys.executable), 'ray')
    return here if os.path.exists(here) else shutil.which('ray')


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def ray_start(*args, env):
    """A Ray node started with ``ray start --block``: ending the process
    stops that node's processes, and only those (``ray stop`` would stop
    every Ray process on the machine, other runs' too)."""
    return subprocess.Popen([ray_cli(), 'start', '--block', '--disable-usage-stats', *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


def ray_stop(procs, address):
    for proc in reversed(procs):
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    # `ray start` records its cluster for later ray.init() calls; ours is
    # gone, so is its record (if it is still ours).
    record = os.path.join(tempfile.gettempdir(), 'ray', 'ray_current_cluster')
    try:
        with open(record) as f:
            if f.read().strip() == address:
                os.unlink(record)
    except OSError:
        pass


@pytest.fixture(scope='module')
def cluster():
    if ray.is_initialized():
        ray.shutdown()
    env = dict(os.environ, PYTHONPATH=PKG_PARENT + os.pathsep
               + os.environ.get('PYTHONPATH', ''))
    # Ray swaps 127.0.0.1 for the machine's public address but leaves the
    # rest of the loopback network alone: the head takes 127.0.0.3, the
    # worker 127.0.0.2.
    address = '127.0.0.3:%d' % free_port()
    procs = []
    try:
        procs.append(ray_start('--head', '--node-ip-address=127.0.0.3',
                               '--port=%s' % address.split(':')[1],
                               '--num-cpus=1', '--resources={"head_host": 1}',
                               '--labels=role=head', '--include-dashboard=false', env=env))
        procs.append(ray_start('--address=' + address, '--node-ip-address=127.0.0.2',
                               '--num-cpus=1', '--resources={"worker_host": 1}',
                               '--labels=role=worker', env=env))
        deadline = time.time() + 120
        while True:
            assert all(p.poll() is None for p in procs), 'a Ray node did not start'
            try:
                ray.init(address=address, _node_ip_address='127.0.0.3',
                         log_to_driver=False)
                if len([n for n in ray.nodes() if n['Alive']]) >= 2:
                    break
                ray.shutdown()
            except Exception:
                if time.time() > deadline:
                    raise
            assert time.time() < deadline, 'the second Ray node never joined'
            time.sleep(0.5)
        ids = {}
        for n in ray.nodes():
            if n['Alive']:
                kind = 'head' if 'head_host' in n['Resources'] else 'worker'
                ids[kind] = n['NodeID']
                ids[kind + '_ip'] = n['NodeManagerAddress']
        assert ids['head_ip'] == '127.0.0.3'
        assert ids['worker_ip'] == '127.0.0.2'
        yield ids
    finally:
        if ray.is_initialized():
            ray.shutdown()
        ray_stop(procs, address)


def test_nodes_land_where_their_kwargs_say(session, cluster):
    with TaskGroup() as tg:
        with Node('by_resource_head', resources={'head_host': 0.1}), Task():
            ops.Const(1)
        with Node('by_resource_worker', resources={'worker_host': 0.1}), Task():
            ops.Const(1)
        with Node('by_label', label_selector={'role': 'worker'}), Task():
            ops.Const(1)
        with Node('by_node_id', node_id=cluster['head']), Task():
            ops.Const(1)
    session.run(tg)
    where = {n: session.node_info(n)['ray_node_id'] for n in (
        'by_resource_head', 'by_resource_worker', 'by_label', 'by_node_id')}
    assert where == {
        'by_resource_head': cluster['head'],
        'by_resource_worker': cluster['worker'],
        'by_label': cluster['worker'],
        'by_node_id': cluster['head'],
    }


def test_a_task_group_across_two_ray_nodes_matches_local(session, cluster):
    want = run_on(LocalSession(workspace.Workspace(), isolate_nodes=True),
                  instances_reports_and_queues)
    assert want == ([21, 21, 55, 55], [21, 55])
    # Spread the group's nodes over both Ray nodes.
    placement = Cluster()
    with placement:
        Node('n1', resources={'head_host': 0.1})
        Node('n2', resources={'worker_host': 0.1})
    got = run_on(session, instances_reports_and_queues, placement)
    assert got == want
    assert session.node_info('n1')['ray_node_id'] == cluster['head']
    assert session.node_info('n2')['ray_node_id'] == cluster['worker']


def test_outputs_cross_ray_nodes(session):
    data = np.arange(100000, dtype=np.float64)
    with TaskGroup() as tg:
        with Node('far', resources={'worker_host': 0.1}), Task():
            out = final_output(ops.Scale(ops.Const(data), scale=0.5))
    session.run(tg)
    np.testing.assert_array_equal(out.fetch(), data * 0.5)

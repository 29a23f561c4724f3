"""The Session example from Caffe2's session.py documentation, run on
ferrocaffe.

A global TaskGroup sets up a message on node1; a private TaskGroup then runs
one task on node1, printing that message, and one on node2, printing its own.
Before that, the session runs a plain net and an execution step.

Run it with:  python examples/session_example.py      (add --ray to run
each node as a Ray actor; needs pip install 'ferrocaffe[ray]')

(The documentation's `net.Clone()` and `net.Net(...)` are spelled
`net.Clone('test2')` and `core.Net(...)` here: Caffe2's Net has no `Net`
method and `Clone` needs a name.)
"""

from ferrocaffe import core
from ferrocaffe.session import LocalSession
from ferrocaffe.task import Node, Task, TaskGroup, WorkspaceType


def build():
    net = core.Net('test1')
    net.Add([net.Const(1), net.Const(2)])

    net2 = net.Clone('test2')
    step = core.execution_step('step1', [net2])

    with TaskGroup(WorkspaceType.GLOBAL) as init_tg:
        with Node('node1'):
            n1setup = core.Net('n1setup')
            n1msg = n1setup.Const('Hello from node 1.')
            Task(step=n1setup)

    with TaskGroup() as private_tg:
        with Node('node1'):
            n1 = core.Net('n1')
            n1.Print(n1msg, 0)
            Task(step=n1)
        with Node('node2'):
            n2 = core.Net('n2')
            n2.Print(n2.Const('Hello from node 2.'), 0)
            Task(step=n2)
    return net, step, init_tg, private_tg, n1msg


def main(session=None):
    net, step, init_tg, private_tg, n1msg = build()
    session = session or LocalSession()
    session.run(net)
    session.run(step)
    session.run(init_tg)
    session.run(private_tg)
    return session, net, n1msg


if __name__ == '__main__':
    import sys
    if '--ray' in sys.argv[1:]:
        from ferrocaffe.distributed import RaySession
        main(RaySession())
    else:
        main()

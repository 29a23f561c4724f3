"""What a person sees at the prompt: sessions name themselves, and
help(net.Add) shows the op's documentation and arguments."""

import pydoc

import numpy as np

from ferrocaffe import core, workspace
from ferrocaffe.net_builder import ops
from ferrocaffe.session import LocalSession
from ferrocaffe.task import Node, Task, TaskGroup


def test_local_session_repr_counts_blobs_and_nets():
    ws = workspace.Workspace()
    session = LocalSession(ws)
    assert repr(session) == '<LocalSession open, workspace with 0 blobs, 0 nets>'
    ws.feed_blob('a', np.ones(1, np.float32))
    ws.create_net(core.Net('repr_net'))
    assert repr(session) == '<LocalSession open, workspace with 1 blobs, 1 nets>'
    session.close()
    assert repr(session).startswith('<LocalSession closed')


def test_isolated_local_session_repr_names_its_nodes():
    session = LocalSession(workspace.Workspace(), isolate_nodes=True)
    assert repr(session).endswith('isolated nodes: none yet>')
    with TaskGroup() as tg:
        with Node('repr_n2'), Task():
            ops.Const(1)
        with Node('repr_n1'), Task():
            ops.Const(2)
    session.run(tg)
    assert repr(session).endswith('isolated nodes: repr_n1, repr_n2>')


def test_help_of_an_op_method_shows_its_schema():
    net = core.Net('help_net')
    text = pydoc.render_doc(net.Add, renderer=pydoc.plaintext)
    assert "Add(inputs, outputs=None, **args)" in text
    assert "Adds an 'Add' operator" in text
    # Caffe2's Add: two inputs, one output, numpy-style broadcast argument.
    assert 'Inputs: 2. Outputs: 1.' in text
    assert 'broadcast (int, default 0)' in text
    fill = pydoc.render_doc(net.ConstantFill, renderer=pydoc.plaintext)
    assert 'Inputs: 0 to 2. Outputs: 1.' in fill
    for arg in ('value', 'dtype', 'shape', 'extra_shape', 'input_as_shape'):
        assert '    %s (' % arg in fill
    # The method still adds the op.
    net.Add(['x', 'y'], 'z')
    assert [op.type for op in net.Proto().op] == ['Add']

"""Caffe2's ``rnn_cell``: present so that code importing it loads, but
recurrent networks (the ``RecurrentNetwork`` op and its cells) are not
among the modules ferrocaffe provides (docs/porting.md): every name of the
module raises NotImplementedError when used."""


def __getattr__(name):
    if name.startswith('__'):
        raise AttributeError(name)
    raise NotImplementedError(
        "caffe2.python.rnn_cell.%s: recurrent networks (RecurrentNetwork, "
        "LSTM and the other cells) are not implemented by ferrocaffe" % name)

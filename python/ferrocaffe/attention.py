"""Caffe2's ``attention``: the attention kinds, so that code naming them
imports. The attention computations (and ``rnn_cell``'s attention cells)
are not provided yet (docs/porting.md): each function raises
NotImplementedError."""

__all__ = ["AttentionType"]


class AttentionType:
    Regular, Recurrent, Dot, SoftCoverage = range(4)


def _missing(name):
    def f(*args, **kwargs):
        raise NotImplementedError(
            "attention.%s: attention is not provided by ferrocaffe yet" % name)
    f.__name__ = name
    return f


apply_regular_attention = _missing("apply_regular_attention")
apply_recurrent_attention = _missing("apply_recurrent_attention")
apply_dot_attention = _missing("apply_dot_attention")
apply_soft_coverage_attention = _missing("apply_soft_coverage_attention")

"""Attention over an encoder's outputs for a decoder step (Caffe2's
``caffe2.python.attention``), used by ``rnn_cell``'s attention cells.

Every kind computes, for the decoder state of one step, a weight per
encoder position (a softmax over the positions, masked past each
sequence's length when ``encoder_lengths`` is given) and the weighted sum
of the encoder outputs, the *context*. They differ in the score of a
position:

* ``Regular``: ``v . tanh(W_e s_j + W_d h)`` (``weighted_encoder_outputs``
  holds ``W_e s_j``, computed once outside the step);
* ``Recurrent``: as Regular, plus ``W_c`` applied to the previous context;
* ``Dot``: ``s_j . (W_d h)`` (``W_d`` only when the sizes differ);
* ``SoftCoverage``: as Regular, plus the encoder-sized ``coverage_weights``
  times the attention summed over earlier steps (the coverage, returned).

Shapes: encoder outputs transposed (batch, encoder dim, encoder length),
weighted encoder outputs (encoder length, batch, encoder dim), decoder
state (1, batch, decoder dim). Each returns (context (1, batch, encoder
dim), attention weights (batch, encoder length, 1), the blobs to recompute
on the backward pass[, coverage]). Blob and parameter names are Caffe2's,
under ``scope``.
"""

from __future__ import annotations

from ferrocaffe import brew

__all__ = [
    "AttentionType",
    "apply_dot_attention",
    "apply_recurrent_attention",
    "apply_regular_attention",
    "apply_soft_coverage_attention",
]


class AttentionType:
    Regular, Recurrent, Dot, SoftCoverage = range(4)


def _name(scope, name):
    # Names are put together by hand: the cells' blobs live partly inside
    # and partly outside the step net's name scope.
    return "%s/%s" % (scope, name)


def _context(model, encoder_outputs_transposed, encoder_output_dim, weights_3d, scope):
    """The weighted sum of the encoder outputs: (1, batch, encoder dim)."""
    context = brew.batch_mat_mul(
        model, [encoder_outputs_transposed, weights_3d],
        _name(scope, "attention_weighted_encoder_context"))
    context, _ = model.net.Reshape(
        context, [context, _name(scope, "attention_weighted_encoder_context_old_shape")],
        shape=[1, -1, encoder_output_dim])
    return context


def _weights(model, logits_transposed, scope, encoder_lengths=None):
    """Softmax over the encoder positions (axis 1 of (batch, length, 1)),
    positions past a sequence's length masked out first."""
    if encoder_lengths is not None:
        logits_transposed = model.net.SequenceMask(
            [logits_transposed, encoder_lengths], ["masked_attention_logits"], mode="sequence")
    return brew.softmax(model, logits_transposed, _name(scope, "attention_weights_3d"), axis=1)


def _sum_match_logits(model, summed, encoder_output_dim, scope):
    """``v . tanh(summed)`` per position, as (batch, length, 1)."""
    summed = model.net.Tanh(summed, summed)
    logits = brew.fc(model, summed, _name(scope, "attention_logits"), dim_in=encoder_output_dim,
                     dim_out=1, axis=2, freeze_bias=True)
    return brew.transpose(model, logits, _name(scope, "attention_logits_transposed"),
                          axes=[1, 0, 2])


def _project(model, blob, dim_in, dim_out, scope, name):
    """An FC over the last axis of a (1, batch, dim_in) blob, as (batch, dim_out)."""
    out = brew.fc(model, blob, _name(scope, name), dim_in=dim_in, dim_out=dim_out, axis=2)
    return model.net.Squeeze(out, out, dims=[0])


def _finish(model, summed, encoder_output_dim, encoder_outputs_transposed, scope,
            encoder_lengths):
    """Scores from the summed projections, then weights and context."""
    logits = _sum_match_logits(model, summed, encoder_output_dim, scope)
    weights = _weights(model, logits, scope, encoder_lengths)
    context = _context(model, encoder_outputs_transposed, encoder_output_dim, weights, scope)
    return context, weights


def apply_regular_attention(model, encoder_output_dim, encoder_outputs_transposed,
                            weighted_encoder_outputs, decoder_hidden_state_t,
                            decoder_hidden_state_dim, scope, encoder_lengths=None):
    decoder = _project(model, decoder_hidden_state_t, decoder_hidden_state_dim,
                       encoder_output_dim, scope, "weighted_decoder_hidden_state")
    summed = model.net.Add([weighted_encoder_outputs, decoder],
                           _name(scope, "decoder_hidden_encoder_outputs_sum"), broadcast=1)
    context, weights = _finish(model, summed, encoder_output_dim, encoder_outputs_transposed,
                               scope, encoder_lengths)
    return context, weights, [summed]


def apply_recurrent_attention(model, encoder_output_dim, encoder_outputs_transposed,
                              weighted_encoder_outputs, decoder_hidden_state_t,
                              decoder_hidden_state_dim, attention_weighted_encoder_context_t_prev,
                              scope, encoder_lengths=None):
    previous = _project(model, attention_weighted_encoder_context_t_prev, encoder_output_dim,
                        encoder_output_dim, scope, "weighted_prev_attention_context")
    decoder = _project(model, decoder_hidden_state_t, decoder_hidden_state_dim,
                       encoder_output_dim, scope, "weighted_decoder_hidden_state")
    both = model.net.Add([previous, decoder],
                         _name(scope, "decoder_hidden_encoder_outputs_sum_tmp"))
    summed = model.net.Add([weighted_encoder_outputs, both],
                           _name(scope, "decoder_hidden_encoder_outputs_sum"), broadcast=1)
    context, weights = _finish(model, summed, encoder_output_dim, encoder_outputs_transposed,
                               scope, encoder_lengths)
    return context, weights, [summed]


def apply_dot_attention(model, encoder_output_dim, encoder_outputs_transposed,
                        decoder_hidden_state_t, decoder_hidden_state_dim, scope,
                        encoder_lengths=None):
    decoder = decoder_hidden_state_t
    if decoder_hidden_state_dim != encoder_output_dim:
        decoder = brew.fc(model, decoder, _name(scope, "weighted_decoder_hidden_state"),
                          dim_in=decoder_hidden_state_dim, dim_out=encoder_output_dim, axis=2)
    # (batch, encoder dim, 1)
    column = model.net.Squeeze(decoder, _name(scope, "squeezed_weighted_decoder_hidden_state"),
                               dims=[0])
    column = model.net.ExpandDims(column, column, dims=[2])
    logits = model.net.BatchMatMul([encoder_outputs_transposed, column],
                                   _name(scope, "attention_logits"), trans_a=1)
    weights = _weights(model, logits, scope, encoder_lengths)
    context = _context(model, encoder_outputs_transposed, encoder_output_dim, weights, scope)
    return context, weights, []


def apply_soft_coverage_attention(model, encoder_output_dim, encoder_outputs_transposed,
                                  weighted_encoder_outputs, decoder_hidden_state_t,
                                  decoder_hidden_state_dim, scope, encoder_lengths,
                                  coverage_t_prev, coverage_weights):
    decoder = _project(model, decoder_hidden_state_t, decoder_hidden_state_dim,
                       encoder_output_dim, scope, "weighted_decoder_hidden_state")
    partial = model.net.Add([weighted_encoder_outputs, decoder],
                            _name(scope, "decoder_hidden_encoder_outputs_sum_tmp"), broadcast=1)
    # The coverage (1, batch, length) as (length, batch), scaling the
    # per-position coverage weights (length, batch, encoder dim).
    coverage = model.net.Squeeze(coverage_t_prev, _name(scope, "coverage_t_prev_2d"), dims=[0])
    coverage = brew.transpose(model, coverage, _name(scope, "coverage_t_prev_transposed"))
    scaled = model.net.Mul([coverage_weights, coverage], _name(scope, "scaled_coverage_weights"),
                           broadcast=1, axis=0)
    summed = model.net.Add([partial, scaled], _name(scope, "decoder_hidden_encoder_outputs_sum"))
    context, weights = _finish(model, summed, encoder_output_dim, encoder_outputs_transposed,
                               scope, encoder_lengths)
    weights_2d = model.net.Squeeze(weights, _name(scope, "attention_weights_2d"), dims=[2])
    coverage_t = model.net.Add([coverage_t_prev, weights_2d], _name(scope, "coverage_t"),
                               broadcast=1)
    return context, weights, [summed], coverage_t

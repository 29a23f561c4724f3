"""Caffe2's ``gru_cell``: a GRU cell for ``rnn_cell``'s machinery and the
function ``GRU`` (one RecurrentNetwork op over a sequence).

A step: the projected input (``i2h``, 3 * hidden wide, computed once over
the sequence) is split into its reset, update and output parts; the reset
and update gates add an FC of the previous hidden state; the output gate
adds an FC of (sigmoid(reset) * h_prev), or with ``linear_before_reset``
sigmoid(reset) * FC(h_prev); ``GRUUnit`` then mixes h_prev and
tanh(output) by sigmoid(update).
"""

import functools

from ferrocaffe import brew, rnn_cell

__all__ = ["GRUCell", "GRU"]


class GRUCell(rnn_cell.RNNCell):
    """A GRU step; ``forget_bias`` is accepted and unused, as in Caffe2."""

    def __init__(self, input_size, hidden_size, forget_bias, memory_optimization,
                 drop_states=False, linear_before_reset=False, **kwargs):
        super(GRUCell, self).__init__(**kwargs)
        self.input_size, self.hidden_size = input_size, hidden_size
        self.forget_bias = float(forget_bias)
        self.memory_optimization = memory_optimization
        self.drop_states = drop_states
        self.linear_before_reset = linear_before_reset

    def _fc(self, model, blob, name):
        return brew.fc(model, blob, self.scope(name), dim_in=self.hidden_size,
                       dim_out=self.hidden_size, axis=2)

    def _apply(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        h_prev = states[0]
        x_reset, x_update, x_output = model.net.Split(
            [input_t], [self.scope("input_t_reset"), self.scope("input_t_update"),
                        self.scope("input_t_output")], axis=2)
        reset = self._fc(model, h_prev, "reset_gate_t")
        update = self._fc(model, h_prev, "update_gate_t")
        reset = model.net.Sum([reset, x_reset], self.scope("reset_gate_t"))
        reset_sig = model.net.Sigmoid(reset, self.scope("reset_gate_t_sigmoid"))
        if self.linear_before_reset:
            output = model.net.Mul([reset_sig, self._fc(model, h_prev, "output_gate_t")],
                                   self.scope("output_gate_t_mul"))
        else:
            reset_h = model.net.Mul([reset_sig, h_prev], self.scope("modified_hidden_t_prev"))
            output = self._fc(model, reset_h, "output_gate_t")
        update = model.net.Sum([update, x_update], self.scope("update_gate_t"))
        output = model.net.Sum([output, x_output], self.scope("output_gate_t_summed"))
        gates, _ = model.net.Concat([reset, update, output],
                                    [self.scope("gates_t"), self.scope("_gates_t_concat_dims")],
                                    axis=2)
        ins = [h_prev, gates] + ([seq_lengths] if seq_lengths is not None else []) + [timestep]
        hidden = model.net.GRUUnit(ins, list(self.get_state_names()),
                                   forget_bias=self.forget_bias, drop_states=self.drop_states,
                                   sequence_lengths=seq_lengths is not None)
        model.net.AddExternalOutputs(hidden)
        return (hidden,)

    def prepare_input(self, model, input_blob):
        return brew.fc(model, input_blob, self.scope("i2h"), dim_in=self.input_size,
                       dim_out=3 * self.hidden_size, axis=2)

    def get_state_names(self):
        return (self.scope("hidden_t"),)

    def get_output_dim(self):
        return self.hidden_size


GRU = functools.partial(rnn_cell._recurrent_layers, GRUCell)

"""Caffe2's ``rnn_cell``: recurrent cells and the functions that run them
over a sequence with one ``RecurrentNetwork`` op (``recurrent.recurrent_net``).

A cell describes one timestep: ``_apply`` adds the ops of the step to a
step model (inputs ``input_t``, the previous states, ``seq_lengths`` and
``timestep``) and returns the new states; ``prepare_input`` adds the ops that
depend only on the input (the input projection), run once over the whole
sequence before the recurrence; ``apply_over_sequence`` builds the step net
and the op. Names follow Caffe2 (``<scope>/i2h``, ``<scope>/gates_t``,
``<scope>/hidden_t``...), so parameters and outputs are found where Caffe2
scripts look for them.

Provided: ``RNNCell``, ``BasicRNNCell``, ``LSTMCell``, ``MILSTMCell``,
``DropoutCell``, ``MultiRNNCell`` and the functions ``BasicRNN``, ``LSTM``,
``MILSTM``, ``layered_LSTM``, ``GetLSTMParamNames``, ``InitFromLSTMParams``.
``cudnn_LSTM`` needs CUDA and raises; the layer-norm and attention cells
are not provided yet (docs/porting.md).
"""

import functools
import inspect

import numpy as np

from ferrocaffe import brew, core, recurrent, scope, workspace
from ferrocaffe.attention import (
    AttentionType, apply_dot_attention, apply_recurrent_attention, apply_regular_attention,
    apply_soft_coverage_attention)
from ferrocaffe.model_helper import ModelHelper
from ferrocaffe.modeling.initializers import Initializer
from ferrocaffe.modeling.parameter_sharing import ParameterSharing

__all__ = [
    "RNNCell", "LSTMInitializer", "BasicRNNCell", "LSTMCell", "MILSTMCell", "DropoutCell",
    "MultiRNNCellInitializer", "MultiRNNCell", "LSTM", "BasicRNN", "MILSTM", "layered_LSTM",
    "GetLSTMParamNames", "InitFromLSTMParams", "cudnn_LSTM",
]


def _ref(blob):
    """A BlobReference for a name (so name scopes entered later leave it alone)."""
    if blob is None or isinstance(blob, core.BlobReference):
        return blob
    return core.BlobReference(str(blob))


def _refs(blobs):
    return [_ref(b) for b in blobs]


class RNNCell(object):
    """A recurrent cell: subclasses give ``apply_override`` (the ops of one
    step) and ``get_state_names_override`` (the states' names), and may
    override ``prepare_input`` and the output hooks."""

    def __init__(self, name=None, forward_only=False, initializer=None):
        self.name = name
        self.recompute_blobs = []
        self.forward_only = forward_only
        self._initializer = initializer

    @property
    def initializer(self):
        return self._initializer

    @initializer.setter
    def initializer(self, value):
        self._initializer = value

    def scope(self, name):
        return name if self.name is None else "%s/%s" % (self.name, name)

    def apply_over_sequence(self, model, inputs, seq_lengths=None, initial_states=None,
                            outputs_with_grads=None):
        """Runs the cell over ``inputs`` (T, N, D) with one RecurrentNetwork
        op; returns (the output sequence, every state's (all steps, last
        step) outputs, in state order)."""
        if initial_states is None:
            if self.initializer is None:
                raise ValueError("apply_over_sequence: give initial_states or set the cell's "
                                 "initializer")
            with scope.NameScope(self.name):
                initial_states = self.initializer.create_states(model)
        sequence = self.prepare_input(model, inputs)
        step = ModelHelper(name=self.name, param_model=model)
        input_t, timestep = step.net.AddScopedExternalInputs("input_t", "timestep")
        names = self.get_state_names()
        if len(initial_states) != len(names):
            raise ValueError("apply_over_sequence: %d initial states for %d states (%s)"
                             % (len(initial_states), len(names), list(names)))
        states_prev = step.net.AddScopedExternalInputs(*[s + "_prev" for s in names])
        states = self._apply(model=step, input_t=input_t, seq_lengths=seq_lengths,
                             states=states_prev, timestep=timestep)
        declared = set(step.net.Proto().external_output)
        for s in states:
            if str(s) not in declared:
                step.net.AddExternalOutput(s)
        if outputs_with_grads is None:
            outputs_with_grads = [2 * self.get_output_state_index()]
        results = recurrent.recurrent_net(
            net=model.net, cell_net=step.net, inputs=[(input_t, sequence)],
            initial_cell_inputs=list(zip(states_prev, initial_states)),
            links=dict(zip(states_prev, states)), timestep=timestep, scope=self.name,
            forward_only=self.forward_only, outputs_with_grads=outputs_with_grads,
            recompute_blobs_on_backward=self.recompute_blobs)
        return self._prepare_output_sequence(model, results), results

    def apply(self, model, input_t, seq_lengths, states, timestep):
        """One step added to ``model`` directly: (output, new states)."""
        input_t = self.prepare_input(model, input_t)
        states = self._apply(model, input_t, seq_lengths, states, timestep)
        return self._prepare_output(model, states), states

    def _apply(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        """``apply_override`` in the cell's name scope; its inputs keep the
        names they had outside it."""
        args = self._rectify_apply_inputs(input_t, seq_lengths, states, timestep, extra_inputs)
        with core.NameScope(self.name):
            return self.apply_override(model, *args)

    def _rectify_apply_inputs(self, input_t, seq_lengths, states, timestep, extra_inputs):
        input_t, seq_lengths, timestep = _refs([input_t, seq_lengths, timestep])
        states = _refs(states)
        args = [input_t, seq_lengths, states, timestep]
        if "extra_inputs" in inspect.signature(self.apply_override).parameters:
            if extra_inputs:
                extra_inputs = [(_ref(b), size) for b, size in extra_inputs]
            args.append(extra_inputs)
        return args

    def apply_override(self, model, input_t, seq_lengths, timestep, extra_inputs=None):
        """The ops of one step (``input_t`` (1, N, D)); returns the new states."""
        raise NotImplementedError("RNNCell.apply_override: implemented by each cell")

    def prepare_input(self, model, input_blob):
        """Ops that depend only on the input, run over the whole sequence."""
        return input_blob

    def get_output_state_index(self):
        """Which state is the cell's output."""
        return 0

    def get_state_names(self):
        return [self.scope(n) for n in self.get_state_names_override()]

    def get_state_names_override(self):
        raise NotImplementedError("RNNCell.get_state_names_override: implemented by each cell")

    def get_output_dim(self):
        raise NotImplementedError("RNNCell.get_output_dim: implemented by each cell")

    def _prepare_output(self, model, states):
        return states[self.get_output_state_index()]

    def _prepare_output_sequence(self, model, state_outputs):
        # state_outputs holds (all steps, last step) per state.
        return state_outputs[2 * self.get_output_state_index()]


class LSTMInitializer(object):
    """Zero initial hidden and cell states, as parameters of the model."""

    def __init__(self, hidden_size):
        self.hidden_size = hidden_size

    def create_states(self, model):
        return [
            model.create_param(param_name=name, shape=[self.hidden_size],
                               initializer=Initializer(operator_name="ConstantFill", value=0.0))
            for name in ("initial_hidden_state", "initial_cell_state")
        ]


def _gate_fc(model, concat_name, fc_input, fc_dim, extra_inputs, name, dim_out):
    """The recurrent projection: an FC (axis 2) of the previous hidden state,
    concatenated first with the extra inputs if any."""
    if extra_inputs:
        blobs, sizes = zip(*extra_inputs)
        fc_input = brew.concat(model, [fc_input] + list(blobs), concat_name, axis=2)
        fc_dim += sum(sizes)
    return brew.fc(model, fc_input, name, dim_in=fc_dim, dim_out=dim_out, axis=2)


class BasicRNNCell(RNNCell):
    """h_t = activation(W_h h_{t-1} + b_h + W_x x_t + b_x), activation tanh or
    relu; rows past their sequence keep h_{t-1} (or 0 with drop_states)."""

    def __init__(self, input_size, hidden_size, forget_bias, memory_optimization,
                 drop_states=False, initializer=None, activation=None, **kwargs):
        super(BasicRNNCell, self).__init__(**kwargs)
        if activation not in ("relu", "tanh"):
            raise ValueError("BasicRNNCell: activation must be 'relu' or 'tanh', got %r"
                             % (activation,))
        self.input_size, self.hidden_size = input_size, hidden_size
        self.drop_states, self.activation = drop_states, activation

    def apply_override(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        h_prev = states[0]
        gates = brew.fc(model, h_prev, "gates_t", dim_in=self.hidden_size,
                        dim_out=self.hidden_size, axis=2)
        brew.sum(model, [gates, input_t], gates)
        act = model.net.Tanh if self.activation == "tanh" else model.net.Relu
        hidden = act(gates, "hidden_t")
        if seq_lengths is not None:
            # live rows (t < length) take the new state, the others the old
            # one (or 0): masks made from the lengths and the timestep.
            t = model.net.CopyFromCPUInput(timestep, "timestep_gpu")
            live = model.net.Cast(model.net.GT([seq_lengths, t], "valid_b", broadcast=1),
                                  "valid", to="float")
            done = model.net.Cast(model.net.LE([seq_lengths, t], "invalid_b", broadcast=1),
                                  "invalid", to="float")
            kept = model.net.Mul([hidden, live], "hidden_valid", broadcast=1, axis=1)
            if self.drop_states:
                hidden = kept
            else:
                old = model.net.Mul([h_prev, done], "hidden_invalid", broadcast=1, axis=1)
                hidden = model.net.Add([kept, old], hidden)
        return (hidden,)

    def prepare_input(self, model, input_blob):
        return brew.fc(model, input_blob, self.scope("i2h"), dim_in=self.input_size,
                       dim_out=self.hidden_size, axis=2)

    def get_state_names(self):
        return (self.scope("hidden_t"),)

    def get_output_dim(self):
        return self.hidden_size


class LSTMCell(RNNCell):
    """An LSTM step: the gates are an FC of the previous hidden state plus the
    projected input (``i2h``, computed once over the sequence), then
    ``LSTMUnit``."""

    def __init__(self, input_size, hidden_size, forget_bias, memory_optimization,
                 drop_states=False, initializer=None, **kwargs):
        super(LSTMCell, self).__init__(initializer=initializer, **kwargs)
        self.initializer = initializer or LSTMInitializer(hidden_size=hidden_size)
        self.input_size, self.hidden_size = input_size, hidden_size
        self.forget_bias = float(forget_bias)
        self.memory_optimization = memory_optimization
        self.drop_states = drop_states
        self.gates_size = 4 * hidden_size

    def apply_override(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        h_prev, c_prev = states
        gates = _gate_fc(model, "gates_concatenated_input_t", h_prev, self.hidden_size,
                         extra_inputs, "gates_t",
                         self.gates_size)
        brew.sum(model, [gates, input_t], gates)
        ins = [h_prev, c_prev, gates] + ([seq_lengths] if seq_lengths is not None else [])
        hidden, cell = model.net.LSTMUnit(
            ins + [timestep], ["hidden_state", "cell_state"], forget_bias=self.forget_bias,
            drop_states=self.drop_states, sequence_lengths=seq_lengths is not None)
        model.net.AddExternalOutputs(hidden, cell)
        if self.memory_optimization:
            self.recompute_blobs = [gates]
        return hidden, cell

    def get_input_params(self):
        return {"weights": self.scope("i2h") + "_w", "biases": self.scope("i2h") + "_b"}

    def get_recurrent_params(self):
        return {"weights": self.scope("gates_t") + "_w", "biases": self.scope("gates_t") + "_b"}

    def prepare_input(self, model, input_blob):
        return brew.fc(model, input_blob, self.scope("i2h"), dim_in=self.input_size,
                       dim_out=self.gates_size, axis=2)

    def get_state_names_override(self):
        return ["hidden_t", "cell_t"]

    def get_output_dim(self):
        return self.hidden_size


class MILSTMCell(LSTMCell):
    """The multiplicative-integration LSTM: gates = (alpha * x + beta_h) *
    (W h) + beta_i * x + b, then LSTMUnit."""

    def _apply(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        h_prev, c_prev = states
        prev = _gate_fc(model, self.scope("gates_concatenated_input_t"), h_prev,
                        self.hidden_size, extra_inputs, self.scope("prev_t"), self.gates_size)

        def param(name, value):
            return model.create_param(self.scope(name), shape=[self.gates_size],
                                      initializer=Initializer("ConstantFill", value=value))

        alpha, beta_h, beta_i, b = (param("alpha", 1.0), param("beta1", 1.0),
                                    param("beta2", 1.0), param("b", 0.0))
        scaled = model.net.ElementwiseLinear([input_t, alpha, beta_h],
                                             self.scope("alpha_by_input_t_plus_beta_h"), axis=2)
        product = model.net.Mul([scaled, prev],
                                self.scope("alpha_by_input_t_plus_beta_h_by_prev_t"))
        shifted = model.net.ElementwiseLinear([input_t, beta_i, b],
                                              self.scope("beta_i_by_input_t_plus_b"), axis=2)
        gates = brew.sum(model, [product, shifted], self.scope("gates_t"))
        gates = self._normalize_gates(model, gates)
        hidden, cell = model.net.LSTMUnit(
            [h_prev, c_prev, gates, seq_lengths, timestep],
            [self.scope("hidden_t_intermediate"), self.scope("cell_t")],
            forget_bias=self.forget_bias, drop_states=self.drop_states)
        model.net.AddExternalOutputs(cell, hidden)
        if self.memory_optimization:
            self.recompute_blobs = [gates]
        return hidden, cell


    def _normalize_gates(self, model, gates):
        return gates


def _layer_norm_gates(cell, model, gates):
    """The gates through a LayerNorm over the gate axis, with a learned
    scale and bias (``gates_t_norm_scale``, ``gates_t_norm_bias``)."""
    normalized, _, _ = brew.layer_norm(model, gates, cell.scope("gates_t_norm"),
                                       dim_in=cell.gates_size, axis=-1)
    return normalized


class LayerNormLSTMCell(LSTMCell):
    """An LSTMCell whose gates (the recurrent FC plus the projected input)
    go through a LayerNorm before LSTMUnit."""

    def _apply(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        input_t, seq_lengths, states, timestep = self._rectify_apply_inputs(
            input_t, seq_lengths, states, timestep, None)[:4]
        h_prev, c_prev = states
        gates = _gate_fc(model, self.scope("gates_concatenated_input_t"), h_prev,
                         self.hidden_size, extra_inputs, self.scope("gates_t"), self.gates_size)
        brew.sum(model, [gates, input_t], gates)
        gates = _layer_norm_gates(self, model, gates)
        ins = [h_prev, c_prev, gates] + ([seq_lengths] if seq_lengths is not None else [])
        hidden, cell = model.net.LSTMUnit(
            ins + [timestep], [core.BlobReference(n) for n in self.get_state_names()],
            forget_bias=self.forget_bias, drop_states=self.drop_states,
            sequence_lengths=seq_lengths is not None)
        model.net.AddExternalOutputs(hidden, cell)
        if self.memory_optimization:
            self.recompute_blobs = [gates]
        return hidden, cell


class LayerNormMILSTMCell(MILSTMCell):
    """A MILSTMCell whose gates go through a LayerNorm before LSTMUnit."""

    def _normalize_gates(self, model, gates):
        return _layer_norm_gates(self, model, gates)


class DropoutCell(RNNCell):
    """Another cell with dropout on its output (not on its recurrent
    state). ``is_test`` is required."""

    def __init__(self, internal_cell, dropout_ratio=None, use_cudnn=False, **kwargs):
        if "is_test" not in kwargs:
            raise ValueError("DropoutCell: the argument 'is_test' is required")
        self.is_test = kwargs.pop("is_test")
        super(DropoutCell, self).__init__(**kwargs)
        self.internal_cell = internal_cell
        self.dropout_ratio = dropout_ratio
        self.use_cudnn = use_cudnn
        self.prepare_input = internal_cell.prepare_input
        self.get_output_state_index = internal_cell.get_output_state_index
        self.get_state_names = internal_cell.get_state_names
        self.get_output_dim = internal_cell.get_output_dim
        self.mask = 0

    def _apply(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        return self.internal_cell._apply(model, input_t, seq_lengths, states, timestep,
                                         extra_inputs)

    def _prepare_output(self, model, states):
        return self._dropout(model, self.internal_cell._prepare_output(model, states))

    def _prepare_output_sequence(self, model, state_outputs):
        return self._dropout(model,
                             self.internal_cell._prepare_output_sequence(model, state_outputs))

    def _dropout(self, model, output):
        if self.dropout_ratio is None or not self.dropout_ratio or self.forward_only:
            return output
        with core.NameScope(self.name or ""):
            out = brew.dropout(model, output, "%s_with_dropout_mask%d" % (output, self.mask),
                               ratio=float(self.dropout_ratio), is_test=self.is_test,
                               use_cudnn=self.use_cudnn)
        self.mask += 1
        return out


class MultiRNNCellInitializer(object):
    """The initial states of each layer's cell, in layer order."""

    def __init__(self, cells):
        self.cells = cells

    def create_states(self, model):
        states = []
        for i, cell in enumerate(self.cells):
            if cell.initializer is None:
                raise ValueError("MultiRNNCell: layer %d's cell has no initializer" % i)
            with core.NameScope("layer_%d" % i), core.NameScope(cell.name):
                states.extend(cell.initializer.create_states(model))
        return states


class MultiRNNCell(RNNCell):
    """Layers of cells in one step: each layer's output is the next layer's
    input; ``residual_output_layers`` add a layer's input to its output
    (not layer 0)."""

    def __init__(self, cells, residual_output_layers=None, **kwargs):
        super(MultiRNNCell, self).__init__(**kwargs)
        self.cells = cells
        self.residual_output_layers = list(residual_output_layers or [])
        first_state, base = [], 0
        for cell in cells:
            first_state.append(base + cell.get_output_state_index())
            base += len(cell.get_state_names())
        # The layers whose outputs are summed into the cell's output: the
        # last one and the chain of residual layers right below it.
        self.output_connected_layers, self.output_indices = [], []
        for i in range(len(cells) - 1):
            if i + 1 in self.residual_output_layers:
                self.output_connected_layers.append(i)
                self.output_indices.append(first_state[i])
            else:
                self.output_connected_layers, self.output_indices = [], []
        self.output_connected_layers.append(len(cells) - 1)
        self.output_indices.append(first_state[-1])
        self.state_names = []
        for i, cell in enumerate(cells):
            self.state_names.extend(self.layer_scoper(i)(n) for n in cell.get_state_names())
        self.initializer = MultiRNNCellInitializer(cells)

    def layer_scoper(self, layer_id):
        def scoped(name):
            return "%s/layer_%d/%s" % (self.name, layer_id, name)
        return scoped

    def prepare_input(self, model, input_blob):
        with core.NameScope(self.name or ""):
            return self.cells[0].prepare_input(model, _ref(input_blob))

    def _apply(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        input_t, seq_lengths, timestep = _refs([input_t, seq_lengths, timestep])
        states = _refs(states)
        if extra_inputs:
            extra_inputs = [(_ref(b), size) for b, size in extra_inputs]
        counts = [len(c.get_state_names()) for c in self.cells]
        if len(states) != sum(counts):
            raise ValueError("MultiRNNCell: %d states for layers taking %d"
                             % (len(states), sum(counts)))
        new_states, at, layer_input = [], 0, input_t
        for i, cell in enumerate(self.cells):
            with core.NameScope(self.name), core.NameScope("layer_%d" % i):
                mine = states[at:at + counts[i]]
                at += counts[i]
                prepared = cell.prepare_input(model, layer_input) if i > 0 else layer_input
                nxt = cell._apply(model, prepared, seq_lengths, mine, timestep,
                                  extra_inputs=extra_inputs if i == 0 else None)
                if i != len(self.cells) - 1:
                    out = cell._prepare_output(model, nxt)
                    if i > 0 and i in self.residual_output_layers:
                        layer_input = brew.sum(model, [out, layer_input],
                                               self.scope("residual_output_%d" % i))
                    else:
                        layer_input = out
                new_states.extend(nxt)
        return new_states

    def get_state_names(self):
        return self.state_names

    def get_output_state_index(self):
        return (sum(len(c.get_state_names()) for c in self.cells[:-1])
                + self.cells[-1].get_output_state_index())

    def _connected(self, model, states, per_state, prepare, name):
        outs, at = [], 0
        for i, cell in enumerate(self.cells):
            n = per_state * len(cell.get_state_names())
            if i in self.output_connected_layers:
                outs.append(getattr(cell, prepare)(model, states[at:at + n]))
            at += n
        return outs[0] if len(outs) == 1 else brew.sum(model, outs, self.scope(name))

    def _prepare_output(self, model, states):
        return self._connected(model, states, 1, "_prepare_output", "residual_output")

    def _prepare_output_sequence(self, model, states):
        return self._connected(model, states, 2, "_prepare_output_sequence",
                               "residual_output_sequence")


class AttentionCell(RNNCell):
    """A decoder cell whose every step also attends over an encoder's
    outputs (``attention``): the decoder's step reads the previous context
    as an extra input, then the context of its new output state is
    computed. States: the decoder's (its output state renamed
    ``hidden_t_external``), the context, and for ``SoftCoverage`` the
    coverage. The output is the decoder's output beside the context."""

    def __init__(self, encoder_output_dim, encoder_outputs, encoder_lengths, decoder_cell,
                 decoder_state_dim, attention_type, weighted_encoder_outputs,
                 attention_memory_optimization, **kwargs):
        super(AttentionCell, self).__init__(**kwargs)
        if attention_type not in (AttentionType.Regular, AttentionType.Recurrent,
                                  AttentionType.Dot, AttentionType.SoftCoverage):
            raise ValueError("AttentionCell: unknown attention_type %r" % (attention_type,))
        self.encoder_output_dim = encoder_output_dim
        self.encoder_outputs = encoder_outputs
        self.encoder_lengths = encoder_lengths
        self.decoder_cell = decoder_cell
        self.decoder_state_dim = decoder_state_dim
        self.weighted_encoder_outputs = weighted_encoder_outputs
        self.encoder_outputs_transposed = None
        self.attention_type = attention_type
        self.attention_memory_optimization = attention_memory_optimization
        self.coverage_weights = None

    @property
    def _coverage(self):
        return self.attention_type == AttentionType.SoftCoverage

    def _apply(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        if extra_inputs is not None:
            raise ValueError("AttentionCell takes no extra inputs")
        own = 2 if self._coverage else 1
        decoder_prev, context_prev = list(states[:-own]), states[-own]
        decoder_states = self.decoder_cell._apply(
            model, input_t, seq_lengths, decoder_prev, timestep,
            extra_inputs=[(context_prev, self.encoder_output_dim)])
        self.hidden_t_intermediate = self.decoder_cell._prepare_output(model, decoder_states)
        common = dict(model=model, encoder_output_dim=self.encoder_output_dim,
                      encoder_outputs_transposed=self.encoder_outputs_transposed,
                      decoder_hidden_state_t=self.hidden_t_intermediate,
                      decoder_hidden_state_dim=self.decoder_state_dim, scope=self.name,
                      encoder_lengths=self.encoder_lengths)
        kind = self.attention_type
        coverage = []
        if kind == AttentionType.Dot:
            context, weights, blobs = apply_dot_attention(**common)
        elif kind == AttentionType.Regular:
            context, weights, blobs = apply_regular_attention(
                weighted_encoder_outputs=self.weighted_encoder_outputs, **common)
        elif kind == AttentionType.Recurrent:
            context, weights, blobs = apply_recurrent_attention(
                weighted_encoder_outputs=self.weighted_encoder_outputs,
                attention_weighted_encoder_context_t_prev=context_prev, **common)
        else:
            context, weights, blobs, covered = apply_soft_coverage_attention(
                weighted_encoder_outputs=self.weighted_encoder_outputs,
                coverage_t_prev=states[-1], coverage_weights=self.coverage_weights, **common)
            coverage = [covered]
        self.attention_weights_3d = weights
        if self.attention_memory_optimization:
            self.recompute_blobs.extend(blobs)
        out = list(decoder_states) + [context] + coverage
        i = self.decoder_cell.get_output_state_index()
        out[i] = model.net.Copy(out[i], self.scope("hidden_t_external"))
        model.net.AddExternalOutputs(*out)
        return out

    def get_attention_weights(self):
        """(batch, encoder length, 1) of the last step built."""
        return self.attention_weights_3d

    def prepare_input(self, model, input_blob):
        # Outside the step net, once: the encoder outputs as (batch, dim,
        # length), and their projection for the sum-matching kinds.
        if self.encoder_outputs_transposed is None:
            self.encoder_outputs_transposed = brew.transpose(
                model, self.encoder_outputs, self.scope("encoder_outputs_transposed"),
                axes=[1, 2, 0])
        if self.weighted_encoder_outputs is None and self.attention_type != AttentionType.Dot:
            self.weighted_encoder_outputs = brew.fc(
                model, self.encoder_outputs, self.scope("weighted_encoder_outputs"),
                dim_in=self.encoder_output_dim, dim_out=self.encoder_output_dim, axis=2)
        return self.decoder_cell.prepare_input(model, input_blob)

    def build_initial_coverage(self, model):
        """Zeros of shape (encoder length,), the coverage before the first
        step, and the coverage weights (an FC of the encoder outputs)."""
        if not self._coverage:
            raise ValueError("build_initial_coverage: the attention type is not SoftCoverage")
        self.coverage_weights = brew.fc(
            model, self.encoder_outputs, self.scope("coverage_weights"),
            dim_in=self.encoder_output_dim, dim_out=self.encoder_output_dim, axis=2)
        length = model.net.Slice(model.net.Shape(self.encoder_outputs), starts=[0], ends=[1])
        return model.net.ConstantFill(length, self.scope("initial_coverage"), value=0.0,
                                      input_as_shape=1)

    def get_state_names(self):
        names = list(self.decoder_cell.get_state_names())
        names[self.get_output_state_index()] = self.scope("hidden_t_external")
        names.append(self.scope("attention_weighted_encoder_context_t"))
        if self._coverage:
            names.append(self.scope("coverage_t"))
        return names

    def get_output_dim(self):
        return self.decoder_state_dim + self.encoder_output_dim

    def get_output_state_index(self):
        return self.decoder_cell.get_output_state_index()

    def _combine(self, model, decoder_output, context):
        with core.NameScope(self.name or ""):
            return brew.concat(model, [decoder_output, context], "states_and_context_combination",
                               axis=2)

    def _prepare_output(self, model, states):
        return self._combine(model, self.hidden_t_intermediate, states[-2 if self._coverage else -1])

    def _prepare_output_sequence(self, model, state_outputs):
        own = 2 if self._coverage else 1
        decoder_output = self.decoder_cell._prepare_output_sequence(
            model, state_outputs[:-2 * own])
        context_all = state_outputs[2 * (len(self.get_state_names()) - own)]
        return self._combine(model, decoder_output, context_all)


def _attention_decoder(cell_class):
    class Cell(AttentionCell):
        def __init__(self, encoder_output_dim, encoder_outputs, decoder_input_dim,
                     decoder_state_dim, name, attention_type, weighted_encoder_outputs,
                     forget_bias, lstm_memory_optimization, attention_memory_optimization,
                     forward_only=False, encoder_lengths=None):
            decoder = cell_class(input_size=decoder_input_dim, hidden_size=decoder_state_dim,
                                 forget_bias=forget_bias,
                                 memory_optimization=lstm_memory_optimization,
                                 name="%s/decoder" % name, forward_only=False, drop_states=False)
            super(Cell, self).__init__(
                encoder_output_dim=encoder_output_dim, encoder_outputs=encoder_outputs,
                encoder_lengths=encoder_lengths, decoder_cell=decoder,
                decoder_state_dim=decoder_state_dim, name=name, attention_type=attention_type,
                weighted_encoder_outputs=weighted_encoder_outputs,
                attention_memory_optimization=attention_memory_optimization,
                forward_only=forward_only)
    return Cell


class LSTMWithAttentionCell(_attention_decoder(LSTMCell)):
    """An LSTMCell decoder (scope ``<name>/decoder``) with attention."""


class MILSTMWithAttentionCell(_attention_decoder(MILSTMCell)):
    """A MILSTMCell decoder (scope ``<name>/decoder``) with attention."""


def _with_attention(cell_class, model, decoder_inputs, decoder_input_lengths,
                    initial_decoder_hidden_state, initial_decoder_cell_state,
                    initial_attention_weighted_encoder_context, encoder_output_dim,
                    encoder_outputs, encoder_lengths, decoder_input_dim, decoder_state_dim, scope,
                    attention_type=AttentionType.Regular, outputs_with_grads=(0, 4),
                    weighted_encoder_outputs=None, lstm_memory_optimization=False,
                    attention_memory_optimization=False, forget_bias=0.0, forward_only=False):
    """An LSTM decoder over ``decoder_inputs`` (T, N, D) attending over
    ``encoder_outputs`` (length, N, encoder dim) at every step, in one
    RecurrentNetwork op; returns every state's (all steps, last step)."""
    cell = cell_class(encoder_output_dim=encoder_output_dim, encoder_outputs=encoder_outputs,
                      encoder_lengths=encoder_lengths, decoder_input_dim=decoder_input_dim,
                      decoder_state_dim=decoder_state_dim, name=scope,
                      attention_type=attention_type,
                      weighted_encoder_outputs=weighted_encoder_outputs, forget_bias=forget_bias,
                      lstm_memory_optimization=lstm_memory_optimization,
                      attention_memory_optimization=attention_memory_optimization,
                      forward_only=forward_only)
    initial_states = [initial_decoder_hidden_state, initial_decoder_cell_state,
                      initial_attention_weighted_encoder_context]
    if attention_type == AttentionType.SoftCoverage:
        initial_states.append(cell.build_initial_coverage(model))
    _, result = cell.apply_over_sequence(model=model, inputs=decoder_inputs,
                                         seq_lengths=decoder_input_lengths,
                                         initial_states=initial_states,
                                         outputs_with_grads=outputs_with_grads)
    return result


LSTMWithAttention = functools.partial(_with_attention, LSTMWithAttentionCell)
MILSTMWithAttention = functools.partial(_with_attention, MILSTMWithAttentionCell)


class UnrolledCell(RNNCell):
    """``cell`` unrolled over exactly ``T`` steps: the step's ops written
    into the model's own net once per timestep (name scope
    ``timestep_<t>``, the parameters shared through ``ParameterSharing``),
    instead of one RecurrentNetwork op. Outputs, names of the parameters
    and gradients are those of the cell run by RecurrentNetwork."""

    def __init__(self, cell, T):
        super(UnrolledCell, self).__init__(name=cell.name, forward_only=cell.forward_only,
                                           initializer=cell.initializer)
        if int(T) < 1:
            raise ValueError("UnrolledCell: T must be at least 1, got %r" % (T,))
        self.T, self.cell = int(T), cell

    def get_state_names(self):
        return self.cell.get_state_names()

    def get_output_state_index(self):
        return self.cell.get_output_state_index()

    def get_output_dim(self):
        return self.cell.get_output_dim()

    def apply_over_sequence(self, model, inputs, seq_lengths=None, initial_states=None,
                            outputs_with_grads=None):
        if initial_states is None:
            if self.cell.initializer is None:
                raise ValueError("apply_over_sequence: give initial_states or set the cell's "
                                 "initializer")
            with scope.NameScope(self.cell.name):
                initial_states = self.cell.initializer.create_states(model)
        sequence = self.cell.prepare_input(model, inputs)
        pieces = model.net.Split(
            sequence, [str(sequence) + "_timestep_%d" % t for t in range(self.T)], axis=0)
        if self.T == 1:
            pieces = [pieces]
        states = list(initial_states)
        steps = []
        for t in range(self.T):
            step_scope = "timestep_%d" % t
            with ParameterSharing({step_scope: ""}), scope.NameScope(step_scope):
                timestep = model.param_init_net.ConstantFill(
                    [], "timestep", value=t, shape=[1], dtype=core.DataType.INT32)
                states = self.cell._apply(model=model, input_t=pieces[t], seq_lengths=seq_lengths,
                                          states=states, timestep=timestep)
            steps.append(states)
        # Each state over all steps (T, N, D), named after its first step's
        # blob without the step's scope.
        every = []
        for per_step in zip(*steps):
            base = str(per_step[0]).replace("timestep_0/", "", 1)
            every.append(model.net.Concat(
                list(per_step),
                [core.BlobReference(base + "_concat"), core.BlobReference(base + "_concat_info")],
                axis=0)[0])
        outputs = tuple(b for pair in zip(every, states) for b in pair)
        if outputs_with_grads is None:
            outputs_with_grads = [2 * self.get_output_state_index()]
        for i in sorted(set(range(len(outputs))) - set(outputs_with_grads)):
            model.net.ZeroGradient(outputs[i], [])
        return self.cell._prepare_output_sequence(model, outputs), outputs


def _recurrent_layers(cell_class, model, input_blob, seq_lengths, initial_states, dim_in,
                      dim_out, scope=None, outputs_with_grads=(0,), return_params=False,
                      memory_optimization=False, forget_bias=0.0, forward_only=False,
                      drop_states=False, return_last_layer_only=True,
                      static_rnn_unroll_size=None, **cell_kwargs):
    """One RecurrentNetwork op of ``cell_class`` layers (``dim_out`` an int or
    a list, one size per layer) over ``input_blob`` (T, N, dim_in); returns
    (hidden_all, hidden_last, cell_all, cell_last) of the last layer (or of
    every layer), and the parameters with ``return_params``."""
    sizes = list(dim_out) if isinstance(dim_out, (list, tuple)) else [dim_out]
    cells = [cell_class(input_size=dim_in if i == 0 else sizes[i - 1], hidden_size=size,
                        forget_bias=forget_bias, memory_optimization=memory_optimization,
                        name=scope if len(sizes) == 1 else None, forward_only=forward_only,
                        drop_states=drop_states, **cell_kwargs)
             for i, size in enumerate(sizes)]
    cell = (MultiRNNCell(cells, name=scope, forward_only=forward_only) if len(cells) > 1
            else cells[0])
    if static_rnn_unroll_size is not None:
        cell = UnrolledCell(cell, static_rnn_unroll_size)
    # outputs_with_grads counts the last layer's four outputs.
    last = 4 * (len(cells) - 1)
    _, result = cell.apply_over_sequence(
        model=model, inputs=input_blob, seq_lengths=seq_lengths,
        initial_states=initial_states,
        outputs_with_grads=[last + i for i in outputs_with_grads])
    if return_last_layer_only:
        result = result[last:]
    if return_params:
        result = list(result) + [{"input": cell.get_input_params(),
                                  "recurrent": cell.get_recurrent_params()}]
    return tuple(result)


# Caffe2's name, which gru_cell and users' cells call.
_LSTM = _recurrent_layers
LSTM = functools.partial(_recurrent_layers, LSTMCell)
BasicRNN = functools.partial(_recurrent_layers, BasicRNNCell)
MILSTM = functools.partial(_recurrent_layers, MILSTMCell)
LayerNormLSTM = functools.partial(_recurrent_layers, LayerNormLSTMCell)
LayerNormMILSTM = functools.partial(_recurrent_layers, LayerNormMILSTMCell)


def _layered(model, input_blob, seq_lengths, initial_states, dim_in, dim_out, scope,
             outputs_with_grads=(0,), return_params=False, memory_optimization=False,
             forget_bias=0.0, forward_only=False, drop_states=False, create_lstm=None):
    """Stacked LSTMs, one RecurrentNetwork op per layer (each layer's scope
    ``<scope>_layer_<i>`` after the first), each started from the previous
    layer's last states."""
    kw = dict(model=model, input_blob=input_blob, seq_lengths=seq_lengths,
              initial_states=initial_states, dim_in=dim_in, scope=scope,
              outputs_with_grads=outputs_with_grads, return_params=return_params,
              memory_optimization=memory_optimization, forget_bias=forget_bias,
              forward_only=forward_only, drop_states=drop_states)
    if not isinstance(dim_out, list):
        return create_lstm(dim_out=dim_out, **kw)
    if len(dim_out) == 1:
        return create_lstm(dim_out=dim_out[0], **kw)
    if not dim_out:
        raise ValueError("layered_LSTM: dim_out is an empty list")
    if return_params:
        raise ValueError("layered_LSTM: return_params is not supported with several layers")
    for i, size in enumerate(dim_out):
        output, last_output, all_states, last_state = create_lstm(dim_out=size, **kw)
        kw.update(input_blob=output, dim_in=size, initial_states=(last_output, last_state),
                  scope="%s_layer_%d" % (scope, i + 1))
    return output, last_output, all_states, last_state


layered_LSTM = functools.partial(_layered, create_lstm=LSTM)


def GetLSTMParamNames():
    """The per-gate parameter names (cuDNN's layout)."""
    return {"weights": ["input_gate_w", "forget_gate_w", "output_gate_w", "cell_w"],
            "biases": ["input_gate_b", "forget_gate_b", "output_gate_b", "cell_b"]}


def InitFromLSTMParams(lstm_pblobs, param_values):
    """Sets an LSTM's weight and bias blobs (``return_params``' dict) from
    per-gate values ``{input_type: {param_name: array}}``, gates in
    GetLSTMParamNames order."""
    names = GetLSTMParamNames()
    for input_type, values in param_values.items():
        for kind in ("weights", "biases"):
            blob = lstm_pblobs[input_type][kind]
            flat = np.concatenate([np.asarray(values[n]).ravel() for n in names[kind]])
            shape = workspace.FetchBlob(blob).shape
            workspace.FeedBlob(blob, flat.reshape(shape).astype(np.float32))


def cudnn_LSTM(model, input_blob, initial_states, dim_in, dim_out, scope,
               recurrent_params=None, input_params=None, num_layers=1, return_params=False):
    """Caffe2's cuDNN LSTM: needs CUDA, which ferrocaffe does not have."""
    raise NotImplementedError(
        "rnn_cell.cudnn_LSTM needs CUDA (cuDNN's Recurrent op); ferrocaffe runs on the CPU: "
        "use rnn_cell.LSTM instead")


def __getattr__(name):
    raise AttributeError("module 'rnn_cell' has no attribute %r" % name)

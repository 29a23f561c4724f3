"""Nets: ``core.Net``, its op methods, cloning and gradients (a part of
:mod:`ferrocaffe.core`)."""

from __future__ import annotations

import inspect
import pickle
import re
import sys
import threading
from collections import defaultdict
from itertools import chain
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ferrocaffe import _core, errors, gradients
# The gradient makers of If, While and Do register themselves (Caffe2's core
# imported control_ops_grad too).
from ferrocaffe import control_ops_grad  # noqa: F401
from ferrocaffe.proto import _utf8, caffe2_pb2
from ferrocaffe import scope
from ferrocaffe import workspace as _workspace
from ferrocaffe.core.blobs import BlobReference, ScopedBlobReference, ScopedName, _RectifyInputOutput, _get_blob_ref
from ferrocaffe.core.operators import (
    _CAFFE2_DEBUG_KEY,
    _ENVIRON_DATA,
    _OPERATOR_FIELD_KEYWORDS,
    _PACKAGE_DIR,
    CreateOperator,
    _argument_bytes,
    _blob_names,
    _caffe2_debug,
    _frame_location,
    _MakeArgument,
    _RegisterPythonImpl,
    _user_frame,
)
from ferrocaffe.core.registry import DataType, IsOperator, IsOperatorWithEngine, _ON_REFRESH, _not_registered, _registry

NameScope = scope.NameScope


# ------------------------------------------------------------------ nets --


def get_net_name(netlike: Net | caffe2_pb2.NetDef | str) -> str:
    if isinstance(netlike, Net):
        return netlike.Proto().name
    if isinstance(netlike, caffe2_pb2.NetDef):
        return netlike.name
    return netlike


def output_to_list(op_output: Any) -> list[Any]:
    """An op's return value (one ref or a tuple of refs) as a list."""
    assert type(op_output) in (list, tuple, BlobReference)
    return [op_output] if isinstance(op_output, BlobReference) else list(op_output)


def _add_net_to_dict(net_dict, net):
    name = get_net_name(net)
    if name in net_dict:
        assert net_dict[name] is None or net == net_dict[name], (
            "Different nets with same name: " + name
        )
        return False
    net_dict[name] = net if isinstance(net, Net) else None
    return True


def remap_input(op: caffe2_pb2.OperatorDef, blob_name_remapping: Mapping[str, str]) -> None:
    new_list = [blob_name_remapping.get(b, b) for b in op.input]
    del op.input[:]
    op.input.extend(new_list)


def _autogen_index(name, prefix):
    """k for a name ``<prefix><k>...``, else None."""
    digits = re.match(r"\d+", name[len(prefix):])
    return int(digits.group()) if digits else None


# The op methods Net.__getattr__ has made (``net.Add``), kept on the class:
# a later ``net.Add`` is then a plain method lookup, not a failed lookup
# (an AttributeError built and caught), a registry check and a new closure,
# which cost more than the rest of adding a small op. Forgotten whenever the
# registry is re-read, so that an op type no longer registered is refused.
_OP_METHODS = set()


_P = inspect.Parameter
_OP_SIGNATURE = inspect.Signature([
    _P("self", _P.POSITIONAL_OR_KEYWORD), _P("inputs", _P.POSITIONAL_OR_KEYWORD),
    _P("outputs", _P.POSITIONAL_OR_KEYWORD, default=None), _P("args", _P.VAR_KEYWORD)])


def _op_doc(op_type):
    """The doc of ``Net.<op_type>`` (what ``help(net.Add)`` shows): the
    registry's schema of the op, its input and output counts and its
    arguments."""
    schema = _core.operator_schema(op_type)
    head = (
        "Adds %s '%s' operator to the net and returns its outputs "
        "(BlobReferences): inputs and outputs are blob names or "
        "BlobReferences (outputs may be omitted, or a count), ``args`` the "
        "op's arguments.\n\n" % ("an" if op_type[:1] in "AEIOU" else "a", op_type))
    if schema is None:
        return head

    def count(lo, hi):
        if hi is None:
            return "%d or more" % lo
        return str(lo) if lo == hi else "%d to %d" % (lo, hi)

    lines = [head + (schema["doc"] or "").strip(), "",
             "Inputs: %s. Outputs: %s." % (
                 count(schema["min_inputs"], schema["max_inputs"]),
                 count(schema["min_outputs"], schema["max_outputs"]))]
    if schema["args"]:
        lines += ["", "Arguments:"]
        for name, ty, default, doc in schema["args"]:
            extra = ", required" if default == "required" else (
                ", default %s" % default if default not in (None, "") else "")
            lines.append("    %s (%s%s)%s" % (name, ty, extra, ": " + doc if doc else ""))
    return "\n".join(lines)


_SCOPE = scope._threadlocal_scope
_getframe = sys._getframe


def _op_method(op_type):
    # net.Add(...): what the call depends on besides its arguments (the name
    # and device scopes, where the user's code is, the net's name) is read
    # here, once, and handed to the net's op list (``_core.NetOps``, in
    # rust/python/src/net_ops.rs) as plain values. It adds the common op
    # (names, arguments and automatic names exactly as _CreateAndAddToSelf
    # makes them) and returns its output names; any other op, and every op
    # while CAFFE2_DEBUG or immediate mode is on, goes through
    # _CreateAndAddToSelf.
    def op_method(self, *args, **kwargs):
        if not (_ENVIRON_DATA.get(_CAFFE2_DEBUG_KEY) or _workspace._immediate_mode):
            local = _SCOPE
            device = local.devicescope
            frame = _getframe(1)
            code = frame.f_code
            site = _user_frame() if code.co_filename.startswith(_PACKAGE_DIR) else (code, frame.f_lasti)
            out = self._ops.add(
                op_type, args, kwargs, local.namescope,
                None if device is None else device.SerializeToString(),
                site, self._proto.name)
            if out is not None:
                if type(out) is str:
                    return BlobReference(out, self)
                return tuple([BlobReference(o, self) for o in out]) if out else None
        return self._CreateAndAddToSelf(op_type, *args, **kwargs)

    op_method.__name__ = op_method.__qualname__ = op_type
    op_method.__doc__ = _op_doc(op_type)
    op_method.__signature__ = _OP_SIGNATURE
    if op_type not in Net.__dict__:
        setattr(Net, op_type, op_method)
        _OP_METHODS.add(op_type)
    return op_method


def _forget_op_methods():
    for op_type in list(_OP_METHODS):
        if Net.__dict__.get(op_type) is not None:
            delattr(Net, op_type)
    _OP_METHODS.clear()


def _gpu_device_type() -> int:
    """Caffe2's ``workspace.GpuDeviceType`` (CUDA: there is no HIP build)."""
    return caffe2_pb2.CUDA


def _place_net(netdef, device_type, device_id, engine):
    netdef.device_option.CopyFrom(
        caffe2_pb2.DeviceOption(device_type=device_type, device_id=device_id))
    for op in netdef.op:
        if engine is not None:
            op.engine = engine
        if op.type == "RecurrentNetwork":
            for arg in op.arg:
                if arg.name == "step_net" and arg.HasField("n"):
                    _place_net(arg.n, device_type, device_id, engine)


class Net:
    """A network under construction: a NetDef plus naming state.

    ``net.Add([a, b], "c")`` adds an ``Add`` op; any registered operator type
    works as a method. Outputs may be omitted (one auto-named output), an int
    (that many auto-named outputs), or names/refs.
    """

    # process-wide: per base name asked for, where the search for a free
    # "<base>_<k>" resumes (every "<base>_<k>" below it is taken)
    _net_names_used_counters: dict[str, int] = {}
    _names_lock = threading.Lock()
    operator_registry_: dict[str, Any] = {}

    @staticmethod
    def current_prefix() -> str:
        # NetBuilder lives in a higher module; it can only be active if that
        # module has been imported, so look for it without importing it.
        net_builder = sys.modules.get("ferrocaffe.net_builder")
        if net_builder is None:
            return ""
        builder = net_builder.NetBuilder.current(required=False)
        return builder.name if builder else ""

    @staticmethod
    def _reset_used_names():
        with Net._names_lock:
            Net._net_names_used_counters = {}

    @staticmethod
    def _name_taken(name):
        """Whether a net of this process had ``name``: it was asked for as
        a base name, or it is ``<base>_<k>`` below its base's counter. (The
        memory this takes grows with the base names, not with the nets.)"""
        counters = Net._net_names_used_counters
        if name in counters:
            return True
        base, _, k = name.rpartition("_")
        return bool(base) and k.isdigit() and str(int(k)) == k and 0 < int(k) < counters.get(base, 0)

    @staticmethod
    def _get_next_net_name(basename):
        """``basename``, or ``<basename>_<k>`` for the smallest k free: a
        name no net of this process had (as in Caffe2 1.x; its later
        counter per base name could hand out "test_1" twice, once for the
        second "test" and once for a net named "test_1")."""
        basename = "/".join(x for x in [Net.current_prefix(), basename] if x)
        with Net._names_lock:
            idx = Net._net_names_used_counters.get(basename, 0)
            name = basename if idx == 0 else "{}_{}".format(basename, idx)
            while Net._name_taken(name):
                idx += 1
                name = "{}_{}".format(basename, idx)
            Net._net_names_used_counters[basename] = idx + 1
        return name

    def __init__(
        self,
        name_or_proto: str | caffe2_pb2.NetDef | Net | None,
        inplace: bool = False,
    ) -> None:
        """A new empty net named ``name_or_proto``, or a net over a copy of
        the NetDef ``name_or_proto`` (the NetDef itself if ``inplace``). The
        name is made unique either way."""
        self._input_record: Any = None  # schema records (schema sits above core)
        self._output_record: Any = None
        # names handed out by NextBlob, so that they are never reused
        self._registered_blob_names = set()
        self._attr_dict = defaultdict(list)
        # The op list (see _flush): ops added and not yet in the NetDef,
        # with where the user's code made each (see _user_frame), the blobs
        # the net defines, and the automatic names.
        self._ops = _core.NetOps(BlobReference)
        # NetDef op index -> creation site, for PopulateProtoWithFileName.
        # Kept on the net (Caffe2's process-wide table grew forever).
        self._op_tracebacks = {}
        if isinstance(name_or_proto, caffe2_pb2.NetDef):
            proto = name_or_proto
            if inplace:
                self._net = proto
            else:
                self._net = caffe2_pb2.NetDef()
                self._net.CopyFrom(proto)
            existing_names = set()
            op_outputs = []
            for op in self._net.op:
                existing_names.update(op.input)
                existing_names.update(op.output)
                op_outputs.extend(op.output)
            self._ops.reset(op_outputs, list(self._net.external_input))
            # Resume automatic naming after the highest <name>_blob_<k>.
            # (Caffe2 bug fixed: it parsed a single digit of k.)
            prefix = self._net.name + "_blob_"
            indices = [
                k
                for k in (_autogen_index(s, prefix) for s in existing_names if s.startswith(prefix))
                if k is not None
            ]
            self._ops.next_blob_index = max(indices) + 1 if indices else 0
            name = self._proto.name
        else:
            name = name_or_proto
            if isinstance(name, str):
                name = _utf8(name, "net", net=repr(name))
            self._net = caffe2_pb2.NetDef()

        self._proto.name = Net._get_next_net_name(name)

    # -- identity

    def Name(self) -> str:
        return self._proto.name

    def __str__(self):
        return self.Name()

    def __repr__(self):
        n = len(self.Proto().op)
        return "<Net %r: %d op%s>" % (self.Name(), n, "" if n == 1 else "s")

    def RunAllOnGPU(self, gpu_id: int = 0, use_cudnn: bool = False) -> None:
        """Places the net, and the step nets of its ``RecurrentNetwork``
        ops, on GPU ``gpu_id`` (engine ``CUDNN`` on every op with
        ``use_cudnn``), as Caffe2 did. ferrocaffe runs on the CPU only:
        such a net serialises, but creating it is an
        ``InvalidArgumentError`` naming the device."""
        _place_net(self.Proto(), _gpu_device_type(), gpu_id,
                   "CUDNN" if use_cudnn else None)

    def RunAllOnMKL(self) -> None:
        """Places the net on Caffe2's MKLDNN device (see ``RunAllOnGPU``)."""
        self.Proto().device_option.CopyFrom(caffe2_pb2.DeviceOption(device_type=caffe2_pb2.MKLDNN))

    def RunAllOnIDEEP(self) -> None:
        """Places the net on Caffe2's IDEEP device (see ``RunAllOnGPU``)."""
        self.Proto().device_option.CopyFrom(caffe2_pb2.DeviceOption(device_type=caffe2_pb2.IDEEP))

    def Proto(self) -> caffe2_pb2.NetDef:
        """The live NetDef. Callers may edit it, so the lookup tables are
        rebuilt on next use."""
        self._InvalidateLookupTables()
        return self._net

    # The NetDef lives in _proto. Ops are not built as protobuf messages one
    # by one (that cost several microseconds an op, most of a large net's
    # build time): the op list (_ops) encodes each op as it is added, and
    # the first read of _net (Proto(), a lookup, pickling) merges the
    # encoded ops into the NetDef, which protobuf parses in C. Code that
    # needs only the name or the external lists reads _proto and does not
    # flush.

    @property
    def _net(self):
        if self._ops.queued:
            self._flush()
        return self._proto

    @_net.setter
    def _net(self, proto):
        self._proto = proto

    def _flush(self):
        # The creation sites get their op indices here, not per op (the
        # length of the NetDef's op list costs as much as half an op).
        base = len(self._proto.op)
        data, sites = self._ops.take()
        self._proto.MergeFromString(data)
        self._op_tracebacks.update(zip(range(base, base + len(sites)), sites))

    def _tables(self):
        """The op list, its blob tables rebuilt first if the NetDef was
        handed out since they were made."""
        ops = self._ops
        if ops.stale:
            self._RecreateLookupTables()
        return ops

    # -- attributes (opaque hooks used by task.py)

    def add_attribute(self, name: str, obj: Any) -> None:
        """Appends ``obj`` to this net's attribute list ``name``."""
        self._attr_dict[name].append(obj)

    def get_attributes(self, name: str) -> list[Any]:
        """The attribute list ``name`` (``[]`` if there is none)."""
        return self._attr_dict.get(name, [])

    # -- blob lookups

    def BlobIsDefined(self, blob: str | BlobReference) -> bool:
        """True if an op of this net writes ``blob`` or it is an external input."""
        return self._tables().is_defined(str(blob))

    def UsesBlob(self, blob: str | BlobReference) -> bool:
        """True if an op of this net reads ``blob`` or it is an external input."""
        ops = self._tables()
        blob_name = str(blob)
        for op in self._net.op:
            if blob_name in op.input:
                return True
        return ops.is_external_input(blob_name)

    def UsedBlobNames(self) -> set[str]:
        """Every blob name an op reads or writes, plus the external lists."""
        blob_names = set()
        for op in self._net.op:
            blob_names |= set(op.input)
            blob_names |= set(op.output)
        blob_names |= set(self._net.external_input)
        blob_names |= set(self._net.external_output)
        return blob_names

    def GetBlobRef(self, blob_name: str | BlobReference) -> BlobReference:
        """A reference to a blob this net defines; KeyError otherwise."""
        blob_name = str(blob_name)
        if not self.BlobIsDefined(blob_name):
            raise KeyError("Net does not define blob %s" % blob_name)
        return BlobReference(blob_name, self)

    def is_external_input(self, blob: str | BlobReference) -> bool:
        return self._tables().is_external_input(str(blob))

    # -- automatic names

    def NextScopedBlob(self, prefix: str = "unnamed") -> BlobReference:
        """NextBlob of the name-scoped ``prefix``."""
        return self.NextBlob(ScopedName(prefix))

    def NextBlob(self, prefix: str = "unnamed") -> BlobReference:
        """A blob name not defined in this net nor handed out before:
        ``prefix`` itself, else ``prefix_auto_<i>``."""
        output_blob_base = BlobReference(prefix)
        output_blob = output_blob_base
        index = 0
        while str(output_blob) in self._registered_blob_names or self.BlobIsDefined(output_blob):
            output_blob = output_blob_base + "_auto_" + str(index)
            index += 1
        self._registered_blob_names.add(str(output_blob))
        return output_blob

    def NextName(self, prefix: str | None = None, output_id: int | None = None) -> str:
        """An automatic blob name: ``<net>/<prefix>[:<output_id>]``, with a
        ``_<k>`` suffix (k from 2) when the name-scoped form is already
        defined, or ``<net>_blob_<n>`` without a prefix. No scope is added."""
        return self._tables().next_name(
            self._proto.name, str(prefix) if prefix else None,
            None if output_id is None else str(output_id), scope.CurrentNameScope())

    # -- lookup tables

    def PopulateProtoWithFileName(self) -> None:
        """Names every op this net created through its op methods after the
        line of user code that created it: ``'<file>:<line>:<function>'``."""
        ops = self._net.op  # the queued ops first: they get their indices
        for index, frame in getattr(self, "_op_tracebacks", {}).items():
            if frame is not None and index < len(ops):
                ops[index].name = ":".join(map(str, _frame_location(*frame)))

    def __copy__(self):
        # A shallow copy shares the NetDef and the op list (its queue, tables
        # and names), as Caffe2's shared the NetDef and the tables.
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def __getstate__(self):
        # Code objects do not pickle: keep the creation sites as locations.
        self._net  # the queued ops go into the NetDef first
        state = dict(self.__dict__)
        if "_op_tracebacks" in state:
            state["_op_tracebacks"] = {
                i: None if f is None else _frame_location(*f) for i, f in state["_op_tracebacks"].items()
            }
        # The op list keeps its automatic names; its tables are made again
        # from the NetDef.
        ops = state.pop("_ops")
        state["_naming"] = (ops.next_blob_index, ops.next_suffixes)
        return state

    def __setstate__(self, state):
        state = dict(state)
        index, suffixes = state.pop("_naming", (state.pop("_next_name_index", 0),
                                                state.pop("_next_blob_name_ids", {})))
        # (Nets pickled by earlier versions kept these on the net.)
        for old in ("_pending", "_pending_sites", "_op_outputs", "_external_input_map",
                    "_recreate_lookup_tables"):
            state.pop(old, None)
        self.__dict__.update(state)
        self.__dict__.setdefault("_op_tracebacks", {})
        ops = _core.NetOps(BlobReference)
        ops.next_blob_index = index
        ops.next_suffixes = suffixes
        ops.invalidate()
        self._ops = ops

    def _ExtendOps(self, new_ops):
        self._net.op.extend(new_ops)
        self._tables().define([str(o) for op in new_ops for o in op.output])

    def extend_ops(self, new_ops: Sequence[caffe2_pb2.OperatorDef]) -> None:
        return self._ExtendOps(new_ops)

    def _CheckLookupTables(self):
        """Asserts the lookup tables cover the proto (for tests)."""
        ops = self._ops
        assert all(ops.is_op_output(o) for op in self._net.op for o in op.output)
        assert all(ops.is_external_input(i) for i in self._net.external_input)

    def _InvalidateLookupTables(self):
        self._ops.invalidate()

    def _RecreateLookupTables(self):
        proto = self._net
        self._ops.reset([o for op in proto.op for o in op.output], list(proto.external_input))

    # -- external inputs and outputs

    def AddExternalInput(self, *inputs: Any) -> Any:
        """Declares external inputs. Returns one ref, or a list of refs."""
        assert len(inputs) > 0
        ops = self._tables()
        input_name_set = set()
        for input in inputs:
            input_name = str(input)
            assert (
                not ops.is_external_input(input_name)
                and input_name not in input_name_set
            ), "Net already contains an input named %s" % input_name
            input_name_set.add(input_name)
        refs = []
        for input in inputs:
            input_name = str(input)
            self._proto.external_input.extend([input_name])
            ops.add_external_input(input_name)
            refs.append(_get_blob_ref(input))
        return refs[0] if len(refs) == 1 else refs

    def AddExternalOutput(self, *outputs: Any) -> None:
        """Declares external outputs: BlobReferences this net defines."""
        for output in outputs:
            assert isinstance(output, BlobReference)
            assert self.BlobIsDefined(output), "{} is not defined".format(output)
        for output in outputs:
            self.Proto().external_output.extend([str(output)])

    def AddExternalInputs(self, *inputs: Any) -> Any:
        return self.AddExternalInput(*inputs)

    def AddExternalOutputs(self, *outputs: Any) -> None:
        self.AddExternalOutput(*outputs)

    def AddScopedExternalInputs(self, *inputs: Any) -> Any:
        res = self.AddExternalInput(*[ScopedBlobReference(b) for b in inputs])
        if not isinstance(res, list):
            res = [res]
        return res

    def AddScopedExternalOutputs(self, *outputs: Any) -> None:
        return self.AddExternalOutput(*[ScopedBlobReference(b) for b in outputs])

    @property
    def external_inputs(self) -> list[BlobReference]:
        return [_get_blob_ref(x) for x in self._proto.external_input]

    @property
    def external_outputs(self) -> list[BlobReference]:
        return [_get_blob_ref(x) for x in self._proto.external_output]

    # -- records (schema lives in a higher module, imported on use)

    def input_record(self) -> Any:
        return self._input_record

    def output_record(self) -> Any:
        return self._output_record

    def set_input_record(self, input_record: Any) -> Any:
        assert self._input_record is None or (
            input_record.has_blobs()
            and set(input_record.field_blobs()) == set(self._input_record.field_blobs())
        ), "Input schema cannot be reset"
        if not input_record.has_blobs():
            with NameScope(self.Name()):
                # schema builds on core: the record makes its own blobs
                self._input_record = input_record._new_record(self)
        else:
            self._input_record = input_record
        for blob in self._input_record.field_blobs():
            if not self.is_external_input(blob):
                self.AddExternalInput(blob)
        return self._input_record

    def set_output_record(self, record: Any) -> None:
        assert self._output_record is None or (
            record.has_blobs()
            and set(record.field_blobs()) == set(self._output_record.field_blobs())
        ), "Output schema cannot be reset"
        for blob in record.field_blobs():
            assert self.BlobIsDefined(blob), "{} is not defined in net {}".format(
                blob, self.Proto()
            )
        for blob in record.field_blobs():
            if blob not in self.external_outputs:
                self.AddExternalOutput(blob)
        self._output_record = record

    # -- whole-net operations

    def AddArgument(self, arg_name: str, arg_value: Any) -> None:
        self._net.arg.extend([_MakeArgument(arg_name, arg_value)])

    def set_rand_seed(
        self,
        seed: int = 100,
        sequence_seed: bool = True,
        seed_on_op_def: bool = False,
    ) -> None:
        """Sets a random seed on every op: ``seed + i`` for op i by default."""
        assert not (sequence_seed and seed_on_op_def), (
            "sequence_seed and seed_on_op_def cannot be both set to True."
        )
        for i, op in enumerate(self.Proto().op):
            if sequence_seed:
                curr_seed = seed + i
            elif seed_on_op_def:
                curr_seed = hash(str(op) + str(seed)) % np.iinfo(np.uint32).max
            else:
                curr_seed = seed
            op.device_option.random_seed = curr_seed

    def AppendNet(
        self,
        net: Net | caffe2_pb2.NetDef,
        device_option: caffe2_pb2.DeviceOption | None = None,
    ) -> Net:
        """Appends ``net``'s ops (copies carrying ``device_option`` if given)
        and merges its external lists. Returns self."""
        assert isinstance(net, Net)
        ops = self._tables()
        for i in net.Proto().external_input:
            if i not in self.Proto().external_input and not ops.is_op_output(i):
                self.Proto().external_input.append(i)
        self.Proto().external_output.extend(
            [o for o in net.Proto().external_output if o not in self.Proto().external_output]
        )
        ops = net.Proto().op
        if device_option is not None:
            ops = [op.__deepcopy__() for op in ops]
            for op in ops:
                op.device_option.CopyFrom(device_option)
        self._ExtendOps(ops)
        return self

    def Clone(
        self,
        name: str,
        blob_remap: Mapping[str, str] | None = None,
        op_id_mask: Sequence[int] | None = None,
        remap_funcs: Mapping[str, Callable[..., Any]] | None = None,
        keep_schema: bool = True,
        update_external_list: bool = False,
    ) -> Net:
        """A copy of this net named ``name`` (made unique).

        ``blob_remap`` renames blobs (inputs, outputs, external lists);
        ``op_id_mask`` keeps only the listed ops, in that order;
        ``remap_funcs`` maps op types to ``f(op, prefix, blob_remap)`` for ops
        that hold blob names elsewhere. ``update_external_list`` recomputes
        the external lists from the kept ops.
        """
        # Caffe2's default: the nets an If or While op holds are renamed too.
        remap_funcs = dict(DEFAULT_REMAP_FUNCS if remap_funcs is None else remap_funcs)
        proto = self._net
        new_proto = caffe2_pb2.NetDef()
        new_proto.CopyFrom(proto)
        new_proto.name = name

        if blob_remap is None:
            blob_remap = {}
        if op_id_mask is None:
            op_id_mask = list(range(0, len(proto.op)))

        def get_remapped_str(blob):
            blob_str = str(blob)
            return str(blob_remap.get(blob_str, blob_str))

        def remap_list(proto_list):
            new_list = [get_remapped_str(b) for b in proto_list]
            del proto_list[:]
            proto_list.extend(new_list)

        def remap_op(op):
            new_op = caffe2_pb2.OperatorDef()
            new_op.CopyFrom(op)
            remap_list(new_op.input)
            remap_list(new_op.output)
            if new_op.type in remap_funcs:
                remap_funcs[new_op.type](new_op, (name + "/") if name else "", blob_remap)
            return new_op

        del new_proto.op[:]
        new_proto.op.extend([remap_op(proto.op[op_id]) for op_id in op_id_mask])
        remap_list(new_proto.external_input)
        remap_list(new_proto.external_output)
        new_net = Net(new_proto)

        if keep_schema and (self._input_record or self._output_record):
            # schema builds on core: the records copy themselves
            if self._input_record:
                new_net._input_record = self._input_record._with_blobs(
                    [
                        BlobReference(get_remapped_str(blob), net=new_net)
                        for blob in self._input_record.field_blobs()
                    ],
                )
            if self._output_record:
                new_net._output_record = self._output_record._with_blobs(
                    [
                        BlobReference(get_remapped_str(blob), net=new_net)
                        for blob in self._output_record.field_blobs()
                    ],
                )

        # Caffe2 bug fixed: the attribute lists were shared with the original.
        for key, attrs in self._attr_dict.items():
            new_net._attr_dict[key] = list(attrs)

        if update_external_list:
            existing_outputs = set()
            used_outputs = set()
            del new_net.Proto().external_input[:]
            del new_net.Proto().external_output[:]
            for op in new_net.Proto().op:
                for ib in op.input:
                    if ib not in existing_outputs:
                        new_net.Proto().external_input.extend([ib])
                    else:
                        used_outputs.add(ib)
                for ob in op.output:
                    existing_outputs.add(ob)
            for ob in existing_outputs:
                if ob not in used_outputs:
                    new_net.Proto().external_output.extend([ob])
        return new_net

    def ClonePartial(
        self,
        name: str,
        inputs: Mapping[Any, Any] | Sequence[Any],
        outputs: Sequence[Any],
        remap_funcs: Mapping[str, Callable[..., Any]] | None = None,
    ) -> tuple[Net, list[BlobReference]]:
        """A net named ``name`` holding only the ops needed to compute
        ``outputs`` from ``inputs``, and references to its outputs.

        ``inputs`` is a dict (or a list of pairs) from blobs of this net to
        the names they take in the clone, or a list of blobs keeping their
        names; each means the blob's last value in this net. Blobs the kept
        ops read that nothing kept writes (and that are not inputs) keep
        their names and become external inputs; every other blob is renamed
        ``name/<blob>``. An input that a kept op would have to compute is an
        ``AssertionError``, as in Caffe2.
        """
        if isinstance(inputs, Mapping):
            input_map = {str(k): str(v) for k, v in inputs.items()}
        elif all(isinstance(i, tuple) and len(i) == 2 for i in inputs):
            input_map = {str(k): str(v) for k, v in inputs}
        else:
            input_map = {str(i): str(i) for i in inputs}
        output_names = [str(o) for o in outputs]
        for o in output_names:
            assert self.BlobIsDefined(o), "{} is not defined".format(o)
        ops = list(self._net.op)
        # Each blob version is (name, n): n counts the writes before it.
        version: dict[str, int] = {}
        reads, writer = [], {}
        for i, op in enumerate(ops):
            reads.append([(b, version.get(b, 0)) for b in op.input])
            for b in op.output:
                version[b] = version.get(b, 0) + 1
                writer[(b, version[b])] = i
        given = {(b, version.get(b, 0)) for b in input_map}

        def needed(targets, stop):
            seen, todo = set(), list(targets)
            while todo:
                v = todo.pop()
                if v in stop or v not in writer or writer[v] in seen:
                    continue
                seen.add(writer[v])
                todo.extend(reads[writer[v]])
            return seen

        used = needed([(o, version.get(o, 0)) for o in output_names], given)
        assert not used & needed(given, set()), (
            "Cannot partially clone net: some of the ops required would generate the given input."
        )
        kept = sorted(used)
        produced = {(b, v) for (b, v), i in writer.items() if i in used}
        undefined = []
        for i in kept:
            for v in reads[i]:
                if v not in produced and v not in given and v[0] not in undefined:
                    undefined.append(v[0])
        prefix = (name + "/") if name else ""
        every = set(version) | {b for r in reads for b, _ in r} | set(self._net.external_input)
        mapping = {
            b: input_map[b] if b in input_map else b if b in undefined else prefix + b
            for b in every
        }
        new_net = self.Clone(name, mapping, kept, remap_funcs)
        new_in = [mapping[b] for b in input_map] + undefined
        new_out = [mapping[o] for o in output_names]
        proto = new_net.Proto()
        del proto.external_input[:]
        proto.external_input.extend(new_in)
        del proto.external_output[:]
        proto.external_output.extend(new_out)
        return new_net, [new_net.GetBlobRef(o) for o in new_out]

    def reroute_tensor(
        self,
        tensor: str | BlobReference,
        new_producer: caffe2_pb2.OperatorDef,
        can_modify: Sequence[caffe2_pb2.OperatorDef] | None = None,
    ) -> int:
        """Puts ``new_producer`` (an op reading ``tensor``) right after the op
        that writes ``tensor`` (first, if it is an external input), and makes
        the ops equal to one in ``can_modify`` read the new op's first output
        instead of ``tensor``. Returns how many ops were changed."""
        name = str(tensor)
        ops = list(self._net.op)
        if self.is_external_input(name):
            at = 0
        else:
            writers = [i for i, op in enumerate(ops) if name in op.output]
            if not writers:
                raise errors.BlobNotFoundError(
                    "net %r has no op that writes %r and it is not an external input" % (self.Name(), name),
                    blob=name,
                )
            at = writers[-1] + 1
        new_name = new_producer.output[0]
        changed = 0
        modifiable = list(can_modify or [])
        for op in ops:
            if op in modifiable:
                remap_input(op, {name: new_name})
                changed += 1
        producer = caffe2_pb2.OperatorDef()
        producer.CopyFrom(new_producer)
        ops.insert(at, producer)
        proto = self._net
        del proto.op[:]
        proto.op.extend(ops)
        self._InvalidateLookupTables()
        return changed

    # -- convenience ops

    def Const(
        self,
        array: Any,
        blob_out: str | BlobReference | None = None,
        dtype: Any = None,
    ) -> BlobReference:
        """A constant: a Python bool becomes a 0-dim BOOL ConstantFill;
        anything else goes through ``np.array(array, dtype)`` and a
        GivenTensor*Fill chosen by the resulting dtype."""
        if isinstance(array, bool):
            return self.ConstantFill([], blob_out or 1, dtype=DataType.BOOL, value=array)

        array = np.array(array) if dtype is None else np.array(array, dtype=dtype)
        kind, size = array.dtype.kind, array.dtype.itemsize
        values = array.flatten().tolist()
        # Caffe2 bug fixed: strings and bools were detected by dtype
        # comparisons that depend on the numpy version; use dtype.kind.
        if kind == "i" and size == 4:
            operator = self.GivenTensorIntFill
        elif kind == "i" and size == 8:
            operator = self.GivenTensorInt64Fill
        elif kind in ("U", "S"):
            operator = self.GivenTensorStringFill
        elif kind == "b":
            operator = self.GivenTensorBoolFill
        else:
            operator = self.GivenTensorFill
            values = [float(v) for v in values]
        return operator([], blob_out or 1, shape=array.shape, values=values)

    def LogInfo(self, *msg_or_blobs: Any) -> None:
        """Prints each item when the net runs: blobs as they are, anything
        else as a string constant."""
        for msg_or_blob in msg_or_blobs:
            if not isinstance(msg_or_blob, BlobReference):
                blob = self.GivenTensorStringFill(
                    [], self.NextName("log"), shape=[], values=[msg_or_blob]
                )
            else:
                blob = msg_or_blob
            self.Print(blob, [])

    def AddGradientOperators(self, ys: Any, skip: int = 0) -> dict[BlobReference, Any]:
        """Appends the backward pass of ``ys`` (a list of losses, or a dict
        giving some of their gradients) through this net's ops after the
        first ``skip``; returns {blob: its gradient} (gradients.py)."""
        grad_ops, input_to_grad = GradientRegistry.GetBackwardPass(self._net.op[skip:], ys)
        self._ExtendOps(grad_ops)
        return input_to_grad

    def Python(
        self,
        f: Any,
        grad_f: Any = None,
        python_func_type: Any = None,
        pass_workspace: bool = False,
        grad_output_indices: Sequence[int] | None = None,
        grad_input_indices: Sequence[int] | None = None,
    ) -> Callable[..., Any]:
        """Returns ``op(inputs, outputs, **kwargs)`` that adds a ``Python`` op.

        ``f`` is a callable ``f(inputs, outputs)`` (``f(inputs, outputs,
        workspace)`` with ``pass_workspace``), registered process-wide under
        a token; or a tuple ``(builder, args, kwargs)``, pickled into the op,
        so that ``builder(*args, **kwargs)`` makes the callable once per op
        instance (in each workspace, on each node). ``grad_f`` (a callable,
        or a builder tuple when ``f`` is one) is what the op's gradient, a
        ``PythonGradient`` op, calls with inputs ``[inputs..., outputs...,
        output gradients...]`` and outputs ``[input gradients...]``, narrowed
        by ``grad_output_indices`` and ``grad_input_indices``.
        """
        assert IsOperator("Python")

        def make_builder(t):
            if not isinstance(t, tuple):
                return ""
            assert len(t) == 3, "Expected builder tuple (func, args, kwargs)"
            func, args, kwargs = t
            return pickle.dumps((func, tuple(args), dict(kwargs)))

        from ferrocaffe import _python_ops

        f_builder = make_builder(f)
        if f_builder:
            # Made here from the caller's own objects: safe to unpickle when
            # the op is built (builders from anywhere else are not).
            _python_ops.trust(f_builder)
        grad_f_builder = make_builder(grad_f)
        assert (not grad_f) or ((not f_builder) == (not grad_f_builder)), (
            "A tuple has to be passed to both f and grad_f or neither."
        )
        core_kwargs = {}
        if f_builder:
            core_kwargs["pickled_builder"] = f_builder
            core_kwargs["pass_workspace"] = pass_workspace
            if grad_f_builder:
                _python_ops.trust(grad_f_builder)
                core_kwargs["pickled_grad_builder"] = grad_f_builder
        else:
            core_kwargs["token"] = _RegisterPythonImpl(
                f, grad_f, python_func_type, pass_workspace=pass_workspace
            )

        grad_output_indices = grad_output_indices or []
        grad_input_indices = grad_input_indices or []
        return lambda *args, **kwargs: self._CreateAndAddToSelf(
            "Python",
            grad_output_indices=grad_output_indices,
            grad_input_indices=grad_input_indices,
            *args,
            **dict(chain(kwargs.items(), core_kwargs.items()))
        )

    # -- op creation by attribute

    def _CreateAndAddToSelf(self, op_type, inputs, outputs=None, **kwargs):
        inputs = _RectifyInputOutput(inputs)
        ops = self._tables()
        for input in inputs:
            if not ops.is_defined(input._name):
                assert input.Net() != self
                self.AddExternalInput(input)
        if outputs is None:
            # one output, named automatically
            outputs = self.NextName(prefix=op_type)
        elif type(outputs) is int:
            outputs = [self.NextName(prefix=op_type, output_id=i) for i in range(outputs)]
        # A single name becomes a reference made here, for this net: it can
        # be returned as it is (no second BlobReference per op).
        single_name = type(outputs) is str
        outputs = _RectifyInputOutput(outputs, net=self)
        # Where the user's code made the op: its index is known when the op
        # list is merged into the NetDef (see _flush).
        site = _user_frame()
        if (
            _OPERATOR_FIELD_KEYWORDS.isdisjoint(kwargs)
            and scope.CurrentDeviceScope() is None
            and not _caffe2_debug()
            and not _workspace._immediate_mode
        ):
            # The common op: its fields and serialised Arguments, with what
            # CreateOperator would check.
            args = []
            for key, value in kwargs.items():
                if value is not None:
                    args.append(_argument_bytes(key, value, op_type))
            output_names = _blob_names(outputs)
            ops.push(op_type, _blob_names(inputs), output_names, args, site)
        else:
            op = CreateOperator(op_type, inputs, outputs, **kwargs)
            output_names = list(op.output)
            ops.push_encoded(op.SerializePartialToString(), output_names, site)
        if len(output_names) == 0:
            return None
        if len(output_names) == 1:
            return outputs[0] if single_name else BlobReference(output_names[0], self)
        return tuple(BlobReference(o, self) for o in output_names)

    def __getattr__(self, op_type: str) -> Callable[..., Any]:
        # Private names are never op types (and refusing them keeps copy and
        # pickle from recursing here before __init__ has run).
        if op_type.startswith("_"):
            raise AttributeError("Attribute {} not found.".format(op_type))
        if not IsOperator(op_type) and not IsOperatorWithEngine(op_type, "CUDNN"):
            raise _not_registered(op_type)
        return _op_method(op_type).__get__(self, type(self))

    def __dir__(self):
        additional = [op for op in _registry() if "_ENGINE_" not in op]
        return sorted(set(chain(dir(type(self)), self.__dict__.keys(), additional)))


def InferBlobDevices(net: Net) -> dict[str, Any]:
    """Maps each blob an op of ``net`` writes to that op's device option."""
    mapping = {}
    for op in net.Proto().op:
        for b in op.output:
            mapping[b] = op.device_option
    return mapping


def InjectCrossDeviceCopies(
    net: Net,
    blob_to_device: Mapping[str, Any] | None = None,
    blob_remap: Mapping[str, str] | None = None,
    placeHolderOps: Sequence[str] | None = None,
) -> tuple[Net, dict[str, Any]]:
    """``(new_net, blob_to_device)``: a copy of ``net`` with the copies a
    blob needs to reach another device, and each blob's device after it.
    Every device here is the CPU, so no copy is ever needed: the ops are
    kept as they are (a non-CPU op is an ``InvalidArgumentError``, as when
    such a net is created). ``blob_to_device`` carries the devices of
    blobs made by earlier nets; ``blob_remap`` and ``placeHolderOps``
    (op types without a schema, such as send/receive markers) are accepted
    for Caffe2's signature."""
    devices = dict(blob_to_device or {})
    for op in net.Proto().op:
        if op.device_option.device_type != caffe2_pb2.CPU:
            raise errors.InvalidArgumentError(
                "op %s of net %r runs on device type %d: ferrocaffe runs on the CPU only"
                % (op.type, net.Name(), op.device_option.device_type),
                op=op.type,
            )
        for b in list(op.input) + list(op.output):
            devices[b] = op.device_option
    new_net = net.Clone(net.Name() + "_cross_device", keep_schema=True)
    return new_net, devices


IR = gradients.IR
GradientSlice = gradients.GradientSlice
GradientWrapper = gradients.GradientWrapper


class GradientRegistry(gradients.GradientRegistry):
    """The gradient makers (gradients.py; one registry shared with it),
    whose backward pass names blobs with BlobReferences, as Caffe2's does."""

    @classmethod
    def GetBackwardPass(
        cls, operators: Sequence[Any], ys: Any, ys_generate_gradient: bool = False
    ) -> tuple[list[Any], dict[BlobReference, Any]]:
        ops, grads = IR(operators).GetBackwardPass(ys)

        def ref(g: Any) -> Any:
            if isinstance(g, gradients.GradientSlice):
                return gradients.GradientSlice(BlobReference(g.indices), BlobReference(g.values))
            return BlobReference(g)

        return ops, {BlobReference(name): ref(g) for name, g in grads.items()}


def control_op_remap(op: caffe2_pb2.OperatorDef, prefix: str, blob_remap: Mapping[str, str]) -> None:
    """Applies ``blob_remap`` inside the nets a control op holds (If and
    AsyncIf: ``then_net``/``else_net``; While: ``loop_net``/``cond_net``),
    as ``Net.Clone`` does by default; each such net is renamed
    ``<name>_remapped``."""
    names = ("then_net", "else_net") if op.type in ("If", "AsyncIf") else ("loop_net", "cond_net")
    for arg in op.arg:
        if arg.name in names and arg.HasField("n"):
            inner = Net(arg.n)
            remapped = inner.Clone((arg.n.name or "") + "_remapped", blob_remap=blob_remap)
            arg.n.CopyFrom(remapped.Proto())


DEFAULT_REMAP_FUNCS: dict[str, Callable[..., Any]] = {
    "If": control_op_remap,
    "AsyncIf": control_op_remap,
    "While": control_op_remap,
}


_ON_REFRESH.append(_forget_op_methods)

"""Execution steps and plans (Caffe2's ``core.ExecutionStep``, ``Plan``,
``execution_step``; a part of :mod:`ferrocaffe.core`)."""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from typing import Any, Mapping, Sequence


from ferrocaffe import errors
from ferrocaffe.proto import MAX_NESTING, _utf8, caffe2_pb2
from ferrocaffe.core.blobs import BlobReference, ScopedName
from ferrocaffe.core.net import Net, _add_net_to_dict, get_net_name


# ------------------------------------------------------- execution steps --


#: How many levels of substeps a step may have below it: a PlanDef holding
#: it is then at most protobuf's MAX_NESTING levels deep.
_MAX_STEP_DEPTH = MAX_NESTING - 1


def _step_depth(step_proto):
    """Levels of substeps below an ExecutionStep proto (iterative)."""
    depth, level = 0, list(step_proto.substep)
    while level:
        depth += 1
        level = [sub for s in level for sub in s.substep]
    return depth


class ExecutionStep:
    """A step of a plan: nets to run, or substeps, with iteration rules.

    A step becomes immutable once added to a plan or another step.
    """

    _step_names_used: set[str] = set()
    _names_lock = threading.Lock()

    @staticmethod
    def _get_next_step_name(basename):
        with ExecutionStep._names_lock:
            name = basename
            next_idx = 1
            while name in ExecutionStep._step_names_used:
                name = basename + "_" + str(next_idx)
                next_idx += 1
            ExecutionStep._step_names_used.add(name)
        return name

    def __init__(
        self,
        name: str | bytes | None,
        nets: Net | Sequence[Net] | None = None,
        num_iter: int | None = None,
    ) -> None:
        self._step = caffe2_pb2.ExecutionStep()
        if isinstance(name, str):
            name = _utf8(name, "step", step=repr(name))
        self._step.name = name or ExecutionStep._get_next_step_name("step")
        self._net_dict = OrderedDict()
        self._is_used = False
        self._substeps = []
        self._depth = 0  # levels of substeps below this step
        if nets is not None:
            if isinstance(nets, Net):
                nets = [nets]
            for net in nets:
                if _add_net_to_dict(self._net_dict, net):
                    self._step.network.extend([get_net_name(net)])
        if num_iter is not None:
            self._set("num_iter", num_iter)

    def _set(self, field, value):
        """Sets a field of the step's proto; a value the field cannot hold
        (an int out of its range) is an error naming the step."""
        try:
            setattr(self._step, field, value)
        except (TypeError, ValueError) as e:  # protobuf's checks of the value
            name = self._step.name
            cls = errors.DataTypeError if isinstance(e, TypeError) else errors.InvalidArgumentError
            raise cls(f"step '{name}', field {field}: {e}", step=name) from None

    def get_net(self, name: str) -> Net:
        return self._net_dict[name]

    def _as_plan(self):
        # workspace.RunPlan(step) asks the step: workspace sits below core.
        return Plan(self)

    def Name(self) -> str:
        return self._step.name

    def __str__(self):
        return self._step.name

    def __repr__(self):
        step = self._step
        fields = [
            "%s=%r" % (f.name, v) for f, v in step.ListFields()
            if f.name not in ("name", "substep", "network")
        ]
        fields.append("%d net%s" % (len(step.network), "" if len(step.network) == 1 else "s"))
        fields.append("%d substep%s" % (len(step.substep), "" if len(step.substep) == 1 else "s"))
        return "<ExecutionStep %r: %s>" % (step.name, ", ".join(fields))

    def _assert_can_mutate(self):
        assert not self._is_used, (
            "Cannot mutate a step that has already been added to a plan/step."
        )

    def _notify_is_used(self):
        self._is_used = True

    def Proto(self) -> caffe2_pb2.ExecutionStep:
        return self._step

    def HasNets(self) -> bool:
        return len(self._step.network) > 0

    def HasSubsteps(self) -> bool:
        return len(self._step.substep) > 0

    def Nets(self) -> list[Net]:
        return list(self._net_dict.values())

    def Substeps(self) -> list[ExecutionStep]:
        return self._substeps

    def SetIter(self, num_iter: int) -> None:
        self._assert_can_mutate()
        self._set("num_iter", num_iter)

    def SetCreateWorkspace(self, create_workspace: bool) -> None:
        self._assert_can_mutate()
        self._set("create_workspace", create_workspace)

    def SetNumConcurrentInstances(self, num_concurrent_instances: int) -> None:
        self._assert_can_mutate()
        self._set("num_concurrent_instances", num_concurrent_instances)

    def SetOnlyOnce(self, only_once: bool) -> None:
        self._assert_can_mutate()
        self._set("only_once", only_once)

    def SetShouldStopBlob(self, should_stop_blob: str | BlobReference) -> None:
        assert isinstance(should_stop_blob, BlobReference), (
            "expects BlobReference here, got {}".format(type(should_stop_blob))
        )
        self._assert_can_mutate()
        self._step.should_stop_blob = str(should_stop_blob)

    def RunEveryMillis(self, interval: int) -> None:
        """Runs this step every ``interval`` ms while its sibling substeps
        run, and once more after they finish. Ignored for a top-level step."""
        # Caffe2 bug fixed: upstream skipped the mutability check here.
        self._assert_can_mutate()
        self._set("run_every_ms", interval)

    def SetReportNet(self, report_net: Net, report_interval: int) -> None:
        """Deprecated: use RunEveryMillis."""
        self._assert_can_mutate()
        _add_net_to_dict(self._net_dict, report_net)
        self._step.report_net = get_net_name(report_net)
        self._set("report_interval", report_interval)

    def AddSubstep(self, substep: ExecutionStep) -> ExecutionStep:
        """Adds a step (or ExecutionStep proto) as a substep; an empty step
        is dropped. Returns self."""
        self._assert_can_mutate()
        assert not self.HasNets(), "Cannot have both network and substeps."
        if substep is self:
            # Caffe2 recursed forever walking such a step.
            raise errors.InvalidPlanError(
                f"step '{self.Name()}' cannot be a substep of itself", step=self.Name())
        if isinstance(substep, ExecutionStep):
            if not substep.HasNets() and not substep.HasSubsteps():
                substep._notify_is_used()
                return self
            proto, sub_depth = substep.Proto(), substep._depth
        else:
            proto, sub_depth = substep, _step_depth(substep)
        depth = max(self._depth, sub_depth + 1)
        if depth > _MAX_STEP_DEPTH:
            # Protobuf (and the runtime's decoder) stop at 100 levels of
            # messages; a PlanDef holding this step would be refused.
            raise errors.InvalidPlanError(
                f"cannot add step '{proto.name}' to step '{self.Name()}': steps may nest at "
                f"most {_MAX_STEP_DEPTH} levels deep (protobuf's limit of "
                f"{MAX_NESTING} levels of messages, inside a plan)",
                step=self.Name())
        if isinstance(substep, ExecutionStep):
            substep._notify_is_used()
            for net in substep.Nets():
                _add_net_to_dict(self._net_dict, net)
            self._substeps.append(substep)
        self._step.substep.add().CopyFrom(proto)
        self._depth = depth
        return self

    def SetConcurrentSubsteps(self, concurrent_substeps: bool) -> None:
        self._assert_can_mutate()
        assert not self.HasNets(), "Cannot have both network and substeps."
        self._step.concurrent_substeps = concurrent_substeps

    def AddNet(self, net: Net) -> ExecutionStep:
        """Adds a net to run (a net added twice runs twice). Returns self."""
        self._assert_can_mutate()
        assert not self.HasSubsteps(), "Cannot have both network and substeps."
        assert isinstance(net, Net)
        _add_net_to_dict(self._net_dict, net)
        self._step.network.extend([get_net_name(net)])
        return self

    def get_all_attributes(self, name: str) -> list[Any]:
        """The attributes ``name`` of every net this step (and its substeps) uses."""
        return [attr for net in self._net_dict.values() for attr in net.get_attributes(name)]

    @classmethod
    def create_from_proto(
        cls,
        step_proto: caffe2_pb2.ExecutionStep,
        net_obj_dict: dict[str, Net],
        net_proto_dict: Mapping[str, caffe2_pb2.NetDef],
    ) -> ExecutionStep:
        """Rebuilds a step (recursively) from its proto. Nets come from
        ``net_obj_dict`` by name, else are created from ``net_proto_dict``."""
        assert isinstance(step_proto, caffe2_pb2.ExecutionStep)
        assert (len(step_proto.network) > 0 and len(step_proto.substep) == 0) or (
            len(step_proto.network) == 0 and len(step_proto.substep) > 0
        )

        steps_or_nets: list[Any] = []
        if len(step_proto.substep) > 0:
            for substep_proto in step_proto.substep:
                steps_or_nets.append(
                    ExecutionStep.create_from_proto(substep_proto, net_obj_dict, net_proto_dict)
                )
        else:
            for net_name in step_proto.network:
                if net_name not in net_obj_dict:
                    assert net_name in net_proto_dict
                    net_obj_dict[net_name] = Net(net_proto_dict[net_name])
                net = net_obj_dict[net_name]
                assert isinstance(net, Net)
                steps_or_nets.append(net)

        def field(name, convert=None):
            if not step_proto.HasField(name):
                return None
            value = getattr(step_proto, name)
            return convert(value) if convert else value

        return execution_step(
            step_proto.name,
            steps_or_nets,
            num_iter=field("num_iter"),
            report_net=None,
            report_interval=None,
            concurrent_substeps=field("concurrent_substeps"),
            should_stop_blob=field("should_stop_blob", BlobReference),
            only_once=field("only_once"),
            num_concurrent_instances=field("num_concurrent_instances"),
            create_workspace=field("create_workspace"),
            run_every_ms=field("run_every_ms"),
        )


def add_nets_in_order(step: ExecutionStep, net_list: list[str]) -> None:
    """Appends to ``net_list`` the names of the nets ``step`` runs, depth
    first (substeps, own nets, report net), skipping names already there."""
    proto = step.Proto()
    for substep in step.Substeps():
        add_nets_in_order(substep, net_list)
    for net in proto.network:
        if net not in net_list:
            net_list.append(net)
    # Report nets come last, though they may run first; callers rely on it.
    if proto.report_net and proto.report_net not in net_list:
        net_list.append(proto.report_net)


class Plan:
    """A plan: steps plus snapshots of the nets they run."""

    def __init__(self, name_or_step: str | bytes | ExecutionStep) -> None:
        self._plan = caffe2_pb2.PlanDef()
        self._net_dict = OrderedDict()
        self._steps = []
        if isinstance(name_or_step, ExecutionStep):
            self._plan.name = name_or_step.Name()
            self.AddStep(name_or_step)
        elif isinstance(name_or_step, (str, bytes)):
            self._plan.name = name_or_step
        else:
            raise ValueError("name_or_step must be a string or ExecutionStep")

    def __str__(self):
        return self._plan.name

    def __repr__(self):
        n = len(self._plan.execution_step)
        return "<Plan %r: %d step%s, %d net%s>" % (
            self._plan.name, n, "" if n == 1 else "s",
            len(self._plan.network), "" if len(self._plan.network) == 1 else "s")

    def Proto(self) -> caffe2_pb2.PlanDef:
        return self._plan

    def AddNets(self, nets: Sequence[Net]) -> None:
        """Adds copies of the nets' NetDefs as they are now (once per name)."""
        for net in nets:
            if _add_net_to_dict(self._net_dict, net):
                assert isinstance(net, Net)
                self._plan.network.add().CopyFrom(net.Proto())

    def Nets(self) -> list[Net]:
        return list(self._net_dict.values())

    def AddStep(self, step: ExecutionStep) -> None:
        """Adds a copy of ``step`` (an empty step is dropped) and the nets it
        runs, in order of first use. The step becomes immutable."""
        assert isinstance(step, ExecutionStep)
        step._notify_is_used()
        if not step.HasNets() and not step.HasSubsteps():
            return
        self._plan.execution_step.add().CopyFrom(step.Proto())
        self._steps.append(step)
        net_list = []
        add_nets_in_order(step, net_list)
        self.AddNets([step.get_net(n) for n in net_list])

    def Steps(self) -> list[ExecutionStep]:
        return self._steps

    def get_all_attributes(self, name: str) -> list[Any]:
        """The attributes ``name`` of every net of this plan."""
        return [attr for net in self._net_dict.values() for attr in net.get_attributes(name)]

    @classmethod
    def create_from_proto(cls, plan_proto: caffe2_pb2.PlanDef) -> Plan:
        assert isinstance(plan_proto, caffe2_pb2.PlanDef)
        plan = Plan(plan_proto.name)
        plan._plan.CopyFrom(plan_proto)
        del plan._plan.network[:]
        del plan._plan.execution_step[:]

        net_obj_dict = {}
        net_proto_dict = {}
        for net_proto in plan_proto.network:
            assert net_proto.name not in net_proto_dict
            net_proto_dict[net_proto.name] = net_proto

        for step_proto in plan_proto.execution_step:
            step = ExecutionStep.create_from_proto(step_proto, net_obj_dict, net_proto_dict)
            plan.AddStep(step)
        return plan


def to_execution_step(step_or_nets: Any, default_name: str | None = None) -> ExecutionStep:
    """A step as is; a NetBuilder as a step over its children that stops on
    its stop blob; anything else through ``execution_step``."""
    if isinstance(step_or_nets, ExecutionStep):
        return step_or_nets

    stop_blob = None
    if not default_name and hasattr(step_or_nets, "name"):
        default_name = step_or_nets.name
    net_builder = sys.modules.get("ferrocaffe.net_builder")
    if net_builder is not None and isinstance(step_or_nets, net_builder.NetBuilder):
        stop_blob = step_or_nets._stop_blob
        step_or_nets = step_or_nets.get()
    return execution_step(default_name, step_or_nets, should_stop_blob=stop_blob)


def execution_step(
    default_name: str | None,
    steps_or_nets: Any,
    num_iter: int | None = None,
    report_net: Net | None = None,
    report_interval: int | None = None,
    concurrent_substeps: bool | None = None,
    should_stop_blob: str | BlobReference | None = None,
    only_once: bool | None = None,
    num_concurrent_instances: int | None = None,
    create_workspace: bool = False,
    run_every_ms: int | None = None,
) -> ExecutionStep:
    """Builds an ExecutionStep.

    ``steps_or_nets`` may be None, a Net, a step, a list of Nets (each added,
    duplicates included) or a list of steps and step-likes (each added as a
    substep). ``should_stop_blob`` is checked after every net or substep;
    without it or ``num_iter`` the step runs once.
    """
    assert should_stop_blob is None or num_iter is None, (
        "Cannot set both should_stop_blob and num_iter."
    )
    if should_stop_blob is None and num_iter is None:
        num_iter = 1

    step = ExecutionStep(default_name)
    if should_stop_blob is not None:
        step.SetShouldStopBlob(should_stop_blob)
    if num_iter is not None:
        step.SetIter(num_iter)
    if only_once is not None:
        step.SetOnlyOnce(only_once)
    if concurrent_substeps is not None:
        step.SetConcurrentSubsteps(concurrent_substeps)
    if report_net is not None:
        assert report_interval is not None
        step.SetReportNet(report_net, report_interval)
    if num_concurrent_instances is not None:
        step.SetNumConcurrentInstances(num_concurrent_instances)
    if create_workspace:
        step.SetCreateWorkspace(True)
    if run_every_ms:
        step.RunEveryMillis(run_every_ms)

    if isinstance(steps_or_nets, ExecutionStep):
        step.AddSubstep(steps_or_nets)
    elif isinstance(steps_or_nets, Net):
        step.AddNet(steps_or_nets)
    elif isinstance(steps_or_nets, list):
        if all(isinstance(x, Net) for x in steps_or_nets):
            for x in steps_or_nets:
                step.AddNet(x)
        else:
            for x in steps_or_nets:
                step.AddSubstep(to_execution_step(x))
    elif steps_or_nets:
        raise ValueError("steps_or_nets must be a step, a net, or a list of nets or steps.")
    return step


def scoped_execution_step(name: str | None, *args: Any, **kwargs: Any) -> ExecutionStep:
    """``execution_step`` with the name scope added to the step name."""
    default_name = ScopedName(name) if name else name
    return execution_step(default_name, *args, **kwargs)

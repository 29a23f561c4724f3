"""``run_plan``: runs a serialised Caffe2 plan, as Caffe2's ``run_plan``
binary did.

    run_plan PLAN_FILE            (or: run_plan --plan PLAN_FILE)
    python -m ferrocaffe.run_plan PLAN_FILE

The file holds a ``PlanDef`` in protobuf binary (``.pb``) or text format
(``.pbtxt``; see ``proto.ReadProtoFromFile``). The plan runs in a fresh
workspace (``--root-folder`` sets its root folder, where relative db paths
of ``Save``/``Load`` resolve). A progress line goes to standard error before
and after the run, and, when standard error is a terminal and the plan's
length is known (its looping top-level steps have a ``num_iter``), a tqdm
bar over their iterations while it runs (``--no-progress``: never;
``--progress``: also when not on a terminal). Exit status: 0 when the plan ran, 1 when it failed
(the error, with the op, net and step, is printed), 2 when the file cannot
be read or is not a plan, 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Sequence

from google.protobuf.message import DecodeError

from ferrocaffe import errors, proto, workspace

_PROG = "run_plan"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=_PROG,
        description="Runs a Caffe2 PlanDef file (protobuf binary or text format).")
    p.add_argument("plan_file", nargs="?", metavar="PLAN_FILE",
                   help="the plan: a .pb (binary) or .pbtxt (text) PlanDef")
    p.add_argument("--plan", dest="plan_flag", metavar="PLAN_FILE",
                   help="the plan file, as Caffe2's run_plan took it")
    p.add_argument("--root-folder", dest="root_folder", default=None,
                   help="root folder of the workspace the plan runs in")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress lines or bar, only errors")
    bar = p.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_const", const=True,
                     default=None,
                     help="draw the progress bar even when standard error is not a terminal")
    bar.add_argument("--no-progress", dest="progress", action="store_const", const=False,
                     help="no progress bar")
    return p


def read_plan(path: str) -> proto.PlanDef:
    """The PlanDef in the file at ``path`` (binary or text). Raises
    ``OSError`` if it cannot be read, ``ValueError`` naming the file if it
    holds no plan."""
    plan = proto.PlanDef()
    try:
        proto.ReadProtoFromFile(path, plan)
    except DecodeError as e:
        raise ValueError(str(e)) from None
    if not plan.execution_step and not plan.network:
        raise ValueError(f"{path!r} holds no plan: no networks and no execution steps")
    return plan


def _count_steps(steps) -> int:
    return sum(1 + _count_steps(s.substep) for s in steps)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.plan_file and args.plan_flag and args.plan_file != args.plan_flag:
        _parser().error("give the plan file once (PLAN_FILE or --plan)")
    path = args.plan_flag or args.plan_file
    if not path:
        _parser().error("no plan file given (PLAN_FILE or --plan)")

    def say(msg: str) -> None:
        if not args.quiet:
            print(f"{_PROG}: {msg}", file=sys.stderr, flush=True)

    try:
        plan = read_plan(path)
    except (OSError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        print(f"{_PROG}: error: cannot read the plan file {path!r}: {reason}",
              file=sys.stderr, flush=True)
        return 2
    name = plan.name or os.path.basename(path)
    say(f"running plan '{name}' from {path!r} ({len(plan.network)} nets, "
        f"{_count_steps(plan.execution_step)} steps)")
    start = time.monotonic()
    try:
        progress = False if args.quiet else args.progress
        workspace.Workspace(root_folder=args.root_folder).run(plan, progress=progress)
    except KeyboardInterrupt:
        print(f"{_PROG}: interrupted: plan '{name}' from {path!r}", file=sys.stderr, flush=True)
        return 130
    except (errors.FerrocaffeError, RuntimeError, OSError) as e:
        print(f"{_PROG}: error: plan '{name}' from {path!r} failed: {e}", file=sys.stderr,
              flush=True)
        return 1
    say(f"plan '{name}' finished in {time.monotonic() - start:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

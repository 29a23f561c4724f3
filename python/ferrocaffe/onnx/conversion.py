"""The commands Caffe2 installed (``caffe2.python.onnx.bin.conversion``):

    convert-caffe2-to-onnx PREDICT_NET [--caffe2-init-net INIT_NET]
        [--value-info JSON] [--caffe2-net-name NAME] [--opset N] -o MODEL.onnx
    convert-onnx-to-caffe2 MODEL.onnx -o PREDICT_NET --init-net-output INIT_NET

NetDefs are read in protobuf binary or text format (``.pbtxt`` tried as text
first) and written in binary (text with a ``.pbtxt``/``.prototxt``/``.txt``
name). ``--value-info`` is a JSON object ``{"input": [elem_type, [dims...]]}``
(ONNX element types: 1 is FLOAT), given inline or as the path of a JSON file
(the model zoo ships ``value_info.json``). Exit status: 0 when the file was
written, 1 with a one-line message when an input cannot be read or
converted (argument errors: 2, as argparse).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

from google.protobuf import text_format
from google.protobuf.message import DecodeError

from .. import errors, proto

_TEXT_SUFFIXES = (".pbtxt", ".prototxt", ".txt")


class _Failure(Exception):
    """A failure the command reports in one line (exit status 1)."""


def _read_net(path: str, what: str):
    try:
        net = proto.ReadProtoFromFile(path, proto.NetDef())
    except OSError as e:
        raise _Failure(f"cannot read the {what} {path!r}: {e.strerror or e}") from None
    except DecodeError:
        raise _Failure(f"{path!r} is not a NetDef (neither protobuf binary nor text)") from None
    if not net.op and not net.external_input and not net.external_output:
        raise _Failure(f"{path!r} holds no net: no ops and no inputs or outputs")
    return net


def _value_info(text: str | None) -> dict | None:
    if text is None:
        return None
    source = "--value-info"
    if os.path.exists(text):
        source = repr(text)
        try:
            with open(text, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise _Failure(f"cannot read the value info {text!r}: {e.strerror or e}") from None
    try:
        value = json.loads(text)
    except ValueError as e:
        raise _Failure(f"{source} is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise _Failure(f"{source} must be a JSON object: name -> [elem_type, [dims]]")
    return value


def _write(path: str, data: bytes) -> None:
    try:
        with open(path, "wb") as f:
            f.write(data)
    except OSError as e:
        raise _Failure(f"cannot write {path!r}: {e.strerror or e}") from None


def _net_bytes(net, path: str) -> bytes:
    if path.endswith(_TEXT_SUFFIXES):
        return text_format.MessageToString(net).encode("utf-8")
    return net.SerializeToString()


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _run(prog: str, body) -> int:
    try:
        body()
    except _Failure as e:
        print(f"{prog}: error: {_one_line(e)}", file=sys.stderr)
        return 1
    except ImportError as e:
        print(f"{prog}: error: {_one_line(e)}", file=sys.stderr)
        return 1
    except (errors.FerrocaffeError, ValueError, OSError, RuntimeError) as e:
        print(f"{prog}: error: {_one_line(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    return 0


def caffe2_to_onnx(argv: Sequence[str] | None = None) -> int:
    """``convert-caffe2-to-onnx``: a Caffe2 predict net (and init net) to an
    ONNX model."""
    prog = "convert-caffe2-to-onnx"
    p = argparse.ArgumentParser(
        prog=prog, description="Converts a Caffe2 net (predict net and init net) to an ONNX model.")
    p.add_argument("caffe2_net", metavar="PREDICT_NET",
                   help="the predict net: a NetDef file (protobuf binary or text)")
    p.add_argument("--caffe2-net-name", help="the net's name (needed when the file has none)")
    p.add_argument("--caffe2-init-net", metavar="INIT_NET",
                   help="the init net, whose outputs become the model's initializers")
    p.add_argument("--value-info", metavar="JSON",
                   help='element type and shape of each input, e.g. \'{"data": [1, [1, 3, 224, 224]]}\' '
                        "(1 is ONNX's FLOAT), or the path of a JSON file holding that")
    p.add_argument("--opset", type=int, default=None,
                   help="ONNX opset of the model (default: the frontend's, 17)")
    p.add_argument("-o", "--output", required=True, metavar="MODEL", help="the ONNX model to write")
    args = p.parse_args(argv)

    def body():
        net = _read_net(args.caffe2_net, "predict net")
        if not net.name and not args.caffe2_net_name:
            raise _Failure("the predict net has no name: give --caffe2-net-name")
        net.name = args.caffe2_net_name or net.name
        init = None
        if args.caffe2_init_net:
            init = _read_net(args.caffe2_init_net, "init net")
            init.name = init.name or f"{net.name}_init"
        value_info = _value_info(args.value_info)
        from . import frontend  # needs the onnx package

        model = frontend.caffe2_net_to_onnx_model(net, init, value_info, opset_version=args.opset)
        _write(args.output, model.SerializeToString())

    return _run(prog, body)


def onnx_to_caffe2(argv: Sequence[str] | None = None) -> int:
    """``convert-onnx-to-caffe2``: an ONNX model to a Caffe2 predict net and
    init net."""
    prog = "convert-onnx-to-caffe2"
    p = argparse.ArgumentParser(
        prog=prog, description="Converts an ONNX model to a Caffe2 predict net and init net.")
    p.add_argument("onnx_model", metavar="MODEL", help="the ONNX model file")
    p.add_argument("-o", "--output", required=True, metavar="PREDICT_NET",
                   help="the predict net to write (text format with a .pbtxt name)")
    p.add_argument("--init-net-output", required=True, metavar="INIT_NET",
                   help="the init net to write (it fills the model's initializers)")
    args = p.parse_args(argv)

    def body():
        from . import backend  # needs the onnx package
        import onnx

        try:
            model = onnx.load(args.onnx_model)
        except OSError as e:
            raise _Failure(f"cannot read the model {args.onnx_model!r}: {e.strerror or e}") from None
        except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and friends
            raise _Failure(f"{args.onnx_model!r} is not an ONNX model: {_one_line(e)}") from None
        if not model.graph.node and not model.graph.output:
            raise _Failure(f"{args.onnx_model!r} is not an ONNX model: it has no graph")
        try:
            onnx.checker.check_model(model)
        except onnx.checker.ValidationError as e:
            raise _Failure(f"{args.onnx_model!r} is not a valid ONNX model: {_one_line(e)}") from None
        init, pred = backend.onnx_graph_to_caffe2_net(model)
        _write(args.init_net_output, _net_bytes(init, args.init_net_output))
        _write(args.output, _net_bytes(pred, args.output))

    return _run(prog, body)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ferrocaffe.onnx.conversion caffe2-to-onnx|onnx-to-caffe2 ...``"""
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"caffe2-to-onnx": caffe2_to_onnx, "onnx-to-caffe2": onnx_to_caffe2}
    if not argv or argv[0] not in commands:
        print("usage: python -m ferrocaffe.onnx.conversion {caffe2-to-onnx,onnx-to-caffe2} ...",
              file=sys.stderr)
        return 2
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())

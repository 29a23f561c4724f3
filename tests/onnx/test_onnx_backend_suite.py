"""ONNX's own backend tests against ferrocaffe's ONNX backend.

The onnx wheel ships its node tests as generators
(``onnx.backend.test.case.node``: each a one-node model, or the node's
function body "expanded", with inputs and the outputs of ONNX's reference)
and its small model tests as files (``simple``, ``pytorch-converted``,
``pytorch-operator``). Every case runs through ``backend.prepare(model).run``
and is compared as ``onnx.backend.test.BackendTest`` compares it (shapes,
dtypes, allclose with the case's tolerances).

What is not expected to pass is decided here, in one place:

- a case using an op listed in ``backend.UNSUPPORTED_OPS`` (or an op of a
  domain other than ONNX's) is skipped, with that list's reason;
- a case matching ``EXPECTED_REFUSALS`` is run and must be refused with a
  typed ``UnsupportedOperatorError`` (a dtype ferrocaffe's tensors lack, or
  an attribute value without a conversion), never a crash or a wrong
  answer;
- a case matching ``EXPECTED_MISMATCHES`` runs and is expected to differ
  from ONNX's reference beyond its tolerance (the reason says why).

Everything else must pass. The "real" model tests are the model zoo's
nets (AlexNet, DenseNet-121, Inception v1 and v2, ResNet-50, ShuffleNet,
SqueezeNet, VGG-19, ZFNet-512, as Caffe2's own frontend exported them) in
the "light" form the wheel ships: constant weights, the expected output
stored beside each model, the inputs made as ONNX's runner makes them.

``python tests/onnx/test_onnx_backend_suite.py`` prints the per-op counts
recorded in docs/porting.md.
"""

import collections
import glob
import os
import re
import sys
import warnings

import numpy as np
import pytest

import onnx  # noqa: E402  (the test extra installs it)

from onnx import numpy_helper  # noqa: E402
from onnx.backend.test.loader import load_model_tests, load_node_model_tests  # noqa: E402
from onnx.backend.test.runner import Runner  # noqa: E402

from ferrocaffe import errors  # noqa: E402
from ferrocaffe.onnx import backend, frontend  # noqa: E402

# (pattern on the case name, reason): refused with UnsupportedOperatorError.
_LOW_PRECISION = "FLOAT8E4M3FN|FLOAT8E4M3FNUZ|FLOAT8E5M2|FLOAT8E5M2FNUZ|FLOAT8E8M0|FLOAT4E2M1"
EXPECTED_REFUSALS = [
    (r"uint32|uint64|_ui64_", "no unsigned 32/64-bit tensors in ferrocaffe"),
    (r"bfloat16|_bf16_|BFLOAT16", "no bfloat16 tensors in ferrocaffe"),
    (rf"({_LOW_PRECISION})(_|$)", "no 8-bit or 4-bit float tensors in ferrocaffe"),
    (r"(UINT4|INT4|UINT2|INT2)(_|$)", "no 2- or 4-bit integer tensors in ferrocaffe"),
    (r"^test_equal_string", "no string comparisons"),
    (r"^test_identity_(sequence|opt)$", "only tensor-typed values are converted"),
    (r"^test_training_dropout(_default)?(_mask)?$", "Dropout in training mode is random"),
    (r"^test_batchnorm_.*_training_mode$", "BatchNormalization in training mode"),
    (r"^test_maxpool_with_argmax_", "MaxPool's Indices output has no ferrocaffe op"),
    (r"^test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_True$",
     "ceil_mode with count_include_pad past the pads: ferrocaffe's pooling counts the taps "
     "in the padded image only"),
    (r"^test_center_crop_pad_.*_expanded$",
     "the crop sizes are computed at run time and Slice's bounds must be constants"),
]
# (pattern, reason): converted and run, outside ONNX's tolerance.
EXPECTED_MISMATCHES = [
    (r"^test_attention_4d_causal_fp16_expanded$",
     "float16 math runs in float32 (rounded once at the end), ONNX's reference in float16"),
]
# Model-test categories in the run (see the module doc).
CATEGORIES = ("simple", "pytorch-converted", "pytorch-operator", "real")
_LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def _load_cases():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = [("node", c) for c in load_node_model_tests()]
        for kind in CATEGORIES:
            # (only the real models stored in the wheel: no downloads)
            cases.extend((kind, c) for c in load_model_tests(kind=kind)
                         if kind != "real" or (c.url or "").startswith("onnx/backend/test/data/light/"))
    return sorted(cases, key=lambda kc: (kc[0], kc[1].name))


CASES = _load_cases()


def _light_path(case):
    return os.path.join(_LIGHT, os.path.basename(case.url))


def _model(kind, case):
    if case.model is not None:
        return case.model
    if kind == "real":
        return onnx.load(_light_path(case))
    return onnx.load(os.path.join(case.model_dir, "model.onnx"))


def _data_sets(kind, case, model):
    if case.data_sets is not None:
        for inputs, outputs in case.data_sets:
            yield ([np.asarray(_normal(i)) for i in inputs], [np.asarray(_normal(o)) for o in outputs])
        return
    if kind == "real":
        inits = {t.name for t in model.graph.initializer}
        inputs = [Runner.generate_dummy_data(vi, seed=0, name=case.model_name, random=False)
                  for vi in model.graph.input if vi.name not in inits]
        out = _light_path(case)[:-len(".onnx")] + "_output_0.pb"
        yield inputs, [numpy_helper.to_array(onnx.load_tensor(out))]
        return
    for d in sorted(glob.glob(os.path.join(case.model_dir, "test_data_set*"))):
        load = lambda pat: [numpy_helper.to_array(onnx.load_tensor(f))  # noqa: E731
                            for f in sorted(glob.glob(os.path.join(d, pat)))]
        yield load("input_*.pb"), load("output_*.pb")


def _normal(t):
    return numpy_helper.to_array(t) if isinstance(t, onnx.TensorProto) else t


def _ops(model):
    return {(n.domain, n.op_type) for n in model.graph.node}


def classify(kind, case):
    """('skip', reason) | ('refuse', reason) | ('mismatch', reason) | ('pass', None)."""
    model = _model(kind, case)
    for domain, op in sorted(_ops(model)):
        if domain not in ("", "ai.onnx"):
            return "skip", f"op {op} of domain {domain}: other domains are not converted"
        if op in backend.UNSUPPORTED_OPS:
            return "skip", f"op {op}: {backend.UNSUPPORTED_OPS[op]}"
    for pattern, reason in EXPECTED_REFUSALS:
        if re.search(pattern, case.name):
            return "refuse", reason
    for pattern, reason in EXPECTED_MISMATCHES:
        if re.search(pattern, case.name):
            return "mismatch", reason
    return "pass", None


def run_case(kind, case):
    model = _model(kind, case)
    rep = backend.prepare(model, "CPU")
    for inputs, expected in _data_sets(kind, case, model):
        got = rep.run(inputs)
        Runner.assert_similar_outputs(expected, list(got), rtol=case.rtol, atol=case.atol)


@pytest.mark.parametrize("kind,case", CASES, ids=[f"{k}:{c.name}" for k, c in CASES])
def test_onnx_backend_case(kind, case):
    verdict, reason = classify(kind, case)
    if verdict == "skip":
        pytest.skip(reason)
    if verdict == "refuse":
        with pytest.raises(errors.UnsupportedOperatorError):
            run_case(kind, case)
        return
    if verdict == "mismatch":
        with pytest.raises(AssertionError):
            run_case(kind, case)
        return
    run_case(kind, case)


def test_every_expectation_matches_a_case():
    # No stale entries: each pattern still names a case that runs.
    names = [c.name for k, c in CASES if classify(k, c)[0] != "skip"]
    for pattern, _ in EXPECTED_REFUSALS + EXPECTED_MISMATCHES:
        assert any(re.search(pattern, n) for n in names), pattern


def test_every_op_in_the_suite_is_converted_or_listed_unsupported():
    # Nothing is dropped silently: an op the suite uses either has a
    # conversion or a reason in UNSUPPORTED_OPS.
    converted = set(backend.Caffe2Backend.supported_ops())
    assert not converted & set(backend.UNSUPPORTED_OPS)
    unknown = set()
    for kind, case in CASES:
        for domain, op in _ops(_model(kind, case)):
            if domain in ("", "ai.onnx") and op not in converted and op not in backend.UNSUPPORTED_OPS:
                unknown.add(op)
    assert unknown == set()


def test_every_op_the_frontend_emits_passes_its_node_tests():
    emitted = set(frontend.ONNX_OPS_EMITTED)
    seen = collections.Counter()
    for kind, case in CASES:
        ops = {op for _, op in _ops(_model(kind, case))}
        if kind != "node" or len(ops) != 1 or not ops <= emitted:
            continue
        verdict, reason = classify(kind, case)
        # Only what the frontend never emits may be refused: dtypes
        # ferrocaffe lacks, training modes, MaxPool's indices.
        assert verdict in ("pass", "refuse"), (case.name, verdict, reason)
        if verdict == "refuse":
            assert re.search(r"tensor|training|Indices|string|count_include_pad", reason), case.name
        else:
            seen[ops.pop()] += 1
    # Every emitted op has node tests that pass (run by the test above).
    assert sorted(emitted - set(seen)) == []


def per_op_counts():
    """{op: Counter(passed/skipped/refused/mismatched)} over the node tests
    (a case counts for each op of its model)."""
    counts = collections.defaultdict(collections.Counter)
    for kind, case in CASES:
        verdict, _ = classify(kind, case)
        if verdict == "pass":
            try:
                run_case(kind, case)
            except Exception:  # noqa: BLE001 - reported as failed
                verdict = "failed"
        label = {"pass": "passed", "skip": "skipped", "refuse": "refused",
                 "mismatch": "mismatched", "failed": "failed"}[verdict]
        key = kind if kind != "node" else None
        for _, op in _ops(_model(kind, case)) if key is None else [("", f"[{kind}]")]:
            counts[op][label] += 1
        counts["(all cases)" if key is None else "(all model cases)"][label] += 1
    return counts


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    c = per_op_counts()
    print("| op | passed | refused | mismatched | skipped | failed |")
    print("|---|---|---|---|---|---|")
    for op in sorted(c, key=lambda o: (o.startswith("(") or o.startswith("["), o)):
        k = c[op]
        print(f"| {op} | {k['passed']} | {k['refused']} | {k['mismatched']} | {k['skipped']} | {k['failed']} |")
    sys.exit(0)

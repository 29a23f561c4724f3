"""A FIFO (or another non-regular file) where a db or data file is expected
is refused at once with FerrocaffeIOError (an OSError) naming it. Opening a
FIFO for reading waits for a writer, inside a call Ctrl-C could not stop:
each case runs in a child process with a bound, and a child that does not
finish is sent SIGINT, then killed, and the test fails."""

import json
import os
import signal
import textwrap

import pytest
from _child import Child

BOUND_S = 60.0

PRELUDE = textwrap.dedent(
    """
    import os, subprocess, sys
    import numpy as np
    from ferrocaffe import _core, checkpoint, core, workspace
    from ferrocaffe.errors import FerrocaffeIOError

    fifo = sys.argv[1]

    def refused(call, *words):
        try:
            call()
        except FerrocaffeIOError as e:
            assert isinstance(e, OSError)
            for w in ("not a regular file (a FIFO)",) + words:
                assert w in str(e), (w, str(e))
            return e
        raise AssertionError("no error")
    """
)

CASES = {
    "load_ferro": """
        e = refused(lambda: workspace.RunOperatorOnce(core.CreateOperator(
            "Load", [], ["x"], db=fifo, db_type="ferro", absolute_path=1)), fifo)
        assert e.file == fifo
    """,
    "load_minidb": """
        refused(lambda: workspace.RunOperatorOnce(core.CreateOperator(
            "Load", [], ["x"], db=fifo, db_type="minidb", absolute_path=1)), fifo)
    """,
    "db_exists": """
        workspace.RunOperatorOnce(core.CreateOperator(
            "DBExists", [], ["e"], db_name=fifo, db_type="ferro", absolute_path=1))
        assert workspace.FetchBlob("e").item() is False
        assert _core.db_exists(fifo, "minidb") is False
    """,
    "list_and_verify_db": """
        refused(lambda: _core.list_db(fifo, "ferro"))
        refused(lambda: _core.list_db(fifo, "minidb"))
        refused(lambda: _core.verify_db(fifo, "ferro"))
    """,
    "mmap_db": """
        e = refused(lambda: checkpoint.mmap_db(fifo), fifo)
        assert e.file == fifo
    """,
    "npy_reader": """
        from ferrocaffe.file_reader import NpyReader
        refused(lambda: NpyReader(fifo, validate=False), fifo)
        refused(lambda: NpyReader(fifo), fifo)
    """,
    # The checkpoint CLI over a directory whose manifest names a FIFO.
    "checkpoint_ls_and_verify": """
        d = os.path.dirname(fifo)
        for cmd, rc in (("ls", 0), ("verify", 1)):
            r = subprocess.run([sys.executable, "-m", "ferrocaffe.checkpoint", cmd, d],
                               capture_output=True, text=True, timeout=30)
            assert r.returncode == rc, (cmd, r.returncode, r.stdout, r.stderr)
            assert "trainer.1" in r.stdout, (cmd, r.stdout)
            if cmd == "ls":
                assert "UNREADABLE" in r.stdout and "not a regular file (a FIFO)" in r.stdout, r.stdout
    """,
    # The manifest itself is a FIFO: a damaged manifest, not a hang.
    "checkpoint_manifest_is_a_fifo": """
        d = os.path.join(os.path.dirname(fifo), "m")
        os.mkdir(d)
        os.mkfifo(os.path.join(d, "manifest.json"))
        from ferrocaffe.errors import CorruptCheckpointError
        try:
            checkpoint.read_manifest(d)
        except CorruptCheckpointError as e:
            assert "not a regular file (a FIFO)" in str(e), e
        else:
            raise AssertionError("no error")
        r = subprocess.run([sys.executable, "-m", "ferrocaffe.checkpoint", "ls", d],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 1 and "not a regular file" in r.stderr, (r.returncode, r.stdout, r.stderr)
    """,
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_fifo_is_refused_without_blocking(tmp_path, name):
    fifo = str(tmp_path / "trainer.1")
    os.mkfifo(fifo)
    with open(tmp_path / "manifest.json", "w") as f:
        json.dump({"format": "ferrocaffe-checkpoints", "latest": 1, "max_to_keep": None,
                   "epochs": [{"epoch": 1, "db_type": "ferro",
                               "dbs": {"trainer": {"file": "trainer.1", "bytes": 64}}}]}, f)
    source = PRELUDE + textwrap.dedent(CASES[name]) + '\nprint("ok", flush=True)\n'
    child = Child(source.replace("sys.argv[1]", repr(fifo)))
    try:
        child.wait_for("ok", BOUND_S)
        assert child.finish(BOUND_S) == 0, child.describe()
    finally:
        if child.proc.poll() is None:
            child.proc.send_signal(signal.SIGINT)
        child.kill()

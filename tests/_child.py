"""A Python child process for the tests whose failure would be a hang or a
crash: its stdout lines are collected by a thread, so every wait has a
bound even when the child prints nothing more."""

import os
import queue
import subprocess
import sys
import threading
import time


def child_env(**extra):
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    # numpy's BLAS pool is never used by these children; idle, it still spins.
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    if env.get("PYTHONPATH"):
        # Passed through, made absolute so the child's cwd does not matter.
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in env["PYTHONPATH"].split(os.pathsep) if p)
    env.update(extra)
    return env


class Child:
    """`python -c source`, its stdout read line by line by a thread."""

    def __init__(self, source, **env):
        self.lines = []
        self.stderr = []
        self._queue = queue.Queue()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", source],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=child_env(**env),
            text=True,
        )
        self._threads = [
            threading.Thread(target=self._read, daemon=True),
            threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _read(self):
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            self._queue.put(line)
        self._queue.put(None)

    def describe(self):
        return f"stdout={self.lines!r} stderr={''.join(self.stderr)[-3000:]}"

    def wait_for(self, wanted, bound):
        """Waits until the child prints the line `wanted`; fails (killing
        it) when it ends first or `bound` seconds pass."""
        deadline = time.monotonic() + bound
        while True:
            remaining = deadline - time.monotonic()
            try:
                line = self._queue.get(timeout=max(remaining, 0))
            except queue.Empty:
                line = None
            if line == wanted:
                return
            if line is None:
                self.kill()
                raise AssertionError(f"never printed {wanted!r} within {bound} s; {self.describe()}")

    def finish(self, bound):
        """Waits for the child to exit (killing it after `bound` seconds,
        which fails); returns its exit code."""
        try:
            rc = self.proc.wait(timeout=bound)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"still running after {bound} s; {self.describe()}")
        for t in self._threads:
            t.join(bound)
        return rc

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

"""What a checkpoint writes and what it trusts.

* Saves replace only regular files and sweep only their own temporaries
  (issue 17, items 7 and 8).
"""

import os
import stat
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import ferrocaffe
from ferrocaffe import core, errors, workspace

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(
    ferrocaffe.__file__)))

DEAD_PID = 4000000000  # above any pid_max: no live process has it


def save_op(path, db_type='ferro'):
    return core.CreateOperator('Save', ['v'], [], db=str(path),
                               db_type=db_type, absolute_path=True)


def fed_workspace():
    ws = workspace.Workspace()
    ws.feed_blob('v', np.arange(4, dtype=np.int64))
    return ws


# ============================================= what a save may replace ==

def _run_with_timeout(fn, timeout=20.0):
    """Runs ``fn`` in a thread; fails (instead of hanging) if it blocks."""
    result = {}

    def target():
        try:
            result['value'] = fn()
        except BaseException as e:  # handed to the test
            result['error'] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), 'the call blocked'
    if 'error' in result:
        raise result['error']
    return result.get('value')


@pytest.mark.parametrize('db_type', ['ferro', 'minidb'])
@pytest.mark.parametrize('kind', ['fifo', 'symlink', 'directory'])
def test_save_refuses_to_replace_anything_but_a_regular_file(
        tmp_path, kind, db_type):
    target = tmp_path / 'db'
    real = tmp_path / 'real'
    real.write_bytes(b'keep me')
    if kind == 'fifo':
        os.mkfifo(str(target))
    elif kind == 'symlink':
        os.symlink(str(real), str(target))
    else:
        target.mkdir()
    ws = fed_workspace()
    with pytest.raises(errors.FerrocaffeIOError) as info:
        _run_with_timeout(lambda: ws.run(save_op(target, db_type)))
    assert isinstance(info.value, OSError)
    assert info.value.file == str(target)
    assert 'only replaces regular files' in str(info.value)
    # Nothing was replaced, and no temporary is left behind.
    mode = os.lstat(str(target)).st_mode
    assert {'fifo': stat.S_ISFIFO, 'symlink': stat.S_ISLNK,
            'directory': stat.S_ISDIR}[kind](mode)
    assert real.read_bytes() == b'keep me'
    assert sorted(os.listdir(str(tmp_path))) == ['db', 'real']
    # The workspace is still usable: a save to a plain path works.
    ws.run(save_op(tmp_path / 'plain', db_type))
    assert os.path.isfile(str(tmp_path / 'plain'))


def test_save_replaces_a_regular_file(tmp_path):
    target = tmp_path / 'db'
    target.write_bytes(b'old')
    fed_workspace().run(save_op(target))
    assert target.read_bytes()[:8] == b'FERROCKP'


# ========================================================= temporaries ==

def _temp_name(target, host, pid, n):
    return '.%s.tmp-ferrocaffe-%s-%d-%d' % (target, host, pid, n)


def test_a_save_sweeps_only_its_own_stale_temporaries(tmp_path):
    d = str(tmp_path)
    foreign = ['.thesis.docx.tmp-1-2', '.db.tmp-%d-0' % DEAD_PID,
               '.db.tmp-ferrocaffe-zz-1-2', 'db.tmp-ferrocaffe-00000000-1-2']
    for name in foreign:
        with open(os.path.join(d, name), 'wb') as f:
            f.write(b'not ours')
        old = time.time() - 7 * 24 * 3600
        os.utime(os.path.join(d, name), (old, old))
    # A week-old temporary of another db of ferrocaffe's: not this save's.
    other = _temp_name('other', '00000000', DEAD_PID, 3)
    with open(os.path.join(d, other), 'wb') as f:
        f.write(b'x')
    old = time.time() - 7 * 24 * 3600
    os.utime(os.path.join(d, other), (old, old))
    # Temporaries of this db: an hour-old one of any host, and a fresh one
    # of a dead process of this host (a SIGKILLed save a moment ago).
    stale_any_host = _temp_name('db', 'ffffffff', 1, 4)
    with open(os.path.join(d, stale_any_host), 'wb') as f:
        f.write(b'x' * 1000)
    os.utime(os.path.join(d, stale_any_host), (old, old))

    fed_workspace().run(save_op(tmp_path / 'db'))
    left = sorted(os.listdir(d))
    assert left == sorted(foreign + [other, 'db'])


def _kill_during_a_save(target, env):
    """Starts a child saving a 64 MiB db to ``target`` over and over and
    SIGKILLs it while a temporary exists; True if one was left behind."""
    child = r'''
import sys, numpy as np
from ferrocaffe import core, workspace
ws = workspace.Workspace()
ws.feed_blob('v', np.ones(1 << 26, np.uint8))
op = core.CreateOperator('Save', ['v'], [], db=sys.argv[1], db_type='ferro',
                         absolute_path=True)
print('READY', flush=True)
while True:
    ws.run(op)
'''
    directory = os.path.dirname(target)
    prefix = '.%s.' % os.path.basename(target)  # a temporary of it
    proc = subprocess.Popen([sys.executable, '-c', child, target],
                            stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout.readline().strip() == b'READY'
        deadline = time.monotonic() + 60
        while not any(n.startswith(prefix) for n in os.listdir(directory)):
            assert time.monotonic() < deadline, 'no temporary appeared'
        proc.kill()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
    return any(n.startswith(prefix) for n in os.listdir(directory))


def test_a_killed_saves_temporary_is_swept_by_the_next_save_at_once(
        tmp_path):
    """A SIGKILLed save of a large db leaves its temporary; the next save
    of that db removes it when it starts, however recent it is."""
    env = dict(os.environ)
    env['PYTHONPATH'] = PYTHON_DIR + os.pathsep + env.get('PYTHONPATH', '')
    target = str(tmp_path / 'db')
    for _ in range(10):
        if _kill_during_a_save(target, env):
            break
    else:
        pytest.fail('no kill landed during a save in 10 tries')
    fed_workspace().run(save_op(target))
    assert [n for n in os.listdir(str(tmp_path)) if n.startswith('.')] == []

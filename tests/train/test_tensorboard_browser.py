"""End to end (issue 16): the main job (examples/train_job.py
--tensorboard) writes its logs, TensorBoard serves them on localhost, and
headless Chromium renders the scalars and graph pages. The rendered page
(its text, shadow roots included: `--dump-dom` leaves out the contents of
TensorBoard's Polymer dashboards, so the text is read over Chromium's own
DevTools pipe) must hold the job's scalar tags and the training net's op
names, and the screenshots (`--screenshot`, in the test's tmp dir;
`--basetemp DIR` keeps them) must not be blank.

Needs the `chromium` program (Debian: `apt-get install chromium`) and the
`tensorboard` package (in the `test` extra); .ci/run installs both. Where
either is missing the test is skipped, except when the variable
`FERROCAFFE_REQUIRE_PROGRAMS` (.ci/run sets it) or `CI` is set: then that
is a failure, so CI really runs it.

    pytest tests/train/test_tensorboard_browser.py --basetemp /tmp/tb_e2e
    ls /tmp/tb_e2e/*/shots/        # scalars.png, graphs.png
"""

import fcntl
import importlib.util
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from _support import EXAMPLES, PKG_PARENT, REQUIRE_PROGRAMS

EXAMPLE = os.path.join(EXAMPLES, 'train_job.py')
CHROMIUM = shutil.which('chromium') or shutil.which('chromium-browser')
HAVE_TENSORBOARD = importlib.util.find_spec('tensorboard') is not None
MISSING = [what for what, ok in (('the chromium program', CHROMIUM),
                                 ('the tensorboard package', HAVE_TENSORBOARD))
           if not ok]

if MISSING and REQUIRE_PROGRAMS:
    raise RuntimeError('CI must run the TensorBoard browser check, but '
                       + ' and '.join(MISSING) + ' are missing (.ci/run installs them)')
pytestmark = pytest.mark.skipif(
    bool(MISSING), reason='needs ' + ' and '.join(MISSING)
    + ' (apt-get install chromium; pip install tensorboard)')

EPOCHS = 3
# Ops of the nets train_job.py draws (brew.fc, relu, the softmax loss, the
# fillers and the SGD update; the gradient ops are folded into a
# GRADIENTS group), named by type as the graph page shows them.
NET_OPS = ['FC', 'Relu', 'SoftmaxWithLoss', 'XavierFill', 'MomentumSGDUpdate', 'GRADIENTS']
TAGS = ['train/loss', 'test/accuracy', 'job/epoch_seconds', 'job/checkpoint_save_seconds']


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def get(url, timeout=5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode('utf-8', 'replace')


@pytest.fixture(scope='module')
def board(tmp_path_factory):
    """Trains the main job for a few epochs with --tensorboard, then serves
    its log directory with TensorBoard; yields (url, tmp dir)."""
    tmp = tmp_path_factory.mktemp('tb_e2e')
    logdir = tmp / 'logs'
    env = dict(os.environ, PYTHONPATH=PKG_PARENT, OPENBLAS_NUM_THREADS='1')
    env.pop('CI', None)         # no progress bars either way
    done = subprocess.run(
        [sys.executable, EXAMPLE, '--workdir', str(tmp / 'job'), '--epochs', str(EPOCHS),
         '--threads', '1', '--hidden', '32', '--no-progress', '--tensorboard', str(logdir)],
        env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert 'TensorBoard logs in' in done.stdout
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, '-m', 'tensorboard.main', '--logdir', str(logdir),
         '--host', '127.0.0.1', '--port', str(port), '--load_fast', 'false',
         '--reload_interval', '1'],
        stdout=subprocess.DEVNULL, stderr=open(tmp / 'tensorboard.log', 'w'))
    url = 'http://127.0.0.1:%d' % port
    try:
        # Up, and the run's scalars loaded (the first load is asynchronous).
        deadline = time.monotonic() + 120
        while True:
            try:
                if 'train/loss' in get(url + '/data/plugin/scalars/tags'):
                    break
            except OSError:
                pass
            assert server.poll() is None, (tmp / 'tensorboard.log').read_text()
            assert time.monotonic() < deadline, 'TensorBoard did not serve the scalars'
            time.sleep(0.5)
        yield url, tmp
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def chromium(url, *args, timeout=180):
    """Runs headless Chromium's command line on url (a screenshot, say)."""
    cmd = [CHROMIUM, '--headless', '--no-sandbox', '--disable-gpu',
           '--disable-dev-shm-usage', '--no-first-run', '--hide-scrollbars',
           '--window-size=1600,1000', '--virtual-time-budget=20000'] + list(args) + [url]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


# The text of the page as rendered, shadow roots included (TensorBoard's
# dashboards are Polymer elements, whose contents `--dump-dom` leaves out),
# without style sheets and scripts.
PAGE_TEXT = """(() => {
  const out = [];
  const walk = (n) => {
    if (n.shadowRoot) walk(n.shadowRoot);
    for (const c of n.childNodes) {
      if (c.nodeType === 3) out.push(c.textContent);
      else if (c.nodeName !== 'STYLE' && c.nodeName !== 'SCRIPT') walk(c);
    }
  };
  walk(document);
  return out.join(' ');
})()"""


def rendered_text(url, wanted, timeout=120):
    """The text headless Chromium renders for url, read once every wanted
    string is in it or when timeout seconds have passed. Chromium runs
    with --remote-debugging-pipe (its DevTools protocol on file
    descriptors 3 and 4: JSON messages ended by NUL), so nothing but
    Chromium itself is needed."""
    to_chrome, from_chrome = os.pipe(), os.pipe()
    # The child's fds 3 and 4, from copies numbered out of their way.
    theirs = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100)
              for fd in (to_chrome[0], from_chrome[1])]
    for fd in (to_chrome[0], from_chrome[1]):
        os.close(fd)
    argv = [CHROMIUM, '--headless', '--no-sandbox', '--disable-gpu',
            '--disable-dev-shm-usage', '--no-first-run', '--window-size=1600,3000',
            '--remote-debugging-pipe', 'about:blank']
    pid = os.posix_spawn(CHROMIUM, argv, dict(os.environ), file_actions=[
        (os.POSIX_SPAWN_DUP2, theirs[0], 3), (os.POSIX_SPAWN_DUP2, theirs[1], 4),
        (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
        (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0)])
    for fd in theirs:
        os.close(fd)
    write, read = to_chrome[1], from_chrome[0]
    state = {'id': 0, 'buf': b''}

    def call(method, session=None, **params):
        state['id'] += 1
        msg = {'id': state['id'], 'method': method, 'params': params}
        if session:
            msg['sessionId'] = session
        os.write(write, json.dumps(msg).encode() + b'\0')
        while True:
            while b'\0' in state['buf']:
                line, state['buf'] = state['buf'].split(b'\0', 1)
                reply = json.loads(line)
                if reply.get('id') == state['id']:
                    assert 'error' not in reply, (method, reply['error'])
                    return reply['result']
            ready, _, _ = select.select([read], [], [], 60)
            assert ready, 'Chromium did not answer ' + method
            chunk = os.read(read, 1 << 20)
            assert chunk, 'Chromium closed its pipe'
            state['buf'] += chunk

    try:
        target = call('Target.createTarget', url=url)['targetId']
        session = call('Target.attachToTarget', targetId=target, flatten=True)['sessionId']
        deadline = time.monotonic() + timeout
        while True:
            got = call('Runtime.evaluate', session, expression=PAGE_TEXT, returnByValue=True)
            text = got['result'].get('value', '')
            if all(w in text for w in wanted) or time.monotonic() > deadline:
                return text
            time.sleep(0.5)
    finally:
        try:
            call('Browser.close')
        except (AssertionError, OSError):
            pass
        os.close(write)
        os.close(read)
        os.waitpid(pid, 0)


def screenshot(url, path):
    chromium(url, '--screenshot=%s' % path)
    assert path.exists()
    from PIL import Image         # comes with tensorboard
    img = Image.open(path).convert('L')
    lo, hi = img.getextrema()
    colors = len(img.getcolors(maxcolors=1 << 16) or range(1 << 16))
    # Not a blank page: light background, dark text and lines, many shades.
    assert hi - lo > 100 and colors > 20, (path, lo, hi, colors)


def test_the_scalars_page_shows_the_curves(board):
    url, tmp = board
    # What TensorBoard serves: a point per epoch for the loss.
    data = json.loads(get(url + '/data/plugin/scalars/scalars?run=.&tag=train%2Floss'))
    assert [step for _, step, _ in data] == list(range(1, EPOCHS + 1))
    # What the page shows: every tag matching '.', in one open section.
    page = url + '/#scalars&tagFilter=.'
    text = rendered_text(page, TAGS)
    for tag in TAGS:
        assert tag in text, tag
    (tmp / 'shots').mkdir(exist_ok=True)
    screenshot(page, tmp / 'shots' / 'scalars.png')


def test_the_graphs_page_shows_the_net(board):
    url, tmp = board
    page = url + '/#graphs'
    text = rendered_text(page, NET_OPS)
    for op in NET_OPS:
        assert op in text, op
    (tmp / 'shots').mkdir(exist_ok=True)
    screenshot(page, tmp / 'shots' / 'graphs.png')

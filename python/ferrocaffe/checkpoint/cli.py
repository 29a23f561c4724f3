"""``python -m ferrocaffe.checkpoint {ls,verify} DIR``: inspect a
checkpoint directory from a shell. DIR may also be a job's work dir: the
one directory with checkpoints below it is inspected. ``ls`` leaves out
the job's runtime blobs (task outputs, the list of names) unless given
``--all``."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence, TextIO

from ferrocaffe import _core
from ferrocaffe.checkpoint.manifest import (
    MANIFEST_NAME, _check_db, find_checkpoints, read_manifest)
from ferrocaffe.checkpoint.state import (
    JOB_STATE_BLOB, _db_size, _detect_db_type, _state_problem, read_job_state)
from ferrocaffe.errors import CorruptCheckpointError, FerrocaffeError


def _human(n):
    for unit in ('B', 'KiB', 'MiB', 'GiB'):
        if n < 1024 or unit == 'GiB':
            return ('%d %s' % (n, unit)) if unit == 'B' else (
                '%.1f %s' % (n, unit))
        n /= 1024.0


def _inventory(directory, db_type=None):
    """``(manifest or None, [(epoch, node, path, db type, manifest record or
    None, listed)])`` of a checkpoint directory, oldest epoch first."""
    manifest = read_manifest(directory)
    rows = []
    listed = set()
    if manifest is not None:
        for entry in sorted(manifest['epochs'], key=lambda e: int(e['epoch'])):
            et = db_type or entry.get('db_type') or manifest.get('db_type')
            for node, info in sorted(entry['dbs'].items()):
                path = os.path.join(directory, info['file'])
                listed.add(os.path.abspath(path))
                rows.append((int(entry['epoch']), node, path,
                             et or _detect_db_type(path), info, True))
    for epoch, nodes in sorted(find_checkpoints(directory).items()):
        for node, path in sorted(nodes.items()):
            if os.path.abspath(path) in listed:
                continue
            rows.append((epoch, node, path, db_type or _detect_db_type(path),
                         None, manifest is None))
    rows.sort(key=lambda r: (r[0], r[1]))
    return manifest, rows


# Blobs the job machinery makes, not the model: task outputs
# (``<node>/<task>:output/...``) and the checkpoint's own list of names.
def _is_runtime_blob(name):
    return ':output/' in name or name == 'blob_names'


def _below(directory, depth=2):
    """The directories under ``directory`` (``depth`` levels down) that hold
    checkpoints, nearest first."""
    found, level = [], [directory]
    for _ in range(depth):
        nxt = []
        for d in level:
            try:
                subs = sorted(e.path for e in os.scandir(d) if e.is_dir())
            except OSError:
                continue
            for sub in subs:
                if (os.path.exists(os.path.join(sub, MANIFEST_NAME))
                        or find_checkpoints(sub)):
                    found.append(sub)
                else:
                    nxt.append(sub)
        level = nxt
    return found


def _locate(directory, out):
    """The checkpoint directory to inspect: ``directory`` itself, or the one
    directory with checkpoints below it (a job's work dir holds them in
    ``checkpoints/``); None, having said why, when there is none or no
    single one."""
    try:
        if read_manifest(directory) is not None or find_checkpoints(directory):
            return directory
    except CorruptCheckpointError:
        return directory  # a damaged manifest: the commands report it

    below = _below(directory)
    if len(below) == 1:
        print('(no checkpoints in %s itself; showing %s)' % (directory, below[0]), file=out)
        return below[0]
    if below:
        print('no checkpoints in %s itself; below it: %s' % (directory, ', '.join(below)),
              file=out)
    else:
        print('no checkpoints in %s or the directories below it' % directory, file=out)
    return None


def _table(rows, out, indent='    '):
    """Prints rows of cells in columns as wide as their widest cell."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        cells = [c.ljust(w) for c, w in zip(r[:-1], widths)] + [r[-1]]
        print(indent + '  '.join(cells).rstrip(), file=out)


def _cmd_ls(directory, db_type, out, show_all=False):
    manifest, rows = _inventory(directory, db_type)
    if not rows:
        print('no checkpoints in %s' % directory, file=out)
        return 2
    if manifest is not None:
        print('%s: manifest lists epochs %s (latest %s, max_to_keep %s)' % (
            directory,
            ', '.join(str(e) for e in sorted(
                int(x['epoch']) for x in manifest['epochs'])) or 'none',
            manifest.get('latest'), manifest.get('max_to_keep')), file=out)
    else:
        print('%s: no manifest; checkpoint files found by name' % directory,
              file=out)
    current = None
    for epoch, node, path, dtype, info, listed in rows:
        if epoch != current:
            current = epoch
            print('epoch %d%s' % (epoch, '' if listed else
                                  '  (not in the manifest)'), file=out)
        size = None
        try:
            size = _db_size(path, dtype)
            entries = _core.list_db(path, dtype)
        except Exception as e:
            print('  %s  %s  %s  %s  UNREADABLE: %s' % (
                node, os.path.basename(path), dtype,
                _human(size) if size is not None else
                'missing' if not os.path.lexists(path) else '-', e), file=out)
            continue
        entries = [x for x in entries if x['name'] != JOB_STATE_BLOB]
        print('  %s  %s  %s  %s  %d blobs' % (
            node, os.path.basename(path), dtype, _human(size), len(entries)),
            file=out)
        print('    %s' % _describe_state(path, dtype), file=out)
        hidden = [x for x in entries if _is_runtime_blob(x['name'])]
        if not show_all:
            entries = [x for x in entries if not _is_runtime_blob(x['name'])]
        table = []
        for entry in entries:
            kind = entry['kind'].lower()
            what = entry['dtype'] if entry['dtype'] else entry['type']
            shape = ('[%s]' % ', '.join(str(d) for d in entry['shape'])
                     if kind == 'tensor' else '')
            table.append((entry['name'], kind, what, shape, _human(entry['bytes'])))
        if table:
            _table(table, out)
        if hidden and not show_all:
            print('    (%d runtime blobs not shown: task outputs and the list of '
                  'names; --all shows them)' % len(hidden), file=out)
    return 0


def _describe_state(path, db_type):
    """One line about the job state stored in a db, for ``ls``."""
    try:
        state = read_job_state(path, db_type)
    except FerrocaffeError as e:
        return 'job state: UNREADABLE: %s' % e
    if state is None:
        return 'job state: none (written by Caffe2 or an older ferrocaffe)'
    text = 'job state: epoch %d, run %d, %s' % (
        state['epoch'], state['generation'],
        'stopped' if state['stopped'] else 'running')
    if state['num_epochs'] is not None:
        text += ', epoch limit %d' % state['num_epochs']
    return text


def _cmd_verify(directory, db_type, out):
    try:
        manifest, rows = _inventory(directory, db_type)
    except CorruptCheckpointError as e:
        print('DAMAGED  %s' % e, file=out)
        return 1
    if not rows:
        print('no checkpoints in %s' % directory, file=out)
        return 2
    damaged = 0
    for epoch, node, path, dtype, info, listed in rows:
        problem = _check_db(path, dtype, info)
        if problem is None:
            try:
                problem = _state_problem(read_job_state(path, dtype), path,
                                         epoch, node)
            except FerrocaffeError as e:
                problem = str(e)
        label = 'epoch %d node %s (%s)' % (epoch, node, os.path.basename(path))
        if problem is None:
            print('ok       %s' % label, file=out)
        else:
            damaged += 1
            print('DAMAGED  %s: %s' % (label, problem), file=out)
    if damaged:
        print('%d of %d checkpoint files are damaged' % (damaged, len(rows)),
              file=out)
        return 1
    print('all %d checkpoint files verify' % len(rows), file=out)
    return 0


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """``python -m ferrocaffe.checkpoint {ls,verify} DIR``."""
    out = out or sys.stdout
    parser = argparse.ArgumentParser(
        prog='python -m ferrocaffe.checkpoint',
        description='Inspect a checkpoint directory.')
    sub = parser.add_subparsers(dest='command', required=True)
    for name, text in (
            ('ls', 'list epochs, nodes, blobs and sizes'),
            ('verify', 'check every checkpoint; exit status 1 on damage')):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument('directory')
        p.add_argument('--db-type', choices=_core.registered_dbs(), default=None,
                       help='the db format (default: from the manifest or '
                            'the files)')
        if name == 'ls':
            p.add_argument('--all', action='store_true',
                           help="also list the job's runtime blobs (task outputs, "
                                'the list of names)')
    args = parser.parse_args(argv)
    if not os.path.isdir(args.directory):
        print('%s is not a directory' % args.directory, file=sys.stderr)
        return 2
    directory = _locate(args.directory, out)
    if directory is None:
        return 2
    try:
        if args.command == 'ls':
            return _cmd_ls(directory, args.db_type, out, args.all)
        return _cmd_verify(directory, args.db_type, out)
    except CorruptCheckpointError as e:
        print('error: %s' % e, file=sys.stderr)
        return 1


# What a shell reports for a command killed by SIGPIPE (128 + 13).
EXIT_BROKEN_PIPE = 141


def run(argv: Sequence[str] | None = None) -> int:
    """:func:`main` as a command: a reader that stops early
    (``python -m ferrocaffe.checkpoint ls DIR | head``) ends it quietly,
    with the status a Unix tool killed by SIGPIPE has, instead of a
    ``BrokenPipeError`` traceback.  Python ignores SIGPIPE, so the closed
    pipe shows up as that error on a write or on the final flush."""
    try:
        status = main(argv)
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        # The interpreter flushes stdout again on exit: point it at
        # /dev/null so that flush has nowhere to fail.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE

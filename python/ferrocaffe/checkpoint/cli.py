"""``python -m ferrocaffe.checkpoint {ls,verify} DIR``: inspect a
checkpoint directory from a shell."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence, TextIO

from ferrocaffe import _core
from ferrocaffe.checkpoint.manifest import (
    _check_db, find_checkpoints, read_manifest)
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


def _cmd_ls(directory, db_type, out):
    manifest, rows = _inventory(directory, db_type)
    if not rows:
        print('no checkpoints in %s' % directory, file=out)
        return 0
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
        size = _db_size(path) if os.path.exists(path) else None
        try:
            entries = _core.list_db(path, dtype)
        except Exception as e:
            print('  %s  %s  %s  %s  UNREADABLE: %s' % (
                node, os.path.basename(path), dtype,
                'missing' if size is None else _human(size), e), file=out)
            continue
        entries = [x for x in entries if x['name'] != JOB_STATE_BLOB]
        print('  %s  %s  %s  %s  %d blobs' % (
            node, os.path.basename(path), dtype, _human(size), len(entries)),
            file=out)
        print('    %s' % _describe_state(path, dtype), file=out)
        for entry in entries:
            kind = entry['kind'].lower()
            what = entry['dtype'] if entry['dtype'] else entry['type']
            shape = ('[%s]' % ', '.join(str(d) for d in entry['shape'])
                     if kind == 'tensor' else '')
            print('    %-40s %-7s %-10s %-14s %s' % (
                entry['name'], kind, what, shape, _human(entry['bytes'])),
                file=out)
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
    args = parser.parse_args(argv)
    if not os.path.isdir(args.directory):
        print('%s is not a directory' % args.directory, file=sys.stderr)
        return 2
    try:
        if args.command == 'ls':
            return _cmd_ls(args.directory, args.db_type, out)
        return _cmd_verify(args.directory, args.db_type, out)
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

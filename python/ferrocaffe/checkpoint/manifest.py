"""Metadata handlers: what is known of the saved epochs.  The dbs alone
say where a job is; :class:`FileMetadataHandler` adds ``manifest.json``
(a cache of them, rebuilt when lost), verification and retention.
:func:`latest_valid_epoch` and :func:`find_checkpoints` read a directory
without a handler."""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import time
from typing import Any, Mapping, Sequence

from ferrocaffe import _core
from ferrocaffe.checkpoint.state import (
    DEFAULT_DB_TYPE, LATEST, _check_job_state, _db_present, _db_size,
    _is_count, _state_problem, db_name, logger, read_job_state)
from ferrocaffe.errors import (
    CorruptCheckpointError, FerrocaffeError, FerrocaffeIOError)


class MetadataHandler(object):
    """
    The protocol of checkpoint metadata handlers (any object with these
    methods will do).  A manager calls ``set_params`` first, then
    ``last_epoch`` to learn where to resume, ``cp_accessible`` before each
    save, ``write`` after each successful save and ``report`` with the
    duration of each save or load.
    """

    def set_params(
        self,
        db_prefix: str,
        db_type: str,
        node_names: Sequence[str],
        path_prefix: str | None = None,
        path_type: str | None = None,
    ) -> None:
        pass

    def last_epoch(self, user_epoch: int | str | None = None) -> int | str | None:
        """The epoch to resume from, given the user's choice (None, an
        epoch, or ``'latest'``)."""
        return user_epoch

    def cp_accessible(self, epoch: int | None = None) -> bool:
        return True

    def write(self, epoch: int) -> None:
        pass

    def report(self, action_name: str, stats: Mapping[str, Any]) -> None:
        pass


MANIFEST_NAME = 'manifest.json'
MANIFEST_FORMAT = 'ferrocaffe-checkpoints'
# A manifest larger than this is not one of ours.
_MANIFEST_MAX_BYTES = 64 << 20


def _checksum(path, db_type):
    """The CRC-32 the manifest records for a db of a format without
    checksums of its own (minidb), else None (the core's ``db_info``)."""
    return _core.db_info(path, db_type, checksum=True)['checksum']


def _plain_name(name):
    """Whether ``name`` names a file directly inside a directory (no
    separator, not absolute, not ``.`` or ``..``)."""
    return (isinstance(name, str) and name not in ('', '.', '..') and
            '/' not in name and '\\' not in name and '\0' not in name and
            not os.path.isabs(name))


def _file_kind(mode):
    """What a non-regular file is, for messages."""
    if stat.S_ISFIFO(mode):
        return 'a FIFO'
    if stat.S_ISDIR(mode):
        return 'a directory'
    if stat.S_ISSOCK(mode):
        return 'a socket'
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return 'a device'
    return 'not a file'


def _read_regular_file(path, limit):
    """The bytes of the regular file at ``path``.  Opened without blocking,
    so that a FIFO there does not hang the caller; anything but a regular
    file, or a file over ``limit`` bytes, raises OSError."""
    fd = os.open(path, os.O_RDONLY | getattr(os, 'O_NONBLOCK', 0))
    with os.fdopen(fd, 'rb') as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, 'not a regular file (%s)' % _file_kind(st.st_mode), path)
        if st.st_size > limit:
            raise OSError(errno.EFBIG, 'larger than %d bytes' % limit, path)
        return f.read(limit + 1)


def _check_manifest(manifest, path):
    """Checks a parsed manifest's structure and field types (ValueError or
    TypeError when one is wrong).  A db record whose ``file`` is not a plain
    name inside the directory is dropped with a warning: the manifest must
    never make ferrocaffe read or delete a file elsewhere."""
    if not isinstance(manifest, dict) or (
            manifest.get('format') != MANIFEST_FORMAT):
        raise ValueError('not a %s manifest' % MANIFEST_FORMAT)
    if not isinstance(manifest.get('epochs'), list):
        raise TypeError("'epochs' is not a list")
    seen = set()
    for entry in manifest['epochs']:
        if not isinstance(entry, dict) or not _is_count(entry.get('epoch')):
            raise TypeError('bad epoch record %.80r' % (entry,))
        epoch = entry['epoch']
        if epoch in seen:
            raise ValueError('epoch %d is listed twice' % epoch)
        seen.add(epoch)
        if entry.get('db_type', 'ferro') not in _core.registered_dbs():
            raise ValueError('epoch %d: bad db_type' % epoch)
        dbs = entry.get('dbs')
        if not isinstance(dbs, dict):
            raise TypeError("epoch %d: 'dbs' is not an object" % epoch)
        for node, info in list(dbs.items()):
            if not isinstance(info, dict):
                raise TypeError('epoch %d: bad record of node %.80r' % (
                    epoch, node))
            if not _plain_name(info.get('file')):
                logger.warning(
                    'checkpoint manifest %s: ignoring the db %.200r of node '
                    '%.80r, epoch %d: not a file name inside the checkpoint '
                    'directory', path, info.get('file'), node, epoch)
                del dbs[node]
                continue
            if 'bytes' in info and not _is_count(info['bytes']):
                raise TypeError('epoch %d: bad size' % epoch)
            crc = info.get('crc32')
            if crc is not None and not (_is_count(crc) and crc < 1 << 32):
                raise TypeError('epoch %d: bad crc32' % epoch)
            if 'state' in info:
                _check_job_state(info['state'])


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The manifest of a checkpoint directory as a dict; None when there is
    none.  A manifest that cannot be used (unreadable, not JSON, not a
    manifest, a field of the wrong type or range) raises
    CorruptCheckpointError; the handlers then fall back to the dbs, which
    hold everything the manifest caches."""
    path = os.path.join(directory, MANIFEST_NAME)
    try:
        raw = _read_regular_file(path, _MANIFEST_MAX_BYTES)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CorruptCheckpointError(
            'checkpoint manifest %s cannot be read: %s' % (
                path, e.strerror or e), file=path) from None
    try:
        manifest = json.loads(raw.decode('utf-8'))
        _check_manifest(manifest, path)
    except (ValueError, KeyError, TypeError, AttributeError,
            RecursionError, OverflowError) as e:
        raise CorruptCheckpointError(
            'checkpoint manifest %s is damaged: %s' % (path, e),
            file=path) from None
    return manifest


class _Db(object):
    """One node's checkpoint file of one epoch, as found in a directory:
    its path, its manifest record (None if unlisted), and its stored job
    state (``problem`` says why it could not be read)."""

    def __init__(self, path, info):
        self.path = path
        self.info = info
        self.state = None
        self.problem = None

    def read_state(self, db_type):
        try:
            self.state = read_job_state(self.path, db_type)
            self.problem = None
        except FerrocaffeError as e:
            self.state, self.problem = None, str(e)


def _scan(directory, node_names, db_type, manifest=None):
    """``{epoch: {node: _Db}}``: the checkpoint files of ``node_names`` in
    ``directory``, with their job states: taken from the manifest's record
    while the file still has the recorded size (a cache; the epoch chosen
    is checked against the file itself), else read from the file."""
    listed = {}
    for entry in (manifest or {}).get('epochs', []):
        for node, info in entry['dbs'].items():
            listed[info['file']] = info
    found = {}
    wanted = set(node_names)
    for epoch, nodes in find_checkpoints(directory).items():
        for node, path in nodes.items():
            if node not in wanted:
                continue
            db = _Db(path, listed.get(os.path.basename(path)))
            cached = db.info is not None and 'state' in db.info
            if cached:
                try:
                    cached = _db_size(path) == db.info.get('bytes')
                except OSError:
                    cached = False
            if cached:
                db.state = db.info['state']
            else:
                db.read_state(db_type)
            found.setdefault(epoch, {})[node] = db
    return found


def _generation(dbs, unknown=0):
    """The run (generation) an epoch's dbs belong to: 0 for dbs without a
    job state, ``unknown`` when none could be read."""
    generations = [db.state['generation'] for db in dbs.values()
                   if db.state is not None]
    if generations:
        return max(generations)
    if any(db.problem is not None for db in dbs.values()):
        return unknown
    return 0


def _epoch_problem(directory, epoch, dbs, node_names, db_type, verify):
    """None if every node's checkpoint of ``epoch`` is there, sound, and
    holds that epoch's job state (read from the file itself), all of the
    same run; else what is wrong."""
    missing = [n for n in node_names if n not in dbs]
    if missing:
        return 'no checkpoint of node(s) %s' % ', '.join(missing)
    generations = set()
    for node in node_names:
        db = dbs[node]
        problem = _check_db(db.path, db_type, db.info, verify)
        if problem is not None:
            return problem
        try:
            state = read_job_state(db.path, db_type)
        except FerrocaffeError as e:
            return str(e)
        problem = _state_problem(state, db.path, epoch, node)
        if problem is not None:
            return problem
        generations.add(state['generation'] if state else 0)
    if len(generations) > 1:
        return 'the nodes\' checkpoints were written by different runs'
    return None


def _latest(directory, node_names, db_type, manifest=None, verify=True,
            warn=True):
    """The newest epoch, of the newest run, whose checkpoints of every node
    are sound (see ``_epoch_problem``); None if there is none."""
    node_names = [str(n) for n in node_names]
    if not node_names:
        return None
    found = _scan(directory, node_names, db_type, manifest)
    # Unreadable dbs are tried (and reported) in their place in the newest
    # run: by their file names, that is where they belong.
    newest = max([_generation(dbs) for dbs in found.values()] or [0])
    order = sorted(((_generation(dbs, newest), epoch)
                    for epoch, dbs in found.items()), reverse=True)
    for _, epoch in order:
        problem = _epoch_problem(directory, epoch, found[epoch], node_names,
                                 db_type, verify)
        if problem is None:
            return epoch
        if warn:
            logger.warning('checkpoint of epoch %d cannot be used (%s); '
                           'trying an earlier epoch', epoch, problem)
    if order and warn:
        logger.warning('no usable checkpoint in %s: starting from scratch',
                       directory)
    return None


class FileMetadataHandler(MetadataHandler):
    """
    Keeps ``manifest.json`` in the checkpoint directory: the saved epochs,
    each with its dbs (file, size, job state, and a CRC-32 for formats
    without checksums of their own), rewritten atomically after each save.

    The manifest is a cache: each db holds its job state, written with its
    blobs in one atomic save, so a manifest that is missing or damaged is
    rebuilt from the dbs, and a db saved just before a kill that prevented
    the manifest write still counts.

    * ``last_epoch('latest')``: the newest epoch, of the newest run, whose
      dbs (every node's) verify, have the size and CRC the manifest records
      for them, and hold that epoch's job state; a damaged one is skipped
      with a warning.  ``None`` (start from scratch) and an epoch number are
      returned as they are.
    * ``write(epoch)`` records ``epoch`` and forgets the later epochs (left
      by an earlier run that went further) and those of older runs (a run
      from scratch replaces them): their dbs are deleted.
    * ``max_to_keep``: only the newest ``max_to_keep`` epochs are kept; the
      dbs of older ones are deleted once the manifest no longer lists them.
      The epoch just saved is always kept, an epoch counts only when every
      node's db of it is there and readable, and a write that had to
      rebuild the manifest deletes nothing (the next one does).  Only dbs
      the manifest listed, or that hold a job state of one of this job's
      nodes, are ever deleted.
    * ``cp_accessible()`` creates the directory if needed and tells whether
      it can be written; when it cannot, ``access_error`` is the OSError
      saying why (with the path).

    One job per directory: two jobs writing one manifest lose each other's
    entries.
    """

    def __init__(self, max_to_keep: int | None = None, verify: bool = True) -> None:
        if max_to_keep is not None and int(max_to_keep) < 1:
            raise ValueError('max_to_keep must be None or >= 1, got %r' %
                             (max_to_keep,))
        self.max_to_keep = None if max_to_keep is None else int(max_to_keep)
        self.verify = verify
        self.db_prefix: str | None = None
        self.db_type = DEFAULT_DB_TYPE
        self.node_names: list[str] = []
        self.path_prefix: str | None = None
        self.path_type: str | None = None
        self.stats: dict[str, Any] = {}
        self.access_error: OSError | None = None

    def set_params(
        self,
        db_prefix: str,
        db_type: str,
        node_names: Sequence[str],
        path_prefix: str | None = None,
        path_type: str | None = None,
    ) -> None:
        self.db_prefix = db_prefix
        self.db_type = db_type
        self.node_names = [str(n) for n in node_names]
        self.path_prefix = path_prefix
        self.path_type = path_type

    def _require_params(self) -> str:
        """The db prefix, once set_params has given it."""
        if self.db_prefix is None:
            raise RuntimeError('FileMetadataHandler.set_params was not called')
        return self.db_prefix

    def manifest_path(self) -> str:
        self._require_params()
        return os.path.join(self._require_params(), MANIFEST_NAME)

    def _read_manifest(self, what):
        """The manifest, or None (with a warning saying ``what`` happens
        instead) when it is damaged."""
        try:
            return read_manifest(self._require_params())
        except CorruptCheckpointError as e:
            logger.warning('%s; %s', e, what)
            return None

    def manifest(self) -> dict[str, Any]:
        """The current manifest (a new, empty one if there is none, or if
        it is damaged: it is then rebuilt by the next save)."""
        self._require_params()
        manifest = self._read_manifest('starting a new one')
        if manifest is None:
            manifest = {'format': MANIFEST_FORMAT, 'version': 1, 'epochs': []}
        return manifest

    def epochs(self) -> list[int]:
        """The epochs the manifest lists, oldest first."""
        return sorted(e['epoch'] for e in self.manifest()['epochs'])

    def cp_accessible(self, epoch: int | None = None) -> bool:
        self._require_params()
        if epoch is not None:
            return all(_db_present(db_name(epoch, n, self._require_params()))
                       for n in self.node_names)
        self.access_error = None
        try:
            os.makedirs(self._require_params(), exist_ok=True)
        except OSError as e:
            if e.filename is None:
                e.filename = self._require_params()
            self.access_error = e
        else:
            if not os.access(self._require_params(), os.W_OK | os.X_OK):
                self.access_error = OSError(
                    errno.EACCES, 'cannot create files in it',
                    self._require_params())
        if self.access_error is not None:
            logger.warning('cannot use the checkpoint directory %s: %s',
                           self.access_error.filename,
                           self.access_error.strerror or self.access_error)
            return False
        return True

    def _record(self, db, new):
        """The manifest record of a db (``new``: just saved, so nothing
        cached about it holds)."""
        info = None if new else db.info
        size = _db_size(db.path)
        if info is not None and info.get('bytes') == size:
            info = dict(info)
        else:
            info = {'file': os.path.basename(db.path), 'bytes': size}
            # A format without checksums of its own (minidb) gets a CRC-32
            # here; ferro and LevelDB have theirs, which verify_db checks.
            crc = _checksum(db.path, self.db_type)
            if crc is not None:
                info['crc32'] = crc
        if db.state is not None:
            info['state'] = db.state
        else:
            info.pop('state', None)
        return info

    def write(self, epoch: int) -> None:
        """Records the (already saved) checkpoints of ``epoch``, reading
        their job states from the dbs, and applies the retention rules (see
        the class)."""
        self._require_params()
        epoch = int(epoch)
        old = self._read_manifest('rebuilding it from the checkpoint files')
        rebuilding = old is None
        found = _scan(self._require_params(), self.node_names, self.db_type, old)
        saved = found.get(epoch, {})
        generations = set()
        for node in self.node_names:
            db = saved.get(node)
            if db is None:
                path = db_name(epoch, node, self._require_params())
                raise FerrocaffeIOError(
                    'the checkpoint %s just saved is not there' % path,
                    file=path)
            db.read_state(self.db_type)  # never the cached one
            problem = db.problem or _state_problem(
                db.state, db.path, epoch, node)
            if problem is not None:
                raise CorruptCheckpointError(problem, file=db.path)
            generations.add(db.state['generation'] if db.state else 0)
        generation = max(generations)

        def counts(ep, dbs):
            return (ep < epoch and _generation(dbs) == generation and
                    all(n in dbs and dbs[n].problem is None
                        for n in self.node_names))

        kept = sorted(ep for ep, dbs in found.items() if counts(ep, dbs))
        kept.append(epoch)
        if self.max_to_keep is not None:
            kept = kept[-self.max_to_keep:]
        written = {e['epoch']: e.get('written_at')
                   for e in (old or {}).get('epochs', [])}
        written[epoch] = time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())
        entries = []
        for ep in kept:
            dbs = {n: self._record(found[ep][n], ep == epoch)
                   for n in self.node_names}
            entry = {'epoch': ep, 'db_type': self.db_type, 'dbs': dbs}
            if written.get(ep) is not None:
                entry['written_at'] = written[ep]
            states = [d.get('state') for d in dbs.values()]
            if all(states):
                entry['finished'] = any(s['stopped'] for s in states)
            entries.append(entry)
        manifest = {
            'format': MANIFEST_FORMAT,
            'version': 1,
            'db_type': self.db_type,
            'nodes': self.node_names,
            'max_to_keep': self.max_to_keep,
            'latest': epoch,
            'epochs': entries,
        }
        data = json.dumps(manifest, indent=1, sort_keys=True).encode('utf-8')
        _core.write_file_atomically(self.manifest_path(), data + b'\n')
        if rebuilding:
            # The dbs were just listed from the files: deleting any on that
            # basis could lose a good one; the next write does it.
            return
        listed: set[str] = set()
        for entry in old['epochs']:
            listed.update(info['file'] for info in entry['dbs'].values())
        keep = set(kept)
        for ep, dbs in found.items():
            if ep in keep:
                continue
            for node, db in dbs.items():
                ours = os.path.basename(db.path) in listed or (
                    db.state is not None and db.state['node'] == node)
                if ours:
                    self._remove(db.path)

    def is_finished(self, epoch: int) -> bool:
        """Whether the manifest records that the job stopped after
        ``epoch`` (the job state in the db says so too; this is for dbs
        written before job states existed)."""
        try:
            manifest = (read_manifest(self.db_prefix) if self.db_prefix
                        else None)
        except CorruptCheckpointError:
            return False
        for entry in (manifest or {}).get('epochs', []):
            if entry['epoch'] == int(epoch):
                return entry.get('finished') is True
        return False

    @staticmethod
    def _remove(path):
        try:
            found = _core.detect_db_type(path)
            if found is not None:
                _core.remove_db(path, found)
        except OSError as e:
            logger.warning('cannot remove old checkpoint %s: %s', path,
                           e.strerror or e)

    def last_epoch(self, user_epoch: int | str | None = None) -> int | str | None:
        if user_epoch != LATEST:
            return user_epoch
        self._require_params()
        manifest = self._read_manifest('looking at the checkpoint files '
                                       'instead')
        return _latest(self._require_params(), self.node_names, self.db_type,
                       manifest, self.verify)

    def report(self, action_name: str, stats: Mapping[str, Any]) -> None:
        self.stats[action_name] = dict(stats)
        logger.debug('%s: %s', action_name, stats)


def _check_db(path, db_type, info=None, verify=True):
    """None if the db at ``path`` is sound, else a description of the
    problem.  ``info`` is its manifest record (size, CRC)."""
    try:
        size = _db_size(path)
    except OSError as e:
        return '%s: %s' % (path, e.strerror or e)
    if info is not None and 'bytes' in info and size != info['bytes']:
        return '%s has %d bytes, the manifest says %d' % (
            path, size, info['bytes'])
    if not verify:
        return None
    try:
        _core.verify_db(path, db_type)
    except FerrocaffeError as e:
        return str(e)
    if info is not None and info.get('crc32') is not None:
        if _checksum(path, db_type) != info['crc32']:
            return ('%s: CRC-32 differs from the one recorded in the '
                    'manifest' % path)
    return None


_CKPT_FILE = re.compile(r'^(?P<node>[^.].*)\.(?P<epoch>[0-9]+)$')


def find_checkpoints(directory: str | os.PathLike[str]) -> dict[int, dict[str, str]]:
    """``{epoch: {node: path}}`` of the regular files (and LevelDB
    directories) in ``directory`` named like checkpoints
    (``<node>.<epoch>``), whatever their content."""
    found: dict[int, dict[str, str]] = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return found
    for name in names:
        m = _CKPT_FILE.match(name)
        path = os.path.join(directory, name)
        if m and _db_present(path):
            found.setdefault(int(m.group('epoch')), {})[m.group('node')] = path
    return found


def latest_valid_epoch(
    directory: str | os.PathLike[str],
    node_names: Sequence[str],
    db_type: str = DEFAULT_DB_TYPE,
    verify: bool = True,
) -> int | None:
    """The newest epoch, of the newest run, for which every node in
    ``node_names`` has a checkpoint in ``directory`` that verifies and holds
    that epoch's job state; None if there is none.  Damaged checkpoints are
    skipped with a warning."""
    return _latest(directory, node_names, db_type, None, verify)

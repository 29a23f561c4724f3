"""Thread-local context stacks (Caffe2's ``caffe2.python.context``).

Two APIs are offered, as in Caffe2:

* the current one: subclass :class:`Managed` (or :class:`DefaultManaged`) and
  use instances as context managers.  ``Cls.current()`` returns the innermost
  active instance of ``Cls`` in the calling thread;
* the older one: decorate a plain class with :class:`define_context` and look
  the active object up with :func:`get_active_context` (or ``Cls.current()``).

Every context-managed class owns one stack per thread.  A new thread starts
with empty stacks.
"""

import functools
import inspect
import threading

__all__ = [
    'Managed',
    'DefaultManaged',
    'define_context',
    'get_active_context',
]


class _ContextInfo(object):
    """Per-class bookkeeping: the thread-local stack and the default policy."""

    def __init__(self, cls, allow_default, arg_name=None):
        self.cls = cls
        self.allow_default = allow_default
        self.arg_name = arg_name
        self._local = threading.local()

    @property
    def _stack(self):
        stack = getattr(self._local, 'obj', None)
        if stack is None:
            stack = []
            self._local.obj = stack
        return stack

    def enter(self, value):
        self._stack.append(value)

    def exit(self, value):
        stack = self._stack
        assert len(stack) > 0, 'Context %s is empty.' % self.cls
        top = stack.pop()
        assert top is value or top == value

    def get_active(self, required=True):
        stack = self._stack
        if not stack:
            if not required:
                return None
            assert self.allow_default, (
                'Context %s is required but none is active.' % self.cls)
            # The default object stays on this thread's stack for good.
            self.enter(self.cls())
            stack = self._stack
        return stack[-1]


class _ContextRegistry(object):
    """Maps each context class to its :class:`_ContextInfo`."""

    def __init__(self):
        self._ctxs = {}
        self._lock = threading.Lock()

    def register(self, ctx_info):
        assert isinstance(ctx_info, _ContextInfo)
        with self._lock:
            assert ctx_info.cls not in self._ctxs, (
                'Context %s already registered' % ctx_info.cls)
            self._ctxs[ctx_info.cls] = ctx_info

    def get(self, cls):
        info = self._ctxs.get(cls)
        if info is not None:
            return info
        # Classes decorated with the old API share their root's stack.
        root = getattr(cls, '_ctx_class', None)
        if root is not None and root in self._ctxs:
            return self._ctxs[root]
        assert isinstance(cls, type) and issubclass(cls, Managed), (
            'must be a context managed class, got {}'.format(cls))
        with self._lock:
            info = self._ctxs.get(cls)
            if info is None:
                info = _ContextInfo(
                    cls, allow_default=issubclass(cls, DefaultManaged))
                self._ctxs[cls] = info
        return info


_CONTEXT_REGISTRY = _ContextRegistry()


def _context_registry():
    return _CONTEXT_REGISTRY


def _get_managed_classes(obj):
    """Every Managed class in ``obj``'s MRO, except the two marker bases."""
    return [
        cls for cls in inspect.getmro(type(obj))
        if issubclass(cls, Managed)
        and cls is not Managed and cls is not DefaultManaged
    ]


class Managed(object):
    """Base class making its subclasses context-managed types.

        class Foo(Managed): ...

        with Foo() as f:
            assert Foo.current() is f

    Entering an object pushes it on the stack of every Managed class of its
    MRO, so a subclass instance is also the current object of its bases.
    """

    @classmethod
    def current(cls, value=None, required=True):
        info = _context_registry().get(cls)
        if value is not None:
            assert isinstance(value, cls), (
                'Wrong context type. Expected: %s, got %s.' % (cls, type(value)))
            return value
        return info.get_active(required=required)

    def __enter__(self):
        registry = _context_registry()
        for cls in _get_managed_classes(self):
            registry.get(cls).enter(self)
        return self

    def __exit__(self, *args):
        registry = _context_registry()
        for cls in _get_managed_classes(self):
            registry.get(cls).exit(self)

    def __call__(self, func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with self:
                return func(*args, **kwargs)
        return wrapper


class DefaultManaged(Managed):
    """Like :class:`Managed`, but ``current()`` creates (and keeps active) a
    default instance when none is active."""


# ---------------------------------------------------------------------------
# Old API: the ``define_context`` class decorator.
# ---------------------------------------------------------------------------

def _legacy_enter(self):
    if self._prev_enter is not None:
        self._prev_enter()
    _context_registry().get(self._ctx_class).enter(self)
    return self


def _legacy_exit(self, *args):
    _context_registry().get(self._ctx_class).exit(self)
    if self._prev_exit is not None:
        self._prev_exit(*args)


def _legacy_call(self, func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        with self:
            return func(*args, **kwargs)
    return wrapper


@classmethod
def _legacy_current(cls, value=None, required=True):
    return get_active_context(cls, value, required)


class define_context(object):
    """Class decorator turning a plain class into a context type (old API).

    Args:
        arg_name: kept for compatibility; unused.
        allow_default: when True, ``current()`` creates a default instance if
            none is active.

    Any ``__enter__``/``__exit__`` the class already defines still runs.  Only
    one class of a hierarchy may be decorated; its subclasses share its stack.
    """

    def __init__(self, arg_name=None, allow_default=False):
        self.arg_name = arg_name
        self.allow_default = allow_default

    def __call__(self, cls):
        assert not hasattr(cls, '_ctx_class'), (
            '%s parent class (%s) already defines context.' % (
                cls, cls._ctx_class))
        cls._ctx_class = cls
        _context_registry().register(
            _ContextInfo(cls, self.allow_default, self.arg_name))
        cls._prev_enter = cls.__enter__ if hasattr(cls, '__enter__') else None
        cls._prev_exit = cls.__exit__ if hasattr(cls, '__exit__') else None
        cls.__enter__ = _legacy_enter
        cls.__exit__ = _legacy_exit
        cls.__call__ = _legacy_call
        cls.current = _legacy_current
        return cls


def get_active_context(cls, val=None, required=True):
    """Returns ``val`` (after a type check) or the active ``cls`` object."""
    info = _context_registry().get(cls)
    if val is not None:
        assert isinstance(val, cls), (
            'Wrong context type. Expected: %s, got %s.' % (cls, type(val)))
        return val
    return info.get_active(required=required)

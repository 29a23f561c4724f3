"""Tests of ferrocaffe.context: Managed / DefaultManaged and the old
define_context API."""

import threading

import pytest

from _support import run_in_thread
from ferrocaffe import context


class Plain(context.Managed):
    pass


class Derived(Plain):
    pass


class WithDefault(context.DefaultManaged):
    instances = 0

    def __init__(self):
        WithDefault.instances += 1


class FreshDefault(context.DefaultManaged):
    pass




# --------------------------------------------------------------- Managed --

def test_current_inside_and_nested():
    assert Plain.current(required=False) is None
    with Plain() as a:
        assert Plain.current() is a
        with Plain() as b:
            assert Plain.current() is b
        assert Plain.current() is a
    assert Plain.current(required=False) is None


def test_enter_returns_self():
    p = Plain()
    with p as q:
        assert q is p


def test_required_but_none_active_message():
    with pytest.raises(AssertionError) as e:
        Plain.current()
    assert str(e.value) == (
        'Context %s is required but none is active.' % Plain)


def test_current_with_value_type_check():
    p = Plain()
    assert Plain.current(p) is p
    # a subclass instance is a valid value
    d = Derived()
    assert Plain.current(d) is d
    with pytest.raises(AssertionError) as e:
        Derived.current(p)
    assert str(e.value) == (
        'Wrong context type. Expected: %s, got %s.' % (Derived, Plain))


def test_value_wins_over_active_context():
    with Plain():
        other = Plain()
        assert Plain.current(other) is other


def test_mro_wide_push():
    with Derived() as d:
        assert Derived.current() is d
        assert Plain.current() is d
        with Plain() as p:
            # a base instance is not pushed on the subclass stack
            assert Plain.current() is p
            assert Derived.current() is d
        assert Plain.current() is d
    assert Plain.current(required=False) is None
    assert Derived.current(required=False) is None


def test_marker_classes_have_no_stack_entry():
    # Entering a Managed subclass must not push onto Managed's own stack.
    with Derived():
        assert context.Managed.current(required=False) is None


def test_exit_on_empty_stack_message():
    p = Plain()
    with pytest.raises(AssertionError) as e:
        p.__exit__(None, None, None)
    assert str(e.value) == 'Context %s is empty.' % Plain


def test_exit_of_wrong_object_asserts():
    a, b = Plain(), Plain()
    a.__enter__()
    b.__enter__()
    with pytest.raises(AssertionError):
        a.__exit__(None, None, None)  # b is on top: popped, then mismatch
    # b was popped by the failed exit; a is still active
    assert Plain.current() is a
    a.__exit__(None, None, None)
    assert Plain.current(required=False) is None


def test_decorator_form():
    ctx = Plain()
    seen = []

    @ctx
    def fn(x, y=1):
        seen.append(Plain.current())
        return x + y

    assert fn(2, y=3) == 5
    assert seen == [ctx]
    assert Plain.current(required=False) is None
    assert fn.__name__ == 'fn'


def test_decorator_pops_on_exception():
    ctx = Plain()

    @ctx
    def boom():
        raise ValueError('x')

    with pytest.raises(ValueError):
        boom()
    assert Plain.current(required=False) is None


def test_exception_inside_with_still_pops():
    with pytest.raises(KeyError):
        with Plain():
            raise KeyError('k')
    assert Plain.current(required=False) is None


# --------------------------------------------------------- DefaultManaged --

def test_default_is_created_and_kept():
    def body():
        before = WithDefault.instances
        first = WithDefault.current()
        assert isinstance(first, WithDefault)
        assert WithDefault.instances == before + 1
        # permanently pushed: the same object comes back
        assert WithDefault.current() is first
        with WithDefault() as explicit:
            assert WithDefault.current() is explicit
        assert WithDefault.current() is first
        assert WithDefault.instances == before + 2
        return True

    assert run_in_thread(body)


def test_default_not_created_when_not_required():
    def body():
        assert FreshDefault.current(required=False) is None
        d = FreshDefault.current()
        assert FreshDefault.current(required=False) is d
        return True

    assert run_in_thread(body)


def test_default_is_per_thread():
    main_default = run_in_thread(lambda: FreshDefault.current())
    other_default = run_in_thread(lambda: FreshDefault.current())
    assert main_default is not other_default


# ---------------------------------------------------------------- threads --

def test_new_thread_starts_with_empty_stacks():
    with Plain():
        assert run_in_thread(lambda: Plain.current(required=False)) is None


def test_stacks_are_thread_local_under_contention():
    errors = []
    barrier = threading.Barrier(8)

    def worker():
        try:
            barrier.wait()
            for _ in range(100):
                with Plain() as a:
                    for _ in range(20):
                        assert Plain.current() is a
                    with Derived() as d:
                        assert Plain.current() is d
                        assert Derived.current() is d
                    assert Plain.current() is a
            assert Plain.current(required=False) is None
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# ------------------------------------------------------------ old API ----

@context.define_context()
class OldCtx(object):
    pass


@context.define_context(allow_default=True)
class OldDefault(object):
    pass


class OldChild(OldCtx):
    pass


@context.define_context()
class OldWithHooks(object):
    def __init__(self):
        self.log = []

    def __enter__(self):
        self.log.append('enter')

    def __exit__(self, *args):
        self.log.append('exit')


def test_define_context_basic():
    assert OldCtx.current(required=False) is None
    with OldCtx() as a:
        assert OldCtx.current() is a
        assert context.get_active_context(OldCtx) is a
    assert context.get_active_context(OldCtx, required=False) is None
    with pytest.raises(AssertionError) as e:
        OldCtx.current()
    assert str(e.value) == (
        'Context %s is required but none is active.' % OldCtx)


def test_define_context_default():
    def body():
        d = OldDefault.current()
        assert isinstance(d, OldDefault)
        assert context.get_active_context(OldDefault) is d
        return True

    assert run_in_thread(body)


def test_define_context_subclass_shares_stack():
    with OldChild() as c:
        assert OldCtx.current() is c
        assert OldChild.current() is c
    with OldCtx() as p:
        # the subclass reads its parent's stack
        assert OldChild.current(required=False) is p


def test_define_context_wraps_existing_hooks():
    obj = OldWithHooks()
    with obj as entered:
        assert entered is obj
        assert OldWithHooks.current() is obj
        assert obj.log == ['enter']
    assert obj.log == ['enter', 'exit']


def test_define_context_once_per_hierarchy():
    with pytest.raises(AssertionError) as e:
        context.define_context()(OldChild)
    assert 'already defines context.' in str(e.value)


def test_define_context_decorator_and_value():
    ctx = OldCtx()

    @ctx
    def fn():
        return OldCtx.current()

    assert fn() is ctx
    other = OldCtx()
    assert context.get_active_context(OldCtx, other) is other
    with pytest.raises(AssertionError) as e:
        context.get_active_context(OldCtx, 'nope')
    assert str(e.value).startswith('Wrong context type. Expected: ')


def test_define_context_threads():
    errors = []

    def worker():
        try:
            for _ in range(100):
                with OldCtx() as a:
                    for _ in range(10):
                        assert OldCtx.current() is a
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_get_active_context_rejects_unmanaged_class():
    class NotAContext(object):
        pass

    with pytest.raises(AssertionError):
        context.get_active_context(NotAContext)

"""The Task example from Caffe2's task.py documentation, run on ferrocaffe.

A task with two concurrent instances: the task-level init creates `globl`,
each instance creates its own `local`, copies `globl` into it 100 times and
adds it back into `globl` when it finishes; the task-level exit squares
`globl` once, after both instances are done.

Run it with:  python examples/task_example.py        (add --ray to run the
node 'trainer' as a Ray actor; needs pip install 'ferrocaffe[ray]')
"""

from ferrocaffe.net_builder import ops
from ferrocaffe.session import LocalSession
from ferrocaffe.task import Node, Task, TaskGroup, final_output


def build():
    """Returns (task_group, task, output of `globl`)."""
    with TaskGroup() as tg:
        # --- the documented example (Caffe2's `blobl` typo fixed) ---
        with Node('trainer'), Task(name='my_task', num_instances=2):
            with ops.task_init():
                globl = ops.Const(0)
            with ops.task_instance_init():
                local = ops.Const(0)
            with ops.loop(100):
                ops.Copy(globl, local)
            with ops.task_instance_exit():
                ops.Add([globl, local], [globl])
            with ops.task_exit():
                ops.Mul([globl, globl], [globl])
            # --- end of the documented example ---
            task = Task.current()
            result = final_output(globl)
    return tg, task, result


def main(session=None):
    """Runs the example on `session` (default: a new LocalSession; pass
    ``ferrocaffe.distributed.RaySession()`` to run it on Ray)."""
    tg, task, result = build()
    with (session or LocalSession()) as session:
        session.run(tg)
        value = result.fetch()
    print('task %s ran %d instances; globl = %s'
          % (task.name, 2, value))
    return value


if __name__ == '__main__':
    import sys
    if '--ray' in sys.argv[1:]:
        from ferrocaffe.distributed import RaySession
        main(RaySession())
    else:
        main()

"""RunPlan's progress bar (progress=True): the plan runs as it would
without it, leaves no trace of the counter behind, and the bar counts the
iterations of the looping top-level steps."""

import io

import numpy as np
import pytest

from ferrocaffe import core, errors, workspace


def counting_plan(n_nets, n_substeps):
    init = core.Net('pg_init')
    init.ConstantFill([], ['acc'], shape=[1], value=0.0)
    init.ConstantFill([], ['one'], shape=[1], value=1.0)
    add = core.Net('pg_add')
    add.Add(['acc', 'one'], ['acc'])
    nets_loop = core.execution_step('pg_nets', [add], num_iter=n_nets)
    inner = core.execution_step('pg_inner', [add])
    sub_loop = core.execution_step('pg_subs', [inner], num_iter=n_substeps)
    plan = core.Plan('pg_plan')
    plan.AddStep(core.execution_step('pg_init_step', [init]))
    plan.AddStep(nets_loop)
    plan.AddStep(sub_loop)
    return plan


def test_a_plan_runs_the_same_with_a_progress_bar(fresh, monkeypatch):
    bars = []
    import tqdm

    class Recording(tqdm.tqdm):
        def __init__(self, *args, **kwargs):
            kwargs['file'] = io.StringIO()
            super().__init__(*args, **kwargs)
            bars.append(self)

    monkeypatch.setattr(tqdm, 'tqdm', Recording)
    before = set(workspace.Blobs())
    assert workspace.RunPlan(counting_plan(7, 5), progress=True)
    np.testing.assert_array_equal(workspace.FetchBlob('acc'), [12.0])
    assert set(workspace.Blobs()) - before == {'acc', 'one'}
    assert not [n for n in workspace.Nets() if 'progress' in n]
    [bar] = bars
    assert bar.total == 12


def test_no_bar_without_a_terminal_or_a_known_length(fresh, monkeypatch):
    import tqdm

    def refuse(*args, **kwargs):
        raise AssertionError('no bar expected')

    monkeypatch.setattr(tqdm, 'tqdm', refuse)
    workspace.RunPlan(counting_plan(3, 2))              # stderr is not a terminal
    once = core.Plan('pg_once')
    net = core.Net('pg_once_net')
    net.ConstantFill([], ['z'], shape=[1], value=1.0)
    once.AddStep(core.execution_step('pg_once_step', [net]))
    workspace.RunPlan(once, progress=True)               # no num_iter: unknown length


def test_a_failure_under_a_bar_is_the_plans_error(fresh):
    bad = core.Net('pg_bad')
    bad.Add(['missing_a', 'missing_b'], ['c'])
    plan = core.Plan('pg_bad_plan')
    plan.AddStep(core.execution_step('pg_bad_step', [bad], num_iter=3))
    with pytest.raises(errors.FerrocaffeError):
        workspace.RunPlan(plan, progress=True)
    assert not [b for b in workspace.Blobs() if 'progress' in b]


def test_the_run_plan_command_draws_a_bar_when_asked_or_on_a_terminal(fresh, tmp_path,
                                                                        monkeypatch, capsys):
    from ferrocaffe import run_plan
    import tqdm
    bars = []

    class Recording(tqdm.tqdm):
        def __init__(self, *args, **kwargs):
            kwargs['file'] = io.StringIO()
            super().__init__(*args, **kwargs)
            bars.append(self)

    path = tmp_path / 'counting.pb'
    path.write_bytes(counting_plan(4, 3).Proto().SerializeToString())
    monkeypatch.setattr(tqdm, 'tqdm', Recording)
    # Standard error is not a terminal here: no bar unless asked for.
    assert run_plan.main([str(path)]) == 0
    assert run_plan.main([str(path), '--no-progress']) == 0
    assert run_plan.main([str(path), '--progress', '--quiet']) == 0
    assert bars == []
    assert run_plan.main([str(path), '--progress']) == 0
    [bar] = bars
    assert bar.total == 7 and bar.n == 7
    # A plan of unknown length gets none, even when asked.
    once = core.Plan('pg_cmd_once')
    net = core.Net('pg_cmd_once_net')
    net.ConstantFill([], ['z'], shape=[1], value=1.0)
    once.AddStep(core.execution_step('pg_cmd_once_step', [net]))
    path.write_bytes(once.Proto().SerializeToString())
    assert run_plan.main([str(path), '--progress']) == 0
    assert len(bars) == 1
    err = capsys.readouterr().err
    assert "finished in" in err

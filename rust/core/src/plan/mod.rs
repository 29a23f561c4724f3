//! The execution-step scheduler: runs a `PlanDef` with Caffe2's step rules.
//!
//! How work is spread out:
//! - a step's nets and sequential substeps run on the calling thread;
//! - concurrent substeps and concurrent instances each get their own scoped OS
//!   thread for the iteration (they may block on queues or on each other, so
//!   they must never wait for a slot in a bounded pool);
//! - report steps get one thread each, woken by a condition variable;
//! - rayon's pool is left to data-parallel work inside kernels, which never
//!   blocks.
//!
//! Failure handling (better than Caffe2's abort-by-default): the first error of
//! any concurrent worker or reporter is recorded, the others are cancelled
//! through a [`CancelToken`], every thread is joined, and the error is returned
//! with the step that raised it. A soft failure (an op returning false) also
//! cancels siblings, so a stuck sibling can never hang the plan.

//!
//! Two halves, as tract does plans: `compile.rs` makes the immutable,
//! workspace-free [`CompiledPlan`](compile::CompiledPlan) (every step
//! validated, its [`StepKind`](compile::StepKind), limit, nets and report
//! periods decided once); `execute.rs` holds the per-run state: a
//! [`PlanState`](execute::PlanState) binds the compiled plan to a
//! workspace, a [`StepState`](execute::StepState) is a compiled step bound
//! to it (nets created, stop blob resolved), and each execution makes its
//! own errors, threads and tokens.

mod compile;
mod execute;

use crate::cancel::CancelToken;
use crate::error::{Error, Result};
use crate::ir::{ExecutionStep, NetDef, OperatorDef, PlanDef, MAX_NESTING};
use crate::workspace::Workspace;
use compile::CompiledPlan;
use execute::{PlanState, SubstepState};
use std::sync::Arc;

/// Refuses steps nested more than [`MAX_NESTING`] levels inside the plan,
/// naming the deepest one's parent: compiling and running steps recurse, and
/// a plan built in Rust is not bounded by the decoder's limit. Iterative.
fn check_nesting(plan: &PlanDef) -> Result<()> {
    let mut level: Vec<&ExecutionStep> = plan.execution_step.iter().collect();
    let mut depth = 1;
    while !level.is_empty() {
        let next: Vec<&ExecutionStep> = level.iter().flat_map(|s| &s.substep).collect();
        if depth >= MAX_NESTING && !next.is_empty() {
            let parent = level
                .iter()
                .find(|s| !s.substep.is_empty())
                .map_or("", |s| s.step_name());
            return Err(Error::invalid_plan(format!(
                "steps are nested more than {MAX_NESTING} levels deep in the plan"
            ))
            .with_step(parent));
        }
        level = next;
        depth += 1;
    }
    Ok(())
}

/// Runs a plan: compiles it once, then runs its top-level steps in order,
/// each bound to the workspace just before it runs (a step that did not
/// compile fails when it is reached, as in Caffe2). `Ok(false)` is a soft
/// failure; a cancelled run is `Err(Cancelled)`.
pub fn run_plan(ws: &Arc<Workspace>, plan: &PlanDef, cancel: &CancelToken) -> Result<bool> {
    if plan.execution_step.is_empty() {
        return Ok(true);
    }
    check_nesting(plan)?;
    let compiled = CompiledPlan::compile(plan)?;
    let run = PlanState::new(ws, &compiled);
    for step in &compiled.steps {
        let step = step.as_ref().map_err(Clone::clone)?;
        let w = SubstepState::new(&run, step, ws)?;
        let ok = w.exec(&run, cancel)?;
        cancel.poll_check()?;
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether running `plan` may run an op matching `pred` on a thread the plan
/// starts (a concurrent substep or instance, a report step or report net)
/// rather than on the calling thread. Looks into nets nested in op arguments
/// (If, While, Do); walks without recursion, as steps may nest deeply.
pub fn calls_off_thread(plan: &PlanDef, pred: &dyn Fn(&OperatorDef) -> bool) -> bool {
    let calls = |net: &NetDef| {
        let mut nets = vec![net];
        while let Some(n) = nets.pop() {
            for op in &n.op {
                if pred(op) {
                    return true;
                }
                for a in &op.arg {
                    nets.extend(a.n.iter());
                    nets.extend(a.nets.iter());
                }
            }
        }
        false
    };
    let matching: std::collections::HashSet<&str> = plan
        .network
        .iter()
        .filter(|n| calls(n))
        .map(|n| n.net_name())
        .collect();
    if matching.is_empty() {
        return false;
    }
    let mut steps: Vec<(&ExecutionStep, bool)> =
        plan.execution_step.iter().map(|s| (s, false)).collect();
    while let Some((step, off)) = steps.pop() {
        if step
            .report_net
            .as_deref()
            .is_some_and(|n| matching.contains(n))
        {
            return true;
        }
        if off && step.network.iter().any(|n| matching.contains(n.as_str())) {
            return true;
        }
        let threads = (step.concurrent_substeps == Some(true) && step.substep.len() > 1)
            || step.num_concurrent_instances.is_some_and(|n| n > 1);
        for sub in &step.substep {
            steps.push((sub, off || threads || sub.run_every_ms.is_some()));
        }
    }
    false
}

/// Runs a single step as a plan of its own, with the nets given.
pub fn run_step(
    ws: &Arc<Workspace>,
    step: &ExecutionStep,
    nets: &[NetDef],
    cancel: &CancelToken,
) -> Result<bool> {
    let plan = PlanDef {
        name: step.name.clone(),
        network: nets.to_vec(),
        execution_step: vec![step.clone()],
    };
    run_plan(ws, &plan, cancel)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blob::BlobValue;
    use crate::blob::Counter;
    use crate::error::ErrorKind;
    use crate::ir::Argument;
    use crate::operator::{register, OpSchema, MANY};
    use crate::ops::kernel;
    use crate::tensor::Tensor;
    use crate::test_util::{int_arg, net, op};
    use std::sync::atomic::Ordering;
    use std::sync::Once;
    use std::time::{Duration, Instant};

    fn step(name: &str) -> ExecutionStep {
        ExecutionStep {
            name: Some(name.into()),
            ..Default::default()
        }
    }
    fn net_step(name: &str, nets: &[&str]) -> ExecutionStep {
        ExecutionStep {
            network: nets.iter().map(|s| s.to_string()).collect(),
            ..step(name)
        }
    }
    fn plan(nets: Vec<NetDef>, steps: Vec<ExecutionStep>) -> PlanDef {
        PlanDef {
            name: Some("p".into()),
            network: nets,
            execution_step: steps,
        }
    }
    fn counter(ws: &Workspace, name: &str) -> i64 {
        ws.blob(name)
            .unwrap()
            .read()
            .object::<Counter>("Counter")
            .unwrap()
            .get()
    }
    fn i64_of(ws: &Workspace, name: &str) -> i64 {
        ws.fetch(name)
            .unwrap()
            .tensor()
            .unwrap()
            .scalar_value::<i64>()
            .unwrap()
    }
    fn run(ws: &Arc<Workspace>, p: &PlanDef) -> Result<bool> {
        run_plan(ws, p, &CancelToken::new())
    }

    /// Test-only ops: a cancellable sleep, and one that fails on its k-th call.
    fn register_test_ops() {
        static ONCE: Once = Once::new();
        ONCE.call_once(|| {
            register(
                OpSchema::new("TestSleepMs", |ctx| {
                    let ms = ctx.args.i64("ms", 1)? as u64;
                    Ok(kernel(move |cx| {
                        cx.cancel.sleep(Duration::from_millis(ms)).map(|_| true)
                    }))
                })
                .args(&[crate::arg!("ms", "int", "1", "how long to sleep")]),
            );
            register(
                OpSchema::new("TestFailAt", |ctx| {
                    let at = ctx.args.i64("at", 0)?;
                    Ok(kernel(move |cx| {
                        let c = cx.input_blob(0).read().object::<Counter>("Counter")?;
                        if c.0.fetch_add(1, Ordering::SeqCst) == at {
                            return Err(Error::failed(format!("planned failure at call {at}")));
                        }
                        Ok(true)
                    }))
                })
                .inputs(1, 1)
                .args(&[crate::arg!("at", "int", "0", "the call that fails")]),
            );
            register(OpSchema::new("TestSoftFail", |_| Ok(kernel(|_| Ok(false)))).inputs(0, MANY));
        });
    }

    #[test]
    fn num_iter_runs_the_net_that_many_times() {
        let ws = Workspace::new();
        let mut s = net_step("s", &["n"]);
        s.num_iter = Some(5);
        let p = plan(
            vec![net("n", vec![op("Iter", &[], &["it"], vec![])])],
            vec![s],
        );
        assert!(run(&ws, &p).unwrap());
        assert_eq!(
            ws.fetch("it")
                .unwrap()
                .tensor()
                .unwrap()
                .array::<i64>()
                .unwrap()
                .as_slice()
                .unwrap(),
            &[5]
        );
        // Zero or negative iterations run nothing and succeed.
        let ws = Workspace::new();
        let mut s = net_step("s", &["n"]);
        s.num_iter = Some(0);
        let p = plan(
            vec![net("n", vec![op("Iter", &[], &["it"], vec![])])],
            vec![s],
        );
        assert!(run(&ws, &p).unwrap());
        assert!(ws.fetch("it").unwrap().is_empty());
    }

    #[test]
    fn stop_blob_is_checked_after_each_net_never_before_the_first() {
        let ws = Workspace::new();
        let init = net(
            "init",
            vec![op(
                "CreateCounter",
                &[],
                &["c"],
                vec![int_arg("init_count", 3)],
            )],
        );
        let body = net(
            "body",
            vec![
                op("CountDown", &["c"], &["stop"], vec![]),
                op("CountUp", &["n"], &["prev"], vec![]),
            ],
        );
        let mk = net("mk", vec![op("CreateCounter", &[], &["n"], vec![])]);
        let mut s = net_step("loop", &["body"]);
        s.should_stop_blob = Some("stop".into());
        let p = plan(
            vec![init, mk, body],
            vec![net_step("i", &["init", "mk"]), s],
        );
        assert!(run(&ws, &p).unwrap());
        // CountDown yields F, F, F, T: four iterations, counter ends at -1.
        assert_eq!(counter(&ws, "n"), 4);
        assert_eq!(counter(&ws, "c"), -1);
    }

    #[test]
    fn only_once_caps_a_stop_blob_loop() {
        let ws = Workspace::new();
        let p = plan(
            vec![
                net(
                    "init",
                    vec![op(
                        "CreateCounter",
                        &[],
                        &["c"],
                        vec![int_arg("init_count", 10)],
                    )],
                ),
                net("body", vec![op("CountDown", &["c"], &["stop"], vec![])]),
            ],
            vec![net_step("i", &["init"]), {
                let mut s = net_step("s", &["body"]);
                s.should_stop_blob = Some("stop".into());
                s.only_once = Some(true);
                s
            }],
        );
        assert!(run(&ws, &p).unwrap());
        assert_eq!(counter(&ws, "c"), 9);
    }

    #[test]
    fn malformed_steps_are_rejected_before_running() {
        let ws = Workspace::new();
        let n = || net("n", vec![op("CreateCounter", &[], &["c"], vec![])]);
        let cases: Vec<(ExecutionStep, &str)> = vec![
            (
                ExecutionStep {
                    num_iter: Some(2),
                    should_stop_blob: Some("c".into()),
                    ..net_step("a", &["n"])
                },
                "cannot both be set",
            ),
            (
                ExecutionStep {
                    only_once: Some(false),
                    ..net_step("b", &["n"])
                },
                "only_once",
            ),
            (
                ExecutionStep {
                    substep: vec![net_step("x", &["n"])],
                    ..net_step("c", &["n"])
                },
                "both substeps and networks",
            ),
            (net_step("d", &["missing"]), "uses undefined net 'missing'"),
            (
                ExecutionStep {
                    report_net: Some("n".into()),
                    ..net_step("e", &["n"])
                },
                "report_interval",
            ),
            (
                ExecutionStep {
                    num_concurrent_instances: Some(-1),
                    substep: vec![net_step("x", &["n"])],
                    ..step("f")
                },
                ">= 0",
            ),
            (
                ExecutionStep {
                    should_stop_blob: Some("nope".into()),
                    ..net_step("g", &["n"])
                },
                "'nope' does not exist",
            ),
        ];
        for (s, msg) in cases {
            let name = s.step_name().to_string();
            let e = run(&ws, &plan(vec![n()], vec![s])).unwrap_err();
            assert!(e.message.contains(msg), "{name}: {}", e.full_message());
            assert_eq!(
                e.context.step.as_deref(),
                Some(name.as_str()),
                "{}",
                e.full_message()
            );
        }
        let e = run(&ws, &plan(vec![n(), n()], vec![net_step("a", &["n"])])).unwrap_err();
        assert!(e.message.contains("two nets named 'n'"));
        // The workspace still works.
        assert!(run(&ws, &plan(vec![n()], vec![net_step("ok", &["n"])])).unwrap());
    }

    /// A plan compiles without a workspace: kinds, limits and report
    /// periods are decided from the definition alone.
    #[test]
    fn a_plan_compiles_without_a_workspace() {
        let worker = |name: &str| net_step(name, &["n"]);
        let mut conc = ExecutionStep {
            substep: vec![worker("a"), worker("b")],
            concurrent_substeps: Some(true),
            num_concurrent_instances: Some(3),
            ..step("conc")
        };
        conc.substep.push(ExecutionStep {
            run_every_ms: Some(20),
            ..worker("rep")
        });
        let seq = ExecutionStep {
            substep: vec![worker("x")],
            should_stop_blob: Some("stop".into()),
            only_once: Some(true),
            ..step("seq")
        };
        let p = plan(
            vec![net("n", vec![])],
            vec![conc, seq, net_step("bad", &["missing"])],
        );
        let c = compile::CompiledPlan::compile(&p).unwrap();
        let conc = c.steps[0].as_ref().unwrap();
        // Two recurring substeps, three instances each; the report step
        // runs on a thread of its own and is no worker.
        assert_eq!(conc.kind, compile::StepKind::Concurrent { workers: 6 });
        assert_eq!(conc.recurring.len(), 2);
        assert_eq!(
            conc.reports[0].report_every,
            Some(Duration::from_millis(20))
        );
        assert_eq!(conc.recurring[0].kind, compile::StepKind::Nets);
        assert_eq!(conc.recurring[0].nets, vec!["n"]);
        let seq = c.steps[1].as_ref().unwrap();
        assert_eq!(seq.kind, compile::StepKind::Sequential);
        assert_eq!(seq.limit, compile::Limit::OnlyOnce);
        assert_eq!(seq.stop_blob, Some("stop"));
        let e = c.steps[2].as_ref().unwrap_err();
        assert!(e.message.contains("uses undefined net 'missing'"));
    }

    /// As in Caffe2, a top-level step that does not compile fails when the
    /// plan reaches it, after the steps before it ran; inside one top-level
    /// step, everything (create_workspace substeps too) is checked before
    /// any of it runs.
    #[test]
    fn a_step_that_does_not_compile_fails_when_reached() {
        let ws = Workspace::new();
        let counting = || net("n", vec![op("Iter", &[], &["it"], vec![])]);
        let p = plan(
            vec![counting()],
            vec![net_step("first", &["n"]), net_step("second", &["missing"])],
        );
        let e = run(&ws, &p).unwrap_err();
        assert_eq!(e.context.step.as_deref(), Some("second"));
        assert_eq!(i64_of(&ws, "it"), 1);
        let ws = Workspace::new();
        let inner = ExecutionStep {
            create_workspace: Some(true),
            substep: vec![net_step("deep", &["missing"])],
            ..step("child")
        };
        let p = plan(
            vec![counting()],
            vec![ExecutionStep {
                substep: vec![net_step("runs_first", &["n"]), inner],
                ..step("outer")
            }],
        );
        let e = run(&ws, &p).unwrap_err();
        assert_eq!(e.context.step.as_deref(), Some("deep"));
        // Nothing of "outer" was bound (no net made its output) or ran.
        assert!(ws.get_blob("it").is_none());
    }

    #[test]
    fn concurrent_instances_with_atomic_iter_lose_no_update() {
        for (instances, iters) in [(7usize, 11i64), (3, 100), (16, 5)] {
            let ws = Workspace::new();
            ws.feed(
                "it",
                BlobValue::Tensor(Tensor::from_vec(&[1], vec![0i64]).unwrap()),
            );
            let init = net("init", vec![op("CreateMutex", &[], &["m"], vec![])]);
            let body = net(
                "body",
                vec![op("AtomicIter", &["m", "it"], &["it"], vec![])],
            );
            let inst = ExecutionStep {
                num_iter: Some(iters),
                create_workspace: Some(true),
                ..net_step("inst", &["body"])
            };
            let par = ExecutionStep {
                substep: vec![inst],
                num_concurrent_instances: Some(instances as i32),
                ..step("par")
            };
            assert!(run(
                &ws,
                &plan(vec![init, body], vec![net_step("i", &["init"]), par])
            )
            .unwrap());
            assert_eq!(
                ws.fetch("it")
                    .unwrap()
                    .tensor()
                    .unwrap()
                    .array::<i64>()
                    .unwrap()[[0]],
                instances as i64 * iters
            );
        }
    }

    #[test]
    fn shared_net_instances_are_serialised_not_racy() {
        // Without create_workspace, instances share one net: plain (non-atomic)
        // Iter still counts exactly, because runs of one net are serialised.
        let ws = Workspace::new();
        let body = net("body", vec![op("Iter", &["it"], &["it"], vec![])]);
        ws.feed(
            "it",
            BlobValue::Tensor(Tensor::from_vec(&[1], vec![0i64]).unwrap()),
        );
        let inst = ExecutionStep {
            num_iter: Some(50),
            ..net_step("inst", &["body"])
        };
        let par = ExecutionStep {
            substep: vec![inst],
            num_concurrent_instances: Some(8),
            ..step("par")
        };
        assert!(run(&ws, &plan(vec![body], vec![par])).unwrap());
        assert_eq!(
            ws.fetch("it")
                .unwrap()
                .tensor()
                .unwrap()
                .array::<i64>()
                .unwrap()[[0]],
            400
        );
    }

    #[test]
    fn child_workspace_blobs_die_and_parent_blobs_persist() {
        let ws = Workspace::new();
        ws.feed(
            "shared",
            BlobValue::Tensor(Tensor::from_vec(&[1], vec![0i64]).unwrap()),
        );
        let body = net(
            "body",
            vec![
                op("Iter", &["shared"], &["shared"], vec![]),
                op("CreateCounter", &[], &["local"], vec![]),
            ],
        );
        let s = ExecutionStep {
            create_workspace: Some(true),
            num_iter: Some(3),
            ..net_step("c", &["body"])
        };
        let outer = ExecutionStep {
            substep: vec![s],
            num_iter: Some(2),
            ..step("outer")
        };
        assert!(run(&ws, &plan(vec![body], vec![outer])).unwrap());
        assert!(!ws.has_blob("local"));
        assert!(!ws.has_net("body"), "nets built in the child die with it");
        assert_eq!(
            ws.fetch("shared")
                .unwrap()
                .tensor()
                .unwrap()
                .array::<i64>()
                .unwrap()[[0]],
            6
        );
    }

    #[test]
    fn global_workspace_id_is_injected_when_node_id_is_set() {
        let ws = Workspace::new();
        ws.feed("NODE_ID", BlobValue::Tensor(Tensor::scalar(2i32)));
        // The child sees GLOBAL_WORKSPACE_ID: an op that needs it as an
        // input builds and runs there.
        let body = net(
            "body",
            vec![op("IsEmpty", &["GLOBAL_WORKSPACE_ID"], &["e"], vec![])],
        );
        let s = ExecutionStep {
            create_workspace: Some(true),
            ..net_step("c", &["body"])
        };
        assert!(run(&ws, &plan(vec![body], vec![s])).unwrap());
        assert!(!ws.has_blob("GLOBAL_WORKSPACE_ID"));
        // Without NODE_ID nothing is injected, so the same plan cannot build.
        let ws = Workspace::new();
        let body = net(
            "body",
            vec![op("IsEmpty", &["GLOBAL_WORKSPACE_ID"], &["e"], vec![])],
        );
        let s = ExecutionStep {
            create_workspace: Some(true),
            ..net_step("c", &["body"])
        };
        let e = run(&ws, &plan(vec![body], vec![s])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::BlobNotFound);
    }

    #[test]
    fn report_step_runs_during_and_once_after_the_body() {
        register_test_ops();
        let ws = Workspace::new();
        let init = net(
            "init",
            vec![
                op("CreateCounter", &[], &["ticks"], vec![]),
                op("CreateCounter", &[], &["work"], vec![]),
            ],
        );
        let body = net(
            "body",
            vec![
                op("TestSleepMs", &[], &[], vec![int_arg("ms", 2)]),
                op("CountUp", &["work"], &["w"], vec![]),
            ],
        );
        let report = net(
            "report",
            vec![
                op("CountUp", &["ticks"], &["t"], vec![]),
                op("RetrieveCount", &["work"], &["seen"], vec![]),
            ],
        );
        let work = ExecutionStep {
            num_iter: Some(60),
            ..net_step("work", &["body"])
        };
        let rep = ExecutionStep {
            run_every_ms: Some(10),
            ..net_step("rep", &["report"])
        };
        let top = ExecutionStep {
            substep: vec![work, rep],
            concurrent_substeps: Some(true),
            ..step("top")
        };
        assert!(run(
            &ws,
            &plan(
                vec![init, body, report],
                vec![net_step("i", &["init"]), top]
            )
        )
        .unwrap());
        // ~120 ms of work at a 10 ms period: several periodic runs plus the
        // final one, and the final one saw the body's last write.
        assert!(
            counter(&ws, "ticks") >= 3,
            "ticks = {}",
            counter(&ws, "ticks")
        );
        assert_eq!(i64_of(&ws, "seen"), 60);
    }

    #[test]
    fn final_report_runs_even_when_the_body_is_instant() {
        let ws = Workspace::new();
        let init = net("init", vec![op("CreateCounter", &[], &["ticks"], vec![])]);
        let report = net("report", vec![op("CountUp", &["ticks"], &["t"], vec![])]);
        let body = net("body", vec![op("CreateCounter", &[], &["x"], vec![])]);
        let rep = ExecutionStep {
            run_every_ms: Some(60_000),
            ..net_step("rep", &["report"])
        };
        let top = ExecutionStep {
            substep: vec![net_step("b", &["body"]), rep],
            ..step("top")
        };
        for _ in 0..20 {
            assert!(run(
                &ws,
                &plan(
                    vec![init.clone(), report.clone(), body.clone()],
                    vec![net_step("i", &["init"]), top.clone()]
                )
            )
            .unwrap());
            assert_eq!(counter(&ws, "ticks"), 1);
        }
    }

    #[test]
    fn a_failure_in_one_of_fifty_instances_is_raised_with_context() {
        register_test_ops();
        let ws = Workspace::new();
        let init = net("init", vec![op("CreateCounter", &[], &["calls"], vec![])]);
        let body = net(
            "body",
            vec![op("TestFailAt", &["calls"], &[], vec![int_arg("at", 25)])],
        );
        let inst = ExecutionStep {
            create_workspace: Some(true),
            num_iter: Some(4),
            ..net_step("inst", &["body"])
        };
        let par = ExecutionStep {
            substep: vec![inst],
            num_concurrent_instances: Some(50),
            ..step("par")
        };
        let e = run(
            &ws,
            &plan(vec![init, body], vec![net_step("i", &["init"]), par]),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::OperatorFailed);
        assert_eq!(e.context.op_type.as_deref(), Some("TestFailAt"));
        assert_eq!(e.context.net.as_deref(), Some("body"));
        assert_eq!(e.context.step.as_deref(), Some("inst"));
        // The workspace is still usable.
        assert!(ws.has_blob("calls"));
    }

    #[test]
    fn a_failing_substep_cancels_a_looping_sibling() {
        register_test_ops();
        let ws = Workspace::new();
        let init = net("init", vec![op("CreateCounter", &[], &["calls"], vec![])]);
        let spin = net(
            "spin",
            vec![op("TestSleepMs", &[], &[], vec![int_arg("ms", 1000)])],
        );
        let fail = net(
            "fail",
            vec![
                op("TestSleepMs", &[], &[], vec![int_arg("ms", 20)]),
                op("TestFailAt", &["calls"], &[], vec![int_arg("at", 0)]),
            ],
        );
        let forever = ExecutionStep {
            should_stop_blob: Some("never".into()),
            ..net_step("forever", &["spin"])
        };
        ws.create_blob("never");
        let top = ExecutionStep {
            substep: vec![forever, net_step("failing", &["fail"])],
            concurrent_substeps: Some(true),
            ..step("top")
        };
        let t = Instant::now();
        let e = run(
            &ws,
            &plan(vec![init, spin, fail], vec![net_step("i", &["init"]), top]),
        )
        .unwrap_err();
        assert_eq!(
            e.context.step.as_deref(),
            Some("failing"),
            "{}",
            e.full_message()
        );
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn soft_failure_returns_false_and_stops_later_steps() {
        register_test_ops();
        let ws = Workspace::new();
        let p = plan(
            vec![
                net("bad", vec![op("TestSoftFail", &[], &[], vec![])]),
                net("later", vec![op("CreateCounter", &[], &["c"], vec![])]),
            ],
            vec![net_step("a", &["bad"]), net_step("b", &["later"])],
        );
        assert!(!run(&ws, &p).unwrap());
        assert!(!ws.has_blob("c"));
    }

    #[test]
    fn cancellation_stops_a_blocked_plan_promptly() {
        register_test_ops();
        let ws = Workspace::new();
        let p = plan(
            vec![net(
                "sleep",
                vec![op("TestSleepMs", &[], &[], vec![int_arg("ms", 60_000)])],
            )],
            vec![ExecutionStep {
                substep: vec![net_step("a", &["sleep"]), net_step("b", &["sleep"])],
                concurrent_substeps: Some(true),
                ..step("top")
            }],
        );
        let tok = CancelToken::new();
        let t2 = tok.clone();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            t2.cancel();
        });
        let t = Instant::now();
        let e = run_plan(&ws, &p, &tok).unwrap_err();
        h.join().unwrap();
        assert!(e.is_cancelled());
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn existing_nets_are_recreated_once_per_plan() {
        let ws = Workspace::new();
        let n = net(
            "n",
            vec![op(
                "CreateCounter",
                &[],
                &["c"],
                vec![int_arg("init_count", 1)],
            )],
        );
        ws.create_net(&net("n", vec![]), false).unwrap();
        assert!(run(&ws, &plan(vec![n], vec![net_step("s", &["n"])])).unwrap());
        assert_eq!(counter(&ws, "c"), 1);
        assert_eq!(ws.get_net("n").unwrap().lock_now().num_ops(), 1);
    }

    #[test]
    fn empty_plan_succeeds_without_creating_nets() {
        let ws = Workspace::new();
        let p = plan(
            vec![net("n", vec![op("CreateCounter", &[], &["c"], vec![])])],
            vec![],
        );
        assert!(run(&ws, &p).unwrap());
        assert!(!ws.has_net("n"));
    }

    #[test]
    fn steps_and_nets_nested_past_the_limit_are_refused_not_a_stack_overflow() {
        // Built in Rust, so no decoder limits the depth; before the checks,
        // compiling or running recursed until the stack overflowed.
        crate::test_util::in_child(
            "plan::tests::steps_and_nets_nested_past_the_limit_are_refused_not_a_stack_overflow",
            || {
                let ws = Workspace::new();
                let deep_steps = |depth: usize| {
                    let mut s = net_step("leaf", &["n"]);
                    for k in 1..depth {
                        s = ExecutionStep {
                            name: Some(format!("level{k}")),
                            substep: vec![s],
                            ..Default::default()
                        };
                    }
                    plan(vec![net("n", vec![])], vec![s])
                };
                let e = run(&ws, &deep_steps(5000)).unwrap_err();
                assert_eq!(e.kind, ErrorKind::InvalidPlan, "{}", e.full_message());
                assert!(e.message.contains("nested more than 100"), "{}", e.message);
                assert!(e
                    .context
                    .step
                    .as_deref()
                    .is_some_and(|s| s.starts_with("level")));
                // 100 levels inside the plan run.
                assert!(run(&ws, &deep_steps(100)).unwrap());
                assert!(run(&ws, &deep_steps(101)).is_err());

                // If nets inside If nets (150 deep: a NetDef that deep can
                // still be cloned and dropped, which recurse too; creating
                // 100 of them one inside another overflowed a debug build's
                // 2 MiB stack).
                ws.feed("cond", BlobValue::Tensor(Tensor::scalar(true)));
                let deep_ifs = |depth: usize| {
                    let mut n = net("n0", vec![op("CreateCounter", &[], &["c"], vec![])]);
                    for k in 1..depth {
                        let mut then = Argument {
                            name: Some("then_net".into()),
                            ..Default::default()
                        };
                        then.n = Some(n);
                        n = net(&format!("n{k}"), vec![op("If", &["cond"], &[], vec![then])]);
                    }
                    n
                };
                let e = ws
                    .run_net_once(&deep_ifs(150), &CancelToken::new())
                    .unwrap_err();
                assert_eq!(e.kind, ErrorKind::InvalidPlan, "{}", e.full_message());
                assert!(e.message.contains("nested more than 34"), "{}", e.message);
                assert!(ws.run_net_once(&deep_ifs(34), &CancelToken::new()).unwrap());
                assert!(ws.run_net_once(&deep_ifs(35), &CancelToken::new()).is_err());
            },
        );
    }
}

#[cfg(test)]
mod proptests {
    //! Random plans and random bytes never panic: every outcome is Ok or a
    //! typed error (a caught panic would surface as ErrorKind::Internal).
    use super::*;
    use crate::error::ErrorKind;
    use crate::ir::{Argument, OperatorDef};
    use proptest::prelude::*;
    use std::time::Duration;

    const BLOBS: &[&str] = &["a", "b", "c", "stop", "ctr", "mtx"];
    const OPS: &[(&str, usize, usize)] = &[
        ("CreateCounter", 0, 1),
        ("CountUp", 1, 1),
        ("CountDown", 1, 1),
        ("CheckCounterDone", 1, 1),
        ("RetrieveCount", 1, 1),
        ("ResetCounter", 1, 1),
        ("Iter", 1, 1),
        ("CreateMutex", 0, 1),
        ("AtomicIter", 2, 1),
        ("IsEmpty", 1, 1),
        ("Copy", 1, 1),
        ("ConstantFill", 0, 1),
        ("NoSuchOp", 1, 1),
    ];

    fn arb_op() -> impl Strategy<Value = OperatorDef> {
        (
            0..OPS.len(),
            prop::collection::vec(0..BLOBS.len(), 3),
            prop::option::of(-2i64..4),
        )
            .prop_map(|(k, names, arg)| {
                let (ty, ni, no) = OPS[k];
                OperatorDef {
                    r#type: Some(ty.into()),
                    input: names[..ni].iter().map(|&i| BLOBS[i].to_string()).collect(),
                    output: names[ni..ni + no]
                        .iter()
                        .map(|&i| BLOBS[i].to_string())
                        .collect(),
                    arg: arg
                        .map(|v| {
                            vec![Argument {
                                name: Some("init_count".into()),
                                i: Some(v),
                                ..Default::default()
                            }]
                        })
                        .unwrap_or_default(),
                    ..Default::default()
                }
            })
    }

    fn arb_step(depth: u32) -> BoxedStrategy<ExecutionStep> {
        let leaf = (
            prop::collection::vec(0..4usize, 0..3),
            prop::option::of(-1i64..4),
            prop::option::of(0..BLOBS.len()),
            prop::option::of(any::<bool>()),
            prop::option::of(any::<bool>()),
        )
            .prop_map(|(nets, num_iter, stop, only_once, cw)| ExecutionStep {
                name: Some("leaf".into()),
                network: nets.iter().map(|k| format!("n{k}")).collect(),
                num_iter,
                should_stop_blob: stop.map(|k| BLOBS[k].to_string()),
                only_once,
                create_workspace: cw,
                ..Default::default()
            });
        if depth == 0 {
            return leaf.boxed();
        }
        (
            prop::collection::vec(arb_step(depth - 1), 0..3),
            prop::option::of(any::<bool>()),
            prop::option::of(-1i32..4),
            prop::option::of(0i64..3),
            prop::option::of(1i64..3),
        )
            .prop_map(|(subs, conc, inst, every, num_iter)| {
                let mut subs = subs;
                if let (Some(ms), Some(first)) = (every, subs.first_mut()) {
                    first.run_every_ms = Some(ms);
                }
                ExecutionStep {
                    name: Some("parent".into()),
                    substep: subs,
                    concurrent_substeps: conc,
                    num_concurrent_instances: inst,
                    num_iter,
                    ..Default::default()
                }
            })
            .boxed()
            .prop_union(leaf.boxed())
            .boxed()
    }

    proptest! {
        // 200 cases in CI; PROPTEST_CASES runs more (scripts/fuzz.sh).
        #![proptest_config(ProptestConfig {
            cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(200),
            .. ProptestConfig::default()
        })]

        #[test]
        fn random_plans_never_panic(nets in prop::collection::vec(prop::collection::vec(arb_op(), 0..4), 4),
                                    steps in prop::collection::vec(arb_step(2), 1..3)) {
            let plan = PlanDef {
                name: Some("random".into()),
                network: nets.into_iter().enumerate().map(|(k, ops)| NetDef { name: Some(format!("n{k}")), op: ops, ..Default::default() }).collect(),
                execution_step: steps,
            };
            let ws = Workspace::new();
            let tok = CancelToken::new();
            // Unbounded stop-blob loops that nothing stops are cut short.
            let t2 = tok.clone();
            let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
            let guard = std::thread::spawn(move || {
                if done_rx.recv_timeout(Duration::from_millis(200)).is_err() {
                    t2.cancel();
                }
            });
            let outcome = run_plan(&ws, &plan, &tok);
            let _ = done_tx.send(());
            guard.join().unwrap();
            if let Err(e) = outcome {
                prop_assert_ne!(e.kind, ErrorKind::Internal, "{}", e.full_message());
            }
            // The workspace is still usable afterwards.
            let ok = ws.run_operator_once(&OperatorDef { r#type: Some("CreateCounter".into()), output: vec!["after".into()], ..Default::default() }, &CancelToken::new());
            prop_assert!(ok.is_ok());
        }

        #[test]
        fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let ws = Workspace::new();
            if let Ok(plan) = crate::ir::decode::<PlanDef>(&bytes, "plan") {
                let tok = CancelToken::new();
                tok.cancel();
                if let Err(e) = run_plan(&ws, &plan, &tok) {
                    prop_assert_ne!(e.kind, ErrorKind::Internal, "{}", e.full_message());
                }
            }
            if let Ok(op) = crate::ir::decode::<OperatorDef>(&bytes, "op") {
                if let Err(e) = ws.run_operator_once(&op, &CancelToken::new()) {
                    prop_assert_ne!(e.kind, ErrorKind::Internal, "{}", e.full_message());
                }
            }
            if let Ok(net) = crate::ir::decode::<NetDef>(&bytes, "net") {
                if let Err(e) = ws.create_net(&net, true) {
                    prop_assert_ne!(e.kind, ErrorKind::Internal, "{}", e.full_message());
                }
            }
            if let Err(e) = crate::storage::deserialize_blob(&bytes) {
                prop_assert_ne!(e.kind, ErrorKind::Internal, "{}", e.full_message());
            }
        }
    }
}

//! Counters, iteration counters, mutexes and timers.

use super::kit::kernel;
use crate::arg;
use crate::blob::{BlobMutex, BlobValue, Counter, Timer};
use crate::error::{Error, Result};
use crate::operator::{InPlace, OpCx, OpDefCtx, OpSchema, Operator};
use crate::tensor::Tensor;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

pub fn schemas() -> Vec<OpSchema> {
    vec![
        OpSchema::new("CreateCounter", create_counter)
            .inputs(0, 0)
            .outputs(1, 1)
            .args(&[arg!("init_count", "int", "0", "initial count, >= 0")])
            .doc("Writes a new atomic int64 counter into the output, replacing its content."),
        OpSchema::new("ResetCounter", reset_counter)
            .inputs(1, 1)
            .outputs(0, 1)
            .args(&[arg!("init_count", "int", "0", "value to reset to, >= 0")])
            .doc("Sets the counter to init_count; the optional output gets the previous value (int64)."),
        OpSchema::new("CountDown", count_down)
            .inputs(1, 1)
            .outputs(1, 1)
            .doc("Decrements the counter (always, it may go negative); outputs whether the value before was <= 0."),
        OpSchema::new("CheckCounterDone", check_counter_done)
            .inputs(1, 1)
            .outputs(1, 1)
            .doc("Outputs whether the counter is <= 0."),
        OpSchema::new("CountUp", count_up)
            .inputs(1, 1)
            .outputs(1, 1)
            .doc("Increments the counter; outputs the value before (int64)."),
        OpSchema::new("RetrieveCount", retrieve_count)
            .inputs(1, 1)
            .outputs(1, 1)
            .doc("Outputs the counter's current value (int64)."),
        OpSchema::new("Iter", iter)
            .inputs(0, 1)
            .outputs(1, 1)
            .inplace(InPlace::Enforce(|i, o| i == 0 && o == 0))
            .doc("Increments a one-element int64 iteration counter (initialised to 0 if empty). Not atomic: use AtomicIter across threads."),
        OpSchema::new("AtomicIter", atomic_iter)
            .inputs(2, 2)
            .outputs(1, 1)
            .inplace(InPlace::Enforce(|i, o| i == 1 && o == 0))
            .doc("Iter under a mutex: inputs (mutex, iter), output iter (in place)."),
        OpSchema::new("CreateMutex", create_mutex).inputs(0, 0).outputs(1, 1).doc("Writes a new mutex into the output."),
        OpSchema::new("AtomicFetchAdd", atomic_fetch_add)
            .inputs(3, 3)
            .outputs(2, 2)
            .inplace(InPlace::Allow(|i, o| i == 1 && o == 0))
            .doc("Inputs (mutex, a, b) -> (a + b, old a), under the mutex; int32 scalars."),
        OpSchema::new("AtomicFetchAdd64", atomic_fetch_add)
            .inputs(3, 3)
            .outputs(2, 2)
            .inplace(InPlace::Allow(|i, o| i == 1 && o == 0))
            .doc("AtomicFetchAdd for int64 scalars."),
        OpSchema::new("TimerBegin", timer_begin)
            .inputs(0, 0)
            .outputs(1, 1)
            .args(&[arg!("counter_name", "string", "output name", "the timer's name")])
            .doc("Creates and starts a timer."),
        OpSchema::new("TimerEnd", timer_end).inputs(1, 1).outputs(0, 0).doc("Stops a timer."),
        OpSchema::new("TimerGet", timer_get)
            .inputs(1, 1)
            .outputs(1, 1)
            .doc("Outputs the nanoseconds since the timer started (int64 scalar)."),
        OpSchema::new("TimerGetAndEnd", timer_get_and_end)
            .inputs(1, 1)
            .outputs(1, 1)
            .doc("TimerGet then TimerEnd; the output has shape [1]."),
    ]
}

fn init_count(ctx: &OpDefCtx<'_>) -> Result<i64> {
    let v = ctx.args.i64("init_count", 0)?;
    if v < 0 {
        return Err(ctx.bad_arg(format!("init_count must be >= 0, got {v}")));
    }
    Ok(v)
}

fn counter_of(cx: &OpCx<'_>) -> Result<Arc<Counter>> {
    cx.input_blob(0)
        .read()
        .object::<Counter>("Counter")
        .map_err(|e| e.with_blob(&cx.io.input_names[0]))
}

fn create_counter(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let init = init_count(ctx)?;
    Ok(kernel(move |cx| {
        cx.output_blob(0)
            .set(BlobValue::Object(Arc::new(Counter::new(init))));
        Ok(true)
    }))
}

fn reset_counter(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let init = init_count(ctx)?;
    Ok(kernel(move |cx| {
        let prev = counter_of(cx)?.0.swap(init, Ordering::SeqCst);
        if cx.num_outputs() == 1 {
            cx.output_blob(0)
                .set(BlobValue::Tensor(Tensor::scalar(prev)));
        }
        Ok(true)
    }))
}

fn count_down(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let prev = counter_of(cx)?.0.fetch_sub(1, Ordering::SeqCst);
        cx.output_blob(0)
            .set(BlobValue::Tensor(Tensor::scalar(prev <= 0)));
        Ok(true)
    }))
}

fn check_counter_done(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let v = counter_of(cx)?.get();
        cx.output_blob(0)
            .set(BlobValue::Tensor(Tensor::scalar(v <= 0)));
        Ok(true)
    }))
}

fn count_up(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let prev = counter_of(cx)?.0.fetch_add(1, Ordering::SeqCst);
        cx.output_blob(0)
            .set(BlobValue::Tensor(Tensor::scalar(prev)));
        Ok(true)
    }))
}

fn retrieve_count(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let v = counter_of(cx)?.get();
        cx.output_blob(0).set(BlobValue::Tensor(Tensor::scalar(v)));
        Ok(true)
    }))
}

/// Increments a one-element int64 tensor in place; an empty blob starts at 0.
fn increment(v: &mut BlobValue, name: &str) -> Result<()> {
    if v.is_empty() {
        *v = BlobValue::Tensor(Tensor::from_vec(&[1], vec![0i64])?);
    }
    let t = v.tensor_mut().map_err(|e| e.with_blob(name))?;
    let a = t.array_mut::<i64>().map_err(|e| e.with_blob(name))?;
    if a.len() != 1 {
        return Err(Error::shape(format!(
            "the iteration counter must have exactly one element, got shape {:?}",
            a.shape()
        ))
        .with_blob(name));
    }
    let x = a.iter_mut().next().expect("one element");
    if *x < 0 || *x == i64::MAX {
        return Err(Error::invalid_arg(format!(
            "the iteration counter holds {x}, outside [0, INT64_MAX)"
        ))
        .with_blob(name));
    }
    *x += 1;
    Ok(())
}

fn iter(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let mut l = cx.lock();
        let name = l.output_name(0).to_string();
        increment(l.output(0), &name)?;
        Ok(true)
    }))
}

fn mutex_of(cx: &OpCx<'_>) -> Result<Arc<BlobMutex>> {
    cx.input_blob(0)
        .read()
        .object::<BlobMutex>("Mutex")
        .map_err(|e| e.with_blob(&cx.io.input_names[0]))
}

fn atomic_iter(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let m = mutex_of(cx)?;
        let _g = m.0.lock();
        let blob = cx.output_blob(0);
        increment(&mut blob.write(), &cx.io.output_names[0])?;
        Ok(true)
    }))
}

fn create_mutex(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        cx.output_blob(0)
            .set(BlobValue::Object(Arc::new(BlobMutex::default())));
        Ok(true)
    }))
}

fn atomic_fetch_add(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let wide = ctx.op_type() == "AtomicFetchAdd64";
    Ok(kernel(move |cx| {
        let m = mutex_of(cx)?;
        let _g = m.0.lock();
        let mut l = cx.lock();
        fn add<T: crate::num::Number>(l: &mut crate::operator::Locked<'_>) -> Result<()> {
            let a = l
                .tensor(1)?
                .scalar_value::<T>()
                .map_err(|e| e.with_blob(l.input_name(1)))?;
            let b = l
                .tensor(2)?
                .scalar_value::<T>()
                .map_err(|e| e.with_blob(l.input_name(2)))?;
            let sum = a
                .checked_plus(b)
                .ok_or_else(|| Error::invalid_arg("AtomicFetchAdd overflowed"))?;
            l.set_output(0, Tensor::scalar(sum));
            l.set_output(1, Tensor::scalar(a));
            Ok(())
        }
        if wide {
            add::<i64>(&mut l)?;
        } else {
            add::<i32>(&mut l)?;
        }
        Ok(true)
    }))
}

fn timer_of(cx: &OpCx<'_>) -> Result<Arc<Timer>> {
    cx.input_blob(0)
        .read()
        .object::<Timer>("Timer")
        .map_err(|e| e.with_blob(&cx.io.input_names[0]))
}

fn timer_begin(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let name = ctx.args.string("counter_name", ctx.output_name(0))?;
    Ok(kernel(move |cx| {
        let t = Timer {
            name: name.clone(),
            start: parking_lot::Mutex::new(Some(Instant::now())),
        };
        cx.output_blob(0).set(BlobValue::Object(Arc::new(t)));
        Ok(true)
    }))
}

fn elapsed_ns(t: &Timer) -> i64 {
    t.start
        .lock()
        .map(|s| s.elapsed().as_nanos() as i64)
        .unwrap_or(0)
}

fn timer_end(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        *timer_of(cx)?.start.lock() = None;
        Ok(true)
    }))
}

fn timer_get(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let ns = elapsed_ns(&*timer_of(cx)?);
        cx.output_blob(0).set(BlobValue::Tensor(Tensor::scalar(ns)));
        Ok(true)
    }))
}

fn timer_get_and_end(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let t = timer_of(cx)?;
        let ns = elapsed_ns(&t);
        *t.start.lock() = None;
        cx.output_blob(0)
            .set(BlobValue::Tensor(Tensor::from_vec(&[1], vec![ns])?));
        Ok(true)
    }))
}

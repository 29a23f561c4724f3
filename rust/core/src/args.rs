//! Reading operator arguments with Caffe2's field rules.
//!
//! A single float reads the `f` field, integers and bools read `i`, strings
//! read `s`; repeated values read `floats`, `ints`, `strings`. A present
//! argument whose expected field is not set is an error (no coercion between
//! `f` and `i`); a missing argument gives the default. Integer reads check that
//! the value fits the target type.

use crate::error::{Error, Result};
use crate::ir::{Argument, NetDef, TensorProto};
use crate::tensor::DataType;

/// One documented argument.
#[derive(Clone, Copy, Debug)]
pub struct ArgDoc {
    pub name: &'static str,
    pub ty: &'static str,
    pub default: &'static str,
    pub doc: &'static str,
}

#[derive(Clone, Copy)]
pub struct Args<'a> {
    op_type: &'a str,
    args: &'a [Argument],
    /// The schema's arguments, when known: debug builds check that a kernel
    /// reads only these (a read of an undeclared name means the schema would
    /// reject a valid argument, or a kernel reads one it should not).
    declared: Option<&'static [ArgDoc]>,
}

fn arg_fields(a: &Argument) -> Vec<&'static str> {
    let mut v = Vec::new();
    if a.f.is_some() {
        v.push("f");
    }
    if a.i.is_some() {
        v.push("i");
    }
    if a.s.is_some() {
        v.push("s");
    }
    if !a.floats.is_empty() {
        v.push("floats");
    }
    if !a.ints.is_empty() {
        v.push("ints");
    }
    if !a.strings.is_empty() {
        v.push("strings");
    }
    if a.n.is_some() {
        v.push("n");
    }
    if !a.nets.is_empty() {
        v.push("nets");
    }
    if a.t.is_some() {
        v.push("t");
    }
    if !a.tensors.is_empty() {
        v.push("tensors");
    }
    v
}

impl<'a> Args<'a> {
    /// Wraps an op's arguments. The same name given twice with different
    /// values is an error (Caffe2 throws at operator construction).
    pub fn new(op_type: &'a str, args: &'a [Argument]) -> Result<Args<'a>> {
        for (k, a) in args.iter().enumerate() {
            if a.name.is_none() {
                return Err(Error::invalid_arg(format!(
                    "argument #{k} of op '{op_type}' has no name"
                )));
            }
            for b in &args[..k] {
                if b.name == a.name && b != a {
                    return Err(Error::invalid_arg(format!(
                        "argument '{}' of op '{op_type}' is given twice with different values",
                        a.name.as_deref().unwrap_or("")
                    )));
                }
            }
        }
        Ok(Args {
            op_type,
            args,
            declared: None,
        })
    }

    /// These arguments, read by a kernel whose schema declares `declared`.
    pub fn declared(self, declared: &'static [ArgDoc]) -> Args<'a> {
        Args {
            declared: Some(declared),
            ..self
        }
    }

    pub fn find(&self, name: &str) -> Option<&'a Argument> {
        if let Some(declared) = self.declared {
            debug_assert!(
                declared.iter().any(|a| a.name == name),
                "the kernel of {} reads argument '{name}', which its schema does not declare",
                self.op_type
            );
        }
        self.args.iter().find(|a| a.name.as_deref() == Some(name))
    }

    pub fn has(&self, name: &str) -> bool {
        self.find(name).is_some()
    }

    fn wrong_field(&self, name: &str, expected: &str, a: &Argument) -> Error {
        let got = arg_fields(a);
        let got = if got.is_empty() {
            "no value".to_string()
        } else {
            format!("field {}", got.join(", "))
        };
        Error::invalid_arg(format!(
            "argument '{name}' of op '{}' does not have the right field: expected field {expected}, got {got}",
            self.op_type
        ))
    }

    /// Which single-value field the argument sets ("f", "i", "s"), if any.
    pub fn field_of(&self, name: &str) -> Option<&'static str> {
        self.find(name).and_then(|a| {
            if a.f.is_some() {
                Some("f")
            } else if a.i.is_some() {
                Some("i")
            } else if a.s.is_some() {
                Some("s")
            } else {
                None
            }
        })
    }

    pub fn f32_opt(&self, name: &str) -> Result<Option<f32>> {
        match self.find(name) {
            None => Ok(None),
            Some(a) => a.f.map(Some).ok_or_else(|| self.wrong_field(name, "f", a)),
        }
    }

    pub fn f32(&self, name: &str, default: f32) -> Result<f32> {
        Ok(self.f32_opt(name)?.unwrap_or(default))
    }

    pub fn i64_opt(&self, name: &str) -> Result<Option<i64>> {
        match self.find(name) {
            None => Ok(None),
            Some(a) => a.i.map(Some).ok_or_else(|| self.wrong_field(name, "i", a)),
        }
    }

    pub fn i64(&self, name: &str, default: i64) -> Result<i64> {
        Ok(self.i64_opt(name)?.unwrap_or(default))
    }

    /// An integer argument that must fit in `T` (checked, never truncated).
    pub fn int<T: TryFrom<i64>>(&self, name: &str, default: T) -> Result<T> {
        match self.i64_opt(name)? {
            None => Ok(default),
            Some(v) => T::try_from(v).map_err(|_| {
                Error::invalid_arg(format!(
                    "argument '{name}' of op '{}' has value {v}, which does not fit its type {}",
                    self.op_type,
                    std::any::type_name::<T>()
                ))
            }),
        }
    }

    pub fn bool(&self, name: &str, default: bool) -> Result<bool> {
        Ok(self.i64_opt(name)?.map(|v| v != 0).unwrap_or(default))
    }

    pub fn bytes_opt(&self, name: &str) -> Result<Option<Vec<u8>>> {
        match self.find(name) {
            None => Ok(None),
            Some(a) => {
                a.s.clone()
                    .map(Some)
                    .ok_or_else(|| self.wrong_field(name, "s", a))
            }
        }
    }

    pub fn string_opt(&self, name: &str) -> Result<Option<String>> {
        match self.bytes_opt(name)? {
            None => Ok(None),
            Some(b) => String::from_utf8(b).map(Some).map_err(|_| {
                Error::invalid_arg(format!(
                    "argument '{name}' of op '{}' is not valid UTF-8",
                    self.op_type
                ))
            }),
        }
    }

    pub fn string(&self, name: &str, default: &str) -> Result<String> {
        Ok(self
            .string_opt(name)?
            .unwrap_or_else(|| default.to_string()))
    }

    /// A repeated argument is read from its list field. An argument given with
    /// no value at all is an empty list (Python's `[]` encodes as nothing).
    fn repeated<T: Clone + 'a>(
        &self,
        name: &str,
        field: &str,
        get: impl Fn(&'a Argument) -> &'a Vec<T>,
    ) -> Result<Option<Vec<T>>> {
        match self.find(name) {
            None => Ok(None),
            Some(a) => {
                let v = get(a);
                if v.is_empty() && !arg_fields(a).is_empty() {
                    return Err(self.wrong_field(name, field, a));
                }
                Ok(Some(v.clone()))
            }
        }
    }

    pub fn floats(&self, name: &str) -> Result<Option<Vec<f32>>> {
        self.repeated(name, "floats", |a| &a.floats)
    }

    pub fn ints(&self, name: &str) -> Result<Option<Vec<i64>>> {
        self.repeated(name, "ints", |a| &a.ints)
    }

    pub fn strings(&self, name: &str) -> Result<Option<Vec<Vec<u8>>>> {
        self.repeated(name, "strings", |a| &a.strings)
    }

    /// A list of Caffe2 dtype codes (`TensorProto.DataType`); missing is
    /// empty. UNDEFINED (0) is allowed only with `allow_undefined`.
    pub fn dtypes(&self, name: &str, allow_undefined: bool) -> Result<Vec<DataType>> {
        self.ints(name)?
            .unwrap_or_default()
            .into_iter()
            .map(|d| {
                i32::try_from(d)
                    .ok()
                    .and_then(DataType::from_i32)
                    .filter(|t| allow_undefined || *t != DataType::Undefined)
                    .ok_or_else(|| {
                        Error::invalid_arg(format!(
                            "argument '{name}' of op '{}' has an unknown data type {d}",
                            self.op_type
                        ))
                    })
            })
            .collect()
    }

    /// A list of strings that must be UTF-8 (names, paths).
    pub fn string_list(&self, name: &str) -> Result<Option<Vec<String>>> {
        match self.strings(name)? {
            None => Ok(None),
            Some(v) => v
                .into_iter()
                .map(|b| {
                    String::from_utf8(b).map_err(|_| {
                        Error::invalid_arg(format!(
                            "argument '{name}' of op '{}' is not valid UTF-8",
                            self.op_type
                        ))
                    })
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
        }
    }

    pub fn net(&self, name: &str) -> Result<Option<NetDef>> {
        match self.find(name) {
            None => Ok(None),
            Some(a) => {
                a.n.clone()
                    .map(Some)
                    .ok_or_else(|| self.wrong_field(name, "n", a))
            }
        }
    }

    pub fn tensor(&self, name: &str) -> Result<Option<TensorProto>> {
        match self.find(name) {
            None => Ok(None),
            Some(a) => {
                a.t.clone()
                    .map(Some)
                    .ok_or_else(|| self.wrong_field(name, "t", a))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::int_arg;

    #[test]
    fn no_coercion_between_fields() {
        let args = [int_arg("value", 1)];
        let a = Args::new("ConstantFill", &args).unwrap();
        let e = a.f32("value", 0.0).unwrap_err();
        assert!(
            e.message.contains("expected field f, got field i"),
            "{}",
            e.message
        );
        assert_eq!(a.i64("value", 0).unwrap(), 1);
        assert_eq!(a.i64("missing", 7).unwrap(), 7);
    }

    #[test]
    fn integer_reads_are_lossless() {
        let args = [int_arg("n", 1 << 40)];
        let a = Args::new("X", &args).unwrap();
        assert!(a.int::<i32>("n", 0).is_err());
        assert_eq!(a.int::<i64>("n", 0).unwrap(), 1 << 40);
    }

    #[test]
    fn duplicate_names_with_different_values_fail() {
        let args = [int_arg("n", 1), int_arg("n", 2)];
        assert!(Args::new("X", &args).is_err());
        let args = [int_arg("n", 1), int_arg("n", 1)];
        assert!(Args::new("X", &args).is_ok());
    }

    #[test]
    fn empty_list_reads_as_empty() {
        let args = [Argument {
            name: Some("shape".into()),
            ..Default::default()
        }];
        let a = Args::new("X", &args).unwrap();
        assert_eq!(a.ints("shape").unwrap(), Some(vec![]));
        let args = [int_arg("shape", 3)];
        let a = Args::new("X", &args).unwrap();
        assert!(a.ints("shape").is_err());
    }
}

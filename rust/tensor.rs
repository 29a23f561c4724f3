//! N-dimensional tensors over `ndarray`, one variant per dtype.
//!
//! There are no implicit casts anywhere: an op that wants `f32` and is handed
//! an `i64` tensor gets a `Type` error naming both dtypes.

use crate::error::{Error, Result};
use ndarray::{ArrayD, IxDyn};

/// Caffe2's `TensorProto.DataType` numbering (kept so plans and checkpoints
/// written by Caffe2 mean the same thing here).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum DataType {
    Undefined = 0,
    Float = 1,
    Int32 = 2,
    Byte = 3,
    String = 4,
    Bool = 5,
    Uint8 = 6,
    Int8 = 7,
    Uint16 = 8,
    Int16 = 9,
    Int64 = 10,
    Float16 = 12,
    Double = 13,
}

impl DataType {
    pub fn from_i32(v: i32) -> Option<DataType> {
        use DataType::*;
        Some(match v {
            0 => Undefined,
            1 => Float,
            2 => Int32,
            3 => Byte,
            4 => String,
            5 => Bool,
            6 => Uint8,
            7 => Int8,
            8 => Uint16,
            9 => Int16,
            10 => Int64,
            12 => Float16,
            13 => Double,
            _ => return None,
        })
    }

    /// Parses Caffe2's upper-case names ("FLOAT", "INT64", ...).
    pub fn from_name(s: &str) -> Option<DataType> {
        use DataType::*;
        Some(match s.to_ascii_uppercase().as_str() {
            "UNDEFINED" => Undefined,
            "FLOAT" => Float,
            "INT32" => Int32,
            "BYTE" => Byte,
            "STRING" => String,
            "BOOL" => Bool,
            "UINT8" => Uint8,
            "INT8" => Int8,
            "UINT16" => Uint16,
            "INT16" => Int16,
            "INT64" => Int64,
            "FLOAT16" => Float16,
            "DOUBLE" => Double,
            _ => return None,
        })
    }

    /// The short name used in messages ("float32", "int64", ...), numpy's spelling.
    pub fn name(self) -> &'static str {
        use DataType::*;
        match self {
            Undefined => "undefined",
            Float => "float32",
            Int32 => "int32",
            Byte => "byte",
            String => "string",
            Bool => "bool",
            Uint8 => "uint8",
            Int8 => "int8",
            Uint16 => "uint16",
            Int16 => "int16",
            Int64 => "int64",
            Float16 => "float16",
            Double => "float64",
        }
    }
}

impl std::fmt::Display for DataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A dense tensor. Strings are byte strings, as Caffe2's `std::string` was.
#[derive(Clone, Debug, PartialEq)]
pub enum Tensor {
    F32(ArrayD<f32>),
    F64(ArrayD<f64>),
    I32(ArrayD<i32>),
    I64(ArrayD<i64>),
    Bool(ArrayD<bool>),
    U8(ArrayD<u8>),
    I8(ArrayD<i8>),
    I16(ArrayD<i16>),
    U16(ArrayD<u16>),
    Str(ArrayD<Vec<u8>>),
}

/// Applies one expression to whichever array a tensor holds.
#[macro_export]
macro_rules! with_array {
    ($t:expr, $a:ident => $body:expr) => {
        match $t {
            $crate::tensor::Tensor::F32($a) => $body,
            $crate::tensor::Tensor::F64($a) => $body,
            $crate::tensor::Tensor::I32($a) => $body,
            $crate::tensor::Tensor::I64($a) => $body,
            $crate::tensor::Tensor::Bool($a) => $body,
            $crate::tensor::Tensor::U8($a) => $body,
            $crate::tensor::Tensor::I8($a) => $body,
            $crate::tensor::Tensor::I16($a) => $body,
            $crate::tensor::Tensor::U16($a) => $body,
            $crate::tensor::Tensor::Str($a) => $body,
        }
    };
}

/// A Rust element type that a tensor can hold.
pub trait Element: Clone + Default + Send + Sync + std::fmt::Debug + 'static {
    const DTYPE: DataType;
    fn wrap(a: ArrayD<Self>) -> Tensor;
    fn view(t: &Tensor) -> Option<&ArrayD<Self>>;
    fn view_mut(t: &mut Tensor) -> Option<&mut ArrayD<Self>>;
}

macro_rules! element {
    ($ty:ty, $var:ident, $dt:ident) => {
        impl Element for $ty {
            const DTYPE: DataType = DataType::$dt;
            fn wrap(a: ArrayD<Self>) -> Tensor {
                Tensor::$var(a)
            }
            fn view(t: &Tensor) -> Option<&ArrayD<Self>> {
                match t {
                    Tensor::$var(a) => Some(a),
                    _ => None,
                }
            }
            fn view_mut(t: &mut Tensor) -> Option<&mut ArrayD<Self>> {
                match t {
                    Tensor::$var(a) => Some(a),
                    _ => None,
                }
            }
        }
        impl From<ArrayD<$ty>> for Tensor {
            fn from(a: ArrayD<$ty>) -> Tensor {
                Tensor::$var(a)
            }
        }
    };
}

element!(f32, F32, Float);
element!(f64, F64, Double);
element!(i32, I32, Int32);
element!(i64, I64, Int64);
element!(bool, Bool, Bool);
element!(u8, U8, Uint8);
element!(i8, I8, Int8);
element!(i16, I16, Int16);
element!(u16, U16, Uint16);
element!(Vec<u8>, Str, String);

impl Tensor {
    pub fn dtype(&self) -> DataType {
        match self {
            Tensor::F32(_) => DataType::Float,
            Tensor::F64(_) => DataType::Double,
            Tensor::I32(_) => DataType::Int32,
            Tensor::I64(_) => DataType::Int64,
            Tensor::Bool(_) => DataType::Bool,
            Tensor::U8(_) => DataType::Uint8,
            Tensor::I8(_) => DataType::Int8,
            Tensor::I16(_) => DataType::Int16,
            Tensor::U16(_) => DataType::Uint16,
            Tensor::Str(_) => DataType::String,
        }
    }

    pub fn shape(&self) -> &[usize] {
        with_array!(self, a => a.shape())
    }

    pub fn ndim(&self) -> usize {
        self.shape().len()
    }

    pub fn numel(&self) -> usize {
        with_array!(self, a => a.len())
    }

    /// A tensor of default values (0, false, "") of the given dtype and shape.
    pub fn zeros(dtype: DataType, shape: &[usize]) -> Result<Tensor> {
        let s = IxDyn(shape);
        Ok(match dtype {
            DataType::Float => Tensor::F32(ArrayD::default(s)),
            DataType::Double => Tensor::F64(ArrayD::default(s)),
            DataType::Int32 => Tensor::I32(ArrayD::default(s)),
            DataType::Int64 => Tensor::I64(ArrayD::default(s)),
            DataType::Bool => Tensor::Bool(ArrayD::default(s)),
            DataType::Uint8 | DataType::Byte => Tensor::U8(ArrayD::default(s)),
            DataType::Int8 => Tensor::I8(ArrayD::default(s)),
            DataType::Int16 => Tensor::I16(ArrayD::default(s)),
            DataType::Uint16 => Tensor::U16(ArrayD::default(s)),
            DataType::String => Tensor::Str(ArrayD::default(s)),
            other => {
                return Err(Error::type_error(format!(
                    "unsupported tensor dtype {other}"
                )))
            }
        })
    }

    /// A 0-dim tensor holding one value.
    pub fn scalar<T: Element>(v: T) -> Tensor {
        T::wrap(ArrayD::from_elem(IxDyn(&[]), v))
    }

    /// Builds a tensor from a shape and flat row-major values.
    pub fn from_vec<T: Element>(shape: &[usize], values: Vec<T>) -> Result<Tensor> {
        let n: usize = shape.iter().product();
        if n != values.len() {
            return Err(Error::shape(format!(
                "shape {:?} holds {} elements but {} values were given",
                shape,
                n,
                values.len()
            )));
        }
        ArrayD::from_shape_vec(IxDyn(shape), values)
            .map(T::wrap)
            .map_err(|e| Error::shape(e.to_string()))
    }

    /// Borrows the array if the dtype is `T`, else a `Type` error naming both.
    pub fn array<T: Element>(&self) -> Result<&ArrayD<T>> {
        T::view(self).ok_or_else(|| {
            Error::type_error(format!(
                "expected a tensor of dtype {} but got {}",
                T::DTYPE,
                self.dtype()
            ))
        })
    }

    pub fn array_mut<T: Element>(&mut self) -> Result<&mut ArrayD<T>> {
        let got = self.dtype();
        T::view_mut(self).ok_or_else(|| {
            Error::type_error(format!(
                "expected a tensor of dtype {} but got {}",
                T::DTYPE,
                got
            ))
        })
    }

    /// The single element of a one-element tensor of dtype `T` (any shape).
    pub fn scalar_value<T: Element>(&self) -> Result<T> {
        let a = self.array::<T>()?;
        if a.len() != 1 {
            return Err(Error::shape(format!(
                "expected a tensor with exactly one element, got shape {:?}",
                a.shape()
            )));
        }
        Ok(a.iter().next().cloned().expect("one element"))
    }

    /// Appends `other` along dim 0 (inner dims must match).
    pub fn append_rows(&mut self, other: &Tensor) -> Result<()> {
        if self.dtype() != other.dtype() {
            return Err(Error::type_error(format!(
                "cannot append a {} tensor to a {} tensor",
                other.dtype(),
                self.dtype()
            )));
        }
        if self.ndim() == 0 || other.ndim() == 0 || self.shape()[1..] != other.shape()[1..] {
            return Err(Error::shape(format!(
                "cannot append rows of shape {:?} to a tensor of shape {:?}",
                other.shape(),
                self.shape()
            )));
        }
        macro_rules! app {
            ($a:ident, $T:ty) => {{
                let b = other.array::<$T>()?;
                $a.append(ndarray::Axis(0), b.view())
                    .map_err(|e| Error::shape(e.to_string()))
            }};
        }
        match self {
            Tensor::F32(a) => app!(a, f32),
            Tensor::F64(a) => app!(a, f64),
            Tensor::I32(a) => app!(a, i32),
            Tensor::I64(a) => app!(a, i64),
            Tensor::Bool(a) => app!(a, bool),
            Tensor::U8(a) => app!(a, u8),
            Tensor::I8(a) => app!(a, i8),
            Tensor::I16(a) => app!(a, i16),
            Tensor::U16(a) => app!(a, u16),
            Tensor::Str(a) => app!(a, Vec<u8>),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrong_dtype_names_both() {
        let t = Tensor::scalar(1i64);
        let e = t.array::<f32>().unwrap_err();
        assert_eq!(
            e.message,
            "expected a tensor of dtype float32 but got int64"
        );
        assert_eq!(t.ndim(), 0);
        assert_eq!(t.numel(), 1);
    }

    #[test]
    fn from_vec_checks_count() {
        assert!(Tensor::from_vec(&[2, 2], vec![1.0f32; 3]).is_err());
        let t = Tensor::from_vec(&[2, 2], vec![1i32, 2, 3, 4]).unwrap();
        assert_eq!(t.shape(), &[2, 2]);
    }

    #[test]
    fn append_rows_checks_inner_dims() {
        let mut a = Tensor::from_vec(&[1, 2], vec![1i32, 2]).unwrap();
        a.append_rows(&Tensor::from_vec(&[2, 2], vec![3i32, 4, 5, 6]).unwrap())
            .unwrap();
        assert_eq!(
            a,
            Tensor::from_vec(&[3, 2], vec![1, 2, 3, 4, 5, 6]).unwrap()
        );
        assert!(a
            .append_rows(&Tensor::from_vec(&[1, 3], vec![1i32, 2, 3]).unwrap())
            .is_err());
    }
}

//! Runtime values of the language (LANGUAGE.md §5.1).
//!
//! Values are immutable and cheap to clone (counted: [`Text`] for strings, `Rc` for
//! containers). Integers are
//! `i64` with transparent promotion to a big integer on overflow, so arithmetic has Python's
//! arbitrary precision. Instances are referenced by id; their state lives in the runtime.
//!
//! Values sit below everything that holds or shows one: the type system (defaults), the IR
//! (constants), the evaluator and the plugins. Their Python text forms are in [`pyfmt`].

pub mod pyfmt;
mod text;
pub use text::Text;

use std::rc::Rc;

use indexmap::IndexMap;
use num_bigint::BigInt;
use num_traits::ToPrimitive;

/// Index of an entity instance in the runtime.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstId(pub u32);

pub type Dict = IndexMap<Text, Value>;

#[derive(Clone, Debug)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    BigInt(Rc<BigInt>),
    Float(f64),
    Str(Text),
    List(Rc<Vec<Value>>),
    Dict(Rc<Dict>),
    Instance(InstId),
    /// Not known during this compile (§11).
    Unknown,
}

// held by every result variable and list element: two words
const _: () = assert!(std::mem::size_of::<Value>() == 16);

impl Value {
    pub fn str(s: &str) -> Value {
        Value::Str(Text::from(s))
    }

    pub fn string(s: String) -> Value {
        Value::Str(Text::from(s))
    }

    pub fn list(v: Vec<Value>) -> Value {
        Value::List(Rc::new(v))
    }

    /// An empty list. One per thread, shared (lists are never changed in place): every
    /// list relation nothing was added to is frozen to one, 35,000 of them at gen_model
    /// N=1,000.
    pub fn empty_list() -> Value {
        thread_local! {
            static EMPTY: Rc<Vec<Value>> = Rc::new(Vec::new());
        }
        Value::List(EMPTY.with(Rc::clone))
    }

    pub fn from_bigint(b: BigInt) -> Value {
        match b.to_i64() {
            Some(i) => Value::Int(i),
            None => Value::BigInt(Rc::new(b)),
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    pub fn is_unknown(&self) -> bool {
        matches!(self, Value::Unknown)
    }

    /// Unknown anywhere inside (lists and dicts are searched).
    pub fn contains_unknown(&self) -> bool {
        match self {
            Value::Unknown => true,
            Value::List(l) => l.iter().any(Value::contains_unknown),
            Value::Dict(d) => d.values().any(Value::contains_unknown),
            _ => false,
        }
    }

    pub fn as_instance(&self) -> Option<InstId> {
        match self {
            Value::Instance(i) => Some(*i),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// Python class name, as used in messages ("int", "str", "bool", …).
    pub fn py_type_name(&self) -> &'static str {
        match self {
            Value::Null => "NoneValue",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::BigInt(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::List(_) => "list",
            Value::Dict(_) => "dict",
            Value::Instance(_) => "Instance",
            Value::Unknown => "Unknown",
        }
    }

    pub fn is_number(&self) -> bool {
        matches!(self, Value::Int(_) | Value::BigInt(_) | Value::Float(_))
    }

    /// Numeric view for comparisons (bools count as ints, as in Python).
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Bool(b) => Some(*b as i64 as f64),
            Value::Int(i) => Some(*i as f64),
            Value::BigInt(b) => b.to_f64(),
            Value::Float(f) => Some(*f),
            _ => None,
        }
    }

    pub fn as_bigint(&self) -> Option<BigInt> {
        match self {
            Value::Bool(b) => Some(BigInt::from(*b as i64)),
            Value::Int(i) => Some(BigInt::from(*i)),
            Value::BigInt(b) => Some((**b).clone()),
            _ => None,
        }
    }
}

/// Python `==` (LANGUAGE.md §5.1): `1 == 1.0`, `true == 1`, structural containers,
/// instances by identity.
pub fn py_eq(a: &Value, b: &Value) -> bool {
    use Value::*;
    match (a, b) {
        (Null, Null) => true,
        (Unknown, Unknown) => false,
        (Str(x), Str(y)) => x == y,
        (Instance(x), Instance(y)) => x == y,
        (List(x), List(y)) => {
            x.len() == y.len() && x.iter().zip(y.iter()).all(|(p, q)| py_eq(p, q))
        }
        (Dict(x), Dict(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).map(|w| py_eq(v, w)).unwrap_or(false))
        }
        (Bool(x), Bool(y)) => x == y,
        (Int(x), Int(y)) => x == y,
        (Float(x), Float(y)) => x == y,
        _ if is_numeric(a) && is_numeric(b) => num_eq(a, b),
        _ => false,
    }
}

fn is_numeric(v: &Value) -> bool {
    matches!(
        v,
        Value::Bool(_) | Value::Int(_) | Value::BigInt(_) | Value::Float(_)
    )
}

fn num_eq(a: &Value, b: &Value) -> bool {
    use num_traits::FromPrimitive;
    match (a, b) {
        (Value::Float(x), Value::Float(y)) => x == y,
        (Value::Float(x), other) | (other, Value::Float(x)) => {
            if !x.is_finite() || x.fract() != 0.0 {
                return false;
            }
            BigInt::from_f64(*x) == other.as_bigint()
        }
        _ => a.as_bigint() == b.as_bigint(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_equality() {
        assert!(py_eq(&Value::Int(1), &Value::Float(1.0)));
        assert!(py_eq(&Value::Bool(true), &Value::Int(1)));
        assert!(!py_eq(&Value::str("1"), &Value::Int(1)));
        assert!(py_eq(
            &Value::list(vec![Value::Int(1), Value::Null]),
            &Value::list(vec![Value::Float(1.0), Value::Null])
        ));
    }
}

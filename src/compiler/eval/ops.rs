//! Operators and casts with Python semantics (LANGUAGE.md §5.4, §9.3, §9.4).
//!
//! Ints are arbitrary precision (i64 fast path, big integers on overflow); `/` always gives a
//! float; `%` and `//`-like behaviour follow Python's sign rules; bools take part in arithmetic
//! as 0/1, as they do in the reference.

use num_bigint::BigInt;
use num_traits::{Signed, ToPrimitive, Zero};

use super::{Eval, Runtime, err};
use crate::compiler::ast::BinOp;
use crate::compiler::lexer::CmpOp;
use crate::compiler::source::Span;
use crate::compiler::types::Prim;
use crate::compiler::value::Value;
use crate::compiler::value::pyfmt;

fn op_name(op: BinOp) -> &'static str {
    match op {
        BinOp::Add => "plus",
        BinOp::Sub => "minus",
        BinOp::Mul => "multiplication",
        BinOp::Div => "division",
        BinOp::Mod => "modulo",
        BinOp::Pow => "exponentiation",
        _ => "operator",
    }
}

fn is_int(v: &Value) -> bool {
    matches!(v, Value::Int(_) | Value::BigInt(_) | Value::Bool(_))
}

fn type_and_value(rt: &Runtime, v: &Value) -> String {
    format!("'{}' ({})", v.py_type_name(), pyfmt::repr(v, rt))
}

pub fn binary(rt: &Runtime, op: BinOp, a: &Value, b: &Value, span: Span) -> Eval<Value> {
    if a.is_unknown() || b.is_unknown() {
        return Ok(Value::Unknown);
    }
    if let BinOp::Cmp(c) = op {
        return compare(rt, c, a, b, span);
    }
    match (op, a, b) {
        (BinOp::Add, Value::Str(x), Value::Str(y)) => {
            let mut s = String::with_capacity(x.len() + y.len());
            s.push_str(x);
            s.push_str(y);
            return Ok(Value::string(s));
        }
        (BinOp::Add, Value::Str(_), other) => {
            return Err(err(
                "operand",
                format!(
                    "Can only concatenate str (not '{}' ({})) to str",
                    other.py_type_name(),
                    pyfmt::repr(other, rt)
                ),
                span,
            ));
        }
        _ => {}
    }
    if !(a.is_number() || matches!(a, Value::Bool(_)))
        || !(b.is_number() || matches!(b, Value::Bool(_)))
    {
        return Err(err(
            "operand",
            format!(
                "Unsupported operand type(s) for {}: {} and {}",
                op_name(op),
                type_and_value(rt, a),
                type_and_value(rt, b)
            ),
            span,
        ));
    }
    if is_int(a) && is_int(b) {
        return int_op(op, a, b, span);
    }
    let x = a.as_f64().unwrap_or(0.0);
    let y = b.as_f64().unwrap_or(0.0);
    let r = match op {
        BinOp::Add => x + y,
        BinOp::Sub => x - y,
        BinOp::Mul => x * y,
        BinOp::Div => {
            if y == 0.0 {
                return Err(err("division", "float division by zero", span));
            }
            x / y
        }
        BinOp::Mod => {
            if y == 0.0 {
                return Err(err("division", "float modulo", span));
            }
            let m = x % y;
            if m != 0.0 && (m < 0.0) != (y < 0.0) {
                m + y
            } else {
                m
            }
        }
        BinOp::Pow => {
            if x == 0.0 && y < 0.0 {
                return Err(err(
                    "division",
                    "0.0 cannot be raised to a negative power",
                    span,
                ));
            }
            x.powf(y)
        }
        _ => unreachable!(),
    };
    Ok(Value::Float(r))
}

fn int_op(op: BinOp, a: &Value, b: &Value, span: Span) -> Eval<Value> {
    // fast path
    if let (Some(x), Some(y)) = (small(a), small(b)) {
        let r = match op {
            BinOp::Add => x.checked_add(y),
            BinOp::Sub => x.checked_sub(y),
            BinOp::Mul => x.checked_mul(y),
            BinOp::Div => {
                if y == 0 {
                    return Err(err("division", "division by zero", span));
                }
                return Ok(Value::Float(x as f64 / y as f64));
            }
            BinOp::Mod => {
                if y == 0 {
                    return Err(err("division", "integer division or modulo by zero", span));
                }
                let m = x.wrapping_rem(y);
                Some(if m != 0 && (m < 0) != (y < 0) {
                    m + y
                } else {
                    m
                })
            }
            BinOp::Pow => {
                if y < 0 {
                    if x == 0 {
                        return Err(err(
                            "division",
                            "0.0 cannot be raised to a negative power",
                            span,
                        ));
                    }
                    return Ok(Value::Float((x as f64).powf(y as f64)));
                }
                u32::try_from(y).ok().and_then(|e| x.checked_pow(e))
            }
            _ => unreachable!(),
        };
        if let Some(r) = r {
            return Ok(Value::Int(r));
        }
    }
    let x = a.as_bigint().unwrap_or_default();
    let y = b.as_bigint().unwrap_or_default();
    let r = match op {
        BinOp::Add => x + y,
        BinOp::Sub => x - y,
        BinOp::Mul => x * y,
        BinOp::Div => {
            if y.is_zero() {
                return Err(err("division", "division by zero", span));
            }
            return Ok(Value::Float(
                x.to_f64().unwrap_or(f64::NAN) / y.to_f64().unwrap_or(f64::NAN),
            ));
        }
        BinOp::Mod => {
            if y.is_zero() {
                return Err(err("division", "integer division or modulo by zero", span));
            }
            let m = &x % &y;
            if !m.is_zero() && (m.is_negative() != y.is_negative()) {
                m + y
            } else {
                m
            }
        }
        BinOp::Pow => {
            if y.is_negative() {
                return Ok(Value::Float(
                    x.to_f64().unwrap_or(0.0).powf(y.to_f64().unwrap_or(0.0)),
                ));
            }
            let e = y.to_u32().unwrap_or(u32::MAX);
            if e > 1_000_000 {
                return Err(err("overflow", "exponent too large", span));
            }
            num_traits::pow(x, e as usize)
        }
        _ => unreachable!(),
    };
    Ok(Value::from_bigint(r))
}

fn small(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::Bool(b) => Some(*b as i64),
        _ => None,
    }
}

fn compare(rt: &Runtime, op: CmpOp, a: &Value, b: &Value, span: Span) -> Eval<Value> {
    use crate::compiler::value::py_eq;
    match op {
        CmpOp::Eq => return Ok(Value::Bool(py_eq(a, b))),
        CmpOp::Ne => return Ok(Value::Bool(!py_eq(a, b))),
        _ => {}
    }
    let numeric = |v: &Value| v.is_number() || matches!(v, Value::Bool(_));
    if !numeric(a) || !numeric(b) {
        return Err(err(
            "compare",
            format!(
                "Can only compare numbers. Got {} and {}",
                pyfmt::repr(a, rt),
                pyfmt::repr(b, rt)
            ),
            span,
        ));
    }
    let ord = if is_int(a) && is_int(b) {
        match (small(a), small(b)) {
            (Some(x), Some(y)) => x.cmp(&y),
            _ => a.as_bigint().cmp(&b.as_bigint()),
        }
    } else {
        match a.as_f64().partial_cmp(&b.as_f64()) {
            Some(o) => o,
            None => return Ok(Value::Bool(false)),
        }
    };
    use std::cmp::Ordering::*;
    Ok(Value::Bool(match op {
        CmpOp::Lt => ord == Less,
        CmpOp::Gt => ord == Greater,
        CmpOp::Le => ord != Greater,
        CmpOp::Ge => ord != Less,
        _ => unreachable!(),
    }))
}

fn cast_error(rt: &Runtime, v: &Value, prim: Prim, span: Span) -> super::Stop {
    err(
        "cast",
        format!(
            "Failed to cast '{}' to {}",
            pyfmt::to_str(v, rt),
            prim.name()
        ),
        span,
    )
}

/// `int(x)`, `float(x)`, `string(x)`, `bool(x)`, …
pub fn cast(rt: &Runtime, prim: Prim, v: Value, span: Span) -> Eval<Value> {
    if v.is_unknown() {
        return Ok(Value::Unknown);
    }
    match prim {
        Prim::Int => match &v {
            Value::Int(_) | Value::BigInt(_) => Ok(v),
            Value::Bool(b) => Ok(Value::Int(*b as i64)),
            Value::Float(f) => {
                if !f.is_finite() {
                    return Err(cast_error(rt, &v, prim, span));
                }
                use num_traits::FromPrimitive;
                Ok(Value::from_bigint(
                    BigInt::from_f64(f.trunc()).unwrap_or_default(),
                ))
            }
            Value::Str(s) => {
                let t = s.trim().replace('_', "");
                t.parse::<BigInt>()
                    .map(Value::from_bigint)
                    .map_err(|_| cast_error(rt, &v, prim, span))
            }
            _ => Err(cast_error(rt, &v, prim, span)),
        },
        Prim::Float | Prim::Number => match &v {
            Value::Float(_) => Ok(v),
            Value::Int(_) | Value::BigInt(_) | Value::Bool(_) => {
                Ok(Value::Float(v.as_f64().unwrap_or(0.0)))
            }
            Value::Str(s) => {
                let t = s.trim().to_ascii_lowercase();
                let parsed = match t.as_str() {
                    "inf" | "+inf" | "infinity" => Some(f64::INFINITY),
                    "-inf" | "-infinity" => Some(f64::NEG_INFINITY),
                    "nan" => Some(f64::NAN),
                    _ => t.replace('_', "").parse::<f64>().ok(),
                };
                parsed
                    .map(Value::Float)
                    .ok_or_else(|| cast_error(rt, &v, prim, span))
            }
            _ => Err(cast_error(rt, &v, prim, span)),
        },
        Prim::String => Ok(Value::string(match &v {
            Value::Bool(true) => "true".into(),
            Value::Bool(false) => "false".into(),
            other => pyfmt::to_str(other, rt),
        })),
        Prim::Bool => Ok(Value::Bool(match &v {
            Value::Null => false,
            Value::Bool(b) => *b,
            Value::Int(i) => *i != 0,
            Value::BigInt(b) => !b.is_zero(),
            Value::Float(f) => *f != 0.0,
            Value::Str(s) => !s.is_empty(),
            Value::List(l) => !l.is_empty(),
            Value::Dict(d) => !d.is_empty(),
            Value::Instance(_) => true,
            Value::Unknown => return Ok(Value::Unknown),
        })),
        Prim::List => match &v {
            Value::List(_) => Ok(v),
            Value::Str(s) => Ok(Value::list(
                s.chars().map(|c| Value::string(c.to_string())).collect(),
            )),
            Value::Dict(d) => Ok(Value::list(
                d.keys().map(|k| Value::Str(k.clone())).collect(),
            )),
            _ => Err(cast_error(rt, &v, prim, span)),
        },
        Prim::Dict => match &v {
            Value::Dict(_) => Ok(v),
            _ => Err(cast_error(rt, &v, prim, span)),
        },
    }
}

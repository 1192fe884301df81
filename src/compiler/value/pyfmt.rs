//! Python-compatible text forms of values.
//!
//! The reference compiler is Python: `std::print`, string interpolation and error messages show
//! values with Python's `repr`/`str`. LANGUAGE.md §15.4 and §9.9 pin down the differences:
//! inside containers null is `null`, bools are `True`/`False`, strings use Python quoting;
//! `print(null)` is `None`; interpolation turns integral floats into ints.

use super::{InstId, Value};

/// How instances show up in text: supplied by the runtime, which knows types and locations.
pub trait InstanceText {
    /// `repr`: `__config__::Host 7f3a…` (never rely on the address).
    fn inst_repr(&self, id: InstId) -> String;
    /// `str`: `__config__::Host (instantiated at main.cf:3)`.
    fn inst_str(&self, id: InstId) -> String;
}

/// Python `repr(float)`: shortest round-trip digits, scientific outside 1e-4 ≤ |x| < 1e16.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if f == 0.0 {
        return if f.is_sign_negative() {
            "-0.0".into()
        } else {
            "0.0".into()
        };
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "1.2345e-5"
    let sci = format!("{:e}", f);
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if negative { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let point = exp + 1; // position of the decimal point in `digits`
        let s = if point <= 0 {
            format!("0.{}{}", "0".repeat((-point) as usize), digits)
        } else if point as usize >= digits.len() {
            format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
        } else {
            format!(
                "{}.{}",
                &digits[..point as usize],
                &digits[point as usize..]
            )
        };
        format!("{sign}{s}")
    } else {
        let m = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits.clone()
        };
        let esign = if exp < 0 { "-" } else { "+" };
        format!("{sign}{m}e{esign}{:02}", exp.abs())
    }
}

/// Python `repr(str)`.
pub fn str_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..0xa0).contains(&(c as u32)) => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

pub fn int_text(v: &Value) -> String {
    match v {
        Value::Int(i) => i.to_string(),
        Value::BigInt(b) => b.to_string(),
        _ => String::new(),
    }
}

/// `repr` of a value as the reference shows it inside containers.
pub fn repr(v: &Value, names: &dyn InstanceText) -> String {
    let mut out = String::new();
    write_repr(&mut out, v, names);
    out
}

fn write_repr(out: &mut String, v: &Value, names: &dyn InstanceText) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("True"),
        Value::Bool(false) => out.push_str("False"),
        Value::Int(_) | Value::BigInt(_) => out.push_str(&int_text(v)),
        Value::Float(f) => out.push_str(&float_repr(*f)),
        Value::Str(s) => out.push_str(&str_repr(s)),
        Value::List(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, item, names);
            }
            out.push(']');
        }
        Value::Dict(d) => {
            out.push('{');
            for (i, (k, item)) in d.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&str_repr(k));
                out.push_str(": ");
                write_repr(out, item, names);
            }
            out.push('}');
        }
        Value::Instance(id) => out.push_str(&names.inst_repr(*id)),
        Value::Unknown => out.push_str("Unknown"),
    }
}

/// Python `str()` of a model value (interpolation, messages): strings bare, null as `null`.
pub fn to_str(v: &Value, names: &dyn InstanceText) -> String {
    match v {
        Value::Str(s) => s.to_string(),
        Value::Instance(id) => names.inst_str(*id),
        other => repr(other, names),
    }
}

/// The value as interpolation shows it: integral floats become ints first.
pub fn interp_str(v: &Value, names: &dyn InstanceText) -> String {
    match v {
        Value::Float(f) if f.is_finite() && f.fract() == 0.0 => integral_float_text(*f),
        other => to_str(other, names),
    }
}

/// `str(int(f))` for an integral float, exact for large magnitudes.
pub fn integral_float_text(f: f64) -> String {
    if f.abs() < 9.0e15 {
        (f as i64).to_string()
    } else {
        use num_traits::FromPrimitive;
        num_bigint::BigInt::from_f64(f)
            .map(|b| b.to_string())
            .unwrap_or_else(|| float_repr(f))
    }
}

/// What `std::print` writes for a value (LANGUAGE.md §15.4).
pub fn print_text(v: &Value, names: &dyn InstanceText) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Str(s) => s.to_string(),
        Value::List(_) | Value::Dict(_) => format!("@{}", repr(v, names)),
        Value::Instance(id) => format!("@{}", names.inst_repr(*id)),
        other => repr(other, names),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoInst;
    impl InstanceText for NoInst {
        fn inst_repr(&self, _: InstId) -> String {
            "I".into()
        }
        fn inst_str(&self, _: InstId) -> String {
            "I".into()
        }
    }

    #[test]
    fn floats_like_python() {
        assert_eq!(float_repr(2.0), "2.0");
        assert_eq!(float_repr(0.1 + 0.2), "0.30000000000000004");
        assert_eq!(float_repr(1e16), "1e+16");
        assert_eq!(float_repr(1e-5), "1e-05");
        assert_eq!(float_repr(0.0001), "0.0001");
        assert_eq!(float_repr(123456789.5), "123456789.5");
        assert_eq!(float_repr(-1.5e300), "-1.5e+300");
        assert_eq!(float_repr(1e15), "1000000000000000.0");
    }

    #[test]
    fn containers_like_python() {
        let v = Value::list(vec![
            Value::Int(1),
            Value::str("a"),
            Value::Bool(true),
            Value::Null,
            Value::Float(1.5),
            Value::str("it's"),
        ]);
        assert_eq!(
            print_text(&v, &NoInst),
            "@[1, 'a', True, null, 1.5, \"it's\"]"
        );
        assert_eq!(print_text(&Value::Null, &NoInst), "None");
        assert_eq!(interp_str(&Value::Float(2.0), &NoInst), "2");
        assert_eq!(str_repr("a\tb"), "'a\\tb'");
    }
}

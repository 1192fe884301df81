//! `std::json_dumps` / `std::json_loads` with Python's `json` module formatting.

use std::rc::Rc;

use super::{Args, PluginDef, fail, req};
use crate::compiler::value::pyfmt;
use crate::compiler::value::{Dict, Value};

/// Python `json.dumps` (default separators `, ` and `: `, ASCII-only output).
pub fn dumps(v: &Value, out: &mut String) -> Result<(), String> {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Int(_) | Value::BigInt(_) => out.push_str(&pyfmt::int_text(v)),
        Value::Float(f) => out.push_str(&if f.is_nan() {
            "NaN".to_string()
        } else if f.is_infinite() {
            if *f > 0.0 {
                "Infinity".into()
            } else {
                "-Infinity".into()
            }
        } else {
            pyfmt::float_repr(*f)
        }),
        Value::Str(s) => quote(s, out),
        Value::List(l) => {
            out.push('[');
            for (i, x) in l.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                dumps(x, out)?;
            }
            out.push(']');
        }
        Value::Dict(d) => {
            out.push('{');
            for (i, (k, x)) in d.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                quote(k, out);
                out.push_str(": ");
                dumps(x, out)?;
            }
            out.push('}');
        }
        Value::Instance(_) => {
            return Err("TypeError: Object of type Instance is not JSON serializable".into());
        }
        Value::Unknown => {
            return Err("TypeError: Object of type Unknown is not JSON serializable".into());
        }
    }
    Ok(())
}

fn quote(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{:04x}", unit));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

pub fn from_json(j: &serde_json::Value) -> Value {
    match j {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::Int(i)
            } else if let Some(u) = n.as_u64() {
                Value::from_bigint(u.into())
            } else {
                Value::Float(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Value::str(s),
        serde_json::Value::Array(a) => Value::list(a.iter().map(from_json).collect()),
        serde_json::Value::Object(o) => {
            let mut d = Dict::with_capacity(o.len());
            for (k, v) in o {
                d.insert(k.as_str().into(), from_json(v));
            }
            Value::Dict(Rc::new(d))
        }
    }
}

pub fn plugins() -> Vec<PluginDef> {
    vec![
        PluginDef {
            namespace: "std",
            name: "json_dumps",
            params: vec![req("obj", "any")],
            var_kwargs: false,
            allow_unknown: false,
            returns: "string",
            func: |_, a: &mut Args| {
                let mut out = String::new();
                dumps(&a.values[0], &mut out).map_err(|e| fail(a, "std::json_dumps", e))?;
                Ok(Value::string(out))
            },
        },
        PluginDef {
            namespace: "std",
            name: "json_loads",
            params: vec![req("s", "string")],
            var_kwargs: false,
            allow_unknown: false,
            returns: "any",
            func: |_, a: &mut Args| {
                let text = a.values[0].as_str().unwrap_or("");
                match serde_json::from_str::<serde_json::Value>(text) {
                    Ok(j) => Ok(from_json(&j)),
                    Err(e) => Err(fail(a, "std::json_loads", format!("JSONDecodeError: {e}"))),
                }
            },
        },
    ]
}

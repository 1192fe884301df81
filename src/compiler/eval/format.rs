//! Python's format-spec mini-language, for f-string fields (`{x:>10}`, `{n:05d}`, `{f:.2f}`).
//!
//! `[[fill]align][sign][#][0][width][,|_][.precision][type]`, with Python's defaults: numbers
//! align right, strings left; an empty spec is `str(value)`.

use num_bigint::BigInt;
use num_traits::{Signed, ToPrimitive};

use crate::compiler::value::Value;
use crate::compiler::value::pyfmt::{self, InstanceText};

#[derive(Default, Debug)]
struct Spec {
    fill: Option<char>,
    align: Option<char>,
    sign: Option<char>,
    alternate: bool,
    zero: bool,
    width: Option<usize>,
    grouping: Option<char>,
    precision: Option<usize>,
    ty: Option<char>,
}

fn parse_spec(s: &str) -> Result<Spec, String> {
    let chars: Vec<char> = s.chars().collect();
    let mut i = 0;
    let mut spec = Spec::default();
    let is_align = |c: char| matches!(c, '<' | '>' | '=' | '^');
    if chars.len() >= 2 && is_align(chars[1]) {
        spec.fill = Some(chars[0]);
        spec.align = Some(chars[1]);
        i = 2;
    } else if !chars.is_empty() && is_align(chars[0]) {
        spec.align = Some(chars[0]);
        i = 1;
    }
    if i < chars.len() && matches!(chars[i], '+' | '-' | ' ') {
        spec.sign = Some(chars[i]);
        i += 1;
    }
    if i < chars.len() && chars[i] == '#' {
        spec.alternate = true;
        i += 1;
    }
    if i < chars.len() && chars[i] == '0' {
        spec.zero = true;
        i += 1;
    }
    let start = i;
    while i < chars.len() && chars[i].is_ascii_digit() {
        i += 1;
    }
    if i > start {
        let w: usize = chars[start..i]
            .iter()
            .collect::<String>()
            .parse()
            .map_err(|_| "Too many decimal digits in format string")?;
        if w > 1 << 20 {
            return Err("width too large".into());
        }
        spec.width = Some(w);
    }
    if i < chars.len() && matches!(chars[i], ',' | '_') {
        spec.grouping = Some(chars[i]);
        i += 1;
    }
    if i < chars.len() && chars[i] == '.' {
        i += 1;
        let start = i;
        while i < chars.len() && chars[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return Err("Format specifier missing precision".into());
        }
        let p: usize = chars[start..i]
            .iter()
            .collect::<String>()
            .parse()
            .map_err(|_| "Too many decimal digits in format string")?;
        if p > 1 << 12 {
            return Err("precision too large".into());
        }
        spec.precision = Some(p);
    }
    if i < chars.len() {
        spec.ty = Some(chars[i]);
        i += 1;
    }
    if i < chars.len() {
        return Err("Invalid format specifier".into());
    }
    Ok(spec)
}

/// `format(value, spec)` as Python does it.
pub fn format_value(
    v: &Value,
    spec_text: &str,
    names: &dyn InstanceText,
) -> Result<String, String> {
    if spec_text.is_empty() {
        return Ok(pyfmt::to_str(v, names));
    }
    let spec = parse_spec(spec_text)?;
    match v {
        Value::Str(s) => format_str(s, &spec),
        Value::Int(_) | Value::BigInt(_) | Value::Bool(_) => {
            let b = v.as_bigint().unwrap_or_default();
            match spec.ty {
                Some('e' | 'E' | 'f' | 'F' | 'g' | 'G' | '%') => {
                    format_float(b.to_f64().unwrap_or(f64::NAN), &spec)
                }
                _ => format_int(&b, &spec),
            }
        }
        Value::Float(f) => format_float(*f, &spec),
        other => Err(format!(
            "unsupported format string passed to {}.__format__",
            other.py_type_name()
        )),
    }
}

fn pad(body: String, sign: &str, spec: &Spec, default_align: char) -> String {
    let width = spec.width.unwrap_or(0);
    let len = body.chars().count() + sign.chars().count();
    if len >= width {
        return format!("{sign}{body}");
    }
    let (fill, align) = if spec.zero && spec.align.is_none() {
        ('0', '=')
    } else {
        (
            spec.fill.unwrap_or(' '),
            spec.align.unwrap_or(default_align),
        )
    };
    let n = width - len;
    let f = |k: usize| fill.to_string().repeat(k);
    match align {
        '<' => format!("{sign}{body}{}", f(n)),
        '^' => format!("{}{sign}{body}{}", f(n / 2), f(n - n / 2)),
        '=' => format!("{sign}{}{body}", f(n)),
        _ => format!("{}{sign}{body}", f(n)),
    }
}

fn format_str(s: &str, spec: &Spec) -> Result<String, String> {
    if let Some(t) = spec.ty
        && t != 's'
    {
        return Err(format!(
            "Unknown format code '{t}' for object of type 'str'"
        ));
    }
    if spec.sign.is_some() {
        return Err("Sign not allowed in string format specifier".into());
    }
    let body: String = match spec.precision {
        Some(p) => s.chars().take(p).collect(),
        None => s.to_string(),
    };
    Ok(pad(body, "", spec, '<'))
}

fn group(digits: &str, sep: char, every: usize) -> String {
    let mut out = String::new();
    let n = digits.len();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (n - i).is_multiple_of(every) {
            out.push(sep);
        }
        out.push(c);
    }
    out
}

fn sign_text(negative: bool, spec: &Spec) -> &'static str {
    if negative {
        "-"
    } else {
        match spec.sign {
            Some('+') => "+",
            Some(' ') => " ",
            _ => "",
        }
    }
}

fn format_int(b: &BigInt, spec: &Spec) -> Result<String, String> {
    if spec.precision.is_some() {
        return Err("Precision not allowed in integer format specifier".into());
    }
    let abs = b.abs();
    let (digits, prefix) = match spec.ty {
        None | Some('d') | Some('n') => (abs.to_string(), ""),
        Some('b') => (abs.to_str_radix(2), "0b"),
        Some('o') => (abs.to_str_radix(8), "0o"),
        Some('x') => (abs.to_str_radix(16), "0x"),
        Some('X') => (abs.to_str_radix(16).to_uppercase(), "0X"),
        Some('c') => {
            let c = b
                .to_u32()
                .and_then(char::from_u32)
                .ok_or("%c arg not in range(0x110000)")?;
            return Ok(pad(c.to_string(), "", spec, '<'));
        }
        Some(t) => {
            return Err(format!(
                "Unknown format code '{t}' for object of type 'int'"
            ));
        }
    };
    let digits = match spec.grouping {
        Some(sep) => group(
            &digits,
            sep,
            if matches!(spec.ty, Some('b' | 'o' | 'x' | 'X')) {
                4
            } else {
                3
            },
        ),
        None => digits,
    };
    let sign = format!(
        "{}{}",
        sign_text(b.is_negative(), spec),
        if spec.alternate { prefix } else { "" }
    );
    Ok(pad(digits, &sign, spec, '>'))
}

fn format_float(f: f64, spec: &Spec) -> Result<String, String> {
    // -0.0 is negative too, as in Python
    let negative = f.is_sign_negative();
    let a = f.abs();
    let body = if !a.is_finite() {
        let s = if a.is_nan() { "nan" } else { "inf" };
        if matches!(spec.ty, Some('E' | 'F' | 'G')) {
            s.to_uppercase()
        } else {
            s.to_string()
        }
    } else {
        match spec.ty {
            Some('f') | Some('F') => format!("{:.*}", spec.precision.unwrap_or(6), a),
            Some('e') | Some('E') => {
                let s = sci(a, spec.precision.unwrap_or(6));
                if spec.ty == Some('E') {
                    s.to_uppercase()
                } else {
                    s
                }
            }
            Some('%') => format!("{:.*}%", spec.precision.unwrap_or(6), a * 100.0),
            Some('g') | Some('G') | Some('n') => {
                let s = general(a, spec.precision.unwrap_or(6), spec.alternate);
                if spec.ty == Some('G') {
                    s.to_uppercase()
                } else {
                    s
                }
            }
            None => match spec.precision {
                None => pyfmt::float_repr(a),
                Some(p) => {
                    let s = general(a, p.max(1), spec.alternate);
                    if s.contains(['.', 'e', 'n', 'i']) {
                        s
                    } else {
                        format!("{s}.0")
                    }
                }
            },
            Some(t) => {
                return Err(format!(
                    "Unknown format code '{t}' for object of type 'float'"
                ));
            }
        }
    };
    let body = match spec.grouping {
        Some(sep) => {
            let (int_part, rest) = match body.find(['.', 'e', '%']) {
                Some(i) => body.split_at(i),
                None => (body.as_str(), ""),
            };
            format!("{}{}", group(int_part, sep, 3), rest)
        }
        None => body,
    };
    Ok(pad(
        body,
        sign_text(
            negative && f != 0.0 || f.is_sign_negative() && f == 0.0,
            spec,
        ),
        spec,
        '>',
    ))
}

/// `%.{p}e` with Python's two-digit exponent.
fn sci(a: f64, p: usize) -> String {
    let s = format!("{:.*e}", p, a);
    let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
    let e: i32 = e.parse().unwrap_or(0);
    format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
}

/// `%g`: precision significant digits, scientific when the exponent is < -4 or >= p.
fn general(a: f64, p: usize, keep_zeros: bool) -> String {
    let p = p.max(1);
    if a == 0.0 {
        return if keep_zeros {
            format!("{:.*}", p - 1, 0.0)
        } else {
            "0".into()
        };
    }
    let exp = {
        let s = format!("{:.*e}", p - 1, a);
        s.split_once('e')
            .and_then(|(_, e)| e.parse::<i32>().ok())
            .unwrap_or(0)
    };
    let s = if exp < -4 || exp >= p as i32 {
        sci(a, p - 1)
    } else {
        format!("{:.*}", (p as i32 - 1 - exp).max(0) as usize, a)
    };
    if keep_zeros {
        return s;
    }
    // strip trailing zeros of the fraction
    let (m, e) = match s.find('e') {
        Some(i) => (s[..i].to_string(), s[i..].to_string()),
        None => (s.clone(), String::new()),
    };
    let m = if m.contains('.') {
        m.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        m
    };
    format!("{m}{e}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compiler::value::InstId;

    struct N;
    impl InstanceText for N {
        fn inst_repr(&self, _: InstId) -> String {
            String::new()
        }
        fn inst_str(&self, _: InstId) -> String {
            String::new()
        }
    }

    fn f(v: Value, s: &str) -> String {
        format_value(&v, s, &N).unwrap()
    }

    #[test]
    fn like_python() {
        assert_eq!(f(Value::Float(1.23456), ".2f"), "1.23");
        assert_eq!(f(Value::Int(42), "05d"), "00042");
        assert_eq!(f(Value::Int(-42), "05d"), "-0042");
        assert_eq!(f(Value::str("ab"), ">5"), "   ab");
        assert_eq!(f(Value::str("ab"), "*^6"), "**ab**");
        assert_eq!(f(Value::Int(1234567), ","), "1,234,567");
        assert_eq!(f(Value::Int(255), "#x"), "0xff");
        assert_eq!(f(Value::Float(1234.5), "e"), "1.234500e+03");
        assert_eq!(f(Value::Float(0.00001234), "g"), "1.234e-05");
        assert_eq!(f(Value::Float(1.5), ".3"), "1.5");
        assert_eq!(f(Value::Float(0.5), ".1%"), "50.0%");
        assert_eq!(f(Value::Int(7), ".2f"), "7.00");
        assert_eq!(f(Value::Bool(true), ">5"), "    1");
    }
}

//! String literal structure: `{{ x.y }}` interpolation and f-string replacement fields.
//!
//! Interpolation follows the reference's pattern `{{\s*([.A-Za-z0-9_-]+)\s*}}` over the decoded
//! string. F-strings follow Python's `str.format` field syntax: `{path!conv:spec}`, `{{`/`}}`
//! escapes, and one level of nested fields inside a spec.

use super::ast::{ExprKind, FField, FPiece, InterpPart, Name};
use super::diagnostics::Diagnostic;
use super::source::Span;

fn is_ref_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-')
}

/// Try to match `{{\s*path\s*}}` at `i`; returns (path, end).
fn match_interp(b: &[u8], i: usize) -> Option<(&[u8], usize)> {
    if !(b.get(i) == Some(&b'{') && b.get(i + 1) == Some(&b'{')) {
        return None;
    }
    let mut p = i + 2;
    while p < b.len() && b[p].is_ascii_whitespace() {
        p += 1;
    }
    let start = p;
    while p < b.len() && is_ref_char(b[p]) {
        p += 1;
    }
    if p == start {
        return None;
    }
    let path = &b[start..p];
    // `\s*` backtracks: trailing ref characters can't be whitespace, so no ambiguity
    while p < b.len() && b[p].is_ascii_whitespace() {
        p += 1;
    }
    if b.get(p) == Some(&b'}') && b.get(p + 1) == Some(&b'}') {
        Some((path, p + 2))
    } else {
        None
    }
}

pub fn has_interpolation(s: &str) -> bool {
    let b = s.as_bytes();
    (0..b.len()).any(|i| match_interp(b, i).is_some())
}

/// Split a decoded string literal into text and `{{ref}}` parts.
pub fn interpolation(s: &str, span: Span) -> ExprKind {
    let b = s.as_bytes();
    let mut parts = Vec::new();
    let mut text_start = 0;
    let mut i = 0;
    while i < b.len() {
        if let Some((path, end)) = match_interp(b, i) {
            if text_start < i {
                parts.push(InterpPart::Text(s[text_start..i].to_string()));
            }
            let path = std::str::from_utf8(path).unwrap_or("");
            parts.push(InterpPart::Ref(
                path.split('.')
                    .map(|p| Name {
                        text: p.to_string(),
                        span,
                    })
                    .collect(),
            ));
            i = end;
            text_start = end;
        } else {
            i += 1;
        }
    }
    if parts.is_empty() {
        return ExprKind::Str(s.to_string());
    }
    if text_start < s.len() {
        parts.push(InterpPart::Text(s[text_start..].to_string()));
    }
    ExprKind::Interpolated(parts)
}

fn fstring_error(msg: &str, span: Span) -> Diagnostic {
    Diagnostic::error("syntax", format!("Syntax error: Invalid f-string: {msg}")).at(span)
}

/// Parse the body of an f-string into literal text and replacement fields.
pub fn parse_fstring(s: &str, span: Span) -> Result<Vec<FPiece>, Diagnostic> {
    parse_format(s, span, 0)
}

fn parse_format(s: &str, span: Span, depth: usize) -> Result<Vec<FPiece>, Diagnostic> {
    let chars: Vec<char> = s.chars().collect();
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut i = 0;
    let mut escaped = false;
    while i < chars.len() {
        let c = chars[i];
        if c == '{' {
            if chars.get(i + 1) == Some(&'{') {
                text.push('{');
                i += 2;
                escaped = true;
                continue;
            }
            // find the matching close brace
            let mut level = 1;
            let mut j = i + 1;
            while j < chars.len() {
                match chars[j] {
                    '{' => level += 1,
                    '}' => {
                        level -= 1;
                        if level == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            if j >= chars.len() {
                return Err(fstring_error("expected '}' before end of string", span));
            }
            let inner: String = chars[i + 1..j].iter().collect();
            if !text.is_empty() {
                pieces.push(FPiece::Text(std::mem::take(&mut text)));
            }
            let mut field = parse_field(&inner, span, depth)?;
            field.unregistered = escaped && depth == 0;
            pieces.push(FPiece::Field(field));
            i = j + 1;
        } else if c == '}' {
            if chars.get(i + 1) == Some(&'}') {
                text.push('}');
                i += 2;
                escaped = true;
                continue;
            }
            return Err(fstring_error(
                "Single '}' encountered in format string",
                span,
            ));
        } else {
            text.push(c);
            i += 1;
        }
    }
    if !text.is_empty() {
        pieces.push(FPiece::Text(text));
    }
    Ok(pieces)
}

fn parse_field(inner: &str, span: Span, depth: usize) -> Result<FField, Diagnostic> {
    // field_name ends at the first '!' or ':' (outside brackets)
    let mut name_end = inner.len();
    let mut bracket = false;
    for (idx, c) in inner.char_indices() {
        match c {
            '[' => bracket = true,
            ']' => bracket = false,
            '!' | ':' if !bracket => {
                name_end = idx;
                break;
            }
            _ => {}
        }
    }
    let name = &inner[..name_end];
    let mut rest = &inner[name_end..];
    let mut conversion = None;
    if let Some(r) = rest.strip_prefix('!') {
        let mut it = r.chars();
        let conv = it.next().ok_or_else(|| {
            fstring_error("end of string while looking for conversion specifier", span)
        })?;
        conversion = Some(conv);
        rest = it.as_str();
        if !rest.is_empty() && !rest.starts_with(':') {
            return Err(fstring_error(
                "expected ':' after conversion specifier",
                span,
            ));
        }
    }
    let spec = match rest.strip_prefix(':') {
        Some(spec) if depth < 2 => parse_format(spec, span, depth + 1)?,
        Some(_) => return Err(fstring_error("Max string recursion exceeded", span)),
        None => Vec::new(),
    };
    let path = if name.trim().is_empty() {
        Vec::new()
    } else {
        name.split('.')
            .map(|p| Name {
                text: p.trim().to_string(),
                span,
            })
            .collect()
    };
    Ok(FField {
        path,
        unregistered: false,
        conversion,
        spec,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interp_parts() {
        match interpolation("a {{ x.y }} b {{z}}{{ bad", Span::default()) {
            ExprKind::Interpolated(parts) => assert_eq!(parts.len(), 5),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            interpolation("{{}}", Span::default()),
            ExprKind::Str(_)
        ));
        assert!(has_interpolation("{{{x}}}"));
    }

    #[test]
    fn fstring_fields() {
        let p = parse_fstring("a{x:{w}.{p}f}b{{c}}{y!r}", Span::default()).unwrap();
        assert_eq!(p.len(), 4);
        assert!(parse_fstring("{x", Span::default()).is_err());
        assert!(parse_fstring("x}", Span::default()).is_err());
    }
}

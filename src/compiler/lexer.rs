//! Lexer for the Inmanta language.
//!
//! Mirrors the reference lexer's rule order (LANGUAGE.md §3): a `matching /re/` regex token is
//! tried first, then f-strings, raw strings, identifiers, `::`, relation arrows (`--`, `->`,
//! `<-` — before comparisons, so `a<-1` is an arrow), comparisons, `+=`, comments, multi-line
//! strings, floats, ints (a leading `-` belongs to the number: `5-1` is `5` `-1`), strings,
//! operators and single-character punctuation. Anything else is an illegal character.
//!
//! The lexer never panics: every byte sequence yields tokens or one diagnostic.

use num_bigint::BigInt;

use super::diagnostics::Diagnostic;
use super::source::{FileId, Span};

#[derive(Clone, Debug, PartialEq)]
pub enum IntLit {
    Small(i64),
    Big(BigInt),
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Kw {
    Typedef,
    As,
    Entity,
    Extends,
    End,
    In,
    Implementation,
    For,
    Matching,
    Index,
    Implement,
    Using,
    When,
    And,
    Or,
    Not,
    True,
    False,
    Import,
    Is,
    Defined,
    Dict,
    Null,
    Undef,
    Parents,
    If,
    Else,
    Elif,
}

impl Kw {
    fn from_str(s: &str) -> Option<Kw> {
        Some(match s {
            "typedef" => Kw::Typedef,
            "as" => Kw::As,
            "entity" => Kw::Entity,
            "extends" => Kw::Extends,
            "end" => Kw::End,
            "in" => Kw::In,
            "implementation" => Kw::Implementation,
            "for" => Kw::For,
            "matching" => Kw::Matching,
            "index" => Kw::Index,
            "implement" => Kw::Implement,
            "using" => Kw::Using,
            "when" => Kw::When,
            "and" => Kw::And,
            "or" => Kw::Or,
            "not" => Kw::Not,
            "true" => Kw::True,
            "false" => Kw::False,
            "import" => Kw::Import,
            "is" => Kw::Is,
            "defined" => Kw::Defined,
            "dict" => Kw::Dict,
            "null" => Kw::Null,
            "undef" => Kw::Undef,
            "parents" => Kw::Parents,
            "if" => Kw::If,
            "else" => Kw::Else,
            "elif" => Kw::Elif,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kw::Typedef => "typedef",
            Kw::As => "as",
            Kw::Entity => "entity",
            Kw::Extends => "extends",
            Kw::End => "end",
            Kw::In => "in",
            Kw::Implementation => "implementation",
            Kw::For => "for",
            Kw::Matching => "matching",
            Kw::Index => "index",
            Kw::Implement => "implement",
            Kw::Using => "using",
            Kw::When => "when",
            Kw::And => "and",
            Kw::Or => "or",
            Kw::Not => "not",
            Kw::True => "true",
            Kw::False => "false",
            Kw::Import => "import",
            Kw::Is => "is",
            Kw::Defined => "defined",
            Kw::Dict => "dict",
            Kw::Null => "null",
            Kw::Undef => "undef",
            Kw::Parents => "parents",
            Kw::If => "if",
            Kw::Else => "else",
            Kw::Elif => "elif",
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Gt,
    Le,
    Ge,
}

impl CmpOp {
    pub fn as_str(self) -> &'static str {
        match self {
            CmpOp::Eq => "==",
            CmpOp::Ne => "!=",
            CmpOp::Lt => "<",
            CmpOp::Gt => ">",
            CmpOp::Le => "<=",
            CmpOp::Ge => ">=",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Tok {
    /// Lowercase-initial identifier (may contain `-`, rejected later in declared names).
    Id(String),
    /// Uppercase-initial identifier: entity names.
    Cid(String),
    Kw(Kw),
    Int(IntLit),
    Float(f64),
    /// `"…"` / `'…'`, escapes decoded; may contain `{{ }}` interpolation.
    Str(String),
    /// `"""…"""`, escapes decoded.
    Mls(String),
    /// `r"…"`: no processing at all.
    RStr(String),
    /// `f"…"`, escapes decoded, fields still to parse.
    FStr(String),
    /// `matching /…/`: the regex source between the slashes.
    Regex(String),
    Sep,
    Rel,
    Cmp(CmpOp),
    PlusEq,
    Plus,
    Minus,
    Slash,
    DoubleStar,
    Star,
    Percent,
    Colon,
    LBracket,
    RBracket,
    LParen,
    RParen,
    Assign,
    Comma,
    Dot,
    LBrace,
    RBrace,
    Question,
    Eof,
}

impl Tok {
    /// How the reference names the token in "Syntax error at token X".
    pub fn describe(&self) -> String {
        match self {
            Tok::Id(s) | Tok::Cid(s) => s.clone(),
            Tok::Kw(k) => k.as_str().to_string(),
            Tok::Int(IntLit::Small(i)) => i.to_string(),
            Tok::Int(IntLit::Big(b)) => b.to_string(),
            Tok::Float(f) => super::value::pyfmt::float_repr(*f),
            Tok::Str(s) | Tok::Mls(s) | Tok::RStr(s) | Tok::FStr(s) => s.clone(),
            Tok::Regex(r) => format!("/{r}/"),
            Tok::Sep => "::".into(),
            Tok::Rel => "--".into(),
            Tok::Cmp(c) => c.as_str().into(),
            Tok::PlusEq => "+=".into(),
            Tok::Plus => "+".into(),
            Tok::Minus => "-".into(),
            Tok::Slash => "/".into(),
            Tok::DoubleStar => "**".into(),
            Tok::Star => "*".into(),
            Tok::Percent => "%".into(),
            Tok::Colon => ":".into(),
            Tok::LBracket => "[".into(),
            Tok::RBracket => "]".into(),
            Tok::LParen => "(".into(),
            Tok::RParen => ")".into(),
            Tok::Assign => "=".into(),
            Tok::Comma => ",".into(),
            Tok::Dot => ".".into(),
            Tok::LBrace => "{".into(),
            Tok::RBrace => "}".into(),
            Tok::Question => "?".into(),
            Tok::Eof => "end of file".into(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Token {
    pub tok: Tok,
    pub span: Span,
}

/// Tokenize a whole file. Warnings (invalid escapes) are appended to `warnings`.
pub fn tokenize(
    file: FileId,
    src: &str,
    warnings: &mut Vec<Diagnostic>,
) -> Result<Vec<Token>, Diagnostic> {
    tokenize_checked(file, src, warnings, true)
}

/// Tokenize a file shipped inside this binary (the built-in modules). Its regular
/// expressions are not compiled to check them: a test does that once
/// (`builtin_regexes_compile`, in `project/builtin.rs`), where every compile would
/// otherwise pay for it (two patterns in std, a fifth of a millisecond each).
pub fn tokenize_builtin(
    file: FileId,
    src: &str,
    warnings: &mut Vec<Diagnostic>,
) -> Result<Vec<Token>, Diagnostic> {
    tokenize_checked(file, src, warnings, false)
}

/// The first token of `src` (after any space and comments) and where it ends, as
/// [`tokenize`] would lex it there; `None` when that is an error or warns.
pub fn first_token(src: &str) -> Option<Token> {
    let mut warnings = Vec::new();
    let mut lx = Lexer {
        file: FileId(0),
        src,
        b: src.as_bytes(),
        pos: 0,
        warnings: &mut warnings,
        check_regexes: true,
    };
    let t = lx.next().ok()?;
    warnings.is_empty().then_some(t)
}

fn tokenize_checked(
    file: FileId,
    src: &str,
    warnings: &mut Vec<Diagnostic>,
    check_regexes: bool,
) -> Result<Vec<Token>, Diagnostic> {
    let mut lx = Lexer {
        file,
        src,
        b: src.as_bytes(),
        pos: 0,
        warnings,
        check_regexes,
    };
    // reserved: gen_model's main.cf has more than a token per four bytes, and a vector
    // grown by doubling copies itself into fresh pages at each step
    let mut out = crate::alloc::reserved();
    let mut ahead = crate::alloc::Ahead::default();
    loop {
        let t = lx.next()?;
        let eof = t.tok == Tok::Eof;
        out.push(t);
        ahead.after_push(&out);
        if eof {
            return Ok(out);
        }
    }
}

struct Lexer<'a, 'w> {
    file: FileId,
    src: &'a str,
    b: &'a [u8],
    pos: usize,
    warnings: &'w mut Vec<Diagnostic>,
    /// Compile each `/regex/` to report a bad one here, with its span.
    check_regexes: bool,
}

fn is_id_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_'
}

fn is_id_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'-'
}

impl Lexer<'_, '_> {
    fn span(&self, start: usize, end: usize) -> Span {
        Span::new(self.file, start, end)
    }

    fn peek(&self, off: usize) -> u8 {
        *self.b.get(self.pos + off).unwrap_or(&0)
    }

    fn tok(&self, tok: Tok, start: usize) -> Token {
        Token {
            tok,
            span: self.span(start, self.pos),
        }
    }

    fn illegal(&self, at: usize) -> Diagnostic {
        let ch = self.src[at..].chars().next().unwrap_or('?');
        Diagnostic::error("syntax", format!("Syntax error: Illegal character '{ch}'"))
            .at(self.span(at, at + ch.len_utf8()))
    }

    fn next(&mut self) -> Result<Token, Diagnostic> {
        // whitespace and newlines carry no meaning
        while self.pos < self.b.len() && matches!(self.b[self.pos], b' ' | b'\t' | b'\n' | b'\r') {
            self.pos += 1;
        }
        let start = self.pos;
        if start >= self.b.len() {
            return Ok(self.tok(Tok::Eof, start));
        }
        let c = self.b[start];

        if c == b'm'
            && let Some(t) = self.try_regex(start)?
        {
            return Ok(t);
        }
        if (c == b'f' || c == b'r')
            && matches!(self.peek(1), b'"' | b'\'')
            && let Some(body) = self.scan_quoted(start + 1)
        {
            let raw = &self.src[start + 2..body - 1];
            self.pos = body;
            let tok = if c == b'f' {
                Tok::FStr(self.decode(raw, start))
            } else {
                Tok::RStr(raw.to_string())
            };
            return Ok(self.tok(tok, start));
        }
        if is_id_start(c) {
            let mut end = start + 1;
            while end < self.b.len() && is_id_char(self.b[end]) {
                end += 1;
            }
            self.pos = end;
            let word = &self.src[start..end];
            let tok = if let Some(kw) = Kw::from_str(word) {
                Tok::Kw(kw)
            } else if c.is_ascii_uppercase() {
                Tok::Cid(word.to_string())
            } else {
                Tok::Id(word.to_string())
            };
            return Ok(self.tok(tok, start));
        }
        let two = (c, self.peek(1));
        let two_tok = match two {
            (b':', b':') => Some(Tok::Sep),
            (b'-', b'-') | (b'-', b'>') | (b'<', b'-') => Some(Tok::Rel),
            (b'!', b'=') => Some(Tok::Cmp(CmpOp::Ne)),
            (b'=', b'=') => Some(Tok::Cmp(CmpOp::Eq)),
            (b'>', b'=') => Some(Tok::Cmp(CmpOp::Ge)),
            (b'<', b'=') => Some(Tok::Cmp(CmpOp::Le)),
            _ => None,
        };
        if let Some(t) = two_tok {
            self.pos += 2;
            return Ok(self.tok(t, start));
        }
        match c {
            b'<' => {
                self.pos += 1;
                return Ok(self.tok(Tok::Cmp(CmpOp::Lt), start));
            }
            b'>' => {
                self.pos += 1;
                return Ok(self.tok(Tok::Cmp(CmpOp::Gt), start));
            }
            b'+' if self.peek(1) == b'=' => {
                self.pos += 2;
                return Ok(self.tok(Tok::PlusEq, start));
            }
            b'#' => {
                self.skip_line();
                return self.next();
            }
            b'/' if self.peek(1) == b'/' => {
                self.skip_line();
                return self.next();
            }
            b'"' if self.peek(1) == b'"' && self.peek(2) == b'"' => {
                if let Some(t) = self.try_mls(start) {
                    return Ok(t);
                }
            }
            _ => {}
        }
        if let Some(t) = self.try_number(start) {
            return Ok(t);
        }
        if c == b'"' || c == b'\'' {
            if let Some(end) = self.scan_quoted(start) {
                let raw = &self.src[start + 1..end - 1];
                self.pos = end;
                let s = self.decode(raw, start);
                return Ok(self.tok(Tok::Str(s), start));
            }
            return Err(self.illegal(start));
        }
        let single = match c {
            b'+' => Tok::Plus,
            b'-' => Tok::Minus,
            b'/' => Tok::Slash,
            b'*' if self.peek(1) == b'*' => {
                self.pos += 2;
                return Ok(self.tok(Tok::DoubleStar, start));
            }
            b':' => Tok::Colon,
            b'[' => Tok::LBracket,
            b']' => Tok::RBracket,
            b'(' => Tok::LParen,
            b')' => Tok::RParen,
            b'=' => Tok::Assign,
            b',' => Tok::Comma,
            b'.' => Tok::Dot,
            b'{' => Tok::LBrace,
            b'}' => Tok::RBrace,
            b'?' => Tok::Question,
            b'*' => Tok::Star,
            b'%' => Tok::Percent,
            _ => return Err(self.illegal(start)),
        };
        self.pos += 1;
        Ok(self.tok(single, start))
    }

    fn skip_line(&mut self) {
        while self.pos < self.b.len() && self.b[self.pos] != b'\n' {
            self.pos += 1;
        }
    }

    /// `matching[\s]+/([^/\\\n]|\\.)+/`
    fn try_regex(&mut self, start: usize) -> Result<Option<Token>, Diagnostic> {
        if !self.src[start..].starts_with("matching") {
            return Ok(None);
        }
        let mut p = start + 8;
        let ws_start = p;
        while p < self.b.len() && self.b[p].is_ascii_whitespace() {
            p += 1;
        }
        if p == ws_start || p >= self.b.len() || self.b[p] != b'/' {
            return Ok(None);
        }
        let body_start = p + 1;
        let mut q = body_start;
        loop {
            if q >= self.b.len() {
                return Ok(None);
            }
            match self.b[q] {
                b'/' => break,
                b'\n' => return Ok(None),
                b'\\' => {
                    if q + 1 >= self.b.len() {
                        return Ok(None);
                    }
                    q += 2;
                }
                _ => q += 1,
            }
        }
        if q == body_start {
            return Ok(None);
        }
        let pattern = &self.src[body_start..q];
        self.pos = q + 1;
        if self.check_regexes
            && let Err(e) = fancy_regex::Regex::new(pattern)
        {
            let msg = e.to_string();
            let last = msg.lines().last().unwrap_or("").trim().to_string();
            return Err(Diagnostic::error(
                "syntax",
                format!("Syntax error: Regex error in /{pattern}/: '{last}'"),
            )
            .at(self.span(p, self.pos)));
        }
        Ok(Some(self.tok(Tok::Regex(pattern.to_string()), start)))
    }

    /// Scan a single-line quoted string starting at the quote; returns the end (after the
    /// closing quote).
    fn scan_quoted(&self, quote_at: usize) -> Option<usize> {
        let q = *self.b.get(quote_at)?;
        let mut p = quote_at + 1;
        while p < self.b.len() {
            match self.b[p] {
                c if c == q => return Some(p + 1),
                b'\n' => return None,
                b'\\' => {
                    if p + 1 >= self.b.len() || self.b[p + 1] == b'\n' {
                        return None;
                    }
                    // skip the escaped character (which may be multi-byte)
                    let ch = self.src[p + 1..].chars().next()?;
                    p += 1 + ch.len_utf8();
                }
                _ => p += 1,
            }
        }
        None
    }

    /// `"{3,5}([\s\S]*?)"{3,5}`, with the backtracking of the regex it mirrors.
    fn try_mls(&mut self, start: usize) -> Option<Token> {
        let mut run = 0;
        while self.peek(run) == b'"' && run < 5 {
            run += 1;
        }
        for open in (3..=run).rev() {
            let body_start = start + open;
            let _ = body_start;
            if let Some(rel) = self.src[body_start..].find("\"\"\"") {
                let close_at = body_start + rel;
                let mut close = 0;
                while close < 5 && self.b.get(close_at + close) == Some(&b'"') {
                    close += 1;
                }
                // the reference takes match[3:-3]: with 4 or 5 quotes, the extra ones are content
                let end = close_at + close;
                let raw = &self.src[start + 3..end - 3];
                self.pos = end;
                let s = self.decode(raw, start);
                return Some(self.tok(Tok::Mls(s), start));
            }
        }
        None
    }

    /// FLOAT `-?[0-9]*\.[0-9]+` then INT `-?[0-9]+`.
    fn try_number(&mut self, start: usize) -> Option<Token> {
        let mut p = start;
        if self.b[p] == b'-' {
            p += 1;
        }
        let int_start = p;
        while p < self.b.len() && self.b[p].is_ascii_digit() {
            p += 1;
        }
        let int_end = p;
        if p + 1 < self.b.len() + 1
            && p < self.b.len()
            && self.b[p] == b'.'
            && p + 1 < self.b.len()
            && self.b[p + 1].is_ascii_digit()
        {
            p += 1;
            while p < self.b.len() && self.b[p].is_ascii_digit() {
                p += 1;
            }
            let text = &self.src[start..p];
            let text = if text.starts_with("-.") {
                format!("-0{}", &text[1..])
            } else if text.starts_with('.') {
                format!("0{text}")
            } else {
                text.to_string()
            };
            self.pos = p;
            return Some(self.tok(Tok::Float(text.parse().unwrap_or(f64::NAN)), start));
        }
        if int_end == int_start {
            return None;
        }
        let text = &self.src[start..int_end];
        self.pos = int_end;
        let lit = match text.parse::<i64>() {
            Ok(v) => IntLit::Small(v),
            Err(_) => IntLit::Big(text.parse::<BigInt>().unwrap_or_default()),
        };
        Some(self.tok(Tok::Int(lit), start))
    }

    /// Python string-escape decoding. An unknown escape is kept as written, with a warning
    /// (as the reference does). Unlike the reference (which decodes UTF-8 bytes as latin-1),
    /// non-ASCII text is kept intact.
    fn decode(&mut self, raw: &str, token_start: usize) -> String {
        // The reference decodes string literals with Python's `unicode_escape` codec, which
        // reads the UTF-8 bytes of non-ASCII text as latin-1: "café" becomes "cafÃ©". Models
        // written for it rely on that output, so we reproduce it (raw strings are untouched).
        let widened: String;
        let raw = if raw.is_ascii() {
            raw
        } else {
            widened = raw.bytes().map(|b| b as char).collect();
            &widened
        };
        if !raw.contains('\\') {
            return raw.to_string();
        }
        let mut out = String::with_capacity(raw.len());
        let mut chars = raw.chars().peekable();
        let mut invalid = false;
        while let Some(c) = chars.next() {
            if c != '\\' {
                out.push(c);
                continue;
            }
            let Some(e) = chars.next() else {
                out.push('\\');
                break;
            };
            match e {
                '\n' => {}
                '\\' => out.push('\\'),
                '\'' => out.push('\''),
                '"' => out.push('"'),
                'a' => out.push('\x07'),
                'b' => out.push('\x08'),
                'f' => out.push('\x0c'),
                'n' => out.push('\n'),
                'r' => out.push('\r'),
                't' => out.push('\t'),
                'v' => out.push('\x0b'),
                '0'..='7' => {
                    let mut v = e.to_digit(8).unwrap_or(0);
                    for _ in 0..2 {
                        match chars.peek().and_then(|c| c.to_digit(8)) {
                            Some(d) => {
                                v = v * 8 + d;
                                chars.next();
                            }
                            None => break,
                        }
                    }
                    out.push(char::from_u32(v).unwrap_or('\u{fffd}'));
                }
                'x' | 'u' | 'U' => {
                    let n = match e {
                        'x' => 2,
                        'u' => 4,
                        _ => 8,
                    };
                    let digits: String = chars.clone().take(n).collect();
                    if digits.len() == n && digits.chars().all(|c| c.is_ascii_hexdigit()) {
                        for _ in 0..n {
                            chars.next();
                        }
                        let v = u32::from_str_radix(&digits, 16).unwrap_or(0xfffd);
                        out.push(char::from_u32(v).unwrap_or('\u{fffd}'));
                    } else {
                        invalid = true;
                        out.push('\\');
                        out.push(e);
                    }
                }
                other => {
                    invalid = true;
                    out.push('\\');
                    out.push(other);
                }
            }
        }
        if invalid {
            self.warnings.push(
                Diagnostic::warning("invalid-escape", "Invalid escape sequence in string.")
                    .at(self.span(token_start, self.pos.max(token_start + 1))),
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(src: &str) -> Vec<Tok> {
        let mut w = Vec::new();
        tokenize(FileId(0), src, &mut w)
            .unwrap()
            .into_iter()
            .map(|t| t.tok)
            .collect()
    }

    #[test]
    fn minus_belongs_to_number() {
        assert_eq!(
            toks("x = 5-1"),
            vec![
                Tok::Id("x".into()),
                Tok::Assign,
                Tok::Int(IntLit::Small(5)),
                Tok::Int(IntLit::Small(-1)),
                Tok::Eof
            ]
        );
        assert_eq!(
            toks("a - 1"),
            vec![
                Tok::Id("a".into()),
                Tok::Minus,
                Tok::Int(IntLit::Small(1)),
                Tok::Eof
            ]
        );
    }

    #[test]
    fn arrows_before_comparisons() {
        assert_eq!(toks("a<-1")[1], Tok::Rel);
        assert_eq!(toks("a <= 1")[1], Tok::Cmp(CmpOp::Le));
    }

    #[test]
    fn strings() {
        assert_eq!(toks(r#""a\tb""#)[0], Tok::Str("a\tb".into()));
        assert_eq!(toks(r#"r"a\tb""#)[0], Tok::RStr("a\\tb".into()));
        assert_eq!(toks("\"\"\"x\ny\"\"\"")[0], Tok::Mls("x\ny".into()));
        assert_eq!(toks("\"\"")[0], Tok::Str("".into()));
        assert_eq!(toks("f'{a}'")[0], Tok::FStr("{a}".into()));
    }

    #[test]
    fn regex_token() {
        assert_eq!(toks("matching /^a\\/b$/")[0], Tok::Regex("^a\\/b$".into()));
        assert_eq!(toks("matching self")[0], Tok::Kw(Kw::Matching));
    }

    #[test]
    fn illegal() {
        let mut w = Vec::new();
        let e = tokenize(FileId(0), "x = $", &mut w).unwrap_err();
        assert!(e.message.contains("Illegal character '$'"));
        let e = tokenize(FileId(0), "x = \"abc", &mut w).unwrap_err();
        assert!(e.message.contains("Illegal character '\"'"));
    }

    #[test]
    fn floats_and_ints() {
        assert_eq!(toks(".5")[0], Tok::Float(0.5));
        assert_eq!(toks("-1.25")[0], Tok::Float(-1.25));
        assert!(matches!(
            toks("123456789012345678901234")[0],
            Tok::Int(IntLit::Big(_))
        ));
    }
}

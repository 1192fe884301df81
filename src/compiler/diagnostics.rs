//! Diagnostics are data.
//!
//! The compiler never formats text for a terminal: it produces [`Diagnostic`] values (severity,
//! code, message, labelled spans, notes). The CLI renders them with the source snippet; the
//! server returns them as JSON ([`Diagnostic::resolve`] turns spans into file/line/column).

use serde::Serialize;

use super::source::{SourceMap, Span};

#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

#[derive(Clone, Debug)]
pub struct Label {
    pub span: Span,
    pub message: String,
}

#[derive(Clone, Debug)]
pub struct Diagnostic {
    pub severity: Severity,
    /// A stable short code, e.g. `syntax`, `double-set`, `not-set`; see LANGUAGE.md §13.
    pub code: &'static str,
    pub message: String,
    pub primary: Option<Label>,
    pub secondary: Vec<Label>,
    pub notes: Vec<String>,
}

impl Diagnostic {
    pub fn error(code: &'static str, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            severity: Severity::Error,
            code,
            message: message.into(),
            primary: None,
            secondary: Vec::new(),
            notes: Vec::new(),
        }
    }

    pub fn warning(code: &'static str, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            severity: Severity::Warning,
            ..Diagnostic::error(code, message)
        }
    }

    pub fn at(mut self, span: Span) -> Diagnostic {
        self.primary = Some(Label {
            span,
            message: String::new(),
        });
        self
    }

    /// Set the primary span only when none is set yet (inner errors know better).
    pub fn or_at(self, span: Span) -> Diagnostic {
        if self.primary.is_some() {
            self
        } else {
            self.at(span)
        }
    }

    pub fn with_label(mut self, span: Span, message: impl Into<String>) -> Diagnostic {
        self.secondary.push(Label {
            span,
            message: message.into(),
        });
        self
    }

    pub fn with_note(mut self, note: impl Into<String>) -> Diagnostic {
        self.notes.push(note.into());
        self
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    /// Resolve spans to positions, for JSON output and for tests.
    pub fn resolve(&self, sources: &SourceMap) -> ResolvedDiagnostic {
        let label = |l: &Label| ResolvedLabel {
            file: sources.file(l.span.file).name.clone(),
            line: sources.position(l.span).line,
            column: sources.position(l.span).column,
            end_line: sources
                .file(l.span.file)
                .line_col(l.span.end.max(l.span.start))
                .0,
            end_column: sources
                .file(l.span.file)
                .line_col(l.span.end.max(l.span.start))
                .1,
            message: l.message.clone(),
        };
        ResolvedDiagnostic {
            severity: self.severity,
            code: self.code,
            message: self.message.clone(),
            primary: self.primary.as_ref().map(label),
            secondary: self.secondary.iter().map(label).collect(),
            notes: self.notes.clone(),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct ResolvedLabel {
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub end_line: usize,
    pub end_column: usize,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// A diagnostic with its spans resolved to file/line/column: the JSON shape of `--json` and
/// of the API.
#[derive(Clone, Debug, Serialize)]
pub struct ResolvedDiagnostic {
    pub severity: Severity,
    pub code: &'static str,
    pub message: String,
    pub primary: Option<ResolvedLabel>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub secondary: Vec<ResolvedLabel>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl std::fmt::Display for ResolvedDiagnostic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sev = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        match &self.primary {
            Some(p) => write!(
                f,
                "{sev}[{}]: {} ({}:{}:{})",
                self.code, self.message, p.file, p.line, p.column
            ),
            None => write!(f, "{sev}[{}]: {}", self.code, self.message),
        }
    }
}

//! Rendering diagnostics for a terminal: `file:line:col`, the source line, a caret.

use std::io::IsTerminal;

use codespan_reporting::diagnostic::{
    Diagnostic as CsDiagnostic, Label as CsLabel, Severity as CsSeverity,
};
use codespan_reporting::files::SimpleFiles;
use codespan_reporting::term::{self, termcolor};

use crate::compiler::diagnostics::{Diagnostic, Severity};
use crate::compiler::source::SourceMap;

/// Write diagnostics to stderr, with colours when stderr is a terminal.
pub fn emit_all(sources: &SourceMap, diags: &[Diagnostic]) {
    let mut files = SimpleFiles::new();
    let ids: Vec<usize> = sources
        .files()
        .map(|(_, f)| files.add(f.name.clone(), f.text.clone()))
        .collect();
    let choice = if std::io::stderr().is_terminal() {
        termcolor::ColorChoice::Auto
    } else {
        termcolor::ColorChoice::Never
    };
    let mut out = termcolor::StandardStream::stderr(choice);
    let config = term::Config::default();
    for d in diags {
        let severity = match d.severity {
            Severity::Error => CsSeverity::Error,
            Severity::Warning => CsSeverity::Warning,
        };
        let mut cs = CsDiagnostic::new(severity)
            .with_code(d.code)
            .with_message(&d.message);
        let mut labels = Vec::new();
        if let Some(p) = &d.primary {
            let end = p.span.end.max(p.span.start + 1) as usize;
            let len = sources.file(p.span.file).text.len();
            labels.push(
                CsLabel::primary(
                    ids[p.span.file.0 as usize],
                    p.span.start as usize..end.min(len.max(p.span.start as usize)),
                )
                .with_message(&p.message),
            );
        }
        for s in &d.secondary {
            let end = s.span.end.max(s.span.start + 1) as usize;
            let len = sources.file(s.span.file).text.len();
            labels.push(
                CsLabel::secondary(
                    ids[s.span.file.0 as usize],
                    s.span.start as usize..end.min(len.max(s.span.start as usize)),
                )
                .with_message(&s.message),
            );
        }
        cs = cs.with_labels(labels).with_notes(d.notes.clone());
        if term::emit_to_write_style(&mut out, &config, &files, &cs).is_err() {
            // fall back to one plain line
            eprintln!("{}", d.resolve(sources));
        }
    }
}

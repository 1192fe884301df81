//! Source files and spans.
//!
//! Every loaded `.cf` file is registered in a [`SourceMap`] and addressed by a [`FileId`]. A
//! [`Span`] is a byte range in one file; line and column numbers (1-based, columns counted in
//! characters) are computed on demand, so spans stay 12 bytes and cheap to copy everywhere.

use std::fmt;

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct FileId(pub u32);

/// A byte range `start..end` in one source file.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Span {
    pub file: FileId,
    pub start: u32,
    pub end: u32,
}

impl Span {
    pub fn new(file: FileId, start: usize, end: usize) -> Span {
        Span {
            file,
            start: start as u32,
            end: end as u32,
        }
    }

    /// The smallest span covering both (they must be in the same file).
    pub fn to(self, other: Span) -> Span {
        Span {
            file: self.file,
            start: self.start.min(other.start),
            end: self.end.max(other.end),
        }
    }
}

/// One source file: its display name (relative to the project when possible) and text.
pub struct SourceFile {
    pub name: String,
    pub text: String,
    line_starts: Vec<u32>,
}

impl SourceFile {
    pub fn new(name: String, text: String) -> SourceFile {
        let mut line_starts = vec![0u32];
        for (i, b) in text.bytes().enumerate() {
            if b == b'\n' {
                line_starts.push(i as u32 + 1);
            }
        }
        SourceFile {
            name,
            text,
            line_starts,
        }
    }

    /// 1-based line and column (in characters) of a byte offset.
    pub fn line_col(&self, offset: u32) -> (usize, usize) {
        let line = match self.line_starts.binary_search(&offset) {
            Ok(l) => l,
            Err(l) => l - 1,
        };
        let start = self.line_starts[line] as usize;
        let end = (offset as usize).min(self.text.len());
        let col = self
            .text
            .get(start..end)
            .map(|s| s.chars().count())
            .unwrap_or(end - start);
        (line + 1, col + 1)
    }

    /// The text of a 1-based line, without its newline.
    pub fn line_text(&self, line: usize) -> &str {
        let start = self.line_starts[line - 1] as usize;
        let end = self
            .line_starts
            .get(line)
            .map(|&e| e as usize)
            .unwrap_or(self.text.len());
        self.text[start..end].trim_end_matches(['\n', '\r'])
    }
}

/// All source files of one compile.
#[derive(Default)]
pub struct SourceMap {
    files: Vec<SourceFile>,
}

/// A resolved position, for messages: `file:line:col`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Position {
    pub file: String,
    pub line: usize,
    pub column: usize,
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}

impl SourceMap {
    pub fn add(&mut self, name: String, text: String) -> FileId {
        self.files.push(SourceFile::new(name, text));
        FileId(self.files.len() as u32 - 1)
    }

    pub fn file(&self, id: FileId) -> &SourceFile {
        &self.files[id.0 as usize]
    }

    pub fn files(&self) -> impl Iterator<Item = (FileId, &SourceFile)> {
        self.files
            .iter()
            .enumerate()
            .map(|(i, f)| (FileId(i as u32), f))
    }

    pub fn position(&self, span: Span) -> Position {
        let file = self.file(span.file);
        let (line, column) = file.line_col(span.start);
        Position {
            file: file.name.clone(),
            line,
            column,
        }
    }

    /// `file:line` as the reference compiler writes locations in messages.
    pub fn short_location(&self, span: Span) -> String {
        let file = self.file(span.file);
        let (line, _) = file.line_col(span.start);
        format!("{}:{}", file.name, line)
    }

    pub fn snippet(&self, span: Span) -> &str {
        let file = self.file(span.file);
        file.text
            .get(span.start as usize..span.end as usize)
            .unwrap_or("")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_column() {
        let f = SourceFile::new("m.cf".into(), "ab\ncé d\n".into());
        assert_eq!(f.line_col(0), (1, 1));
        assert_eq!(f.line_col(3), (2, 1));
        // 'd' is after a two-byte character: column counts characters
        assert_eq!(f.line_col(7), (2, 4));
        assert_eq!(f.line_text(2), "cé d");
    }
}

//! Lexer + parser on arbitrary bytes: any input must give a syntax tree or a diagnostic,
//! never a panic or a stack overflow.
#![no_main]

use libfuzzer_sys::fuzz_target;
use steward::compiler::{lexer, parser, source::FileId};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mut warnings = Vec::new();
    if let Ok(tokens) = lexer::tokenize(FileId(0), text, &mut warnings) {
        let _ = parser::parse(&tokens);
    }
});

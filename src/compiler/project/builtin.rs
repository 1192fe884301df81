//! The files of the built-in modules (`std`, `fs`, `exec`, `mitogen`), compiled into the
//! binary.

/// A built-in module file: (module, path inside the module, content).
pub(super) static BUILTIN: &[(&str, &str, &str)] = &[
    (
        "std",
        "module.yml",
        include_str!("../builtin/std/module.yml"),
    ),
    (
        "std",
        "model/_init.cf",
        include_str!("../builtin/std/model/_init.cf"),
    ),
    (
        "std",
        "model/testing.cf",
        include_str!("../builtin/std/model/testing.cf"),
    ),
    (
        "std",
        "templates/host_uri.j2",
        include_str!("../builtin/std/templates/host_uri.j2"),
    ),
    ("fs", "module.yml", include_str!("../builtin/fs/module.yml")),
    (
        "fs",
        "model/_init.cf",
        include_str!("../builtin/fs/model/_init.cf"),
    ),
    (
        "exec",
        "module.yml",
        include_str!("../builtin/exec/module.yml"),
    ),
    (
        "exec",
        "model/_init.cf",
        include_str!("../builtin/exec/model/_init.cf"),
    ),
    (
        "mitogen",
        "module.yml",
        include_str!("../builtin/mitogen/module.yml"),
    ),
    (
        "mitogen",
        "model/_init.cf",
        include_str!("../builtin/mitogen/model/_init.cf"),
    ),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compiler::lexer::{Tok, tokenize};
    use crate::compiler::source::FileId;

    /// Built-in modules are tokenized without compiling their regular expressions
    /// ([`crate::compiler::lexer::tokenize_builtin`]): this is the check every compile would otherwise make, and the
    /// one their typedefs make at their first use.
    #[test]
    fn builtin_regexes_compile() {
        let mut seen = 0;
        for (module, path, text) in BUILTIN {
            if !path.ends_with(".cf") {
                continue;
            }
            let tokens = tokenize(FileId(0), text, &mut Vec::new())
                .unwrap_or_else(|d| panic!("{module}/{path}: {}", d.message));
            for t in tokens {
                if let Tok::Regex(pattern) = t.tok {
                    let cell = std::sync::OnceLock::new();
                    crate::compiler::types::compiled_regex(&pattern, &cell)
                        .unwrap_or_else(|e| panic!("{module}/{path}: {e}"));
                    seen += 1;
                }
            }
        }
        // std's non_empty_string and hoststring: the test must have looked at something
        assert!(
            seen >= 2,
            "{seen} regular expressions in the built-in modules"
        );
    }
}

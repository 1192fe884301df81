//! The exec module's plugins (inmanta-module-exec 2.1.1): building command lines.

use super::{Args, Caller, Outcome, PluginDef, fail, req};
use crate::compiler::value::Value;

pub fn plugins() -> Vec<PluginDef> {
    vec![
        PluginDef {
            namespace: "exec",
            name: "in_shell",
            params: vec![req("command", "string")],
            var_kwargs: false,
            allow_unknown: false,
            returns: "string",
            func: |_, a| {
                let command = a.values[0].as_str().unwrap_or("");
                Ok(Value::string(list2cmdline(&["sh", "-c", command])))
            },
        },
        PluginDef {
            namespace: "exec",
            name: "shlex_join",
            params: vec![req("cmd", "string[]")],
            var_kwargs: false,
            allow_unknown: false,
            returns: "string",
            func: shlex_join,
        },
    ]
}

fn shlex_join(_: &mut dyn Caller, a: &mut Args) -> Outcome<Value> {
    let Value::List(items) = &a.values[0] else {
        return Err(fail(a, "exec::shlex_join", "TypeError: cmd is not a list"));
    };
    let words: Vec<String> = items
        .iter()
        .map(|v| shlex_quote(v.as_str().unwrap_or("")))
        .collect();
    Ok(Value::string(words.join(" ")))
}

/// Python's `shlex.quote`.
fn shlex_quote(s: &str) -> String {
    if s.is_empty() {
        return "''".into();
    }
    let safe = |c: char| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c);
    if s.chars().all(safe) {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', "'\"'\"'"))
}

/// Python's `subprocess.list2cmdline` (the MS C runtime's quoting rules).
fn list2cmdline(args: &[&str]) -> String {
    let mut out = String::new();
    for arg in args {
        if !out.is_empty() {
            out.push(' ');
        }
        let needquote = arg.is_empty() || arg.contains([' ', '\t']);
        if needquote {
            out.push('"');
        }
        let mut backslashes = 0;
        for c in arg.chars() {
            match c {
                '\\' => backslashes += 1,
                '"' => {
                    out.push_str(&"\\".repeat(backslashes * 2));
                    backslashes = 0;
                    out.push_str("\\\"");
                }
                c => {
                    out.push_str(&"\\".repeat(backslashes));
                    backslashes = 0;
                    out.push(c);
                }
            }
        }
        out.push_str(&"\\".repeat(backslashes));
        if needquote {
            out.push_str(&"\\".repeat(backslashes));
            out.push('"');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{list2cmdline, shlex_quote};

    #[test]
    fn in_shell_quotes_as_list2cmdline() {
        // expected values from Python 3.11's subprocess.list2cmdline(["sh", "-c", command])
        for (command, expected) in [
            ("ls", "sh -c ls"),
            ("ls -l /tmp", "sh -c \"ls -l /tmp\""),
            ("", "sh -c \"\""),
            ("echo\"x", "sh -c echo\\\"x"),
            ("a\\\\\"b c", "sh -c \"a\\\\\\\\\\\"b c\""),
            ("trail\\ x\\", "sh -c \"trail\\ x\\\\\""),
            ("no\\space\\", "sh -c no\\space\\"),
        ] {
            assert_eq!(list2cmdline(&["sh", "-c", command]), expected, "{command}");
        }
    }

    #[test]
    fn shlex_join_quotes_as_python() {
        // expected values from Python 3.11's shlex.quote
        for (word, expected) in [
            ("", "''"),
            ("plain-word_1.2/x:y,z@%+=", "plain-word_1.2/x:y,z@%+="),
            ("two words", "'two words'"),
            ("it's", "'it'\"'\"'s'"),
            ("$HOME", "'$HOME'"),
            ("é", "'é'"),
        ] {
            assert_eq!(shlex_quote(word), expected, "{word}");
        }
    }
}

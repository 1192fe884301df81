//! Plugins that read the files of modules and the project's data directory: std's and fs's
//! `source`, `file` and `list_files`; std's `password`, `generate_password` and `unique_file`.

use super::{Args, Caller, Default, Outcome, PluginDef, fail, opt, req};
use crate::compiler::value::Value;

fn s(a: &Args, i: usize) -> &str {
    a.values[i].as_str().unwrap_or("")
}

fn def(namespace: &'static str, name: &'static str, func: super::PluginFn) -> PluginDef {
    PluginDef {
        namespace,
        name,
        params: vec![req("path", "string")],
        var_kwargs: false,
        allow_unknown: false,
        returns: if name == "list_files" {
            "list"
        } else {
            "string"
        },
        func,
    }
}

pub fn plugins() -> Vec<PluginDef> {
    vec![
        def("std", "source", |c, a| source(c, a, "std::source")),
        def("std", "file", |c, a| file(c, a, "std::file")),
        def("std", "list_files", |c, a| {
            list_files(c, a, "std::list_files")
        }),
        def("fs", "source", |c, a| source(c, a, "fs::source")),
        def("fs", "file", |c, a| file(c, a, "fs::file")),
        def("fs", "list_files", |c, a| {
            list_files(c, a, "fs::list_files")
        }),
        PluginDef {
            namespace: "std",
            name: "password",
            params: vec![req("pw_id", "string")],
            var_kwargs: false,
            allow_unknown: false,
            returns: "string",
            func: password,
        },
        PluginDef {
            namespace: "std",
            name: "generate_password",
            params: vec![
                req("pw_id", "string"),
                opt("length", "int", Default::Int(20)),
            ],
            var_kwargs: false,
            allow_unknown: false,
            returns: "string",
            func: generate_password,
        },
        PluginDef {
            namespace: "std",
            name: "unique_file",
            params: vec![
                req("prefix", "string"),
                req("seed", "string"),
                req("suffix", "string"),
                opt("length", "int", Default::Int(20)),
            ],
            var_kwargs: false,
            allow_unknown: false,
            returns: "string",
            func: |_, a| {
                // as std 8.1.0: the md5 of the seed in hex; `length` is accepted and unused
                use md5::Digest;
                let hex = hex::encode(md5::Md5::digest(s(a, 1).as_bytes()));
                Ok(Value::string(format!("{}{hex}{}", s(a, 0), s(a, 2))))
            },
        },
    ]
}

/// The text of a module file.
fn source(c: &mut dyn Caller, a: &mut Args, plugin: &str) -> Outcome<Value> {
    let (module, rest) = resolve_module_path(c, s(a, 0), a, plugin)?;
    match c.host().module_file(&module, "files", &rest) {
        Ok((content, _)) => Ok(Value::string(content)),
        Err(e) => Err(fail(a, plugin, e)),
    }
}

/// A marker for a module file, as the reference's `FileMarker`: the string
/// `imp-module-source:file://<absolute path>`, which the export of an `fs::File` replaces by
/// the file's content.
fn file(c: &mut dyn Caller, a: &mut Args, plugin: &str) -> Outcome<Value> {
    let (module, rest) = resolve_module_path(c, s(a, 0), a, plugin)?;
    match c.host().module_file(&module, "files", &rest) {
        Ok((content, abs)) => {
            let marker = format!("imp-module-source:file://{abs}");
            c.host().remember_file(&marker, &content);
            Ok(Value::string(marker))
        }
        Err(e) => Err(fail(a, plugin, e)),
    }
}

/// The names of the files in a directory of a module's `files/`, sorted (the reference gives
/// them in `os.listdir` order, which the filesystem decides). `mymod` alone is the module's
/// `files/` itself.
fn list_files(c: &mut dyn Caller, a: &mut Args, plugin: &str) -> Outcome<Value> {
    let path = s(a, 0).to_string();
    let (module, rest) = if path.contains('/') {
        resolve_module_path(c, &path, a, plugin)?
    } else {
        (path, String::new())
    };
    match c.host().list_module_files(&module, "files", &rest) {
        Ok(names) => Ok(Value::list(names.into_iter().map(Value::string).collect())),
        Err(e) => Err(fail(a, plugin, e)),
    }
}

/// Where std's passwords are kept, relative to the project (the reference's data dir of the
/// std plugins).
const PASSWORD_FILE: &str = "passwordfile.txt";

/// The `id=password` records of the password file, in file order.
fn read_passwords(c: &mut dyn Caller, a: &Args, plugin: &str) -> Outcome<Vec<(String, String)>> {
    let text = match c.host().read_data_file("std", PASSWORD_FILE) {
        Ok(t) => t.unwrap_or_default(),
        Err(e) => return Err(fail(a, plugin, e)),
    };
    let mut records: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.chars().count() <= 2 {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(fail(a, plugin, "ValueError: substring not found"));
        };
        let (k, v) = (k.trim().to_string(), v.trim().to_string());
        match records.iter_mut().find(|(key, _)| *key == k) {
            Some(r) => r.1 = v,
            None => records.push((k, v)),
        }
    }
    Ok(records)
}

fn check_id(a: &Args, plugin: &str) -> Outcome<String> {
    let id = s(a, 0).to_string();
    if id.contains('=') {
        return Err(fail(
            a,
            plugin,
            "Exception: The password id cannot contain =",
        ));
    }
    Ok(id)
}

/// A password kept in `data/std/passwordfile.txt` of the project; an error when absent.
fn password(c: &mut dyn Caller, a: &mut Args) -> Outcome<Value> {
    let id = check_id(a, "std::password")?;
    let records = read_passwords(c, a, "std::password")?;
    match records.into_iter().find(|(k, _)| *k == id) {
        Some((_, v)) => Ok(Value::string(v)),
        None => Err(fail(
            a,
            "std::password",
            format!("Exception: Password {id} does not exist in file data/std/{PASSWORD_FILE}"),
        )),
    }
}

/// The password kept under this id in `data/std/passwordfile.txt`, or a new one (letters and
/// digits) that is kept there for `std::password` and the next compiles, as the reference.
///
/// The reference draws a new password at random. Steward's server compiles each commit in a
/// fresh checkout, where a random password would change (and be redeployed) on every compile
/// unless the file is committed; so a new password stays derived from its id, as Steward's
/// `generate_password` always did (length at most 64).
fn generate_password(c: &mut dyn Caller, a: &mut Args) -> Outcome<Value> {
    let id = check_id(a, "std::generate_password")?;
    let mut records = read_passwords(c, a, "std::generate_password")?;
    if let Some((_, v)) = records.iter().find(|(k, _)| *k == id) {
        return Ok(Value::string(v.clone()));
    }
    let length = match &a.values[1] {
        Value::Int(n) => *n,
        _ => 20,
    };
    let pw = derived_password(&id, length);
    records.push((id, pw.clone()));
    let text: String = records.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
    if let Err(e) = c.host().write_data_file("std", PASSWORD_FILE, &text) {
        return Err(fail(a, "std::generate_password", e));
    }
    Ok(Value::string(pw))
}

/// A password derived from its id: `length` (1 to 64) letters and digits from its sha256.
fn derived_password(id: &str, length: i64) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(id.as_bytes());
    let alphabet = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    (0..length.clamp(1, 64) as usize)
        .map(|i| alphabet[digest[i % 32] as usize % alphabet.len()] as char)
        .collect()
}

/// `module/path` (or `./path` for the calling module) into (module, path).
pub fn resolve_module_path(
    c: &dyn Caller,
    path: &str,
    a: &Args,
    plugin: &str,
) -> Outcome<(String, String)> {
    if let Some(rest) = path.strip_prefix("./") {
        // the module of the file the call is written in
        let file = a.span.file;
        let module = c
            .program()
            .namespaces
            .iter()
            .find(|n| n.file == Some(file))
            .map(|n| n.module.clone())
            .unwrap_or_default();
        return Ok((module, rest.to_string()));
    }
    match path.split_once('/') {
        Some((m, rest)) => Ok((m.to_string(), rest.to_string())),
        None => Err(fail(
            a,
            plugin,
            format!("{path} is not of the form <module>/<path>"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::derived_password;

    #[test]
    fn derived_passwords_are_those_steward_always_made() {
        // the values of the earlier generate_password, so that models keep their passwords
        let pw = derived_password("db", 20);
        assert_eq!(pw, "9ILxRqbi6Qw83ZmCTo7R");
        assert!(pw.chars().all(|c| c.is_ascii_alphanumeric()), "{pw}");
        assert_eq!(pw, derived_password("db", 20));
        assert_ne!(pw, derived_password("other", 20));
        assert_eq!(derived_password("db", 100).len(), 64);
        assert_eq!(derived_password("db", 0).len(), 1);
    }
}

//! Python environments made from a project's `requirements.txt`: where Inmanta projects keep
//! their modules (V2 modules are `inmanta-module-<name>` packages) and their plugins' Python
//! dependencies.
//!
//! An environment is a virtualenv created with `python3 -m venv` and filled with
//! `pip install -r`. It is marked, once complete, with the key of what it was made from (the
//! requirements' text and the base interpreter's version), so the same requirements reuse it
//! and changed ones rebuild it; a half-made one (a crash, a failed install) is never used.
//! Two processes making the same environment wait for each other (a lock file beside it).
//!
//! Used by `steward project install` (`<project>/.steward/venv`) and by the git-following
//! server, which keeps one environment per key under its data directory so that commits with
//! the same requirements share it.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

pub mod reap;

/// The marker inside a complete environment: the key it was made for.
const MARKER: &str = ".steward-requirements";

#[derive(Debug, thiserror::Error)]
pub enum PyEnvError {
    #[error("can not run {python}: {error} (is Python 3 installed? --python names another)")]
    NoPython { python: String, error: String },
    #[error("{what} failed (exit status {code:?}):\n{output}")]
    Failed {
        what: String,
        code: Option<i32>,
        output: String,
    },
    #[error("{what} {}: {error}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> PyEnvError {
    let path = path.to_path_buf();
    move |error| PyEnvError::Io { what, path, error }
}

/// How to make an environment.
#[derive(Clone, Debug)]
pub struct InstallOptions {
    /// The interpreter the environment is made with.
    pub base_python: String,
    /// Install wheels only (`--only-binary :all:`): installing then runs no code from the
    /// packages (an sdist's build would). The server always asks for it.
    pub only_binary: bool,
    /// Run pip in a sandbox (the server does, for commits).
    pub sandbox: Option<Sandboxed>,
    /// Steward stands in for inmanta-core ([`PROVIDED_CORE`]): pip gets a package of that
    /// name holding nothing but the dependencies modules' code imports, so that requiring an
    /// Inmanta module does not install inmanta-core's server (and, wheels only, does not
    /// fail on its dependencies that have no wheel, such as `crontab`).
    pub provide_core: bool,
}

/// The inmanta-core version Steward's `inmanta` package stands in for, as pip sees it when
/// [`InstallOptions::provide_core`]: a local version, so that it is the one pip picks and it
/// satisfies every `inmanta-core` requirement of the modules that 14.0.0 satisfies.
pub const PROVIDED_CORE: &str = "14.0.0+steward";

/// What inmanta-core 14 installs that modules import without requiring it themselves (the
/// fs module's `json_file` and the files module import `yaml`), by import name, with
/// inmanta-core 14.0.0's own requirement of it. Inmanta runs every module where inmanta-core
/// is installed, so these are what an environment of Steward's must hold in its place.
pub const FROM_INMANTA_CORE: &[(&str, &str)] = &[
    ("dateutil", "python-dateutil~=2.0"),
    ("jinja2", "jinja2~=3.0"),
    ("more_itertools", "more-itertools>=8,<11"),
    ("packaging", "packaging>=21.3"),
    ("pydantic", "pydantic~=2.5"),
    ("ruamel", "ruamel.yaml~=0.17"),
    ("toml", "toml~=0.10"),
    ("typing_inspect", "typing-inspect~=0.9"),
    ("yaml", "pyyaml~=6.0"),
];

/// Python that writes the stand-in wheel of inmanta-core (argv: directory, version, then
/// its requirements): metadata only, nothing to import.
const PROVIDED_CORE_WHEEL: &str = r#"
import base64, hashlib, os, sys, zipfile
out, version, requires = sys.argv[1], sys.argv[2], sys.argv[3:]
info = f"inmanta_core-{version}.dist-info"
NL = chr(10)
metadata = ["Metadata-Version: 2.1", "Name: inmanta-core", "Version: " + version,
            "Summary: stands in for inmanta-core: Steward provides its Python API"]
metadata += ["Requires-Dist: " + r for r in requires]
files = {
    f"{info}/METADATA": NL.join(metadata) + NL,
    f"{info}/WHEEL": NL.join(["Wheel-Version: 1.0", "Generator: steward", "Root-Is-Purelib: true", "Tag: py3-none-any"]) + NL,
}
record = []
for name, text in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
    record.append(f"{name},sha256={digest},{len(text.encode())}")
record.append(f"{info}/RECORD,,")
files[f"{info}/RECORD"] = NL.join(record) + NL
path = os.path.join(out, f"inmanta_core-{version}-py3-none-any.whl")
with zipfile.ZipFile(path, "w") as z:
    for name, text in files.items():
        z.writestr(zipfile.ZipInfo(name, (2020, 1, 1, 0, 0, 0)), text)
"#;

/// Write the stand-in of inmanta-core into `dir` (a wheel directory for `--find-links`) and
/// a constraints file that makes pip take it; returns the constraints file.
fn provide_core(dir: &Path, base_python: &str) -> Result<PathBuf, PyEnvError> {
    std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
    let mut output = String::new();
    run(
        Command::new(base_python)
            .arg("-c")
            .arg(PROVIDED_CORE_WHEEL)
            .arg(dir)
            .arg(PROVIDED_CORE)
            .args(FROM_INMANTA_CORE.iter().map(|(_, r)| *r)),
        "writing the stand-in of inmanta-core",
        &mut output,
    )?;
    let constraints = dir.join("constraints.txt");
    std::fs::write(&constraints, format!("inmanta-core=={PROVIDED_CORE}\n"))
        .map_err(io("writing", &constraints))?;
    Ok(constraints)
}

impl Default for InstallOptions {
    fn default() -> Self {
        InstallOptions {
            base_python: "python3".into(),
            only_binary: false,
            sandbox: None,
            provide_core: false,
        }
    }
}

/// How pip runs when what it installs was chosen by someone the server does not trust (a
/// commit's `requirements.txt`): jailed, with only the given environment, and, with an
/// identity, as that identity; the finished environment is then given to root and left
/// read-only to the identity's group, so no later compile can change what it holds.
#[derive(Clone, Debug)]
pub struct Sandboxed {
    pub jail: crate::sandbox::Jail,
    pub identity: Option<crate::sandbox::Identity>,
    /// The whole environment pip sees (`HOME`, `TMPDIR` and `PIP_CACHE_DIR` included).
    pub env: Vec<(String, std::ffi::OsString)>,
}

/// What [`ensure`] did.
#[derive(Debug)]
pub struct Ensured {
    /// The environment's directory (`bin/python3` inside).
    pub dir: PathBuf,
    /// Made now (false: it was there, complete, for the same key).
    pub created: bool,
    /// What venv and pip printed.
    pub output: String,
    pub key: String,
    /// Held while this value lives: reapers leave the environment alone.
    pub in_use: reap::InUse,
}

impl Ensured {
    pub fn python(&self) -> PathBuf {
        python_of(&self.dir)
    }
}

/// The interpreter of the environment at `dir`.
pub fn python_of(dir: &Path) -> PathBuf {
    dir.join("bin").join("python3")
}

/// The version line of an interpreter (`Python 3.11.7`), asked once per process.
pub fn python_version(python: &str) -> Result<String, PyEnvError> {
    static SEEN: Mutex<Option<HashMap<String, String>>> = Mutex::new(None);
    if let Some(v) = SEEN.lock().unwrap().as_ref().and_then(|m| m.get(python)) {
        return Ok(v.clone());
    }
    let v = ask_version(python)?;
    SEEN.lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .insert(python.to_string(), v.clone());
    Ok(v)
}

fn ask_version(python: &str) -> Result<String, PyEnvError> {
    let out = Command::new(python)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| PyEnvError::NoPython {
            python: python.into(),
            error: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(PyEnvError::NoPython {
            python: python.into(),
            error: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    Ok(text.trim().to_string())
}

/// The key of an environment made from `requirements` (its text, line endings and blank
/// lines aside) with an interpreter of `python_version`, hex.
pub fn key(requirements: &str, python_version: &str) -> String {
    let mut h = Sha256::new();
    h.update(python_version.as_bytes());
    h.update([0]);
    for line in normalized(requirements) {
        h.update(line.as_bytes());
        h.update([b'\n']);
    }
    hex::encode(h.finalize())
}

/// The requirement lines of a requirements file as pip reads them: continuation lines
/// joined, comments, blank lines and surrounding space dropped, inner space collapsed. Two
/// files that differ only in those ways make the same environment.
pub fn normalized(requirements: &str) -> Vec<String> {
    logical_lines(requirements)
        .into_iter()
        .map(|(_, line)| {
            without_comment(&line)
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        })
        .filter(|l| !l.is_empty())
        .collect()
}

/// The lines of a requirements file as pip reads them, each with the number of its first
/// physical line: a line ending in `\` continues on the next (joined first, as pip does).
fn logical_lines(requirements: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (i, raw) in requirements.lines().enumerate() {
        let (first, mut text) = pending.take().unwrap_or((i + 1, String::new()));
        let line = raw.trim_end();
        match line.strip_suffix('\\') {
            Some(cont) => {
                text.push_str(cont);
                text.push(' ');
                pending = Some((first, text));
            }
            None => {
                text.push_str(line);
                out.push((first, text));
            }
        }
    }
    out.extend(pending);
    out
}

/// `line` without its comment: a `#` at its start or after white space starts one (pip's
/// rule).
fn without_comment(line: &str) -> &str {
    let at = line
        .char_indices()
        .find(|&(i, c)| c == '#' && (i == 0 || line[..i].ends_with(char::is_whitespace)))
        .map(|(i, _)| i);
    at.map_or(line, |i| &line[..i])
}

/// A line of a requirements file the server refuses.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "requirements.txt:{line}: {reason}; only plain requirements are accepted \
     (name[extras] version-specifier ; marker, optionally --hash=...): `{text}`"
)]
pub struct RefusedRequirement {
    /// 1-based line number in the file.
    pub line: usize,
    /// The line (cut at 120 characters).
    pub text: String,
    pub reason: &'static str,
}

/// Check that `requirements` holds only plain requirements (PEP 508 names with extras,
/// version specifiers and markers, optionally `--hash=alg:hex` options): no pip options
/// (`-r`, `-c`, `-e`, `--index-url`, `-f`, `--trusted-host`, …), no paths, no URLs, no VCS
/// references. Whatever pip could be made to read, build or fetch beyond the configured index
/// is refused here, before pip runs. The first refused line is named.
pub fn check_plain(requirements: &str) -> Result<(), RefusedRequirement> {
    for (line, text) in logical_lines(requirements) {
        check_line(&text).map_err(|reason| RefusedRequirement {
            line,
            text: text.trim().chars().take(120).collect(),
            reason,
        })?;
    }
    Ok(())
}

/// Whether every word of a marker outside its quoted strings is a marker variable or
/// operator (PEP 508).
fn marker_words_known(marker: &str) -> bool {
    const KNOWN: &[&str] = &[
        "python_version",
        "python_full_version",
        "os_name",
        "sys_platform",
        "platform_release",
        "platform_system",
        "platform_version",
        "platform_machine",
        "platform_python_implementation",
        "implementation_name",
        "implementation_version",
        "extra",
        "and",
        "or",
        "in",
        "not",
    ];
    let mut outside = String::new();
    let mut quote = None;
    for c in marker.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '\'' || c == '"' => quote = Some(c),
            None => outside.push(c),
        }
    }
    quote.is_none()
        && outside
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
            .filter(|w| w.starts_with(|c: char| c.is_ascii_alphabetic()))
            .all(|w| KNOWN.contains(&w))
}

fn check_line(text: &str) -> Result<(), &'static str> {
    let code = without_comment(text).trim();
    if code.is_empty() {
        return Ok(());
    }
    if code.starts_with('-') {
        return Err("pip options are not accepted");
    }
    let mut words = code.split_whitespace().peekable();
    let mut requirement = String::new();
    // the requirement is everything before the first option (`--hash=...`)
    while let Some(w) = words.peek() {
        if w.starts_with("--") {
            break;
        }
        requirement.push_str(words.next().expect("peeked"));
        requirement.push(' ');
    }
    for option in words {
        let Some(hash) = option.strip_prefix("--hash=") else {
            return Err("the only option a requirement may carry is --hash");
        };
        let ok = hash.split_once(':').is_some_and(|(alg, hex)| {
            matches!(alg, "sha256" | "sha384" | "sha512")
                && !hex.is_empty()
                && hex.bytes().all(|b| b.is_ascii_hexdigit())
        });
        if !ok {
            return Err("a --hash must be sha256:, sha384: or sha512: and hex digits");
        }
    }
    let requirement = requirement.trim();
    if requirement.contains("://") || requirement.contains('@') {
        return Err("URL and VCS requirements are not accepted");
    }
    let (spec, marker) = match requirement.split_once(';') {
        Some((s, m)) => (s.trim(), Some(m.trim())),
        None => (requirement, None),
    };
    if let Some(m) = marker
        && !m
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || " _.<>=!~'\"()-*".contains(c))
    {
        return Err("the environment marker has characters markers do not use");
    }
    if let Some(m) = marker
        && !marker_words_known(m)
    {
        return Err("the environment marker names something markers do not have");
    }
    // name: letters, digits, and . _ - inside (PEP 508)
    let name_end = spec
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        .unwrap_or(spec.len());
    let name = &spec[..name_end];
    let valid_name = !name.is_empty()
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !valid_name || name.contains("..") {
        return Err("this is not a package name (paths and archives are not accepted)");
    }
    let mut rest = spec[name_end..].trim_start();
    if let Some(after) = rest.strip_prefix('[') {
        let Some((extras, after)) = after.split_once(']') else {
            return Err("an extras list is not closed");
        };
        if !extras
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || " ,._-".contains(c))
        {
            return Err("extras are package-style names");
        }
        rest = after.trim_start();
    }
    let rest = rest.trim_start_matches('(').trim_end_matches(')');
    if !rest
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || " <>=!~.*,+".contains(c))
    {
        return Err("the version specifier has characters specifiers do not use");
    }
    if !rest.is_empty() && !rest.trim_start().starts_with(['<', '>', '=', '!', '~']) {
        return Err("a version specifier starts with a comparison (==, >=, ~=, …)");
    }
    Ok(())
}

/// Make (or reuse) the environment for `requirements` under `envs`, named by its key: what
/// a server does, so that every commit with the same requirements shares one.
pub fn ensure_shared(
    envs: &Path,
    requirements: &str,
    base: &Path,
    opts: &InstallOptions,
) -> Result<Ensured, PyEnvError> {
    let version = python_version(&opts.base_python)?;
    let name = &key(requirements, &version)[..24];
    ensure(&envs.join(name), requirements, base, opts)
}

/// Whether the environment at `dir` is complete for `key`.
pub fn is_ready(dir: &Path, key: &str) -> bool {
    std::fs::read_to_string(dir.join(MARKER)).is_ok_and(|m| m.trim() == key)
        && python_of(dir).exists()
}

/// Make (or reuse) the environment at `dir` for `requirements` (the text of a
/// requirements file; `base` is the directory its relative paths are read from).
pub fn ensure(
    dir: &Path,
    requirements: &str,
    base: &Path,
    opts: &InstallOptions,
) -> Result<Ensured, PyEnvError> {
    let version = python_version(&opts.base_python)?;
    let key = key(requirements, &version);
    let parent = dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(io("creating", parent))?;
    let lock_path = reap::lock_path(dir);
    // users hold it shared (compiles, handler processes): one more needs no exclusive lock
    let shared = reap::lock_file(dir, false).map_err(io("locking", &lock_path))?;
    if is_ready(dir, &key) {
        reap::touch(dir);
        return Ok(Ensured {
            dir: dir.to_path_buf(),
            created: false,
            output: String::new(),
            key,
            in_use: reap::InUse::from_lock(shared),
        });
    }
    drop(shared);
    // another process making it: wait, then use what it made
    let lock = reap::lock_file(dir, true).map_err(io("locking", &lock_path))?;
    if is_ready(dir, &key) {
        let in_use = reap::keep_using(dir, lock).map_err(io("locking", &lock_path))?;
        return Ok(Ensured {
            dir: dir.to_path_buf(),
            created: false,
            output: String::new(),
            key,
            in_use,
        });
    }
    if dir.exists() {
        // made for other requirements, or left half-made
        std::fs::remove_dir_all(dir).map_err(io("removing", dir))?;
    }
    let mut output = String::new();
    run(
        Command::new(&opts.base_python)
            .arg("-m")
            .arg("venv")
            .arg(dir),
        &format!("{} -m venv {}", opts.base_python, dir.display()),
        &mut output,
    )?;
    let req_file = dir.join("requirements.txt");
    std::fs::write(&req_file, requirements).map_err(io("writing", &req_file))?;
    let mut pip = Command::new(python_of(dir));
    pip.args([
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-input",
    ]);
    if opts.only_binary {
        pip.args(["--only-binary", ":all:"]);
    }
    if opts.provide_core {
        let wheels = dir.join(".steward-provided");
        let constraints = provide_core(&wheels, &opts.base_python)?;
        pip.arg("--find-links")
            .arg(&wheels)
            .arg("-c")
            .arg(constraints);
    }
    pip.arg("-r").arg(&req_file).current_dir(base);
    if let Some(sandboxed) = &opts.sandbox {
        // pip reads nothing but the copy of the requirements in the environment, runs in its
        // own directory, and sees only the environment it is given
        pip.current_dir(dir).env_clear().envs(sandboxed.env.clone());
        if let Some(id) = sandboxed.identity {
            crate::sandbox::chown_tree(dir, id).map_err(io("handing over", dir))?;
        }
        sandboxed.jail.apply_std(&mut pip);
    }
    run(&mut pip, "pip install -r requirements.txt", &mut output)?;
    if let Some(id) = opts.sandbox.as_ref().and_then(|s| s.identity) {
        // what pip made, no later compile may change
        crate::sandbox::share_read_only(dir, id).map_err(io("sharing", dir))?;
    }
    reap::record_size(dir);
    let marker = dir.join(MARKER);
    let mut f = std::fs::File::create(&marker).map_err(io("writing", &marker))?;
    f.write_all(key.as_bytes())
        .map_err(io("writing", &marker))?;
    // used from now on
    let in_use = reap::keep_using(dir, lock).map_err(io("locking", &lock_path))?;
    Ok(Ensured {
        dir: dir.to_path_buf(),
        created: true,
        output,
        key,
        in_use,
    })
}

/// Output of a venv or pip run kept for reports and errors: its last this many bytes.
const KEEP_OUTPUT: usize = 16 << 10;

/// `text` cut to its last [`KEEP_OUTPUT`] bytes (where pip says what failed), saying so.
fn bounded(text: &str) -> String {
    if text.len() <= KEEP_OUTPUT {
        return text.to_string();
    }
    let mut start = text.len() - KEEP_OUTPUT;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!(
        "… ({} bytes of output left out) …\n{}",
        start,
        &text[start..]
    )
}

fn run(cmd: &mut Command, what: &str, output: &mut String) -> Result<(), PyEnvError> {
    let out = cmd
        .stdin(Stdio::null())
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .output()
        .map_err(|e| PyEnvError::Failed {
            what: what.into(),
            code: None,
            output: e.to_string(),
        })?;
    let text = bounded(
        &(String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)),
    );
    output.push_str(&format!("$ {what}\n{text}"));
    if !out.status.success() {
        return Err(PyEnvError::Failed {
            what: what.into(),
            code: out.status.code(),
            output: text,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_ignore_blank_lines_and_follow_the_python_version() {
        let a = key("pyyaml==6.0.2\n\ninmanta-module-yaml\n", "Python 3.11.7");
        assert_eq!(
            a,
            key("  pyyaml==6.0.2\r\ninmanta-module-yaml", "Python 3.11.7")
        );
        assert_ne!(
            a,
            key("pyyaml==6.0.1\ninmanta-module-yaml", "Python 3.11.7")
        );
        assert_ne!(
            a,
            key("pyyaml==6.0.2\ninmanta-module-yaml", "Python 3.12.1")
        );
    }

    #[test]
    fn only_plain_requirements_pass() {
        let ok = "# modules\n\ninmanta-module-std==8.1.0\ninmanta-module-fs>=1.1,<2 ; python_version >= \"3.9\"\n\
                  PyYAML[extra1, extra2] ~= 6.0  # a comment\n\
                  requests==2.32.3 \\\n    --hash=sha256:0123abcdef\npydantic (>=2)\nsix\n";
        assert_eq!(check_plain(ok), Ok(()));
        for (text, line) in [
            ("six\n./evil\n", 2),
            ("-r /etc/shadow\n", 1),
            ("--index-url https://evil.example/simple\n", 1),
            ("--extra-index-url=https://x\n", 1),
            ("six\n\n--trusted-host x\n", 3),
            ("-f /tmp/wheels\n", 1),
            ("-c constraints.txt\n", 1),
            ("-e git+https://x/y.git#egg=y\n", 1),
            ("git+https://example.com/x.git\n", 1),
            ("evil @ file:///srv/evil\n", 1),
            ("https://example.com/x-1.0-py3-none-any.whl\n", 1),
            ("/abs/path/x.whl\n", 1),
            ("../up\n", 1),
            ("x.tar.gz/\n", 1),
            ("six --install-option=--prefix=/\n", 1),
            ("six==1.0 --hash=md5:abc\n", 1),
            ("six ; os.system('x')\n", 1),
            ("six \\\n  -r /etc/shadow\n", 1),
        ] {
            let e = check_plain(text).expect_err(text);
            assert_eq!(e.line, line, "{text}: {e}");
            assert!(
                e.to_string()
                    .starts_with(&format!("requirements.txt:{line}: ")),
                "{e}"
            );
        }
    }

    #[test]
    fn comments_and_spacing_make_no_new_environment() {
        let a = key("inmanta-module-std==8.1.0\nsix\n", "Python 3.11.7");
        assert_eq!(
            a,
            key(
                "# pinned\ninmanta-module-std==8.1.0   # std\n\n  six  \n",
                "Python 3.11.7"
            )
        );
        assert_eq!(
            normalized("a \\\n  --hash=sha256:00\n# x\nb"),
            vec!["a --hash=sha256:00".to_string(), "b".to_string()]
        );
    }

    #[test]
    fn a_missing_interpreter_is_named() {
        let e = python_version("/nonexistent/python3").unwrap_err();
        assert!(e.to_string().contains("/nonexistent/python3"), "{e}");
    }

    #[test]
    fn an_environment_is_made_once_and_remade_for_other_requirements() {
        let dir = tempfile::tempdir().unwrap();
        let venv = dir.path().join("venv");
        let opts = InstallOptions::default();
        // nothing to install: no network needed
        let first = ensure(&venv, "# nothing\n", dir.path(), &opts).unwrap();
        assert!(first.created && first.python().exists());
        let again = ensure(&venv, "# nothing\n\n", dir.path(), &opts).unwrap();
        assert!(!again.created);
        // other requirements remake it once nobody uses it any more
        let first_key = first.key.clone();
        drop((first, again));
        // a failed install leaves no usable environment
        let bad = ensure(&venv, "-r does-not-exist.txt\n", dir.path(), &opts).unwrap_err();
        assert!(bad.to_string().contains("does-not-exist.txt"), "{bad}");
        assert!(!is_ready(&venv, &first_key));
        let remade = ensure(&venv, "# nothing\n", dir.path(), &opts).unwrap();
        assert!(remade.created);
    }
}

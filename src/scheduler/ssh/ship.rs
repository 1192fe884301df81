//! Shipping to a target by content: the executor binary under its hash, handler code under
//! its digest. Each shipment is one remote script in one session: it answers `steward-have`
//! (nothing more happens: one round trip, 0 bytes) or `steward-send`, then receives the bytes
//! on stdin, checks them, and renames them into place so that a name that exists is always
//! complete; concurrent shipments of the same content race harmlessly (same bytes, atomic
//! renames).

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::SystemTime;

use sha2::{Digest, Sha256};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};

use super::{Link, Shipped, SshError};

/// `$1` cache root, `$2` sha256, `$3` size, `$4` name suffix. The file there is used only when
/// its content has that sha256 (a file that differs is replaced); what arrives is checked for
/// size and sha256 before it is renamed into place; the directories are made with mode 700
/// and refused when someone else can write to them. Exit 3: the binary does not run there
/// (its error on stderr); exit 4: refused (no way to hash, a directory others can write).
const EXECUTOR: &str = concat!(
    remote_prelude!(),
    r#"sha256 < /dev/null > /dev/null; [ $? -ne 2 ] || refuse "$nohash"
private "$1" bin
f="$1/bin/steward-$4"
if [ -e "$f" ] || [ -L "$f" ]; then
  check "$f" "regular file"
  s=$(sha256 < "$f") || refuse "can not hash $f"
  if [ "$s" = "$2" ]; then printf 'steward-have %s\n' "$f"; exit 0; fi
  echo "$f does not have the sha256 of this executor: replacing it" >&2
fi
umask 077
t="$1/bin/.steward-$4.$$.tmp"
trap 'rm -f "$t"' EXIT
printf 'steward-send %s\n' "$f"
cat > "$t" || exit 1
n=$(wc -c < "$t") || exit 1
if [ "$n" -ne "$3" ]; then echo "received $n of $3 bytes" >&2; exit 1; fi
s=$(sha256 < "$t") || exit 1
if [ "$s" != "$2" ]; then echo "what arrived does not have the sha256 sent" >&2; exit 1; fi
chmod 500 "$t" || exit 1
if ! out=$("$t" --version 2>&1 < /dev/null); then echo "it does not start there: $out" >&2; exit 3; fi
mv -f "$t" "$f" || exit 1
printf 'steward-done %s\n' "$f"
"#
);

/// `$1` cache root, `$2` code digest, `$3` hash of the helper library ('' = none). Receives a
/// tar of `<digest>/` and/or `_lib/` files, as `steward-send` asked. The directories are
/// checked as for the executor (exit 4: refused).
const CODE: &str = concat!(
    remote_prelude!(),
    r#"private "$1" code
c="$1/code"; need=""
[ -f "$c/$2/.complete" ] || need="code"
if [ -n "$3" ] && [ "$(cat "$c/_lib/.complete" 2>/dev/null)" != "$3" ]; then need="$need lib"; fi
if [ -z "$need" ]; then printf 'steward-have %s\n' "$c/$2"; exit 0; fi
umask 077
t=$(mktemp -d "$c/.tmp-XXXXXXXX") || exit 1
trap 'rm -rf "$t"' EXIT
printf 'steward-send %s\n' "$need"
tar -xf - --no-same-owner -C "$t" || exit 1
if [ -d "$t/$2" ]; then
  if [ ! -f "$t/$2/.complete" ]; then echo "the code of $2 arrived without its .complete marker" >&2; exit 1; fi
  if [ ! -f "$c/$2/.complete" ]; then
    mv -T "$t/$2" "$c/$2" 2>/dev/null || [ -f "$c/$2/.complete" ] || { echo "can not place $c/$2 (remove what is there)" >&2; exit 1; }
  fi
fi
if [ -d "$t/_lib" ]; then
  mkdir -p "$c/_lib" || exit 1
  for f in "$t/_lib"/*; do
    if [ -f "$f" ]; then mv -f "$f" "$c/_lib/" || exit 1; fi
  done
  printf '%s' "$3" > "$t/.lib" && mv -f "$t/.lib" "$c/_lib/.complete" || exit 1
fi
printf 'steward-done %s\n' "$c/$2"
"#
);

pub(super) async fn ensure_executor(link: &Link, local: &Path) -> Result<Shipped, SshError> {
    let path = local.to_path_buf();
    let (sha, size, machine) = tokio::task::spawn_blocking(move || hash_executable(&path))
        .await
        .map_err(|e| SshError::Local {
            what: "hashing".into(),
            path: local.display().to_string(),
            detail: e.to_string(),
        })??;
    check_platform(link, machine)?;
    let size_arg = size.to_string();
    let mut x = Exchange::start(
        link,
        "shipping the executor",
        EXECUTOR,
        &[&link_root(link), &sha, &size_arg, &sha[..16]],
    )?;
    let (word, path) = x.marker().await?;
    if word == "have" {
        x.finish().await?;
        remember(link, &path, &sha);
        return Ok(Shipped {
            remote_path: path,
            bytes_uploaded: 0,
        });
    }
    let mut file = tokio::fs::File::open(local)
        .await
        .map_err(|e| SshError::Local {
            what: "reading".into(),
            path: local.display().to_string(),
            detail: e.to_string(),
        })?;
    let sent = x.send_from(&mut file).await?;
    let (_, path) = x.marker().await?;
    x.finish().await?;
    remember(link, &path, &sha);
    Ok(Shipped {
        remote_path: path,
        bytes_uploaded: sent,
    })
}

pub(super) async fn ensure_code(
    link: &Link,
    local_dir: &Path,
    digest: &str,
) -> Result<Shipped, SshError> {
    let local = |what: &str, path: &Path, detail: String| SshError::Local {
        what: what.into(),
        path: path.display().to_string(),
        detail,
    };
    if digest.is_empty()
        || digest.starts_with('.')
        || digest == "_lib"
        || !digest
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return Err(local(
            "not a code digest:",
            Path::new(digest),
            "expected letters, digits, '_', '-' or '.'".into(),
        ));
    }
    let code = local_dir.join(digest);
    if !code.join(".complete").is_file() {
        return Err(local(
            "handler code is not complete (no .complete marker) in",
            &code,
            "it is written by scheduler/code.rs before it is shipped".into(),
        ));
    }
    let dir = local_dir.to_path_buf();
    let (lib_files, lib_hash) = tokio::task::spawn_blocking(move || lib_files(&dir))
        .await
        .map_err(|e| local("reading", local_dir, e.to_string()))?
        .map_err(|e| local("reading", &local_dir.join("_lib"), e.to_string()))?;
    let mut x = Exchange::start(
        link,
        "shipping handler code",
        CODE,
        &[&link_root(link), digest, &lib_hash],
    )?;
    let (word, need) = x.marker().await?;
    let remote_path = format!("{}/code/{digest}", link_root(link));
    if word == "have" {
        x.finish().await?;
        return Ok(Shipped {
            remote_path,
            bytes_uploaded: 0,
        });
    }
    let mut entries: Vec<String> = Vec::new();
    if need.split(' ').any(|w| w == "code") {
        entries.push(digest.to_string());
    }
    if need.split(' ').any(|w| w == "lib") {
        entries.extend(lib_files.iter().map(|f| format!("_lib/{f}")));
    }
    let tar = local_tar(local_dir, &entries).await?;
    let sent = x.send_from(&mut &tar[..]).await?;
    x.marker().await?;
    x.finish().await?;
    Ok(Shipped {
        remote_path,
        bytes_uploaded: sent,
    })
}

/// What [`super::SshLink::executor_command`] checks `path` against before it runs it.
fn remember(link: &Link, path: &str, sha: &str) {
    link.executors
        .lock()
        .expect("executors")
        .insert(path.to_string(), sha.to_string());
}

fn link_root(link: &Link) -> String {
    format!(
        "{}/{}",
        link.remote.home.trim_end_matches('/'),
        super::REMOTE_CACHE
    )
}

/// One shipment's session: markers on stdout, errors on stderr.
struct Exchange<'a> {
    link: &'a Link,
    what: &'static str,
    child: Child,
    stdin: Option<ChildStdin>,
    out: BufReader<ChildStdout>,
    stderr: tokio::task::JoinHandle<String>,
}

impl<'a> Exchange<'a> {
    fn start(
        link: &'a Link,
        what: &'static str,
        script: &str,
        args: &[&str],
    ) -> Result<Exchange<'a>, SshError> {
        let mut c = link.script(script, args);
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = c.spawn().map_err(|e| SshError::Local {
            what: "can not run".into(),
            path: "ssh".into(),
            detail: e.to_string(),
        })?;
        let mut err = child.stderr.take().expect("piped");
        // what the target says on stderr explains a failure: its end is enough
        let stderr =
            tokio::spawn(
                async move { crate::scheduler::lines::read_tail(&mut err, 64 * 1024).await },
            );
        Ok(Exchange {
            link,
            what,
            stdin: child.stdin.take(),
            out: BufReader::new(child.stdout.take().expect("piped")),
            child,
            stderr,
        })
    }

    /// The next `steward-WORD rest` line: (WORD, rest).
    async fn marker(&mut self) -> Result<(String, String), SshError> {
        loop {
            // the script's markers are short; anything long is not one
            match crate::scheduler::lines::next_line(&mut self.out, 64 * 1024).await {
                Ok(crate::scheduler::lines::Line::TooLong(_)) => {}
                Ok(crate::scheduler::lines::Line::Text(line)) => {
                    if let Some(m) = line.strip_prefix("steward-")
                        && let Some((word, rest)) = m.split_once(' ')
                    {
                        if word == "refused" {
                            // its reason is on stderr too, and it exits 4
                            return Err(self.failed().await);
                        }
                        return Ok((word.to_string(), rest.to_string()));
                    }
                }
                Ok(crate::scheduler::lines::Line::End) | Err(_) => {
                    return Err(self.failed().await);
                }
            }
        }
    }

    /// Stream `from` to the remote script; the number of bytes sent.
    async fn send_from<R: tokio::io::AsyncRead + Unpin>(
        &mut self,
        from: &mut R,
    ) -> Result<u64, SshError> {
        let mut stdin = self.stdin.take().expect("stdin sent once");
        let sent = tokio::io::copy(from, &mut stdin).await;
        let closed = stdin.shutdown().await;
        drop(stdin);
        match (sent, closed) {
            (Ok(n), Ok(())) => Ok(n),
            // the remote side stopped reading: its own message says why
            _ => Err(self.failed().await),
        }
    }

    async fn finish(mut self) -> Result<(), SshError> {
        drop(self.stdin.take());
        let status = self.child.wait().await;
        if status.as_ref().is_ok_and(|s| s.success()) {
            Ok(())
        } else {
            Err(self.failed().await)
        }
    }

    async fn failed(&mut self) -> SshError {
        drop(self.stdin.take());
        let status = self.child.wait().await;
        let stderr = (&mut self.stderr).await.unwrap_or_default();
        let output = std::process::Output {
            status: status.unwrap_or_default(),
            stdout: Vec::new(),
            stderr: stderr.into_bytes(),
        };
        if output.status.code() == Some(4) {
            return SshError::Untrusted {
                target: self.link.target.to_string(),
                detail: String::from_utf8_lossy(&output.stderr).trim().to_string(),
            };
        }
        if output.status.code() == Some(3) {
            return SshError::Platform {
                target: self.link.target.to_string(),
                detail: String::from_utf8_lossy(&output.stderr).trim().to_string(),
            };
        }
        self.link.failure(self.what, &output)
    }
}

/// The target must run what the binary is built for.
fn check_platform(link: &Link, machine: Option<&'static str>) -> Result<(), SshError> {
    let r = &link.remote;
    let err = |detail: String| SshError::Platform {
        target: link.target.to_string(),
        detail,
    };
    if r.os != "Linux" {
        return Err(err(format!(
            "it runs {} and the executor is a Linux program",
            r.os
        )));
    }
    if let Some(m) = machine {
        let same = r.arch == m
            || matches!(
                (m, r.arch.as_str()),
                ("aarch64", "arm64") | ("i686", "i386" | "i486" | "i586") | ("ppc64le", "ppc64")
            )
            || m == "arm" && r.arch.starts_with("arm");
        if !same {
            return Err(err(format!(
                "it is a {} machine and the executor is built for {m}",
                r.arch
            )));
        }
    }
    Ok(())
}

/// The sha256 (hex), size and architecture (`uname -m` spelling, when known) of a binary,
/// remembered while its size, modification time and inode stay the same (a debug build is
/// hundreds of megabytes: hashing it for every executor started would show).
fn hash_executable(path: &Path) -> Result<(String, u64, Option<&'static str>), SshError> {
    type Key = (PathBuf, u64, SystemTime, u64);
    type Known = HashMap<Key, (String, Option<&'static str>)>;
    static KNOWN: Mutex<Option<Known>> = Mutex::new(None);
    let local = |what: &str, e: std::io::Error| SshError::Local {
        what: what.into(),
        path: path.display().to_string(),
        detail: e.to_string(),
    };
    let m = std::fs::metadata(path).map_err(|e| local("reading", e))?;
    if !m.is_file() {
        return Err(local(
            "the executor binary is not a file:",
            std::io::Error::other("not a regular file"),
        ));
    }
    let key: Key = (
        path.to_path_buf(),
        m.len(),
        m.modified().map_err(|e| local("reading", e))?,
        std::os::unix::fs::MetadataExt::ino(&m),
    );
    // one hash at a time: executors of several agents start together, and the second
    // caller had better wait for the first's result than hash the same file again
    static HASHING: Mutex<()> = Mutex::new(());
    let _one = HASHING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((sha, machine)) = KNOWN
        .lock()
        .expect("hashes")
        .as_ref()
        .and_then(|k| k.get(&key))
    {
        return Ok((sha.clone(), key.1, *machine));
    }
    let mut f = std::fs::File::open(path).map_err(|e| local("reading", e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut head = [0u8; 20];
    let mut seen = 0usize;
    loop {
        let n = f.read(&mut buf).map_err(|e| local("reading", e))?;
        if n == 0 {
            break;
        }
        if seen < head.len() {
            let k = (head.len() - seen).min(n);
            head[seen..seen + k].copy_from_slice(&buf[..k]);
            seen += k;
        }
        hasher.update(&buf[..n]);
    }
    let sha = hex::encode(hasher.finalize());
    let machine = elf_machine(&head[..seen]);
    KNOWN
        .lock()
        .expect("hashes")
        .get_or_insert_default()
        .insert(key.clone(), (sha.clone(), machine));
    Ok((sha, key.1, machine))
}

/// The architecture an ELF header names, in `uname -m` words.
fn elf_machine(head: &[u8]) -> Option<&'static str> {
    if head.len() < 20 || &head[..4] != b"\x7fELF" {
        return None;
    }
    let machine = match head[5] {
        1 => u16::from_le_bytes([head[18], head[19]]),
        _ => u16::from_be_bytes([head[18], head[19]]),
    };
    Some(match machine {
        3 => "i686",
        40 => "arm",
        62 => "x86_64",
        183 => "aarch64",
        243 => "riscv64",
        21 => "ppc64le",
        22 => "s390x",
        _ => return None,
    })
}

pub(super) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The files of `<dir>/_lib` (names, sorted) and the hash of their names and contents ('' when
/// there is no `_lib`).
fn lib_files(dir: &Path) -> std::io::Result<(Vec<String>, String)> {
    let lib = dir.join("_lib");
    if !lib.is_dir() {
        return Ok((Vec::new(), String::new()));
    }
    let mut names = Vec::new();
    for e in std::fs::read_dir(&lib)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().to_string();
        if !name.starts_with('.') && e.file_type()?.is_file() {
            names.push(name);
        }
    }
    names.sort();
    let mut h = Sha256::new();
    for n in &names {
        h.update(n.as_bytes());
        h.update([0]);
        h.update(std::fs::read(lib.join(n))?);
        h.update([0]);
    }
    Ok((names, hex::encode(h.finalize())))
}

/// A tar of `entries` (relative to `dir`), made by the system's tar.
async fn local_tar(dir: &Path, entries: &[String]) -> Result<Vec<u8>, SshError> {
    let out = tokio::process::Command::new("tar")
        .env_clear()
        .envs(std::env::var_os("PATH").map(|p| ("PATH", p)))
        .arg("-C")
        .arg(dir)
        .args([
            "-cf",
            "-",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "--",
        ])
        .args(entries)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| SshError::Local {
            what: "can not run tar for".into(),
            path: dir.display().to_string(),
            detail: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(SshError::Local {
            what: "packing handler code in".into(),
            path: dir.display().to_string(),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(out.stdout)
}

/// `s` as one word for a POSIX shell.
pub(super) fn sh_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars().all(|c| {
            c.is_ascii_alphanumeric()
                || matches!(c, '_' | '-' | '.' | '/' | ':' | '=' | '@' | '+' | ',')
        })
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_quoting_keeps_words_whole() {
        assert_eq!(
            sh_quote("/home/u/.cache/steward/bin/steward-ab12"),
            "/home/u/.cache/steward/bin/steward-ab12"
        );
        assert_eq!(sh_quote(""), "''");
        assert_eq!(sh_quote("a b"), "'a b'");
        assert_eq!(sh_quote("it's; rm -rf ~"), r"'it'\''s; rm -rf ~'");
        assert_eq!(sh_quote("$(reboot)"), "'$(reboot)'");
        // what a shell makes of them
        for s in [
            "plain",
            "a b",
            "it's",
            "$(x) `y` \"z\" \\ ~ * ?",
            "-n",
            "\n",
        ] {
            let out = std::process::Command::new("/bin/sh")
                .arg("-c")
                .arg(format!("printf %s {}", sh_quote(s)))
                .output()
                .unwrap();
            assert_eq!(String::from_utf8_lossy(&out.stdout), s);
        }
    }

    #[test]
    fn elf_headers_name_their_machine() {
        let me = std::fs::read("/proc/self/exe").unwrap();
        let m = elf_machine(&me[..20]);
        let expected = match std::env::consts::ARCH {
            "x86" => "i686",
            a => a,
        };
        assert_eq!(m, Some(expected));
        assert_eq!(elf_machine(b"#!/bin/sh\n"), None);
    }

    #[test]
    fn remote_scripts_are_valid_sh() {
        for s in [
            EXECUTOR,
            CODE,
            super::super::PROBE,
            super::super::KILL,
            super::super::START_EXECUTOR,
        ] {
            let out = std::process::Command::new("/bin/sh")
                .arg("-n")
                .arg("-c")
                .arg(s)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{s}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

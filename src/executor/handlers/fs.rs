//! Handlers of the fs module: files, directories, symlinks on this machine.
//!
//! `permissions` is written as in the model, octal digits as a number (644); owner and
//! group are names. A null desired value means "leave it alone".

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use serde_json::{Value, json};

use super::accounts::{GROUPS, USERS};
use crate::executor::context::{Attrs, Context};
use crate::executor::handler::{CrudHandler, HResult, HandlerError};
use crate::model::diff::AttributeChange;

fn attr_str<'a>(a: &'a Attrs, k: &str) -> Option<&'a str> {
    a.get(k).and_then(Value::as_str)
}

fn path_of(a: &Attrs, key: &str) -> HResult<String> {
    let p =
        attr_str(a, key).ok_or_else(|| HandlerError::Failed(format!("resource has no {key}")))?;
    if !p.starts_with('/') {
        return Err(HandlerError::Failed(format!(
            "{key} must be an absolute path, got '{p}'"
        )));
    }
    Ok(p.to_string())
}

/// `644` (octal digits written as a number) -> 0o644.
pub fn mode_from_model(v: &Value) -> HResult<Option<u32>> {
    match v {
        Value::Null => Ok(None),
        Value::Number(n) => {
            let digits = n.to_string();
            u32::from_str_radix(&digits, 8).map(Some).map_err(|_| {
                HandlerError::Failed(format!("permissions {digits} are not octal digits"))
            })
        }
        Value::String(s) => u32::from_str_radix(s.trim_start_matches("0o"), 8)
            .map(Some)
            .map_err(|_| HandlerError::Failed(format!("permissions '{s}' are not octal digits"))),
        other => Err(HandlerError::Failed(format!("invalid permissions {other}"))),
    }
}

/// 0o644 -> 644 (the model's notation).
pub fn mode_to_model(mode: u32) -> Value {
    let s = format!("{:o}", mode & 0o7777);
    json!(s.parse::<u64>().unwrap_or(0))
}

pub fn user_name(uid: u32) -> String {
    USERS.name_of(uid).unwrap_or_else(|| uid.to_string())
}

pub fn group_name(gid: u32) -> String {
    GROUPS.name_of(gid).unwrap_or_else(|| gid.to_string())
}

fn uid_of(name: &str) -> HResult<u32> {
    name.parse::<u32>()
        .ok()
        .or_else(|| USERS.id_of(name))
        .ok_or_else(|| HandlerError::Failed(format!("no such user: {name}")))
}

fn gid_of(name: &str) -> HResult<u32> {
    name.parse::<u32>()
        .ok()
        .or_else(|| GROUPS.id_of(name))
        .ok_or_else(|| HandlerError::Failed(format!("no such group: {name}")))
}

/// Fill owner, group and permissions of `current` from the filesystem.
fn read_meta(meta: &std::fs::Metadata, current: &mut Attrs) {
    current.insert("owner".into(), json!(user_name(meta.uid())));
    current.insert("group".into(), json!(group_name(meta.gid())));
    current.insert("permissions".into(), mode_to_model(meta.mode()));
}

/// Which of a resource's metadata [`apply_meta`] sets.
#[derive(Clone, Copy, PartialEq)]
enum Meta {
    /// owner, group and permissions
    All,
    /// owner and group: the file was just written with its permissions (set again only
    /// when a change of owner cleared its set-user-id or set-group-id bit)
    Ownership,
}

/// Apply owner, group and permissions where desired (not null). The owner first: the
/// kernel clears the set-user-id and set-group-id bits of a file whose owner changes.
fn apply_meta(
    ctx: &mut Context,
    path: &str,
    desired: &Attrs,
    follow: bool,
    which: Meta,
) -> HResult<()> {
    let uid = attr_str(desired, "owner").map(uid_of).transpose()?;
    let gid = attr_str(desired, "group").map(gid_of).transpose()?;
    let chowned = uid.is_some() || gid.is_some();
    if chowned {
        if follow {
            std::os::unix::fs::chown(path, uid, gid)?;
        } else {
            std::os::unix::fs::lchown(path, uid, gid)?;
        }
    }
    let mode = mode_from_model(desired.get("permissions").unwrap_or(&Value::Null))?;
    let mode = match which {
        Meta::All => mode,
        Meta::Ownership => mode.filter(|m| chowned && m & 0o6000 != 0),
    };
    if let Some(mode) = mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
        ctx.debug(
            "permissions set",
            &[("path", json!(path)), ("mode", json!(format!("{mode:o}")))],
        );
    }
    Ok(())
}

/// Long contents are shown by size and hash in changes, not in full.
fn shown(content: &str) -> Value {
    if content.len() <= 512 {
        json!(content)
    } else {
        use sha2::Digest;
        json!(format!(
            "<{} bytes, sha256 {}>",
            content.len(),
            &hex::encode(sha2::Sha256::digest(content.as_bytes()))[..16]
        ))
    }
}

/// This process's id, asked of the kernel once (it names temporary files).
fn process_id() -> u32 {
    static ID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *ID.get_or_init(std::process::id)
}

/// Write a file atomically: a temporary file in the same directory, renamed over it.
fn write_atomically(path: &str, content: &[u8], mode: Option<u32>) -> HResult<()> {
    let p = Path::new(path);
    let dir = p
        .parent()
        .ok_or_else(|| HandlerError::Failed(format!("{path} has no parent directory")))?;
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.steward-{}", process_id()));
    let result = (|| -> std::io::Result<()> {
        let mut f = match std::fs::File::create(&tmp) {
            Ok(f) => f,
            // asked only when the write failed: one stat less for every file written
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !dir.is_dir() => {
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("directory {} does not exist", dir.display()),
                ));
            }
            Err(e) => return Err(e),
        };
        f.write_all(content)?;
        if let Some(m) = mode {
            f.set_permissions(std::fs::Permissions::from_mode(m))?;
        } else if let Ok(old) = std::fs::metadata(p) {
            // keep the permissions of the file we replace
            f.set_permissions(old.permissions())?;
        }
        drop(f);
        std::fs::rename(&tmp, p)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(|e| HandlerError::Failed(format!("can not write {path}: {e}")))
}

pub struct FileHandler;

/// A file's facts: `sha256` (hex) of its content and its `size` in bytes, when it exists.
/// Reported when asked, and with a deploy that wrote it when the model waits for them; a
/// model reads them with `std::getfact(file, "sha256")`.
fn file_facts(ctx: &mut Context, path: &str) -> HResult<()> {
    use sha2::Digest;
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    ctx.set_fact("sha256", hex::encode(sha2::Sha256::digest(&bytes)), true);
    ctx.set_fact("size", bytes.len().to_string(), true);
    Ok(())
}

impl CrudHandler for FileHandler {
    fn facts(&self, ctx: &mut Context, desired: &Attrs) -> HResult<()> {
        file_facts(ctx, &path_of(desired, "path")?)
    }

    fn read(&self, ctx: &mut Context, current: &mut Attrs) -> HResult<bool> {
        let path = path_of(current, "path")?;
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        if !meta.is_file() {
            return Err(HandlerError::Failed(format!(
                "{path} exists but is not a regular file"
            )));
        }
        let bytes = std::fs::read(&path)?;
        let content = String::from_utf8_lossy(&bytes).to_string();
        ctx.scratch.insert("content".into(), json!(content));
        current.insert("content".into(), json!(content));
        read_meta(&meta, current);
        Ok(true)
    }

    fn diff(
        &self,
        _ctx: &mut Context,
        current: &Attrs,
        desired: &Attrs,
    ) -> BTreeMap<String, AttributeChange> {
        let mut d = crate::executor::handler::default_diff(current, desired);
        if let Some(c) = d.get_mut("content") {
            c.current = shown(c.current.as_str().unwrap_or(""));
            c.desired = shown(c.desired.as_str().unwrap_or(""));
        }
        d
    }

    fn create(&self, ctx: &mut Context, desired: &Attrs) -> HResult<()> {
        let path = path_of(desired, "path")?;
        let content = attr_str(desired, "content").unwrap_or("");
        let mode = mode_from_model(desired.get("permissions").unwrap_or(&Value::Null))?;
        write_atomically(&path, content.as_bytes(), mode)?;
        apply_meta(ctx, &path, desired, true, Meta::Ownership)?;
        ctx.info(
            "file created",
            &[("path", json!(path)), ("bytes", json!(content.len()))],
        );
        ctx.set_created();
        if ctx.want_facts {
            file_facts(ctx, &path)?;
        }
        Ok(())
    }

    fn update(
        &self,
        ctx: &mut Context,
        changes: &BTreeMap<String, AttributeChange>,
        desired: &Attrs,
    ) -> HResult<()> {
        let path = path_of(desired, "path")?;
        let mut which = Meta::All;
        if changes.contains_key("content") {
            let content = attr_str(desired, "content").unwrap_or("");
            let mode = mode_from_model(desired.get("permissions").unwrap_or(&Value::Null))?;
            write_atomically(&path, content.as_bytes(), mode)?;
            which = Meta::Ownership;
            ctx.info(
                "file content updated",
                &[("path", json!(path)), ("bytes", json!(content.len()))],
            );
        }
        apply_meta(ctx, &path, desired, true, which)?;
        ctx.set_updated();
        if ctx.want_facts && changes.contains_key("content") {
            file_facts(ctx, &path)?;
        }
        Ok(())
    }

    fn delete(&self, ctx: &mut Context, desired: &Attrs) -> HResult<()> {
        let path = path_of(desired, "path")?;
        std::fs::remove_file(&path)?;
        ctx.info("file removed", &[("path", json!(path))]);
        ctx.set_purged();
        Ok(())
    }
}

pub struct DirectoryHandler;

impl CrudHandler for DirectoryHandler {
    fn read(&self, _ctx: &mut Context, current: &mut Attrs) -> HResult<bool> {
        let path = path_of(current, "path")?;
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        if !meta.is_dir() {
            return Err(HandlerError::Failed(format!(
                "{path} exists but is not a directory"
            )));
        }
        read_meta(&meta, current);
        Ok(true)
    }

    fn create(&self, ctx: &mut Context, desired: &Attrs) -> HResult<()> {
        let path = path_of(desired, "path")?;
        // parents too: a model need not declare every directory above its own
        std::fs::create_dir_all(&path)?;
        apply_meta(ctx, &path, desired, true, Meta::All)?;
        ctx.info("directory created", &[("path", json!(path))]);
        ctx.set_created();
        Ok(())
    }

    fn update(
        &self,
        ctx: &mut Context,
        _changes: &BTreeMap<String, AttributeChange>,
        desired: &Attrs,
    ) -> HResult<()> {
        let path = path_of(desired, "path")?;
        apply_meta(ctx, &path, desired, true, Meta::All)?;
        ctx.info("directory updated", &[("path", json!(path))]);
        ctx.set_updated();
        Ok(())
    }

    fn delete(&self, ctx: &mut Context, desired: &Attrs) -> HResult<()> {
        let path = path_of(desired, "path")?;
        std::fs::remove_dir(&path)
            .map_err(|e| HandlerError::Failed(format!("can not remove directory {path}: {e}")))?;
        ctx.info("directory removed", &[("path", json!(path))]);
        ctx.set_purged();
        Ok(())
    }
}

pub struct SymlinkHandler;

impl CrudHandler for SymlinkHandler {
    fn read(&self, _ctx: &mut Context, current: &mut Attrs) -> HResult<bool> {
        let dst = path_of(current, "dst")?;
        let meta = match std::fs::symlink_metadata(&dst) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        if !meta.file_type().is_symlink() {
            return Err(HandlerError::Failed(format!(
                "{dst} exists but is not a symlink"
            )));
        }
        let target = std::fs::read_link(&dst)?;
        current.insert("src".into(), json!(target.to_string_lossy()));
        Ok(true)
    }

    fn create(&self, ctx: &mut Context, desired: &Attrs) -> HResult<()> {
        let dst = path_of(desired, "dst")?;
        let src = attr_str(desired, "src")
            .ok_or_else(|| HandlerError::Failed("symlink has no src".into()))?;
        std::os::unix::fs::symlink(src, &dst)?;
        ctx.info(
            "symlink created",
            &[("dst", json!(dst)), ("src", json!(src))],
        );
        ctx.set_created();
        Ok(())
    }

    fn update(
        &self,
        ctx: &mut Context,
        _changes: &BTreeMap<String, AttributeChange>,
        desired: &Attrs,
    ) -> HResult<()> {
        let dst = path_of(desired, "dst")?;
        let src = attr_str(desired, "src")
            .ok_or_else(|| HandlerError::Failed("symlink has no src".into()))?;
        // replace atomically: a new link renamed over the old one
        let tmp = format!("{dst}.steward-{}", std::process::id());
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(src, &tmp)?;
        std::fs::rename(&tmp, &dst)?;
        ctx.info(
            "symlink retargeted",
            &[("dst", json!(dst)), ("src", json!(src))],
        );
        ctx.set_updated();
        Ok(())
    }

    fn delete(&self, ctx: &mut Context, desired: &Attrs) -> HResult<()> {
        let dst = path_of(desired, "dst")?;
        std::fs::remove_file(&dst)?;
        ctx.info("symlink removed", &[("dst", json!(dst))]);
        ctx.set_purged();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::cache::Cache;

    fn attrs(v: Value) -> Attrs {
        v.as_object().unwrap().clone()
    }

    /// The file is written with its permissions and not chmod-ed again; a change of owner
    /// (which clears set-user-id) still ends with the permissions asked for.
    #[test]
    fn created_and_updated_files_have_their_owner_and_permissions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f").to_string_lossy().to_string();
        let mut cache = Cache::default();
        let mut ctx = Context::new("fs::File[a,path=f]", false, false, 1, &mut cache);
        let desired = attrs(json!({"path": path, "content": "x\n", "permissions": 640,
            "owner": null, "group": null}));
        FileHandler.create(&mut ctx, &desired).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o640);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "x\n");

        let mut current = attrs(json!({"path": path}));
        assert!(FileHandler.read(&mut ctx, &mut current).unwrap());
        assert_eq!(current["permissions"], json!(640));
        assert_eq!(current["owner"], json!(user_name(meta.uid())));
        assert_eq!(current["group"], json!(group_name(meta.gid())));

        // SAFETY: geteuid(2) can not fail and touches no memory
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: a change of owner needs root (this test runs as another user)");
            return;
        }
        let desired = attrs(json!({"path": path, "content": "y\n", "permissions": 4755,
            "owner": "65534", "group": "65534"}));
        let changes = FileHandler.diff(&mut ctx, &current, &desired);
        FileHandler.update(&mut ctx, &changes, &desired).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (65534, 65534));
        assert_eq!(
            meta.mode() & 0o7777,
            0o4755,
            "set-user-id kept after the chown"
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "y\n");
    }

    #[test]
    fn a_file_in_a_missing_directory_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nope/f").to_string_lossy().to_string();
        let mut cache = Cache::default();
        let mut ctx = Context::new("fs::File[a,path=f]", false, false, 1, &mut cache);
        let desired = attrs(json!({"path": path, "content": "x", "permissions": null}));
        let err = FileHandler
            .create(&mut ctx, &desired)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("can not write {path}: directory"))
                && err.contains("does not exist"),
            "{err}"
        );
    }
}

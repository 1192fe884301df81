//! Handlers of the fs module: files, directories, symlinks on this machine.
//!
//! `permissions` is written as in the model, octal digits as a number (644); owner and
//! group are names. A null desired value means "leave it alone".

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use serde_json::{Value, json};

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

fn lookup(file: &str, by_name: Option<&str>, by_id: Option<u32>) -> Option<(String, u32)> {
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        if f.len() < 3 {
            return None;
        }
        let id: u32 = f[2].parse().ok()?;
        let hit = by_name.is_some_and(|n| n == f[0]) || by_id == Some(id);
        hit.then(|| (f[0].to_string(), id))
    })
}

pub fn user_name(uid: u32) -> String {
    lookup("/etc/passwd", None, Some(uid))
        .map(|x| x.0)
        .unwrap_or_else(|| uid.to_string())
}

pub fn group_name(gid: u32) -> String {
    lookup("/etc/group", None, Some(gid))
        .map(|x| x.0)
        .unwrap_or_else(|| gid.to_string())
}

fn uid_of(name: &str) -> HResult<u32> {
    name.parse::<u32>()
        .ok()
        .or_else(|| lookup("/etc/passwd", Some(name), None).map(|x| x.1))
        .ok_or_else(|| HandlerError::Failed(format!("no such user: {name}")))
}

fn gid_of(name: &str) -> HResult<u32> {
    name.parse::<u32>()
        .ok()
        .or_else(|| lookup("/etc/group", Some(name), None).map(|x| x.1))
        .ok_or_else(|| HandlerError::Failed(format!("no such group: {name}")))
}

/// Fill owner, group and permissions of `current` from the filesystem.
fn read_meta(meta: &std::fs::Metadata, current: &mut Attrs) {
    current.insert("owner".into(), json!(user_name(meta.uid())));
    current.insert("group".into(), json!(group_name(meta.gid())));
    current.insert("permissions".into(), mode_to_model(meta.mode()));
}

/// Apply owner, group and permissions where desired (not null).
fn apply_meta(ctx: &mut Context, path: &str, desired: &Attrs, follow: bool) -> HResult<()> {
    if let Some(mode) = mode_from_model(desired.get("permissions").unwrap_or(&Value::Null))? {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
        ctx.debug(
            "permissions set",
            &[("path", json!(path)), ("mode", json!(format!("{mode:o}")))],
        );
    }
    let uid = attr_str(desired, "owner").map(uid_of).transpose()?;
    let gid = attr_str(desired, "group").map(gid_of).transpose()?;
    if uid.is_some() || gid.is_some() {
        if follow {
            std::os::unix::fs::chown(path, uid, gid)?;
        } else {
            std::os::unix::fs::lchown(path, uid, gid)?;
        }
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

/// Write a file atomically: a temporary file in the same directory, renamed over it.
fn write_atomically(path: &str, content: &[u8], mode: Option<u32>) -> HResult<()> {
    let p = Path::new(path);
    let dir = p
        .parent()
        .ok_or_else(|| HandlerError::Failed(format!("{path} has no parent directory")))?;
    if !dir.is_dir() {
        return Err(HandlerError::Failed(format!(
            "can not write {path}: directory {} does not exist",
            dir.display()
        )));
    }
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.steward-{}", std::process::id()));
    let result = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
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
        apply_meta(ctx, &path, desired, true)?;
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
        if changes.contains_key("content") {
            let content = attr_str(desired, "content").unwrap_or("");
            let mode = mode_from_model(desired.get("permissions").unwrap_or(&Value::Null))?;
            write_atomically(&path, content.as_bytes(), mode)?;
            ctx.info(
                "file content updated",
                &[("path", json!(path)), ("bytes", json!(content.len()))],
            );
        }
        apply_meta(ctx, &path, desired, true)?;
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
        apply_meta(ctx, &path, desired, true)?;
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
        apply_meta(ctx, &path, desired, true)?;
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

//! Handler code of versions: content-addressed blobs (shared by every version and environment
//! using the same file) and, per version, which code handles which resource type.

use std::collections::{BTreeMap, HashMap, HashSet};

use sha2::{Digest, Sha256};
use sqlx::{PgConnection, PgExecutor};
use uuid::Uuid;

use super::{Result, StoreError};
use crate::model::{ExportFile, HandlerCode};

/// Check the code of an export: every file is present (in the export or stored before) with
/// the content its hash says, every digest matches its files.
pub fn validate(export: &ExportFile) -> Result<()> {
    for (hash, hexed) in &export.code {
        let content = hex::decode(hexed)
            .map_err(|_| StoreError::Invalid(format!("code {hash} is not hex")))?;
        if hex::encode(Sha256::digest(&content)) != *hash {
            return Err(StoreError::Invalid(format!(
                "code {hash} does not match its content"
            )));
        }
    }
    for (ty, h) in &export.handlers {
        if h.expected_digest() != h.digest {
            return Err(StoreError::Invalid(format!(
                "the handler of {ty}: its digest does not match its files{}",
                if h.inmanta.is_some() {
                    ", requirements and imports"
                } else {
                    ""
                }
            )));
        }
        if let Some(i) = &h.inmanta
            && let Some(bad) = i.imports.iter().find(|m| !is_python_dotted_name(m))
        {
            return Err(StoreError::Invalid(format!(
                "the handler of {ty}: '{bad}' is not a Python module name"
            )));
        }
        if !h.files.contains_key(&h.entry) {
            return Err(StoreError::Invalid(format!(
                "the handler of {ty}: entry {} is not among its files",
                h.entry
            )));
        }
        for (path, f) in &h.files {
            if path.starts_with('/') || path.split('/').any(|p| p == ".." || p.is_empty()) {
                return Err(StoreError::Invalid(format!(
                    "the handler of {ty}: bad file path '{path}'"
                )));
            }
            let _ = f;
        }
    }
    Ok(())
}

/// `a.b_c.d`: what an Inmanta handler's `imports` may name.
fn is_python_dotted_name(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').all(|p| {
            p.chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

/// Store the handlers of a new version (its row exists) and the code they need.
pub async fn store_version_code(
    c: &mut PgConnection,
    env: Uuid,
    version: i32,
    export: &ExportFile,
) -> Result<()> {
    if export.handlers.is_empty() {
        return Ok(());
    }
    let needed: HashSet<&str> = export
        .handlers
        .values()
        .flat_map(|h| h.files.values().map(|f| f.hash.as_str()))
        .collect();
    let needed: Vec<&str> = needed.into_iter().collect();
    let known: HashSet<String> =
        sqlx::query_scalar("SELECT hash FROM code_blobs WHERE hash = ANY($1)")
            .bind(&needed)
            .fetch_all(&mut *c)
            .await?
            .into_iter()
            .collect();
    let mut hashes = Vec::new();
    let mut contents = Vec::new();
    for h in needed {
        if known.contains(h) {
            continue;
        }
        let hexed = export.code.get(h).ok_or_else(|| {
            StoreError::Invalid(format!(
                "handler file {h} is missing from the export's code"
            ))
        })?;
        hashes.push(h.to_string());
        contents.push(
            hex::decode(hexed).map_err(|_| StoreError::Invalid(format!("code {h} is not hex")))?,
        );
    }
    if !hashes.is_empty() {
        sqlx::query("INSERT INTO code_blobs (hash, content) SELECT * FROM unnest($1::text[], $2::bytea[]) ON CONFLICT (hash) DO UPDATE SET created_at = now()")
            .bind(&hashes)
            .bind(&contents)
            .execute(&mut *c)
            .await?;
    }
    for (ty, h) in &export.handlers {
        sqlx::query(
            "INSERT INTO version_handlers (environment_id, version, resource_type, module, entry, files, digest, inmanta) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(env)
        .bind(version)
        .bind(ty)
        .bind(&h.module)
        .bind(&h.entry)
        .bind(serde_json::to_value(&h.files).unwrap_or_default())
        .bind(&h.digest)
        .bind(h.inmanta.as_ref().map(|i| serde_json::to_value(i).unwrap_or_default()))
        .execute(&mut *c)
        .await?;
    }
    Ok(())
}

/// Resource type -> its handler code, for a version.
pub async fn handlers_of(
    e: impl PgExecutor<'_>,
    env: Uuid,
    version: i32,
) -> Result<BTreeMap<String, HandlerCode>> {
    let rows: Vec<HandlerRow> = sqlx::query_as(
        "SELECT resource_type, module, entry, files, digest, inmanta FROM version_handlers WHERE environment_id = $1 AND version = $2",
    )
    .bind(env)
    .bind(version)
    .fetch_all(e)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(ty, module, entry, files, digest, inmanta)| {
            (ty, handler_code(module, entry, files, digest, inmanta))
        })
        .collect())
}

/// File contents by hash.
pub async fn blobs(e: impl PgExecutor<'_>, hashes: &[String]) -> Result<HashMap<String, Vec<u8>>> {
    let rows: Vec<(String, Vec<u8>)> =
        sqlx::query_as("SELECT hash, content FROM code_blobs WHERE hash = ANY($1)")
            .bind(hashes)
            .fetch_all(e)
            .await?;
    Ok(rows.into_iter().collect())
}

/// The handler code with this digest, as some version of `env` ships it.
pub async fn by_digest(e: impl PgExecutor<'_>, env: Uuid, digest: &str) -> Result<HandlerCode> {
    let row: Option<HandlerRow> = sqlx::query_as(
        "SELECT resource_type, module, entry, files, digest, inmanta FROM version_handlers \
         WHERE environment_id = $1 AND digest = $2 LIMIT 1",
    )
    .bind(env)
    .bind(digest)
    .fetch_optional(e)
    .await?;
    let (_, module, entry, files, digest, inmanta) =
        row.ok_or_else(|| super::StoreError::NotFound(format!("handler code {digest}")))?;
    Ok(handler_code(module, entry, files, digest, inmanta))
}

/// Whether handler code `digest` serves a resource of one of `agents` in some version of
/// `env` (what an agent token naming those agents may fetch).
pub async fn used_by_agents(
    e: impl PgExecutor<'_>,
    env: Uuid,
    digest: &str,
    agents: &[String],
) -> Result<bool> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM version_handlers h JOIN resource_spans r \
           ON r.environment_id = h.environment_id \
           AND r.first_version <= h.version AND r.last_version >= h.version \
           AND r.resource_type = h.resource_type \
         WHERE h.environment_id = $1 AND h.digest = $2 AND r.agent = ANY($3))",
    )
    .bind(env)
    .bind(digest)
    .bind(agents)
    .fetch_one(e)
    .await?)
}

/// resource type, module, entry, files, digest, inmanta.
type HandlerRow = (
    String,
    String,
    String,
    serde_json::Value,
    String,
    Option<serde_json::Value>,
);

fn handler_code(
    module: String,
    entry: String,
    files: serde_json::Value,
    digest: String,
    inmanta: Option<serde_json::Value>,
) -> HandlerCode {
    HandlerCode {
        module,
        entry,
        files: serde_json::from_value(files).unwrap_or_default(),
        digest,
        inmanta: inmanta.and_then(|v| serde_json::from_value(v).ok()),
    }
}

/// Digests of the handler code some stored version of any environment uses: the code
/// directories executors may still need (`scheduler::code::reap` removes the others).
pub async fn live_digests(e: impl PgExecutor<'_>) -> Result<std::collections::HashSet<String>> {
    let rows: Vec<(String,)> = sqlx::query_as("SELECT DISTINCT digest FROM version_handlers")
        .fetch_all(e)
        .await?;
    Ok(rows.into_iter().map(|(d,)| d).collect())
}

/// The Python requirement lists of the Inmanta handler code that stored versions ship
/// (each once): the handler environments they need.
pub async fn live_handler_requirements(e: impl PgExecutor<'_>) -> Result<Vec<Vec<String>>> {
    let rows: Vec<(serde_json::Value,)> =
        sqlx::query_as("SELECT DISTINCT inmanta FROM version_handlers WHERE inmanta IS NOT NULL")
            .fetch_all(e)
            .await?;
    Ok(rows
        .into_iter()
        .filter_map(|(v,)| serde_json::from_value::<crate::model::InmantaCode>(v).ok())
        .map(|c| c.requirements)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CodeFile, InmantaCode};

    fn export_with(imports: &[&str], digest: Option<&str>) -> ExportFile {
        let content = b"import os\n";
        let hash = hex::encode(Sha256::digest(content));
        let mut files = BTreeMap::new();
        files.insert(
            "inmanta_plugins/m/__init__.py".to_string(),
            CodeFile {
                hash: hash.clone(),
                executable: false,
            },
        );
        let mut h = HandlerCode {
            module: "m".into(),
            entry: "inmanta_plugins/m/__init__.py".into(),
            files,
            digest: String::new(),
            inmanta: Some(InmantaCode {
                requirements: vec!["mitogen".into()],
                imports: imports.iter().map(|s| s.to_string()).collect(),
            }),
        };
        h.digest = digest
            .map(str::to_string)
            .unwrap_or_else(|| h.expected_digest());
        let mut x = ExportFile::default();
        x.handlers.insert("m::T".into(), h);
        x.code.insert(hash, hex::encode(content));
        x
    }

    #[test]
    fn inmanta_code_is_validated_with_its_requirements_and_imports() {
        validate(&export_with(&["inmanta_plugins.m"], None)).unwrap();
        // a digest over the files only: not enough
        let files_only = {
            let x = export_with(&["inmanta_plugins.m"], None);
            let h = &x.handlers["m::T"];
            HandlerCode::compute_digest(&h.entry, &h.files)
        };
        let err = validate(&export_with(&["inmanta_plugins.m"], Some(&files_only)))
            .unwrap_err()
            .to_string();
        assert!(err.contains("requirements and imports"), "{err}");
        let err = validate(&export_with(&["inmanta_plugins.m; rm -rf /"], None))
            .unwrap_err()
            .to_string();
        assert!(err.contains("is not a Python module name"), "{err}");
    }
}

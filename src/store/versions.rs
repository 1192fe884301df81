//! Versions: immutable snapshots of an environment's desired state, their diffs, releases.
//!
//! Storing a version runs in one transaction under the environment's row lock: number it,
//! store attributes content-addressed (unchanged resources share rows across versions), store
//! its resources, compute the diff against the previous version, apply retention, and release
//! it when the environment auto-releases. Releases are approvals bound to the version's
//! content hash; the *active* version is the newest released one.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgExecutor};
use uuid::Uuid;

use super::environments;
use super::{Result, StoreError};
use crate::model::diff::{self, ChangeKind, ResourceDigest};
use crate::model::{ExportFile, Resource, ResourceId};

#[derive(Clone, Debug, Serialize, serde::Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct VersionInfo {
    pub environment_id: Uuid,
    pub number: i32,
    pub created_at: DateTime<Utc>,
    pub uploader: String,
    pub origin: String,
    pub content_hash: String,
    pub provenance: serde_json::Value,
    pub metadata: serde_json::Value,
    pub resource_count: i32,
    pub status: String,
    pub released_at: Option<DateTime<Utc>>,
    pub diff_summary: serde_json::Value,
    pub diff_base: Option<i32>,
}

const COLUMNS: &str = "environment_id, number, created_at, uploader, origin, content_hash, provenance, metadata, \
     resource_count, status, released_at, diff_summary, diff_base";

#[derive(Clone, Debug, Serialize, serde::Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct StoredResource {
    pub resource_id: String,
    pub resource_type: String,
    pub agent: String,
    pub hash: String,
    pub attributes: serde_json::Value,
    pub requires: Vec<String>,
    pub undefined: bool,
}

impl StoredResource {
    pub fn to_resource(&self) -> Resource {
        Resource {
            id: ResourceId(self.resource_id.clone()),
            type_name: self.resource_type.clone(),
            agent: self.agent.clone(),
            attributes: self.attributes.as_object().cloned().unwrap_or_default(),
            requires: self
                .requires
                .iter()
                .map(|r| ResourceId(r.clone()))
                .collect(),
        }
    }
}

#[derive(Clone, Debug, Serialize, serde::Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct DiffEntry {
    pub resource_id: String,
    pub change: String,
    pub attributes: serde_json::Value,
}

#[derive(Clone, Debug, Serialize, serde::Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Approval {
    pub id: i64,
    pub version: i32,
    pub content_hash: String,
    pub decision: String,
    pub approver: String,
    pub comment: String,
    pub at: DateTime<Utc>,
}

pub struct NewVersion<'a> {
    pub export: &'a ExportFile,
    /// Who stored it: a token name, "git", …
    pub uploader: &'a str,
    /// push | git | rollback
    pub origin: &'a str,
    pub provenance: serde_json::Value,
}

pub struct Stored {
    pub info: VersionInfo,
    pub auto_released: bool,
}

/// Check an export before it becomes a version: unique ids, ids consistent with type and
/// agent, `requires` and `undefined` pointing inside the version.
pub fn validate_export(export: &ExportFile) -> Result<()> {
    if export.format != crate::model::EXPORT_FORMAT {
        return Err(StoreError::Invalid(format!(
            "unsupported export format {} (this server reads format {})",
            export.format,
            crate::model::EXPORT_FORMAT
        )));
    }
    let mut ids = std::collections::HashSet::with_capacity(export.resources.len());
    for r in &export.resources {
        if r.id.0.chars().any(char::is_control) {
            return Err(StoreError::Invalid(format!(
                "resource id {:?} contains a control character",
                r.id.0
            )));
        }
        let Some((ty, agent, _, _)) = r.id.parse() else {
            return Err(StoreError::Invalid(format!(
                "'{}' is not a resource id (type[agent,attr=value])",
                r.id
            )));
        };
        if ty != r.type_name || agent != r.agent {
            return Err(StoreError::Invalid(format!(
                "resource {}: type '{}' and agent '{}' do not match its id",
                r.id, r.type_name, r.agent
            )));
        }
        if !ids.insert(r.id.0.as_str()) {
            return Err(StoreError::Invalid(format!(
                "resource {} appears twice",
                r.id
            )));
        }
    }
    for r in &export.resources {
        for q in &r.requires {
            if !ids.contains(q.0.as_str()) {
                return Err(StoreError::Invalid(format!(
                    "resource {} requires {}, which is not in this version",
                    r.id, q
                )));
            }
        }
    }
    for u in &export.undefined {
        if !ids.contains(u.0.as_str()) {
            return Err(StoreError::Invalid(format!(
                "undefined resource {u} is not in this version"
            )));
        }
    }
    if let Some(cycle) = crate::model::find_cycle(&export.resources) {
        return Err(StoreError::Invalid(format!(
            "dependency cycle: {}",
            cycle
                .iter()
                .map(|c| c.0.as_str())
                .collect::<Vec<_>>()
                .join(" -> ")
        )));
    }
    Ok(())
}

/// Store a new version (see the module doc).
pub async fn store(c: &mut PgConnection, env_id: Uuid, nv: NewVersion<'_>) -> Result<Stored> {
    validate_export(nv.export)?;
    super::code::validate(nv.export)?;
    super::facts::validate_unknowns(&nv.export.unknowns)?;
    let env = environments::lock(&mut *c, env_id).await?;
    let (prev,): (Option<i32>,) =
        sqlx::query_as("SELECT max(number) FROM versions WHERE environment_id = $1")
            .bind(env_id)
            .fetch_one(&mut *c)
            .await?;
    let number = prev.unwrap_or(0) + 1;
    let res = &nv.export.resources;
    let undefined: std::collections::HashSet<&str> =
        nv.export.undefined.iter().map(|u| u.0.as_str()).collect();
    let hashes: Vec<String> = res.iter().map(Resource::hash).collect();
    let requires: Vec<Vec<String>> = res
        .iter()
        .map(|r| r.requires.iter().map(|q| q.0.clone()).collect())
        .collect();
    let mut content_hash = diff::content_hash(res.iter().enumerate().map(|(i, r)| {
        (
            r.id.0.as_str(),
            hashes[i].as_str(),
            requires[i].as_slice(),
            undefined.contains(r.id.0.as_str()),
        )
    }));
    // an approval covers the handler code too: other code, another content hash
    if !nv.export.handlers.is_empty() {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update(content_hash.as_bytes());
        for (ty, code) in &nv.export.handlers {
            h.update(format!("\n{ty}={}", code.digest).as_bytes());
        }
        content_hash = hex::encode(h.finalize());
    }
    // attributes, content-addressed
    // most attributes are stored already (a new version changes a few resources): send only
    // the blobs the database does not have
    let known: std::collections::HashSet<String> =
        sqlx::query_scalar("SELECT hash FROM resource_blobs WHERE hash = ANY($1)")
            .bind(&hashes)
            .fetch_all(&mut *c)
            .await?
            .into_iter()
            .collect();
    let mut sent = std::collections::HashSet::new();
    let (missing_hashes, missing_attrs): (Vec<&str>, Vec<serde_json::Value>) = res
        .iter()
        .zip(&hashes)
        .filter(|(_, h)| !known.contains(*h) && sent.insert(h.as_str()))
        .map(|(r, h)| (h.as_str(), serde_json::Value::Object(r.attributes.clone())))
        .unzip();
    if !missing_hashes.is_empty() {
        sqlx::query(
            "INSERT INTO resource_blobs (hash, attributes) SELECT * FROM unnest($1::text[], $2::jsonb[]) \
             ON CONFLICT (hash) DO NOTHING",
        )
        .bind(&missing_hashes)
        .bind(&missing_attrs)
        .execute(&mut *c)
        .await?;
    }
    let metadata = serde_json::to_value(&nv.export.metadata).unwrap_or_default();
    sqlx::query(
        "INSERT INTO versions (environment_id, number, uploader, origin, content_hash, provenance, metadata, \
         resource_count, diff_base) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(env_id)
    .bind(number)
    .bind(nv.uploader)
    .bind(nv.origin)
    .bind(&content_hash)
    .bind(&nv.provenance)
    .bind(&metadata)
    .bind(res.len() as i32)
    .bind(prev)
    .execute(&mut *c)
    .await?;
    let ids: Vec<&str> = res.iter().map(|r| r.id.0.as_str()).collect();
    let types: Vec<&str> = res.iter().map(|r| r.type_name.as_str()).collect();
    let agents: Vec<&str> = res.iter().map(|r| r.agent.as_str()).collect();
    // requires travel as one newline-separated text per resource (ids hold no newline; a
    // ragged text[][] can not be bound, and jsonb costs a parse per row)
    let reqs: Vec<String> = requires.iter().map(|r| r.join("\n")).collect();
    let undef: Vec<bool> = ids.iter().map(|i| undefined.contains(i)).collect();
    sqlx::query(
        "INSERT INTO version_resources (environment_id, version, resource_id, resource_type, agent, hash, requires, undefined) \
         SELECT $1, $2, u.rid, u.rtype, u.agent, u.hash, \
         CASE WHEN u.req = '' THEN '{}'::text[] ELSE string_to_array(u.req, E'\\n') END, u.undef \
         FROM unnest($3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::bool[]) AS u(rid, rtype, agent, hash, req, undef)",
    )
    .bind(env_id)
    .bind(number)
    .bind(&ids)
    .bind(&types)
    .bind(&agents)
    .bind(&hashes)
    .bind(&reqs)
    .bind(&undef)
    .execute(&mut *c)
    .await?;
    super::code::store_version_code(&mut *c, env_id, number, nv.export).await?;
    super::facts::record_unknowns(&mut *c, env_id, number, &nv.export.unknowns).await?;
    // diff against the previous version
    let new_digests: BTreeMap<String, ResourceDigest> = res
        .iter()
        .enumerate()
        .map(|(i, r)| {
            (
                r.id.0.clone(),
                ResourceDigest {
                    hash: hashes[i].clone(),
                    undefined: undef[i],
                },
            )
        })
        .collect();
    let new_attrs: HashMap<&str, &serde_json::Map<String, serde_json::Value>> = res
        .iter()
        .map(|r| (r.id.0.as_str(), &r.attributes))
        .collect();
    let summary = match prev {
        Some(base) => {
            let old = digests(&mut *c, env_id, base).await?;
            store_diff(&mut *c, env_id, number, &old, &new_digests, |id| {
                new_attrs.get(id).map(|m| (*m).clone())
            })
            .await?
        }
        None => {
            let old = BTreeMap::new();
            store_diff(&mut *c, env_id, number, &old, &new_digests, |id| {
                new_attrs.get(id).map(|m| (*m).clone())
            })
            .await?
        }
    };
    sqlx::query("UPDATE versions SET diff_summary = $3 WHERE environment_id = $1 AND number = $2")
        .bind(env_id)
        .bind(number)
        .bind(&summary)
        .execute(&mut *c)
        .await?;
    // release by policy
    let mut auto_released = false;
    if env.settings.auto_release && !env.auto_release_held {
        release_locked(
            &mut *c,
            env_id,
            number,
            "auto-release",
            "released automatically",
        )
        .await?;
        auto_released = true;
    }
    apply_retention(&mut *c, env_id, env.settings.version_retention).await?;
    let info = get(&mut *c, env_id, number).await?;
    Ok(Stored {
        info,
        auto_released,
    })
}

async fn digests(
    c: &mut PgConnection,
    env: Uuid,
    version: i32,
) -> Result<BTreeMap<String, ResourceDigest>> {
    let rows: Vec<(String, String, bool)> = sqlx::query_as(
        "SELECT resource_id, hash, undefined FROM version_resources WHERE environment_id = $1 AND version = $2",
    )
    .bind(env)
    .bind(version)
    .fetch_all(&mut *c)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, hash, undefined)| (id, ResourceDigest { hash, undefined }))
        .collect())
}

async fn blobs(
    c: &mut PgConnection,
    hashes: &[String],
) -> Result<HashMap<String, serde_json::Value>> {
    let rows: Vec<(String, serde_json::Value)> =
        sqlx::query_as("SELECT hash, attributes FROM resource_blobs WHERE hash = ANY($1)")
            .bind(hashes)
            .fetch_all(&mut *c)
            .await?;
    Ok(rows.into_iter().collect())
}

/// Compute the per-resource diff and store it; returns the summary counts.
async fn store_diff(
    c: &mut PgConnection,
    env: Uuid,
    number: i32,
    old: &BTreeMap<String, ResourceDigest>,
    new: &BTreeMap<String, ResourceDigest>,
    new_attrs: impl Fn(&str) -> Option<serde_json::Map<String, serde_json::Value>>,
) -> Result<serde_json::Value> {
    let entries = compute_diff(c, old, new, new_attrs).await?;
    let mut counts: BTreeMap<&str, i64> =
        [("new", 0), ("updated", 0), ("deleted", 0), ("unchanged", 0)].into();
    let unchanged =
        new.len() as i64 - entries.iter().filter(|e| e.change != "deleted").count() as i64;
    for e in &entries {
        *counts.entry(e.change.as_str()).or_default() += 1;
    }
    counts.insert("unchanged", unchanged);
    let ids: Vec<&str> = entries.iter().map(|e| e.resource_id.as_str()).collect();
    let kinds: Vec<&str> = entries.iter().map(|e| e.change.as_str()).collect();
    let attrs: Vec<&serde_json::Value> = entries.iter().map(|e| &e.attributes).collect();
    sqlx::query(
        "INSERT INTO version_diffs (environment_id, version, resource_id, change, attributes) \
         SELECT $1, $2, * FROM unnest($3::text[], $4::text[], $5::jsonb[])",
    )
    .bind(env)
    .bind(number)
    .bind(&ids)
    .bind(&kinds)
    .bind(&attrs)
    .execute(&mut *c)
    .await?;
    Ok(serde_json::json!(counts))
}

/// The changed resources between two digest sets (unchanged ones are left out).
pub(super) async fn compute_diff(
    c: &mut PgConnection,
    old: &BTreeMap<String, ResourceDigest>,
    new: &BTreeMap<String, ResourceDigest>,
    new_attrs: impl Fn(&str) -> Option<serde_json::Map<String, serde_json::Value>>,
) -> Result<Vec<DiffEntry>> {
    let classified = diff::classify(old, new);
    let updated_old: Vec<String> = classified
        .iter()
        .filter(|(_, k)| *k == ChangeKind::Updated)
        .map(|(id, _)| old[*id].hash.clone())
        .collect();
    let old_blobs = blobs(c, &updated_old).await?;
    let mut out = Vec::new();
    for (id, kind) in classified {
        let attributes = match kind {
            ChangeKind::Unchanged => continue,
            ChangeKind::New | ChangeKind::Deleted => serde_json::json!({}),
            ChangeKind::Updated => {
                let before = old_blobs
                    .get(&old[id].hash)
                    .and_then(|v| v.as_object().cloned())
                    .unwrap_or_default();
                let after = new_attrs(id).unwrap_or_default();
                serde_json::to_value(diff::attribute_changes(&before, &after)).unwrap_or_default()
            }
        };
        out.push(DiffEntry {
            resource_id: id.to_string(),
            change: kind.as_str().to_string(),
            attributes,
        });
    }
    Ok(out)
}

/// The stored diff of a version against its diff base.
pub async fn stored_diff(e: impl PgExecutor<'_>, env: Uuid, number: i32) -> Result<Vec<DiffEntry>> {
    Ok(sqlx::query_as::<_, DiffEntry>(
        "SELECT resource_id, change, attributes FROM version_diffs WHERE environment_id = $1 AND version = $2 \
         ORDER BY resource_id",
    )
    .bind(env)
    .bind(number)
    .fetch_all(e)
    .await?)
}

/// The diff between any two versions `from` -> `to`.
pub async fn diff_between(
    c: &mut PgConnection,
    env: Uuid,
    from: i32,
    to: i32,
) -> Result<Vec<DiffEntry>> {
    get(&mut *c, env, from).await?;
    get(&mut *c, env, to).await?;
    let old = digests(&mut *c, env, from).await?;
    let new = digests(&mut *c, env, to).await?;
    let changed_new: Vec<String> = new
        .iter()
        .filter(|(id, d)| old.get(*id).is_some_and(|o| o.hash != d.hash))
        .map(|(_, d)| d.hash.clone())
        .collect();
    let new_blobs = blobs(&mut *c, &changed_new).await?;
    let mut entries = compute_diff(&mut *c, &old, &new, |id| {
        new.get(id)
            .and_then(|d| new_blobs.get(&d.hash))
            .and_then(|v| v.as_object().cloned())
    })
    .await?;
    entries.sort_by(|a, b| a.resource_id.cmp(&b.resource_id));
    Ok(entries)
}

pub async fn get(e: impl PgExecutor<'_>, env: Uuid, number: i32) -> Result<VersionInfo> {
    let sql = format!("SELECT {COLUMNS} FROM versions WHERE environment_id = $1 AND number = $2");
    sqlx::query_as::<_, VersionInfo>(sqlx::AssertSqlSafe(sql))
        .bind(env)
        .bind(number)
        .fetch_optional(e)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("version {number}")))
}

/// Newest first; with `before`, only versions numbered below it (the next page of a list).
pub async fn list(
    e: impl PgExecutor<'_>,
    env: Uuid,
    limit: i64,
    before: Option<i32>,
) -> Result<Vec<VersionInfo>> {
    let sql = format!(
        "SELECT {COLUMNS} FROM versions WHERE environment_id = $1 AND ($3::int IS NULL OR number < $3) \
         ORDER BY number DESC LIMIT $2"
    );
    Ok(sqlx::query_as::<_, VersionInfo>(sqlx::AssertSqlSafe(sql))
        .bind(env)
        .bind(limit)
        .bind(before)
        .fetch_all(e)
        .await?)
}

/// How many decisions (releases and rejections) each of these versions has.
pub async fn decision_counts(
    e: impl PgExecutor<'_>,
    env: Uuid,
    numbers: &[i32],
) -> Result<HashMap<i32, i64>> {
    let rows: Vec<(i32, i64)> = sqlx::query_as(
        "SELECT version, count(*) FROM approvals WHERE environment_id = $1 AND version = ANY($2) \
         GROUP BY version",
    )
    .bind(env)
    .bind(numbers)
    .fetch_all(e)
    .await?;
    Ok(rows.into_iter().collect())
}

/// Versions waiting for a decision: not released nor rejected, newer than the active one.
pub async fn waiting(e: impl PgExecutor<'_>, env: Uuid) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM versions v WHERE v.environment_id = $1 AND v.status = 'new' \
         AND v.number > COALESCE((SELECT max(number) FROM versions a \
           WHERE a.environment_id = $1 AND a.status = 'released'), 0)",
    )
    .bind(env)
    .fetch_one(e)
    .await?)
}

/// The active version: the newest released one.
pub async fn active(e: impl PgExecutor<'_>, env: Uuid) -> Result<Option<i32>> {
    let (n,): (Option<i32>,) = sqlx::query_as(
        "SELECT max(number) FROM versions WHERE environment_id = $1 AND status = 'released'",
    )
    .bind(env)
    .fetch_one(e)
    .await?;
    Ok(n)
}

pub async fn resources(
    e: impl PgExecutor<'_>,
    env: Uuid,
    number: i32,
) -> Result<Vec<StoredResource>> {
    Ok(sqlx::query_as::<_, StoredResource>(
        "SELECT vr.resource_id, vr.resource_type, vr.agent, vr.hash, b.attributes, vr.requires, vr.undefined \
         FROM version_resources vr JOIN resource_blobs b ON b.hash = vr.hash \
         WHERE vr.environment_id = $1 AND vr.version = $2 ORDER BY vr.resource_id",
    )
    .bind(env)
    .bind(number)
    .fetch_all(e)
    .await?)
}

/// A resource of a version without its attributes (those are fetched by hash, when needed).
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct ResourceDigestRow {
    pub resource_id: String,
    pub resource_type: String,
    pub agent: String,
    pub hash: String,
    pub requires: Vec<String>,
    pub undefined: bool,
}

pub async fn resource_digests(
    e: impl PgExecutor<'_>,
    env: Uuid,
    number: i32,
) -> Result<Vec<ResourceDigestRow>> {
    Ok(sqlx::query_as::<_, ResourceDigestRow>(
        "SELECT resource_id, resource_type, agent, hash, requires, undefined FROM version_resources \
         WHERE environment_id = $1 AND version = $2 ORDER BY resource_id",
    )
    .bind(env)
    .bind(number)
    .fetch_all(e)
    .await?)
}

/// Attributes by content hash.
pub async fn attributes_by_hash(
    e: impl PgExecutor<'_>,
    hashes: &[String],
) -> Result<HashMap<String, serde_json::Value>> {
    if hashes.is_empty() {
        return Ok(HashMap::new());
    }
    let rows: Vec<(String, serde_json::Value)> =
        sqlx::query_as("SELECT hash, attributes FROM resource_blobs WHERE hash = ANY($1)")
            .bind(hashes)
            .fetch_all(e)
            .await?;
    Ok(rows.into_iter().collect())
}

/// The whole version as an export file (what was uploaded, modulo key order).
pub async fn export_of(c: &mut PgConnection, env: Uuid, number: i32) -> Result<ExportFile> {
    let info = get(&mut *c, env, number).await?;
    let res = resources(&mut *c, env, number).await?;
    let handlers = super::code::handlers_of(&mut *c, env, number).await?;
    let hashes: Vec<String> = handlers
        .values()
        .flat_map(|h| h.files.values().map(|f| f.hash.clone()))
        .collect();
    let code = super::code::blobs(&mut *c, &hashes)
        .await?
        .into_iter()
        .map(|(h, content)| (h, hex::encode(content)))
        .collect();
    Ok(ExportFile {
        format: crate::model::EXPORT_FORMAT,
        undefined: res
            .iter()
            .filter(|r| r.undefined)
            .map(|r| ResourceId(r.resource_id.clone()))
            .collect(),
        resources: res.iter().map(StoredResource::to_resource).collect(),
        metadata: serde_json::from_value(info.metadata).unwrap_or_default(),
        handlers,
        code,
        unknowns: super::facts::unknowns_of(&mut *c, env, number)
            .await?
            .into_iter()
            .map(|(u, _)| u)
            .collect(),
    })
}

/// One resource across versions: (version, hash, undefined), newest first.
pub async fn resource_history(
    e: impl PgExecutor<'_>,
    env: Uuid,
    resource_id: &str,
) -> Result<Vec<(i32, String, bool)>> {
    Ok(sqlx::query_as(
        "SELECT version, hash, undefined FROM version_resources WHERE environment_id = $1 AND resource_id = $2 \
         ORDER BY version DESC",
    )
    .bind(env)
    .bind(resource_id)
    .fetch_all(e)
    .await?)
}

pub async fn resource_in(
    e: impl PgExecutor<'_>,
    env: Uuid,
    number: i32,
    resource_id: &str,
) -> Result<StoredResource> {
    sqlx::query_as::<_, StoredResource>(
        "SELECT vr.resource_id, vr.resource_type, vr.agent, vr.hash, b.attributes, vr.requires, vr.undefined \
         FROM version_resources vr JOIN resource_blobs b ON b.hash = vr.hash \
         WHERE vr.environment_id = $1 AND vr.version = $2 AND vr.resource_id = $3",
    )
    .bind(env)
    .bind(number)
    .bind(resource_id)
    .fetch_optional(e)
    .await?
    .ok_or_else(|| StoreError::NotFound(format!("resource {resource_id} in version {number}")))
}

/// Release under the environment lock (the caller holds it).
async fn release_locked(
    c: &mut PgConnection,
    env: Uuid,
    number: i32,
    approver: &str,
    comment: &str,
) -> Result<VersionInfo> {
    let v = get(&mut *c, env, number).await?;
    match v.status.as_str() {
        "released" => {
            return Err(StoreError::Conflict(format!(
                "version {number} is released already"
            )));
        }
        "rejected" => {
            return Err(StoreError::Conflict(format!(
                "version {number} was rejected"
            )));
        }
        _ => {}
    }
    if let Some(active) = active(&mut *c, env).await?
        && active > number
    {
        return Err(StoreError::Conflict(format!(
            "version {number} is older than the active version {active}: roll back to it instead"
        )));
    }
    sqlx::query(
        "INSERT INTO approvals (environment_id, version, content_hash, decision, approver, comment) \
         VALUES ($1, $2, $3, 'release', $4, $5)",
    )
    .bind(env)
    .bind(number)
    .bind(&v.content_hash)
    .bind(approver)
    .bind(comment)
    .execute(&mut *c)
    .await?;
    sqlx::query("UPDATE versions SET status = 'released', released_at = now() WHERE environment_id = $1 AND number = $2")
        .bind(env)
        .bind(number)
        .execute(&mut *c)
        .await?;
    get(&mut *c, env, number).await
}

/// Release a version (an approval bound to its content hash). `expected_hash`, when given,
/// must match: an approver approves exactly what they reviewed. An explicit release ends the
/// auto-release hold of a rollback.
pub async fn release(
    c: &mut PgConnection,
    env: Uuid,
    number: i32,
    approver: &str,
    comment: &str,
    expected_hash: Option<&str>,
) -> Result<VersionInfo> {
    environments::lock(&mut *c, env).await?;
    let v = get(&mut *c, env, number).await?;
    if let Some(h) = expected_hash
        && h != v.content_hash
    {
        return Err(StoreError::Conflict(format!(
            "version {number} has content hash {}, not the {h} you approved",
            v.content_hash
        )));
    }
    let info = release_locked(&mut *c, env, number, approver, comment).await?;
    environments::set_auto_release_held(&mut *c, env, false).await?;
    Ok(info)
}

pub async fn reject(
    c: &mut PgConnection,
    env: Uuid,
    number: i32,
    approver: &str,
    comment: &str,
) -> Result<VersionInfo> {
    environments::lock(&mut *c, env).await?;
    let v = get(&mut *c, env, number).await?;
    if v.status != "new" {
        return Err(StoreError::Conflict(format!(
            "version {number} is {} already",
            v.status
        )));
    }
    sqlx::query(
        "INSERT INTO approvals (environment_id, version, content_hash, decision, approver, comment) \
         VALUES ($1, $2, $3, 'reject', $4, $5)",
    )
    .bind(env)
    .bind(number)
    .bind(&v.content_hash)
    .bind(approver)
    .bind(comment)
    .execute(&mut *c)
    .await?;
    sqlx::query(
        "UPDATE versions SET status = 'rejected' WHERE environment_id = $1 AND number = $2",
    )
    .bind(env)
    .bind(number)
    .execute(&mut *c)
    .await?;
    get(&mut *c, env, number).await
}

pub async fn approvals(e: impl PgExecutor<'_>, env: Uuid, number: i32) -> Result<Vec<Approval>> {
    Ok(sqlx::query_as::<_, Approval>(
        "SELECT id, version, content_hash, decision, approver, comment, at FROM approvals \
         WHERE environment_id = $1 AND version = $2 ORDER BY id",
    )
    .bind(env)
    .bind(number)
    .fetch_all(e)
    .await?)
}

/// Roll back: a new version with the content of `from`, released at once; automatic release
/// is then held until a newer version is released explicitly.
pub async fn rollback(
    c: &mut PgConnection,
    env: Uuid,
    from: i32,
    actor: &str,
    comment: &str,
) -> Result<VersionInfo> {
    let export = export_of(&mut *c, env, from).await?;
    let provenance = serde_json::json!({ "rollback_of": from });
    // hold first so that storing does not auto-release: the release below is explicit
    environments::lock(&mut *c, env).await?;
    environments::set_auto_release_held(&mut *c, env, true).await?;
    let stored = store(
        &mut *c,
        env,
        NewVersion {
            export: &export,
            uploader: actor,
            origin: "rollback",
            provenance,
        },
    )
    .await?;
    let info = release_locked(&mut *c, env, stored.info.number, actor, comment).await?;
    Ok(info)
}

/// Delete a version; never the active one.
pub async fn delete(c: &mut PgConnection, env: Uuid, number: i32) -> Result<()> {
    environments::lock(&mut *c, env).await?;
    get(&mut *c, env, number).await?;
    if active(&mut *c, env).await? == Some(number) {
        return Err(StoreError::Conflict(format!(
            "version {number} is the active version and can not be deleted"
        )));
    }
    delete_unchecked(c, env, &[number]).await
}

async fn delete_unchecked(c: &mut PgConnection, env: Uuid, numbers: &[i32]) -> Result<()> {
    let hashes: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT hash FROM version_resources WHERE environment_id = $1 AND version = ANY($2)",
    )
    .bind(env)
    .bind(numbers)
    .fetch_all(&mut *c)
    .await?;
    sqlx::query("DELETE FROM versions WHERE environment_id = $1 AND number = ANY($2)")
        .bind(env)
        .bind(numbers)
        .execute(&mut *c)
        .await?;
    // attributes nobody refers to any more
    sqlx::query(
        "DELETE FROM resource_blobs b WHERE b.hash = ANY($1) \
         AND NOT EXISTS (SELECT 1 FROM version_resources vr WHERE vr.hash = b.hash)",
    )
    .bind(&hashes)
    .execute(&mut *c)
    .await?;
    Ok(())
}

/// Keep the newest `keep` versions and the active one.
async fn apply_retention(c: &mut PgConnection, env: Uuid, keep: u32) -> Result<()> {
    let active = active(&mut *c, env).await?.unwrap_or(0);
    let old: Vec<i32> = sqlx::query_scalar(
        "SELECT number FROM (SELECT number FROM versions WHERE environment_id = $1 ORDER BY number DESC OFFSET $3) o \
         WHERE number <> $2",
    )
    .bind(env)
    .bind(active)
    .bind(keep as i64)
    .fetch_all(&mut *c)
    .await?;
    if !old.is_empty() {
        delete_unchecked(c, env, &old).await?;
    }
    Ok(())
}

/// Number of versions per environment (for metrics).
pub async fn counts(e: impl PgExecutor<'_>) -> Result<Vec<(Uuid, i64)>> {
    Ok(
        sqlx::query_as("SELECT environment_id, count(*) FROM versions GROUP BY environment_id")
            .fetch_all(e)
            .await?,
    )
}

//! Versions: immutable snapshots of an environment's desired state, their diffs, releases.
//!
//! Storing a version (`versions/write.rs`) runs in one transaction under the environment's row
//! lock; its resources are kept as spans of versions (`versions/spans.rs`), so a version
//! costs rows for what it changes. Reads here see version V as the spans that cover it.
//! Releases are approvals bound to the version's content hash; the *active* version is the
//! newest released one.

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
    /// Where a version with many new attribute sets (5,000 or more, whole or sent as
    /// changes) may take a second connection from, to write them beside its own transaction
    /// while that writes the version's spans (the two in parallel). `None`: all in the
    /// transaction.
    pub attributes_beside: Option<&'a sqlx::PgPool>,
}

pub struct Stored {
    pub info: VersionInfo,
    pub auto_released: bool,
    /// Span rows the version opened (about the resources it changed or added).
    pub rows_opened: usize,
    /// The attributes it stored: (index in the export's resources, content hash), for
    /// [`hand_over`] once it is committed.
    pub fresh_attributes: Vec<(usize, String)>,
}

/// After the commit of `stored`: hand the attributes it stored over to the scheduler that
/// reads them next (moved out of `export`). See [`fresh`].
pub fn hand_over(stored: &mut Stored, export: &mut ExportFile) {
    fresh::hand_over(
        &mut export.resources,
        std::mem::take(&mut stored.fresh_attributes),
    );
}

/// Rows opened by one version from which the planner's statistics of `resource_spans` are
/// out of date enough to matter: with the statistics of a table that was nearly empty, it
/// takes "the open rows" for a handful and closes the next version's changed rows by
/// scanning all of them (measured: 70-80 ms instead of 40 to close 1,000 of 100,000, and
/// until autovacuum's next pass, which may be a minute away).
const ANALYZE_FROM_ROWS: usize = 5_000;

/// After the commit of a version that opened many span rows: refresh the statistics of
/// `resource_spans` in the background (one refresh at a time per database; a failure only
/// costs speed).
pub fn refresh_statistics_after(pool: &sqlx::PgPool, stored: &Stored) {
    // by database: a process with several (the tests) must not skip one database's refresh
    // because another's runs
    static RUNNING: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    if stored.rows_opened < ANALYZE_FROM_ROWS {
        return;
    }
    let options = pool.connect_options();
    let database = format!(
        "{}:{}/{}",
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or_default()
    );
    {
        let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        if running.contains(&database) {
            return;
        }
        running.push(database.clone());
    }
    let pool = pool.clone();
    tokio::spawn(async move {
        let started = std::time::Instant::now();
        match sqlx::query("ANALYZE resource_spans").execute(&pool).await {
            Ok(_) => tracing::debug!(
                ms = started.elapsed().as_secs_f64() * 1e3,
                "statistics of resource_spans refreshed"
            ),
            // e.g. a database user that does not own the table (an external PostgreSQL
            // set up by someone else): autovacuum refreshes them later
            Err(e) => {
                tracing::info!(error = %e, "could not refresh the statistics of resource_spans")
            }
        }
        RUNNING
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|d| *d != database);
    });
}

mod blobs;
mod fresh;
mod held;
mod spans;
mod write;

pub(in crate::store) use blobs::collect_blobs;
pub use held::{HeldManifest, ReadyManifest, held_manifests, offer_manifests};
pub use spans::{Entry, OPEN};
pub use write::{Manifest, store, store_delta, store_hashed, validate_export};

/// A version's resources by id: what the diff needs of each (attribute hash, undefined).
async fn digests(
    c: &mut PgConnection,
    env: Uuid,
    version: i32,
) -> Result<BTreeMap<String, ResourceDigest>> {
    let rows: Vec<(String, String, bool)> = sqlx::query_as(
        "SELECT resource_id, hash, undefined FROM resource_spans \
         WHERE environment_id = $1 AND first_version <= $2 AND last_version >= $2",
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
    let old_blobs = attributes_by_hash(&mut *c, &updated_old).await?;
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

/// The stored diff of a version against its diff base. A version stored with no version
/// before it (no diff base) has every resource new: that diff is not stored row by row
/// (100,000 rows for a first version of 100,000 resources) but read from its resources.
/// (Versions stored before that have the same rows stored; they are not read twice.)
pub async fn stored_diff(e: impl PgExecutor<'_>, env: Uuid, number: i32) -> Result<Vec<DiffEntry>> {
    Ok(sqlx::query_as::<_, DiffEntry>(
        "SELECT resource_id, change, attributes FROM version_diffs WHERE environment_id = $1 AND version = $2 \
         UNION ALL \
         SELECT s.resource_id, 'new', '{}'::jsonb FROM resource_spans s JOIN versions v \
           ON v.environment_id = s.environment_id AND v.number = $2 AND v.diff_base IS NULL \
         WHERE s.environment_id = $1 AND s.first_version <= $2 AND s.last_version >= $2 \
           AND NOT EXISTS (SELECT 1 FROM version_diffs d WHERE d.environment_id = $1 AND d.version = $2) \
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
    let new_blobs = attributes_by_hash(&mut *c, &changed_new).await?;
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
         FROM resource_spans vr JOIN resource_blobs b ON b.hash = vr.hash \
         WHERE vr.environment_id = $1 AND vr.first_version <= $2 AND vr.last_version >= $2 \
         ORDER BY vr.resource_id",
    )
    .bind(env)
    .bind(number)
    .fetch_all(e)
    .await?)
}

/// A resource of a version without its attributes (those are fetched by hash, when needed).
#[derive(Clone, Debug, PartialEq, sqlx::FromRow)]
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
        "SELECT resource_id, resource_type, agent, hash, requires, undefined FROM resource_spans \
         WHERE environment_id = $1 AND first_version <= $2 AND last_version >= $2 ORDER BY resource_id",
    )
    .bind(env)
    .bind(number)
    .fetch_all(e)
    .await?)
}

/// [`resource_digests`] of a version the store holds the manifest of in memory (the newest,
/// just stored: a scheduler merging it reads none of its rows; 100,000 resources: ~190 ms
/// on a busy database), else read. A version is never changed once stored, and its content
/// hash covers every resource's id (type and agent are in it), hash, requires and
/// undefined flag: the held manifest of the same number and content hash is the version.
pub async fn resource_digests_held_or_read(
    pool: &sqlx::PgPool,
    env: Uuid,
    number: i32,
) -> Result<Vec<ResourceDigestRow>> {
    let content_hash: Option<String> = sqlx::query_scalar(
        "SELECT content_hash FROM versions WHERE environment_id = $1 AND number = $2",
    )
    .bind(env)
    .bind(number)
    .fetch_optional(pool)
    .await?;
    let held = content_hash.and_then(|h| held::manifest_of(env, number, &h));
    let Some(manifest) = held else {
        return resource_digests(pool, env, number).await;
    };
    Ok(manifest
        .iter()
        .map(|(id, e)| ResourceDigestRow {
            resource_id: id.clone(),
            resource_type: e.resource_type.clone(),
            agent: e.agent.clone(),
            hash: e.hash.clone(),
            requires: e.requires.clone(),
            undefined: e.undefined,
        })
        .collect())
}

/// What changed from version `from` to the newer `to`: the resources `to` has that `from` had
/// not so (new or changed), and the ids `from` had that `to` has not so (changed or gone).
/// Reads the spans that start or end between them, not the versions: `None` when `from` no
/// longer exists (its rows may be gone; read `to` whole then).
pub async fn changes_between(
    pool: &sqlx::PgPool,
    env: Uuid,
    from: i32,
    to: i32,
) -> Result<Option<(Vec<ResourceDigestRow>, Vec<String>)>> {
    // one snapshot: `from` exists in it, so its rows are all there
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *tx)
        .await?;
    let exists: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM versions WHERE environment_id = $1 AND number = $2)",
    )
    .bind(env)
    .bind(from)
    .fetch_one(&mut *tx)
    .await?;
    if !exists {
        return Ok(None);
    }
    let opened = sqlx::query_as::<_, ResourceDigestRow>(
        "SELECT resource_id, resource_type, agent, hash, requires, undefined FROM resource_spans \
         WHERE environment_id = $1 AND first_version > $2 AND first_version <= $3 AND last_version >= $3 \
         ORDER BY resource_id",
    )
    .bind(env)
    .bind(from)
    .bind(to)
    .fetch_all(&mut *tx)
    .await?;
    let closed: Vec<String> = sqlx::query_scalar(
        "SELECT resource_id FROM resource_spans \
         WHERE environment_id = $1 AND last_version >= $2 AND last_version < $3 AND first_version <= $2",
    )
    .bind(env)
    .bind(from)
    .bind(to)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Some((opened, closed)))
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

/// A resource's attributes as [`take_attributes`] gives them.
#[derive(Debug)]
pub enum StoredAttributes {
    /// Handed over by a store in this process, parsed already.
    Map(fresh::AttributeMap),
    /// Read from the database: the JSON text of the object, for the reader to parse when it
    /// needs it (a scheduler restoring 100,000 resources deploys few of them soon, and
    /// parsing them all was most of its start).
    Text(String),
}

/// The attributes of `hashes`: those just handed over by a store in this process
/// ([`hand_over`]) taken out of memory, the others read as text. For one reader that builds
/// intents from them (the scheduler); what it takes is gone for others, who read it.
pub async fn take_attributes(
    e: impl PgExecutor<'_>,
    mut hashes: Vec<String>,
) -> Result<HashMap<String, StoredAttributes>> {
    let mut found: HashMap<String, StoredAttributes> = fresh::take(&mut hashes)
        .into_iter()
        .map(|(h, a)| (h, StoredAttributes::Map(a)))
        .collect();
    if hashes.is_empty() {
        return Ok(found);
    }
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT hash, attributes::text FROM resource_blobs WHERE hash = ANY($1)")
            .bind(&hashes)
            .fetch_all(e)
            .await?;
    found.extend(
        rows.into_iter()
            .map(|(h, a)| (h, StoredAttributes::Text(a))),
    );
    Ok(found)
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
        "SELECT v.number, s.hash, s.undefined FROM resource_spans s JOIN versions v \
           ON v.environment_id = s.environment_id AND v.number BETWEEN s.first_version AND s.last_version \
         WHERE s.environment_id = $1 AND s.resource_id = $2 ORDER BY v.number DESC",
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
         FROM resource_spans vr JOIN resource_blobs b ON b.hash = vr.hash \
         WHERE vr.environment_id = $1 AND vr.resource_id = $3 \
         AND vr.first_version <= $2 AND vr.last_version >= $2",
    )
    .bind(env)
    .bind(number)
    .bind(resource_id)
    .fetch_optional(e)
    .await?
    .ok_or_else(|| StoreError::NotFound(format!("resource {resource_id} in version {number}")))
}

/// Release under the environment lock (the caller holds it).
pub(super) async fn release_locked(
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
            attributes_beside: None,
        },
    )
    .await?;
    let info = release_locked(&mut *c, env, stored.info.number, actor, comment).await?;
    Ok(info)
}

/// Delete a version; never the active one, nor one a pending delete takes its intent from.
pub async fn delete(c: &mut PgConnection, env: Uuid, number: i32) -> Result<()> {
    environments::lock(&mut *c, env).await?;
    get(&mut *c, env, number).await?;
    if active(&mut *c, env).await? == Some(number) {
        return Err(StoreError::Conflict(format!(
            "version {number} is the active version and can not be deleted"
        )));
    }
    if super::deploy::versions_pending_deletes_need(&mut *c, env)
        .await?
        .contains(&number)
    {
        return Err(StoreError::Conflict(format!(
            "version {number} holds resources that were removed after it and are still to be \
             deleted on their targets (delete_removed_resources); it can be deleted once they are"
        )));
    }
    write::delete_unchecked(c, env, &[number]).await
}

/// Number of versions per environment (for metrics).
pub async fn counts(e: impl PgExecutor<'_>) -> Result<Vec<(Uuid, i64)>> {
    Ok(
        sqlx::query_as("SELECT environment_id, count(*) FROM versions GROUP BY environment_id")
            .fetch_all(e)
            .await?,
    )
}

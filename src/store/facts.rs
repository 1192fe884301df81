//! Parameters and facts, and the unknown values compiles could not resolve.
//!
//! One table, `parameters`: a *parameter* belongs to the environment (`resource_id` is `''`)
//! and never expires; a *fact* belongs to one resource (its id without version) and expires by
//! default, so that it is renewed from its agent. Values are text, as Inmanta's are. A write
//! ([`set_many`]) is one upsert that also stamps `updated` when the value is the same (that is
//! a renewal), and, in the same transaction, marks resolved the `version_unknowns` rows it
//! answers, so the caller learns which versions may now compile further.
//!
//! Every input is bounded ([`MAX_NAME`], [`MAX_RESOURCE_ID`], [`MAX_VALUE`],
//! [`MAX_METADATA`], [`MAX_ITEMS`]) and refused with a message naming the item.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{Acquire, PgConnection, PgExecutor};
use uuid::Uuid;

use super::{Result, StoreError};
use crate::model::{ResourceId, UnknownRecord};

/// Longest name of a parameter or fact (characters).
pub const MAX_NAME: usize = 255;
/// Longest resource id of a fact (characters).
pub const MAX_RESOURCE_ID: usize = 1024;
/// Largest value (bytes).
pub const MAX_VALUE: usize = 64 * 1024;
/// Largest metadata (bytes of its JSON).
pub const MAX_METADATA: usize = 64 * 1024;
/// Most values one write takes.
pub const MAX_ITEMS: usize = 1000;
/// Where a value comes from (Inmanta's `ParameterSource`).
pub const SOURCES: [&str; 4] = ["user", "fact", "plugin", "report"];

/// A parameter (`resource_id` empty) or a fact of a resource.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Param {
    /// Names the row (Inmanta's v2 API addresses facts by id).
    pub id: Uuid,
    pub environment_id: Uuid,
    pub name: String,
    /// The resource a fact belongs to (its id without version); `''` for a parameter.
    pub resource_id: String,
    pub value: String,
    /// `user`, `fact`, `plugin` or `report`.
    pub source: String,
    #[schema(value_type = Object)]
    pub metadata: serde_json::Value,
    /// Last written (a renewal with the same value counts).
    pub updated: DateTime<Utc>,
    /// A fact that expires is valid for the environment's `fact_expire` after `updated`.
    pub expires: bool,
    /// Reaches the compiles of the environment's branch but never a pull request's preview
    /// (`steward param set --secret`); writes that do not say keep it.
    #[serde(default)]
    pub secret: bool,
    /// Filled in by the API ([`mark_expired`]): an expiring fact older than `fact_expire`.
    #[sqlx(skip)]
    #[serde(default)]
    pub expired: bool,
}

impl Param {
    pub fn is_parameter(&self) -> bool {
        self.resource_id.is_empty()
    }
}

/// A value to write.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NewParam {
    pub name: String,
    /// `''` for a parameter; a fact's resource id (a `,v=N` version suffix is dropped).
    pub resource_id: String,
    pub value: String,
    pub source: String,
    pub metadata: serde_json::Value,
    pub expires: bool,
}

/// What a write did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetOutcome {
    /// `(resource_id, name)` of the values that are new or different.
    pub changed: Vec<(String, String)>,
    /// Versions of the environment that had an unresolved unknown this write answered (those
    /// rows are now resolved), ascending.
    pub resolved_versions: Vec<i32>,
}

/// One value of a batch (`PUT /api/v1/environments/{env}/parameters`).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ParameterItem {
    pub name: String,
    /// A fact's resource; empty or absent: a parameter of the environment.
    #[serde(default)]
    pub resource_id: String,
    pub value: String,
    /// `user` by default (`fact` for agent tokens), `plugin` or `report`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<serde_json::Value>,
    /// Default: facts expire, parameters never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<bool>,
    /// Keep the value from pull-request previews; absent: as it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<bool>,
}

/// A parameter's or fact's key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ParamKey {
    /// `''` for a parameter.
    pub resource_id: String,
    pub name: String,
}

/// What a batch changed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WriteResult {
    /// Values that are new or different (the others were renewed: their `updated` is now).
    pub changed: Vec<ParamKey>,
    /// Versions whose unknown values this write made known.
    pub resolved_versions: Vec<i32>,
}

impl From<SetOutcome> for WriteResult {
    fn from(o: SetOutcome) -> WriteResult {
        WriteResult {
            changed: o
                .changed
                .into_iter()
                .map(|(resource_id, name)| ParamKey { resource_id, name })
                .collect(),
            resolved_versions: o.resolved_versions,
        }
    }
}

const COLUMNS: &str =
    "id, environment_id, name, resource_id, value, source, metadata, updated, expires, secret";

/// A fact's resource id as stored: `type[agent,attr=value]`, without the `,v=N` suffix
/// Inmanta's versioned ids carry. `''` stays `''` (a parameter).
pub fn normalize_resource_id(rid: &str) -> Result<String> {
    if rid.is_empty() {
        return Ok(String::new());
    }
    let plain = match rid.rsplit_once("],v=") {
        Some((head, v)) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => {
            format!("{head}]")
        }
        _ => rid.to_string(),
    };
    if plain.chars().count() > MAX_RESOURCE_ID {
        return Err(StoreError::Invalid(format!(
            "resource id '{}…' is longer than {MAX_RESOURCE_ID} characters",
            plain.chars().take(40).collect::<String>()
        )));
    }
    if plain.chars().any(char::is_control) {
        return Err(StoreError::Invalid(format!(
            "resource id {plain:?} contains a control character"
        )));
    }
    if ResourceId(plain.clone()).parse().is_none() {
        return Err(StoreError::Invalid(format!(
            "'{plain}' is not a resource id (type[agent,attribute=value])"
        )));
    }
    Ok(plain)
}

/// A name of a parameter or fact: 1 to [`MAX_NAME`] characters, no control character.
pub fn check_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(StoreError::Invalid(
            "a parameter or fact needs a name".into(),
        ));
    }
    if name.chars().count() > MAX_NAME {
        return Err(StoreError::Invalid(format!(
            "name '{}…' is longer than {MAX_NAME} characters",
            name.chars().take(40).collect::<String>()
        )));
    }
    if name.chars().any(char::is_control) {
        return Err(StoreError::Invalid(format!(
            "name {name:?} contains a control character"
        )));
    }
    Ok(())
}

/// Check one value to write and give it as stored.
fn checked(p: &NewParam) -> Result<NewParam> {
    check_name(&p.name)?;
    let resource_id = normalize_resource_id(&p.resource_id)?;
    let what = if resource_id.is_empty() {
        format!("parameter '{}'", p.name)
    } else {
        format!("fact '{}' of {resource_id}", p.name)
    };
    if p.value.len() > MAX_VALUE {
        return Err(StoreError::Invalid(format!(
            "{what}: the value has {} bytes, more than the {MAX_VALUE} a value may have",
            p.value.len()
        )));
    }
    if p.value.contains('\0') {
        return Err(StoreError::Invalid(format!(
            "{what}: the value contains a NUL character"
        )));
    }
    if !SOURCES.contains(&p.source.as_str()) {
        return Err(StoreError::Invalid(format!(
            "{what}: source '{}' is not one of {}",
            p.source,
            SOURCES.join(", ")
        )));
    }
    let metadata = match &p.metadata {
        serde_json::Value::Null => serde_json::json!({}),
        m => m.clone(),
    };
    if metadata.to_string().len() > MAX_METADATA {
        return Err(StoreError::Invalid(format!(
            "{what}: the metadata is larger than {MAX_METADATA} bytes"
        )));
    }
    if resource_id.is_empty() && p.expires {
        return Err(StoreError::Invalid(format!(
            "{what}: a parameter never expires (give a resource_id to set a fact)"
        )));
    }
    Ok(NewParam {
        name: p.name.clone(),
        resource_id,
        value: p.value.clone(),
        source: p.source.clone(),
        metadata,
        expires: p.expires,
    })
}

/// Check a batch and give it as stored: each value valid, at most [`MAX_ITEMS`], one value
/// per `(resource_id, name)` (the last one given wins).
pub fn validate(params: &[NewParam]) -> Result<Vec<NewParam>> {
    if params.len() > MAX_ITEMS {
        return Err(StoreError::Invalid(format!(
            "{} values in one write; at most {MAX_ITEMS} are taken at once",
            params.len()
        )));
    }
    let mut by_key: BTreeMap<(String, String), NewParam> = BTreeMap::new();
    for p in params {
        let p = checked(p)?;
        by_key.insert((p.resource_id.clone(), p.name.clone()), p);
    }
    Ok(by_key.into_values().collect())
}

/// Parameters and facts of an environment, by resource and name: all of them (`None`), or
/// those of one resource (`Some("")`: the environment's parameters only).
pub async fn list(
    e: impl PgExecutor<'_>,
    env: Uuid,
    resource_id: Option<&str>,
) -> Result<Vec<Param>> {
    let rid = match resource_id {
        Some(r) => Some(normalize_resource_id(r)?),
        None => None,
    };
    let sql = format!(
        "SELECT {COLUMNS} FROM parameters WHERE environment_id = $1 \
         AND ($2::text IS NULL OR resource_id = $2) ORDER BY resource_id, name"
    );
    Ok(sqlx::query_as::<_, Param>(sqlx::AssertSqlSafe(sql))
        .bind(env)
        .bind(rid)
        .fetch_all(e)
        .await?)
}

/// What a pull request's preview may read: the values that are not secret, and the keys of
/// those withheld (a compile asking for one finds it unknown).
pub async fn list_for_preview(
    e: impl PgExecutor<'_>,
    env: Uuid,
) -> Result<(Vec<Param>, Vec<ParamKey>)> {
    let sql = format!(
        "SELECT {COLUMNS} FROM parameters WHERE environment_id = $1 ORDER BY resource_id, name"
    );
    let rows = sqlx::query_as::<_, Param>(sqlx::AssertSqlSafe(sql))
        .bind(env)
        .fetch_all(e)
        .await?;
    let (secret, open): (Vec<Param>, Vec<Param>) = rows.into_iter().partition(|p| p.secret);
    let withheld = secret
        .into_iter()
        .map(|p| ParamKey {
            resource_id: p.resource_id,
            name: p.name,
        })
        .collect();
    Ok((open, withheld))
}

/// The values of the environment marked secret (to redact them from what previews show).
pub async fn secret_values(e: impl PgExecutor<'_>, env: Uuid) -> Result<Vec<String>> {
    Ok(
        sqlx::query_scalar("SELECT value FROM parameters WHERE environment_id = $1 AND secret")
            .bind(env)
            .fetch_all(e)
            .await?,
    )
}

/// Mark values secret or not (they keep the mark through renewals and new values).
pub async fn mark_secret(
    e: impl PgExecutor<'_>,
    env: Uuid,
    keys: &[ParamKey],
    secret: bool,
) -> Result<()> {
    let rids: Vec<&str> = keys.iter().map(|k| k.resource_id.as_str()).collect();
    let names: Vec<&str> = keys.iter().map(|k| k.name.as_str()).collect();
    sqlx::query(
        "UPDATE parameters p SET secret = $4 FROM unnest($2::text[], $3::text[]) AS k(rid, name) \
         WHERE p.environment_id = $1 AND p.resource_id = k.rid AND p.name = k.name",
    )
    .bind(env)
    .bind(&rids)
    .bind(&names)
    .bind(secret)
    .execute(e)
    .await?;
    Ok(())
}

/// The facts of an environment (not its parameters), by resource and name.
pub async fn list_facts(e: impl PgExecutor<'_>, env: Uuid) -> Result<Vec<Param>> {
    let sql = format!(
        "SELECT {COLUMNS} FROM parameters WHERE environment_id = $1 AND resource_id <> '' \
         ORDER BY resource_id, name"
    );
    Ok(sqlx::query_as::<_, Param>(sqlx::AssertSqlSafe(sql))
        .bind(env)
        .fetch_all(e)
        .await?)
}

pub async fn get(
    e: impl PgExecutor<'_>,
    env: Uuid,
    resource_id: &str,
    name: &str,
) -> Result<Option<Param>> {
    let rid = normalize_resource_id(resource_id)?;
    let sql = format!(
        "SELECT {COLUMNS} FROM parameters WHERE environment_id = $1 AND resource_id = $2 AND name = $3"
    );
    Ok(sqlx::query_as::<_, Param>(sqlx::AssertSqlSafe(sql))
        .bind(env)
        .bind(rid)
        .bind(name)
        .fetch_optional(e)
        .await?)
}

/// A fact or parameter by its row id (Inmanta's v2 `get_fact`).
pub async fn get_by_id(e: impl PgExecutor<'_>, env: Uuid, id: Uuid) -> Result<Option<Param>> {
    let sql = format!("SELECT {COLUMNS} FROM parameters WHERE environment_id = $1 AND id = $2");
    Ok(sqlx::query_as::<_, Param>(sqlx::AssertSqlSafe(sql))
        .bind(env)
        .bind(id)
        .fetch_optional(e)
        .await?)
}

/// Delete one value; whether it was there.
pub async fn delete(
    e: impl PgExecutor<'_>,
    env: Uuid,
    resource_id: &str,
    name: &str,
) -> Result<bool> {
    let rid = normalize_resource_id(resource_id)?;
    let n = sqlx::query(
        "DELETE FROM parameters WHERE environment_id = $1 AND resource_id = $2 AND name = $3",
    )
    .bind(env)
    .bind(rid)
    .bind(name)
    .execute(e)
    .await?
    .rows_affected();
    Ok(n > 0)
}

/// Write values (see the module doc): one upsert, `updated = now()` for every row given, and
/// the unresolved unknowns they answer marked resolved, atomically (in a savepoint when `c`
/// is in a transaction, else in a transaction of its own).
pub async fn set_many(c: &mut PgConnection, env: Uuid, params: &[NewParam]) -> Result<SetOutcome> {
    let params = validate(params)?;
    if params.is_empty() {
        return Ok(SetOutcome::default());
    }
    let names: Vec<&str> = params.iter().map(|p| p.name.as_str()).collect();
    let rids: Vec<&str> = params.iter().map(|p| p.resource_id.as_str()).collect();
    let values: Vec<&str> = params.iter().map(|p| p.value.as_str()).collect();
    let sources: Vec<&str> = params.iter().map(|p| p.source.as_str()).collect();
    let metadata: Vec<&serde_json::Value> = params.iter().map(|p| &p.metadata).collect();
    let expires: Vec<bool> = params.iter().map(|p| p.expires).collect();
    let mut tx = c.begin().await?;
    // `old` reads the rows as they were before this statement: a value that differs from it
    // (or had none) changed
    let mut changed: Vec<(String, String)> = sqlx::query_as(
        "WITH input AS ( \
           SELECT * FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::jsonb[], $7::bool[]) \
             AS u(name, resource_id, value, source, metadata, expires)), \
         old AS ( \
           SELECT p.resource_id, p.name, p.value FROM parameters p \
           JOIN input i ON p.resource_id = i.resource_id AND p.name = i.name \
           WHERE p.environment_id = $1), \
         up AS ( \
           INSERT INTO parameters (environment_id, name, resource_id, value, source, metadata, updated, expires) \
           SELECT $1, name, resource_id, value, source, metadata, now(), expires FROM input \
           ON CONFLICT (environment_id, resource_id, name) DO UPDATE SET value = EXCLUDED.value, \
             source = EXCLUDED.source, metadata = EXCLUDED.metadata, updated = now(), expires = EXCLUDED.expires \
           RETURNING resource_id, name, value) \
         SELECT up.resource_id, up.name FROM up \
         LEFT JOIN old ON old.resource_id = up.resource_id AND old.name = up.name \
         WHERE old.value IS DISTINCT FROM up.value",
    )
    .bind(env)
    .bind(&names)
    .bind(&rids)
    .bind(&values)
    .bind(&sources)
    .bind(&metadata)
    .bind(&expires)
    .fetch_all(&mut *tx)
    .await?;
    changed.sort();
    let mut resolved_versions: Vec<i32> = sqlx::query_scalar(
        "UPDATE version_unknowns SET resolved = true WHERE environment_id = $1 AND NOT resolved \
         AND (resource_id, name) IN (SELECT * FROM unnest($2::text[], $3::text[])) RETURNING version",
    )
    .bind(env)
    .bind(&rids)
    .bind(&names)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    resolved_versions.sort_unstable();
    resolved_versions.dedup();
    Ok(SetOutcome {
        changed,
        resolved_versions,
    })
}

/// Mark each fact's [`Param::expired`]: it expires and was last written more than
/// `fact_expire` seconds before `now`.
pub fn mark_expired(params: &mut [Param], fact_expire: u64, now: DateTime<Utc>) {
    let limit = chrono::Duration::seconds(fact_expire.min(i64::MAX as u64) as i64);
    for p in params {
        p.expired = p.expires && !p.is_parameter() && now - p.updated > limit;
    }
}

/// Check the unknowns of an export: names and ids within bounds (they are stored with it).
pub fn validate_unknowns(unknowns: &[UnknownRecord]) -> Result<()> {
    for u in unknowns {
        check_name(&u.name)?;
        normalize_resource_id(&u.resource_id)?;
        if u.source.is_empty() || u.source.len() > 32 || u.source.chars().any(char::is_control) {
            return Err(StoreError::Invalid(format!(
                "unknown '{}' of '{}': source {:?} is not a short word (fact, parameter, plugin)",
                u.name, u.resource_id, u.source
            )));
        }
    }
    Ok(())
}

/// Record the unknowns of a version being stored (the caller's transaction): one statement.
pub async fn record_unknowns(
    c: &mut PgConnection,
    env: Uuid,
    version: i32,
    unknowns: &[UnknownRecord],
) -> Result<()> {
    if unknowns.is_empty() {
        return Ok(());
    }
    let mut rids = Vec::with_capacity(unknowns.len());
    for u in unknowns {
        rids.push(normalize_resource_id(&u.resource_id)?);
    }
    let names: Vec<&str> = unknowns.iter().map(|u| u.name.as_str()).collect();
    let sources: Vec<&str> = unknowns.iter().map(|u| u.source.as_str()).collect();
    sqlx::query(
        "INSERT INTO version_unknowns (environment_id, version, resource_id, name, source) \
         SELECT DISTINCT ON (u.rid, u.name) $1, $2, u.rid, u.name, u.source \
         FROM unnest($3::text[], $4::text[], $5::text[]) AS u(rid, name, source) \
         ON CONFLICT DO NOTHING",
    )
    .bind(env)
    .bind(version)
    .bind(&rids)
    .bind(&names)
    .bind(&sources)
    .execute(&mut *c)
    .await?;
    Ok(())
}

/// The unknowns recorded for a version, with whether each was resolved since.
pub async fn unknowns_of(
    e: impl PgExecutor<'_>,
    env: Uuid,
    version: i32,
) -> Result<Vec<(UnknownRecord, bool)>> {
    let rows: Vec<(String, String, String, bool)> = sqlx::query_as(
        "SELECT resource_id, name, source, resolved FROM version_unknowns \
         WHERE environment_id = $1 AND version = $2 ORDER BY resource_id, name",
    )
    .bind(env)
    .bind(version)
    .fetch_all(e)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(resource_id, name, source, resolved)| {
            (
                UnknownRecord {
                    resource_id,
                    name,
                    source,
                },
                resolved,
            )
        })
        .collect())
}

/// Mark resolved the unknowns of `version` whose value was written since `since` (it arrived
/// while the compile that started then ran, before the version was stored); whether there
/// were any. For the recompile trigger: such a version needs a recompile as much as one
/// whose fact arrives later. Values older than the compile were in its facts file: an
/// unknown that one of them would answer is not resolved here, so a recompile never loops.
pub async fn resolve_existing(
    e: impl PgExecutor<'_>,
    env: Uuid,
    version: i32,
    since: DateTime<Utc>,
) -> Result<bool> {
    let n = sqlx::query(
        "UPDATE version_unknowns u SET resolved = true WHERE u.environment_id = $1 AND u.version = $2 \
         AND NOT u.resolved AND EXISTS (SELECT 1 FROM parameters p WHERE p.environment_id = u.environment_id \
           AND p.resource_id = u.resource_id AND p.name = u.name AND p.updated >= $3)",
    )
    .bind(env)
    .bind(version)
    .bind(since)
    .execute(e)
    .await?
    .rows_affected();
    Ok(n > 0)
}

/// Resources with an expiring fact last written before `updated_before`, oldest first, at
/// most `limit`: the renewal scan (index `parameters_renewal`).
pub async fn due_for_renewal(
    e: impl PgExecutor<'_>,
    env: Uuid,
    updated_before: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT resource_id FROM parameters WHERE environment_id = $1 AND expires \
         AND updated < $2 AND resource_id <> '' GROUP BY resource_id ORDER BY min(updated) LIMIT $3",
    )
    .bind(env)
    .bind(updated_before)
    .bind(limit)
    .fetch_all(e)
    .await?)
}

/// At most `limit` of an environment's parameters (`resource_id` `""`) or of one resource's
/// facts, by name: a page shows a bounded list and asks for one more row to know it was cut.
pub async fn list_first(
    e: impl PgExecutor<'_>,
    env: Uuid,
    resource_id: &str,
    limit: i64,
) -> Result<Vec<Param>> {
    let rid = normalize_resource_id(resource_id)?;
    let sql = format!(
        "SELECT {COLUMNS} FROM parameters WHERE environment_id = $1 AND resource_id = $2 \
         ORDER BY name LIMIT $3"
    );
    Ok(sqlx::query_as::<_, Param>(sqlx::AssertSqlSafe(sql))
        .bind(env)
        .bind(rid)
        .bind(limit)
        .fetch_all(e)
        .await?)
}

/// The first `limit` resources (by id) that have facts, each with how many: the console's
/// overview of an environment's facts without reading them.
pub async fn fact_counts_by_resource(
    e: impl PgExecutor<'_>,
    env: Uuid,
    limit: i64,
) -> Result<Vec<(String, i64)>> {
    Ok(sqlx::query_as(
        "SELECT resource_id, count(*) FROM parameters WHERE environment_id = $1 \
         AND resource_id <> '' GROUP BY resource_id ORDER BY resource_id LIMIT $2",
    )
    .bind(env)
    .bind(limit)
    .fetch_all(e)
    .await?)
}

/// How many parameters and facts an environment has (for the console).
pub async fn counts(e: impl PgExecutor<'_>, env: Uuid) -> Result<(i64, i64)> {
    let (params, facts): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE resource_id = ''), count(*) FILTER (WHERE resource_id <> '') \
         FROM parameters WHERE environment_id = $1",
    )
    .bind(env)
    .fetch_one(e)
    .await?;
    Ok((params, facts))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fact(name: &str, rid: &str, value: &str) -> NewParam {
        NewParam {
            name: name.into(),
            resource_id: rid.into(),
            value: value.into(),
            source: "fact".into(),
            metadata: serde_json::Value::Null,
            expires: true,
        }
    }

    #[test]
    fn resource_ids_lose_their_version_and_must_parse() {
        assert_eq!(
            normalize_resource_id("vm::Host[a,name=x],v=12").unwrap(),
            "vm::Host[a,name=x]"
        );
        assert_eq!(
            normalize_resource_id("vm::Host[a,name=x]").unwrap(),
            "vm::Host[a,name=x]"
        );
        assert_eq!(normalize_resource_id("").unwrap(), "");
        assert!(normalize_resource_id("not an id").is_err());
        assert!(normalize_resource_id("t[a,k=\u{1}]").is_err());
        let long = format!("t[a,k={}]", "x".repeat(MAX_RESOURCE_ID));
        assert!(normalize_resource_id(&long).is_err());
    }

    #[test]
    fn batches_are_bounded_and_checked() {
        let ok = fact("ip", "vm::Host[a,name=x]", "10.0.0.1");
        assert_eq!(
            validate(std::slice::from_ref(&ok)).unwrap()[0].metadata,
            serde_json::json!({})
        );
        let many = vec![ok.clone(); MAX_ITEMS + 1];
        assert!(
            validate(&many)
                .unwrap_err()
                .to_string()
                .contains("at most 1000")
        );
        // the same key twice: the last one wins
        let mut second = ok.clone();
        second.value = "10.0.0.2".into();
        let v = validate(&[ok.clone(), second]).unwrap();
        assert_eq!((v.len(), v[0].value.as_str()), (1, "10.0.0.2"));
        let mut big = ok.clone();
        big.value = "x".repeat(MAX_VALUE + 1);
        assert!(validate(&[big]).unwrap_err().to_string().contains("bytes"));
        let mut bad = ok.clone();
        bad.source = "guess".into();
        assert!(validate(&[bad]).is_err());
        let mut unnamed = ok.clone();
        unnamed.name = String::new();
        assert!(validate(&[unnamed]).is_err());
        let mut param = ok;
        param.resource_id = String::new();
        assert!(
            validate(std::slice::from_ref(&param))
                .unwrap_err()
                .to_string()
                .contains("never expires")
        );
        param.expires = false;
        assert!(validate(&[param]).is_ok());
    }

    #[test]
    fn facts_expire_after_fact_expire() {
        let now = Utc::now();
        let p = |rid: &str, expires: bool, age: i64| Param {
            secret: false,
            id: Uuid::nil(),
            environment_id: Uuid::nil(),
            name: "n".into(),
            resource_id: rid.into(),
            value: "v".into(),
            source: "fact".into(),
            metadata: serde_json::json!({}),
            updated: now - chrono::Duration::seconds(age),
            expires,
            expired: false,
        };
        let mut ps = vec![
            p("t[a,k=v]", true, 100),
            p("t[a,k=v]", true, 10),
            p("t[a,k=v]", false, 100),
            p("", false, 100),
        ];
        mark_expired(&mut ps, 60, now);
        assert_eq!(
            ps.iter().map(|p| p.expired).collect::<Vec<_>>(),
            [true, false, false, false]
        );
    }
}

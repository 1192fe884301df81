//! How a version's resources are kept: as spans of versions (`resource_spans`).
//!
//! A row says "this resource was exactly this from `first_version` to `last_version`". Version
//! V holds the rows with `first_version <= V AND last_version >= V`; the open rows
//! (`last_version = OPEN`) are the newest version's. Storing a version closes the rows of the
//! resources it changes or drops and opens one for each resource it changes or adds, so its
//! cost follows the change, not the environment's size. Deleting versions removes the rows no
//! remaining version lies in.

use std::collections::BTreeMap;

use sqlx::PgConnection;
use uuid::Uuid;

use super::super::Result;
use crate::model::content;

/// `last_version` of a row in the newest version.
pub const OPEN: i32 = i32::MAX;

/// A resource of a version, without its id (the key it is kept under) and attributes (kept
/// by `hash` in `resource_blobs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub resource_type: String,
    pub agent: String,
    pub hash: String,
    pub requires: Vec<String>,
    pub undefined: bool,
    /// The id's content bucket ([`content::bucket`]; derived from the id, so an entry
    /// copied under another id must have it made again): a store finds the lines of the
    /// buckets a change opens without hashing every id (100,000: ~5 ms on every upload).
    /// One that is wrong only makes the opening fail: the tree is then made from every line.
    pub bucket: u16,
}

/// The newest version's resources: the open rows.
pub async fn open_entries(c: &mut PgConnection, env: Uuid) -> Result<BTreeMap<String, Entry>> {
    let rows: Vec<(String, String, String, String, Vec<String>, bool)> = sqlx::query_as(
        "SELECT resource_id, resource_type, agent, hash, requires, undefined FROM resource_spans \
         WHERE environment_id = $1 AND last_version = 2147483647",
    )
    .bind(env)
    .fetch_all(&mut *c)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, resource_type, agent, hash, requires, undefined)| {
            let bucket = content::bucket(&id);
            (
                id,
                Entry {
                    bucket,
                    resource_type,
                    agent,
                    hash,
                    requires,
                    undefined,
                },
            )
        })
        .collect())
}

/// Make version `number` (the one after `prev`, whose rows are the open ones): close the
/// rows of `closed` (changed or dropped) at `prev`, and open a row for each of `opened`.
pub async fn advance(
    c: &mut PgConnection,
    env: Uuid,
    prev: Option<i32>,
    number: i32,
    closed: &[&str],
    opened: &[(&str, &Entry)],
) -> Result<()> {
    if let (Some(prev), false) = (prev, closed.is_empty()) {
        // by id through the primary key: with `resource_id = ANY($3)` the planner walks every
        // open row and compares each with the whole list (measured: 0.4 s for 1,000 of 100,000)
        sqlx::query(
            "UPDATE resource_spans s SET last_version = $2 FROM unnest($3::text[]) AS u(rid) \
             WHERE s.environment_id = $1 AND s.resource_id = u.rid AND s.last_version = 2147483647",
        )
        .bind(env)
        .bind(prev)
        .bind(closed)
        .execute(&mut *c)
        .await?;
    }
    for chunk in opened.chunks(crate::store::ROWS_PER_STATEMENT) {
        open_rows(&mut *c, env, number, chunk).await?;
    }
    Ok(())
}

/// Insert the open rows of `opened` resources, first in version `number`.
async fn open_rows(
    c: &mut PgConnection,
    env: Uuid,
    number: i32,
    opened: &[(&str, &Entry)],
) -> Result<()> {
    let ids: Vec<&str> = opened.iter().map(|(id, _)| *id).collect();
    let types: Vec<&str> = opened
        .iter()
        .map(|(_, e)| e.resource_type.as_str())
        .collect();
    let agents: Vec<&str> = opened.iter().map(|(_, e)| e.agent.as_str()).collect();
    let hashes: Vec<&str> = opened.iter().map(|(_, e)| e.hash.as_str()).collect();
    // requires travel as one newline-separated text per resource (ids hold no newline; a
    // ragged text[][] can not be bound, and jsonb costs a parse per row)
    let reqs: Vec<String> = opened.iter().map(|(_, e)| e.requires.join("\n")).collect();
    let undef: Vec<bool> = opened.iter().map(|(_, e)| e.undefined).collect();
    sqlx::query(
        "INSERT INTO resource_spans (environment_id, resource_id, first_version, resource_type, agent, hash, requires, undefined) \
         SELECT $1, u.rid, $2, u.rtype, u.agent, u.hash, \
         CASE WHEN u.req = '' THEN '{}'::text[] ELSE string_to_array(u.req, E'\\n') END, u.undef \
         FROM unnest($3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::bool[]) AS u(rid, rtype, agent, hash, req, undef)",
    )
    .bind(env)
    .bind(number)
    .bind(&ids)
    .bind(&types)
    .bind(&agents)
    .bind(&hashes)
    .bind(&reqs)
    .bind(&undef)
    .execute(&mut *c)
    .await?;
    Ok(())
}

/// After the versions `deleted` were deleted (their `versions` rows are gone): delete the
/// rows no remaining version lies in, and when the newest version was among them, reopen
/// the rows of the newest remaining one. Returns the attribute hashes of the deleted rows
/// (the blobs that may have lost their last user).
pub async fn forget(c: &mut PgConnection, env: Uuid, deleted: &[i32]) -> Result<Vec<String>> {
    let remaining: Vec<i32> =
        sqlx::query_scalar("SELECT number FROM versions WHERE environment_id = $1 ORDER BY number")
            .bind(env)
            .fetch_all(&mut *c)
            .await?;
    // a run of deleted versions between two remaining ones (lo, hi) loses exactly the rows
    // that lie within it: first_version > lo and last_version < hi
    let mut gaps: Vec<(i32, Option<i32>)> = deleted
        .iter()
        .map(|&d| {
            let at = remaining.partition_point(|&n| n < d);
            let lo = if at == 0 { 0 } else { remaining[at - 1] };
            (lo, remaining.get(at).copied())
        })
        .collect();
    gaps.sort_unstable();
    gaps.dedup();
    let mut hashes = Vec::new();
    for (lo, hi) in gaps {
        let gone: Vec<String> = match hi {
            Some(hi) => {
                sqlx::query_scalar(
                    "DELETE FROM resource_spans WHERE environment_id = $1 \
                     AND first_version > $2 AND first_version < $3 AND last_version < $3 RETURNING hash",
                )
                .bind(env)
                .bind(lo)
                .bind(hi)
                .fetch_all(&mut *c)
                .await?
            }
            None => {
                // the newest versions went: what they started goes, and what they closed of
                // the newest remaining version `lo` is open again
                let gone = sqlx::query_scalar(
                    "DELETE FROM resource_spans WHERE environment_id = $1 AND first_version > $2 \
                     RETURNING hash",
                )
                .bind(env)
                .bind(lo)
                .fetch_all(&mut *c)
                .await?;
                sqlx::query(
                    "UPDATE resource_spans SET last_version = 2147483647 \
                     WHERE environment_id = $1 AND last_version >= $2 AND last_version < 2147483647",
                )
                .bind(env)
                .bind(lo)
                .execute(&mut *c)
                .await?;
                gone
            }
        };
        hashes.extend(gone);
    }
    hashes.sort_unstable();
    hashes.dedup();
    Ok(hashes)
}

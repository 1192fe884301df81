//! Resource attribute sets (`resource_blobs`), shared by every span with the same content
//! hash, and the one protocol that keeps a blob while a span may refer to it: a store holds
//! its blobs with a lock until it commits ([`hold_blobs`]), and a collector deletes only
//! blobs it could lock and that no span refers to ([`collect_blobs`]). No foreign key does
//! this (migration 0021).

use std::collections::HashSet;

use sqlx::PgConnection;

use super::fresh::AttributeMap;
use crate::store::{Result, StoreError};

/// Make sure the blobs `hashes` (with their `attributes`) exist until this transaction ends:
/// insert those that are missing, and take a key-share lock on those that were already
/// there. The blob collector ([`collect_blobs`]) leaves a blob alone that it can not lock,
/// and one it deleted before this lock was taken is inserted again here.
/// (The spans' foreign key did this per row, at half the cost of inserting them:
/// migration 0021.)
pub(super) async fn hold_blobs(
    c: &mut PgConnection,
    hashes: &[&str],
    attributes: &[sqlx::types::Json<&AttributeMap>],
) -> Result<()> {
    let rows = crate::store::ROWS_PER_STATEMENT;
    for (h, a) in hashes.chunks(rows).zip(attributes.chunks(rows)) {
        hold_blob_chunk(&mut *c, h, a).await?;
    }
    Ok(())
}

async fn hold_blob_chunk(
    c: &mut PgConnection,
    hashes: &[&str],
    attributes: &[sqlx::types::Json<&AttributeMap>],
) -> Result<()> {
    let mut todo: Vec<usize> = (0..hashes.len()).collect();
    // a blob can only go missing again while a collector deletes it between our insert and
    // our lock: one more round normally settles it
    for _ in 0..5 {
        if todo.is_empty() {
            return Ok(());
        }
        let h: Vec<&str> = todo.iter().map(|&i| hashes[i]).collect();
        let a: Vec<&sqlx::types::Json<&AttributeMap>> =
            todo.iter().map(|&i| &attributes[i]).collect();
        let inserted: HashSet<String> = sqlx::query_scalar(
            "INSERT INTO resource_blobs (hash, attributes) SELECT * FROM unnest($1::text[], $2::jsonb[]) \
             ON CONFLICT (hash) DO NOTHING RETURNING hash",
        )
        .bind(&h)
        .bind(&a)
        .fetch_all(&mut *c)
        .await?
        .into_iter()
        .collect();
        let existing: Vec<&str> = h.into_iter().filter(|x| !inserted.contains(*x)).collect();
        if existing.is_empty() {
            return Ok(());
        }
        let held: HashSet<String> = sqlx::query_scalar(
            "SELECT hash FROM resource_blobs WHERE hash = ANY($1) ORDER BY hash FOR KEY SHARE",
        )
        .bind(&existing)
        .fetch_all(&mut *c)
        .await?
        .into_iter()
        .collect();
        todo.retain(|&i| !inserted.contains(hashes[i]) && !held.contains(hashes[i]));
    }
    if todo.is_empty() {
        return Ok(());
    }
    Err(StoreError::Conflict(format!(
        "the attributes {} were deleted again and again while this version was stored: send it again",
        hashes[todo[0]]
    )))
}

/// Delete the blobs among `hashes` that no span refers to any more; how many went. Each is
/// locked first; one that a store in progress holds ([`hold_blobs`]) is skipped, as it is
/// in use, rather than waited for (waiting here, while this transaction may hold blobs
/// another collector waits for, is how two environments' stores would deadlock). The
/// delete's own snapshot, taken after the locks, sees the spans of every store that held
/// one of them before.
pub(in crate::store) async fn collect_blobs(
    c: &mut PgConnection,
    hashes: &[String],
) -> Result<u64> {
    if hashes.is_empty() {
        return Ok(0);
    }
    let locked: Vec<String> = sqlx::query_scalar(
        "SELECT hash FROM resource_blobs WHERE hash = ANY($1) FOR UPDATE SKIP LOCKED",
    )
    .bind(hashes)
    .fetch_all(&mut *c)
    .await?;
    if locked.is_empty() {
        return Ok(0);
    }
    let deleted = sqlx::query(
        "DELETE FROM resource_blobs b WHERE b.hash = ANY($1) \
         AND NOT EXISTS (SELECT 1 FROM resource_spans s WHERE s.hash = b.hash)",
    )
    .bind(&locked)
    .execute(&mut *c)
    .await?;
    Ok(deleted.rows_affected())
}

//! Resource attribute sets (`resource_blobs`), shared by every span with the same content
//! hash, and the one protocol that keeps a blob while a span may refer to it: a store holds
//! its blobs with a lock until it commits ([`hold_blobs`]), and a collector deletes only
//! blobs it could lock and that no span refers to ([`collect_blobs`]). No foreign key does
//! this (migration 0021).

use std::collections::HashSet;

use sqlx::PgConnection;

use crate::store::{Result, StoreError};

/// Make sure the blobs `hashes` (with their `attributes`) exist until this transaction ends:
/// insert those that are missing, and take a key-share lock on those that were already
/// there. The blob collector ([`collect_blobs`]) leaves a blob alone that it can not lock,
/// and one it deleted before this lock was taken is inserted again here.
/// (The spans' foreign key did this per row, at half the cost of inserting them:
/// migration 0021.)
///
/// `first`: what is tried first. [`Hold::Insert`] when most of them are new (one statement
/// per chunk then), [`Hold::Lock`] when most of them were written already
/// ([`write_beside`]: the insert would send and parse every one for nothing).
pub(super) async fn hold_blobs(
    c: &mut PgConnection,
    hashes: &[&str],
    attributes: &[String],
    first: Hold,
) -> Result<()> {
    let rows = crate::store::ROWS_PER_STATEMENT;
    for (h, a) in hashes.chunks(rows).zip(attributes.chunks(rows)) {
        if first == Hold::Lock {
            let held = lock_existing(&mut *c, h).await?;
            let (h, a): (Vec<&str>, Vec<String>) = h
                .iter()
                .zip(a)
                .filter(|(hash, _)| !held.contains(**hash))
                .map(|(hash, a)| (*hash, a.clone()))
                .unzip();
            hold_blob_chunk(&mut *c, &h, &a).await?;
        } else {
            hold_blob_chunk(&mut *c, h, a).await?;
        }
    }
    Ok(())
}

/// What [`hold_blobs`] tries first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Hold {
    Insert,
    Lock,
}

/// Take a key-share lock on those of `hashes` that exist; the ones locked.
async fn lock_existing(c: &mut PgConnection, hashes: &[&str]) -> Result<HashSet<String>> {
    Ok(sqlx::query_scalar(
        "SELECT hash FROM resource_blobs WHERE hash = ANY($1) ORDER BY hash FOR KEY SHARE",
    )
    .bind(hashes)
    .fetch_all(&mut *c)
    .await?
    .into_iter()
    .collect())
}

/// A connection for [`write_beside`], if `pool` has one to spare soon (else the version's
/// transaction writes the blobs itself, rather than wait for one). Taken before it is
/// joined with the transaction's work: polled in one task with that work, the connecting
/// would wait for it.
pub(super) async fn connection_beside(
    pool: &sqlx::PgPool,
) -> Option<sqlx::pool::PoolConnection<sqlx::Postgres>> {
    tokio::time::timeout(std::time::Duration::from_millis(100), pool.acquire())
        .await
        .ok()?
        .ok()
}

/// Write the blobs among `hashes` that do not exist yet, on connection `c`, each
/// statement committed on its own: beside a version's transaction, which writes its spans
/// meanwhile (on the other core) and, once this is over, holds these blobs with
/// [`hold_blobs`] and [`Hold::Lock`]. Nothing depends on this: a blob the collector takes
/// before that lock, or one this did not write (an error, a deadlock with another writer),
/// is written by the transaction. One that no version comes to use (the version was
/// refused after this) is collected by the retention pass, as any blob nothing refers to.
pub(super) async fn write_beside(
    mut c: sqlx::pool::PoolConnection<sqlx::Postgres>,
    hashes: &[&str],
    attributes: &[String],
) -> Result<u64> {
    let rows = crate::store::ROWS_PER_STATEMENT;
    let mut written = 0;
    for (h, a) in hashes.chunks(rows).zip(attributes.chunks(rows)) {
        let existing: HashSet<String> =
            sqlx::query_scalar("SELECT hash FROM resource_blobs WHERE hash = ANY($1)")
                .bind(h)
                .fetch_all(&mut *c)
                .await?
                .into_iter()
                .collect();
        // in hash order, as every writer of blobs: two that write the same ones do not wait
        // for each other crosswise
        let mut missing: Vec<(&str, &str)> = h
            .iter()
            .zip(a)
            .filter(|(hash, _)| !existing.contains(**hash))
            .map(|(hash, a)| (*hash, a.as_str()))
            .collect();
        if missing.is_empty() {
            continue;
        }
        missing.sort_unstable_by_key(|m| m.0);
        let (h, a): (Vec<&str>, Vec<&str>) = missing.into_iter().unzip();
        written += sqlx::query(
            "INSERT INTO resource_blobs (hash, attributes) SELECT * FROM unnest($1::text[], $2::json[]) \
             ON CONFLICT (hash) DO NOTHING",
        )
        .bind(&h)
        .bind(&a)
        .execute(&mut *c)
        .await?
        .rows_affected();
    }
    Ok(written)
}

async fn hold_blob_chunk(
    c: &mut PgConnection,
    hashes: &[&str],
    attributes: &[String],
) -> Result<()> {
    let mut todo: Vec<usize> = (0..hashes.len()).collect();
    // a blob can only go missing again while a collector deletes it between our insert and
    // our lock: one more round normally settles it
    for _ in 0..5 {
        if todo.is_empty() {
            return Ok(());
        }
        let h: Vec<&str> = todo.iter().map(|&i| hashes[i]).collect();
        let a: Vec<&str> = todo.iter().map(|&i| attributes[i].as_str()).collect();
        let inserted: HashSet<String> = sqlx::query_scalar(
            "INSERT INTO resource_blobs (hash, attributes) SELECT * FROM unnest($1::text[], $2::json[]) \
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
        let held = lock_existing(&mut *c, &existing).await?;
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

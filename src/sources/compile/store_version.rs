//! Storing a branch compile's export as the environment's next version: as its changes
//! against the memory of the last compile (see `memory.rs`), or whole.

use chrono::Utc;
use serde_json::{Value, json};

use super::{CompileResult, Memory, Report, begin, memory};
use crate::model::ExportFile;
use crate::store::sources::{CompileRow, SourceRow};
use crate::store::{self, versions};

/// Store a branch compile's export as a version, with its provenance: as its changes
/// against the memory of the environment's last compile when it was read so, else (or when
/// the store refuses the changes: its newest version is not the memory's) whole. Gives back
/// the memory of what it stored.
pub(super) async fn store_version(
    pool: &sqlx::PgPool,
    job: &CompileRow,
    source: &SourceRow,
    fence: Option<&crate::store::leases::Fence>,
    started: chrono::DateTime<Utc>,
    mut report: Report,
    mut read: memory::Read,
) -> (CompileResult, Option<Memory>) {
    // store as a version
    let at = begin();
    let mut provenance = json!({
        "repository": crate::model::urls::public_url(&source.url),
        "branch": job.branch,
        "commit": job.commit,
        "path": source.path,
        "compile": job.id,
        "trigger": job.trigger,
    });
    // a recompile for facts says which values arrived and which versions waited for them
    if let Some(why) = job.stages.as_array().and_then(|st| {
        st.iter()
            .find(|s| s["name"] == "facts arrived")
            .map(|s| s["why"].clone())
    }) {
        provenance["facts"] = why;
    }
    let env = job.environment_id;
    let mut how = "as its changes";
    let mut hashes = None;
    let stored = loop {
        if read.changes.is_none() && hashes.is_none() {
            hashes = Some(crate::model::hash_all(&read.export.resources));
        }
        let what = match (&read.changes, &hashes) {
            (Some(c), _) => StoreAs::Changes(c),
            (None, h) => {
                how = "whole";
                StoreAs::Whole(h.clone().unwrap_or_default())
            }
        };
        let attempt = store_in_tx(
            pool,
            job,
            fence,
            started,
            &read.export,
            provenance.clone(),
            what,
        )
        .await;
        match attempt {
            Err(store::StoreError::BaseMoved(why)) if read.changes.is_some() => {
                tracing::info!(environment = %env, commit = %job.commit, reason = %why, "the compile's changes were refused: storing it whole");
                read = match read.whole(env) {
                    Ok(r) => r,
                    Err(e) => {
                        let error = format!("the compiler's export is unreadable: {e}");
                        return (report.failed("store", at, error), None);
                    }
                };
            }
            other => break other,
        }
    };
    match stored {
        Ok((mut s, meanwhile)) => {
            let memory = match read.changes.take() {
                Some(c) => Some(c.stored_as(s.info.number)),
                None => read.memory(
                    env,
                    s.info.number,
                    &s.info.content_hash,
                    hashes.unwrap_or_default(),
                ),
            };
            // a scheduler of this process reads these attributes next (if none does, they
            // are dropped after a few seconds)
            if s.auto_released {
                versions::hand_over(&mut s, &mut read.export);
            }
            report.result.resolved_meanwhile = meanwhile;
            report.passed(
                "store",
                at,
                &format!("version {}, stored {how}", s.info.number),
            );
            report.result.success = true;
            report.result.version = Some(s.info.number);
            report.result.auto_released = s.auto_released;
            (report.done(), memory)
        }
        Err(e) => (
            report.failed("store", at, format!("storing the version failed: {e}")),
            None,
        ),
    }
}

/// How a compile's export is stored.
enum StoreAs<'a> {
    /// As these changes (the export holds the new and changed resources).
    Changes(&'a memory::Changes),
    /// Whole, with its resources' attribute hashes.
    Whole(Vec<String>),
}

/// Store a compile's export as the environment's next version, with the compile's records,
/// in one transaction. True with the version: values the compile missed arrived meanwhile.
async fn store_in_tx(
    pool: &sqlx::PgPool,
    job: &CompileRow,
    fence: Option<&crate::store::leases::Fence>,
    started: chrono::DateTime<Utc>,
    export: &ExportFile,
    provenance: Value,
    how: StoreAs<'_>,
) -> Result<(versions::Stored, bool), store::StoreError> {
    let mut tx = pool.begin().await?;
    // a replica that lost the environment meanwhile stores nothing: the new owner compiles
    // this commit again
    if let Some(f) = fence {
        f.check(&mut tx).await?;
    }
    let nv = versions::NewVersion {
        export,
        uploader: "git",
        origin: "git",
        provenance,
        attributes_beside: Some(pool),
    };
    let env = job.environment_id;
    let s = match how {
        StoreAs::Changes(c) => {
            versions::store_delta(&mut tx, env, nv, &c.base, &c.removed, Some(&c.content_hash))
                .await?
        }
        StoreAs::Whole(hashes) => versions::store_hashed(&mut tx, env, nv, hashes).await?,
    };
    store::sources::set_compile_version(&mut *tx, job.id, s.info.number).await?;
    let meanwhile = store::facts::resolve_existing(&mut *tx, env, s.info.number, started).await?;
    store::audit::record(
        &mut *tx,
        "git",
        Some(env),
        "version.compile",
        &s.info.number.to_string(),
        json!({"commit": job.commit, "compile": job.id, "auto_released": s.auto_released}),
    )
    .await?;
    tx.commit().await?;
    versions::refresh_statistics_after(pool, &s);
    Ok((s, meanwhile))
}

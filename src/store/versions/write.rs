//! Storing a version: in one transaction under the environment's row lock, number it, check
//! it, store the attributes it adds (content-addressed), move the resource spans by what
//! changed against the newest version, compute and keep its diff, release it when the
//! environment auto-releases, and apply version retention.
//!
//! A version arrives whole (an export) or as its changes against the newest version (a
//! *delta*: the resources that are new or changed, the ids that went, and the complete list
//! of undefined ones). Both end in the same [`Manifest`] of the new version and the same
//! rows, so a version has one content hash and one diff however it was sent. The cost of
//! storing follows the change: the newest version's manifest is kept in memory between
//! stores (checked against the database's newest version number and content hash, so
//! another replica's store or a deletion is never missed), and only the changed spans are
//! written.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use sqlx::PgConnection;
use uuid::Uuid;

use super::blobs::{Hold, collect_blobs, hold_blobs};
use super::held::{cached, forget_cached, ready_for, remember, tree_of};
use super::spans::{self, Entry};
use super::{DiffEntry, NewVersion, Stored};
use crate::model::content::{self, ContentTree};
use crate::model::diff::{self, ChangeKind};
use crate::model::{DeltaBase, ExportFile, Resource, ResourceId};
use crate::store::{Result, StoreError, environments};

/// The resources of a version by id.
pub type Manifest = BTreeMap<String, Entry>;

/// Check an export before it becomes a version: unique ids, ids consistent with type and
/// agent, `requires` and `undefined` pointing inside the version.
pub fn validate_export(export: &ExportFile) -> Result<()> {
    check_format(export)?;
    let mut ids = HashSet::with_capacity(export.resources.len());
    for r in &export.resources {
        check_resource(r)?;
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
                return Err(not_inside(&r.id.0, &q.0));
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
        return Err(cycle_error(&cycle));
    }
    Ok(())
}

fn check_format(export: &ExportFile) -> Result<()> {
    if export.format != crate::model::EXPORT_FORMAT {
        return Err(StoreError::Invalid(format!(
            "unsupported export format {} (this server reads format {})",
            export.format,
            crate::model::EXPORT_FORMAT
        )));
    }
    super::super::code::validate(export)?;
    super::super::facts::validate_unknowns(&export.unknowns)
}

fn check_resource(r: &Resource) -> Result<()> {
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
    Ok(())
}

fn not_inside(id: &str, required: &str) -> StoreError {
    StoreError::Invalid(format!(
        "resource {id} requires {required}, which is not in this version"
    ))
}

fn cycle_error(cycle: &[ResourceId]) -> StoreError {
    StoreError::Invalid(format!(
        "dependency cycle: {}",
        cycle
            .iter()
            .map(|c| c.0.as_str())
            .collect::<Vec<_>>()
            .join(" -> ")
    ))
}

fn entry_of(r: &Resource, undefined: bool) -> Entry {
    Entry {
        resource_type: r.type_name.clone(),
        agent: r.agent.clone(),
        hash: r.hash(),
        requires: r.requires.iter().map(|q| q.0.clone()).collect(),
        undefined,
        bucket: crate::model::content::bucket(&r.id.0),
    }
}

/// Store a whole export as the next version.
pub async fn store(c: &mut PgConnection, env_id: Uuid, nv: NewVersion<'_>) -> Result<Stored> {
    let hashes = crate::model::hash_all(&nv.export.resources);
    store_hashed(c, env_id, nv, hashes).await
}

/// [`store`], given the attribute hashes of the export's resources (`Resource::hash`, in
/// their order), by a caller that needs them too.
pub async fn store_hashed(
    c: &mut PgConnection,
    env_id: Uuid,
    nv: NewVersion<'_>,
    hashes: Vec<String>,
) -> Result<Stored> {
    validate_export(nv.export)?;
    if hashes.len() != nv.export.resources.len() {
        return Err(StoreError::Invalid(format!(
            "{} attribute hashes for {} resources",
            hashes.len(),
            nv.export.resources.len()
        )));
    }
    let undefined: HashSet<&str> = nv.export.undefined.iter().map(|u| u.0.as_str()).collect();
    let manifest: Manifest = nv
        .export
        .resources
        .iter()
        .zip(hashes)
        .map(|(r, hash)| {
            let entry = Entry {
                resource_type: r.type_name.clone(),
                agent: r.agent.clone(),
                hash,
                requires: r.requires.iter().map(|q| q.0.clone()).collect(),
                undefined: undefined.contains(r.id.0.as_str()),
                bucket: crate::model::content::bucket(&r.id.0),
            };
            (r.id.0.clone(), entry)
        })
        .collect();
    let mut lock = lock_newest(c, env_id).await?;
    let newest = lock.newest.as_ref().map(|(_, _, m)| m.clone());
    let empty = Manifest::new();
    let base = newest.as_deref().unwrap_or(&empty);
    write(
        c,
        env_id,
        &nv,
        &mut lock,
        manifest,
        Against::Whole(base),
        None,
    )
    .await
}

/// What a new version is compared with to find what changed.
#[derive(Clone, Copy)]
enum Against<'a> {
    /// The newest version's whole manifest (a version sent whole: every id is compared).
    Whole(&'a Manifest),
    /// The newest version's entries of the ids a delta touched, in id order (`None`: the id
    /// was not in it). Every other id is the same in both, so only these are compared.
    Touched(&'a BTreeMap<String, Option<Entry>>),
}

impl Against<'_> {
    /// The newest version's entry of `id`, for an id that is new, changed or touched.
    fn base(&self, id: &str) -> Option<&Entry> {
        match self {
            Against::Whole(m) => m.get(id),
            Against::Touched(t) => t.get(id).and_then(Option::as_ref),
        }
    }
}

/// Store the next version sent as its changes against `base`, which must be the newest
/// version (else [`StoreError::BaseMoved`]: the sender sends the whole export), and which
/// must come out with the content hash `expect` when given (so a sender whose idea of the
/// base was wrong never stores a version other than its own). In
/// `nv.export`, `resources` are the new and changed resources, in full, and `undefined` is
/// the complete list of the new version's undefined resources; `removed` are the ids the new
/// version no longer has.
pub async fn store_delta(
    c: &mut PgConnection,
    env_id: Uuid,
    nv: NewVersion<'_>,
    base: &DeltaBase,
    removed: &[ResourceId],
    expect: Option<&str>,
) -> Result<Stored> {
    let export = nv.export;
    check_format(export)?;
    let mut given = HashSet::with_capacity(export.resources.len());
    for r in &export.resources {
        check_resource(r)?;
        if !given.insert(r.id.0.as_str()) {
            return Err(StoreError::Invalid(format!(
                "resource {} appears twice",
                r.id
            )));
        }
    }
    if let Some(r) = removed.iter().find(|r| given.contains(r.0.as_str())) {
        return Err(StoreError::Invalid(format!(
            "resource {r} is both removed and given"
        )));
    }
    let mut lock = lock_newest(c, env_id).await?;
    match &lock.newest {
        Some((n, hash, _)) if *n == base.version && *hash == base.content_hash => {}
        Some((n, _, _)) if *n == base.version => {
            return Err(StoreError::BaseMoved(format!(
                "version {n} is not the version these changes were made against (its content differs): send the whole version"
            )));
        }
        Some((n, _, _)) => {
            return Err(StoreError::BaseMoved(format!(
                "the newest version is {n}, not {}: send the whole version",
                base.version
            )));
        }
        None => {
            return Err(StoreError::BaseMoved(
                "the environment has no version yet: send the whole version".into(),
            ));
        }
    }
    // the newest version's manifest becomes the new one in place: taken out of the cache
    // (a failed store only costs the next one a read of the open rows), it is held once and
    // is not copied (a copy of 100,000 entries cost ~25 ms); what the delta replaces is kept
    // aside in `touched`
    let newest = lock
        .newest
        .as_mut()
        .map(|(_, _, m)| std::mem::take(m))
        .unwrap_or_default();
    forget_cached(env_id);
    let mut manifest: Manifest = Arc::try_unwrap(newest).unwrap_or_else(|shared| (*shared).clone());
    let mut touched: BTreeMap<String, Option<Entry>> = BTreeMap::new();
    for r in removed {
        // the sender's idea of the base is wrong: it sends the whole version
        let Some(old) = manifest.remove(&r.0) else {
            return Err(StoreError::BaseMoved(format!(
                "removed resource {r} is not in version {}: send the whole version",
                base.version
            )));
        };
        touched.insert(r.0.clone(), Some(old));
    }
    let undefined: HashSet<&str> = export.undefined.iter().map(|u| u.0.as_str()).collect();
    // resources that gained a requirement: a new cycle goes through one of them
    let mut gained_edges: Vec<&str> = Vec::new();
    for r in &export.resources {
        let entry = entry_of(r, false);
        let gained = match manifest.get(&r.id.0) {
            Some(b) => entry.requires.iter().any(|q| !b.requires.contains(q)),
            None => !entry.requires.is_empty(),
        };
        if gained {
            gained_edges.push(&r.id.0);
        }
        let old = manifest.insert(r.id.0.clone(), entry);
        touched.insert(r.id.0.clone(), old);
    }
    for u in &undefined {
        if !manifest.contains_key(*u) {
            return Err(StoreError::Invalid(format!(
                "undefined resource {u} is not in this version"
            )));
        }
    }
    for (id, e) in manifest.iter_mut() {
        // most versions have no undefined resource: no id is hashed then
        let now = (e.undefined || !undefined.is_empty()) && undefined.contains(id.as_str());
        if e.undefined != now {
            // what it was before: given resources are in `touched` already
            touched.entry(id.clone()).or_insert_with(|| Some(e.clone()));
            e.undefined = now;
        }
    }
    // the graph: what the given resources require is there; nothing left requires a removed
    // one; a cycle can only come from changed requires
    for r in &export.resources {
        if let Some(q) = r.requires.iter().find(|q| !manifest.contains_key(&q.0)) {
            return Err(not_inside(&r.id.0, &q.0));
        }
    }
    if !removed.is_empty() {
        let gone: HashSet<&str> = removed.iter().map(|r| r.0.as_str()).collect();
        for (id, e) in &manifest {
            if let Some(q) = e.requires.iter().find(|q| gone.contains(q.as_str())) {
                return Err(not_inside(id, q));
            }
        }
    }
    let cycle = crate::model::find_cycle_from(gained_edges, |id| {
        manifest
            .get(id)
            .into_iter()
            .flat_map(|e| e.requires.iter().map(String::as_str))
    });
    if let Some(cycle) = cycle {
        let cycle: Vec<ResourceId> = cycle.into_iter().map(|id| ResourceId(id.into())).collect();
        return Err(cycle_error(&cycle));
    }
    write(
        c,
        env_id,
        &nv,
        &mut lock,
        manifest,
        Against::Touched(&touched),
        expect,
    )
    .await
}

/// The environment locked, and its newest version (number, content hash, manifest).
struct Locked {
    settings: crate::model::settings::EnvSettings,
    auto_release_held: bool,
    newest: Option<(i32, String, Arc<Manifest>)>,
    /// the newest version's content tree, when the cache had it (else the next version's is
    /// built whole)
    tree: Option<ContentTree>,
}

async fn lock_newest(c: &mut PgConnection, env_id: Uuid) -> Result<Locked> {
    let env = environments::lock(&mut *c, env_id).await?;
    let newest: Option<(i32, String)> = sqlx::query_as(
        "SELECT number, content_hash FROM versions WHERE environment_id = $1 ORDER BY number DESC LIMIT 1",
    )
    .bind(env_id)
    .fetch_optional(&mut *c)
    .await?;
    let mut tree = None;
    let newest = match newest {
        None => None,
        Some((n, hash)) => {
            let manifest = match cached(env_id, n, &hash) {
                Some((m, t)) => {
                    tree = t.take();
                    m
                }
                None => Arc::new(spans::open_entries(&mut *c, env_id).await?),
            };
            Some((n, hash, manifest))
        }
    };
    Ok(Locked {
        settings: env.settings,
        auto_release_held: env.auto_release_held,
        newest,
        tree,
    })
}

async fn write(
    c: &mut PgConnection,
    env_id: Uuid,
    nv: &NewVersion<'_>,
    lock: &mut Locked,
    manifest: Manifest,
    against: Against<'_>,
    expect: Option<&str>,
) -> Result<Stored> {
    let t0 = std::time::Instant::now();
    let prev = lock.newest.as_ref().map(|(n, _, _)| *n);
    let number = prev.unwrap_or(0) + 1;
    // what changed: rows to close, rows to open, the diff
    let mut closed: Vec<&str> = Vec::new();
    let mut opened: Vec<(&str, &Entry)> = Vec::new();
    let mut changes: Vec<(&str, ChangeKind)> = Vec::new();
    match against {
        // both are in id order: one walk over the two, not a lookup per resource
        Against::Whole(base) => {
            let mut old = base.iter().peekable();
            for (id, e) in &manifest {
                while let Some((gone, _)) = old.next_if(|(b, _)| b.as_str() < id.as_str()) {
                    closed.push(gone);
                    changes.push((gone, ChangeKind::Deleted));
                }
                let before = old.next_if(|(b, _)| *b == id).map(|(_, b)| b);
                classify(id, before, e, &mut closed, &mut opened, &mut changes);
            }
            for (gone, _) in old {
                closed.push(gone);
                changes.push((gone, ChangeKind::Deleted));
            }
        }
        // in id order too, and only the ids the delta touched
        Against::Touched(touched) => {
            for (id, before) in touched {
                let now = manifest.get_key_value(id.as_str());
                match (before, now) {
                    (Some(_), None) => {
                        closed.push(id);
                        changes.push((id, ChangeKind::Deleted));
                    }
                    (_, Some((id, e))) => classify(
                        id,
                        before.as_ref(),
                        e,
                        &mut closed,
                        &mut opened,
                        &mut changes,
                    ),
                    (None, None) => {}
                }
            }
        }
    }
    // the content hash: the newest version's tree changed by what changed (whole when the
    // cache did not have it)
    let ready = match lock.tree.take() {
        Some(tree) => {
            let touched = closed
                .iter()
                .copied()
                .chain(opened.iter().map(|(id, _)| *id));
            // the base version's resources: the whole base, or (a delta, whose base became
            // the new manifest in place) the new manifest's untouched resources and what
            // the touched ones were
            let ready = match against {
                Against::Whole(base) => ready_for(
                    tree,
                    |wanted| {
                        base.iter()
                            .filter(move |(_, e)| wanted.holds(e))
                            .map(|(id, e)| (id.as_str(), e))
                    },
                    touched,
                ),
                // (the bucket first: a look-up in `was` for each of 100,000 ids was most of
                // a one-change store's work here)
                Against::Touched(was) => ready_for(
                    tree,
                    |wanted| {
                        let kept = manifest
                            .iter()
                            .filter(move |(id, e)| {
                                wanted.holds(e) && !was.contains_key(id.as_str())
                            })
                            .map(|(id, e)| (id.as_str(), e));
                        let replaced = was
                            .iter()
                            .filter_map(|(id, e)| e.as_ref().map(|e| (id.as_str(), e)));
                        kept.chain(replaced)
                    },
                    touched,
                ),
            };
            if ready.is_none() {
                tracing::warn!(environment = %env_id, "the held content tree's seals do not fit the newest version's lines: hashing them all");
            }
            ready
        }
        None => None,
    };
    let mut tree = match ready {
        Some(mut tree) => {
            for id in &closed {
                tree.remove(id);
            }
            for (id, e) in &opened {
                tree.insert(id, &e.hash, &e.requires, e.undefined);
            }
            tree
        }
        None => tree_of(&manifest),
    };
    debug_assert_eq!(tree.len(), manifest.len());
    let content_hash = content::with_handlers(tree.root(), &nv.export.handlers);
    if let Some(expected) = expect
        && expected != content_hash
    {
        return Err(StoreError::BaseMoved(format!(
            "these changes make a version with content hash {content_hash}, not the {expected} the sender has: send the whole version"
        )));
    }
    let t_classified = t0.elapsed();
    // attributes, content-addressed: only those of new and changed resources can be missing
    let given: HashMap<&str, Given> = nv
        .export
        .resources
        .iter()
        .enumerate()
        .map(|(i, r)| (r.id.0.as_str(), (i, &r.attributes)))
        .collect();
    let mut sent = HashSet::new();
    let mut fresh = Vec::new();
    // as the JSON text the column keeps (serde_json writes an object's keys in their order)
    let (blob_hashes, blob_attrs): (Vec<&str>, Vec<String>) = opened
        .iter()
        .filter(|(id, e)| against.base(id).is_none_or(|b| b.hash != e.hash))
        .filter(|(_, e)| sent.insert(e.hash.as_str()))
        .filter_map(|(id, e)| {
            given.get(id).map(|&(i, a)| {
                fresh.push((i, e.hash.clone()));
                (e.hash.as_str(), json_text(a))
            })
        })
        .unzip();
    let summary = summary(&changes, manifest.len());
    let metadata = serde_json::to_value(&nv.export.metadata).unwrap_or_default();
    let rows = async {
        sqlx::query(
            "INSERT INTO versions (environment_id, number, uploader, origin, content_hash, provenance, metadata, \
             resource_count, diff_base, diff_summary) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(env_id)
        .bind(number)
        .bind(nv.uploader)
        .bind(nv.origin)
        .bind(&content_hash)
        .bind(&nv.provenance)
        .bind(&metadata)
        .bind(manifest.len() as i32)
        .bind(prev)
        .bind(&summary)
        .execute(&mut *c)
        .await?;
        let t_diffed = t0.elapsed();
        spans::advance(&mut *c, env_id, prev, number, &closed, &opened).await?;
        Ok::<_, StoreError>((t_diffed, t0.elapsed()))
    };
    // many new attributes: written from a second connection, each statement committed,
    // while this transaction writes the version's spans, the two on two cores (100,000:
    // 1.2 s each, one after the other before); then held here like any others. Held only
    // once that connection is done: a blob this transaction inserted first would hold up
    // its insert of it until a commit that waits for it.
    let beside = match nv.attributes_beside {
        Some(pool) if blob_hashes.len() >= crate::store::ROWS_PER_STATEMENT => {
            super::blobs::connection_beside(pool).await
        }
        _ => None,
    };
    let (hold, (t_diffed, t_spans)) = match beside {
        Some(connection) => {
            let (written, rows) = tokio::join!(
                super::blobs::write_beside(connection, &blob_hashes, &blob_attrs),
                rows
            );
            match written {
                Ok(n) => {
                    tracing::debug!(environment = %env_id, version = number, written = n, "attributes written beside the version's transaction")
                }
                // held and written below instead
                Err(e) => {
                    tracing::debug!(environment = %env_id, version = number, error = %e, "attributes not written beside the version's transaction")
                }
            }
            (Hold::Lock, rows?)
        }
        None => (Hold::Insert, rows.await?),
    };
    hold_blobs(&mut *c, &blob_hashes, &blob_attrs, hold).await?;
    let t_blobs = t0.elapsed();
    super::super::code::store_version_code(&mut *c, env_id, number, nv.export).await?;
    super::super::facts::record_unknowns(&mut *c, env_id, number, &nv.export.unknowns).await?;
    // a version with nothing before it is all new: its diff is read from its resources
    // ([`super::stored_diff`]) instead of written as one row per resource
    if prev.is_some() {
        let entries = diff_entries(c, &against, &manifest, &changes, &given).await?;
        store_diff(c, env_id, number, &entries).await?;
    }
    // release by policy
    let mut auto_released = false;
    if lock.settings.auto_release && !lock.auto_release_held {
        super::release_locked(
            &mut *c,
            env_id,
            number,
            "auto-release",
            "released automatically",
        )
        .await?;
        auto_released = true;
    }
    apply_retention(&mut *c, env_id, lock.settings.version_retention).await?;
    let info = super::get(&mut *c, env_id, number).await?;
    tracing::debug!(
        environment = %env_id, version = number, resources = manifest.len(),
        opened = opened.len(), closed = closed.len(),
        classified_ms = t_classified.as_secs_f64() * 1e3, diffed_ms = t_diffed.as_secs_f64() * 1e3,
        spans_ms = t_spans.as_secs_f64() * 1e3, blobs_ms = t_blobs.as_secs_f64() * 1e3,
        total_ms = t0.elapsed().as_secs_f64() * 1e3, "version stored"
    );
    // kept for the next store; if this transaction does not commit, the number and content
    // hash it is kept under will not match the database's newest version, so it is not used
    let rows_opened = opened.len();
    remember(env_id, number, &content_hash, Arc::new(manifest), tree);
    Ok(Stored {
        info,
        auto_released,
        rows_opened,
        fresh_attributes: fresh,
    })
}

use super::fresh::AttributeMap;

/// A resource as sent: its place in the export and its attributes.
type Given<'a> = (usize, &'a AttributeMap);

/// The diff entries of `changes` (sorted by id): attribute changes of the updated ones.
async fn diff_entries(
    c: &mut PgConnection,
    against: &Against<'_>,
    manifest: &Manifest,
    changes: &[(&str, ChangeKind)],
    given: &HashMap<&str, Given<'_>>,
) -> Result<Vec<DiffEntry>> {
    // the attributes before, and after where they were not given (an undefined flag flipped)
    let mut wanted: Vec<String> = Vec::new();
    for (id, kind) in changes {
        if *kind == ChangeKind::Updated {
            wanted.push(base_hash(against, id));
            if !given.contains_key(id) {
                wanted.push(manifest[*id].hash.clone());
            }
        }
    }
    let blobs = super::attributes_by_hash(&mut *c, &wanted).await?;
    let attrs_of = |hash: &str| {
        blobs
            .get(hash)
            .and_then(|v| v.as_object().cloned())
            .unwrap_or_default()
    };
    Ok(changes
        .iter()
        .map(|(id, kind)| {
            let attributes = match kind {
                ChangeKind::Updated => {
                    let before = attrs_of(&base_hash(against, id));
                    let after = match given.get(id) {
                        Some((_, a)) => (*a).clone(),
                        None => attrs_of(&manifest[*id].hash),
                    };
                    serde_json::to_value(diff::attribute_changes(&before, &after))
                        .unwrap_or_default()
                }
                _ => serde_json::json!({}),
            };
            DiffEntry {
                resource_id: id.to_string(),
                change: kind.as_str().to_string(),
                attributes,
            }
        })
        .collect())
}

/// The attribute hash an updated resource had in the newest version.
fn base_hash(against: &Against<'_>, id: &str) -> String {
    against.base(id).map(|b| b.hash.clone()).unwrap_or_default()
}

/// Attributes as the text `resource_blobs` keeps.
fn json_text(a: &AttributeMap) -> String {
    serde_json::to_string(a).expect("a JSON object serializes")
}

/// Sort one id of the new version (`now`) by its entry in the newest one (`before`): new,
/// changed (its row closed and a new one opened; a diff entry unless only its requires
/// changed) or the same.
fn classify<'a>(
    id: &'a str,
    before: Option<&Entry>,
    now: &'a Entry,
    closed: &mut Vec<&'a str>,
    opened: &mut Vec<(&'a str, &'a Entry)>,
    changes: &mut Vec<(&'a str, ChangeKind)>,
) {
    match before {
        None => {
            opened.push((id, now));
            changes.push((id, ChangeKind::New));
        }
        Some(b) if b == now => {}
        Some(b) => {
            closed.push(id);
            opened.push((id, now));
            if b.hash != now.hash || b.undefined != now.undefined {
                changes.push((id, ChangeKind::Updated));
            }
        }
    }
}

fn summary(changes: &[(&str, ChangeKind)], total: usize) -> serde_json::Value {
    let mut counts: BTreeMap<&str, i64> =
        [("new", 0), ("updated", 0), ("deleted", 0), ("unchanged", 0)].into();
    for (_, kind) in changes {
        *counts.entry(kind.as_str()).or_default() += 1;
    }
    let changed = changes
        .iter()
        .filter(|(_, kind)| *kind != ChangeKind::Deleted)
        .count();
    counts.insert("unchanged", total as i64 - changed as i64);
    serde_json::json!(counts)
}

async fn store_diff(
    c: &mut PgConnection,
    env: Uuid,
    number: i32,
    entries: &[DiffEntry],
) -> Result<()> {
    // in statements of a bounded size: a version changing the attributes of 100,000
    // resources in one statement grew its backend by 450 MB (the attribute changes, parsed)
    for chunk in entries.chunks(crate::store::ROWS_PER_STATEMENT) {
        let ids: Vec<&str> = chunk.iter().map(|e| e.resource_id.as_str()).collect();
        let kinds: Vec<&str> = chunk.iter().map(|e| e.change.as_str()).collect();
        let attrs: Vec<&serde_json::Value> = chunk.iter().map(|e| &e.attributes).collect();
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
    }
    Ok(())
}

/// Delete versions (their rows, spans, diffs) and the attributes nobody refers to any more.
pub(super) async fn delete_unchecked(
    c: &mut PgConnection,
    env: Uuid,
    numbers: &[i32],
) -> Result<()> {
    sqlx::query("DELETE FROM versions WHERE environment_id = $1 AND number = ANY($2)")
        .bind(env)
        .bind(numbers)
        .execute(&mut *c)
        .await?;
    let hashes = spans::forget(&mut *c, env, numbers).await?;
    collect_blobs(c, &hashes).await?;
    Ok(())
}

/// Keep the newest `keep` versions, the active one, and those a pending delete takes its
/// intent from (a removed resource not yet deleted on its target).
async fn apply_retention(c: &mut PgConnection, env: Uuid, keep: u32) -> Result<()> {
    let active = super::active(&mut *c, env).await?.unwrap_or(0);
    let needed = crate::store::deploy::versions_pending_deletes_need(&mut *c, env).await?;
    let old: Vec<i32> = sqlx::query_scalar(
        "SELECT number FROM (SELECT number FROM versions WHERE environment_id = $1 ORDER BY number DESC OFFSET $3) o \
         WHERE number <> $2 AND number <> ALL($4)",
    )
    .bind(env)
    .bind(active)
    .bind(keep as i64)
    .bind(&needed)
    .fetch_all(&mut *c)
    .await?;
    if !old.is_empty() {
        delete_unchecked(c, env, &old).await?;
    }
    Ok(())
}

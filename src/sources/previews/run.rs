//! Running one queued preview: the pull request fetched and merged onto its base, the merge
//! compiled as a preview (no secret values), its export diffed against the active version,
//! secret values hidden in what the diff shows, and the outcome recorded and reported.

use super::*;

impl GitSources {
    /// Run the next queued preview; false when there is none (or the environment is halted).
    pub(super) async fn preview_next(&self, env: Uuid) -> Result<bool, SourceError> {
        let pool = &self.0.pool;
        let Some(run) = store_previews::next_queued(pool, env).await? else {
            return Ok(false);
        };
        let e = store::environments::get_environment(pool, env).await?;
        if e.halted {
            return Ok(false);
        }
        let Some(src) = store::sources::get_source(pool, env).await? else {
            return Ok(false);
        };
        let _slot = preview_slots()
            .acquire()
            .await
            .map_err(|_| SourceError::Unavailable)?;
        {
            let mut tx = pool.begin().await.map_err(StoreError::from)?;
            self.check_fence(env, &mut tx).await?;
            if !store_previews::start_run(&mut *tx, run.id).await? {
                return Ok(true);
            }
            tx.commit().await.map_err(StoreError::from)?;
        }
        let preview = store_previews::get(pool, env, run.preview_id).await?;
        let mut out = Outgoing::default();
        out.status(
            &src,
            &run.head,
            &status_context(&e.name),
            State::Pending,
            "previewing",
        );
        if let Some(n) = preview.number {
            out.preview_comment(&src, n);
        }
        let mut tx = pool.begin().await.map_err(StoreError::from)?;
        out.write(&mut tx, env).await?;
        tx.commit().await.map_err(StoreError::from)?;
        self.0.feedback.wake();

        let t = Instant::now();
        let done = self
            .run_preview(&src, &preview, &run, &e.settings.previews)
            .await;
        let ended = self
            .finish_preview(&src, &e.name, &preview, &run, done)
            .await?;
        if ended {
            tracing::info!(environment = %env, preview = %preview.id, run = %run.id, ms = t.elapsed().as_millis() as u64, "preview done");
        } else {
            tracing::info!(environment = %env, preview = %preview.id, run = %run.id, "preview superseded while it ran; its result is dropped");
        }
        Ok(true)
    }

    /// Fetch, merge, compile and diff one run.
    async fn run_preview(
        &self,
        src: &SourceRow,
        preview: &Preview,
        run: &Run,
        settings: &PreviewSettings,
    ) -> Done {
        let mut done = Done::new(&run.head);
        let env = src.environment_id;
        let mirror = self.mirror_of(env, &src.url);
        // fetch: the pull request's refs and the branches, in one fetch
        let at = compile::begin();
        let fetched = {
            let guard = self.mirror_lock(&mirror).lock_owned().await;
            let (m, url, auth, branch) = (
                mirror.clone(),
                src.url.clone(),
                git::Auth::of(src),
                src.branch.clone(),
            );
            let (number, head) = (preview.number, run.head.clone());
            let refused = self.refused(&src.url);
            tokio::task::spawn_blocking(move || {
                let _guard = guard;
                if let Some(e) = refused {
                    return Err(e);
                }
                let (head, host_merge) = match number {
                    Some(n) => {
                        let refs = git::fetch_pull(&m, &url, &auth, n as u64)?;
                        (refs.head, refs.merge)
                    }
                    None => {
                        if !git::has_commit(&m, &head) {
                            git::ensure_mirror(&m, &url, &auth)?;
                        }
                        (head, None)
                    }
                };
                let base = git::resolve_branch(&m, &branch)?
                    .ok_or_else(|| git::GitError::NotFound(format!("branch {branch}")))?;
                Ok((head, host_merge, base))
            })
            .await
            .unwrap_or_else(|e| Err(git::GitError::Other(format!("fetch crashed: {e}"))))
        };
        let (head, host_merge, base) = match fetched {
            Ok(f) => f,
            Err(e) => return done.failed("fetch", at, format!("fetching failed: {e}")),
        };
        if head != run.head {
            // pushed again since the hint: the newest head is what merging would take
            done.stage(
                "fetch",
                at,
                true,
                &format!("head moved from {} to {}", short(&run.head), short(&head)),
            );
        } else {
            done.stage("fetch", at, true, &format!("head {}", short(&head)));
        }
        done.head = head.clone();
        done.base = Some(base.clone());

        // merge: the host's merge commit when it is of this base and head, else one made here
        let at = compile::begin();
        let name = match preview.number {
            Some(n) => n.to_string(),
            None => format!("hand-{}", preview.id.simple()),
        };
        let merged = {
            let guard = self.mirror_lock(&mirror).lock_owned().await;
            let m = mirror.clone();
            let (base, head) = (base.clone(), head.clone());
            tokio::task::spawn_blocking(move || {
                let _guard = guard;
                if let Some(hm) = host_merge
                    && git::parents(&m, &hm).is_ok_and(|p| p == [base.clone(), head.clone()])
                {
                    return Ok(("host", git::Merge::Clean(hm)));
                }
                git::merge_for_preview(&m, &base, &head, &name).map(|r| ("steward", r))
            })
            .await
            .unwrap_or_else(|e| Err(git::GitError::Other(format!("merge crashed: {e}"))))
        };
        let merge = match merged {
            Ok((source, git::Merge::Clean(c))) => {
                done.merge_source = Some(source);
                done.stage(
                    "merge",
                    at,
                    true,
                    &format!(
                        "{} onto {} at {}: {} ({source})",
                        short(&head),
                        src.branch,
                        short(&base),
                        short(&c)
                    ),
                );
                c
            }
            Ok((_, git::Merge::Conflict(paths))) => {
                let mut list = paths
                    .iter()
                    .take(20)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ");
                if paths.len() > 20 {
                    list.push_str(&format!(" and {} more", paths.len() - 20));
                }
                return done.failed(
                    "merge",
                    at,
                    format!("does not merge cleanly into {}: {list}", src.branch),
                );
            }
            Err(e) => return done.failed("merge", at, format!("merging failed: {e}")),
        };
        done.merge = Some(merge.clone());
        // superseded meanwhile (a newer push, a close): the compile would be for nothing
        if !store_previews::still_running(&self.0.pool, run.id)
            .await
            .unwrap_or(true)
        {
            return done.failed("compile", compile::begin(), "superseded".into());
        }

        // compile, as a preview
        let pip_sources = self.0.pip_sources.lock().unwrap().clone();
        let spec = compile::BuildSpec {
            env,
            commit: &merge,
            stages: std::mem::take(&mut done.stages),
            source: src,
            mirror: &mirror,
            steward_bin: &self.0.steward_bin,
            python: compile::Python {
                envs: &self.0.data_dir.join("python-envs"),
                pip: &pip_sources,
                made: &self.0.envs_made,
            },
            preview: true,
            memory: None,
            sites: None,
        };
        let built = compile::build(&self.0.pool, spec).await;
        let (report, export, withheld) = match built {
            Ok(b) => (b.report, b.export.export, b.withheld),
            Err(failed) => {
                done.absorb(*failed);
                done.source_lines(&mirror, &merge, &src.path).await;
                return done;
            }
        };
        done.stages = report.stages;
        done.exit_code = report.result.exit_code;
        done.stdout = report.result.stdout;
        done.stderr = report.result.stderr;
        done.diagnostics = report.result.diagnostics;
        // its handler code is never stored nor run; only the resources are diffed
        let at = compile::begin();
        let diff = async {
            let mut c = self.0.pool.acquire().await?;
            store_previews::diff_export(&mut c, env, &export, &withheld).await
        }
        .await;
        match diff {
            Ok(mut d) => {
                // the active version may hold secret values (branch compiles read them): a
                // preview, shown to the pull request's author, never does
                match store::facts::secret_values(&self.0.pool, env).await {
                    Ok(secrets) => redact(&mut d.changes, &secrets),
                    Err(e) => {
                        return done.failed("diff", at, format!("reading secrets failed: {e}"));
                    }
                }
                let s = &d.summary;
                done.stage(
                    "diff",
                    at,
                    true,
                    &format!(
                        "{} against {}",
                        comment::counts_text(s),
                        comment::against(d.base)
                    ),
                );
                // the dry-run (opt in, never for a fork): the resources it adds or changes,
                // as the pull request wants them
                if settings.dry_run && !preview.fork && d.base.is_some() {
                    let wanted: std::collections::HashSet<&str> = d
                        .changes
                        .iter()
                        .filter(|c| c.change == "new" || c.change == "updated")
                        .map(|c| c.resource_id.as_str())
                        .collect();
                    done.dry = export
                        .resources
                        .iter()
                        .filter(|r| wanted.contains(r.id.0.as_str()))
                        .cloned()
                        .collect();
                }
                done.success = true;
                done.diff_base = d.base;
                done.summary = d.summary;
                done.changes = d.changes;
            }
            Err(e) => return done.failed("diff", at, format!("diffing failed: {e}")),
        }
        done
    }

    /// Record a run's end with its statuses and comment; false when it was superseded.
    async fn finish_preview(
        &self,
        src: &SourceRow,
        env_name: &str,
        preview: &Preview,
        run: &Run,
        done: Done,
    ) -> Result<bool, SourceError> {
        let env = src.environment_id;
        let mut done = done;
        let dryrun = match (done.dry.is_empty(), done.diff_base) {
            (false, Some(version)) => {
                let id = Uuid::new_v4();
                done.summary["dryrun"] =
                    json!({"id": id, "version": version, "total": done.dry.len()});
                Some((id, version))
            }
            _ => None,
        };
        let stages = json!(done.stages);
        let source_lines = json!(done.source_lines);
        let end = RunEnd {
            status: if done.success { "success" } else { "failed" },
            head: &done.head,
            base: done.base.as_deref(),
            merge: done.merge.as_deref(),
            merge_source: done.merge_source,
            diff_base: done.diff_base,
            summary: &done.summary,
            stages: &stages,
            exit_code: done.exit_code,
            stdout: &done.stdout,
            stderr: &done.stderr,
            diagnostics: &done.diagnostics,
            source_lines: &source_lines,
            error: done.error.as_deref(),
        };
        let mut out = Outgoing::default();
        let context = status_context(env_name);
        if done.success {
            out.status(
                src,
                &done.head,
                &context,
                State::Success,
                &format!(
                    "{} against {}",
                    comment::counts_text(&done.summary),
                    comment::against(done.diff_base)
                ),
            );
        } else {
            out.status(
                src,
                &done.head,
                &context,
                State::Failure,
                done.error.as_deref().unwrap_or("failed"),
            );
        }
        if let Some(n) = preview.number {
            out.preview_comment(src, n);
        }
        let mut tx = self.0.pool.begin().await.map_err(StoreError::from)?;
        self.check_fence(env, &mut tx).await?;
        if !store_previews::finish_run(&mut tx, run.id, &end).await? {
            return Ok(false);
        }
        store_previews::store_changes(&mut tx, run.id, &done.changes).await?;
        if let Some((id, version)) = dryrun {
            let resources: Vec<&crate::model::Resource> = done.dry.iter().collect();
            store_previews::create_dryrun(
                &mut tx,
                env,
                id,
                run.id,
                version,
                &resources,
                &format!("preview of {}", preview.reference),
            )
            .await?;
        }
        out.write(&mut tx, env).await?;
        tx.commit().await.map_err(StoreError::from)?;
        self.0.feedback.wake();
        if let Some((dryrun, _)) = dryrun {
            // the environment's scheduler runs it (on whichever replica owns it)
            self.0.notifier.send(crate::events::Event::PreviewDryrun {
                environment: env,
                dryrun,
            });
        }
        Ok(true)
    }
}

fn short(c: &str) -> &str {
    &c[..c.len().min(12)]
}

/// What a value holding one of `secrets` (4 characters or more) shows instead.
pub const HIDDEN: &str = "(hidden: contains a secret value)";

/// Hide every attribute value, old or new, that holds a secret value.
fn redact(changes: &mut [store_previews::PreviewChange], secrets: &[String]) {
    let secrets: Vec<&str> = secrets
        .iter()
        .map(String::as_str)
        .filter(|s| s.len() >= 4)
        .collect();
    if secrets.is_empty() {
        return;
    }
    let holds = |v: &Value| {
        let text = match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        secrets.iter().any(|s| text.contains(s))
    };
    for ch in changes {
        if let Some(attrs) = ch.attributes.as_object_mut() {
            for c in attrs.values_mut() {
                for side in ["current", "desired"] {
                    if holds(&c[side]) {
                        c[side] = json!(HIDDEN);
                    }
                }
            }
        }
    }
}

/// A run as it goes.
struct Done {
    success: bool,
    head: String,
    base: Option<String>,
    merge: Option<String>,
    merge_source: Option<&'static str>,
    diff_base: Option<i32>,
    summary: Value,
    stages: Vec<Value>,
    exit_code: Option<i32>,
    stdout: String,
    stderr: String,
    diagnostics: Value,
    source_lines: Vec<compile::SourceLine>,
    error: Option<String>,
    changes: Vec<store_previews::PreviewChange>,
    /// What the dry-run runs, when there is one.
    dry: Vec<crate::model::Resource>,
}

impl Done {
    fn new(head: &str) -> Done {
        Done {
            success: false,
            head: head.into(),
            base: None,
            merge: None,
            merge_source: None,
            diff_base: None,
            summary: json!({}),
            stages: Vec::new(),
            exit_code: None,
            stdout: String::new(),
            stderr: String::new(),
            diagnostics: json!([]),
            source_lines: Vec::new(),
            error: None,
            changes: Vec::new(),
            dry: Vec::new(),
        }
    }

    fn stage(&mut self, name: &str, at: compile::Start, ok: bool, detail: &str) {
        self.stages
            .push(compile::stage(name, at.0, at.1.elapsed(), ok, detail));
    }

    fn failed(mut self, name: &str, at: compile::Start, error: String) -> Done {
        self.stage(name, at, false, &error);
        self.error = Some(error);
        self
    }

    /// A compile that failed: its report becomes the run's.
    fn absorb(&mut self, r: compile::CompileResult) {
        self.stages = r.stages.as_array().cloned().unwrap_or_default();
        self.exit_code = r.exit_code;
        self.stdout = r.stdout;
        self.stderr = r.stderr;
        self.diagnostics = r.diagnostics;
        self.error = r.error;
    }

    /// The lines the diagnostics point at, read from the merge (so a comment shows them
    /// wherever it is rendered).
    async fn source_lines(&mut self, mirror: &Path, merge: &str, path: &str) {
        let (m, c, p, d) = (
            mirror.to_path_buf(),
            merge.to_string(),
            path.to_string(),
            self.diagnostics.clone(),
        );
        self.source_lines =
            tokio::task::spawn_blocking(move || compile::source_lines(&m, &c, &p, &d))
                .await
                .unwrap_or_default();
    }
}

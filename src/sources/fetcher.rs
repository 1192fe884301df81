//! The fetcher of an environment's source: one task per followed environment, which polls,
//! takes hints (webhooks, hooks, watches of a local repository) and API triggers, fetches the
//! branch into the environment's mirror and queues the commit to compile (or says why not).

use super::*;

/// A look at the branch (the mirror's lock and the fetch) longer than this is logged as a
/// warning: every trigger of the source waits for it.
const SLOW_FETCH: Duration = Duration::from_secs(10);

impl GitSources {
    pub(super) async fn fetcher(
        self,
        env: Uuid,
        mut rx: mpsc::UnboundedReceiver<Msg>,
        queued: Arc<Notify>,
    ) {
        // the database may be busy or away: keep trying (triggers wait in the channel)
        let mut delay = Duration::from_millis(100);
        let source = loop {
            match store::sources::get_source(&self.0.pool, env).await {
                Ok(Some(s)) => break s,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(environment = %env, error = %e, "loading the git source failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        };
        let (watch_tx, mut watch_rx) = mpsc::unbounded_channel();
        let _watcher = if source.watch {
            watch_local_repository(&source.url, watch_tx)
        } else {
            None
        };
        let mut next_poll = next_poll_at(source.poll_interval);
        let mut pending: std::collections::VecDeque<Msg> = std::collections::VecDeque::new();
        let mut last_hint_fetch: Option<Instant> = None;
        let mut retry_delay: Option<Duration> = None;
        loop {
            let sleep = next_poll
                .map(|t| t.saturating_duration_since(Instant::now()))
                .unwrap_or(Duration::from_secs(3600));
            let msg = match pending.pop_front() {
                Some(m) => m,
                None => tokio::select! {
                    m = rx.recv() => match m {
                        Some(m) => m,
                        None => return,
                    },
                    Some(()) = watch_rx.recv() => {
                        // a burst of ref updates is one push
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        while watch_rx.try_recv().is_ok() {}
                        Msg::Trigger { kind: "watch".into(), commit: None, reply: None }
                    }
                    _ = tokio::time::sleep(sleep) => {
                        next_poll = next_poll_at(source.poll_interval);
                        Msg::Trigger { kind: "poll".into(), commit: None, reply: None }
                    }
                },
            };
            let (kind, commit, reply) = match msg {
                Msg::Trigger {
                    kind,
                    commit,
                    reply,
                } => (kind, commit, reply),
                Msg::Recompile(facts) => {
                    match self.queue_recompile(env, &source, &facts).await {
                        Ok(true) => queued.notify_one(),
                        Ok(false) => {}
                        // the database is away: the facts stay pending and are tried again
                        Err(SourceError::Store(e @ StoreError::Unavailable(_))) => {
                            tracing::warn!(environment = %env, error = %e, "queueing the recompile for facts failed; trying again");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            pending.push_back(Msg::Recompile(facts));
                        }
                        Err(e) => {
                            tracing::warn!(environment = %env, error = %e, "queueing the recompile for facts failed")
                        }
                    }
                    continue;
                }
            };
            // triggers for the tip that arrived meanwhile are answered by this one fetch;
            // one naming a commit waits its turn
            let mut replies: Vec<oneshot::Sender<Result<Triggered, SourceError>>> =
                reply.into_iter().collect();
            let mut kind = kind;
            if commit.is_none() {
                while let Ok(m) = rx.try_recv() {
                    match m {
                        Msg::Trigger {
                            kind: k,
                            commit: None,
                            reply,
                        } => {
                            if kind == "poll" || kind == "startup" {
                                kind = k;
                            }
                            replies.extend(reply);
                        }
                        named => pending.push_back(named),
                    }
                }
            }
            // hints (webhooks, hooks, watches) are rate-limited per source: a flood of them,
            // replayed or not, costs one fetch a second at most
            if matches!(kind.as_str(), "webhook" | "hook" | "watch")
                && let Some(last) = last_hint_fetch
            {
                let wait = MIN_HINT_INTERVAL.saturating_sub(Instant::now().duration_since(last));
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                    while let Ok(m) = rx.try_recv() {
                        match m {
                            Msg::Trigger {
                                commit: None,
                                reply,
                                ..
                            } => replies.extend(reply),
                            named => pending.push_back(named),
                        }
                    }
                }
            }
            if matches!(kind.as_str(), "webhook" | "hook" | "watch") {
                last_hint_fetch = Some(Instant::now());
            }
            let began = Instant::now();
            let r = self.fetch_and_queue(&source, &kind, commit).await;
            if began.elapsed() > SLOW_FETCH {
                tracing::warn!(environment = %env, trigger = %kind, took_ms = began.elapsed().as_millis() as u64, waiting = replies.len(), "a trigger took long to answer (fetch, then queueing the compile)");
            }
            if let Ok(t) = &r
                && t.status == "queued"
            {
                queued.notify_one();
            }
            if let Err(e) = &r
                && (!matches!(kind.as_str(), "poll" | "startup")
                    || !matches!(e, SourceError::Git(_)))
            {
                tracing::warn!(environment = %env, trigger = %kind, error = %e, "git trigger failed");
            }
            // a failed look at the branch on its own (at start, or a poll) is tried again
            // with backoff, also when polling is off: nothing else may come to look
            match (&r, kind.as_str()) {
                (Err(e), "poll" | "startup") => {
                    let d = retry_delay
                        .map(|d: Duration| (d * 2).min(Duration::from_secs(30)))
                        .unwrap_or(Duration::from_secs(1));
                    retry_delay = Some(d);
                    let retry = Instant::now() + d;
                    next_poll = Some(next_poll.map_or(retry, |p| p.min(retry)));
                    tracing::info!(environment = %env, trigger = %kind, error = %e, retry_in_s = d.as_secs(), "looking at the branch failed; trying again");
                }
                (Ok(_), _) => retry_delay = None,
                _ => {}
            }
            for reply in replies {
                let _ = reply.send(match &r {
                    Ok(t) => Ok(t.clone()),
                    Err(e) => Err(e.clone()),
                });
            }
        }
    }

    /// Make sure the mirror holds `commit`, fetching when it does not.
    pub(super) async fn fetch_commit(
        &self,
        src: &SourceRow,
        mirror: &Path,
        commit: &str,
    ) -> Result<(), git::GitError> {
        if let Some(e) = self.refused(&src.url) {
            return Err(e);
        }
        let guard = self.mirror_lock(mirror).lock_owned().await;
        let (mirror, url, auth, commit) = (
            mirror.to_path_buf(),
            src.url.clone(),
            git::Auth::of(src),
            commit.to_string(),
        );
        tokio::task::spawn_blocking(move || {
            let _guard = guard;
            if git::has_commit(&mirror, &commit) {
                return Ok(());
            }
            git::ensure_mirror(&mirror, &url, &auth)
        })
        .await
        .map_err(|e| git::GitError::Other(format!("fetch crashed: {e}")))?
    }

    /// Fetch, resolve, and queue the commit to compile.
    pub(super) async fn fetch_and_queue(
        &self,
        src: &SourceRow,
        kind: &str,
        commit: Option<String>,
    ) -> Result<Triggered, SourceError> {
        let env = src.environment_id;
        let mirror = self.mirror_of(src.environment_id, &src.url);
        let started = Utc::now();
        let t = Instant::now();
        let fetched = {
            // the guard goes into the blocking fetch: if this task is aborted (the workers
            // restart), the fetch still runs to its end before another may start
            let guard = self.mirror_lock(&mirror).lock_owned().await;
            let lock_wait = t.elapsed();
            let (mirror, url, auth, branch) = (
                mirror.clone(),
                src.url.clone(),
                git::Auth::of(src),
                src.branch.clone(),
            );
            let refused = self.refused(&url);
            let fetched =
                tokio::task::spawn_blocking(move || -> Result<Option<String>, git::GitError> {
                    let _guard = guard;
                    if let Some(e) = refused {
                        return Err(e);
                    }
                    git::ensure_mirror(&mirror, &url, &auth)?;
                    git::resolve_branch(&mirror, &branch)
                })
                .await
                .map_err(|e| git::GitError::Other(format!("fetch crashed: {e}")))?;
            // a trigger is answered only after this: say where a slow one spent its time
            // (waiting for the mirror another fetch or a preview held, or the fetch itself)
            let took = t.elapsed();
            if took > SLOW_FETCH {
                tracing::warn!(environment = %env, trigger = kind, lock_wait_ms = lock_wait.as_millis() as u64, fetch_ms = (took - lock_wait).as_millis() as u64, "looking at the branch took long");
            } else {
                tracing::debug!(environment = %env, trigger = kind, lock_wait_ms = lock_wait.as_millis() as u64, fetch_ms = (took - lock_wait).as_millis() as u64, "looked at the branch");
            }
            fetched
        };
        let tip = match fetched {
            Ok(Some(tip)) => tip,
            Ok(None) => {
                let e = SourceError::NoBranch(src.branch.clone());
                let _ = store::sources::record_fetch(&self.0.pool, env, None, Some(&e.to_string()))
                    .await;
                return Err(e);
            }
            Err(e) => {
                let _ = store::sources::record_fetch(&self.0.pool, env, None, Some(&e.to_string()))
                    .await;
                return Err(e.into());
            }
        };
        store::sources::record_fetch(&self.0.pool, env, Some(&tip), None).await?;
        let fetch_ms = t.elapsed();
        let commit_named = commit.is_some();
        let target = match commit {
            None => tip.clone(),
            Some(c) => {
                let (mirror, branch, c2) = (mirror.clone(), src.branch.clone(), c.clone());
                let resolved = tokio::task::spawn_blocking(move || {
                    git::commit_on_branch(&mirror, &c2, &branch)
                })
                .await
                .map_err(|e| git::GitError::Other(format!("lookup crashed: {e}")))??;
                match resolved {
                    Some(full) => full,
                    None => {
                        return Err(SourceError::NotOnBranch {
                            commit: c,
                            branch: src.branch.clone(),
                        });
                    }
                }
            }
        };
        // only someone naming a commit may compile a failed one again
        if let Some(done) =
            store::sources::existing_compile(&self.0.pool, env, &target, commit_named).await?
        {
            return Ok(Triggered {
                commit: target,
                status: "already_compiled".into(),
                compile: done.id,
                superseded: vec![],
            });
        }
        let fetch_stage = compile::stage(
            "fetch",
            started,
            fetch_ms,
            true,
            &format!("{} at {}", src.branch, &tip[..tip.len().min(12)]),
        );
        // commits that reached the branch with this one (two quick pushes, a push of
        // several commits) are not compiled, but each leaves a trace
        let skipped = if commit_named {
            Vec::new()
        } else {
            match store::sources::last_compiled_commit(&self.0.pool, env).await? {
                Some(last) if last != target => {
                    let (mirror, tip, last) = (mirror.clone(), target.clone(), last.clone());
                    tokio::task::spawn_blocking(move || {
                        git::commits_between(&mirror, &tip, &last, 100)
                    })
                    .await
                    .map_err(|e| git::GitError::Other(format!("history walk crashed: {e}")))?
                    .unwrap_or_default()
                }
                _ => Vec::new(),
            }
        };
        let mut out = Outgoing::default();
        let mut tx = self.0.pool.begin().await.map_err(StoreError::from)?;
        self.check_fence(env, &mut tx).await?;
        let (id, mut superseded) =
            store::sources::enqueue(&mut tx, env, &target, &src.branch, kind, fetch_stage).await?;
        let skipped_ids =
            store::sources::record_skipped(&mut tx, env, &skipped, &src.branch, kind, id).await?;
        superseded.extend(skipped_ids.into_iter().zip(skipped));
        store::sources::add_event(
            &mut *tx,
            env,
            &target,
            "received",
            json!({"trigger": kind, "compile": id}),
        )
        .await?;
        out.status(
            src,
            &target,
            "steward/compile",
            State::Pending,
            "queued for compile",
        );
        out.notify(
            src,
            "received",
            json!({"commit": target, "compile": id, "trigger": kind}),
        );
        for (old, old_commit) in &superseded {
            store::sources::add_event(
                &mut *tx,
                env,
                old_commit,
                "superseded",
                json!({"compile": old, "by": id, "by_commit": target}),
            )
            .await?;
            out.status(
                src,
                old_commit,
                "steward/compile",
                State::Error,
                "superseded by a newer commit before it compiled",
            );
            out.notify(
                src,
                "superseded",
                json!({"commit": old_commit, "compile": old, "by_commit": target}),
            );
        }
        let queued = out.write(&mut tx, env).await?;
        tx.commit().await.map_err(StoreError::from)?;
        if queued {
            self.0.feedback.wake();
        }
        tracing::info!(environment = %env, commit = %target, trigger = kind, superseded = superseded.len(), "commit queued for compile");
        Ok(Triggered {
            commit: target,
            status: "queued".into(),
            compile: id,
            superseded: superseded.into_iter().map(|(i, _)| i).collect(),
        })
    }
}

//! The compile queue of an environment: one task per followed environment, which runs the
//! queued compiles one at a time and records how each ended (its events and the commit status
//! and notifications they cause) in one transaction. Compiles an earlier run left `running`
//! are queued again, or settled when their version was already stored.

use super::*;

impl GitSources {
    /// The end of a compile, its timeline events and the messages they cause, in one
    /// transaction; while the database is away it is tried again (the compile itself is not
    /// repeated), so a restart of PostgreSQL never leaves a commit at `compile_started`.
    pub(super) async fn finish_compile(
        &self,
        id: Uuid,
        end: &store::sources::CompileEnd<'_>,
        src: &SourceRow,
        events: &[(&str, &str, serde_json::Value)],
        out: Outgoing,
    ) -> Result<(), StoreError> {
        let env = src.environment_id;
        let mut delay = Duration::from_millis(200);
        loop {
            let attempt = async {
                let mut tx = self.0.pool.begin().await?;
                self.check_fence(env, &mut tx).await?;
                store::sources::finish_compile(&mut *tx, id, end).await?;
                for (commit, event, detail) in events {
                    store::sources::add_event(&mut *tx, env, commit, event, detail.clone()).await?;
                }
                let queued = out.clone().write(&mut tx, env).await?;
                tx.commit().await?;
                Ok::<bool, StoreError>(queued)
            }
            .await;
            match attempt {
                Ok(queued) => {
                    if queued {
                        self.0.feedback.wake();
                    }
                    return Ok(());
                }
                Err(e @ StoreError::Unavailable(_)) => {
                    tracing::warn!(environment = %env, error = %e, "recording a finished compile failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// End the compiles left running whose version was stored (the server stopped, or this
    /// replica's predecessor lost the environment, between storing the version and recording
    /// the end): they are not compiled again, which would make a second version of the same
    /// commit. Their timeline and the commit status say they compiled. True when feedback
    /// was queued.
    pub(super) async fn settle_stored(
        &self,
        tx: &mut sqlx::PgConnection,
        env: Option<Uuid>,
    ) -> Result<bool, StoreError> {
        let settled = store::sources::settle_stored(&mut *tx, env).await?;
        let mut queued = false;
        for c in settled {
            tracing::warn!(environment = %c.environment_id, commit = %c.commit, version = c.version, compile = %c.id, "a compile's version was stored but its end was not recorded: recorded now, not compiled again");
            let detail = json!({"compile": c.id, "version": c.version});
            store::sources::add_event(&mut *tx, c.environment_id, &c.commit, "compiled", detail)
                .await?;
            let mut out = Outgoing::default();
            if let Some(src) = store::sources::get_source(&mut *tx, c.environment_id).await? {
                out.status(
                    &src,
                    &c.commit,
                    "steward/compile",
                    State::Success,
                    &format!("compiled into version {}", c.version),
                );
                out.notify(
                    &src,
                    "compiled",
                    json!({"commit": c.commit, "compile": c.id, "version": c.version}),
                );
            }
            queued |= out.write(&mut *tx, c.environment_id).await?;
        }
        Ok(queued)
    }

    pub(super) async fn compiler(self, env: Uuid, queued: Arc<Notify>) {
        // a compile left `running` by the workers this one replaces (a source changed), by
        // a stop, or by the replica that owned the environment before: it runs again here
        let mut delay = Duration::from_millis(200);
        loop {
            let requeued = async {
                let mut tx = self.0.pool.begin().await?;
                self.check_fence(env, &mut tx).await?;
                let settled = self.settle_stored(&mut tx, Some(env)).await?;
                let n = store::sources::requeue_interrupted_of(&mut *tx, env).await?;
                tx.commit().await?;
                Ok::<(bool, u64), StoreError>((settled, n))
            }
            .await;
            match requeued {
                Ok((settled, n)) => {
                    if settled {
                        self.0.feedback.wake();
                    }
                    if n > 0 {
                        tracing::info!(environment = %env, compiles = n, "interrupted compiles are queued again");
                    }
                    break;
                }
                Err(StoreError::Fenced(_)) => return,
                Err(e) => {
                    tracing::warn!(environment = %env, error = %e, "re-queueing interrupted compiles failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
        // what this environment's last compile stored: the next one is stored as its changes
        let mut memory = compile::Memories::default();
        loop {
            let ran = self.compile_next(env, &mut memory).await;
            match ran {
                Ok(true) => continue,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(environment = %env, error = %e, "running the compile queue failed; retrying")
                }
            }
            // woken by a queued commit, or look again (a halted environment resumed, the
            // database came back)
            let _ = tokio::time::timeout(Duration::from_secs(1), queued.notified()).await;
        }
    }

    /// Run the next queued compile; false when there is none (or the environment is halted).
    pub(super) async fn compile_next(
        &self,
        env: Uuid,
        memory: &mut compile::Memories,
    ) -> Result<bool, SourceError> {
        let pool = &self.0.pool;
        let Some(job) = store::sources::next_queued(pool, env).await? else {
            return Ok(false);
        };
        if store::environments::get_environment(pool, env)
            .await?
            .halted
        {
            return Ok(false);
        }
        let Some(src) = store::sources::get_source(pool, env).await? else {
            return Ok(false);
        };
        // started and said so, or neither: a compile is never left running unannounced
        {
            let mut tx = pool.begin().await.map_err(StoreError::from)?;
            self.check_fence(env, &mut tx).await?;
            if !store::sources::start_compile(&mut *tx, job.id).await? {
                return Ok(true);
            }
            store::sources::add_event(
                &mut *tx,
                env,
                &job.commit,
                "compile_started",
                json!({"compile": job.id}),
            )
            .await?;
            tx.commit().await.map_err(StoreError::from)?;
        }
        let mirror = self.mirror_of(src.environment_id, &src.url);
        // a compile queued by another replica (which fetched into its own mirror) or
        // before this data dir was new: fetch here first
        if let Err(e) = self.fetch_commit(&src, &mirror, &job.commit).await {
            tracing::warn!(environment = %env, commit = %job.commit, error = %e, "fetching the commit to compile failed; the compile reports it");
        }
        let pip_sources = self.0.pip_sources.lock().unwrap().clone();
        let r = compile::run(
            pool,
            &job,
            &src,
            &mirror,
            &self.0.steward_bin,
            compile::Python {
                envs: &self.0.data_dir.join("python-envs"),
                pip: &pip_sources,
                made: &self.0.envs_made,
            },
            self.fence(env).as_ref(),
            memory,
        )
        .await;
        let end = store::sources::CompileEnd {
            success: r.success,
            stages: &r.stages,
            exit_code: r.exit_code,
            stdout: &r.stdout,
            stderr: &r.stderr,
            diagnostics: &r.diagnostics,
            error: r.error.as_deref(),
            version: r.version,
            python_env: r.python_env.as_deref(),
        };
        let mut out = Outgoing::default();
        let mut events: Vec<(&str, &str, serde_json::Value)> = Vec::new();
        if r.success {
            let v = r.version.unwrap_or(0);
            events.push((
                &job.commit,
                "compiled",
                json!({"compile": job.id, "version": v}),
            ));
            events.push((
                &job.commit,
                "version",
                json!({"version": v, "auto_released": r.auto_released}),
            ));
            out.status(
                &src,
                &job.commit,
                "steward/compile",
                State::Success,
                &format!("compiled into version {v}"),
            );
            out.notify(&src, "compiled", json!({"commit": job.commit, "compile": job.id, "version": v, "auto_released": r.auto_released}));
            if !r.auto_released {
                events.push((&job.commit, "waiting_for_approval", json!({"version": v})));
                out.status(
                    &src,
                    &job.commit,
                    "steward/deploy",
                    State::Pending,
                    &format!("version {v} waits for approval"),
                );
            }
            self.finish_compile(job.id, &end, &src, &events, out)
                .await?;
            tracing::info!(environment = %env, commit = %job.commit, version = v, auto_released = r.auto_released, "commit compiled");
            if r.resolved_meanwhile {
                tracing::info!(environment = %env, commit = %job.commit, version = v, "values the compile missed arrived while it ran: compiling again");
                self.facts_arrived(env, vec![v], Vec::new(), false);
            }
            if r.auto_released {
                self.0.notifier.send(Event::Released {
                    environment: env,
                    version: v,
                });
            }
        } else {
            let error = r.error.clone().unwrap_or_default();
            events.push((
                &job.commit,
                "compile_failed",
                json!({"compile": job.id, "error": error}),
            ));
            out.status(&src, &job.commit, "steward/compile", State::Failure, &error);
            out.notify(&src, "compile_failed", json!({"commit": job.commit, "compile": job.id, "error": error, "diagnostics": r.diagnostics}));
            self.finish_compile(job.id, &end, &src, &events, out)
                .await?;
            tracing::warn!(environment = %env, commit = %job.commit, error = %error, "commit did not compile; the active version stays");
        }
        Ok(true)
    }
}

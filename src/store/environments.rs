//! Projects and environments (multi-tenancy).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgExecutor};
use uuid::Uuid;

use super::{Result, StoreError};
use crate::model::settings::EnvSettings;

#[derive(Clone, Debug, Serialize, serde::Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Project {
    pub id: Uuid,
    pub name: String,
    pub created_at: DateTime<Utc>,
}

#[derive(Clone, Debug, sqlx::FromRow)]
struct EnvironmentRow {
    id: Uuid,
    project_id: Uuid,
    project_name: String,
    name: String,
    settings: serde_json::Value,
    auto_release_held: bool,
    halted: bool,
    created_at: DateTime<Utc>,
}

#[derive(Clone, Debug, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Environment {
    pub id: Uuid,
    pub project_id: Uuid,
    pub project: String,
    pub name: String,
    pub settings: EnvSettings,
    pub auto_release_held: bool,
    pub halted: bool,
    pub created_at: DateTime<Utc>,
}

impl From<EnvironmentRow> for Environment {
    fn from(r: EnvironmentRow) -> Environment {
        Environment {
            id: r.id,
            project_id: r.project_id,
            project: r.project_name,
            name: r.name,
            settings: EnvSettings::from_stored(&r.settings),
            auto_release_held: r.auto_release_held,
            halted: r.halted,
            created_at: r.created_at,
        }
    }
}

const ENV_SELECT: &str = "SELECT e.id, e.project_id, p.name AS project_name, e.name, e.settings, \
     e.auto_release_held, e.halted, e.created_at FROM environments e JOIN projects p ON p.id = e.project_id";

pub fn valid_name(kind: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 100
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !name.starts_with(['-', '.']);
    if ok {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!(
            "invalid {kind} name '{name}': use 1-100 letters, digits, '-', '_' or '.'"
        )))
    }
}

pub async fn create_project(e: impl PgExecutor<'_>, name: &str) -> Result<Project> {
    valid_name("project", name)?;
    sqlx::query_as::<_, Project>(
        "INSERT INTO projects (id, name) VALUES ($1, $2) RETURNING id, name, created_at",
    )
    .bind(Uuid::new_v4())
    .bind(name)
    .fetch_one(e)
    .await
    .map_err(|err| match StoreError::from(err) {
        StoreError::Conflict(_) => {
            StoreError::Conflict(format!("a project named '{name}' exists already"))
        }
        other => other,
    })
}

pub async fn list_projects(e: impl PgExecutor<'_>) -> Result<Vec<Project>> {
    Ok(
        sqlx::query_as::<_, Project>("SELECT id, name, created_at FROM projects ORDER BY name")
            .fetch_all(e)
            .await?,
    )
}

pub async fn get_project(e: impl PgExecutor<'_>, id: Uuid) -> Result<Project> {
    sqlx::query_as::<_, Project>("SELECT id, name, created_at FROM projects WHERE id = $1")
        .bind(id)
        .fetch_optional(e)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("project {id}")))
}

pub async fn find_project(e: impl PgExecutor<'_>, name: &str) -> Result<Project> {
    sqlx::query_as::<_, Project>("SELECT id, name, created_at FROM projects WHERE name = $1")
        .bind(name)
        .fetch_optional(e)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("project '{name}'")))
}

pub async fn rename_project(e: impl PgExecutor<'_>, id: Uuid, name: &str) -> Result<Project> {
    valid_name("project", name)?;
    sqlx::query_as::<_, Project>(
        "UPDATE projects SET name = $2 WHERE id = $1 RETURNING id, name, created_at",
    )
    .bind(id)
    .bind(name)
    .fetch_optional(e)
    .await?
    .ok_or_else(|| StoreError::NotFound(format!("project {id}")))
}

/// Delete a project; refused while it holds a protected environment.
pub async fn delete_project(c: &mut PgConnection, id: Uuid) -> Result<()> {
    let envs = list_environments(&mut *c, Some(id)).await?;
    if let Some(p) = envs.iter().find(|e| e.settings.protected) {
        return Err(StoreError::Conflict(format!(
            "environment '{}' of this project is protected: unprotect it first",
            p.name
        )));
    }
    let ids: Vec<Uuid> = envs.iter().map(|e| e.id).collect();
    let hashes = locked_attribute_hashes(&mut *c, &ids).await?;
    let r = sqlx::query("DELETE FROM projects WHERE id = $1")
        .bind(id)
        .execute(&mut *c)
        .await?;
    if r.rows_affected() == 0 {
        return Err(StoreError::NotFound(format!("project {id}")));
    }
    super::versions::collect_blobs(c, &hashes).await?;
    Ok(())
}

/// Lock environments that are about to be deleted (waiting for a version being stored in
/// them) and return the attribute hashes their versions refer to: the blobs to collect once
/// they are gone (their spans go with their rows: migration 0021).
async fn locked_attribute_hashes(c: &mut PgConnection, ids: &[Uuid]) -> Result<Vec<String>> {
    sqlx::query("SELECT 1 FROM environments WHERE id = ANY($1) ORDER BY id FOR UPDATE")
        .bind(ids)
        .execute(&mut *c)
        .await?;
    Ok(sqlx::query_scalar(
        "SELECT DISTINCT hash FROM resource_spans WHERE environment_id = ANY($1) ORDER BY hash",
    )
    .bind(ids)
    .fetch_all(&mut *c)
    .await?)
}

pub async fn create_environment(
    e: impl PgExecutor<'_>,
    project_id: Uuid,
    name: &str,
    settings: &EnvSettings,
) -> Result<Uuid> {
    valid_name("environment", name)?;
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO environments (id, project_id, name, settings) VALUES ($1, $2, $3, $4)",
    )
    .bind(id)
    .bind(project_id)
    .bind(name)
    .bind(serde_json::to_value(settings).expect("settings serialize"))
    .execute(e)
    .await
    .map_err(|err| match StoreError::from(err) {
        StoreError::Conflict(_) => StoreError::Conflict(format!(
            "the project has an environment named '{name}' already"
        )),
        StoreError::Invalid(_) => StoreError::NotFound(format!("project {project_id}")),
        other => other,
    })?;
    Ok(id)
}

pub async fn list_environments(
    e: impl PgExecutor<'_>,
    project: Option<Uuid>,
) -> Result<Vec<Environment>> {
    let sql =
        format!("{ENV_SELECT} WHERE $1::uuid IS NULL OR e.project_id = $1 ORDER BY p.name, e.name");
    let rows = sqlx::query_as::<_, EnvironmentRow>(sqlx::AssertSqlSafe(sql))
        .bind(project)
        .fetch_all(e)
        .await?;
    Ok(rows.into_iter().map(Environment::from).collect())
}

pub async fn get_environment(e: impl PgExecutor<'_>, id: Uuid) -> Result<Environment> {
    let sql = format!("{ENV_SELECT} WHERE e.id = $1");
    sqlx::query_as::<_, EnvironmentRow>(sqlx::AssertSqlSafe(sql))
        .bind(id)
        .fetch_optional(e)
        .await?
        .map(Environment::from)
        .ok_or_else(|| StoreError::NotFound(format!("environment {id}")))
}

/// Environments named `name` (in any project), or `project/name`.
pub async fn find_environments(e: impl PgExecutor<'_>, name: &str) -> Result<Vec<Environment>> {
    let (project, env) = match name.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, name),
    };
    let sql = format!(
        "{ENV_SELECT} WHERE e.name = $1 AND ($2::text IS NULL OR p.name = $2) ORDER BY p.name"
    );
    let rows = sqlx::query_as::<_, EnvironmentRow>(sqlx::AssertSqlSafe(sql))
        .bind(env)
        .bind(project)
        .fetch_all(e)
        .await?;
    Ok(rows.into_iter().map(Environment::from).collect())
}

pub async fn rename_environment(e: impl PgExecutor<'_>, id: Uuid, name: &str) -> Result<()> {
    valid_name("environment", name)?;
    let r = sqlx::query("UPDATE environments SET name = $2 WHERE id = $1")
        .bind(id)
        .bind(name)
        .execute(e)
        .await
        .map_err(|err| match StoreError::from(err) {
            StoreError::Conflict(_) => StoreError::Conflict(format!(
                "the project has an environment named '{name}' already"
            )),
            other => other,
        })?;
    if r.rows_affected() == 0 {
        return Err(StoreError::NotFound(format!("environment {id}")));
    }
    Ok(())
}

/// Store validated settings (the caller validated them with `EnvSettings::patched`).
pub async fn set_settings(e: impl PgExecutor<'_>, id: Uuid, settings: &EnvSettings) -> Result<()> {
    let r = sqlx::query(
        "UPDATE environments SET settings = $2 WHERE id = $1 \
         RETURNING pg_notify($3, id::text)",
    )
    .bind(id)
    .bind(serde_json::to_value(settings).expect("settings serialize"))
    .bind(super::changes::CHANNEL)
    .execute(e)
    .await?;
    if r.rows_affected() == 0 {
        return Err(StoreError::NotFound(format!("environment {id}")));
    }
    Ok(())
}

pub async fn set_auto_release_held(e: impl PgExecutor<'_>, id: Uuid, held: bool) -> Result<()> {
    sqlx::query("UPDATE environments SET auto_release_held = $2 WHERE id = $1")
        .bind(id)
        .bind(held)
        .execute(e)
        .await?;
    Ok(())
}

pub async fn set_halted(e: impl PgExecutor<'_>, id: Uuid, halted: bool) -> Result<()> {
    // followers (console pages) hear of it when this commits
    sqlx::query(
        "UPDATE environments SET halted = $2 WHERE id = $1 \
         RETURNING pg_notify($3, id::text)",
    )
    .bind(id)
    .bind(halted)
    .bind(super::changes::CHANNEL)
    .execute(e)
    .await?;
    Ok(())
}

/// Delete an environment and everything in it; refused when it is protected.
pub async fn delete_environment(c: &mut PgConnection, id: Uuid) -> Result<()> {
    let env = get_environment(&mut *c, id).await?;
    if env.settings.protected {
        return Err(StoreError::Conflict(format!(
            "environment '{}' is protected: set protected=false first",
            env.name
        )));
    }
    // its versions' attributes that no other environment shares go with it
    let hashes = locked_attribute_hashes(&mut *c, &[id]).await?;
    sqlx::query("DELETE FROM environments WHERE id = $1")
        .bind(id)
        .execute(&mut *c)
        .await?;
    super::versions::collect_blobs(c, &hashes).await?;
    Ok(())
}

/// Take the environment's row lock for the rest of the transaction (serializes version
/// numbering and releases per environment). Whoever locks it changes it: followers are
/// notified when the transaction commits.
pub async fn lock(c: &mut PgConnection, id: Uuid) -> Result<Environment> {
    let sql = format!("{ENV_SELECT} WHERE e.id = $1 FOR UPDATE OF e");
    let env = sqlx::query_as::<_, EnvironmentRow>(sqlx::AssertSqlSafe(sql))
        .bind(id)
        .fetch_optional(&mut *c)
        .await?
        .map(Environment::from)
        .ok_or_else(|| StoreError::NotFound(format!("environment {id}")))?;
    super::changes::notify(&mut *c, id).await?;
    Ok(env)
}

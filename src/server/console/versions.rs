//! (being written) the console's versions pages.

use axum::Router;

use crate::server::AppState;

/// This module's templates (registered by [`super::render`]).
pub const TEMPLATES: &[(&str, &str)] = &[];

pub fn routes() -> Router<AppState> {
    Router::new()
}

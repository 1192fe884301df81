//! Rules for names as written in the model, shared by the define and lower stages: which
//! identifiers are valid, and what a type name means in the namespace it is written in
//! (LANGUAGE.md §2.4).

use super::ast;
use super::diagnostics::Diagnostic;
use super::ids::{EntityId, NsId};
use super::program::Program;
use super::types::{Prim, TypeRef};

/// What a type name names: a primitive type or a type defined in some namespace.
pub(crate) enum ResolvedType {
    Prim(Prim),
    Named(TypeRef),
}

/// `-` is not allowed in identifiers (as in the reference): the error for `name`, if any.
pub(crate) fn hyphen_error(name: &ast::Name) -> Option<Diagnostic> {
    if name.text.contains('-') {
        Some(
            Diagnostic::error(
                "invalid-name",
                format!(
                    "The use of '-' in identifiers is not allowed. please rename {}",
                    name.text
                ),
            )
            .at(name.span),
        )
    } else {
        None
    }
}

/// Resolve a type name as written in namespace `ns` (LANGUAGE.md §2.4).
pub(crate) fn resolve_type(
    p: &Program,
    ns: NsId,
    q: &ast::QName,
) -> Result<ResolvedType, Diagnostic> {
    let full = q.full();
    let nsd = p.ns(ns);
    if let Some(prefix) = q.prefix() {
        let Some(target) = nsd.visible.get(&prefix) else {
            return Err(Diagnostic::error(
                "unknown-type",
                format!(
                    "could not find type {full} in namespace {}. Try importing the module with `import {prefix}`",
                    nsd.name
                ),
            )
            .at(q.span));
        };
        let t = p.ns(*target);
        return match t.types.get(&q.last().text) {
            Some(t) => Ok(ResolvedType::Named(*t)),
            None => Err(Diagnostic::error(
                "unknown-type",
                format!("could not find type {full} in namespace {}", t.name),
            )
            .at(q.span)),
        };
    }
    let name = &q.last().text;
    if let Some(p) = Prim::from_name(name) {
        return Ok(ResolvedType::Prim(p));
    }
    let mut cur = Some(ns);
    while let Some(c) = cur {
        let cd = p.ns(c);
        if let Some(t) = cd.types.get(name) {
            return Ok(ResolvedType::Named(*t));
        }
        cur = cd.parent;
    }
    Err(Diagnostic::error(
        "unknown-type",
        format!("could not find type {full} in namespace {}", nsd.name),
    )
    .at(q.span))
}

/// Resolve a name that must be an entity.
pub(crate) fn resolve_entity(
    p: &Program,
    ns: NsId,
    q: &ast::QName,
) -> Result<EntityId, Diagnostic> {
    match resolve_type(p, ns, q)? {
        ResolvedType::Named(TypeRef::Entity(e)) => Ok(e),
        _ => Err(Diagnostic::error(
            "unknown-type",
            format!(
                "could not find type {} in namespace {}",
                q.full(),
                p.ns(ns).name
            ),
        )
        .at(q.span)),
    }
}

//! Final checks after the scheduling loop (LANGUAGE.md §12.6): pending index lookups, instances
//! without implementation, unset attributes and relation lower bounds. All are collected and
//! reported together; "not all statements executed" only when nothing else explains it.

use super::Runtime;
use super::state::*;
use crate::compiler::diagnostics::Diagnostic;
use crate::compiler::types::AttrKind;
use crate::compiler::value::InstId;

impl Runtime<'_> {
    pub fn final_checks(&mut self) -> Vec<Diagnostic> {
        let p = self.p;
        let mut errors = Vec::new();
        let mut pending: Vec<_> = self
            .pending_lookups
            .iter()
            .filter(|(_, (rv, _))| self.rvs[rv.0 as usize].waiters != 0)
            .map(|((e, pos, key), (_, span))| (*e, *pos, key.clone(), *span))
            .collect();
        pending.sort_by_key(|(_, _, _, span)| (span.file.0, span.start));
        for (e, pos, key, span) in pending {
            let ent = p.entity(e);
            let idx = ent.indexes[pos].0;
            let attrs = &p.indexes[idx.0 as usize].attrs;
            let text = attrs
                .iter()
                .zip(key.iter())
                .map(|(a, k)| format!("{a}={}", key_value_text(self, k)))
                .collect::<Vec<_>>()
                .join(", ");
            errors.push(
                Diagnostic::error(
                    "index-miss",
                    format!(
                        "No match in index on type {} with key {}",
                        ent.full_name, text
                    ),
                )
                .at(span),
            );
        }
        for i in 0..self.instances.len() {
            let inst = InstId(i as u32);
            let (entity, base, site, impls) = {
                let x = &self.instances[i];
                (x.entity, x.rv_base, x.site, x.impl_count)
            };
            let ent = p.entity(entity);
            let span = p.ir.expr(site).span;
            if impls == 0 {
                errors.push(
                    Diagnostic::error(
                        "no-implementation",
                        format!("Unable to select implementation for entity {}", ent.name),
                    )
                    .at(span),
                );
            }
            for (slot, &aid) in ent.slots.iter().enumerate() {
                let rv = RvId(base + slot as u32);
                let r = &self.rvs[rv.0 as usize];
                let attr = p.attr(aid);
                match r.kind {
                    RvKind::Single => {
                        if matches!(r.state, RvState::Unset) {
                            errors.push(
                                Diagnostic::error(
                                    "not-set",
                                    format!(
                                        "The object {} is not complete: attribute {} ({}) is not set",
                                        self.inst_site_text(inst),
                                        attr.name,
                                        self.sources.position(attr.span)
                                    ),
                                )
                                .at(span)
                                .with_label(attr.span, "attribute declared here"),
                            );
                        }
                    }
                    RvKind::Optional => {
                        if !self.is_frozen(rv) {
                            if self.dl(rv).providers == 0 {
                                self.freeze(rv);
                            } else {
                                errors.push(not_set(self, inst, attr, span));
                            }
                        }
                    }
                    RvKind::List => {
                        let d = self.dl(rv);
                        let (low, n, frozen, providers) =
                            (d.low, d.items.len() as u32, d.frozen, d.providers);
                        if !frozen && n >= low && providers == 0 {
                            self.freeze(rv);
                        } else if n < low || !frozen {
                            let _ = matches!(attr.kind, AttrKind::Relation { .. });
                            errors.push(
                                Diagnostic::error(
                                    "not-set",
                                    format!(
                                        "The object {} is not complete: attribute {} ({}) requires {} values but only {} are set",
                                        self.inst_site_text(inst),
                                        attr.name,
                                        self.sources.position(attr.span),
                                        low,
                                        n
                                    ),
                                )
                                .at(span)
                                .with_label(attr.span, "relation declared here"),
                            );
                        }
                    }
                    RvKind::Var => {}
                }
            }
        }
        if errors.is_empty()
            && let Some(d) = self.unexecuted()
        {
            errors.push(d);
        }
        errors
    }
}

fn not_set(
    rt: &Runtime,
    inst: InstId,
    attr: &crate::compiler::types::Attribute,
    span: crate::compiler::source::Span,
) -> Diagnostic {
    Diagnostic::error(
        "not-set",
        format!(
            "The object {} is not complete: attribute {} ({}) is not set",
            rt.inst_site_text(inst),
            attr.name,
            rt.sources.position(attr.span)
        ),
    )
    .at(span)
}

fn key_value_text(rt: &Runtime, k: &super::KeyPart) -> String {
    use super::KeyPart::*;
    use crate::compiler::value::pyfmt;
    match k {
        Null => "null".into(),
        Bool(b) => if *b { "True" } else { "False" }.into(),
        Int(i) => i.to_string(),
        Big(b) => b.clone(),
        Float(f) => pyfmt::float_repr(f64::from_bits(*f)),
        Str(s) => pyfmt::str_repr(s),
        Inst(i) => pyfmt::InstanceText::inst_repr(rt, *i),
        Other(o) => o.clone(),
    }
}

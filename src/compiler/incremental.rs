//! The incremental compile: a change to a literal, patched into the previous export.
//!
//! Most edits to a model change a value, not its shape: a file's content, a port, a
//! version. A full compile of 100,000 resources takes about a second for such an edit; the
//! export it makes differs from the previous one in one field. This module finds, in a full
//! compile, the literals whose value goes into exactly one field of each resource it reaches
//! and nowhere else ([`collect`]: [`PatchSites`]), and [`cache`] keeps them with that
//! compile's export. The next compile whose input differs only inside one such literal
//! changes those fields and is done.
//!
//! A literal is a *site* when, for every instance its constructor made:
//! - it is a keyword argument of that constructor, a plain string (no `{{ }}`), integer or
//!   float token, set into a plain attribute (`string`, `int`, `float` or `number`; not a
//!   typedef, list or relation; not part of an index);
//! - nothing else assigned the attribute (not even the same value again) and the instance
//!   came from this constructor only (no second constructor found it through an index);
//! - nothing read the value: no model code (attribute access, `is defined`, a plugin or a
//!   template reading the instance), and in the export nothing but the resource's own field
//!   of that attribute (not its id, agent, `requires`, a mitogen context, another resource's
//!   field). The evaluator marks each read ([`super::eval::state::READ`]): a read that is
//!   not seen is the one way this goes wrong, so every accessor of a value marks, and the
//!   export's own-field read is the one exception.
//!
//! A compile that read the world (Python plugins, facts, data files) makes no sites: the
//! next compile may see another world. The differential test (`tests/it/incremental.rs`)
//! compiles random edits both ways and compares the exports.

pub mod cache;

use super::eval::Runtime;
use super::eval::state::{READ, SET_AGAIN};
use super::export::ExportedField;
use super::ids::ExprId;
use super::ir::ExprKind;
use super::lexer::{IntLit, Tok};
use super::source::{FileId, SourceMap};
use super::types::{AttrKind, BaseType, Prim};
use super::value::Value;
use crate::model::ExportFile;

/// What a full compile leaves for the next one to patch ([`super::CompileOutcome::memory`]).
pub struct Remembered {
    pub sites: PatchSites,
    pub inputs: cache::Inputs,
    pub main_path: std::path::PathBuf,
    /// The main file as the compile read it.
    pub main_text: String,
}

/// What [`compile_or_patch`] made.
pub enum Compiled {
    /// A compile (in full), as [`super::compile`] makes it.
    Full(super::CompileOutcome),
    /// The last compile's export, patched (or as it was: nothing changed).
    Patched(cache::Patched),
}

/// Compile as [`super::compile`] does, through the memory at `memory` (see
/// [`cache::path`]): when the last compile there was made with the same options and the
/// project differs from it only inside sites, its export is patched; otherwise the
/// compile runs in full and is remembered (when it read nothing a memory can not check).
/// The memory is handed back to be written by the caller ([`Pending::write`]), which can do
/// it while the export is on its way; [`Pending::generation`] names it.
pub fn compile_or_patch(
    opts: &super::CompileOptions,
    memory: &std::path::Path,
    print: &mut (dyn FnMut(&str) + Send),
) -> (Compiled, Pending) {
    let started = std::time::Instant::now();
    let main_file = opts.main_file.as_deref().unwrap_or("main.cf");
    let project_dir = opts
        .project_dir
        .canonicalize()
        .unwrap_or_else(|_| opts.project_dir.clone());
    let key = cache::Key::new(&project_dir, main_file, &opts.env, opts.python.as_deref());
    match cache::patch(memory, &key, &project_dir.join(main_file)) {
        Ok(mut patched) => {
            for line in &patched.prints {
                print(line);
            }
            tracing::debug!(
                changed = patched.changed.len(),
                ms = started.elapsed().as_secs_f64() * 1e3,
                "compile patched from the last one's memory"
            );
            let next = patched.take_next();
            let pending = Pending(next.map(|n| PendingWrite::Patched(memory.to_path_buf(), n)));
            return (Compiled::Patched(patched), pending);
        }
        Err(why) => tracing::debug!(%why, "compiled in full"),
    }
    let opts = super::CompileOptions {
        remember: opts.export,
        ..opts.clone()
    };
    let mut outcome = super::compile(&opts, print);
    let pending = match (outcome.memory.take(), &outcome.result) {
        (Some(remembered), Ok(Some(_))) => Pending(Some(PendingWrite::Full(
            memory.to_path_buf(),
            key,
            remembered,
            cache::new_generation(),
        ))),
        // nothing to remember: a memory left would describe another state of the project
        _ => {
            let _ = std::fs::remove_file(memory);
            Pending(None)
        }
    };
    (Compiled::Full(outcome), pending)
}

/// [`compile_or_patch`], with a patched export parsed into the outcome a compile gives
/// ([`super::CompileOutcome::patched`] says how many resources the patch changed).
pub fn compile(
    opts: &super::CompileOptions,
    memory: &std::path::Path,
    print: &mut (dyn FnMut(&str) + Send),
) -> (super::CompileOutcome, Pending) {
    match compile_or_patch(opts, memory, print) {
        (Compiled::Full(outcome), pending) => (outcome, pending),
        (Compiled::Patched(patched), pending) => match patched.export() {
            Ok(export) => (
                super::CompileOutcome {
                    sources: Default::default(),
                    warnings: Vec::new(),
                    stats: super::CompileStats {
                        resources: export.resources.len(),
                        ..Default::default()
                    },
                    result: Ok(Some(export)),
                    memory: None,
                    patched: Some(patched.changed.len()),
                },
                pending,
            ),
            // the memory's export does not read: forget it, and compile in full
            Err(why) => {
                tracing::warn!(%why, "the compile's memory is broken: compiling in full");
                let _ = std::fs::remove_file(memory);
                compile(opts, memory, print)
            }
        },
    }
}

/// A memory to write after a compile ([`compile`]).
#[must_use = "the memory is written by `write` or `detach`"]
pub struct Pending(Option<PendingWrite>);

enum PendingWrite {
    Patched(std::path::PathBuf, cache::NextMemory),
    Full(std::path::PathBuf, cache::Key, Remembered, u64),
}

impl Pending {
    /// The generation of the memory to be written (`None`: nothing is remembered).
    pub fn generation(&self) -> Option<u64> {
        match &self.0 {
            None => None,
            Some(PendingWrite::Patched(_, next)) => Some(next.generation()),
            Some(PendingWrite::Full(.., generation)) => Some(*generation),
        }
    }

    /// Write the memory of the compile that gave `export` (a failure is logged: the next
    /// compile then runs in full).
    pub fn write(self, export: &ExportFile) {
        self.detach(Some(export)).write()
    }

    /// The memory, independent of `export` (a full compile's export is laid out in lines
    /// here), to be written on another thread. A patch's memory has its export already
    /// (`None` will do); a full compile's without one is not remembered.
    pub fn detach(self, export: Option<&ExportFile>) -> Detached {
        match self.0 {
            None => Detached(None),
            Some(PendingWrite::Patched(path, next)) => Detached(Some((path, next))),
            Some(PendingWrite::Full(path, key, remembered, generation)) => {
                // the file as it is now must be what was compiled (it may have changed
                // meanwhile): else nothing is remembered
                let same = std::fs::read(&remembered.main_path)
                    .is_ok_and(|now| now == remembered.main_text.as_bytes());
                let mut lines = Vec::new();
                let laid_out = export.is_some_and(|export| {
                    crate::model::export_lines::write(export, &mut lines).is_ok()
                });
                if !same || !laid_out {
                    let _ = std::fs::remove_file(&path);
                    return Detached(None);
                }
                let next = cache::NextMemory::new(
                    generation,
                    key,
                    remembered.inputs,
                    remembered.main_text.into_bytes(),
                    remembered.sites,
                    lines,
                );
                Detached(Some((path, next)))
            }
        }
    }
}

/// A memory ready to be written ([`Pending::detach`]).
pub struct Detached(Option<(std::path::PathBuf, cache::NextMemory)>);

impl Detached {
    /// Write it (a failure is logged: the next compile then runs in full).
    pub fn write(self) {
        let Some((path, next)) = self.0 else {
            return;
        };
        if let Err(e) = next.save(&path) {
            tracing::warn!(
                "the compile's memory {} was not written ({e}); the next compile runs in full",
                path.display()
            );
        }
    }
}

/// The attribute type a site's value must have.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum SiteType {
    String = 1,
    Int = 2,
    Float = 3,
    Number = 4,
}

impl SiteType {
    fn of(prim: Prim) -> Option<SiteType> {
        Some(match prim {
            Prim::String => SiteType::String,
            Prim::Int => SiteType::Int,
            Prim::Float => SiteType::Float,
            Prim::Number => SiteType::Number,
            _ => return None,
        })
    }

    pub fn from_u8(b: u8) -> Option<SiteType> {
        Some(match b {
            1 => SiteType::String,
            2 => SiteType::Int,
            3 => SiteType::Float,
            4 => SiteType::Number,
            _ => return None,
        })
    }

    /// Would the attribute take `v` (as the evaluator's type check does for these types)?
    pub fn accepts(self, v: &Value) -> bool {
        match self {
            SiteType::String => matches!(v, Value::Str(_)),
            SiteType::Int => matches!(v, Value::Int(_)),
            SiteType::Float => matches!(v, Value::Float(_)),
            SiteType::Number => matches!(v, Value::Int(_) | Value::Float(_)),
        }
    }
}

/// One field a site's value goes into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Target {
    /// The resource's place in the export (its resources are sorted by id).
    pub resource: u32,
    /// The field's name: its place in [`PatchSites::fields`].
    pub field: u32,
}

/// A literal of the main file and the fields its value goes into as it is.
#[derive(Clone, Debug, PartialEq)]
pub struct Site {
    /// The literal's bytes in the main file: `start..end`.
    pub start: u32,
    pub end: u32,
    pub ty: SiteType,
    pub targets: Vec<Target>,
}

/// The sites of a compile's main file, in the order of the file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PatchSites {
    pub sites: Vec<Site>,
    /// The names of the fields targets go into.
    pub fields: Vec<String>,
}

/// The value a literal token has in the model, as the parser and lowering make it: a string
/// without interpolation, an integer that fits 64 bits, a float; `None` for anything else.
pub fn token_value(tok: &Tok) -> Option<Value> {
    match tok {
        Tok::Str(s) | Tok::Mls(s) if !super::strings::has_interpolation(s) => {
            Some(Value::string(s.clone()))
        }
        Tok::RStr(s) => Some(Value::string(s.clone())),
        Tok::Int(IntLit::Small(i)) => Some(Value::Int(*i)),
        Tok::Float(f) => Some(Value::Float(*f)),
        _ => None,
    }
}

/// A site's value in a resource, as the export writes it.
pub fn field_json(v: &Value) -> serde_json::Value {
    match v {
        Value::Int(i) => serde_json::Value::from(*i),
        Value::Float(f) => serde_json::Number::from_f64(*f)
            .map(serde_json::Value::Number)
            .unwrap_or(serde_json::Value::Null),
        Value::Str(s) => serde_json::Value::String(s.to_string()),
        _ => serde_json::Value::Null,
    }
}

/// The sites of an evaluated and exported model: see the module's documentation. `fields`
/// are the resources' own fields the export read (with their places in the export's sorted
/// resources); `main` is the main file.
pub fn collect(
    rt: &Runtime,
    fields: &[ExportedField],
    sources: &SourceMap,
    main: FileId,
) -> PatchSites {
    let p = rt.p;
    // the literal an attribute of an instance has from its constructor, if any
    let literal_of = |inst: u32, slot: u16| -> Option<ExprId> {
        let instance = &rt.instances[inst as usize];
        if !instance.extra_sites.is_empty() {
            return None;
        }
        let ExprKind::Construct(c) = &p.ir.expr(instance.site).kind else {
            return None;
        };
        let arg = c.args.iter().find(|a| a.slot == slot && !a.direct)?;
        let rv = &rt.rvs[(instance.rv_base + slot as u32) as usize];
        if rv.set_by != instance.site.0 {
            return None;
        }
        match &p.ir.expr(arg.value).kind {
            ExprKind::Const(Value::Str(_) | Value::Int(_) | Value::Float(_)) => Some(arg.value),
            _ => None,
        }
    };
    let unpatchable = |inst: u32, slot: u16| -> bool {
        let instance = &rt.instances[inst as usize];
        let rv = &rt.rvs[(instance.rv_base + slot as u32) as usize];
        if rv.is_marked(READ | SET_AGAIN) {
            return true;
        }
        !matches!(
            &p.slot_attr(instance.entity, slot).kind,
            AttrKind::Value { ty, .. }
                if !ty.list && matches!(ty.base, BaseType::Prim(prim) if SiteType::of(prim).is_some())
        )
    };
    // every literal given to a constructor whose value something read (or that is not a
    // plain value) is out, for every instance that constructor made
    let mut out: foldhash::HashSet<ExprId> = Default::default();
    for (i, instance) in rt.instances.iter().enumerate() {
        let ExprKind::Construct(c) = &p.ir.expr(instance.site).kind else {
            continue;
        };
        for arg in &c.args {
            if matches!(p.ir.expr(arg.value).kind, ExprKind::Const(_))
                && (arg.direct
                    || !instance.extra_sites.is_empty()
                    || unpatchable(i as u32, arg.slot))
            {
                out.insert(arg.value);
            }
        }
        for extra in &instance.extra_sites {
            if let ExprKind::Construct(c) = &p.ir.expr(*extra).kind {
                out.extend(c.args.iter().map(|a| a.value));
            }
        }
    }
    // each field a literal goes into, with the type of its attribute (grouped by literal
    // below: a literal in a loop or an implementation goes into each instance's field)
    let mut names: Vec<String> = Vec::new();
    let mut found: Vec<(ExprId, Option<SiteType>, Target)> = Vec::with_capacity(fields.len());
    for f in fields {
        let Some(lit) = literal_of(f.inst.0, f.slot) else {
            continue;
        };
        if out.contains(&lit) {
            continue;
        }
        let entity = rt.instances[f.inst.0 as usize].entity;
        let ty = match &p.slot_attr(entity, f.slot).kind {
            AttrKind::Value { ty, .. } => match ty.base {
                BaseType::Prim(prim) => SiteType::of(prim),
                _ => None,
            },
            _ => None,
        };
        let field = match names.iter().position(|n| n == f.field) {
            Some(at) => at,
            None => {
                names.push(f.field.to_string());
                names.len() - 1
            }
        };
        found.push((
            lit,
            ty,
            Target {
                resource: f.resource,
                field: field as u32,
            },
        ));
    }
    found.sort_unstable_by_key(|(lit, _, t)| (lit.0, *t));
    let text = &sources.file(main).text;
    let mut sites: Vec<Site> = Vec::new();
    for group in found.chunk_by(|a, b| a.0 == b.0) {
        let lit = group[0].0;
        // attributes of different types: the value would have to satisfy each, so no patch
        let Some(ty) = group[0].1 else { continue };
        if group.iter().any(|g| g.1 != Some(ty)) {
            continue;
        }
        let span = p.ir.expr(lit).span;
        // a constant is made from one literal token only (no folding), so its span is that
        // token's; its type was checked when it was set
        if span.file != main || text.get(span.start as usize..span.end as usize).is_none() {
            continue;
        }
        sites.push(Site {
            start: span.start,
            end: span.end,
            ty,
            targets: group.iter().map(|g| g.2).collect(),
        });
    }
    sites.sort_unstable_by_key(|s| s.start);
    // two sites over the same bytes can not be told apart: neither is one
    let overlapping: Vec<bool> = (0..sites.len())
        .map(|i| {
            (i > 0 && sites[i - 1].end > sites[i].start)
                || (i + 1 < sites.len() && sites[i].end > sites[i + 1].start)
        })
        .collect();
    let mut at = 0;
    sites.retain(|_| {
        at += 1;
        !overlapping[at - 1]
    });
    PatchSites {
        sites,
        fields: names,
    }
}

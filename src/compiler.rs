//! The Inmanta-language compiler: from a project directory to resources.
//!
//! Pipeline (LANGUAGE.md §1): load and parse `main.cf` and every imported module file
//! ([`project`]), define the type system ([`define`]), lower code to IR ([`lower`]), evaluate
//! with the dataflow scheduler ([`eval`]), then export resources ([`export`]). The compiler does
//! no I/O except reading module files and printing `std::print` output through a callback, and,
//! when asked to compile incrementally ([`incremental`]), reading and writing its memory of
//! the last compile; it knows nothing of the server. Diagnostics are data ([`diagnostics`]); the
//! CLI renders them.
//!
//! Layers, each using only those before it: [`source`], [`diagnostics`]; [`value`] (values and
//! their Python text); the front end ([`lexer`], [`ast`], [`strings`], [`parser`]); [`ids`],
//! [`types`] (the type system), [`ir`] (the code) and [`program`] (both); [`plugins`], which
//! owns its interfaces to the evaluator ([`plugins::Caller`]) and to the world
//! ([`plugins::Host`]), and runs Inmanta modules' Python plugins in a plugin host
//! ([`plugins::python`], [`plugins::pyhost`]); [`names`], [`lower`] and [`define`], which builds the program and drives
//! lowering; [`project`] (loading); [`eval`]; [`handler_code`], [`export`]; [`incremental`]
//! (what of an export a next compile may patch, and its memory).
//! `scripts/module-edges` prints the edges and reports any cycle between these modules.

pub mod ast;
pub mod define;
pub mod diagnostics;
pub mod eval;
pub mod export;
pub mod handler_code;
pub mod ids;
pub mod incremental;
pub mod ir;
pub mod lexer;
pub mod lower;
pub mod names;
pub mod parser;
pub mod plugins;
pub mod program;
pub mod project;
pub mod source;
pub mod strings;
pub mod types;
pub mod value;

use std::collections::BTreeMap;
use std::path::PathBuf;

use diagnostics::Diagnostic;
use source::SourceMap;

use crate::model::ExportFile;

#[derive(Clone, Debug, Default)]
pub struct CompileOptions {
    pub project_dir: PathBuf,
    /// Entry file (default `main.cf`).
    pub main_file: Option<String>,
    /// Produce the export (resources) after a successful compile.
    pub export: bool,
    /// Variables `std::get_env` sees before the process environment. Every compile also
    /// sees `STEWARD_PROJECT_DIR`, the absolute project directory (unless given here), so a
    /// model can place things relative to its project.
    pub env: BTreeMap<String, String>,
    /// The Python interpreter of the project's environment (V2 modules, Python plugins). When
    /// `None`: `$VIRTUAL_ENV/bin/python3`, `<project>/.steward/venv/bin/python3` if it exists,
    /// else `python3` on `PATH`. No Python runs for a project that needs none.
    pub python: Option<PathBuf>,
    /// The environment's parameters and facts, for `std::getfact` (loaded by the caller, in
    /// one call to the server). `None`: the compile knows no server; the first `getfact` says
    /// so in a warning, and every fact is unknown (or the call's default).
    pub facts: Option<crate::model::Facts>,
    /// The process ends right after this compile (`steward compile`, `steward export`): the
    /// evaluated model and the program are left for the exit to give back at once instead of
    /// being freed object by object (about 4 % of a compile's instructions, and at gen_model
    /// N=20,000 some hundred megabytes unmapped page by page). Never set where the process
    /// goes on (the server, `steward deploy`).
    pub process_ends_after: bool,
    /// Find what an incremental compile needs to patch the next one
    /// ([`CompileOutcome::memory`], [`incremental`]).
    pub remember: bool,
}

#[derive(Clone, Debug, Default)]
pub struct CompileStats {
    pub files: usize,
    pub instances: usize,
    pub resources: usize,
    /// Where the compile's time went, each phase from its end to the next one's.
    pub phases: CompilePhases,
}

/// The wall time of each phase of a compile: loading and parsing every file, defining the
/// program (types and lowering), evaluating it, and exporting the resources.
#[derive(Clone, Copy, Debug, Default)]
pub struct CompilePhases {
    pub load: std::time::Duration,
    pub define: std::time::Duration,
    pub evaluate: std::time::Duration,
    pub export: std::time::Duration,
}

pub struct CompileOutcome {
    pub sources: SourceMap,
    pub warnings: Vec<Diagnostic>,
    /// `Ok(Some(export))` when exporting, `Ok(None)` for a plain compile.
    pub result: Result<Option<ExportFile>, Vec<Diagnostic>>,
    pub stats: CompileStats,
    /// With [`CompileOptions::remember`], after an export that read nothing a memory can
    /// not check: what the next compile may patch.
    pub memory: Option<incremental::Remembered>,
    /// The export was patched from the last compile's memory ([`incremental::compile`]):
    /// how many resources changed.
    pub patched: Option<usize>,
}

impl CompileOutcome {
    pub fn is_ok(&self) -> bool {
        self.result.is_ok()
    }

    pub fn errors(&self) -> &[Diagnostic] {
        match &self.result {
            Ok(_) => &[],
            Err(e) => e,
        }
    }
}

struct CompileHost<'a> {
    env: &'a BTreeMap<String, String>,
    project: &'a project::Project,
    modules: &'a BTreeMap<String, project::ModuleInfo>,
    print: &'a mut (dyn FnMut(&str) + Send),
    /// File markers handed out by `fs::file` / `std::file`, with the file's content.
    files: std::collections::HashMap<String, String>,
    /// The Python plugin host, started on first use.
    python: plugins::pyhost::PySession,
    facts: Option<&'a crate::model::Facts>,
    /// The warnings of the evaluation (facts asked for without a server).
    warnings: Vec<Diagnostic>,
    /// The facts asked for and not found: (resource id, name).
    unknowns: std::collections::BTreeSet<(String, String)>,
    /// Entity types with an `@resource` class in a module's Python.
    python_resources: std::collections::HashSet<String>,
    /// Resource ids of instances computed so far.
    resource_ids: std::collections::HashMap<value::InstId, String>,
    /// What the model read of the world, for the incremental compile
    /// ([`incremental::cache::Inputs`]).
    world: WorldReads,
}

/// What a compile read besides its files: the incremental compile's memory holds it, and a
/// compile that read what a later one could see changed (facts, Python, data files) is not
/// remembered.
#[derive(Default)]
struct WorldReads {
    /// It read something no memory can check.
    unchecked: std::cell::Cell<bool>,
    env: std::cell::RefCell<Vec<(String, Option<String>)>>,
    /// The files of modules (and of the project) read, as templates and file contents.
    files: std::cell::RefCell<Vec<PathBuf>>,
    prints: Vec<String>,
}

impl plugins::Host for CompileHost<'_> {
    fn print(&mut self, text: &str) {
        self.world.prints.push(text.to_string());
        (self.print)(text)
    }

    fn fact(&mut self, resource_id: &str, name: &str, span: source::Span) -> Option<String> {
        self.world.unchecked.set(true);
        match self.facts {
            Some(facts) => facts.get(resource_id, name).map(str::to_string),
            None => {
                if self.warnings.iter().all(|w| w.code != FACTS_WITHOUT_SERVER) {
                    self.warnings.push(
                        Diagnostic::warning(
                            FACTS_WITHOUT_SERVER,
                            "facts are not known without a server: std::getfact gives \
                             unknown (or its default) for every fact in this compile",
                        )
                        .at(span)
                        .with_note(
                            "steward export and steward deploy ask their server; \
                             steward compile --facts FILE reads them from a file",
                        ),
                    );
                }
                None
            }
        }
    }

    fn record_unknown(&mut self, resource_id: &str, name: &str) {
        self.unknowns
            .insert((resource_id.to_string(), name.to_string()));
    }

    fn unknowns(&self) -> Vec<crate::model::UnknownRecord> {
        self.unknowns
            .iter()
            .map(|(resource_id, name)| crate::model::UnknownRecord {
                resource_id: resource_id.clone(),
                name: name.clone(),
                source: "fact".into(),
            })
            .collect()
    }

    fn resource_type(&self, names: &[&str]) -> Option<plugins::ResourceType> {
        // as the export decides: a Python class anywhere up the hierarchy, else the nearest
        // module.yml declaration
        if names.iter().any(|n| self.python_resources.contains(*n)) {
            return Some(plugins::ResourceType::Python);
        }
        names.iter().find_map(|n| {
            self.modules.values().find_map(|m| {
                m.yml
                    .resources
                    .get(*n)
                    .map(|def| plugins::ResourceType::Declared {
                        type_name: n.to_string(),
                        agent: def.agent.clone(),
                        id: def.id.clone(),
                    })
            })
        })
    }

    fn known_resource_id(&self, inst: value::InstId) -> Option<String> {
        self.resource_ids.get(&inst).cloned()
    }

    fn remember_resource_id(&mut self, inst: value::InstId, id: String) {
        self.resource_ids.insert(inst, id);
    }

    fn module_file(&self, module: &str, dir: &str, path: &str) -> Result<(String, String), String> {
        let read = project::module_file(self.project, self.modules, module, dir, path);
        // the file read (its path as shown, from the working directory when relative),
        // for the memory to check; a failed read is not checked
        match read.as_ref().map(|(_, shown)| std::path::absolute(shown)) {
            Ok(Ok(path)) => self.world.files.borrow_mut().push(path),
            _ => self.world.unchecked.set(true),
        }
        read
    }

    fn env_var(&self, name: &str) -> Option<String> {
        if let Some(v) = self.env.get(name) {
            return Some(v.clone());
        }
        let value = std::env::var(name).ok();
        self.world
            .env
            .borrow_mut()
            .push((name.to_string(), value.clone()));
        value
    }

    fn take_python(&mut self) -> Result<plugins::pyhost::PyHost, String> {
        self.world.unchecked.set(true);
        self.python.take()
    }

    fn put_python(&mut self, host: plugins::pyhost::PyHost) {
        self.python.put(host)
    }

    fn remember_file(&mut self, marker: &str, content: &str) {
        self.files.insert(marker.to_string(), content.to_string());
    }

    fn remembered_file(&self, marker: &str) -> Option<String> {
        self.files.get(marker).cloned()
    }

    fn list_module_files(
        &self,
        module: &str,
        dir: &str,
        path: &str,
    ) -> Result<Vec<String>, String> {
        self.world.unchecked.set(true);
        project::list_module_files(self.project, self.modules, module, dir, path)
    }

    fn read_data_file(&self, namespace: &str, name: &str) -> Result<Option<String>, String> {
        self.world.unchecked.set(true);
        let path = self.project.dir.join("data").join(namespace).join(name);
        if !path.exists() {
            return Ok(None);
        }
        project::read_confined(&self.project.root, &path)
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display()))
    }

    fn write_data_file(&mut self, namespace: &str, name: &str, text: &str) -> Result<(), String> {
        self.world.unchecked.set(true);
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let target = self.project.dir.join("data").join(namespace).join(name);
        let fail = |e: std::io::Error| format!("{}: {e}", target.display());
        // each directory checked inside the project before anything is made in it
        let mut dir = self.project.root.clone();
        for part in ["data", namespace] {
            let next = dir.join(part);
            if next.symlink_metadata().is_err() {
                std::fs::create_dir(&next).map_err(fail)?;
            }
            dir = project::confined(&self.project.root, &next).map_err(fail)?;
        }
        // replaced whole, readable by its owner only (it holds passwords)
        let tmp = dir.join(format!(".{name}.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(fail)?;
        f.write_all(text.as_bytes()).map_err(fail)?;
        drop(f);
        std::fs::rename(&tmp, dir.join(name)).map_err(fail)
    }
}

/// The model has a call to a Python plugin somewhere (it will most likely run).
fn calls_python(program: &program::Program) -> bool {
    let builtin = plugins::all().len() as u32;
    !program.python_plugins.is_empty()
        && program
            .ir
            .exprs
            .iter()
            .any(|e| matches!(&e.kind, ir::ExprKind::Call(c) if c.plugin.0 >= builtin))
}

/// The Python of a compile's modules, read (not run): plugins, resource types, handlers.
struct CompilePython {
    plugins: Vec<plugins::python::PyPlugin>,
    /// Module name -> what its Python defines.
    modules: BTreeMap<String, plugins::python::ModulePython>,
    session: plugins::pyhost::PySession,
}

fn python_of(
    project: &project::Project,
    modules: &BTreeMap<String, project::ModuleInfo>,
    env: &BTreeMap<String, String>,
) -> CompilePython {
    let mut config = plugins::pyhost::PyConfig {
        interpreter: project.python.interpreter.clone(),
        project_dir: project.dir.clone(),
        environment: env
            .get("STEWARD_ENVIRONMENT")
            .cloned()
            .or_else(|| std::env::var("STEWARD_ENVIRONMENT").ok()),
        ..Default::default()
    };
    let mut scanned = BTreeMap::new();
    let mut all = Vec::new();
    let mut imports = plugins::pyhost::Imports::default();
    for (name, m) in modules {
        let Some(dir) = &m.python else { continue };
        let found = plugins::python::scan_module(name, dir);
        all.extend(found.plugins.iter().cloned());
        config.modules.insert(
            name.clone(),
            dir.canonicalize().unwrap_or_else(|_| dir.clone()),
        );
        if m.v2 {
            config.v2.insert(name.clone());
        }
        if plugins::pyhost::deferrable(name) {
            imports
                .deferred
                .insert(name.clone(), found.python_modules.clone());
        } else {
            imports.eager.extend(found.python_modules.iter().cloned());
        }
        scanned.insert(name.clone(), found);
    }
    CompilePython {
        plugins: all,
        modules: scanned,
        session: plugins::pyhost::PySession::new(config, imports),
    }
}

/// The code of the warning that facts are not known (given once per compile).
pub const FACTS_WITHOUT_SERVER: &str = "facts";

/// Stack of the compiler thread: deep (but bounded) models recurse deeply in the passes.
const COMPILER_STACK: usize = 256 << 20;

/// Compile the project in `opts.project_dir`. `print` receives each `std::print` line as it
/// is produced (prints happen even if the compile fails later, as in the reference).
pub fn compile(opts: &CompileOptions, print: &mut (dyn FnMut(&str) + Send)) -> CompileOutcome {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("compiler".into())
            .stack_size(COMPILER_STACK)
            .spawn_scoped(scope, || compile_here(opts, print))
            .expect("spawn compiler thread")
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

fn compile_here(opts: &CompileOptions, print: &mut (dyn FnMut(&str) + Send)) -> CompileOutcome {
    let mut sources = SourceMap::default();
    let mut stats = CompileStats::default();
    let mut phase_started = std::time::Instant::now();
    let mut phase_end = |phase: &mut std::time::Duration| {
        let now = std::time::Instant::now();
        *phase = now - phase_started;
        phase_started = now;
    };
    let project = match project::load_project_with(
        &opts.project_dir,
        opts.main_file.as_deref(),
        opts.python.as_deref(),
    ) {
        Ok(p) => p,
        Err(d) => {
            return CompileOutcome {
                sources,
                warnings: Vec::new(),
                result: Err(vec![d]),
                stats,
                memory: None,
                patched: None,
            };
        }
    };
    // Loading std pinned in requirements.txt (which every compile loads first) asks the
    // interpreter for its `sys.path`. The plugin host answers that: the interpreter starting
    // then is the one that runs the plugins later, if any run, instead of a second one
    // starting after the model is defined (when none runs it costs what the question cost).
    // If it can not, the question is asked as before, and reports its errors.
    let mut early_host = None;
    if project.pinned.contains("std")
        && let Ok(mut host) =
            plugins::pyhost::PyHost::boot(&project.python.interpreter, &project.dir)
        && let Ok(paths) = host.sys_path()
    {
        project.python.set_sys_path(paths);
        early_host = Some(host);
    }
    let loaded = match project::Loader::new(&project, &mut sources).load_all() {
        Ok(l) => l,
        Err(errors) => {
            return CompileOutcome {
                sources,
                warnings: Vec::new(),
                result: Err(errors),
                stats,
                memory: None,
                patched: None,
            };
        }
    };
    stats.files = loaded.files.len();
    phase_end(&mut stats.phases.load);
    let mut warnings = loaded.warnings;
    let modules = loaded.modules;
    let mut python = python_of(&project, &modules, &opts.env);
    if let Some(host) = early_host {
        python.session.adopt(host);
    }
    let program = match define::define_with(loaded.files, python.plugins.clone()) {
        Ok(p) => p,
        Err(errors) => {
            return CompileOutcome {
                sources,
                warnings,
                result: Err(errors),
                stats,
                memory: None,
                patched: None,
            };
        }
    };
    phase_end(&mut stats.phases.define);
    let mut memory = None;
    let result = {
        let mut env = opts.env.clone();
        if !env.contains_key("STEWARD_PROJECT_DIR") {
            let dir = opts
                .project_dir
                .canonicalize()
                .unwrap_or_else(|_| opts.project_dir.clone());
            env.insert("STEWARD_PROJECT_DIR".into(), dir.display().to_string());
        }
        let mut host = CompileHost {
            env: &env,
            project: &project,
            modules: &modules,
            print,
            files: Default::default(),
            python: python.session,
            facts: opts.facts.as_ref(),
            warnings: Vec::new(),
            unknowns: Default::default(),
            python_resources: python
                .modules
                .values()
                .flat_map(|m| m.resources.iter().cloned())
                .collect(),
            resource_ids: Default::default(),
            world: WorldReads::default(),
        };
        if calls_python(&program) {
            host.python.prestart();
        }
        let mut rt = eval::Runtime::new(&program, &sources, &mut host);
        let run = rt
            .check_defaults()
            .map_err(|d| vec![d])
            .and_then(|_| rt.run());
        stats.instances = rt.instances.len();
        phase_end(&mut stats.phases.evaluate);
        let result = match run {
            Err(e) => Err(e),
            Ok(()) if opts.export => {
                let mut fields = opts.remember.then(Vec::new);
                let r = export::export(
                    &mut rt,
                    &modules,
                    &project.name,
                    &python.modules,
                    fields.as_mut(),
                )
                .map(Some);
                if let Ok(Some(e)) = &r {
                    stats.resources = e.resources.len();
                    if let Some(fields) = &fields {
                        memory = remembered(&rt, &sources, fields, &project, &modules);
                    }
                }
                phase_end(&mut stats.phases.export);
                r
            }
            Ok(()) => Ok(None),
        };
        if opts.process_ends_after {
            std::mem::forget(rt);
        } else {
            drop(rt);
        }
        warnings.append(&mut host.warnings);
        // a compile that read what no memory can check, or that warned (a patched compile
        // would not), is not remembered
        if host.world.unchecked.get() || !host.files.is_empty() || !warnings.is_empty() {
            memory = None;
        }
        if let Some(m) = &mut memory {
            let m: &mut incremental::Remembered = m;
            m.inputs.env_reads = host.world.env.take();
            for file in host.world.files.take() {
                m.inputs.add(&file);
            }
            m.inputs.prints = std::mem::take(&mut host.world.prints);
        }
        result
    };
    if opts.process_ends_after {
        std::mem::forget(program);
    }
    tracing::debug!(
        files = stats.files,
        instances = stats.instances,
        resources = stats.resources,
        load_ms = stats.phases.load.as_millis() as u64,
        define_ms = stats.phases.define.as_millis() as u64,
        evaluate_ms = stats.phases.evaluate.as_millis() as u64,
        export_ms = stats.phases.export.as_millis() as u64,
        "compiled"
    );
    CompileOutcome {
        sources,
        warnings,
        result,
        stats,
        memory,
        patched: None,
    }
}

/// What the incremental compile remembers of a full compile ([`incremental::cache`]).
fn remembered(
    rt: &eval::Runtime,
    sources: &SourceMap,
    fields: &[export::ExportedField],
    project: &project::Project,
    modules: &BTreeMap<String, project::ModuleInfo>,
) -> Option<incremental::Remembered> {
    let (main, main_file) = sources.files().find(|(_, f)| f.name == project.main_file)?;
    let started = std::time::Instant::now();
    let sites = incremental::collect(rt, fields, sources, main);
    tracing::debug!(
        sites = sites.sites.len(),
        fields = fields.len(),
        ms = started.elapsed().as_secs_f64() * 1e3,
        "found the literals a next compile may patch"
    );
    // what the load read: the project's files, each module's files (its model, and its
    // Python and handlers, whose code is exported), and the directories modules are found
    // in (a module added there may be the one an import finds next time); the project's own
    // templates and files the model read are added by the host
    let mut inputs = incremental::cache::Inputs::default();
    for name in ["project.yml", "requirements.txt"] {
        inputs.add(&project.root.join(name));
    }
    for dir in &project.module_paths {
        inputs.add(&project.root.join(dir));
    }
    for m in modules.values() {
        if let project::ModuleRoot::Dir(dir) = &m.root {
            let dir = dir.canonicalize().unwrap_or_else(|_| dir.clone());
            if let Some(parent) = dir.parent() {
                inputs.add(parent);
            }
            inputs.add_tree(&dir);
        }
        if let Some(python) = &m.python {
            inputs.add_tree(python);
        }
        for (_, extra) in &m.extra_python {
            inputs.add_tree(extra);
        }
    }
    Some(incremental::Remembered {
        sites,
        inputs,
        main_path: project.root.join(&project.main_file),
        // the loader appends a line end to each file
        main_text: main_file
            .text
            .strip_suffix('\n')
            .unwrap_or(&main_file.text)
            .to_string(),
    })
}

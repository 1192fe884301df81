//! Projects and modules: `project.yml`, the module path, built-in modules, and loading every
//! file reachable from `main.cf` through imports (LANGUAGE.md §2).
//!
//! Modules are V1 directories on the module path (`<dir>/<name>/module.yml` +
//! `model/_init.cf` + `model/<sub>.cf`, Python in `plugins/`), V2 modules installed as Python
//! packages in the project's Python environment (`<site-packages>/inmanta_plugins/<name>/`
//! with `model/`, `templates/`, `files/`), or built into the binary (std, fs, exec, mitogen).
//! Order: the module path (not for std), then the built-ins, then the Python environment; a
//! project that pins the real package (`inmanta-module-<name>` in its `requirements.txt`)
//! gets it from the Python environment even when a built-in has that name. The interpreter
//! is asked for its `sys.path` only when a module is found nowhere else ([`PythonEnv`]).
//! `module.yml` may declare the module's resource types (see [`ResourceDef`]).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::define::LoadedFile;
use super::diagnostics::Diagnostic;
use super::lexer;
use super::parser;
use super::source::{SourceMap, Span};

mod builtin;
mod pyenv;
use builtin::BUILTIN;
pub use pyenv::{PythonEnv, module_of_requirement};
use pyenv::{dist_metadata, pinned_modules, requirement_lines};

#[derive(Debug, Deserialize)]
struct ProjectYml {
    name: Option<String>,
    #[serde(default)]
    modulepath: Option<serde_yaml_ng::Value>,
}

#[derive(Clone, Debug)]
pub struct Project {
    pub dir: PathBuf,
    /// `dir` with every symlink resolved: every file the model reads resolves inside it.
    pub root: PathBuf,
    pub name: String,
    pub module_paths: Vec<PathBuf>,
    pub main_file: String,
    /// The project's Python environment (V2 modules, Python plugins).
    pub python: PythonEnv,
    /// Module names the project pins as real packages (`inmanta-module-<name>` in
    /// `requirements.txt`, `-` turned into `_`).
    pub pinned: HashSet<String>,
}

/// The canonical form of `path` if it resolves (symlinks followed) inside `root` (canonical).
/// A model reads only files of its project: a path that leaves it (absolute, `..`, or a
/// symlink pointing out) is refused before anything is read.
pub fn confined(root: &Path, path: &Path) -> std::io::Result<PathBuf> {
    let real = path.canonicalize()?;
    if real.starts_with(root) {
        Ok(real)
    } else {
        Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "it resolves outside the project directory (a model may only read files of its project and modules)",
        ))
    }
}

/// `std::fs::read_to_string` of a file that must resolve inside `root`.
pub fn read_confined(root: &Path, path: &Path) -> std::io::Result<String> {
    std::fs::read_to_string(confined(root, path)?)
}

pub fn load_project(dir: &Path, main_file: Option<&str>) -> Result<Project, Diagnostic> {
    load_project_with(dir, main_file, None)
}

/// [`load_project`] with an explicit Python interpreter for the project's environment.
pub fn load_project_with(
    dir: &Path,
    main_file: Option<&str>,
    python: Option<&Path>,
) -> Result<Project, Diagnostic> {
    let yml = dir.join("project.yml");
    let root = dir.canonicalize().map_err(|e| {
        Diagnostic::error(
            "project",
            format!(
                "can not read {}: {e} (a project directory holds project.yml and main.cf)",
                yml.display()
            ),
        )
    })?;
    let text = read_confined(&root, &yml).map_err(|e| {
        Diagnostic::error(
            "project",
            format!(
                "can not read {}: {e} (a project directory holds project.yml and main.cf)",
                yml.display()
            ),
        )
    })?;
    let parsed: ProjectYml = serde_yaml_ng::from_str(&text)
        .map_err(|e| Diagnostic::error("project", format!("invalid project.yml: {e}")))?;
    let name = parsed.name.unwrap_or_else(|| {
        dir.file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_else(|| "project".into())
    });
    let mut entries = Vec::new();
    match parsed.modulepath {
        Some(serde_yaml_ng::Value::String(s)) => entries.push(s),
        Some(serde_yaml_ng::Value::Sequence(items)) => {
            entries.extend(items.iter().filter_map(|i| i.as_str().map(String::from)));
        }
        _ => {}
    }
    let mut module_paths = Vec::new();
    for s in entries {
        // module directories are part of the project: relative, no `..`, no symlink out
        let rel = Path::new(&s);
        let path = dir.join(rel);
        let escapes = rel.components().any(|c| {
            !matches!(
                c,
                std::path::Component::Normal(_) | std::path::Component::CurDir
            )
        }) || (path.exists() && confined(&root, &path).is_err());
        if escapes {
            return Err(Diagnostic::error(
                "project",
                format!(
                    "invalid project.yml: the module path {s:?} leaves the project directory (module paths are relative directories inside the project)"
                ),
            ));
        }
        module_paths.push(path);
    }
    Ok(Project {
        dir: dir.to_path_buf(),
        root,
        name,
        module_paths,
        main_file: main_file.unwrap_or("main.cf").to_string(),
        python: PythonEnv::choose(python, dir),
        pinned: pinned_modules(dir),
    })
}

/// A resource type declared by a module (`resources:` in module.yml).
#[derive(Clone, Debug, Deserialize)]
pub struct ResourceDef {
    /// Dotted attribute path giving the agent name, e.g. `host.name`.
    pub agent: String,
    /// The identifying attribute.
    pub id: String,
    /// Exported attributes.
    #[serde(default)]
    pub fields: Vec<String>,
    /// field -> attribute path (or `@builtin` mapping).
    #[serde(default)]
    pub map: BTreeMap<String, String>,
    /// Skip instances for which this boolean attribute is false.
    #[serde(default)]
    pub skip_unless: Option<String>,
    /// Handler executable (path inside the module) for modules shipping their own handler.
    #[serde(default)]
    pub handler: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct ModuleYml {
    pub name: Option<String>,
    #[serde(default)]
    pub version: Option<serde_yaml_ng::Value>,
    #[serde(default)]
    pub resources: BTreeMap<String, ResourceDef>,
    /// Python requirements of a V1 module's plugins (pip requirement strings).
    #[serde(default)]
    pub requirements: Vec<String>,
}

#[derive(Clone, Debug)]
pub enum ModuleRoot {
    Builtin,
    Dir(PathBuf),
}

#[derive(Clone, Debug)]
pub struct ModuleInfo {
    pub name: String,
    pub version: String,
    pub root: ModuleRoot,
    pub yml: ModuleYml,
    /// The Python package of the module (`inmanta_plugins.<name>`): a V1 module's `plugins/`,
    /// a V2 module's package directory; `None` without Python.
    pub python: Option<PathBuf>,
    /// The module's own Python requirements (V1 `module.yml` / `requirements.txt`, V2
    /// `Requires-Dist`), as written.
    pub requirements: Vec<String>,
    /// A V2 module (installed as a Python package).
    pub v2: bool,
    /// Python its distribution installs beside `inmanta_plugins/<name>` (path under
    /// site-packages, absolute path): shipped with the handler code.
    pub extra_python: Vec<(String, PathBuf)>,
}

impl ModuleInfo {
    /// The installed V2 package of module `name` beside this V2 module (in the same
    /// site-packages), for when `name` is built in here but this module's Python imports the
    /// real package's (the files module imports `inmanta_plugins.mitogen.abc`).
    pub fn installed_beside(&self, name: &str) -> Option<ModuleInfo> {
        let ModuleRoot::Dir(dir) = &self.root else {
            return None;
        };
        if !self.v2 {
            return None;
        }
        let sibling = dir.parent()?.join(name);
        if !sibling.join("__init__.py").is_file() {
            return None;
        }
        let dist = dist_metadata(&sibling, name);
        Some(ModuleInfo {
            name: name.to_string(),
            version: dist.version.clone(),
            root: ModuleRoot::Dir(sibling.clone()),
            yml: ModuleYml {
                name: Some(name.to_string()),
                version: Some(serde_yaml_ng::Value::String(dist.version)),
                ..Default::default()
            },
            python: Some(sibling),
            requirements: dist.requires,
            v2: true,
            extra_python: dist.extra_python,
        })
    }

    /// The text of a file of this module, with its display name and absolute path.
    pub fn read(&self, rel: &str) -> Option<(String, String, String)> {
        match &self.root {
            ModuleRoot::Builtin => BUILTIN
                .iter()
                .find(|(m, p, _)| *m == self.name && *p == rel)
                .map(|(m, p, c)| {
                    (
                        c.to_string(),
                        format!("<builtin>/{m}/{p}"),
                        format!("<builtin>/{m}/{p}"),
                    )
                }),
            ModuleRoot::Dir(d) => {
                let path = d.join(rel);
                // the module's own files only: nothing a symlink points to outside it
                let text = read_confined(&d.canonicalize().ok()?, &path).ok()?;
                Some((text, path.display().to_string(), path.display().to_string()))
            }
        }
    }
}

/// Everything loaded for one compile.
pub struct Loaded {
    pub files: Vec<LoadedFile>,
    pub modules: BTreeMap<String, ModuleInfo>,
    pub warnings: Vec<Diagnostic>,
}

pub struct Loader<'a> {
    pub project: &'a Project,
    pub sources: &'a mut SourceMap,
    modules: BTreeMap<String, ModuleInfo>,
}

fn version_text(v: &Option<serde_yaml_ng::Value>) -> String {
    match v {
        Some(serde_yaml_ng::Value::String(s)) => s.clone(),
        Some(serde_yaml_ng::Value::Number(n)) => n.to_string(),
        _ => "0.0.0".into(),
    }
}

impl<'a> Loader<'a> {
    pub fn new(project: &'a Project, sources: &'a mut SourceMap) -> Loader<'a> {
        Loader {
            project,
            sources,
            modules: BTreeMap::new(),
        }
    }

    /// Find a module by name: the module path first (not for std), then built-ins.
    pub fn find_module(&mut self, name: &str) -> Result<ModuleInfo, String> {
        if let Some(m) = self.modules.get(name) {
            return Ok(m.clone());
        }
        if name.contains('-') {
            return Err(format!(
                "{name} is not a valid module name: hyphens are not allowed"
            ));
        }
        let mut found = None;
        if name != "std" {
            for dir in &self.project.module_paths {
                let root = dir.join(name);
                if root.join("module.yml").is_file()
                    || root.join("model").join("_init.cf").is_file()
                {
                    if confined(&self.project.root, &root).is_err() {
                        return Err(format!(
                            "module {name} ({}) resolves outside the project directory",
                            relative_display(&self.project.dir, &root.display().to_string())
                        ));
                    }
                    let yml = read_confined(&self.project.root, &root.join("module.yml"))
                        .ok()
                        .map(|t| serde_yaml_ng::from_str::<ModuleYml>(&t))
                        .transpose()
                        .map_err(|e| format!("invalid module.yml of module {name}: {e}"))?
                        .unwrap_or_default();
                    let python = root
                        .join("plugins")
                        .join("__init__.py")
                        .is_file()
                        .then(|| root.join("plugins"));
                    let mut requirements = yml.requirements.clone();
                    if let Ok(text) =
                        read_confined(&self.project.root, &root.join("requirements.txt"))
                    {
                        requirements.extend(requirement_lines(&text));
                    }
                    found = Some(ModuleInfo {
                        name: name.to_string(),
                        version: version_text(&yml.version),
                        root: ModuleRoot::Dir(root),
                        yml,
                        python,
                        requirements,
                        v2: false,
                        extra_python: Vec::new(),
                    });
                    break;
                }
            }
        }
        if found.is_none() && self.project.pinned.contains(name) {
            found = self.find_v2(name)?;
        }
        if found.is_none()
            && let Some((_, _, text)) = BUILTIN
                .iter()
                .find(|(m, p, _)| *m == name && *p == "module.yml")
        {
            let yml: ModuleYml =
                serde_yaml_ng::from_str(text).expect("built-in module.yml is valid");
            found = Some(ModuleInfo {
                name: name.to_string(),
                version: version_text(&yml.version),
                root: ModuleRoot::Builtin,
                yml,
                python: None,
                requirements: Vec::new(),
                v2: false,
                extra_python: Vec::new(),
            });
        }
        if found.is_none() {
            found = self.find_v2(name)?;
        }
        match found {
            Some(m) => {
                self.modules.insert(name.to_string(), m.clone());
                Ok(m)
            }
            None => {
                let paths: Vec<String> = self
                    .project
                    .module_paths
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect();
                Err(format!(
                    "could not find module {name} in the module path [{}], among the built-in modules (std, fs, exec, mitogen) or in the Python environment of {} (a V2 module is the package inmanta-module-{})",
                    paths.join(", "),
                    self.project.python.interpreter.display(),
                    name.replace('_', "-")
                ))
            }
        }
    }

    /// A V2 module installed in the project's Python environment.
    fn find_v2(&self, name: &str) -> Result<Option<ModuleInfo>, String> {
        let dir = match self.project.python.find_v2(name) {
            Ok(Some(d)) => d,
            Ok(None) => return Ok(None),
            Err(e) if self.project.pinned.contains(name) => {
                return Err(format!(
                    "module {name} is pinned in requirements.txt but the Python environment can not be read: {e}"
                ));
            }
            // no Python at all: the module is simply not found
            Err(_) => return Ok(None),
        };
        let dist = dist_metadata(&dir, name);
        let version = dist.version;
        let yml = ModuleYml {
            name: Some(name.to_string()),
            version: Some(serde_yaml_ng::Value::String(version.clone())),
            ..Default::default()
        };
        let python = dir.join("__init__.py").is_file().then(|| dir.clone());
        Ok(Some(ModuleInfo {
            name: name.to_string(),
            version,
            root: ModuleRoot::Dir(dir),
            yml,
            python,
            requirements: dist.requires,
            v2: true,
            extra_python: dist.extra_python,
        }))
    }

    /// The file defining namespace `ns` (`m`, `m::a`, …): its text, its display name, and
    /// whether it is built in.
    fn namespace_file(&mut self, ns: &str) -> Result<Option<(String, String, bool)>, String> {
        let mut parts = ns.split("::");
        let module = parts.next().unwrap_or("");
        let rest: Vec<&str> = parts.collect();
        let m = self.find_module(module)?;
        let candidates = if rest.is_empty() {
            vec!["model/_init.cf".to_string()]
        } else {
            let p = rest.join("/");
            vec![format!("model/{p}.cf"), format!("model/{p}/_init.cf")]
        };
        for c in candidates {
            if let ModuleRoot::Dir(d) = &m.root
                && d.join(&c).exists()
                && let Err(e) = d
                    .canonicalize()
                    .and_then(|root| confined(&root, &d.join(&c)))
            {
                return Err(format!(
                    "{}: {e}",
                    relative_display(&self.project.dir, &d.join(&c).display().to_string())
                ));
            }
            if let Some((text, display, _)) = m.read(&c) {
                return Ok(Some(match &m.root {
                    ModuleRoot::Dir(_) => {
                        (text, relative_display(&self.project.dir, &display), false)
                    }
                    ModuleRoot::Builtin => (text, display, true),
                }));
            }
        }
        Ok(None)
    }

    /// Load main.cf and everything it imports. Syntax errors are collected per file.
    pub fn load_all(mut self) -> Result<Loaded, Vec<Diagnostic>> {
        let mut errors = Vec::new();
        let mut warnings = Vec::new();
        let mut files: Vec<LoadedFile> = Vec::new();
        let mut seen: HashSet<String> = HashSet::new();
        // (namespace, text, display name, built in) to parse, in load order
        let mut queue: VecDeque<(String, String, String, bool)> = VecDeque::new();
        let main_path = self.project.dir.join(&self.project.main_file);
        let main_text = match read_confined(&self.project.root, &main_path) {
            Ok(t) => t,
            Err(e) => {
                return Err(vec![Diagnostic::error(
                    "project",
                    format!("can not read {}: {e}", main_path.display()),
                )]);
            }
        };
        // std first: its top-level statements (std::linux, …) exist before anyone uses them
        match self.namespace_file("std") {
            Ok(Some((text, display, builtin))) => {
                queue.push_back(("std".into(), text, display, builtin))
            }
            Ok(None) => unreachable!("std is built in"),
            // std pinned in requirements.txt, in a Python environment that can not be read
            Err(msg) => {
                return Err(vec![Diagnostic::error(
                    "import",
                    format!("Failed to load module std: {msg}"),
                )]);
            }
        }
        seen.insert("std".into());
        queue.push_back((
            "__config__".into(),
            main_text,
            self.project.main_file.clone(),
            false,
        ));
        seen.insert("__config__".into());
        while let Some((ns, mut text, display, builtin)) = queue.pop_front() {
            // like the reference, parse with a newline appended: "end of file" errors then
            // point at the line after the last one
            text.push('\n');
            let file = self.sources.add(display, text);
            let module = if ns == "__config__" {
                "__config__".to_string()
            } else {
                ns.split("::").next().unwrap_or("").to_string()
            };
            let tokenize = if builtin {
                lexer::tokenize_builtin
            } else {
                lexer::tokenize
            };
            let tokens = match tokenize(file, &self.sources.file(file).text, &mut warnings) {
                Ok(t) => t,
                Err(d) => {
                    errors.push(d);
                    continue;
                }
            };
            let ast = match parser::parse(&tokens) {
                Ok(a) => a,
                Err(d) => {
                    errors.push(d);
                    continue;
                }
            };
            let mut imports = Vec::new();
            let mut names: HashMap<String, Span> = HashMap::new();
            for item in &ast.items {
                let super::ast::TopItem::Import(imp) = item else {
                    continue;
                };
                let target = imp.module.full();
                let visible = imp
                    .alias
                    .as_ref()
                    .map(|a| a.text.clone())
                    .unwrap_or_else(|| target.clone());
                if let Some(prev) = names.get(&visible) {
                    let _ = prev;
                    errors.push(
                        Diagnostic::error(
                            "duplicate",
                            format!("Two import statements have the same name {visible}"),
                        )
                        .at(imp.span),
                    );
                    continue;
                }
                names.insert(visible.clone(), imp.span);
                // every prefix of the imported namespace is loaded
                let parts: Vec<&str> = target.split("::").collect();
                let mut ok = true;
                for i in 1..=parts.len() {
                    let prefix = parts[..i].join("::");
                    if seen.contains(&prefix) {
                        continue;
                    }
                    match self.namespace_file(&prefix) {
                        Ok(Some((text, display, builtin))) => {
                            seen.insert(prefix.clone());
                            queue.push_back((prefix, text, display, builtin));
                        }
                        Ok(None) => {
                            errors.push(
                                Diagnostic::error(
                                    "import",
                                    format!(
                                        "Failed to load module {target}: could not find module {prefix} (no model file for it)"
                                    ),
                                )
                                .at(imp.module.span),
                            );
                            ok = false;
                            break;
                        }
                        Err(msg) => {
                            errors.push(
                                Diagnostic::error(
                                    "import",
                                    format!("Failed to load module {target}: {msg}"),
                                )
                                .at(imp.module.span),
                            );
                            ok = false;
                            break;
                        }
                    }
                }
                if ok {
                    imports.push((visible, target, imp.span));
                }
            }
            files.push(LoadedFile {
                ns_name: ns,
                module,
                file,
                ast,
                imports,
            });
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Loaded {
            files,
            modules: self.modules,
            warnings,
        })
    }
}

fn relative_display(base: &Path, path: &str) -> String {
    let p = Path::new(path);
    match p.strip_prefix(base) {
        Ok(r) => r.display().to_string(),
        Err(_) => path.to_string(),
    }
}

/// Read a file shipped with a module (`templates/`, `files/`), for plugins.
pub fn module_file(
    project: &Project,
    modules: &BTreeMap<String, ModuleInfo>,
    module: &str,
    dir: &str,
    path: &str,
) -> Result<(String, String), String> {
    if path.split('/').any(|p| p == "..") || path.starts_with('/') {
        return Err(format!(
            "{path}: paths may not leave the module (no absolute paths, no `..`)"
        ));
    }
    // the project's own files: "/name" (as the reference) or "<project name>/name"
    if module.is_empty()
        || module == "__config__"
        || (module == project.name && !modules.contains_key(module))
    {
        let full = project.dir.join(dir).join(path);
        return match confined(&project.root, &full) {
            Ok(real) => std::fs::read_to_string(&real)
                .map(|t| (t, full.display().to_string()))
                .map_err(|_| format!("{path} isn't a valid file ({})", full.display())),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                Err(format!("{path} can not be read: {e}"))
            }
            Err(_) => Err(format!("{path} isn't a valid file ({})", full.display())),
        };
    }
    let Some(m) = modules.get(module) else {
        return Err(format!(
            "Module {module} does not exist for path {module}/{path}"
        ));
    };
    if let ModuleRoot::Dir(d) = &m.root {
        let full = d.join(dir).join(path);
        if full.exists()
            && let Err(e) = d.canonicalize().and_then(|root| confined(&root, &full))
        {
            return Err(format!("{module}/{path} can not be read: {e}"));
        }
    }
    match m.read(&format!("{dir}/{path}")) {
        Some((text, _, abs)) => Ok((text, abs)),
        None => Err(format!("{module}/{path} isn't a valid file")),
    }
}

/// The names of the files (directories left out) in `path` under a module's `dir`, as
/// `module_file` finds that module (`path` may be empty: the `dir` itself), sorted.
pub fn list_module_files(
    project: &Project,
    modules: &BTreeMap<String, ModuleInfo>,
    module: &str,
    dir: &str,
    path: &str,
) -> Result<Vec<String>, String> {
    if path.split('/').any(|p| p == "..") || path.starts_with('/') {
        return Err(format!(
            "{path}: paths may not leave the module (no absolute paths, no `..`)"
        ));
    }
    let (root, full) = if module.is_empty()
        || module == "__config__"
        || (module == project.name && !modules.contains_key(module))
    {
        (project.root.clone(), project.dir.join(dir).join(path))
    } else {
        let Some(m) = modules.get(module) else {
            return Err(format!(
                "Module {module} does not exist for path {module}/{path}"
            ));
        };
        match &m.root {
            ModuleRoot::Dir(d) => (
                d.canonicalize()
                    .map_err(|e| format!("{}: {e}", d.display()))?,
                d.join(dir).join(path),
            ),
            ModuleRoot::Builtin => {
                let prefix = format!("{dir}/{}", path.trim_end_matches('/'));
                let prefix = format!("{}/", prefix.trim_end_matches('/'));
                let mut names: Vec<String> = BUILTIN
                    .iter()
                    .filter(|(m, _, _)| *m == module)
                    .filter_map(|(_, p, _)| p.strip_prefix(&prefix))
                    .filter(|rest| !rest.contains('/'))
                    .map(str::to_string)
                    .collect();
                if names.is_empty() {
                    return Err(format!(
                        "FileNotFoundError: [Errno 2] No such file or directory: '<builtin>/{module}/{prefix}'"
                    ));
                }
                names.sort();
                return Ok(names);
            }
        }
    };
    let not_found = || {
        format!(
            "FileNotFoundError: [Errno 2] No such file or directory: '{}'",
            full.display()
        )
    };
    let real = confined(&root, &full).map_err(|e| match e.kind() {
        std::io::ErrorKind::PermissionDenied => format!("{}: {e}", full.display()),
        _ => not_found(),
    })?;
    let entries = std::fs::read_dir(&real).map_err(|_| not_found())?;
    let mut names = Vec::new();
    for entry in entries.flatten() {
        // a file, or a symlink to one inside the project (os.path.isfile follows links)
        if confined(&root, &entry.path()).is_ok_and(|p| p.is_file()) {
            names.push(entry.file_name().to_string_lossy().to_string());
        }
    }
    names.sort();
    Ok(names)
}

//! The real public `fs`, `exec` and `mitogen` Inmanta modules' handlers, unchanged, deploying
//! through mitogen's local context in Steward's executors: their wheels come from the package
//! index (pip download), `mitogen` is installed by the executor into its virtualenv for the
//! handlers' requirements. The export is built here as the reference exports this model (the
//! resources below are what `inmanta export -j` of inmanta-core 14.0.0 wrote for it, with the
//! paths moved into a temporary directory), with the files the exporter uploads (`fs::File`'s
//! content by sha1) shipped with the handler code under `_files/`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::{Value, json};
use steward::model::{Resource, ResourceId};

use crate::deploy::deploy_actions;
use crate::python_handlers::{inmanta_code, upload, with_code};
use crate::support::{TestServer, eventually, wait_deployed};

const WHEELS: &[&str] = &[
    "inmanta-module-fs==1.1.2",
    "inmanta-module-exec==2.1.1",
    "inmanta-module-mitogen==0.2.5",
];

/// The modules' Python files (path under site-packages -> content), from their wheels,
/// downloaded once per test process.
fn module_files() -> &'static BTreeMap<String, String> {
    static FILES: OnceLock<BTreeMap<String, String>> = OnceLock::new();
    FILES.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("steward-real-modules-{}", std::process::id()));
        let wheels = dir.join("wheels");
        let site = dir.join("site");
        let out = Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--quiet",
                "--disable-pip-version-check",
                "-d",
            ])
            .arg(&wheels)
            .args(WHEELS)
            .output()
            .expect("pip");
        assert!(
            out.status.success(),
            "pip download: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for w in std::fs::read_dir(&wheels).unwrap() {
            let w = w.unwrap().path();
            let out = Command::new("python3")
                .args(["-m", "zipfile", "-e"])
                .arg(&w)
                .arg(&site)
                .output()
                .unwrap();
            assert!(out.status.success(), "unzip {}", w.display());
        }
        let mut files = BTreeMap::new();
        collect(&site, &site, &mut files);
        let _ = std::fs::remove_dir_all(&dir);
        files
    })
}

fn collect(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let rel = p.strip_prefix(root).unwrap().to_string_lossy().to_string();
        if p.is_dir() {
            if rel.ends_with(".dist-info") || rel.ends_with("__pycache__") {
                continue;
            }
            collect(root, &p, out);
        } else if rel.ends_with(".py")
            && (rel.starts_with("inmanta_plugins/") || rel.starts_with("inmanta_mitogen/"))
        {
            out.insert(rel, std::fs::read_to_string(&p).unwrap());
        }
    }
}

fn sha1_hex(content: &[u8]) -> String {
    let out = Command::new("python3")
        .args([
            "-c",
            "import hashlib,sys; print(hashlib.sha1(sys.stdin.buffer.read()).hexdigest())",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(content)?;
            c.wait_with_output()
        })
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A resource as the reference exports it (`inmanta export -j`), minus `id`, `version`
/// and `requires`, which Steward's export carries beside the attributes.
fn reference(ty: &str, key: &str, value: &str, attrs: Value, requires: &[String]) -> Resource {
    let mut a = json!({
        "purge_on_delete": false, "send_event": true, "purged": false, "receive_events": true,
        "via": {"method_name": "local", "name": ""},
    });
    for (k, v) in attrs.as_object().unwrap() {
        a[k] = v.clone();
    }
    Resource {
        id: ResourceId::new(ty, "localhost", key, value),
        type_name: ty.into(),
        agent: "localhost".into(),
        attributes: a.as_object().unwrap().clone(),
        requires: requires.iter().map(|r| ResourceId(r.clone())).collect(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn real_fs_exec_and_mitogen_handlers_deploy_through_mitogen() {
    let files = module_files();
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let env = c
        .create_environment("pyh", "real", None)
        .await
        .unwrap()
        .id
        .to_string();
    let tmp = tempfile::tempdir().unwrap();
    let t = |p: &str| tmp.path().join(p).to_str().unwrap().to_string();
    let content = "hello world\n";
    let hash = sha1_hex(content.as_bytes());
    assert_eq!(hash, "22596363b3de40b06f981fb85d82312e8c0ed511");

    let mut shipped: Vec<(String, String)> =
        files.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    shipped.push((format!("_files/{hash}"), content.to_string()));
    let shipped_ref: Vec<(&str, &str)> = shipped
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let code = inmanta_code(
        "fs",
        &shipped_ref,
        // as the packages declare them: the modules are shipped, mitogen is installed
        &["inmanta-module-mitogen", "inmanta-module-std", "mitogen"],
        &[
            "inmanta_plugins.mitogen",
            "inmanta_plugins.fs",
            "inmanta_plugins.exec",
        ],
    );
    let dir_id = format!("fs::Directory[localhost,path={}]", t("dir"));
    let file = |permissions: i64| {
        reference(
            "fs::File",
            "path",
            &t("dir/hello.txt"),
            json!({"path": t("dir/hello.txt"), "group": null, "owner": null, "permissions": permissions, "hash": hash}),
            std::slice::from_ref(&dir_id),
        )
    };
    let resources = |permissions: i64| {
        vec![
            reference(
                "fs::Directory",
                "path",
                &t("dir"),
                json!({"path": t("dir"), "group": null, "owner": null, "permissions": null}),
                &[],
            ),
            file(permissions),
            reference(
                "fs::Symlink",
                "dst",
                &t("link"),
                json!({"src": t("dir/hello.txt"), "dst": t("link")}),
                std::slice::from_ref(&dir_id),
            ),
            reference(
                "exec::Run",
                "command",
                &format!("touch {}", t("ran")),
                json!({
                    "skip_on_fail": false, "cwd": "", "command": format!("touch {}", t("ran")), "path": "",
                    "unless": "", "returns": [0], "reload": "", "timeout": 300, "creates": t("ran"),
                    "reload_only": false, "onlyif": "", "environment": {},
                }),
                &[],
            ),
        ]
    };
    let started = std::time::Instant::now();
    let v1 = upload(&c, &env, &with_code(resources(644), &code)).await;
    let p = wait_deployed(&c, &env, v1, 120).await;
    let first = started.elapsed();
    let file_id = format!("fs::File[localhost,path={}]", t("dir/hello.txt"));
    assert_eq!(
        p["by_status"]["deployed"],
        4,
        "{p} {:#}",
        deploy_actions(&c, &env, &file_id)
            .await
            .first()
            .map(|a| a.messages.clone())
            .unwrap_or_default()
    );
    assert_eq!(
        std::fs::read_to_string(t("dir/hello.txt")).unwrap(),
        content
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(t("dir/hello.txt"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o644);
    assert_eq!(
        std::fs::read_link(t("link")).unwrap(),
        PathBuf::from(t("dir/hello.txt"))
    );
    assert!(Path::new(&t("ran")).exists());
    let a = &deploy_actions(&c, &env, &file_id).await[0];
    assert_eq!(a.change, "created");
    // every call through mitogen is in the action log, as Inmanta logs it
    assert!(
        a.messages
            .to_string()
            .contains("Calling function inmanta_mitogen.put in context"),
        "{:#}",
        a.messages
    );

    // a change of permissions: updated by the real handler
    let t2 = std::time::Instant::now();
    let v2 = upload(&c, &env, &with_code(resources(600), &code)).await;
    wait_deployed(&c, &env, v2, 60).await;
    let second = t2.elapsed();
    eventually(10, "the mode to change", || async {
        let mode = std::fs::metadata(t("dir/hello.txt"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        (mode == 0o600).then_some(())
    })
    .await;
    let a = &deploy_actions(&c, &env, &file_id).await[0];
    assert_eq!(a.change, "updated");
    assert_eq!(
        a.changes["permissions"],
        json!({"current": 644, "desired": 600})
    );
    eprintln!(
        "real fs/exec/mitogen: first deploy (virtualenv with mitogen, handler host, mitogen context) {:.1} s, next version {:.2} s; digest {}",
        first.as_secs_f64(),
        second.as_secs_f64(),
        &code.0.digest[..12]
    );
}

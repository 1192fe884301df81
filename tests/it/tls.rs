//! TLS on the server (`--tls-cert`, `--tls-key`) and clients that verify it (`--ca-cert`):
//! a throwaway CA and a server certificate for 127.0.0.1/localhost are made with the openssl
//! command for each test.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::{Duration, Instant};

use steward::client::{Client, ClientError, ClientOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{free_port, new_database, spawn_server_with, steward_bin};

/// A CA, a certificate it signed for 127.0.0.1 and localhost, and keys.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let openssl = |args: &[&str]| {
            let o = Command::new("openssl")
                .args(args)
                .current_dir(dir.path())
                .output()
                .expect("the openssl command");
            assert!(
                o.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        };
        // the CA: its key in PKCS#8
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=steward test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        // the server: its key in SEC1 ("EC PRIVATE KEY")
        openssl(&[
            "ecparam",
            "-name",
            "prime256v1",
            "-genkey",
            "-noout",
            "-out",
            "server.key",
        ]);
        openssl(&[
            "req",
            "-new",
            "-key",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ]);
        std::fs::write(
            dir.path().join("ext.cnf"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
             keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ]);
        Pki { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// A real `steward server` child over TLS; killed when dropped.
struct TlsServer {
    child: std::process::Child,
    port: u16,
    url: String,
    admin: String,
    _data: tempfile::TempDir,
}

impl TlsServer {
    async fn start(pki: &Pki, admin: &str) -> TlsServer {
        let data = tempfile::tempdir_in(crate::support::scratch()).unwrap();
        let port = free_port();
        let (cert, key) = (pki.path("server.pem"), pki.path("server.key"));
        let child = spawn_server_with(
            &new_database(),
            port,
            admin,
            data.path(),
            &[
                OsStr::new("--tls-cert"),
                cert.as_os_str(),
                OsStr::new("--tls-key"),
                key.as_os_str(),
            ],
        );
        let url = format!("https://127.0.0.1:{port}");
        let c = client(&url, admin, pki);
        let deadline = Instant::now() + Duration::from_secs(20);
        while c.health().await.is_err() {
            assert!(
                Instant::now() < deadline,
                "the TLS server did not become healthy: {}",
                std::fs::read_to_string(data.path().join("server.log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        TlsServer {
            child,
            port,
            url,
            admin: admin.into(),
            _data: data,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._data.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client(url: &str, token: &str, pki: &Pki) -> Client {
    Client::with_options(
        url,
        Some(token.into()),
        &ClientOptions {
            ca_cert: Some(pki.path("ca.pem")),
        },
    )
    .unwrap()
}

/// `steward <args>` with no STEWARD_* connection settings from the test's environment.
fn steward(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(steward_bin());
    c.args(args).current_dir(dir);
    for v in [
        "STEWARD_SERVER",
        "STEWARD_TOKEN",
        "STEWARD_ENV",
        "STEWARD_CA_CERT",
    ] {
        c.env_remove(v);
    }
    c
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn clients_with_the_ca_certificate_talk_to_an_https_server_and_others_are_refused() {
    let pki = Pki::new();
    let srv = TlsServer::start(&pki, "stw_test_admin_secret_for_tls").await;
    assert!(
        srv.log()
            .contains(&format!("listening on https://127.0.0.1:{}", srv.port)),
        "{}",
        srv.log()
    );
    let c = client(&srv.url, &srv.admin, &pki);
    c.create_environment("tls", "prod", None).await.unwrap();
    let work = tempfile::tempdir().unwrap();
    let ca = pki.path("ca.pem");
    let ca = ca.to_str().unwrap();

    // the CLI with --ca-cert, with STEWARD_CA_CERT, and with ca_cert in .steward.toml
    // (relative to that file's directory)
    let o = steward(
        work.path(),
        &[
            "env",
            "list",
            "--server",
            &srv.url,
            "--token",
            &srv.admin,
            "--ca-cert",
            ca,
        ],
    )
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("prod"),
        "{}",
        text(&o)
    );
    let o = steward(
        work.path(),
        &["env", "list", "--server", &srv.url, "--token", &srv.admin],
    )
    .env("STEWARD_CA_CERT", ca)
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let project = tempfile::tempdir().unwrap();
    std::fs::copy(pki.path("ca.pem"), project.path().join("our-ca.pem")).unwrap();
    std::fs::write(
        project.path().join(".steward.toml"),
        format!(
            "server = \"{}\"\ntoken = \"{}\"\nca_cert = \"our-ca.pem\"\n",
            srv.url, srv.admin
        ),
    )
    .unwrap();
    let o = steward(project.path(), &["env", "list"]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("prod"),
        "{}",
        text(&o)
    );

    // without the CA: refused, and the error says why and what to do
    let o = steward(
        work.path(),
        &["env", "list", "--server", &srv.url, "--token", &srv.admin],
    )
    .output()
    .unwrap();
    assert!(!o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("certificate") && err.contains("--ca-cert"),
        "{}",
        text(&o)
    );
    // said once, by steward, not also logged by the verifier
    assert!(!err.contains("rustls_platform_verifier"), "{}", text(&o));
    match Client::new(&srv.url, Some(srv.admin.clone()))
        .health()
        .await
    {
        Err(ClientError::Certificate { message, .. }) => {
            assert!(message.contains("UnknownIssuer"), "{message}")
        }
        other => panic!("a client without the CA got {other:?}"),
    }
    // a CA file that is not one: an error naming it
    let o = steward(
        work.path(),
        &[
            "env",
            "list",
            "--server",
            &srv.url,
            "--ca-cert",
            pki.path("server.key").to_str().unwrap(),
        ],
    )
    .output()
    .unwrap();
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("server.key"),
        "{}",
        text(&o)
    );
    // plain HTTP to the TLS port: a 400 that says to use https
    let http = format!("http://127.0.0.1:{}", srv.port);
    let r = reqwest::get(format!("{http}/health")).await.unwrap();
    assert_eq!(r.status(), 400);
    let body = r.text().await.unwrap();
    assert!(body.contains("https://127.0.0.1:"), "{body}");
    let o = steward(
        work.path(),
        &["env", "list", "--server", &http, "--token", &srv.admin],
    )
    .output()
    .unwrap();
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("HTTPS"),
        "{}",
        text(&o)
    );
    // and the server still serves
    c.health().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_never_finishes_its_handshake_is_dropped_while_others_are_served() {
    let pki = Pki::new();
    let srv = TlsServer::start(&pki, "stw_test_admin_secret_for_tls_handshake").await;
    let c = client(&srv.url, &srv.admin, &pki);
    let port = srv.port;
    // one says nothing at all, one starts a TLS record and stops
    let held = |opening: &'static [u8]| async move {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        s.write_all(opening).await.unwrap();
        let started = Instant::now();
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf)).await;
        (started.elapsed(), read.map(|r| r.map_err(|e| e.kind())))
    };
    let served_meanwhile = async {
        for _ in 0..10 {
            c.health().await.expect("served during the held handshakes");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    // after a handshake, HTTP/1.1 (by ALPN) and half-sent headers: the header-read timeout
    let half_headers = async {
        use tokio_rustls::rustls;
        use tokio_rustls::rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(rustls::pki_types::CertificateDer::from_pem_file(pki.path("ca.pem")).unwrap())
            .unwrap();
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let mut s = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect("127.0.0.1".try_into().unwrap(), tcp)
            .await
            .expect("TLS handshake with the CA's roots");
        assert_eq!(s.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
        s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        let started = Instant::now();
        let mut buf = [0u8; 1024];
        let read = tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf)).await;
        (started.elapsed(), read.map(|r| r.map_err(|e| e.kind())))
    };
    let (silent, partial, headers, ()) = tokio::join!(
        held(b""),
        held(b"\x16\x03\x01"),
        half_headers,
        served_meanwhile
    );
    for (what, (elapsed, read)) in [("silent", silent), ("partial", partial)] {
        // closed by the server (end of stream or reset), after the 10 s handshake timeout
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "{what}: {read:?} after {elapsed:?}"
        );
        assert!(
            elapsed >= Duration::from_secs(9) && elapsed < Duration::from_secs(20),
            "{what}: closed after {elapsed:?}"
        );
    }
    // hyper answers 408 or closes; either way within its 10 s header-read timeout
    let (elapsed, read) = headers;
    assert!(
        read.is_ok(),
        "half-sent headers over TLS held for {elapsed:?}"
    );
    assert!(
        elapsed < Duration::from_secs(15),
        "half-sent headers over TLS held for {elapsed:?}"
    );
    c.health().await.unwrap();
}

/// `steward server` with these flags, expected to fail at startup: its stderr. The
/// database URL points nowhere: a TLS error (rather than one about the database) shows the
/// files are checked first.
async fn failed_start(flags: &[&OsStr]) -> String {
    failed_start_with(flags, &[]).await
}

async fn failed_start_with(flags: &[&OsStr], env: &[(&str, &OsStr)]) -> String {
    let data = tempfile::tempdir_in(crate::support::scratch()).unwrap();
    let mut cmd = tokio::process::Command::new(steward_bin());
    cmd.args(["server", "--bind", &format!("127.0.0.1:{}", free_port())])
        .args(["--database-url", "postgres://steward@127.0.0.1:1/nowhere"])
        .arg("--data-dir")
        .arg(data.path())
        .args(flags)
        .env_remove("STEWARD_TLS_CERT")
        .env_remove("STEWARD_TLS_KEY")
        .envs(env.iter().copied())
        .kill_on_drop(true);
    let o = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("the server gave up within 30 s")
        .unwrap();
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    String::from_utf8_lossy(&o.stderr).to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn unusable_certificates_or_keys_stop_the_server_before_it_listens() {
    let pki = Pki::new();
    let p = |n: &str| pki.path(n).into_os_string();
    let (cert, key, ca_key, missing) =
        (p("server.pem"), p("server.key"), p("ca.key"), p("nope.key"));
    let (tls_cert, tls_key) = (OsStr::new("--tls-cert"), OsStr::new("--tls-key"));

    let err = failed_start(&[tls_cert, &cert]).await;
    assert!(err.contains("--tls-key"), "{err}");
    let err = failed_start(&[tls_key, &key]).await;
    assert!(err.contains("--tls-cert"), "{err}");
    let err = failed_start(&[tls_cert, &cert, tls_key, &missing]).await;
    assert!(
        err.contains("can not read the TLS key") && err.contains("nope.key"),
        "{err}"
    );
    let err = failed_start(&[tls_cert, &cert, tls_key, &ca_key]).await;
    assert!(
        err.contains("is not the private key of the certificate") && err.contains("ca.key"),
        "{err}"
    );
    // the same from STEWARD_TLS_CERT and STEWARD_TLS_KEY
    let err = failed_start_with(
        &[],
        &[("STEWARD_TLS_CERT", &cert), ("STEWARD_TLS_KEY", &ca_key)],
    )
    .await;
    assert!(err.contains("is not the private key of"), "{err}");
    let err = failed_start(&[tls_cert, &cert, tls_key, &cert]).await;
    assert!(
        err.contains("invalid TLS key file") && err.contains("server.pem"),
        "{err}"
    );
    let err = failed_start(&[tls_cert, &key, tls_key, &key]).await;
    assert!(
        err.contains("invalid TLS certificate file") && err.contains("server.key"),
        "{err}"
    );
}

//! A throwaway OpenSSH server on a loopback port (Debian's openssh-server), with a fresh host
//! key, one authorised client key and a known_hosts file; and a TCP proxy that adds latency.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Sshd {
    pub port: u16,
    pub user: String,
    pub known_hosts: PathBuf,
    pub client_key: PathBuf,
    host_key: String,
    child: Child,
}

fn keygen(path: &Path) -> String {
    let ok = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "", "-f"])
        .arg(path)
        .status()
        .expect("ssh-keygen")
        .success();
    assert!(ok, "ssh-keygen failed");
    let public = std::fs::read_to_string(path.with_extension("pub")).unwrap();
    public
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Sshd {
    pub fn start(dir: &Path) -> Sshd {
        assert!(
            Path::new("/usr/sbin/sshd").is_file(),
            "/usr/sbin/sshd is missing: install openssh-server (scripts/test does)"
        );
        std::fs::create_dir_all(dir).unwrap();
        let host_key = keygen(&dir.join("host_key"));
        let client = keygen(&dir.join("client_key"));
        std::fs::write(dir.join("authorized_keys"), format!("{client}\n")).unwrap();
        let home = dir.join("home");
        std::fs::create_dir_all(&home).unwrap();
        // SAFETY: geteuid(2) can not fail
        if unsafe { libc::geteuid() } == 0 {
            std::fs::create_dir_all("/run/sshd").unwrap();
        }
        let user = String::from_utf8(Command::new("id").arg("-un").output().unwrap().stdout)
            .unwrap()
            .trim()
            .to_string();
        let port = free_port();
        let config = dir.join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {hk}\nPidFile {pid}\n\
                 AuthorizedKeysFile {ak}\nUsePAM no\nPermitRootLogin prohibit-password\n\
                 StrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
                 X11Forwarding no\nPrintMotd no\nMaxSessions 32\nSetEnv HOME={home}\n",
                hk = dir.join("host_key").display(),
                pid = dir.join("sshd.pid").display(),
                ak = dir.join("authorized_keys").display(),
                home = home.display(),
            ),
        )
        .unwrap();
        let child = Command::new("/usr/sbin/sshd")
            .arg("-D")
            .arg("-E")
            .arg(dir.join("sshd.log"))
            .arg("-f")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("sshd");
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "sshd did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let known_hosts = dir.join("known_hosts");
        std::fs::write(&known_hosts, format!("[127.0.0.1]:{port} {host_key}\n")).unwrap();
        Sshd {
            port,
            user,
            known_hosts,
            client_key: dir.join("client_key"),
            host_key,
            child,
        }
    }

    /// Trust this server's key on another port too (a proxy in front of it).
    pub fn also_known_at(&self, port: u16) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.known_hosts)
            .unwrap();
        writeln!(f, "[127.0.0.1]:{port} {}", self.host_key).unwrap();
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP proxy on a loopback port to `127.0.0.1:target` that delays every byte by `one_way`
/// in each direction (so a round trip costs 2 × `one_way` more), without limiting throughput.
pub async fn delay_proxy(target: u16, one_way: Duration) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await else {
                continue;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            for (mut r, mut w) in [(cr, sw), (sr, cw)].map(|(r, w)| {
                (
                    Box::new(r) as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
                    Box::new(w) as Box<dyn tokio::io::AsyncWrite + Unpin + Send>,
                )
            }) {
                let (tx, mut rx) =
                    tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        match r.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                let due = tokio::time::Instant::now() + one_way;
                                if tx.send((due, buf[..n].to_vec())).is_err() {
                                    break;
                                }
                            }
                        }
                    }
                });
                tokio::spawn(async move {
                    while let Some((due, bytes)) = rx.recv().await {
                        tokio::time::sleep_until(due).await;
                        if w.write_all(&bytes).await.is_err() {
                            break;
                        }
                    }
                    let _ = w.shutdown().await;
                });
            }
        }
    });
    port
}

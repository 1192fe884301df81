//! The pre-exec side of a [`Jail`](super::Jail): everything the forked child does before the
//! program is exec'd, on values prepared before the fork (the child allocates nothing and
//! makes only async-signal-safe system calls).

use std::ffi::CString;
use std::path::{Path, PathBuf};

use super::{Identity, Jail, MAX_KEPT, PRIVATE_TMP_SIZE, c_path};

/// Everything the child needs, made before the fork: the pre-exec code allocates nothing.
pub(super) struct Prepared {
    identity: Option<Identity>,
    limits: Vec<(libc::__rlimit_resource_t, libc::rlimit)>,
    namespaces: bool,
    die_with_parent: bool,
    user_ns: bool,
    uid_map: CString,
    gid_map: CString,
    proc_path: CString,
    proc_type: CString,
    root_path: CString,
    setgroups_path: CString,
    uid_map_path: CString,
    gid_map_path: CString,
    deny: CString,
    /// Directories an empty tmpfs covers: a private temporary directory (`true`: anyone may
    /// write there) or one hidden from the jail (`false`).
    covers: Vec<(CString, bool)>,
    tmpfs: CString,
    tmp_options: CString,
    hidden_options: CString,
    /// `keep_visible`: the directory, then the directories to make inside a cover on the
    /// way to it (outermost first)
    keep: Vec<(CString, Vec<CString>)>,
    /// Where this process's command line and environment are in memory (from
    /// `/proc/self/stat`): the jail's init, a fork of the server, blanks them so that
    /// `/proc/1/cmdline` shows nothing of the server's.
    arg_area: Area,
    env_area: Area,
}

/// A range of this process's memory: start and end addresses.
type Area = Option<(usize, usize)>;

/// The command line and environment areas of this process (fields 48 to 51 of
/// `/proc/self/stat`).
fn own_memory_areas() -> (Area, Area) {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return (None, None);
    };
    // after "pid (comm)", fields are counted from 3
    let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return (None, None);
    };
    let fields: Vec<usize> = after
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let area = |start: usize| {
        let (a, b) = (*fields.get(start - 3)?, *fields.get(start - 2)?);
        (a > 0 && b > a).then_some((a, b))
    };
    (area(48), area(50))
}

impl Prepared {
    pub(super) fn new(jail: &Jail) -> Prepared {
        // SAFETY: getuid/getgid can not fail
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let c = |s: &str| CString::new(s).expect("no NUL");
        let (arg_area, env_area) = own_memory_areas();
        // what an empty tmpfs covers: the private temporary directories, then what the
        // jail must not see (outermost first; one inside another is covered already)
        let mut covers: Vec<(PathBuf, bool)> = Vec::new();
        if jail.namespaces {
            if jail.private_tmp {
                covers.extend(
                    ["/tmp", "/var/tmp", "/dev/shm"]
                        .into_iter()
                        .filter(|d| Path::new(d).is_dir())
                        .map(|d| (PathBuf::from(d), true)),
                );
            }
            let mut hidden: Vec<&PathBuf> = jail
                .hide
                .iter()
                .filter(|d| d.is_absolute() && d.parent().is_some() && d.is_dir())
                .collect();
            hidden.sort_by_key(|d| d.components().count());
            for d in hidden {
                if !covers.iter().any(|(c, _)| d.starts_with(c)) {
                    covers.push((d.clone(), false));
                }
            }
        }
        let keep = jail
            .keep_visible
            .iter()
            .filter_map(|keep| {
                // the outermost cover it is under; directories on the way are made in it
                let (under, _) = covers.iter().find(|(c, _)| keep.starts_with(c))?;
                let inside: Vec<CString> = keep
                    .ancestors()
                    .skip(1)
                    .take_while(|a| *a != under.as_path())
                    .filter_map(c_path)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                Some((c_path(keep)?, inside))
            })
            .take(MAX_KEPT)
            .collect();
        Prepared {
            identity: jail.identity,
            limits: jail
                .limits
                .iter()
                .map(|(r, soft, hard)| {
                    (
                        *r,
                        libc::rlimit {
                            rlim_cur: *soft as libc::rlim_t,
                            rlim_max: *hard as libc::rlim_t,
                        },
                    )
                })
                .collect(),
            namespaces: jail.namespaces,
            die_with_parent: jail.die_with_parent,
            // without root, the namespaces come with a user namespace of our own, in which
            // we keep our uid and gid
            user_ns: uid != 0,
            uid_map: c(&format!("{uid} {uid} 1")),
            gid_map: c(&format!("{gid} {gid} 1")),
            proc_path: c("/proc"),
            proc_type: c("proc"),
            root_path: c("/"),
            setgroups_path: c("/proc/self/setgroups"),
            uid_map_path: c("/proc/self/uid_map"),
            gid_map_path: c("/proc/self/gid_map"),
            deny: c("deny"),
            covers: covers
                .iter()
                .filter_map(|(d, tmp)| Some((c_path(d)?, *tmp)))
                .collect(),
            tmpfs: c("tmpfs"),
            tmp_options: c(&format!("mode=1777,size={PRIVATE_TMP_SIZE}")),
            hidden_options: c("mode=0711,size=1m"),
            keep,
            arg_area,
            env_area,
        }
    }
}

fn check(rc: libc::c_int) -> std::io::Result<()> {
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Write `text` to the file at `path` (for /proc/self/*_map).
///
/// # Safety
/// Async-signal-safe: open, write, close.
unsafe fn write_file(path: &CString, text: &CString) -> std::io::Result<()> {
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        check(fd)?;
        let bytes = text.as_bytes();
        let n = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
        libc::close(fd);
        if n != bytes.len() as isize {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Close every descriptor but `keep` (standard streams included).
///
/// # Safety
/// Async-signal-safe: close_range, or close in a loop where the kernel has no close_range.
unsafe fn close_all_but(keep: libc::c_int) {
    unsafe {
        let range = |first: libc::c_uint, last: libc::c_uint| {
            libc::syscall(libc::SYS_close_range, first, last, 0 as libc::c_uint) == 0
        };
        let keep = keep as libc::c_uint;
        let done = (keep == 0 || range(0, keep - 1)) && range(keep + 1, libc::c_uint::MAX);
        if !done {
            for fd in 0..65536 {
                if fd != keep as libc::c_int {
                    libc::close(fd);
                }
            }
        }
    }
}

/// Wait for `pid` and return its raw wait status.
///
/// # Safety
/// Async-signal-safe: waitpid only.
pub(super) unsafe fn wait_for(pid: libc::pid_t) -> libc::c_int {
    let mut status = 0;
    loop {
        // SAFETY: waitpid on our own child
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return status;
        }
        if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return 127 << 8;
        }
    }
}

/// End this process the way the raw wait `status` says its child ended: the same exit code,
/// or the same signal (the caller then sees SIGXCPU or SIGKILL as if it had no go-between).
///
/// # Safety
/// Async-signal-safe: signal, kill, _exit.
unsafe fn end_like(status: libc::c_int) -> ! {
    unsafe {
        if libc::WIFSIGNALED(status) {
            let sig = libc::WTERMSIG(status);
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
            libc::_exit(128 + sig);
        }
        libc::_exit(libc::WEXITSTATUS(status))
    }
}

/// The pre-exec code. With namespaces the forked child becomes a go-between that waits:
///
/// ```text
/// server ─ go-between (old PID namespace: the pid the server waits for)
///            └─ init (pid 1 of a new namespace: mounts a fresh /proc, waits)
///                 └─ the program (exec'd here, after limits and the identity switch)
/// ```
///
/// When the program ends, init ends with its status, and the kernel kills whatever else is
/// left in the namespace; the go-between passes the status on (signals included). A kill of
/// the go-between's process group (a timeout) takes the others too, and each dies with its
/// parent.
pub(super) fn in_child(p: &Prepared) -> std::io::Result<()> {
    // SAFETY: system calls only, on values prepared before the fork
    unsafe {
        if p.die_with_parent {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        }
        if p.namespaces {
            let mut flags = libc::CLONE_NEWPID | libc::CLONE_NEWNS;
            if p.user_ns {
                flags |= libc::CLONE_NEWUSER;
            }
            if p.user_ns {
                // A server that is not root is non-dumpable (its memory holds its secrets),
                // which makes /proc/self/*_map root's and unwritable for us. Dumpable for
                // as long as it takes to write them: outside the new namespaces only the
                // server's own user could attach in that window, and its sandboxed
                // processes are all inside namespaces of their own.
                libc::prctl(libc::PR_SET_DUMPABLE, 1);
            }
            check(libc::unshare(flags))?;
            if p.user_ns {
                write_file(&p.setgroups_path, &p.deny)?;
                write_file(&p.uid_map_path, &p.uid_map)?;
                write_file(&p.gid_map_path, &p.gid_map)?;
                // the go-between and init are copies of the server: the program they start
                // (the same uid) must not read their memory
                libc::prctl(libc::PR_SET_DUMPABLE, 0);
            }
            // mounts made here stay here
            check(libc::mount(
                std::ptr::null(),
                p.root_path.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            // init tells the go-between how the program ended through a pipe: a pid 1
            // can not end itself by a signal to pass one on
            let mut status_pipe = [0 as libc::c_int; 2];
            check(libc::pipe2(status_pipe.as_mut_ptr(), libc::O_CLOEXEC))?;
            let init = libc::fork();
            check(init)?;
            if init > 0 {
                // the go-between: it never execs, so it must let go of every descriptor it
                // inherited (the spawning side waits for its exec-error pipe to close, and
                // for the end of the output pipes)
                close_all_but(status_pipe[0]);
                let ended = wait_for(init);
                let mut status: libc::c_int = 0;
                let n = libc::read(
                    status_pipe[0],
                    (&mut status as *mut libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>(),
                );
                end_like(if n == std::mem::size_of::<libc::c_int>() as isize {
                    status
                } else {
                    ended
                });
            }
            libc::close(status_pipe[0]);
            // init: pid 1 of the new namespace. It is a copy of the server that never execs:
            // its command line and environment would be the server's in /proc/1
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            for (start, end) in [p.arg_area, p.env_area].into_iter().flatten() {
                std::ptr::write_bytes(start as *mut u8, 0, end - start);
            }
            let title = b"steward-sandbox\0";
            if let Some((start, end)) = p.arg_area
                && end - start >= title.len()
            {
                std::ptr::copy_nonoverlapping(title.as_ptr(), start as *mut u8, title.len());
            }
            libc::prctl(libc::PR_SET_NAME, title.as_ptr());
            if libc::mount(
                p.proc_type.as_ptr(),
                p.proc_path.as_ptr(),
                p.proc_type.as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                std::ptr::null(),
            ) != 0
            {
                libc::_exit(126);
            }
            // directories to keep (opened before they are covered, bound back after)
            let mut kept = [-1 as libc::c_int; MAX_KEPT];
            for (fd, (path, _)) in kept.iter_mut().zip(&p.keep) {
                *fd = libc::open(path.as_ptr(), libc::O_PATH | libc::O_DIRECTORY);
            }
            for (dir, tmp) in &p.covers {
                let options = if *tmp {
                    &p.tmp_options
                } else {
                    &p.hidden_options
                };
                if libc::mount(
                    p.tmpfs.as_ptr(),
                    dir.as_ptr(),
                    p.tmpfs.as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    options.as_ptr().cast(),
                ) != 0
                {
                    libc::_exit(126);
                }
            }
            for (&kept, (path, inside)) in kept.iter().zip(&p.keep) {
                if kept < 0 {
                    continue;
                }
                for d in inside {
                    // traversable, never listable: the way in shows nothing else
                    libc::mkdir(d.as_ptr(), 0o711);
                }
                libc::mkdir(path.as_ptr(), 0o700);
                // "/proc/self/fd/<kept>", written without allocating (procfs takes no
                // leading zeros)
                let mut source = [0u8; 32];
                source[..14].copy_from_slice(b"/proc/self/fd/");
                let mut digits = [0u8; 10];
                let (mut n, mut len) = (kept as u32, 0);
                loop {
                    digits[len] = b'0' + (n % 10) as u8;
                    len += 1;
                    n /= 10;
                    if n == 0 {
                        break;
                    }
                }
                for i in 0..len {
                    source[14 + i] = digits[len - 1 - i];
                }
                if libc::mount(
                    source.as_ptr().cast(),
                    path.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ) != 0
                {
                    libc::_exit(126);
                }
                libc::close(kept);
            }
            let program = libc::fork();
            if program < 0 {
                libc::_exit(126);
            }
            if program > 0 {
                close_all_but(status_pipe[1]);
                let status = wait_for(program);
                libc::write(
                    status_pipe[1],
                    (&status as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>(),
                );
                libc::_exit(0);
            }
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        }
        for (resource, l) in &p.limits {
            check(libc::setrlimit(*resource, l))?;
        }
        if let Some(id) = p.identity {
            check(libc::setgroups(0, std::ptr::null()))?;
            check(libc::setgid(id.gid))?;
            check(libc::setuid(id.uid))?;
            // changing credentials clears the death signal: set it again
            if p.die_with_parent {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            }
        }
    }
    Ok(())
}

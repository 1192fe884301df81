//! User and group names of this machine, from `/etc/passwd` and `/etc/group`.
//!
//! Every file, directory and symlink a handler reads reports its owner and group by name,
//! so a repair of 10,000 files looked both up 10,000 times. Reading and splitting the two
//! files each time was a third of the executor's system calls (open, stat, two reads and a
//! close, twice per resource). The parsed files are kept for the executor's life and read
//! again only when their identity changes: tools that add users (`useradd`, `groupadd`,
//! `vipw`) replace the file by a rename, which gives it a new inode, and an edit in place
//! changes its modification time or size. One `stat` per lookup checks that.

use std::os::unix::fs::MetadataExt;
use std::sync::Mutex;

/// What identifies one version of an accounts file.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(path: &str) -> Option<Stamp> {
        let m = std::fs::metadata(path).ok()?;
        Some(Stamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }
}

/// One parsed accounts file: (name, id) in file order (the first entry wins, as for libc).
struct Table {
    stamp: Stamp,
    entries: Vec<(String, u32)>,
}

fn parse(text: &str) -> Vec<(String, u32)> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(':');
            let name = fields.next()?;
            let _password = fields.next()?;
            let id = fields.next()?.parse().ok()?;
            Some((name.to_string(), id))
        })
        .collect()
}

/// A cache of one accounts file.
pub struct Accounts {
    path: &'static str,
    table: Mutex<Option<Table>>,
}

pub static USERS: Accounts = Accounts::new("/etc/passwd");
pub static GROUPS: Accounts = Accounts::new("/etc/group");

impl Accounts {
    pub const fn new(path: &'static str) -> Accounts {
        Accounts {
            path,
            table: Mutex::new(None),
        }
    }

    /// Run `f` over the file's entries, reading it again if it changed since last time.
    /// `None` when the file can not be read.
    fn with<T>(&self, f: impl FnOnce(&[(String, u32)]) -> T) -> Option<T> {
        let stamp = Stamp::of(self.path)?;
        // a panic elsewhere while the lock was held leaves a table that is still whole
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        if table.as_ref().is_none_or(|t| t.stamp != stamp) {
            let text = std::fs::read_to_string(self.path).ok()?;
            // the stamp taken before the read: a change during the read is seen next time
            *table = Some(Table {
                stamp,
                entries: parse(&text),
            });
        }
        table.as_ref().map(|t| f(&t.entries))
    }

    /// The name of an id.
    pub fn name_of(&self, id: u32) -> Option<String> {
        self.with(|entries| {
            entries
                .iter()
                .find(|(_, i)| *i == id)
                .map(|(name, _)| name.clone())
        })
        .flatten()
    }

    /// The id of a name.
    pub fn id_of(&self, name: &str) -> Option<u32> {
        self.with(|entries| entries.iter().find(|(n, _)| n == name).map(|(_, id)| *id))
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaked(path: &std::path::Path) -> &'static str {
        Box::leak(path.to_string_lossy().to_string().into_boxed_str())
    }

    #[test]
    fn parses_names_and_ids_and_skips_broken_lines() {
        let entries = parse(
            "root:x:0:0:root:/root:/bin/bash\n\nbroken\nweb:x:notanumber:\nsvc:x:998:998::/:/bin/false\n",
        );
        assert_eq!(
            entries,
            vec![("root".to_string(), 0), ("svc".to_string(), 998)]
        );
    }

    #[test]
    fn a_replaced_or_edited_file_is_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("passwd");
        std::fs::write(&path, "root:x:0:0::/root:/bin/sh\n").unwrap();
        let accounts = Accounts::new(leaked(&path));
        assert_eq!(accounts.name_of(0).as_deref(), Some("root"));
        assert_eq!(accounts.id_of("web"), None);

        // replaced by a rename, as useradd does: a new inode
        let next = dir.path().join("passwd+");
        std::fs::write(
            &next,
            "root:x:0:0::/root:/bin/sh\nweb:x:1001:1001::/:/bin/false\n",
        )
        .unwrap();
        std::fs::rename(&next, &path).unwrap();
        assert_eq!(accounts.id_of("web"), Some(1001));
        assert_eq!(accounts.name_of(1001).as_deref(), Some("web"));

        // edited in place: same inode, another size
        std::fs::write(&path, "admin:x:0:0::/root:/bin/sh\n").unwrap();
        assert_eq!(accounts.name_of(0).as_deref(), Some("admin"));
        assert_eq!(accounts.id_of("web"), None);

        // gone: nothing is answered from the old table
        std::fs::remove_file(&path).unwrap();
        assert_eq!(accounts.name_of(0), None);
    }
}

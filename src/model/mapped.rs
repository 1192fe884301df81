//! A file mapped into memory, read-only: the large files a run reads whole, once, at its
//! start (`steward deploy`'s memory of its last compile, what its last run left) are read
//! from the page cache where they lie instead of copied into a buffer of their own. At
//! 100,000 resources those are 47 and 55 MB; reading each whole took 40-160 ms, most of it
//! the page faults of the new buffer (mapped and populated: 3-4 ms).
//!
//! The mapping is private and populated at once. Its bytes are the file's as long as nobody
//! truncates or rewrites that file in place: Steward replaces these files by renaming a new
//! one over them, which leaves a mapping of the old one as it was (one truncated in place
//! by someone else would end the process with SIGBUS when its bytes are read).

use std::os::fd::AsRawFd;
use std::path::Path;

pub struct Mapped {
    ptr: *mut libc::c_void,
    len: usize,
}

// The mapping is read-only and owned by this value: nothing else writes through it.
unsafe impl Send for Mapped {}
unsafe impl Sync for Mapped {}

impl Mapped {
    /// The file at `path`, mapped whole.
    pub fn open(path: &Path) -> std::io::Result<Mapped> {
        let file = std::fs::File::open(path)?;
        let len = usize::try_from(file.metadata()?.len())
            .map_err(|_| std::io::Error::other("the file is larger than the address space"))?;
        if len == 0 {
            return Ok(Mapped {
                ptr: std::ptr::null_mut(),
                len: 0,
            });
        }
        #[cfg(target_os = "linux")]
        let flags = libc::MAP_PRIVATE | libc::MAP_POPULATE;
        #[cfg(not(target_os = "linux"))]
        let flags = libc::MAP_PRIVATE;
        // SAFETY: a new private, read-only mapping of an open file; the result is checked
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                flags,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapped { ptr, len })
    }
}

impl std::ops::Deref for Mapped {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ptr` maps `len` readable bytes until this value is dropped
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        if self.len != 0 {
            // SAFETY: the mapping made in `open`, unmapped once
            unsafe {
                libc::munmap(self.ptr, self.len);
            }
        }
    }
}

impl std::fmt::Debug for Mapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mapped({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapped_file_reads_as_its_bytes_and_outlives_a_replacement() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let bytes: Vec<u8> = (0..100_000u32).flat_map(|i| i.to_le_bytes()).collect();
        std::fs::write(&path, &bytes).unwrap();
        let m = Mapped::open(&path).unwrap();
        assert_eq!(&m[..], &bytes[..]);
        // replaced by a rename, and removed: the mapping keeps the old bytes
        let other = dir.path().join("g");
        std::fs::write(&other, b"new").unwrap();
        std::fs::rename(&other, &path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(&m[..], &bytes[..]);
        std::fs::write(&path, b"").unwrap();
        assert!(Mapped::open(&path).unwrap().is_empty());
        assert!(Mapped::open(&dir.path().join("none")).is_err());
    }
}

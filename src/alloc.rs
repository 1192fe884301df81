//! The process's memory allocator: mimalloc for everything, except that blocks of
//! [`MAPPED_FROM`] bytes or more are their own memory mappings, grown with `mremap`.
//!
//! Why not mimalloc alone: the compiler and the server grow a few vectors to hundreds of
//! megabytes (the compiler's result variables, tasks and instances; the store's batches).
//! mimalloc grows a block by allocating a new one and copying, so each doubling copies the
//! whole vector and faults in fresh pages for it: at gen_model N=20,000 that was a quarter of
//! `steward compile`'s time (`finish_grow` -> `_mi_theap_realloc_zero` -> `memcpy` and
//! page faults). `mremap` moves the pages instead, as glibc's allocator does for its large
//! blocks. A large block freed is also given back to the system at once, which keeps the
//! server's resident memory close to what it uses.
//!
//! Which allocator owns a block follows from its size alone (the size of the layout Rust
//! passes to `dealloc` and `realloc`), so no header or lookup is needed.
//!
//! Transparent huge pages: mimalloc reserves 1 GiB arenas and, by default, asks the kernel
//! to back them with 2 MiB pages. It is built without that (`no_thp`). Where the kernel
//! defragments for such requests (`defrag` = `madvise`, a common default), every fresh 2 MiB
//! page is cleared whole, after compaction when memory is fragmented:
//! - `steward compile` after another large process: gen_model N=1,000 took 0.15-0.2 s
//!   instead of 0.05 s;
//! - the server storing a first version of 10,000 resources (examples/bench_deploy.rs,
//!   interleaved runs): upload and store 0.66 s with huge pages, 0.40 s without. Only the
//!   no-change repair gains from them (0.42 against 0.45 s).
//!
//! On a system whose THP setting is `always`, one-shot commands still turn them off for
//! themselves ([`no_huge_pages_for_this_process`]). `steward deploy` is the exception: most
//! of its memory is filled at once by decoding what its last run left, and it asks for huge
//! pages for its heap ([`huge_pages_for_this_process`]).
//!
//! Page faults are still a quarter of a compile's time: each fresh page is cleared by the
//! kernel when first written. One-shot compiles have the pages just past the end of their
//! growing arenas populated by a second thread ([`Ahead`]), on the core the compile does not
//! use: gen_model N=20,000 faults 35,000 pages instead of 92,000. Populating whole blocks
//! ahead instead (each new half of a doubled vector) was tried too: as fast, but 150 MB
//! more resident memory, populated for nothing.

use std::alloc::{GlobalAlloc, Layout};
use std::ptr;

/// Alignment every mimalloc block has (its smallest blocks are a word), so that the plain
/// entry points serve these layouts; `mi_malloc_aligned` costs about twice as much per call,
/// and the compiler makes hundreds of thousands of small allocations.
const WORD: usize = std::mem::size_of::<usize>();

/// Blocks from this size on are separate mappings. Below it, the copies that growing a
/// vector costs add up to a few megabytes at most, and mimalloc's reuse of freed memory is
/// faster than a system call and fresh pages per allocation.
pub const MAPPED_FROM: usize = 4 << 20;

/// An empty vector with room for [`MAPPED_FROM`] bytes: address space, not memory. This
/// allocator maps a block that large lazily (pages cost only once written) and grows it with
/// `mremap`, without copying. For the compiler's arenas (its code, result variables, tasks,
/// ...): started small, each grew through a series of copies into fresh memory instead, and
/// at gen_model N=1,000 a quarter of `steward compile`'s page faults were those copies.
pub fn reserved<T>() -> Vec<T> {
    Vec::with_capacity(MAPPED_FROM.div_ceil(std::mem::size_of::<T>().max(1)))
}

/// Memory settings for a process that compiles once and exits (`steward compile`, and the
/// compile benchmark, which measures what it does).
pub fn tune_for_a_one_shot_compile() {
    no_huge_pages_for_this_process();
    populate_ahead_for_this_process();
}

/// Linux's `MADV_POPULATE_WRITE` (5.14): fault a range in, writable, without changing what
/// it holds. Not in the `libc` crate yet; an older kernel answers EINVAL, and nothing changes.
const MADV_POPULATE_WRITE: libc::c_int = 23;

/// How far past a vector's end [`Ahead`] keeps its pages populated: the memory a vector may
/// hold that it does not use yet, for each vector that asks.
const AHEAD: usize = 1 << 20;

/// Where [`Ahead`] sends the ranges to populate, once a command asked for it.
static POPULATE: std::sync::OnceLock<std::sync::mpsc::Sender<(usize, usize)>> =
    std::sync::OnceLock::new();

/// From now on, vectors that use [`Ahead`] have the pages just past their end populated by a
/// thread of their own, on another core, before they are written: for a one-shot compile,
/// which is single-threaded and spends a quarter of its time in page faults (clearing fresh
/// pages, at gen_model N=20,000 about 90,000 of them). The memory this costs is bounded:
/// [`AHEAD`] for each such vector.
pub fn populate_ahead_for_this_process() {
    POPULATE.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<(usize, usize)>();
        // if the thread can not start, the ranges sent go nowhere: vectors fault as before
        let _ = std::thread::Builder::new()
            .name("populate".into())
            .spawn(move || {
                for (start, len) in rx {
                    // SAFETY: populating only faults pages in (as a write would, without
                    // writing): whatever is mapped there now (the vector, or, once it moved
                    // or was freed, another private mapping of this process, which maps no
                    // file shared and writable) keeps its contents; an unmapped range fails
                    unsafe { libc::madvise(start as *mut libc::c_void, len, MADV_POPULATE_WRITE) };
                }
            });
        tx
    });
}

/// An empty byte vector with room for `capacity` bytes, its pages faulted in by one system
/// call (`MADV_POPULATE_WRITE`) rather than one fault per page as it is written: for a
/// buffer about to be filled whole (a 32 MB export copied with a few lines swapped), where
/// faulting 8,000 pages one by one costs ~1 µs each in a virtual machine. Below
/// [`MAPPED_FROM`] the block is mimalloc's, and nothing is asked.
pub fn populated(capacity: usize) -> Vec<u8> {
    let v: Vec<u8> = Vec::with_capacity(capacity);
    let len = v.capacity() & !(PAGE - 1);
    if v.capacity() >= MAPPED_FROM && len > 0 {
        // SAFETY: the range lies inside this vector's own block (its start, whole pages
        // of its capacity; with this allocator a block this large is a mapping of its own,
        // page-aligned; under another, a start that is not aligned is refused with EINVAL);
        // populating only faults pages in, without changing what they hold (an older kernel
        // answers EINVAL too, and nothing happens)
        unsafe { libc::madvise(v.as_ptr() as *mut libc::c_void, len, MADV_POPULATE_WRITE) };
    }
    v
}

/// The populated front of one growing vector: call [`Ahead::after_push`] after adding to it.
#[derive(Default)]
pub struct Ahead {
    /// Length from which the next range is asked for.
    next: usize,
    /// The vector's address when last asked for, and the end of what was asked.
    base: usize,
    asked_to: usize,
}

impl Ahead {
    #[inline]
    pub fn after_push<T>(&mut self, v: &Vec<T>) {
        if v.len() >= self.next {
            self.advance(v);
        }
    }

    #[cold]
    fn advance<T>(&mut self, v: &Vec<T>) {
        let Some(tx) = POPULATE.get() else {
            self.next = usize::MAX;
            return;
        };
        let elem = std::mem::size_of::<T>().max(1);
        let base = v.as_ptr() as usize;
        let used_to = base + v.len() * elem;
        let mut from = (used_to + PAGE - 1) & !(PAGE - 1);
        if base == self.base {
            from = from.max(self.asked_to);
        }
        let to = (used_to + AHEAD).min(base + v.capacity() * elem) & !(PAGE - 1);
        if to > from && tx.send((from, to - from)).is_ok() {
            (self.base, self.asked_to) = (base, to);
        }
        self.next = v.len() + (AHEAD / 2 / elem).max(1);
    }
}

/// Whether large blocks mapped from now on ask for transparent huge pages
/// ([`huge_pages_for_this_process`]).
static HUGE_MAPPINGS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Transparent huge pages for this process's heap from now on (`MADV_HUGEPAGE` on
/// mimalloc's arena and on each large block mapped after), for `steward deploy`: a run at
/// 100,000 resources decodes what the last run left into ~1 M small blocks, ~110 MB of fresh
/// memory in its first 200 ms, while both cores are busy. One 4 KiB fault costs ~2.5 µs in
/// a virtual machine, so those faults were ~30 % of the run's CPU; a 2 MiB page is one fault
/// (at 100,000, change one: the run's page faults, its PostgreSQL's included, ~96,000 ->
/// ~18,000; edit to file on disk, median of 12 runs, 0.255 -> 0.177 s; to exit 0.61 -> 0.47 s).
///
/// Not for every process (see the module's note): where memory is fragmented, a huge-page
/// fault in a madvised range may compact memory first. A deploy's run pays that at most
/// for the ~100 huge pages it touches; `STEWARD_HUGE_PAGES=off` turns this off, and a system
/// whose THP setting is `never` ignores the advice. The heap's later arenas (mimalloc
/// reserves another once its first 1 GiB is used) keep 4 KiB pages.
pub fn huge_pages_for_this_process() {
    if huge_pages_turned_off() {
        return;
    }
    HUGE_MAPPINGS.store(true, std::sync::atomic::Ordering::Relaxed);
    // the arena is the mapping a small block lies in (mimalloc does not name its arenas)
    // SAFETY: a block of mimalloc's own, freed below; only its address is used
    let probe = unsafe { mi::mi_malloc(64) };
    if let Some((start, end)) = anonymous_mapping_holding(probe as usize) {
        // SAFETY: advice on a private anonymous mapping of this process (the arena) changes
        // how its future faults are served, never what it holds
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
    // SAFETY: allocated above by mimalloc, not used after
    unsafe { mi::mi_free(probe) };
}

/// `STEWARD_HUGE_PAGES=off` (or `0`).
fn huge_pages_turned_off() -> bool {
    std::env::var("STEWARD_HUGE_PAGES").is_ok_and(|v| v == "off" || v == "0")
}

/// The bounds of the private anonymous mapping of this process that holds `addr`, from
/// `/proc/self/maps` (`None`: none, or not readable).
fn anonymous_mapping_holding(addr: usize) -> Option<(usize, usize)> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines().find_map(|line| {
        // "start-end perms offset dev inode [path]": anonymous has inode 0 and no path
        let mut fields = line.split_whitespace();
        let (start, end) = fields.next()?.split_once('-')?;
        let (start, end) = (
            usize::from_str_radix(start, 16).ok()?,
            usize::from_str_radix(end, 16).ok()?,
        );
        let perms = fields.next()?;
        let inode = fields.nth(2)?;
        let anonymous = perms.starts_with("rw") && perms.ends_with('p') && inode == "0";
        (anonymous && fields.next().is_none() && (start..end).contains(&addr))
            .then_some((start, end))
    })
}

/// No transparent huge pages for this process from now on, whatever the allocator asked for
/// (`PR_SET_THP_DISABLE`, checked by the kernel at each page fault): for a command that runs
/// for a moment, clearing (and compacting memory for) 2 MiB at a time costs more than the
/// fewer page faults gain. Inherited by the children it starts.
pub fn no_huge_pages_for_this_process() {
    // SAFETY: prctl with these arguments only sets a flag of the calling process; failing
    // (an old kernel) leaves huge pages as they were, which is correct, only slower
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}

/// The allocator of the `steward` binary (and of the benchmarks, which measure what it does).
pub struct Allocator;

/// The page size mapping lengths are rounded to: 4 KiB on the platforms we build for (any
/// multiple of the real page size is correct, so no `sysconf` per call).
const PAGE: usize = 4096;

fn mapping_len(size: usize) -> usize {
    (size + PAGE - 1) & !(PAGE - 1)
}

fn is_mapped(layout: &Layout) -> bool {
    // a mapping is aligned to a page; larger alignments stay with mimalloc
    layout.size() >= MAPPED_FROM && layout.align() <= PAGE
}

unsafe fn map(size: usize) -> *mut u8 {
    // SAFETY: an anonymous private mapping has no preconditions; failure is MAP_FAILED
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            mapping_len(size),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        ptr::null_mut()
    } else {
        if HUGE_MAPPINGS.load(std::sync::atomic::Ordering::Relaxed) {
            // SAFETY: advice on the mapping just made (see `huge_pages_for_this_process`)
            unsafe { libc::madvise(p, mapping_len(size), libc::MADV_HUGEPAGE) };
        }
        p.cast()
    }
}

unsafe fn unmap(p: *mut u8, size: usize) {
    // SAFETY: the caller passes a mapping made by `map`/`remap` for this size
    unsafe { libc::munmap(p.cast(), mapping_len(size)) };
}

use libmimalloc_sys as mi;

unsafe impl GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if is_mapped(&layout) {
            unsafe { map(layout.size()) }
        } else if layout.align() <= WORD {
            unsafe { mi::mi_malloc(layout.size()).cast() }
        } else {
            unsafe { mi::mi_malloc_aligned(layout.size(), layout.align()).cast() }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if is_mapped(&layout) {
            // fresh anonymous pages read as zero
            unsafe { map(layout.size()) }
        } else if layout.align() <= WORD {
            unsafe { mi::mi_zalloc(layout.size()).cast() }
        } else {
            unsafe { mi::mi_zalloc_aligned(layout.size(), layout.align()).cast() }
        }
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        if is_mapped(&layout) {
            unsafe { unmap(p, layout.size()) }
        } else {
            unsafe { mi::mi_free(p.cast()) }
        }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY (for the layout): GlobalAlloc::realloc promises `new_size`, rounded up to
        // the alignment, does not overflow isize
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (is_mapped(&layout), is_mapped(&new_layout)) {
            (false, false) if layout.align() <= WORD => unsafe {
                mi::mi_realloc(p.cast(), new_size).cast()
            },
            (false, false) => unsafe {
                mi::mi_realloc_aligned(p.cast(), new_size, layout.align()).cast()
            },
            (true, true) => {
                let (old_len, new_len) = (mapping_len(layout.size()), mapping_len(new_size));
                if old_len == new_len {
                    return p;
                }
                // SAFETY: `p` is a mapping of `old_len` bytes; MAYMOVE lets the kernel move
                // its pages to a free range, without copying them
                let q = unsafe { libc::mremap(p.cast(), old_len, new_len, libc::MREMAP_MAYMOVE) };
                if q == libc::MAP_FAILED {
                    ptr::null_mut()
                } else {
                    q.cast()
                }
            }
            // crossing the threshold: the other allocator takes the block over, once
            _ => unsafe {
                let q = self.alloc(new_layout);
                if !q.is_null() {
                    ptr::copy_nonoverlapping(p, q, layout.size().min(new_size));
                    self.dealloc(p, layout);
                }
                q
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every path between the two allocators keeps the bytes, in both directions, and a
    /// mapped block grown with `mremap` reads back what was written before it moved.
    #[test]
    fn blocks_keep_their_bytes_across_the_threshold_and_mremap() {
        let a = Allocator;
        let fill = |p: *mut u8, n: usize| {
            for i in (0..n).step_by(4093) {
                unsafe { *p.add(i) = (i % 251) as u8 };
            }
        };
        let check = |p: *mut u8, n: usize| {
            for i in (0..n).step_by(4093) {
                assert_eq!(unsafe { *p.add(i) }, (i % 251) as u8, "byte {i}");
            }
        };
        unsafe {
            let small = 1 << 20;
            let layout = Layout::from_size_align(small, 8).unwrap();
            let p = a.alloc(layout);
            assert!(!p.is_null());
            fill(p, small);
            // small -> mapped
            let big = MAPPED_FROM + 12345;
            let p = a.realloc(p, layout, big);
            assert!(!p.is_null());
            check(p, small);
            fill(p, big);
            // mapped -> bigger mapped (mremap)
            let layout = Layout::from_size_align(big, 8).unwrap();
            let bigger = 64 << 20;
            let p = a.realloc(p, layout, bigger);
            assert!(!p.is_null());
            check(p, big);
            fill(p, bigger);
            // mapped -> small again
            let layout = Layout::from_size_align(bigger, 8).unwrap();
            let p = a.realloc(p, layout, small);
            assert!(!p.is_null());
            check(p, small);
            a.dealloc(p, Layout::from_size_align(small, 8).unwrap());

            // a zeroed mapped block reads as zero
            let layout = Layout::from_size_align(MAPPED_FROM, 16).unwrap();
            let z = a.alloc_zeroed(layout);
            assert!(!z.is_null());
            assert!((0..MAPPED_FROM).step_by(4096).all(|i| *z.add(i) == 0));
            a.dealloc(z, layout);

            // small blocks: word-aligned ones through the plain entry points, larger
            // alignments through the aligned ones, also when reallocated
            for (size, align) in [(3, 1), (24, 8), (24, 16), (40, 32), (100, 64)] {
                let layout = Layout::from_size_align(size, align).unwrap();
                let p = a.alloc(layout);
                assert!(
                    !p.is_null() && (p as usize).is_multiple_of(align),
                    "{size} {align}"
                );
                *p = 7;
                let p = a.realloc(p, layout, size * 100);
                assert!(
                    !p.is_null() && (p as usize).is_multiple_of(align),
                    "{size} {align}"
                );
                assert_eq!(*p, 7);
                a.dealloc(p, Layout::from_size_align(size * 100, align).unwrap());
            }

            // an alignment past a page stays with mimalloc, also when large
            let layout = Layout::from_size_align(MAPPED_FROM, 1 << 16).unwrap();
            let p = a.alloc(layout);
            assert!(!p.is_null());
            assert_eq!(p as usize % (1 << 16), 0);
            a.dealloc(p, layout);
        }
    }

    /// Which pages of `[from, to)` are in memory (`mincore`), as a count.
    fn resident_pages(from: usize, to: usize) -> usize {
        let pages = (to - from) / PAGE;
        let mut vec = vec![0u8; pages];
        // SAFETY: `from` is page aligned and the range is mapped (a vector's capacity);
        // `vec` has one byte per page
        let rc = unsafe { libc::mincore(from as *mut libc::c_void, to - from, vec.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        vec.iter().filter(|b| **b & 1 == 1).count()
    }

    /// A vector that uses [`Ahead`] has the pages past its end populated by the other
    /// thread before it writes them, and none further than [`AHEAD`] past its end: the
    /// memory it costs is bounded. This reads the kernel's view of the pages (`mincore`);
    /// the process's allocator here is the system's, which maps a block this large apart
    /// too (after a header of its own).
    #[test]
    fn ahead_populates_past_the_end_and_no_further() {
        // SAFETY: a fresh anonymous page, populated and unmapped again
        let supported = unsafe {
            let p = map(PAGE);
            assert!(!p.is_null());
            let rc = libc::madvise(p.cast(), PAGE, MADV_POPULATE_WRITE);
            unmap(p, PAGE);
            rc == 0
        };
        if !supported {
            eprintln!("SKIPPED: this kernel has no MADV_POPULATE_WRITE (Linux 5.14 or later)");
            return;
        }
        no_huge_pages_for_this_process();
        populate_ahead_for_this_process();
        let up = |a: usize| (a + PAGE - 1) & !(PAGE - 1);
        let down = |a: usize| a & !(PAGE - 1);
        let capacity = 16 << 20;
        let mut v: Vec<u8> = Vec::with_capacity(capacity);
        let base = v.as_ptr() as usize;
        let mut ahead = Ahead::default();
        for i in 0..(2 << 20) {
            v.push(i as u8);
            ahead.after_push(&v);
        }
        let end = base + v.len();
        let written = (down(end) - up(base)) / PAGE;
        assert_eq!(
            resident_pages(up(base), down(end)),
            written,
            "written pages"
        );
        // half of AHEAD past the end is always asked for
        let (front, half) = (up(end), down(end + AHEAD / 2));
        let want = (half - front) / PAGE;
        assert!(want > 0);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while resident_pages(front, half) < want {
            assert!(
                std::time::Instant::now() < deadline,
                "after 10 s, {} of the {want} pages past the end are populated",
                resident_pages(front, half)
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(
            resident_pages(up(end + AHEAD), down(base + capacity)),
            0,
            "pages further than AHEAD past the end"
        );
    }

    /// The advice lands where the heap's blocks are: the mapping a mimalloc block lies in
    /// is found, and the kernel reports it as advised (`hg` in its `VmFlags`).
    #[test]
    fn the_heaps_arena_is_advised_huge_pages() {
        if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists() {
            eprintln!("skipped: this kernel has no transparent huge pages");
            return;
        }
        if huge_pages_turned_off() {
            eprintln!("skipped: STEWARD_HUGE_PAGES turns the advice off");
            return;
        }
        huge_pages_for_this_process();
        let block = unsafe { mi::mi_malloc(64) };
        let (start, end) = anonymous_mapping_holding(block as usize).expect("the arena");
        unsafe { mi::mi_free(block) };
        assert!(end - start >= 2 << 20, "an arena, not a small mapping");
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let head = format!("{start:x}-{end:x} ");
        let flags = smaps
            .split_inclusive('\n')
            .skip_while(|l| !l.starts_with(&head))
            .find(|l| l.starts_with("VmFlags:"))
            .expect("the arena's flags");
        assert!(
            flags.split_whitespace().any(|f| f == "hg"),
            "not advised: {flags}"
        );
        // the program's code is a file's mapping, not the heap's
        let code = anonymous_mapping_holding as fn(usize) -> _ as usize;
        assert_eq!(anonymous_mapping_holding(code), None);
    }
}

//! The binary's allocator: the system's, with its large blocks (a layer's
//! weights, a GEMM's output, a converted tensor: [`LARGE`] bytes and up)
//! asked of Linux on transparent huge pages (`MADV_HUGEPAGE`, honoured when
//! `/sys/kernel/mm/transparent_hugepage/enabled` is `always` or `madvise`).
//! A sweep over a 27B checkpoint allocates and fills tens of GiB of fresh
//! blocks; on 4 KiB pages each one costs a page fault (zeroing, a cgroup
//! charge, page-table locks: a sixth of a 27B `triage`'s CPU time in
//! `perf`), on 2 MiB pages one fault per 512 of them. Only where pages
//! come from changes: no value does.

use std::alloc::{GlobalAlloc, Layout, System};

/// Blocks from this size up are advised onto huge pages.
pub const LARGE: usize = 8 << 20;

/// A transparent huge page (x86-64, aarch64 with 4 KiB base pages).
const HUGE: usize = 2 << 20;

/// The system allocator, large blocks on transparent huge pages.
pub struct LargePages;

// SAFETY: every call is the system allocator's; the advice only tells the
// kernel how to back pages of a block this allocator just handed out.
unsafe impl GlobalAlloc for LargePages {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as the caller's contract for `alloc`.
        let p = unsafe { System.alloc(layout) };
        advise(p, layout.size());
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as the caller's contract for `alloc_zeroed`.
        let p = unsafe { System.alloc_zeroed(layout) };
        advise(p, layout.size());
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        // SAFETY: as the caller's contract for `dealloc`.
        unsafe { System.dealloc(p, layout) }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as the caller's contract for `realloc`.
        let q = unsafe { System.realloc(p, layout, new_size) };
        advise(q, new_size);
        q
    }
}

/// glibc returns every freed block above its mmap threshold to the kernel,
/// and trims the heap's top above twice that, so each op's fresh output of a
/// few MiB faults in zeroed pages again (a tenth of a bf16 compare's time in
/// `perf`). Blocks up to 32 MiB (glibc's largest dynamic threshold) come from
/// the heap and freed memory is kept for reuse up to 512 MiB; layer weights
/// (larger) are still mapped and returned, so the streamed peak stays one
/// layer's. No value changes. (Taking every block from the heap,
/// `M_MMAP_MAX` 0, made a 4096-token dump 8 % faster but raised the 27B
/// layout's peaks: `compare` 0.84 -> 0.99 GiB, and `triage` reached 8.01 GiB;
/// docs/performance.md.) The binary calls this at start-up; the benchmarks
/// that time its allocations call it too.
pub fn reuse_freed_buffers() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters (glibc takes its arena
    // lock); the binary calls this before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 512 << 20);
    }
}

/// `o` as the f32 values written into it: for buffers filled in place of
/// being zeroed first (`Vec::spare_capacity_mut`).
///
/// # Safety
/// Every value of `o` is written.
pub(crate) unsafe fn assume_init(o: &mut [std::mem::MaybeUninit<f32>]) -> &mut [f32] {
    // SAFETY: MaybeUninit<f32> has f32's layout; the caller wrote every value.
    unsafe { &mut *(o as *mut [std::mem::MaybeUninit<f32>] as *mut [f32]) }
}

/// The whole huge pages inside `[p, p + len)`: `(start, len)`, `None` for a
/// block under [`LARGE`] or holding no whole huge page.
pub fn huge_span(p: usize, len: usize) -> Option<(usize, usize)> {
    if len < LARGE {
        return None;
    }
    let start = p.checked_next_multiple_of(HUGE)?;
    let end = p.checked_add(len)? / HUGE * HUGE;
    (end > start).then(|| (start, end - start))
}

/// Advises the huge pages of block `p` of `len` bytes (best effort).
fn advise(p: *mut u8, len: usize) {
    #[cfg(target_os = "linux")]
    if let Some((start, n)) = (!p.is_null()).then(|| huge_span(p as usize, len)).flatten() {
        // SAFETY: `[start, start + n)` lies inside a block just allocated;
        // MADV_HUGEPAGE changes how its pages are backed, not their contents.
        unsafe {
            libc::madvise(start as *mut libc::c_void, n, libc::MADV_HUGEPAGE);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (p, len);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_span_is_the_whole_huge_pages_inside_a_large_block() {
        let mb = 1 << 20;
        assert_eq!(huge_span(0x1000, LARGE - 1), None, "under LARGE");
        // 16 B past a 4 KiB page (glibc's mapped blocks): the first and last
        // partial huge pages are left out.
        let p = 7 * HUGE + 4096 + 16;
        assert_eq!(huge_span(p, 9 * mb), Some((8 * HUGE, 3 * HUGE)));
        assert_eq!(huge_span(8 * HUGE, LARGE), Some((8 * HUGE, LARGE)));
        assert_eq!(huge_span(usize::MAX - mb, LARGE), None, "no overflow");
    }

    /// The allocator's own calls: a large block advised, written, grown and
    /// shrunk across the threshold (its contents kept), zeroed, freed.
    #[test]
    fn large_blocks_keep_their_contents_through_realloc() {
        let a = LargePages;
        let layout = Layout::from_size_align(LARGE + 4096, 64).unwrap();
        let big = Layout::from_size_align(3 * LARGE, 64).unwrap();
        let small = Layout::from_size_align(4096, 64).unwrap();
        let byte = |i: usize| (i % 251) as u8;
        // SAFETY: non-zero layouts; every pointer is checked, used within
        // its block and freed once with the layout it has.
        unsafe {
            let p = a.alloc(layout);
            assert!(!p.is_null());
            (0..layout.size()).for_each(|i| *p.add(i) = byte(i));
            let q = a.realloc(p, layout, big.size());
            assert!(!q.is_null());
            assert!((0..layout.size()).all(|i| *q.add(i) == byte(i)));
            let r = a.realloc(q, big, small.size());
            assert!(!r.is_null());
            assert!((0..small.size()).all(|i| *r.add(i) == byte(i)));
            a.dealloc(r, small);
            let z = a.alloc_zeroed(big);
            assert!(!z.is_null());
            assert!((0..big.size()).step_by(4093).all(|i| *z.add(i) == 0));
            a.dealloc(z, big);
        }
    }
}

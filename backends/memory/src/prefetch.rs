//! Asking the CPU to start loading a value's cache lines, without waiting.
//!
//! Why: a decision under a plan reads two tables of many entries, the plan
//! cache's and the store's, and each read is a cache miss when keys are
//! many and visited at random. Started before the plan is looked up, the
//! store's miss overlaps the plan cache's instead of following it
//! (docs/benchmarks.md, "The store's entry fetched while the plan is found").

/// Start loading every cache line `value` spans. A hint: nothing waits for
/// it, and on a target without a prefetch instruction it does nothing.
#[inline]
pub(crate) fn lines_of<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        const LINE: usize = 64;
        let start = (value as *const T).cast::<i8>();
        let size = std::mem::size_of::<T>().max(1);
        // The lines of the first and the last byte, and any between.
        let first = start as usize / LINE;
        let last = (start as usize + size - 1) / LINE;
        for line in 0..=(last - first) {
            let at = start.wrapping_add(line * LINE);
            // SAFETY: `_mm_prefetch` is `unsafe` only for its target
            // feature, SSE, which is in the x86_64 baseline: every CPU
            // this code runs on has it. The instruction is a hint: it
            // changes no memory and no register the program reads, and it
            // never faults, whatever the address (`wrapping_add` makes
            // no claim that `at` is in bounds either).
            #[allow(unsafe_code)]
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(at);
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hint on values of any size and alignment reads back nothing
    /// changed (and does not fault past the value's end).
    #[test]
    fn a_prefetch_changes_nothing() {
        let small = 7u8;
        let large = [3u64; 40];
        let empty = ();
        lines_of(&small);
        lines_of(&large);
        lines_of(&empty);
        lines_of(&large[39]);
        assert_eq!(small, 7);
        assert!(large.iter().all(|&x| x == 3));
    }
}

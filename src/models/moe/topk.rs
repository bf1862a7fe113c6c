//! `torch.topk(values, k, largest=True, sorted=True)` on CPU, ported so that
//! tied values come out in torch's order: `aten/src/ATen/native/TopKImpl.h::topk_impl_loop`
//! calls libstdc++'s `std::partial_sort` or `std::nth_element` + `std::sort`
//! (`bits/stl_heap.h`, `bits/stl_algo.h`), which are not stable; this file
//! performs the same comparisons and swaps (`docs/moe.md`, "Top-k ties").

type Elem = (f32, usize);

/// `TopKImpl.h`'s comparator for `largest=True`: NaN before numbers, then
/// greater values first; the index is never compared.
#[inline]
fn comp(x: &Elem, y: &Elem) -> bool {
    (x.0.is_nan() && !y.0.is_nan()) || x.0 > y.0
}

fn lg(n: usize) -> usize {
    (usize::BITS - 1 - n.leading_zeros()) as usize
}

// The libstdc++ algorithms (bits/stl_heap.h, bits/stl_algo.h) that
// `std::partial_sort`, `std::nth_element` and `std::sort` expand to, on
// `a[first..last]`, with the exact comparison sequence: torch's tie order is
// whatever this sequence produces.

fn push_heap(a: &mut [Elem], f: usize, mut hole: usize, top: usize, val: Elem) {
    let mut parent = hole.wrapping_sub(1) / 2;
    while hole > top && comp(&a[f + parent], &val) {
        a[f + hole] = a[f + parent];
        hole = parent;
        parent = hole.wrapping_sub(1) / 2;
    }
    a[f + hole] = val;
}

fn adjust_heap(a: &mut [Elem], f: usize, mut hole: usize, len: usize, val: Elem) {
    let top = hole;
    let mut sc = hole;
    while len >= 1 && sc < (len - 1) / 2 {
        sc = 2 * (sc + 1);
        if comp(&a[f + sc], &a[f + sc - 1]) {
            sc -= 1;
        }
        a[f + hole] = a[f + sc];
        hole = sc;
    }
    if len & 1 == 0 && len >= 2 && sc == (len - 2) / 2 {
        sc = 2 * (sc + 1);
        a[f + hole] = a[f + sc - 1];
        hole = sc - 1;
    }
    push_heap(a, f, hole, top, val);
}

fn make_heap(a: &mut [Elem], f: usize, l: usize) {
    let len = l - f;
    if len < 2 {
        return;
    }
    let mut parent = (len - 2) / 2;
    loop {
        let v = a[f + parent];
        adjust_heap(a, f, parent, len, v);
        if parent == 0 {
            return;
        }
        parent -= 1;
    }
}

fn pop_heap(a: &mut [Elem], f: usize, l: usize, result: usize) {
    let v = a[result];
    a[result] = a[f];
    adjust_heap(a, f, 0, l - f, v);
}

fn heap_select(a: &mut [Elem], f: usize, m: usize, l: usize) {
    make_heap(a, f, m);
    for i in m..l {
        if comp(&a[i], &a[f]) {
            pop_heap(a, f, m, i);
        }
    }
}

fn sort_heap(a: &mut [Elem], f: usize, mut l: usize) {
    while l - f > 1 {
        l -= 1;
        pop_heap(a, f, l, l);
    }
}

fn partial_sort(a: &mut [Elem], f: usize, m: usize, l: usize) {
    heap_select(a, f, m, l);
    sort_heap(a, f, m);
}

fn move_median_to_first(a: &mut [Elem], r: usize, x: usize, y: usize, z: usize) {
    if comp(&a[x], &a[y]) {
        if comp(&a[y], &a[z]) {
            a.swap(r, y);
        } else if comp(&a[x], &a[z]) {
            a.swap(r, z);
        } else {
            a.swap(r, x);
        }
    } else if comp(&a[x], &a[z]) {
        a.swap(r, x);
    } else if comp(&a[y], &a[z]) {
        a.swap(r, z);
    } else {
        a.swap(r, y);
    }
}

fn unguarded_partition(a: &mut [Elem], mut f: usize, mut l: usize, pivot: usize) -> usize {
    loop {
        while comp(&a[f], &a[pivot]) {
            f += 1;
        }
        l -= 1;
        while comp(&a[pivot], &a[l]) {
            l -= 1;
        }
        if f >= l {
            return f;
        }
        a.swap(f, l);
        f += 1;
    }
}

fn unguarded_partition_pivot(a: &mut [Elem], f: usize, l: usize) -> usize {
    let mid = f + (l - f) / 2;
    move_median_to_first(a, f, f + 1, mid, l - 1);
    unguarded_partition(a, f + 1, l, f)
}

fn unguarded_linear_insert(a: &mut [Elem], mut last: usize) {
    let val = a[last];
    let mut next = last - 1;
    while comp(&val, &a[next]) {
        a[last] = a[next];
        last = next;
        next -= 1;
    }
    a[last] = val;
}

fn insertion_sort(a: &mut [Elem], f: usize, l: usize) {
    if f == l {
        return;
    }
    for i in f + 1..l {
        if comp(&a[i], &a[f]) {
            let val = a[i];
            a.copy_within(f..i, f + 1);
            a[f] = val;
        } else {
            unguarded_linear_insert(a, i);
        }
    }
}

fn nth_element(a: &mut [Elem], mut f: usize, nth: usize, mut l: usize) {
    if f == l || nth == l {
        return;
    }
    let mut depth = lg(l - f) * 2;
    while l - f > 3 {
        if depth == 0 {
            heap_select(a, f, nth + 1, l);
            a.swap(f, nth);
            return;
        }
        depth -= 1;
        let cut = unguarded_partition_pivot(a, f, l);
        if cut <= nth {
            f = cut;
        } else {
            l = cut;
        }
    }
    insertion_sort(a, f, l);
}

fn introsort_loop(a: &mut [Elem], f: usize, mut l: usize, mut depth: usize) {
    while l - f > 16 {
        if depth == 0 {
            partial_sort(a, f, l, l);
            return;
        }
        depth -= 1;
        let cut = unguarded_partition_pivot(a, f, l);
        introsort_loop(a, cut, l, depth);
        l = cut;
    }
}

fn std_sort(a: &mut [Elem], f: usize, l: usize) {
    if f == l {
        return;
    }
    introsort_loop(a, f, l, lg(l - f) * 2);
    if l - f > 16 {
        insertion_sort(a, f, f + 16);
        for i in f + 16..l {
            unguarded_linear_insert(a, i);
        }
    } else {
        insertion_sort(a, f, l);
    }
}

/// `torch.topk(values, k, largest=True, sorted=True).indices` of one row, as
/// torch computes it on CPU (`aten/src/ATen/native/TopKImpl.h::topk_impl_loop`):
/// `(value, index)` pairs compared by value only (NaN largest), then with
/// libstdc++ `std::partial_sort(first k)` when `k · 64 <= n`, else
/// `std::nth_element(k-1)` followed by `std::sort` of the first `k-1`.
/// Neither is stable, so tied values come out in an order that depends on
/// `n`, `k` and the whole row (not lowest-index-first); this port performs
/// the same comparisons and swaps and so returns the same indices
/// (`tests/moe_block.rs` checks it on tie-heavy rows recorded from torch).
///
/// `k` is clamped to `values.len()`; `k = 0` gives an empty result.
pub fn topk_torch_cpu(values: &[f32], k: usize) -> Vec<usize> {
    let n = values.len();
    let k = k.min(n);
    if k == 0 {
        return Vec::new();
    }
    let mut a: Vec<Elem> = values.iter().copied().zip(0..).collect();
    if k * 64 <= n {
        partial_sort(&mut a, 0, k, n);
    } else {
        nth_element(&mut a, 0, k - 1, n);
        std_sort(&mut a, 0, k - 1);
    }
    a[..k].iter().map(|&(_, i)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topk_distinct_values_sorted_descending() {
        let v = [0.1f32, 0.7, 0.3, 0.9, 0.5, 0.2, 0.8, 0.4];
        assert_eq!(topk_torch_cpu(&v, 3), [3, 6, 1]);
        let big: Vec<f32> = (0..300).map(|i| ((i * 37) % 300) as f32).collect();
        let got = topk_torch_cpu(&big, 4);
        let want: Vec<usize> = (296..300)
            .rev()
            .map(|x| big.iter().position(|&y| y == x as f32).unwrap())
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn topk_ties_follow_libstdcxx_not_lowest_index() {
        // torch.topk(torch.zeros(1, n), k) on CPU (fixtures/moe/block/facts.json)
        assert_eq!(topk_torch_cpu(&[0.0; 8], 3), [6, 5, 4]);
        assert_eq!(topk_torch_cpu(&[0.0; 16], 4), [10, 11, 12, 9]);
        assert_eq!(
            topk_torch_cpu(&[0.0; 256], 8),
            [172, 169, 170, 171, 174, 175, 168, 173]
        );
        assert_eq!(topk_torch_cpu(&[0.0; 512], 8), [7, 4, 1, 3, 5, 0, 2, 6]);
        let mut nan = [1.0f32; 8];
        nan[2] = f32::NAN;
        assert_eq!(topk_torch_cpu(&nan, 1), [2]);
    }
}

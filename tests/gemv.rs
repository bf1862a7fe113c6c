//! Many single-row products at once (`models::layers::gemv`) give, row for
//! row, the bits of candle's product of that row alone — f32 weights and
//! bf16 pairs, every part of the single-row route's order (64-value blocks,
//! 8-value groups, the scalar tail, none of some) — and
//! `Matrix::linear_each_row` (and `Matrix::linear` on one row) give candle's
//! bits row by row on every shape, the ones the kernel does not take included.

mod common;

use common::{bits, matrix};

use candle_core::Tensor;
use hsparity::models::layers::bf16_gemm::{self, Pairs};
use hsparity::models::layers::{gemv, linear, Matrix};
use hsparity::precision::Precision;

/// Row by row, as a decode step computes it: `x_r.matmul(&w.t())`.
fn one_by_one(x: &Tensor, w: &Tensor) -> Tensor {
    let rows: Vec<Tensor> = (0..x.dim(0).unwrap())
        .map(|r| x.narrow(0, r, 1).unwrap().matmul(&w.t().unwrap()).unwrap())
        .collect();
    Tensor::cat(&rows, 0).unwrap()
}

/// `(s, n, k)` the kernel takes.
const TAKEN: &[(usize, usize, usize)] = &[
    (2, 257, 3),     // k just above gevv's, n just above the horizontal kernel's
    (7, 300, 63),    // no 64-value block: 8-value groups and a tail only
    (5, 1024, 1024), // blocks only (the mid checkpoint's projections)
    (8, 513, 1069),  // blocks, groups and an odd tail
    (3, 600, 1096),  // blocks, then one group and no tail
];

#[test]
fn each_row_has_the_bits_of_its_own_product() {
    if !gemv::reproduces(1024, 1024) {
        eprintln!("skipped: this CPU has no AVX-512F (steps run candle's product row by row)");
        return;
    }
    for &(s, n, k) in TAKEN {
        let x = matrix(s, k, 3 + k as u64, false);
        for bf16 in [false, true] {
            let w = matrix(n, k, 11 + n as u64, bf16);
            let want = one_by_one(&x, &w);
            let wv = w.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let got = if bf16 {
                gemv::rows_times(&x, gemv::Weight::Bf16(&Pairs::of(&w).unwrap())).unwrap()
            } else {
                gemv::rows_times(&x, gemv::Weight::F32(&wv)).unwrap()
            };
            assert!(
                bits(&got) == bits(&want),
                "[{s}, {n}, {k}] bf16 {bf16}: rows differ from their own products"
            );
        }
    }
}

#[test]
fn shapes_off_the_single_row_route_are_refused() {
    let x = matrix(3, 64, 1, false);
    let small = matrix(256, 64, 2, false).flatten_all().unwrap();
    let small = small.to_vec1::<f32>().unwrap();
    assert!(
        !gemv::reproduces(256, 64),
        "n <= 256: the horizontal kernel"
    );
    assert!(!gemv::reproduces(1024, 2), "k <= 2: gevv");
    assert!(gemv::rows_times(&x, gemv::Weight::F32(&small)).is_err());
    if !gemv::reproduces(300, 64) {
        return;
    }
    let w = matrix(300, 64, 3, false).flatten_all().unwrap();
    let w = w.to_vec1::<f32>().unwrap();
    assert!(
        gemv::rows_times(&x, gemv::Weight::F32(&w[..w.len() - 5])).is_err(),
        "values that do not fill whole rows"
    );
    let strided = matrix(64, 3, 4, false).t().unwrap();
    assert!(
        gemv::rows_times(&strided, gemv::Weight::F32(&w)).is_err(),
        "rows whose values are not adjacent take candle's blocked route"
    );
    let none = gemv::rows_times(&x.narrow(0, 0, 0).unwrap(), gemv::Weight::F32(&w)).unwrap();
    assert_eq!(none.dims(), &[0, 300]);
}

/// Rows whose values are not adjacent (a transposed input) go row by row
/// through candle, whose single-row product of such a row is its blocked
/// route: the same bits as candle's.
#[test]
fn a_strided_input_gives_candles_bits_row_by_row() {
    let x = matrix(200, 3, 9, false).t().unwrap();
    let w = matrix(300, 200, 10, false);
    let m = Matrix::new(w.clone()).unwrap();
    let got = m.linear_each_row(&x, Precision::F32).unwrap();
    assert!(bits(&got) == bits(&one_by_one(&x, &w)));
}

#[test]
fn linear_each_row_gives_linear_row_by_row_on_every_shape() {
    let shapes = [(4, 1024, 1024), (3, 200, 64), (1, 512, 512), (6, 300, 2)];
    for (s, n, k) in shapes {
        let x = matrix(s, k, 5 + s as u64, true);
        for prec in [Precision::F32, Precision::Bf16] {
            let w = matrix(n, k, 17 + k as u64, true);
            let m = Matrix::of_param(w.clone(), prec, false).unwrap();
            // candle's product of each row alone, rounded.
            let want: Vec<Tensor> = (0..s)
                .map(|r| linear(&x.narrow(0, r, 1).unwrap(), &w, prec).unwrap())
                .collect();
            let want = Tensor::cat(&want, 0).unwrap();
            let got = m.linear_each_row(&x, prec).unwrap();
            assert!(
                bits(&got) == bits(&want),
                "[{s}, {n}, {k}] {prec:?}: linear_each_row differs from candle row by row \
                 (bf16 kernel available: {})",
                bf16_gemm::available()
            );
            let one = m.linear(&x.narrow(0, 0, 1).unwrap(), prec).unwrap();
            assert!(
                bits(&one) == bits(&want.narrow(0, 0, 1).unwrap()),
                "[1, {n}, {k}] {prec:?}: Matrix::linear on one row differs from candle"
            );
        }
    }
}

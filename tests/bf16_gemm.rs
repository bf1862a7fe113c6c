//! The bf16 dot-product matmul (`models::layers::bf16_gemm`) gives candle's
//! f32 GEMM bits on the widened values for every shape it takes — one and
//! several k-blocks, odd K, the small-size block rule, every tile remainder
//! — and `Matrix::linear` gives `linear`'s bits for every shape (the kernel
//! where it is exact, the f32 GEMM elsewhere). Where the CPU lacks the
//! instruction the weights stay f32 (`bf16_gemm::available` is false).

mod common;

use common::{bits, matrix, BLOCKED_SHAPES};

use hsparity::models::layers::{bf16_gemm, linear, Matrix};
use hsparity::precision::Precision;

/// Bit for bit candle's `x.matmul(&w.t())` on the same values.
#[test]
fn the_kernel_gives_the_bits_of_the_f32_gemm() {
    if !bf16_gemm::available() {
        eprintln!(
            "skipped: this CPU has no AVX512-BF16 (weights stay f32, linear keeps candle's GEMM)"
        );
        return;
    }
    for &(m, n, k) in BLOCKED_SHAPES {
        assert!(
            bf16_gemm::exact_for(m, n, k).is_some(),
            "[{m}, {n}, {k}] is taken"
        );
        let (x, w) = (
            matrix(m, k, 1 + m as u64, true),
            matrix(n, k, 7 + k as u64, true),
        );
        let pairs = bf16_gemm::Pairs::of(&w).unwrap();
        let got = bf16_gemm::matmul_nt(&x, &pairs)
            .unwrap()
            .expect("bf16 inputs");
        let want = x.matmul(&w.t().unwrap()).unwrap();
        assert!(
            bits(&got) == bits(&want),
            "[{m}, {k}] x [{n}, {k}]: bits differ from the f32 GEMM"
        );
        assert!(
            bits(&pairs.widen().unwrap()) == bits(&w),
            "[{n}, {k}]: widening is exact"
        );
    }
}

/// `Matrix::linear` equals `linear` on the f32 weight for the kernel's
/// shapes and for those it leaves to the f32 GEMM (one row, one column,
/// `m·n <= 256`, `k <= 2`), in bf16 and f32.
#[test]
fn a_bf16_matrix_gives_the_bits_of_linear_on_every_shape() {
    let others = [
        (1, 300, 64),
        (300, 1, 64),
        (8, 30, 64),
        (50, 50, 2),
        (1, 3072, 1024),
    ];
    for &(m, n, k) in BLOCKED_SHAPES.iter().chain(&others) {
        let (x, w) = (
            matrix(m, k, 3 + n as u64, true),
            matrix(n, k, 5 + m as u64, true),
        );
        for prec in [Precision::Bf16, Precision::F32] {
            let want = linear(&x, &w, prec).unwrap();
            let plain = Matrix::new(w.clone()).unwrap();
            assert!(bits(&plain.linear(&x, prec).unwrap()) == bits(&want));
            if bf16_gemm::available() {
                let packed = Matrix::bf16(&w).unwrap();
                assert!(
                    bits(&packed.linear(&x, prec).unwrap()) == bits(&want),
                    "[{m}, {k}] x [{n}, {k}] {prec:?}: bits differ from linear"
                );
            }
        }
    }
}

/// Inputs that are not bf16 values take the f32 GEMM (never rounded
/// silently); weights that are not bf16 values and misfit shapes are refused.
#[test]
fn refuses_what_it_cannot_compute_exactly() {
    let w = matrix(3, 8, 1, true);
    let x = (matrix(300, 8, 2, true) + 1e-3).unwrap(); // not bf16 values
    if bf16_gemm::available() {
        let pairs = bf16_gemm::Pairs::of(&w).unwrap();
        assert!(bf16_gemm::matmul_nt(&x, &pairs).unwrap().is_none());
        assert!(
            bf16_gemm::matmul_nt(&matrix(300, 9, 2, true), &pairs).is_err(),
            "shapes"
        );
        let packed = Matrix::bf16(&w).unwrap();
        let want = linear(&x, &w, Precision::Bf16).unwrap();
        assert!(bits(&packed.linear(&x, Precision::Bf16).unwrap()) == bits(&want));
    }
    assert!(bf16_gemm::Pairs::of(&(w + 1e-3).unwrap()).is_err());
    assert_eq!(bf16_gemm::exact_for(1, 300, 64), None);
    assert_eq!(bf16_gemm::exact_for(8, 30, 64), None);
    // A k-block of an odd number of values would split a pair: refused. Its
    // size depends on the L1 cache (gemm-common's kernel_params).
    for k in [1025, 1030, 2049, 3071] {
        let kc = gemm_common::cache::kernel_params(130, 70, k, 16, 6, 4).kc;
        let want = (kc.is_multiple_of(2) || kc >= k).then_some(kc);
        assert_eq!(bf16_gemm::exact_for(130, 70, k), want, "k = {k}, kc = {kc}");
    }
}

/// A checkpoint stored in bf16 gives its linear weights' pairs straight from
/// the mapped bytes, equal to the parameter `tensor_in` loads (widened back,
/// bit for bit), for every linear weight of the model; an f32 checkpoint
/// gives none (its values need rounding first).
#[test]
fn pairs_from_a_bf16_checkpoint_equal_the_loaded_parameter() {
    use hsparity::loading::{LoadingPath, WeightSource};
    use hsparity::session::Session;
    let dir = "fixtures/divergence/bf16-auto";
    let session = Session::open(&common::target(dir, None), &[LoadingPath::CausalLm]).unwrap();
    let view = &session.paths[0].view;
    let mut checked = 0;
    for l in 0..session.spec.num_layers() {
        for name in session.spec.layer_tensor_names(l) {
            let w = view.tensor_in(&name, Precision::Bf16).unwrap();
            let Some((dims, words)) = view.bf16_pairs(&name).unwrap() else {
                continue;
            };
            assert_eq!(&dims[..], w.dims(), "{name}");
            let pairs = bf16_gemm::Pairs::from_words(dims, words).unwrap();
            assert!(
                bits(&pairs.widen().unwrap()) == bits(&w),
                "{name}: pairs differ from the parameter"
            );
            checked += 1;
        }
    }
    assert!(checked >= 10, "only {checked} weights came as pairs");
    let f32_session = Session::open(
        &common::target("fixtures/tiny-qwen3_5", None),
        &[LoadingPath::CausalLm],
    )
    .unwrap();
    let f32_view = &f32_session.paths[0].view;
    let names = f32_session.spec.layer_tensor_names(0);
    let name = names
        .iter()
        .find(|n| f32_view.shape(n).is_some_and(|s| s.len() == 2))
        .unwrap();
    assert!(f32_view.bf16_pairs(name).unwrap().is_none(), "{name}");
}

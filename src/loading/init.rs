//! Values for the tensors transformers initialises because the checkpoint
//! lacks them (MISSING keys, a suspect's random lm_head): constant rules
//! directly, random rules from a counter-based generator so that any slice
//! of a tensor can be filled on its own, in parallel, in its storage dtype.
//!
//! The random values are hsparity's own (splitmix64; normals by Box-Muller
//! in f32, both values of each pair), not torch's `normal_` stream: what a
//! MISSING tensor emulates is the rule and scale of transformers'
//! `_init_weights`, and the run is reproducible under `--seed`.

use candle_core::{Device, Tensor};

use crate::error::{Error, Result};
use crate::loading::spec::InitRule;
use crate::precision::Precision;

/// Values for a missing tensor: constant rules directly; random rules from a
/// generator seeded by `seed` and the FNV-1a hash of `name` (splitmix64,
/// Box-Muller pairs in f32 for normals). The same values as [`init_tensor_in`] at f32.
///
/// Errors: a random rule without a seed ([`Error::Checkpoint`]).
pub fn init_tensor(
    name: &str,
    init: InitRule,
    shape: &[usize],
    seed: Option<u64>,
) -> Result<Tensor> {
    init_tensor_in(name, init, shape, seed, Precision::F32)
}

/// [`init_tensor`]'s values rounded to `prec` and held in `prec`'s dtype,
/// generated chunk by chunk straight into that storage (no f32 copy of the
/// whole tensor: a random 248k-row LM head is 2.5 GB in bf16, not 5 GB of
/// f32 on the way). The generator is counter-based, so every element is a
/// function of its index and the chunks are filled in parallel; the values
/// are bitwise those of `prec.round(init_tensor(..))`.
///
/// Errors: a random rule without a seed ([`Error::Checkpoint`]).
pub fn init_tensor_in(
    name: &str,
    init: InitRule,
    shape: &[usize],
    seed: Option<u64>,
    prec: Precision,
) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let dev = Device::Cpu;
    match init {
        InitRule::Zeros => return Ok(Tensor::zeros(shape, prec.dtype(), &dev)?),
        InitRule::Ones => return Ok(Tensor::ones(shape, prec.dtype(), &dev)?),
        _ => {}
    }
    let Some(seed) = seed else {
        return Err(Error::Checkpoint(format!(
            "tensor {name} is missing from the checkpoint; transformers would initialise it randomly \
             ({init}); pass a seed to emulate that"
        )));
    };
    let g = InitGenerator::new(name, init, seed);
    Ok(match prec {
        Precision::F32 => Tensor::from_vec(g.fill(n, |x| x), shape, &dev)?,
        Precision::Bf16 => Tensor::from_vec(g.fill(n, half::bf16::from_f32), shape, &dev)?,
        Precision::F16 => Tensor::from_vec(g.fill(n, half::f16::from_f32), shape, &dev)?,
    })
}

/// The random init rules' generator: element `i` of a tensor is a function
/// of `i` alone (splitmix64 over a counter), so any range can be filled
/// independently.
struct InitGenerator {
    base: u64,
    init: InitRule,
}

/// splitmix64's increment.
const GAMMA: u64 = 0x9e3779b97f4a7c15;

impl InitGenerator {
    fn new(name: &str, init: InitRule, seed: u64) -> Self {
        let mut h: u64 = 0xcbf29ce484222325;
        for b in name.bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
        Self {
            base: h ^ seed.wrapping_mul(GAMMA),
            init,
        }
    }

    /// The `k`-th draw (from 1), uniform in (0, 1).
    fn uniform(&self, k: u64) -> f64 {
        let mut z = self.base.wrapping_add(k.wrapping_mul(GAMMA));
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^= z >> 31;
        ((z >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Element `i` in f32: a normal's from pair i/2 ([`Self::normal_pair`],
    /// as [`Self::fill`] makes them), a log-uniform from draw i+1.
    fn value(&self, i: u64) -> f32 {
        match self.init {
            InitRule::Normal { std } => self.normal_pair(i / 2, std)[(i % 2) as usize],
            InitRule::LogUniform { lo, hi } => (lo + self.uniform(i + 1) * (hi - lo)).ln() as f32,
            InitRule::Zeros => 0.0,
            InitRule::Ones => 1.0,
        }
    }

    /// Elements 2j and 2j+1 of a normal rule: one Box-Muller pair in f32 from
    /// draws 2j+1 and 2j+2, `r = std·√(−2 ln u₁)`, `θ = 2π u₂`, giving
    /// `r cos θ` and `r sin θ` (one logarithm per two values).
    fn normal_pair(&self, j: u64, std: f64) -> [f32; 2] {
        let (u1, u2) = (
            self.uniform(2 * j + 1) as f32,
            self.uniform(2 * j + 2) as f32,
        );
        let r = (-2.0 * u1.ln()).sqrt() * std as f32;
        let (sin, cos) = (std::f32::consts::TAU * u2).sin_cos();
        [r * cos, r * sin]
    }

    /// Elements `0..n`, each stored as `cast` of its f32 value.
    fn fill<T: Copy + Default + Send>(&self, n: usize, cast: impl Fn(f32) -> T + Sync) -> Vec<T> {
        use rayon::prelude::*;
        // Even, so that no normal pair straddles two chunks.
        const CHUNK: usize = 1 << 16;
        const _: () = assert!(CHUNK.is_multiple_of(2));
        let mut v = vec![T::default(); n];
        v.par_chunks_mut(CHUNK).enumerate().for_each(|(c, out)| {
            let first = (c * CHUNK) as u64;
            match self.init {
                InitRule::Normal { std } => {
                    for (p, two) in out.chunks_mut(2).enumerate() {
                        let pair = self.normal_pair(first / 2 + p as u64, std);
                        two.iter_mut().zip(pair).for_each(|(x, y)| *x = cast(y));
                    }
                }
                _ => {
                    for (j, x) in out.iter_mut().enumerate() {
                        *x = cast(self.value(first + j as u64));
                    }
                }
            }
        });
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stream the generator replaces: one splitmix64 state advanced
    /// draw by draw.
    fn sequential(name: &str, init: InitRule, n: usize, seed: u64) -> Vec<f32> {
        let mut h: u64 = 0xcbf29ce484222325;
        for b in name.bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
        let mut state = h ^ seed.wrapping_mul(GAMMA);
        let mut next = || {
            state = state.wrapping_add(GAMMA);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
            z ^= z >> 31;
            ((z >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        let mut out = Vec::with_capacity(n + 1);
        while out.len() < n {
            match init {
                InitRule::Normal { std } => {
                    let (u1, u2) = (next() as f32, next() as f32);
                    let r = (-2.0 * u1.ln()).sqrt() * std as f32;
                    let theta = 2.0 * std::f32::consts::PI * u2;
                    out.extend([r * theta.cos(), r * theta.sin()]);
                }
                InitRule::LogUniform { lo, hi } => out.push((lo + next() * (hi - lo)).ln() as f32),
                InitRule::Zeros => out.push(0.0),
                InitRule::Ones => out.push(1.0),
            }
        }
        out.truncate(n);
        out
    }

    #[test]
    fn counter_generation_is_the_sequential_stream_across_chunks() {
        // Three chunks and a partial one.
        let n = 3 * (1 << 16) + 123;
        for init in [
            InitRule::Normal { std: 0.02 },
            InitRule::LogUniform { lo: 1.0, hi: 16.0 },
        ] {
            let got = init_tensor("lm_head.weight", init, &[n], Some(7))
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let want = sequential("lm_head.weight", init, n, 7);
            assert!(got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
            assert!(got.iter().any(|x| *x != got[0]), "{init}: not constant");
        }
    }

    /// A normal rule's values have its mean and standard deviation, and the
    /// two values of a Box-Muller pair are uncorrelated (bounds of about six
    /// standard errors over 2²⁰ values).
    #[test]
    fn normal_values_have_the_rules_moments_and_pairs_are_uncorrelated() {
        let (n, std) = (1usize << 20, 0.02f64);
        let x = init_tensor("w", InitRule::Normal { std }, &[n], Some(11))
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let z: Vec<f64> = x.iter().map(|&v| f64::from(v) / std).collect();
        let mean = z.iter().sum::<f64>() / n as f64;
        let var = z.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
        let corr = z.chunks(2).map(|p| p[0] * p[1]).sum::<f64>() / (n / 2) as f64;
        let se = 1.0 / (n as f64).sqrt();
        assert!(mean.abs() < 6.0 * se, "mean {mean}");
        assert!((var - 1.0).abs() < 6.0 * 2f64.sqrt() * se, "variance {var}");
        assert!(
            corr.abs() < 6.0 * 2f64.sqrt() * se,
            "pair correlation {corr}"
        );
    }

    #[test]
    fn storage_dtype_values_are_the_rounded_f32_values() {
        let shape = [301, 517];
        let init = InitRule::Normal { std: 0.5 };
        let f32s = init_tensor("w", init, &shape, Some(3)).unwrap();
        for prec in [Precision::Bf16, Precision::F16, Precision::F32] {
            let t = init_tensor_in("w", init, &shape, Some(3), prec).unwrap();
            assert_eq!(t.dtype(), prec.dtype());
            let got = t
                .to_dtype(candle_core::DType::F32)
                .unwrap()
                .flatten_all()
                .unwrap();
            let want = prec.round(&f32s).unwrap().flatten_all().unwrap();
            let (g, w) = (
                got.to_vec1::<f32>().unwrap(),
                want.to_vec1::<f32>().unwrap(),
            );
            assert!(
                g.iter().zip(&w).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{prec}"
            );
        }
    }

    #[test]
    fn a_random_rule_without_a_seed_is_refused() {
        let e = init_tensor("x", InitRule::Normal { std: 1.0 }, &[2], None).unwrap_err();
        assert!(e.to_string().contains("pass a seed"), "{e}");
    }
}

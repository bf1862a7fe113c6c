//! A drafter's linear weights as its products read them ([`Matrix`]), made
//! once at load where that holds no more bytes than the stored weights, so
//! that a forward neither widens nor copies them: every draft block of a
//! replay runs the drafter once, and at 27B scale (1.7 B parameters) widening
//! a layer per forward cost more than the forward's products.

use std::collections::HashMap;

use candle_core::DType;

use super::DrafterWeights;
use crate::error::Result;
use crate::kernels;
use crate::models::layers::Matrix;
use crate::precision::Precision;

/// The prepared matrices by tensor name; the others are widened per forward.
#[derive(Clone, Default)]
pub(super) struct Linears {
    mats: HashMap<String, Matrix>,
    /// Bytes the prepared matrices hold outside the stored weights.
    bytes: u64,
}

/// The linear weights of a drafter of `layers` layers.
fn names(layers: usize) -> Vec<String> {
    let per_layer = [
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    ];
    std::iter::once("fc.weight".to_string())
        .chain((0..layers).flat_map(|i| per_layer.map(|n| format!("layers.{i}.{n}.weight"))))
        .collect()
}

impl Linears {
    /// Prepares the linear weights of `weights` (shape-checked) for products
    /// in `prec` on the CPU: a bf16 drafter computing in bf16 on a CPU with
    /// the bf16 dot product holds them as bf16 pairs (taken out of
    /// `weights`: the same bytes; candle's sums, never the AMX kernel's,
    /// [`Matrix::with_candle_sums`]), an f32 drafter computing in f32 as its own tensors
    /// (shared). Anything else (a half drafter widened to f32, a GPU) is not
    /// prepared: holding the widened copy would double the drafter's bytes.
    ///
    /// Errors: a tensor failure.
    pub(super) fn prepare(
        weights: &mut DrafterWeights,
        prec: Precision,
        layers: usize,
    ) -> Result<Self> {
        let stored = if prec == Precision::Bf16 && kernels::capabilities().bf16_gemm() {
            DType::BF16
        } else if prec == Precision::F32 {
            DType::F32
        } else {
            return Ok(Self::default());
        };
        let mut out = Self::default();
        if !weights.on_cpu() {
            return Ok(out);
        }
        for name in names(layers) {
            if weights.dtype(&name) != Some(stored) {
                continue;
            }
            let wide = crate::loading::WeightSource::tensor(weights, &name)?;
            let m = match stored {
                DType::BF16 => {
                    let m = Matrix::bf16(&wide)?.transient_widening().with_candle_sums();
                    weights.remove(&name);
                    out.bytes += (wide.dim(0)? * wide.dim(1)?.div_ceil(2) * 4) as u64;
                    m
                }
                _ => Matrix::new(wide)?,
            };
            out.mats.insert(name, m);
        }
        Ok(out)
    }

    /// The matrix of `name`: prepared, or widened from `weights` (rounded to
    /// `prec`) for this forward.
    ///
    /// Errors: the tensor is missing or unreadable.
    pub(super) fn get(
        &self,
        weights: &DrafterWeights,
        name: &str,
        prec: Precision,
    ) -> Result<Matrix> {
        match self.mats.get(name) {
            Some(m) => Ok(m.clone()),
            None => Matrix::new(prec.round(&crate::loading::WeightSource::tensor(weights, name)?)?),
        }
    }

    /// Bytes the prepared matrices hold outside the stored weights.
    pub(super) fn bytes(&self) -> u64 {
        self.bytes
    }
}

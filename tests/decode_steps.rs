//! A cached decode's single-token steps run at once
//! (`DecoderLayer::forward_steps`) give the bits of the steps run one by
//! one (`DecoderLayer::forward`, recurrent form, one row each), outputs and
//! the state left behind: on every layer of the tiny fixtures (Qwen3.5,
//! Qwen3, the MoE family; fp8 KV cache and a tentative block too), and on a random layer wide
//! enough that its products take the many-rows single-row kernel
//! (`kernels::Kernel::Gemv`) instead of candle's product row by row.

use crate::common;

use candle_core::{Device, Tensor};
use hsparity::checkpoint::config::ModelConfig;
use hsparity::kernels::{self, Kernel, Stored};
use hsparity::loading::{LoadingPath, WeightSource};
use hsparity::models::layers::attention::KvCache;
use hsparity::models::{DecoderLayer, GdnForm, LayerState, TextModelSpec};
use hsparity::precision::Precision;
use hsparity::session::Session;

use common::hidden_input as input;

/// How the state of [`steps_match`] is set up before the steps.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Before {
    /// As a prefill leaves it.
    Prefill,
    /// With an fp8 KV cache (attention layers only).
    Fp8,
    /// A tentative block begun (a speculative loop's verify), one token kept after.
    Tentative,
}

/// Prefills 5 tokens into a fresh state (chunked form), then takes 4 steps
/// one by one and all at once from copies of that state, then one more
/// single step from each state left behind: the same bits everywhere.
fn steps_match(spec: &TextModelSpec, layer: &DecoderLayer, before: Before, what: &str, seed: u64) {
    let (h, prec) = (spec.geo.hidden, layer.prec);
    let mut state = layer.new_state(spec);
    if before == Before::Fp8 {
        match &mut state {
            LayerState::Full(c) => *c = KvCache::fp8(),
            LayerState::Linear(_) => return,
        }
    }
    let pre = input(5, h, seed, prec);
    let pos_pre = spec.positions(0, 5).unwrap();
    layer
        .forward(&pre, spec, &pos_pre, GdnForm::Chunked, Some(&mut state))
        .unwrap();
    if before == Before::Tentative {
        state.begin_tentative();
    }
    let steps = input(4, h, seed + 1, prec);
    let pos: Vec<_> = (5..9).map(|t| spec.positions(t, 1).unwrap()).collect();
    let (mut one, mut all) = (state.clone(), state);
    let singles: Vec<Tensor> = (0..4)
        .map(|i| {
            let row = steps.narrow(0, i, 1).unwrap();
            layer
                .forward(&row, spec, &pos[i], GdnForm::Recurrent, Some(&mut one))
                .unwrap()
        })
        .collect();
    let singles = Tensor::cat(&singles, 0).unwrap();
    let at_once = layer.forward_steps(&steps, spec, &pos, &mut all).unwrap();
    assert!(
        common::bits(&singles) == common::bits(&at_once),
        "{what}: steps at once differ from one by one"
    );
    if before == Before::Tentative {
        // A tentative state takes its steps one by one either way (only the
        // first is the block); both commit the same prefix.
        one.commit(5, 6).unwrap();
        all.commit(5, 6).unwrap();
    }
    let next = input(1, h, seed + 2, prec);
    let pos_next = spec.positions(9, 1).unwrap();
    let after = |s: &mut LayerState| {
        layer
            .forward(&next, spec, &pos_next, GdnForm::Recurrent, Some(s))
            .unwrap()
    };
    assert!(
        common::bits(&after(&mut one)) == common::bits(&after(&mut all)),
        "{what}: the state left behind differs"
    );
}

#[test]
fn steps_at_once_give_the_bits_of_steps_one_by_one_on_the_fixtures() {
    let fixtures = [
        ("fixtures/tiny-qwen3_5", LoadingPath::CausalLm),
        ("fixtures/tiny-qwen3", LoadingPath::CausalLm),
        ("fixtures/moe/qwen3.6-fused", LoadingPath::CausalLm),
    ];
    for (dir, path) in fixtures {
        let session = Session::open(&common::target(dir, None), &[path]).unwrap();
        let (spec, src) = (&session.spec, &session.paths[0].view);
        for prec in [Precision::F32, Precision::Bf16] {
            for l in 0..spec.num_layers() {
                let layer = DecoderLayer::load(spec, src, l, prec).unwrap();
                for before in [Before::Prefill, Before::Fp8, Before::Tentative] {
                    let what = format!("{dir} layer {l} {prec:?} {before:?}");
                    steps_match(spec, &layer, before, &what, l as u64 * 7);
                }
            }
        }
    }
}

/// Random weights for a Qwen3.5 layer of the geometry in `spec` with MLP
/// width `inter`, values in about [-0.1, 0.1] (norm weights about 1).
struct Random {
    spec: TextModelSpec,
    inter: usize,
}

impl Random {
    fn shape(&self, name: &str) -> Vec<usize> {
        let g = &self.spec.geo;
        let (h, nv, dv) = (g.hidden, g.lin_v_heads, g.lin_v_dim);
        let (nh, nkv, hd) = (g.num_heads, g.num_kv_heads, g.head_dim);
        let last = name.rsplit_once("layers.").map_or(name, |(_, s)| s);
        let suffix = last.split_once('.').map_or(last, |(_, s)| s);
        match suffix {
            "linear_attn.in_proj_qkv.weight" => vec![g.conv_dim(), h],
            "linear_attn.in_proj_z.weight" => vec![nv * dv, h],
            "linear_attn.in_proj_b.weight" | "linear_attn.in_proj_a.weight" => vec![nv, h],
            "linear_attn.conv1d.weight" => vec![g.conv_dim(), 1, g.conv_kernel],
            "linear_attn.dt_bias" | "linear_attn.A_log" => vec![nv],
            "linear_attn.norm.weight" => vec![dv],
            "linear_attn.out_proj.weight" => vec![h, nv * dv],
            "self_attn.q_proj.weight" => vec![2 * nh * hd, h],
            "self_attn.k_proj.weight" | "self_attn.v_proj.weight" => vec![nkv * hd, h],
            "self_attn.o_proj.weight" => vec![h, nh * hd],
            "self_attn.q_norm.weight" | "self_attn.k_norm.weight" => vec![hd],
            "input_layernorm.weight" | "post_attention_layernorm.weight" => vec![h],
            "mlp.gate_proj.weight" | "mlp.up_proj.weight" => vec![self.inter, h],
            "mlp.down_proj.weight" => vec![h, self.inter],
            other => panic!("no shape for {other}"),
        }
    }
}

impl WeightSource for Random {
    fn tensor(&self, name: &str) -> hsparity::error::Result<Tensor> {
        let shape = self.shape(name);
        let n: usize = shape.iter().product();
        let seed = name
            .bytes()
            .fold(7u64, |a, b| a.wrapping_mul(31) ^ u64::from(b));
        let v: Vec<f32> = common::uniform(n, seed)
            .into_iter()
            .map(|u| (u - 0.5) * 0.2)
            .collect();
        Ok(Tensor::from_vec(v, shape, &Device::Cpu)?)
    }

    fn identity(&self, name: &str) -> String {
        format!("random {name}")
    }
}

#[test]
fn steps_at_once_give_the_bits_of_steps_one_by_one_on_a_wide_layer() {
    let mut raw: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string("fixtures/tiny-qwen3_5/config.json").unwrap(),
    )
    .unwrap();
    let t = &mut raw["text_config"];
    for (k, v) in [
        ("hidden_size", 320),
        ("linear_key_head_dim", 80),
        ("linear_value_head_dim", 80),
        ("head_dim", 80),
    ] {
        t[k] = v.into();
    }
    let cfg = ModelConfig::from_value(raw).unwrap();
    let spec = TextModelSpec::new(&cfg.text).unwrap();
    let g = &spec.geo;
    assert!(
        kernels::plan(
            1,
            g.conv_dim(),
            g.hidden,
            Stored::F32,
            kernels::capabilities()
        )
        .map(|p| p.kernel())
            == kernels::capabilities()
                .avx512_gemm()
                .then_some(Kernel::Gemv),
        "the wide layer's projections take the kernel where the CPU has it"
    );
    let src = Random {
        spec: spec.clone(),
        inter: 384,
    };
    for prec in [Precision::F32, Precision::Bf16] {
        for l in [0, 2] {
            let layer = DecoderLayer::load(&spec, &src, l, prec).unwrap();
            for before in [Before::Prefill, Before::Fp8, Before::Tentative] {
                let what = format!("wide layer {l} {prec:?} {before:?}");
                steps_match(&spec, &layer, before, &what, 100 + l as u64);
            }
        }
    }
}

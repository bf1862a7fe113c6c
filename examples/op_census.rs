//! Which operation departs first from transformers in half precision: feeds
//! every captured input of transformers' own forward (`tools/op_census.py`)
//! to hsparity's implementation of the same operation and counts the
//! outputs that differ (docs/noise-floor.md, "Which operation departs
//! first").
//!
//! ```sh
//! .venv/bin/python tools/op_census.py CKPT PROMPTS.jsonl target/census.safetensors
//! cargo run --release --example op_census -- CKPT target/census.safetensors
//! ```
//!
//! Per operation, over every layer and prompt: the output elements compared,
//! how many differ, and the largest difference in units of the output's
//! dtype at the value (ulps). The operations: the linear maps, the norms
//! (`input_layernorm`, `post_attention_layernorm`, `q_norm`/`k_norm`, the
//! Gated DeltaNet's gated norm), the token mixers as wholes (Gated DeltaNet:
//! projections, conv, delta rule, gated norm, output; attention: projections,
//! norms, rope, softmax, output), the MLP, and the decoder layer.

use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor};
use hsparity::error::{Error, Result};
use hsparity::loading::{LoadingPath, WeightSource};
use hsparity::models::decoder::{DecoderLayer, FeedForward, Mixer};
use hsparity::models::layers::{matrix, norm::RmsNormGated};
use hsparity::models::qwen3_5::gated_delta_net::{chunked, DeltaRuleInputs, GatedDeltaNet};
use hsparity::models::{GdnForm, TextModelSpec};
use hsparity::precision::Precision;
use hsparity::session::{Session, Target};

/// One operation's tally: elements compared, differing, and of those the
/// ones a single step of the captured dtype apart, and the most steps.
#[derive(Default)]
struct Tally {
    elements: usize,
    differing: usize,
    one_step: usize,
    max_steps: u64,
}

/// `x`'s position on the number line of `dtype` (bf16: the top 16 bits of
/// the f32; f32: all 32), so that neighbours are one apart.
fn ordinal(x: f32, dtype: DType) -> i64 {
    let (bits, sign) = match dtype {
        DType::BF16 => (i64::from(x.to_bits() >> 16), 1i64 << 15),
        DType::F16 => (i64::from(half::f16::from_f32(x).to_bits()), 1i64 << 15),
        _ => (i64::from(x.to_bits()), 1i64 << 31),
    };
    if bits & sign != 0 {
        -(bits & (sign - 1))
    } else {
        bits
    }
}

impl Tally {
    /// `ours` (f32 storage) against the captured `theirs` (its own dtype).
    fn add(&mut self, ours: &Tensor, theirs: &Tensor) -> Result<()> {
        let dtype = theirs.dtype();
        let a = ours.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        let b = theirs
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        if a.len() != b.len() {
            return Err(Error::Input(format!(
                "{} outputs against {} captured",
                a.len(),
                b.len()
            )));
        }
        for (x, y) in a.iter().zip(&b) {
            self.elements += 1;
            if x.to_bits() != y.to_bits() {
                let steps = ordinal(*x, dtype).abs_diff(ordinal(*y, dtype));
                self.differing += 1;
                self.one_step += usize::from(steps == 1);
                self.max_steps = self.max_steps.max(steps);
            }
        }
        Ok(())
    }
}

/// The Gated DeltaNet's kernel: hsparity's kernel inputs from the mixer's
/// input (projections, causal conv and SiLU, decay, write strength) against
/// the arguments transformers passed to `torch_chunk_gated_delta_rule`; then
/// the chunked delta rule on transformers' own arguments against its output.
fn delta_rule_census(
    m: &GatedDeltaNet,
    mix_in: &Tensor,
    get: &Get,
    prec: Precision,
    check: &mut Check,
) -> Result<()> {
    let ours = m.delta_rule_inputs(mix_in)?;
    let d = ".linear_attn.delta_rule";
    let (q, k, v) = (
        get(&format!("{d}.query"))?,
        get(&format!("{d}.key"))?,
        get(&format!("{d}.value"))?,
    );
    let (g, beta) = (get(&format!("{d}.g"))?, get(&format!("{d}.beta"))?);
    let (t, nk, dk) = q.dims3()?;
    let (nv, dv) = (v.dim(1)?, v.dim(2)?);
    // GVA as the kernel expands it: value head h reads key head h / (nv / nk).
    let expand = |x: &Tensor| -> Result<Tensor> {
        let r = nv / nk;
        Ok(x.unsqueeze(2)?
            .broadcast_as((t, nk, r, dk))?
            .reshape((t, nv, dk))?
            .contiguous()?)
    };
    let (q, k) = (expand(&q)?, expand(&k)?);
    let wide = |x: &Tensor| -> Result<Tensor> { Ok(x.to_dtype(DType::F32)?) };
    let shaped = |v: &[f32], dims: &[usize]| Tensor::from_slice(v, dims, &Device::Cpu);
    check(
        "conv + SiLU (query, key)",
        shaped(&ours.q, &[t, nv, dk])?,
        q.clone(),
    )?;
    check(
        "conv + SiLU (query, key)",
        shaped(&ours.k, &[t, nv, dk])?,
        k.clone(),
    )?;
    check(
        "conv + SiLU (value)",
        shaped(&ours.v, &[t, nv, dv])?,
        v.clone(),
    )?;
    check(
        "decay g (softplus, exp)",
        shaped(&ours.g, &[t, nv])?,
        g.clone(),
    )?;
    check(
        "write strength β (sigmoid)",
        shaped(&ours.beta, &[t, nv])?,
        beta.clone(),
    )?;
    let flat = |x: &Tensor| -> Result<Vec<f32>> { Ok(wide(x)?.flatten_all()?.to_vec1::<f32>()?) };
    let theirs = DeltaRuleInputs {
        t,
        heads: nv,
        dk,
        dv,
        q: flat(&q)?,
        k: flat(&k)?,
        v: flat(&v)?,
        g: flat(&g)?,
        beta: flat(&beta)?,
    };
    let mut state = vec![0f32; nv * dk * dv];
    let mut o = chunked(&theirs, &mut state);
    prec.round_slice(&mut o);
    check(
        "delta rule (chunked)",
        shaped(&o, &[t, nv, dv])?,
        get(&format!("{d}.out"))?,
    )
}

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
}

/// What every operation of one decoder layer needs.
struct Layer<'a> {
    l: usize,
    layer: DecoderLayer,
    gated: Option<RmsNormGated>,
    spec: &'a TextModelSpec,
    src: &'a dyn WeightSource,
    prec: Precision,
}

/// Reads a captured tensor by its name after `p{k}.layers.{l}`.
type Get<'a> = dyn Fn(&str) -> Result<Tensor> + 'a;
/// Adds one operation's outputs (hsparity's, transformers') to the tally.
type Check<'a> = dyn FnMut(&str, Tensor, Tensor) -> Result<()> + 'a;

/// hsparity keeps half-precision activations as f32 values rounded to the
/// dtype: an input is the captured numbers, widened.
fn input(get: &Get, m: &str) -> Result<Tensor> {
    Ok(get(m)?.to_dtype(DType::F32)?)
}

impl Layer<'_> {
    /// The layer, its norms, its feed-forward and its mixer as wholes.
    fn blocks(&self, get: &Get, check: &mut Check) -> Result<()> {
        let (spec, layer) = (self.spec, &self.layer);
        let x = input(get, ".in")?;
        let pos = spec.positions(0, x.dim(0)?)?;
        let ours = layer.forward(&x, spec, &pos, GdnForm::Chunked, None)?;
        check("decoder layer", ours, get(".out")?)?;
        for (op, norm) in [
            ("input_layernorm", &layer.input_layernorm),
            ("post_attention_layernorm", &layer.post_attention_layernorm),
        ] {
            let ours = norm.forward(&input(get, &format!(".{op}.in"))?)?;
            check(op, ours, get(&format!(".{op}.out"))?)?;
        }
        let ff = match &layer.mlp {
            FeedForward::Dense(_) => "mlp (SwiGLU)",
            FeedForward::SparseMoe(_) => "mlp (sparse MoE block)",
        };
        check(
            ff,
            layer.mlp.forward(&input(get, ".mlp.in")?)?.0,
            get(".mlp.out")?,
        )?;
        let (mixer, ours) = match &layer.mixer {
            Mixer::Linear(m) => {
                let x = input(get, ".linear_attn.in")?;
                ("linear_attn", m.forward(&x, GdnForm::Chunked, None)?)
            }
            Mixer::Full(m) => {
                let x = input(get, ".self_attn.in")?;
                ("self_attn", m.forward(&x, &spec.rotary, &pos, None)?)
            }
        };
        check(
            &format!("{mixer} (whole mixer)"),
            ours,
            get(&format!(".{mixer}.out"))?,
        )
    }

    /// The linear maps, the Gated DeltaNet's kernel and gated norm, the
    /// attention's q/k norms.
    fn parts(&self, get: &Get, check: &mut Check) -> Result<()> {
        let (l, prec, src) = (self.l, self.prec, self.src);
        let mut linears: Vec<&str> = match &self.layer.mixer {
            Mixer::Linear(_) => vec![
                "linear_attn.in_proj_qkv",
                "linear_attn.in_proj_z",
                "linear_attn.in_proj_b",
                "linear_attn.in_proj_a",
                "linear_attn.out_proj",
            ],
            Mixer::Full(_) => vec![
                "self_attn.q_proj",
                "self_attn.k_proj",
                "self_attn.v_proj",
                "self_attn.o_proj",
            ],
        };
        if let FeedForward::Dense(_) = &self.layer.mlp {
            linears.extend(["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]);
        }
        for name in linears {
            let w = matrix(src, &format!("layers.{l}.{name}.weight"), prec)?;
            let ours = w.linear(&input(get, &format!(".{name}.in"))?, prec)?;
            let lin = name.rsplit('.').next().unwrap_or(name);
            check(
                &format!("linear ({lin})"),
                ours,
                get(&format!(".{name}.out"))?,
            )?;
        }
        match (&self.layer.mixer, &self.gated) {
            (Mixer::Linear(m), gated) => {
                delta_rule_census(m, &input(get, ".linear_attn.in")?, get, prec, check)?;
                if let Some(g) = gated {
                    let n = ".linear_attn.norm";
                    let ours = g.forward(
                        &input(get, &format!("{n}.in"))?,
                        &input(get, &format!("{n}.gate"))?,
                    )?;
                    check(
                        "gated norm (linear_attn.norm)",
                        ours,
                        get(&format!("{n}.out"))?,
                    )?;
                }
            }
            (Mixer::Full(_), _) => {
                for qk in ["q_norm", "k_norm"] {
                    let n = format!("self_attn.{qk}");
                    let eps = self.spec.geo.eps;
                    let norm = hsparity::models::qwen3_5::norm(
                        src,
                        &format!("layers.{l}.{n}"),
                        eps,
                        prec,
                    )?;
                    let ours = norm.forward(&input(get, &format!(".{n}.in"))?)?;
                    check("q_norm / k_norm", ours, get(&format!(".{n}.out"))?)?;
                }
            }
        }
        Ok(())
    }
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [ckpt, census] = &args[..] else {
        return Err(Error::Input(
            "usage: op_census CHECKPOINT CENSUS.safetensors (tools/op_census.py writes it)".into(),
        ));
    };
    let target = Target {
        checkpoint: ckpt.clone(),
        ..Default::default()
    };
    let session = Session::open(&target, &[LoadingPath::CausalLm])?;
    let path = &session.paths[0];
    let (spec, src, prec) = (&session.spec, &path.view as &dyn WeightSource, path.compute);
    let t = candle_core::safetensors::load(census, &Device::Cpu)?;
    let prompts = (0..)
        .take_while(|k| t.contains_key(&format!("p{k}.layers.0.in")))
        .count();
    let mut tally: BTreeMap<String, Tally> = BTreeMap::new();
    for l in 0..spec.num_layers() {
        let norm = format!("layers.{l}.linear_attn.norm");
        let layer = DecoderLayer::load(spec, src, l, prec)?;
        // Only a Gated DeltaNet layer has the gated norm; its load errors stand.
        let gated = matches!(layer.mixer, Mixer::Linear(_))
            .then(|| RmsNormGated::load(src, &norm, spec.geo.eps, prec))
            .transpose()?;
        let layer = Layer {
            l,
            layer,
            gated,
            spec,
            src,
            prec,
        };
        for k in 0..prompts {
            let get = |m: &str| -> Result<Tensor> {
                let name = format!("p{k}.layers.{l}{m}");
                let x = t
                    .get(&name)
                    .ok_or_else(|| Error::Input(format!("{census}: no {name}")))?;
                Ok(x.clone())
            };
            let mut check = |op: &str, ours: Tensor, theirs: Tensor| -> Result<()> {
                tally.entry(op.to_string()).or_default().add(&ours, &theirs)
            };
            layer.blocks(&get, &mut check)?;
            layer.parts(&get, &mut check)?;
        }
    }
    println!(
        "{ckpt}: {} layers, {prompts} prompts, {prec}; transformers' captured inputs through hsparity's operations",
        spec.num_layers()
    );
    println!(
        "{:<34} {:>10} {:>9} {:>8} {:>9} {:>9}",
        "operation", "outputs", "differing", "share", "one step", "max steps"
    );
    for (op, s) in &tally {
        println!(
            "{op:<34} {:>10} {:>9} {:>8.1e} {:>9} {:>9}",
            s.elements,
            s.differing,
            s.differing as f64 / s.elements.max(1) as f64,
            s.one_step,
            s.max_steps
        );
    }
    Ok(())
}

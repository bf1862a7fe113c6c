//! `hsparity triage`: test every usual suspect of a drafter regression in one
//! run and rank them by what they cost in τ.
//!
//! Baseline: the training-side path (`causal-lm`, its own dtype, chunked Gated
//! DeltaNet, taps `hidden_states[L+1]`). Each variant changes one thing an
//! eval harness gets wrong; its per-tap divergence from the baseline is
//! measured on the baseline's trajectory and its τ on its own greedy
//! trajectory. Variants that only change which hidden states feed the drafter
//! (tap offsets, the normed last tap) reuse the baseline's forward, so they
//! cost no target compute.

use std::time::Instant;

use candle_core::Tensor;
use serde::Serialize;

use crate::commands::drafter::{replay_all, Replay};
use crate::commands::Session;
use crate::drafter_eval::EndRule;
use crate::drafter_eval::{self, PromptTau};
use crate::error::{Error, Result};
use crate::loading::{InitRule, LoadingPath};
use crate::models::precision::Precision;
use crate::models::qwen3_5::{GdnForm, LmHead, TextModel};
use crate::models::WeightSource;
use crate::parity::{Accumulator, Tolerance, Verdict};
use crate::progress;
use crate::prompts::PromptOptions;

/// Options of `triage`.
#[derive(Debug, Clone)]
pub struct TriageOptions {
    pub checkpoint: String,
    pub drafter: String,
    pub prompts: PromptOptions,
    pub max_new_tokens: usize,
    pub ddtree_budget: usize,
    /// τ seen in the eval that regressed, to point at consistent variants.
    pub observed_tau: Option<f64>,
    /// Stale-position shift for the `positions +k` variant.
    pub position_shift: usize,
    pub seed: u64,
    pub quiet: bool,
    /// Compute device (`--device`).
    pub device: crate::device::DeviceSpec,
    pub command_line: String,
}

/// One variant's outcome (a `variants[]` row of `triage --json`).
#[derive(Debug, Clone, Serialize)]
pub struct VariantResult {
    /// Short name (`tap-offset-1`, `dtype-bf16`, …).
    pub name: String,
    /// What it emulates.
    pub description: String,
    /// First tap (as a `hidden_states` index) whose features diverge from the
    /// baseline's beyond tolerance, on the baseline trajectory.
    pub first_divergent: Option<usize>,
    /// Smallest per-token cosine between the variant's and the baseline's tap
    /// features (on the baseline trajectory).
    pub cos_min_at_taps: f64,
    pub tau_macro: f64,
    /// τ(variant) − τ(baseline).
    pub delta_tau: f64,
    pub ddtree_tau_macro: f64,
    /// With `--observed-tau`: |τ − observed| ≤ 0.25 or 10 %.
    pub consistent_with_observed: Option<bool>,
    /// Seconds this variant took (0 for variants sharing the baseline forward).
    pub wall_s: f64,
}

/// The baseline the variants are measured against.
#[derive(Debug, Clone, Serialize)]
pub struct Baseline {
    pub path: String,
    pub dtype: String,
    pub gdn_form: String,
    pub taps: Vec<usize>,
    pub tau_macro: f64,
    pub ddtree_tau_macro: f64,
    pub wall_s: f64,
}

/// `triage --json`.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename = "triage")]
pub struct TriageReport {
    pub schema_version: u32,
    pub verdict: Verdict,
    pub summary: String,
    pub exit_code: i32,
    pub command: String,
    pub baseline: Baseline,
    /// Ranked by |delta_tau|, largest first.
    pub variants: Vec<VariantResult>,
    pub observed_tau: Option<f64>,
    /// Whole run, seconds.
    pub wall_time_s: f64,
    pub notes: Vec<String>,
}

/// How a variant turns hidden states into drafter features.
#[derive(Clone, Copy)]
enum Taps {
    /// `hidden_states[L+1+offset]` (pre-norm; offset 0 = the convention).
    Offset(i64),
    /// The last tap goes through the final norm.
    NormedLast,
}

/// Features for `taps` under `mode` from one forward's outputs.
fn select(hs: &[Tensor], last: &Tensor, taps: &[usize], mode: Taps) -> Result<Tensor> {
    match mode {
        Taps::Offset(0) => drafter_eval::tap_features(hs, last, taps),
        Taps::Offset(k) => {
            // What a harness reading `hidden_states[L+1+k]` literally gets:
            // index N is transformers' final-normed entry.
            let parts = taps
                .iter()
                .map(|&l| {
                    let i = l as i64 + 1 + k;
                    if i < 0 || i >= hs.len() as i64 {
                        Err(Error::Input(format!(
                            "tap {l}{k:+} falls outside the model"
                        )))
                    } else {
                        Ok(&hs[i as usize])
                    }
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Tensor::cat(&parts, candle_core::D::Minus1)?)
        }
        Taps::NormedLast => {
            // Only a tap on the last layer can be read after the final norm
            // (transformers' hidden_states[N]); the caller checks that.
            let parts: Vec<&Tensor> = taps.iter().map(|&l| &hs[l + 1]).collect();
            Ok(Tensor::cat(&parts, candle_core::D::Minus1)?)
        }
    }
}

fn tau(p: &[PromptTau], b: usize) -> f64 {
    drafter_eval::summarize(p, b).tau_macro
}

/// Per-tap divergence: the first tap whose features fail `tol`, and the
/// smallest cosine over all taps. `a`, `b`: per prompt `[T, K·H]`.
fn tap_divergence(
    a: &[Tensor],
    b: &[Tensor],
    taps: &[usize],
    h: usize,
    tol: &Tolerance,
) -> Result<(Option<usize>, f64)> {
    let mut first = None;
    let mut cos_min = f64::INFINITY;
    for (j, &l) in taps.iter().enumerate() {
        let mut acc = Accumulator::default();
        for (k, (x, y)) in a.iter().zip(b).enumerate() {
            acc.add(k, &x.narrow(1, j * h, h)?, &y.narrow(1, j * h, h)?)?;
        }
        let m = acc.finish();
        cos_min = cos_min.min(m.cos_min);
        if first.is_none() && tol.judge(&m) != Verdict::Pass {
            first = Some(l + 1);
        }
    }
    Ok((first, cos_min))
}

/// Runs the triage matrix.
///
/// Errors: as [`Session::open`] and the drafter loading.
pub fn run(opts: &TriageOptions) -> Result<TriageReport> {
    let t0 = Instant::now();
    let session = Session::open(
        &opts.checkpoint,
        &[LoadingPath::CausalLm],
        &opts.prompts,
        opts.seed,
        opts.device,
    )?;
    let base_path = &session.paths[0];
    let tc = &base_path.text_config;
    let (drafter, _) = crate::commands::drafter::load_checked(
        &session,
        &opts.drafter,
        opts.max_new_tokens,
        opts.position_shift,
        EndRule::GithubMain,
    )?;
    let b = drafter.cfg.block_size;
    let taps = drafter.cfg.target_layer_ids.clone();
    let h = tc.hidden_size;
    let base_prec = base_path.dtype.precision();
    let tol = Tolerance::for_dtype(base_prec.name());
    let prompt_lens: Vec<usize> = session.prompts.iter().map(|p| p.ids.len()).collect();
    let max_new = opts.max_new_tokens;
    let n_gen = max_new + b;
    let mut notes = Vec::new();

    // Variant list (the baseline first).
    let mut plan: Vec<(&str, String)> = vec![("vlm", "loading path vlm (AutoModel: its own dtype and tie resolution; lm_head borrowed from causal-lm)".into())];
    for p in [Precision::F32, Precision::Bf16, Precision::F16] {
        if p != base_prec {
            let kind = match p {
                Precision::F32 => "dtype-f32",
                Precision::Bf16 => "dtype-bf16",
                Precision::F16 => "dtype-f16",
            };
            plan.push((kind, format!("dtype {}", p.name())));
        }
    }
    plan.push((
        "recurrent",
        "Gated DeltaNet recurrent form instead of chunked".into(),
    ));
    plan.push((
        "tap-offset--1",
        "tap offset −1 (hidden_states[L] instead of [L+1])".into(),
    ));
    plan.push((
        "tap-offset-+1",
        "tap offset +1 (hidden_states[L+2]; final-normed when L+2 = N)".into(),
    ));
    let n_layers = session.spec.num_layers();
    if taps.iter().max() == Some(&(n_layers - 1)) {
        plan.push((
            "normed-last-tap",
            "tap on the last layer read from hidden_states[N], i.e. after the final norm".into(),
        ));
    } else {
        notes.push(format!(
            "normed-last-tap not run: no tap is on the last layer ({}), and only hidden_states[N] is final-normed",
            n_layers - 1
        ));
    }
    plan.push((
        "positions-+1",
        "decode positions shifted by +1 (off-by-one position ids after the prefill)".into(),
    ));
    plan.push((
        "positions-+k",
        format!(
            "decode positions shifted by +{} (stale rope offset, e.g. cached rope_deltas)",
            opts.position_shift
        ),
    ));
    plan.push((
        "missing",
        "MISSING tensors initialised as transformers would".into(),
    ));
    let pb = progress::single(plan.len() as u64 + 1, "runs", opts.quiet);
    pb.set_message("baseline");

    // Baseline: trajectory, hidden states, τ.
    let tb = Instant::now();
    let base = TextModel::load(
        &session.spec,
        &base_path.view,
        Some(&base_path.view),
        base_prec,
    )?;
    let base_tokens: Vec<Vec<u32>> = session
        .prompts
        .iter()
        .map(|p| Ok([p.ids.clone(), base.greedy(&p.ids, n_gen, GdnForm::Chunked)?].concat()))
        .collect::<Result<_>>()?;
    let base_outs: Vec<_> = base_tokens
        .iter()
        .map(|t| base.forward(t, None, GdnForm::Chunked, true))
        .collect::<Result<_>>()?;
    let feats_of = |mode: Taps| -> Result<Vec<Tensor>> {
        base_outs
            .iter()
            .map(|o| {
                select(
                    o.hidden_states.as_deref().expect("requested"),
                    o.last_layer_output.as_ref().expect("requested"),
                    &taps,
                    mode,
                )
            })
            .collect()
    };
    let base_feats = feats_of(Taps::Offset(0))?;
    let (bd, bt) = replay_all(
        &drafter,
        &base,
        &base_tokens,
        &prompt_lens,
        &base_feats,
        Replay {
            max_new,
            budget: opts.ddtree_budget,
            rule: EndRule::GithubMain,
        },
    )?;
    let baseline = Baseline {
        path: "causal-lm".into(),
        dtype: base_prec.name().into(),
        gdn_form: "chunked".into(),
        taps: taps.clone(),
        tau_macro: tau(&bd, b),
        ddtree_tau_macro: tau(&bt, b),
        wall_s: tb.elapsed().as_secs_f64(),
    };
    pb.inc(1);

    // Tap features of `m` over sequences whose first `prompt_lens[k]` tokens
    // are the prompt (decoded tokens keep their decode positions).
    let feats_on = |m: &TextModel, seqs: &[Vec<u32>], form: GdnForm| -> Result<Vec<Tensor>> {
        crate::commands::drafter::features(m, seqs, &prompt_lens, &taps, form)
    };
    // A variant that runs its own target model: divergence on the baseline
    // trajectory, τ on its own trajectory.
    let own_model = |m: &TextModel, form: GdnForm| -> Result<Replays> {
        let on_base = feats_on(m, &base_tokens, form)?;
        let tokens: Vec<Vec<u32>> = session
            .prompts
            .iter()
            .map(|p| Ok([p.ids.clone(), m.greedy(&p.ids, n_gen, form)?].concat()))
            .collect::<Result<_>>()?;
        let own = feats_on(m, &tokens, form)?;
        let (d, t) = replay_all(
            &drafter,
            m,
            &tokens,
            &prompt_lens,
            &own,
            Replay {
                max_new,
                budget: opts.ddtree_budget,
                rule: EndRule::GithubMain,
            },
        )?;
        Ok((on_base, d, t))
    };

    // A variant model: the baseline's tensors when it reads the same bytes in
    // the same dtype with the same lm_head (no second copy), else loaded.
    let base_key = crate::commands::weights_key(
        &session.spec,
        &base_path.view,
        Some(&base_path.view),
        base_prec,
    );
    let variant_model =
        |view: &dyn WeightSource, head: &dyn WeightSource, prec: Precision| -> Result<TextModel> {
            if crate::commands::weights_key(&session.spec, view, Some(head), prec) == base_key {
                Ok(base.clone())
            } else {
                TextModel::load(&session.spec, view, Some(head), prec)
            }
        };
    let mut variants = Vec::new();
    for (kind, description) in plan {
        pb.set_message(description.clone());
        let tv = Instant::now();
        let outcome: Option<Outcome> = match kind {
            "vlm" => {
                let vp = crate::loading::resolve(&session.ckpt, LoadingPath::Vlm)?;
                let view = vp
                    .view
                    .with_seed(opts.seed)
                    .with_device(session.spec.device.clone());
                let m = variant_model(&view, &base_path.view, vp.dtype.precision())?;
                let (f, d, t) = own_model(&m, GdnForm::Chunked)?;
                Some(("vlm".into(), f, d, t))
            }
            k if k.starts_with("dtype-") => {
                let p = Precision::parse(&k["dtype-".len()..])?;
                let m = variant_model(&base_path.view, &base_path.view, p)?;
                let (f, d, t) = own_model(&m, GdnForm::Chunked)?;
                Some((format!("dtype-{}", p.name()), f, d, t))
            }
            "recurrent" => {
                let (f, d, t) = own_model(&base, GdnForm::Recurrent)?;
                Some(("gdn-recurrent".into(), f, d, t))
            }
            "tap-offset--1" | "tap-offset-+1" | "normed-last-tap" => {
                let mode = match kind {
                    "tap-offset--1" => Taps::Offset(-1),
                    "tap-offset-+1" => Taps::Offset(1),
                    _ => Taps::NormedLast,
                };
                match feats_of(mode) {
                    Ok(f) => {
                        let (d, t) = replay_all(
                            &drafter,
                            &base,
                            &base_tokens,
                            &prompt_lens,
                            &f,
                            Replay {
                                max_new,
                                budget: opts.ddtree_budget,
                                rule: EndRule::GithubMain,
                            },
                        )?;
                        let name = match kind {
                            "tap-offset--1" => "tap-offset-1",
                            "tap-offset-+1" => "tap-offset+1",
                            _ => "normed-last-tap",
                        };
                        Some((name.into(), f, d, t))
                    }
                    Err(e) => {
                        notes.push(format!("{description}: skipped ({e})"));
                        None
                    }
                }
            }
            "positions-+1" | "positions-+k" => {
                let k = if kind == "positions-+1" {
                    1
                } else {
                    opts.position_shift
                };
                let m = base.clone().with_decode_shift(k);
                let (f, d, t) = own_model(&m, GdnForm::Chunked)?;
                Some((format!("positions+{k}"), f, d, t))
            }
            "missing" => {
                let missing_path = [LoadingPath::CausalLm, LoadingPath::Vlm]
                    .into_iter()
                    .filter_map(|p| crate::loading::resolve(&session.ckpt, p).ok())
                    .find(|r| r.inventory.missing > 0);
                match missing_path {
                    Some(r) => {
                        let view = r
                            .view
                            .with_seed(opts.seed)
                            .with_device(session.spec.device.clone());
                        let head: &dyn WeightSource = if view.has_lm_head() {
                            &view
                        } else {
                            &base_path.view
                        };
                        let m = variant_model(&view, head, r.dtype.precision())?;
                        let (f, d, t) = own_model(&m, GdnForm::Chunked)?;
                        Some((format!("missing-{}", r.path.name()), f, d, t))
                    }
                    None => {
                        // No path misses anything here: emulate the commonest
                        // case (bug-log: tie only at the top level, lm_head
                        // absent -> causal-lm gets a random lm_head).
                        let shape = vec![tc.vocab_size, tc.hidden_size];
                        let w = crate::loading::view::init_tensor(
                            "lm_head.weight",
                            InitRule::Normal {
                                std: tc.initializer_range,
                            },
                            &shape,
                            Some(opts.seed),
                        )?
                        .to_device(&session.spec.device)?;
                        let src = SingleTensor(w);
                        let head = LmHead::load(&src, base_prec)?;
                        let m = base.clone().with_lm_head(Some(head));
                        notes.push(
                            "no path reports MISSING tensors on this checkpoint; the missing variant emulates a random lm_head (normal(0, initializer_range)), what causal-lm gets when tie_word_embeddings is set only at the top level and lm_head.weight is absent".into(),
                        );
                        let (f, d, t) = own_model(&m, GdnForm::Chunked)?;
                        Some(("missing-lm_head".into(), f, d, t))
                    }
                }
            }
            _ => None,
        };
        if let Some((name, f, d, t)) = outcome {
            let (first_divergent, cos_min_at_taps) =
                tap_divergence(&f, &base_feats, &taps, h, &tol)?;
            let tau_v = tau(&d, b);
            let shares_forward =
                matches!(kind, "tap-offset--1" | "tap-offset-+1" | "normed-last-tap");
            variants.push(VariantResult {
                name,
                description,
                first_divergent,
                cos_min_at_taps,
                tau_macro: tau_v,
                delta_tau: tau_v - baseline.tau_macro,
                ddtree_tau_macro: tau(&t, b),
                consistent_with_observed: opts
                    .observed_tau
                    .map(|o| (tau_v - o).abs() <= 0.25f64.max(0.1 * o)),
                wall_s: if shares_forward {
                    0.0
                } else {
                    tv.elapsed().as_secs_f64()
                },
            });
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    variants.sort_by(|a, b| b.delta_tau.abs().total_cmp(&a.delta_tau.abs()));
    let top: Vec<String> = variants
        .iter()
        .filter(|v| v.delta_tau < 0.0)
        .take(3)
        .map(|v| format!("{} (Δτ {:+.2})", v.name, v.delta_tau))
        .collect();
    let mut summary = format!(
        "baseline causal-lm τ {:.2}; {}",
        baseline.tau_macro,
        if top.is_empty() {
            "no suspect lowers τ".to_string()
        } else {
            format!("costliest suspects: {}", top.join(", "))
        }
    );
    if let Some(o) = opts.observed_tau {
        let ok: Vec<&str> = variants
            .iter()
            .filter(|v| v.consistent_with_observed == Some(true))
            .map(|v| v.name.as_str())
            .collect();
        summary.push_str(&format!(
            "; consistent with observed τ {o}: {}",
            if ok.is_empty() {
                "none".to_string()
            } else {
                ok.join(", ")
            }
        ));
    }
    Ok(TriageReport {
        schema_version: crate::report::SCHEMA_VERSION,
        verdict: Verdict::Pass,
        summary,
        exit_code: 0,
        command: opts.command_line.clone(),
        baseline,
        variants,
        observed_tau: opts.observed_tau,
        wall_time_s: t0.elapsed().as_secs_f64(),
        notes,
    })
}

/// A variant's name, its tap features on the baseline trajectory, and its
/// DFlash and DDTree replays.
type Replays = (Vec<Tensor>, Vec<PromptTau>, Vec<PromptTau>);

type Outcome = (String, Vec<Tensor>, Vec<PromptTau>, Vec<PromptTau>);

/// A one-tensor weight source (`lm_head.weight`).
struct SingleTensor(Tensor);

impl WeightSource for SingleTensor {
    fn tensor(&self, _name: &str) -> Result<Tensor> {
        Ok(self.0.clone())
    }
    fn identity(&self, name: &str) -> String {
        format!("synthetic:{name}")
    }
}

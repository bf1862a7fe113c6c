//! The help's epilogue: loading paths, exit codes and the verdict policy.

use crate::parity::Tolerance;
use crate::precision::Precision;

/// The top-level help's epilogue: loading paths, exit codes and the verdict
/// policy, its numbers from [`Tolerance::for_precision`].
pub(super) fn after_help() -> String {
    epilogue(
        "1 a finding: a row does not pass, a path has missing (randomly initialised) or non-finite tensors, the drafter was made for another target, or τ differs by more than --max-tau-gap",
    )
}

/// `diff`'s epilogue: its own findings (dumps, or checkpoints' tensors).
pub(super) fn diff_after_help() -> String {
    epilogue(
        "1 a finding: a compared hidden state, last_layer_output or the logits do not pass, a dump holds NaN/Inf, the --align offset is not 0; for two checkpoints, a tensor that differs or is held by one side only, or two different architectures",
    )
}

/// The epilogue with `findings` as exit code 1's meaning.
fn epilogue(findings: &str) -> String {
    let limits: Vec<String> = [Precision::F32, Precision::F16, Precision::Bf16]
        .iter()
        .map(|&p| {
            let t = Tolerance::for_precision(p);
            format!(
                "{p} {} / {:.0e} (warn {} / {:.0e})",
                t.pass_cos, t.pass_rel_l2, t.warn_cos, t.warn_rel_l2
            )
        })
        .collect();
    format!(
        "Loading paths: causal-lm (AutoModelForCausalLM), vlm (AutoModel), image-text-to-text (AutoModelForImageTextToText).\n\
         Exit codes: 0 parity holds and inventories are clean; {findings}; 2 bad input or usage (one line on stderr, nothing written). Numeric options are refused outside the range their help gives.\n\
         Verdicts: a row PASSes when bitwise equal or within the pass limits (cos_min ≥, rel L2 ≤), WARNs within the warn limits, else FAILs; a run passes only when every row passes (a WARN fails it: small is not equal). Limits by the dtype both paths computed in: {}; paths of different dtypes are held to f32's. The summary line names the rows that did not pass and the rule.",
        limits.join("; ")
    )
}

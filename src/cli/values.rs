//! How clap reads the typed values of the flags: loading paths, the delta
//! rule's form, the end rule and `--dtype`.

use clap::builder::PossibleValue;
use clap::ValueEnum;

use crate::drafter::eval::EndRule;
use crate::loading::LoadingPath;
use crate::models::GdnForm;
use crate::precision::Precision;

impl ValueEnum for LoadingPath {
    fn value_variants<'a>() -> &'a [Self] {
        &LoadingPath::ALL
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        let v = PossibleValue::new(self.name()).help(self.auto_class());
        Some(match self {
            LoadingPath::CausalLm => v.aliases(["causal_lm", "AutoModelForCausalLM"]),
            LoadingPath::Vlm => v.alias("AutoModel"),
            LoadingPath::ImageTextToText => {
                v.aliases(["image_text_to_text", "itt", "AutoModelForImageTextToText"])
            }
        })
    }
}

impl ValueEnum for GdnForm {
    fn value_variants<'a>() -> &'a [Self] {
        &[GdnForm::Chunked, GdnForm::Recurrent]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(PossibleValue::new(self.name()).help(match self {
            GdnForm::Chunked => {
                "Chunked delta rule (chunk 64): what transformers runs for a prefill"
            }
            GdnForm::Recurrent => "Token-by-token recurrence",
        }))
    }
}

impl ValueEnum for EndRule {
    fn value_variants<'a>() -> &'a [Self] {
        &[EndRule::GithubMain, EndRule::Wheel]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(match self {
            EndRule::GithubMain => PossibleValue::new("main")
                .help("z-lab GitHub main: full blocks every round, record a+1"),
            EndRule::Wheel => PossibleValue::new("wheel").help(
                "dflash 0.1.0 wheel: last blocks shrink, recorded lengths sum to max_new_tokens - 1",
            ),
        })
    }
}

/// `--dtype`: `auto` (what each loading path would pick) or a dtype for every path.
#[derive(Debug, Clone, Copy)]
pub(super) struct DtypeArg(pub(super) Option<Precision>);

impl ValueEnum for DtypeArg {
    fn value_variants<'a>() -> &'a [Self] {
        &[
            DtypeArg(None),
            DtypeArg(Some(Precision::F32)),
            DtypeArg(Some(Precision::Bf16)),
            DtypeArg(Some(Precision::F16)),
        ]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(match self.0 {
            None => PossibleValue::new("auto").help("What each loading path would load with"),
            Some(Precision::F32) => PossibleValue::new("f32").aliases(["float32", "fp32"]),
            Some(Precision::Bf16) => PossibleValue::new("bf16").alias("bfloat16"),
            Some(Precision::F16) => PossibleValue::new("f16").aliases(["float16", "fp16", "half"]),
        })
    }
}

/// A checkpoint or drafter argument (a directory or a Hub id): text, as Hub
/// ids and the transformers loaders take it; a path that is not UTF-8 is
/// refused naming it (lossily), not as an unnamed argument.
pub(super) fn dir_or_id() -> impl clap::builder::TypedValueParser<Value = String> {
    use clap::builder::TypedValueParser;
    clap::builder::OsStringValueParser::new().try_map(|s| {
        s.into_string().map_err(|s| {
            format!(
                "{} is not UTF-8: give the directory by a UTF-8 path (a symlink to it), or a Hub id",
                s.to_string_lossy()
            )
        })
    })
}

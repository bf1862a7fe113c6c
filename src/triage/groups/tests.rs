//! How suspects fall into groups, on the toy pair.

use super::*;
use crate::loading::LoadingPath;
use crate::precision::Precision;
use crate::session::Target;

/// Recipe of a loading-path suspect on `p` (its head, or the baseline's
/// where it loads none, as `Suspect::recipe` makes it), otherwise the
/// baseline's run.
fn on_path(p: crate::loading::inventory::ResolvedPath, form: GdnForm) -> Recipe {
    let head = match p.view.has_lm_head() {
        true => Head::Own,
        false => Head::Base,
    };
    Recipe::Model {
        prec: p.dtype,
        weights: Weights::Path(Box::new(p)),
        head,
        form,
        decode_shift: 0,
        lane: LaneEdit::default(),
        spec: None,
    }
}

/// Another loading path that loads the same tensors in the same dtype runs
/// exactly the baseline's lane: it is an alias of it, not a second lane;
/// the same path with another delta-rule form is a lane; a dtype of its
/// own is a group of its own.
#[test]
fn a_path_loading_the_baselines_tensors_is_an_alias_of_its_lane() {
    let target = Target {
        checkpoint: "fixtures/toy-pair/target".into(),
        prompts: crate::prompts::PromptOptions {
            file: Some("fixtures/toy-pair/prompts.jsonl".into()),
            ..Default::default()
        },
        ..Target::default()
    };
    let session = Session::open(&target, &[LoadingPath::CausalLm, LoadingPath::Vlm]).unwrap();
    let vlm = || session.resolve_extra(LoadingPath::Vlm, 0).unwrap();
    let mut f32_vlm = on_path(vlm(), GdnForm::Chunked);
    if let Recipe::Model { prec, .. } = &mut f32_vlm {
        *prec = Precision::F32;
    }
    let recipes = vec![
        on_path(vlm(), GdnForm::Chunked),
        on_path(vlm(), GdnForm::Recurrent),
        f32_vlm,
    ];
    let residents: Vec<Option<Resident>> = recipes.iter().map(|_| None).collect();
    let base = &session.paths[0].view;
    let base_target = TargetModel {
        spec: &session.spec,
        weights: base,
        head: base,
        prec: session.paths[0].dtype,
    };
    assert_ne!(
        base_target.prec,
        Precision::F32,
        "the f32 run is another dtype"
    );
    for given in [false, true] {
        let groups = build(&session, base_target, &recipes, &residents, given);
        assert_eq!(groups.len(), 2, "given {given}");
        assert_eq!(groups[0].aliases, [(0, 0)], "given {given}");
        let lanes: Vec<_> = groups[0].lanes.iter().map(|l| l.suspect).collect();
        assert_eq!(lanes, [None, Some(1)], "given {given}");
        assert_eq!(groups[1].lanes.len(), 1);
        assert!(groups[1].aliases.is_empty());
    }
}

//! A layer's tensor names are spelled in three places, each for its own
//! reader: the family's loader (`ModelFamily::load_layer`), its list
//! (`ModelFamily::layer_tensor_names`: which loading paths share a loaded
//! layer and are declared bitwise equal, which rows a random init taints)
//! and the state dict transformers builds (`loading::spec::text_tensors`,
//! with shapes and init rules, in registration order). Here the three
//! agree, layer by layer, on every family's fixture: the names a recording
//! weight source sees while a layer loads (eagerly: the source cannot be
//! shared, so an MoE layer reads its experts at once) are exactly the
//! listed ones, and so are the state dict's `layers.{i}.*` entries.

use std::collections::BTreeSet;
use std::sync::Mutex;

use candle_core::Tensor;

use crate::common;
use hsparity::error::Result;
use hsparity::loading::{LoadingPath, WeightSource};
use hsparity::models::DecoderLayer;
use hsparity::precision::Precision;
use hsparity::session::Session;

/// A weight source that forwards to `inner` and records every name asked for.
struct Recording<'a> {
    inner: &'a dyn WeightSource,
    names: Mutex<BTreeSet<String>>,
}

impl Recording<'_> {
    fn saw(&self, name: &str) {
        self.names.lock().unwrap().insert(name.to_string());
    }
}

impl WeightSource for Recording<'_> {
    fn tensor(&self, name: &str) -> Result<Tensor> {
        self.saw(name);
        self.inner.tensor(name)
    }
    fn identity(&self, name: &str) -> String {
        self.inner.identity(name)
    }
    fn tensor_in(&self, name: &str, prec: Precision) -> Result<Tensor> {
        self.saw(name);
        self.inner.tensor_in(name, prec)
    }
    fn rows(&self, name: &str, ids: &[u32], prec: Precision) -> Result<Tensor> {
        self.saw(name);
        self.inner.rows(name, ids, prec)
    }
    fn row_range(&self, name: &str, start: usize, len: usize, prec: Precision) -> Result<Tensor> {
        self.saw(name);
        self.inner.row_range(name, start, len, prec)
    }
    fn bf16_pairs(&self, name: &str) -> Result<hsparity::loading::PairWords> {
        self.saw(name);
        self.inner.bf16_pairs(name)
    }
    fn bf16_pair_rows(
        &self,
        name: &str,
        start: usize,
        len: usize,
    ) -> Result<hsparity::loading::PairWords> {
        self.saw(name);
        self.inner.bf16_pair_rows(name, start, len)
    }
    fn hold_pairs(&self, hold: bool) {
        self.inner.hold_pairs(hold)
    }
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.saw(name);
        self.inner.shape(name)
    }
    fn expert(&self, name: &str, e: usize, prec: Precision) -> Result<Tensor> {
        self.saw(name);
        self.inner.expert(name, e, prec)
    }
}

/// Every layer of `dir` (loaded on `path`, in f32 and bf16): the names its
/// loader reads are the family's list, with no name listed twice.
fn loader_reads_the_listed_names(dir: &str, path: LoadingPath) {
    let session = Session::open(&common::target(dir, None), &[path]).unwrap();
    let view = &session.paths[0].view;
    let expected = hsparity::loading::spec::text_tensors(&session.paths[0].text_config).unwrap();
    for l in 0..session.spec.num_layers() {
        let listed = session.spec.layer_tensor_names(l);
        let set: BTreeSet<String> = listed.iter().cloned().collect();
        assert_eq!(
            set.len(),
            listed.len(),
            "{dir} layer {l}: a name listed twice"
        );
        let prefix = format!("layers.{l}.");
        let state_dict: BTreeSet<String> = expected
            .iter()
            .filter(|t| t.key.starts_with(&prefix))
            .map(|t| t.key.clone())
            .collect();
        assert_eq!(
            state_dict, set,
            "{dir} layer {l}: loading/spec.rs expects other names"
        );
        for prec in [Precision::F32, Precision::Bf16] {
            let rec = Recording {
                inner: view,
                names: Mutex::new(BTreeSet::new()),
            };
            DecoderLayer::load(&session.spec, &rec, l, prec).unwrap();
            let read = rec.names.into_inner().unwrap();
            assert_eq!(
                read, set,
                "{dir} layer {l} ({:?}, {prec:?}): the loader reads other names than \
                 layer_tensor_names lists",
                session.spec.layer_types[l]
            );
        }
    }
}

#[test]
fn qwen3_5_layers_read_the_listed_tensors() {
    loader_reads_the_listed_names("fixtures/tiny-qwen3_5", LoadingPath::CausalLm);
}

#[test]
fn qwen3_layers_read_the_listed_tensors() {
    loader_reads_the_listed_names("fixtures/tiny-qwen3", LoadingPath::CausalLm);
}

#[test]
fn qwen3_5_moe_layers_read_the_listed_tensors() {
    for layout in ["qwen3.5-fused", "qwen3.6-fused", "per-expert"] {
        loader_reads_the_listed_names(&format!("fixtures/moe/{layout}"), LoadingPath::CausalLm);
    }
}

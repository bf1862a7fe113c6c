//! The end of a capture: the LM head in vocabulary chunks for every path
//! with one, and what the capture will materialise (for the progress bar).

use candle_core::Tensor;

use super::share::{group_bytes, same_input, share_groups, tensor_bytes};
use super::Run;
use crate::error::Result;
use crate::models::LmHead;

impl Run<'_> {
    /// Logits of every path with an LM head: `lm_head.weight` in vocabulary
    /// chunks, each chunk read once for all paths sharing it (same bytes,
    /// same dtype), and run once per bitwise-distinct input.
    pub(super) fn logits(&self, states: &[Vec<Tensor>]) -> Result<Vec<Option<Vec<Tensor>>>> {
        let names = ["lm_head.weight".to_string()];
        let groups = share_groups(self.paths, &names);
        let paths = self.paths;
        let mut logits: Vec<Option<Vec<Tensor>>> = vec![None; paths.len()];
        for p in (0..paths.len()).filter(|&p| paths[p].has_lm_head && groups[p] == p) {
            let members: Vec<usize> = (p..paths.len())
                .filter(|&q| paths[q].has_lm_head && groups[q] == p)
                .collect();
            let mut distinct: Vec<usize> = Vec::new();
            let mut same_as: Vec<usize> = Vec::with_capacity(members.len());
            for &q in &members {
                let seen = distinct
                    .iter()
                    .enumerate()
                    .map(|(j, &r)| (j, states[r].as_slice()));
                same_as.push(match same_input(seen, &states[q])? {
                    Some(j) => j,
                    None => {
                        distinct.push(q);
                        distinct.len() - 1
                    }
                });
            }
            let inputs: Vec<&[Tensor]> = distinct.iter().map(|&r| states[r].as_slice()).collect();
            let out = LmHead::forward_streamed(paths[p].source, paths[p].precision, &inputs)?;
            self.progress.loading.inc(tensor_bytes(&paths[p], &names));
            for (&q, &j) in members.iter().zip(&same_as) {
                logits[q] = Some(out[j].clone());
            }
        }
        Ok(logits)
    }

    /// Stored bytes the capture will read (each shared copy once).
    pub(super) fn total_bytes(&self) -> u64 {
        let paths = self.paths;
        let shared = |names: &[String]| group_bytes(paths, names, &share_groups(paths, names));
        let head = ["lm_head.weight".to_string()];
        let head_groups = share_groups(paths, &head);
        (0..self.spec.num_layers())
            .map(|l| shared(&self.spec.layer_tensor_names(l)))
            .sum::<u64>()
            + shared(&["norm.weight".to_string()])
            + (0..paths.len())
                .filter(|&p| paths[p].has_lm_head && head_groups[p] == p)
                .map(|p| tensor_bytes(&paths[p], &head))
                .sum::<u64>()
    }
}

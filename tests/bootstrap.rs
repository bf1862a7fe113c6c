//! The paired bootstrap interval on Δτ (`hsparity::drafter::bootstrap`)
//! against a case computed by hand, and its determinism under the seed.

use hsparity::drafter::bootstrap::{Bootstrap, RESAMPLES};
use statrs::distribution::{Binomial, DiscreteCDF};

/// Per-prompt differences d = [0, 0, 0, 3]: a resample of the 4 prompts
/// holds k copies of the 3 with k ~ Binomial(4, 1/4), so its mean is 0.75k.
/// P(k = 0) = 81/256 ≈ 0.32 > 2.5 %, so the lower end is 0;
/// P(k ≤ 2) = 243/256 ≈ 0.949 < 97.5 % ≤ P(k ≤ 3) = 255/256, so the upper
/// end is 0.75 · 3 = 2.25. Both ends sit far inside a plateau of the
/// distribution (3 % and 2 % of the mass away), so 10 000 resamples find
/// them whatever the seed.
#[test]
fn interval_matches_the_exact_bootstrap_distribution() {
    let cdf = Binomial::new(0.25, 4).unwrap();
    assert!((cdf.cdf(0) - 81.0 / 256.0).abs() < 1e-12);
    assert!((cdf.cdf(2) - 243.0 / 256.0).abs() < 1e-12);
    let d = [0.0, 0.0, 0.0, 3.0];
    for seed in [0, 1, 42] {
        let i = Bootstrap::seeded(seed).mean(&d).unwrap();
        assert_eq!((i.low, i.high), (0.0, 2.25), "seed {seed}");
        assert!(i.contains_zero, "the interval [0, 2.25] holds 0");
        assert_eq!(i.prompts, 4);
        assert_eq!(
            i.verdict().as_deref(),
            Some("not distinguishable with 4 prompts")
        );
    }
    // Shifted by −1 (d = [−1, −1, −1, 2]): [−1, 1.25], still holding 0; by
    // −3 (all below 0 but one): [−3, −0.75], distinguishable.
    let i = Bootstrap::seeded(0).mean(&[-1.0, -1.0, -1.0, 2.0]).unwrap();
    assert_eq!((i.low, i.high), (-1.0, 1.25));
    let i = Bootstrap::seeded(0).mean(&[-3.0, -3.0, -3.0, 0.0]).unwrap();
    assert_eq!((i.low, i.high), (-3.0, -0.75));
    assert!(!i.contains_zero && i.verdict().is_none());
}

/// `delta` is the interval of the paired differences: a − b per prompt.
#[test]
fn delta_pairs_the_prompts() {
    let a = [4.0, 5.0, 6.0, 9.0];
    let b = [4.0, 5.0, 6.0, 6.0];
    assert_eq!(
        Bootstrap::seeded(7).delta(&a, &b),
        Bootstrap::seeded(7).mean(&[0.0, 0.0, 0.0, 3.0])
    );
    // Counts that differ, or a single prompt: no interval.
    assert!(Bootstrap::seeded(7).delta(&a, &b[..3]).is_none());
    assert!(Bootstrap::seeded(7).mean(&[1.0]).is_none());
}

/// One seed, one interval (bit for bit); another seed resamples other prompts.
#[test]
fn interval_is_deterministic_under_the_seed() {
    let d = [0.13, -0.42, 0.9, 0.05, -0.2, 0.61, 0.33];
    let a = Bootstrap::seeded(3).mean(&d).unwrap();
    let b = Bootstrap::seeded(3).mean(&d).unwrap();
    assert_eq!(a.low.to_bits(), b.low.to_bits());
    assert_eq!(a.high.to_bits(), b.high.to_bits());
    let others: Vec<_> = (4..8)
        .map(|s| Bootstrap::seeded(s).mean(&d).unwrap())
        .collect();
    assert!(others.iter().any(|o| (o.low, o.high) != (a.low, a.high)));
    assert_eq!(Bootstrap::seeded(3).resamples, RESAMPLES);
}

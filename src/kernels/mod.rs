//! hsparity's hand-written CPU kernels: products that give candle's own
//! bits faster than candle (and, on AMX CPUs, bf16 products in the tile
//! unit's sums), on slices, with one dispatch policy.
//!
//! A foundation room: it imports no model, loading or tensor code. Its
//! callers ([`crate::models::layers::Matrix`]) adapt candle tensors to the
//! slices here and fall back to candle's GEMM, the oracle every kernel is
//! tested against bit for bit, wherever no kernel is planned.
//!
//! The policy, in one place:
//! - [`Capabilities`] is read once per process ([`capabilities`]): the CPU's
//!   features (CPUID; the bf16 instruction's rate timed once,
//!   [`Capabilities::bf16_dot_slow`]) and the environment switches
//!   (`HSPARITY_NO_AVX512_GEMM`, `HSPARITY_NO_BF16_DOT`, `HSPARITY_NO_AMX`,
//!   `HSPARITY_NO_AVX512_DELTA` and `HSPARITY_FORCE_BF16_DOT`, set to any
//!   value).
//! - [`plan`] answers "which kernel computes `x [m, k] · w [n, k]ᵀ` exactly
//!   here?" for every kernel, from candle's route for that shape
//!   ([`routes::route`]) and the capabilities; `None` means candle's GEMM.
//! - A [`Plan`] is the only way to run a product kernel; [`Plan::run`]
//!   refuses one this CPU cannot execute (a plan made for other
//!   capabilities), and records the kernel's name ([`ran`]) for the report's
//!   `environment.kernels`. The Gated DeltaNet's head loops, compiled three
//!   times in `models::qwen3_5::delta_rule`, pick their widest build from the
//!   same capabilities and record it as [`Kernel::DeltaRuleAvx512`] or
//!   [`Kernel::DeltaRuleAvx2`].
//! - The products' arithmetic lives in per-architecture modules behind
//!   `cfg` (`x86_64`: AVX-512 FMA, AVX512-BF16); on any other architecture
//!   the capabilities are all off, no plan is made, and candle's GEMM
//!   computes everything, with the same results.
//!
//! Outside the policy: reading a checkpoint's bf16 bytes as [`Pairs`]
//! words ([`words_from_bytes`]) takes AVX-512BW wherever the CPU has it,
//! with no switch and no entry in [`ran`]: it is a copy with a rotate, the
//! same words and NaN/Inf counts as its scalar loop on every input. The
//! same holds for widening a tensor's f16 bytes to f32
//! (`checkpoint::weights`, `vcvtph2ps` where the CPU has AVX-512F), for
//! the roundings' and the layers' elementwise tails' AVX-512F builds
//! (`precision`, `models::layers::elementwise`, the causal conv): exact
//! conversions, bit operations and the same IEEE operations in the same
//! order, the same values in every build.
//!
//! Every kernel but one gives candle's bits, so those switches change speed
//! only. The exception is [`Kernel::Bf16Amx`]: on a CPU with AMX-BF16 a
//! model computing in bf16 takes its products on AMX tiles, whose sums are
//! the tile unit's, not candle's (its module docs, `x86_64/amx.rs`); so a
//! bf16 run's numbers there agree with other CPUs' to the noise floor, not
//! bitwise, and `HSPARITY_NO_AMX` brings candle's sums back. No switch
//! changes which checks a command runs (`compare` decides its incremental
//! check from the CPU, [`Capabilities::cpu_reads_weights_once`]).

pub mod routes;

mod pairs;
#[cfg(target_arch = "x86_64")]
mod x86_64;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

pub use pairs::{words_from_bytes, Pairs, Words};
pub use routes::{route, Route};

use crate::error::Result;

/// What this process may run: the CPU's features and the environment's
/// switches, read once ([`capabilities`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities {
    /// AVX2 (the delta rule's wide build).
    pub avx2: bool,
    /// AVX-512F with FMA and AVX2 (the f32 and single-row kernels).
    pub avx512f: bool,
    /// AVX512-BF16 whose `vdpbf16ps` adds as the bf16 kernel assumes
    /// (probed once: odd element first, each addition rounded).
    pub avx512bf16: bool,
    /// `vdpbf16ps` makes fewer than [`DOT_RATE_PAYS`] times the
    /// multiply-adds per second of AVX-512 FMAs on this core (measured once
    /// at start-up; half of them on an Emerald Rapids Xeon): the f32
    /// kernel, widening the pairs as it reads them, takes the blocked
    /// products of bf16 pairs instead of the bf16 kernel, with the same sums,
    /// unless [`Capabilities::force_bf16_dot`] or the f32 kernel is off
    /// ([`plan`]).
    pub bf16_dot_slow: bool,
    /// AMX-BF16 and AMX-TILE, the tile state granted by the OS and a tile
    /// product checked on known values.
    pub amx_bf16: bool,
    /// The CPU has AMX-BF16 but the OS refused the tile state
    /// (`arch_prctl(ARCH_REQ_XCOMP_PERM)`): the AMX kernel cannot run.
    pub amx_refused: bool,
    /// `HSPARITY_NO_AVX512_GEMM` is set: the f32 and single-row kernels off.
    pub no_avx512_gemm: bool,
    /// `HSPARITY_NO_BF16_DOT` is set: the bf16 kernel off.
    pub no_bf16_dot: bool,
    /// `HSPARITY_NO_AMX` is set: the AMX kernel off (candle's sums).
    pub no_amx: bool,
    /// `HSPARITY_NO_AVX512_DELTA` is set: the delta rule's AVX-512F build off
    /// (its AVX2 build runs).
    pub no_avx512_delta: bool,
    /// `HSPARITY_FORCE_BF16_DOT` is set: the bf16 kernel takes its products
    /// even where its instruction is slow (for benchmarks and tests).
    pub force_bf16_dot: bool,
}

impl Capabilities {
    /// This CPU's features and this process's environment.
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        let cpu = x86_64::detect();
        #[cfg(not(target_arch = "x86_64"))]
        let cpu = Self::default();
        Self {
            no_avx512_gemm: std::env::var_os("HSPARITY_NO_AVX512_GEMM").is_some(),
            no_bf16_dot: std::env::var_os("HSPARITY_NO_BF16_DOT").is_some(),
            no_amx: std::env::var_os("HSPARITY_NO_AMX").is_some(),
            no_avx512_delta: std::env::var_os("HSPARITY_NO_AVX512_DELTA").is_some(),
            force_bf16_dot: std::env::var_os("HSPARITY_FORCE_BF16_DOT").is_some(),
            ..cpu
        }
    }

    /// No kernel at all (candle's GEMM everywhere), as on an architecture
    /// without one.
    pub fn none() -> Self {
        Self::default()
    }

    /// The f32 blocked kernel and the single-row kernel may run.
    pub fn avx512_gemm(&self) -> bool {
        self.avx512f && !self.no_avx512_gemm
    }

    /// The bf16 dot-product kernel may run.
    pub fn bf16_gemm(&self) -> bool {
        self.avx512f && self.avx512bf16 && !self.no_bf16_dot
    }

    /// The AMX kernel may run.
    pub fn bf16_amx(&self) -> bool {
        self.amx_bf16 && !self.no_amx
    }

    /// A bf16 model's weight may be kept as its [`Pairs`] (a bf16 kernel
    /// may read them).
    pub fn keeps_bf16_pairs(&self) -> bool {
        self.bf16_gemm() || self.bf16_amx()
    }

    /// A cached decode's single-token steps can read each weight once for
    /// all steps on this CPU (the single-row kernel exists here), whatever
    /// the switches say: what `compare` decides its default incremental
    /// check from, so that a switch changes its speed, not whether it runs.
    pub fn cpu_reads_weights_once(&self) -> bool {
        self.avx512f
    }

    /// The CPU features the kernels look at, by name.
    pub fn cpu_features(&self) -> Vec<&'static str> {
        names_on([
            (self.avx2, "avx2"),
            (self.avx512f, "avx512f"),
            (self.avx512bf16, "avx512bf16"),
            (self.avx512bf16 && self.bf16_dot_slow, "avx512bf16-slow"),
            (self.amx_bf16, "amx-bf16"),
        ])
    }

    /// What turned kernels off, by name: the environment's switches that are
    /// set, and `ARCH_REQ_XCOMP_PERM refused` where the OS refused AMX's tile
    /// state (the report's `environment.kernels.disabled_by`).
    pub fn disabled_by(&self) -> Vec<&'static str> {
        names_on([
            (self.no_avx512_gemm, "HSPARITY_NO_AVX512_GEMM"),
            (self.no_bf16_dot, "HSPARITY_NO_BF16_DOT"),
            (self.no_amx, "HSPARITY_NO_AMX"),
            (self.no_avx512_delta, "HSPARITY_NO_AVX512_DELTA"),
            (self.amx_refused, "ARCH_REQ_XCOMP_PERM refused"),
        ])
    }

    /// The kernels that may run, by name.
    pub fn available(&self) -> Vec<&'static str> {
        Kernel::ALL
            .into_iter()
            .filter(|k| match k {
                Kernel::F32Gemm | Kernel::Gemv => self.avx512_gemm(),
                Kernel::Bf16Gemm => self.bf16_gemm(),
                Kernel::Bf16Amx => self.bf16_amx(),
                Kernel::DeltaRuleAvx2 => self.avx2,
                Kernel::DeltaRuleAvx512 => self.avx512f && !self.no_avx512_delta,
            })
            .map(Kernel::name)
            .collect()
    }
}

/// The multiply-add rate of `vdpbf16ps` over AVX-512 FMAs' below which the
/// bf16 kernel does not pay ([`Capabilities::bf16_dot_slow`]). The bf16
/// kernel runs at about 95 % of its instruction's rate, the f32 kernel on
/// the same pairs at 50–70 % of the FMA's (it widens them first), so the
/// two break even at a rate of about 0.6–0.7. Measured: 0.49–0.55 on an
/// Emerald Rapids Xeon (CPUID model 207) without AMX, where on the 27B
/// layout's shapes the bf16 kernel reaches 145–167 GFLOP/s and the f32
/// kernel on the pairs 170–245 (`examples/gemm_bench.rs`,
/// docs/performance.md); about 2 by AMD Zen 4's and Zen 5's instruction
/// tables, which issue it as often as an FMA (not measured).
pub const DOT_RATE_PAYS: f64 = 0.75;

/// One thread's f32 multiply-add rate on this core with the operands in
/// registers, in GFLOP/s (AVX-512F FMAs, two per lane), timed now (the
/// best of 7 timings of 24,000 FMAs, well under 1 ms): the ceiling of the
/// f32 kernel per thread. `None` without
/// AVX-512F or off x86-64.
pub fn fma_rate() -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        x86_64::fma_rate()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// `vdpbf16ps`'s multiply-adds per second over AVX-512 FMAs' on this core,
/// timed now (about 0.2 ms); `None` without AVX-512F and AVX512-BF16 or off
/// x86-64. [`Capabilities::detect`] compares it with [`DOT_RATE_PAYS`].
pub fn bf16_dot_rate() -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        x86_64::bf16_dot_rate()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// `out[i] = e^{−x[i]}` for every value of `x` (`out` at least as long),
/// with the bits of this process's libm `expf`, as `(-x).exp()` gives them
/// (candle's `silu` makes that call per value): 16 values at a time where
/// the CPU has AVX-512F and the vector build reproduces this libm (glibc's
/// algorithm, checked once per process: `x86_64/expf.rs`), else one libm
/// call per value.
pub fn exp_negated(x: &[f32], out: &mut [f32]) {
    assert!(out.len() >= x.len(), "an output per value");
    #[cfg(target_arch = "x86_64")]
    if capabilities().avx512f && x86_64::expf::matches_libm() {
        // SAFETY: the CPU has AVX-512F (read from CPUID with the
        // capabilities); `out` holds a value per input (asserted).
        return unsafe { x86_64::expf::exp_negated(x, out) };
    }
    exp_negated_libm(x, out);
}

/// [`exp_negated`] by libm, in the crate's baseline build whatever its
/// caller's: inlined into an AVX-512F loop, the calls are made from 16-lane
/// vectors taken apart and spilled around each call, which made the pass
/// 45 % slower (3.8 against 2.6 ns a value on an Emerald Rapids Xeon).
#[inline(never)]
fn exp_negated_libm(x: &[f32], out: &mut [f32]) {
    for (o, &x) in out.iter_mut().zip(x) {
        *o = (-x).exp();
    }
}

/// This process's capabilities, read on first use.
pub fn capabilities() -> &'static Capabilities {
    static CAPS: OnceLock<Capabilities> = OnceLock::new();
    CAPS.get_or_init(Capabilities::detect)
}

/// A kernel of this room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// candle's blocked f32 route on 16-lane FMAs.
    F32Gemm,
    /// candle's blocked f32 route on bf16 pairs (`vdpbf16ps`).
    Bf16Gemm,
    /// bf16 pairs on AMX tiles (`TDPBF16PS`), in the tile unit's sums, not
    /// candle's.
    Bf16Amx,
    /// candle's single-row route, many rows in one pass over the weight.
    Gemv,
    /// The Gated DeltaNet's head loops compiled for AVX2
    /// (`models::qwen3_5::delta_rule`: the same operations, wider lanes).
    DeltaRuleAvx2,
    /// The same loops compiled for AVX-512F.
    DeltaRuleAvx512,
}

impl Kernel {
    /// Every kernel, in the order reports list them.
    pub const ALL: [Kernel; 6] = [
        Kernel::F32Gemm,
        Kernel::Bf16Gemm,
        Kernel::Bf16Amx,
        Kernel::Gemv,
        Kernel::DeltaRuleAvx2,
        Kernel::DeltaRuleAvx512,
    ];

    /// The name reports use.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::F32Gemm => "f32-gemm-avx512",
            Kernel::Bf16Gemm => "bf16-gemm-avx512bf16",
            Kernel::Bf16Amx => "bf16-gemm-amx",
            Kernel::Gemv => "gemv-avx512",
            Kernel::DeltaRuleAvx2 => "delta-rule-avx2",
            Kernel::DeltaRuleAvx512 => "delta-rule-avx512",
        }
    }

    fn slot(self) -> &'static AtomicBool {
        static RAN: [AtomicBool; Kernel::ALL.len()] =
            [const { AtomicBool::new(false) }; Kernel::ALL.len()];
        &RAN[self as usize]
    }

    /// Records that this kernel ran (see [`ran`]).
    pub fn record(self) {
        self.slot().store(true, Ordering::Relaxed);
    }
}

/// The kernels that have run in this process so far, by name.
pub fn ran() -> Vec<&'static str> {
    Kernel::ALL
        .into_iter()
        .filter(|k| k.slot().load(Ordering::Relaxed))
        .map(Kernel::name)
        .collect()
}

/// How a weight is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// f32, row-major `[n, k]`.
    F32,
    /// bf16 pairs ([`Pairs`]).
    Bf16,
}

/// A weight `[n, k]` as the kernels read it.
#[derive(Clone, Copy)]
pub enum Weight<'a> {
    /// f32, row-major.
    F32(&'a [f32]),
    /// bf16 pairs.
    Bf16(&'a Pairs),
    /// bf16 pairs read as their values rounded to f16 (to nearest, ties to
    /// even): a bf16 checkpoint in a model computing in f16, whose f32 copy
    /// would hold those values. The bf16 kernels do not read it.
    Bf16InF16(&'a Pairs),
}

impl Weight<'_> {
    /// How it is held.
    pub fn stored(&self) -> Stored {
        match self {
            Weight::F32(_) => Stored::F32,
            Weight::Bf16(_) | Weight::Bf16InF16(_) => Stored::Bf16,
        }
    }
}

/// A product a kernel computes exactly: made by [`plan`] only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    kernel: Kernel,
    m: usize,
    n: usize,
    k: usize,
    kc: usize,
}

/// The kernel that computes `x [m, k] · w [n, k]ᵀ` (`w` held as `stored`)
/// bit for bit as candle's CPU matmul does, under `caps` — or, for bf16
/// pairs on a CPU with AMX-BF16, in the tile unit's sums; `None`: candle's
/// GEMM (the route no kernel here reproduces, or a CPU or switch without
/// it). For a bf16 weight on the blocked route where the bf16 kernel cannot
/// sum as candle does (an odd k-block) the plan is the f32 kernel, which
/// reads the pairs too, widening each value once per product.
///
/// - a single row on candle's gemv route: [`Kernel::Gemv`];
/// - the blocked route: [`Kernel::Bf16Amx`] for bf16 pairs where AMX may
///   run (any k-block: its sums are its own), else [`Kernel::Bf16Gemm`] for
///   bf16 pairs with an even k-block (or one block) unless its instruction
///   is slow here and the f32 kernel may run
///   ([`Capabilities::bf16_dot_slow`]: the f32 kernel makes the same sums
///   faster), else [`Kernel::F32Gemm`];
/// - anything else (`m·n <= 256`, `k <= 2`, a single column): none.
pub fn plan(m: usize, n: usize, k: usize, stored: Stored, caps: &Capabilities) -> Option<Plan> {
    let make = |kernel, kc| Plan {
        kernel,
        m,
        n,
        k,
        kc,
    };
    match route(m, n, k) {
        Route::Gemv if m == 1 && caps.avx512_gemm() => Some(make(Kernel::Gemv, k)),
        Route::Blocked { kc, .. } => {
            let pairs_fit = kc.is_multiple_of(2) || kc >= k;
            let dot_pays = !(caps.bf16_dot_slow && caps.avx512_gemm()) || caps.force_bf16_dot;
            if stored == Stored::Bf16 && caps.bf16_amx() {
                Some(make(Kernel::Bf16Amx, kc))
            } else if stored == Stored::Bf16 && pairs_fit && dot_pays && caps.bf16_gemm() {
                Some(make(Kernel::Bf16Gemm, kc))
            } else if caps.avx512_gemm() {
                Some(make(Kernel::F32Gemm, kc))
            } else {
                None
            }
        }
        _ => None,
    }
}

impl Plan {
    /// The kernel.
    pub fn kernel(&self) -> Kernel {
        self.kernel
    }

    /// The k-block the sums are made in (`k` for [`Kernel::Gemv`]; candle's
    /// for [`Kernel::Bf16Amx`], which sums 16 pairs per tile step instead).
    pub fn kc(&self) -> usize {
        self.kc
    }

    /// `[m, n, k]`.
    pub fn dims(&self) -> [usize; 3] {
        [self.m, self.n, self.k]
    }

    /// `x [m, k] · w [n, k]ᵀ` → `[m, n]` row-major, not rounded; for a
    /// [`Kernel::Gemv`] plan `x` may hold any number of rows `s`, each its
    /// own single-row product (`[s, n]`). `None` when the bf16 kernel finds
    /// an input value that is not a bf16 value (the caller takes the f32
    /// route).
    ///
    /// Errors: `x` or `w` do not hold the planned shape, or `w` is not held
    /// as the plan's kernel reads it.
    pub fn run(&self, x: &[f32], w: Weight<'_>) -> Result<Option<Vec<f32>>> {
        let (m, n, k) = (self.m, self.n, self.k);
        let refuse = |why: &str| -> crate::error::Error {
            candle_core::Error::Msg(format!(
                "{} of x [{m}, {k}] and w [{n}, {k}]: {why}",
                self.kernel.name()
            ))
            .into()
        };
        let w_fits = match w {
            Weight::F32(v) => v.len() == n * k,
            Weight::Bf16(p) | Weight::Bf16InF16(p) => p.dims() == [n, k],
        };
        if !w_fits {
            return Err(refuse("the weight does not hold [n, k]"));
        }
        let x_fits = match self.kernel {
            Kernel::Gemv => x.len().is_multiple_of(k.max(1)),
            _ => x.len() == m * k,
        };
        if !x_fits {
            return Err(refuse("the input does not hold [m, k]"));
        }
        // The f32 and single-row kernels read every form (bf16 pairs
        // widened as they go); the bf16 kernels read pairs as stored.
        let reads = matches!(
            (self.kernel, w),
            (Kernel::F32Gemm | Kernel::Gemv, _)
                | (Kernel::Bf16Gemm | Kernel::Bf16Amx, Weight::Bf16(_))
        );
        if !reads {
            return Err(refuse("the weight is not held as this kernel reads it"));
        }
        // A plan may have been made for other capabilities than this CPU's
        // (`plan` takes any): the instructions must exist here.
        let cpu = capabilities();
        let here = match self.kernel {
            Kernel::F32Gemm | Kernel::Gemv => cpu.avx512f,
            Kernel::Bf16Gemm => cpu.avx512f && cpu.avx512bf16,
            Kernel::Bf16Amx => cpu.amx_bf16,
            Kernel::DeltaRuleAvx2 | Kernel::DeltaRuleAvx512 => false,
        };
        if !here {
            return Err(refuse("this CPU lacks the kernel's instructions"));
        }
        self.kernel.record();
        #[cfg(target_arch = "x86_64")]
        {
            Ok(x86_64::run(self, x, w))
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (x, w);
            Err(refuse("no kernel on this architecture"))
        }
    }
}

/// The names whose flag is on, in order.
fn names_on<const N: usize>(flags: [(bool, &'static str); N]) -> Vec<&'static str> {
    flags
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect()
}

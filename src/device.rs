//! The compute device a run uses: `cpu` (default), or `cuda` / `cuda:N` in a
//! build with the `cuda` cargo feature (candle's CUDA backend).
//!
//! On a GPU the weights are still read, converted and NaN-scanned on the host
//! one tensor at a time (from the shared mmap) and then copied to the device;
//! matmuls, norms, attention and the MLP run there; the Gated DeltaNet conv and
//! delta-rule kernels and the per-layer statistics run on the host (plain Rust
//! loops, as on the CPU), so their inputs and outputs cross the bus once per
//! layer.

use std::fmt;
use std::str::FromStr;

use candle_core::Device;

use crate::error::{Error, Result};

/// Where tensors live: the `--device` option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceSpec {
    /// The host (candle's CPU backend; all cores).
    #[default]
    Cpu,
    /// CUDA device ordinal N (`cuda` = `cuda:0`).
    Cuda(usize),
}

impl FromStr for DeviceSpec {
    type Err = Error;

    /// Parses `cpu`, `cuda` or `cuda:N`.
    ///
    /// Errors ([`Error::Input`]): anything else.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::Input("expected cpu, cuda or cuda:N (N a device ordinal)".into());
        match s {
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" => Ok(DeviceSpec::Cuda(0)),
            _ => {
                let n = s.strip_prefix("cuda:").ok_or_else(bad)?;
                if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad());
                }
                n.parse().map(DeviceSpec::Cuda).map_err(|_| bad())
            }
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Cpu => write!(f, "cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl DeviceSpec {
    /// True when this build has the `cuda` feature.
    pub const CUDA_BUILD: bool = cfg!(feature = "cuda");

    /// Opens the device.
    ///
    /// Errors ([`Error::Input`], exit code 2): `cuda:N` in a build without the
    /// `cuda` feature (the message says how to rebuild), or a device the
    /// driver cannot open (no GPU, ordinal out of range, no driver).
    pub fn open(self) -> Result<Device> {
        match self {
            DeviceSpec::Cpu => Ok(Device::Cpu),
            DeviceSpec::Cuda(n) => {
                if !Self::CUDA_BUILD {
                    return Err(Error::Input(format!(
                        "--device cuda:{n}: this hsparity was built without CUDA support; \
                         rebuild with `cargo build --release --features cuda` (needs the CUDA \
                         toolkit: nvcc on PATH)"
                    )));
                }
                Device::new_cuda(n).map_err(|e| {
                    Error::Input(format!("--device cuda:{n}: cannot open the GPU: {e}"))
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_device_names() {
        for (s, d) in [
            ("cpu", DeviceSpec::Cpu),
            ("cuda", DeviceSpec::Cuda(0)),
            ("cuda:0", DeviceSpec::Cuda(0)),
            ("cuda:3", DeviceSpec::Cuda(3)),
        ] {
            assert_eq!(s.parse::<DeviceSpec>().unwrap(), d, "{s}");
        }
        assert_eq!(DeviceSpec::Cuda(3).to_string(), "cuda:3");
        assert_eq!(DeviceSpec::Cpu.to_string(), "cpu");
        for bad in [
            "", "gpu", "cuda:", "cuda:-1", "cuda:x", "cuda:+1", "CPU", "metal",
        ] {
            let e = bad.parse::<DeviceSpec>().unwrap_err().to_string();
            assert!(e.contains("expected cpu, cuda or cuda:N"), "{bad}: {e}");
        }
    }

    #[test]
    fn cpu_opens_and_cuda_needs_the_feature() {
        assert!(DeviceSpec::Cpu.open().unwrap().is_cpu());
        if !DeviceSpec::CUDA_BUILD {
            let e = DeviceSpec::Cuda(0).open().unwrap_err();
            assert!(matches!(e, Error::Input(_)));
            assert!(e.to_string().contains("--features cuda"), "{e}");
        }
    }
}

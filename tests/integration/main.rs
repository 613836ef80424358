//! The integration tests, in one test binary.
//!
//! Each file here is one area (the CLI, the loaders, the experiments, …). They are modules of a
//! single crate rather than one crate per file because every test crate links the whole library
//! with polars and candle inside: twenty binaries of 50–150 MB each took about 2 GB of disk and
//! twenty link steps on a 2-core CI machine, and a CI run once died in the linker (a bus error, most likely a full disk).
//! One binary links once; `cargo test --test integration <module>::` runs one area.
//! (`tests/hub.rs` stays its own crate: it needs `--features hub`.)

mod architecture;
mod cli;
mod embedded_dataset;
mod experiments;
mod fewshot;
mod kernel_abi;
mod loaders;
mod losses_baselines;
mod losses_smooth_rank;
mod metrics_reference;
mod models;
mod ondisk;
mod pipeline;
mod report;
mod rerank;
mod retrieval_engine;
mod samplers;
mod ssr;
mod ssr_features;
mod synthetic_on_disk;
mod train;

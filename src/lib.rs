//! kipam: multi-cluster IP address management for Kubernetes.
//!
//! The pure core takes plain data and returns plain data: [`address`], [`allocator`],
//! [`resources`] (the CRD types), [`validation`], [`planner`], [`desired`] (objects a plan asks
//! for), [`status`] and [`render`]. The adapters at the edges do the I/O: [`offline`] against
//! files, [`controller`] against the API server, [`applier`] inside user clusters, and the `kipam` binary's command line.

pub mod address;
pub mod allocator;
pub mod applier;
pub mod controller;
pub mod desired;
pub mod offline;
pub mod planner;
pub mod render;
pub mod reservations;
pub mod resources;
pub mod status;
pub mod validation;

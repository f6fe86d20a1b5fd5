//! kipam: multi-cluster IP address management for Kubernetes.
//!
//! The pure core takes plain data and returns plain data: [`address`], [`allocator`],
//! [`resources`] (the CRD types), [`validation`], [`planner`], [`desired`] (objects a plan asks
//! for), [`status`] and [`render`]. The adapters at the edges do the I/O: [`offline`] against
//! files, [`controller`] against the API server, [`applier`] inside user clusters, [`api`] (the
//! seed REST API, served by the controller), [`webhook`] (admission reviews, decided by the
//! pure [`webhook::rules`]) served over [`tls`], and the `kipam` binary's command line.

pub mod address;
pub mod allocator;
pub mod api;
pub mod applier;
pub mod controller;
pub mod desired;
pub mod offline;
pub mod planner;
pub mod planning;
pub mod rbac;
pub mod render;
pub mod reservations;
pub mod resources;
pub mod seed;
pub mod status;
pub mod tls;
pub mod validation;
pub mod webhook;

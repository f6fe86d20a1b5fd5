//! kipam: multi-cluster IP address management for Kubernetes.
//!
//! The pure core (addresses, allocation) takes plain data and returns plain data; the
//! adapters at the edges (command line, controller, REST API) do the I/O.

pub mod address;
pub mod allocator;
pub mod controller;
pub mod desired;
pub mod offline;
pub mod planner;
pub mod render;
pub mod resources;
pub mod status;
pub mod validation;

//! kipam: multi-cluster IP address management for Kubernetes.
//!
//! The map is `ARCHITECTURE.md` at the repository root. The pure core takes plain data and
//! returns plain data: [`address`], [`duration`], [`allocator`], [`resources`] (the CRD types),
//! [`validation`], [`planner`], [`reservations`], [`desired`] (objects a plan asks for),
//! [`status`] and [`render`]. [`seed`] is the running seed's shared core (clients, caches,
//! ledger, pool records, leader state, metrics). The adapters over them, none of which knows
//! another: [`planning`] (the planning loop and the fenced commit), [`applier`] (addons inside
//! user clusters), [`api`] (the seed REST API), [`webhook`] (admission reviews, decided by the
//! pure [`webhook::rules`]), and [`offline`] (files). [`controller`] starts the seed's adapters
//! and stops them in order; the `kipam` binary's command line calls it.

pub mod address;
pub mod allocator;
pub mod api;
pub mod applier;
pub mod controller;
pub mod demand;
pub mod desired;
pub mod discover;
pub mod duration;
pub mod offline;
pub mod page;
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

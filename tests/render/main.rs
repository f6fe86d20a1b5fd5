//! Addon rendering seen from outside: the shipped MetalLB addon (snapshots, MetalLB's own CRD
//! schema), the messages a template author sees, and the address filters.
//!
//! Paths are relative to the package root, where `cargo test` runs, so messages show paths
//! the way `kipam` shows them for its default `--addons-dir addons`.

mod errors;
mod example;
mod filters;
mod limits;
mod metallb;
mod network;
mod schema;
mod yaml;

use std::path::Path;

use kipam::render::{AllocationData, ClusterData, RenderedAddon, Renderer, TemplateData};

/// The addons and shared templates shipped in this repository.
pub fn shipped() -> Renderer {
    match Renderer::load(Path::new("addons"), Path::new("templates")) {
        Ok(renderer) => renderer,
        Err(err) => panic!("the shipped addons do not load: {err}"),
    }
}

/// Renders the shipped `metallb` addon, failing the test with the message on error.
pub fn metallb(data: &TemplateData) -> RenderedAddon {
    match shipped().render("metallb", data) {
        Ok(rendered) => rendered,
        Err(err) => panic!("metallb does not render: {err}"),
    }
}

/// A cluster named as KKP names them, in `dc`.
pub fn cluster(name: &str, dc: &str) -> ClusterData {
    ClusterData::new(name, dc)
}

pub fn range(dc: &str, pieces: &[&str]) -> AllocationData {
    AllocationData::range(dc, pieces.iter().copied())
}

pub fn prefix(dc: &str, cidr: &str) -> AllocationData {
    AllocationData::prefix(dc, cidr)
}

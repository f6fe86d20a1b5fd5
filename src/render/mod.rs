//! Addon rendering: minijinja templates over a cluster's IPAM allocations.
//!
//! Pure: [`Renderer::load`] reads the templates once; [`Renderer::render`] turns
//! [`TemplateData`] into Kubernetes objects without touching disk or network. The command line
//! (`kipam render`, `kipam offline --out`) and the controller's applier sit on top of it.
//!
//! - [`data`]: the template data, serialised with KKP's names;
//! - `engine`: the configured environment (strict undefined, fuel, no auto-escaping);
//! - `filters`: address filters (`nth_host`, `netmask`, ...) exact for IPv6;
//! - `loader`: the `addons/<name>/*.yaml` and `templates/` layout on disk;
//! - `output`: parsing rendered YAML into labelled objects and writing it back;
//! - `error`: [`RenderError`];
//! - [`sandbox`]: the one adapter here — rendering in a separate, memory-bounded process, so
//!   no template can exhaust the machine (used by every command that renders).
//!
//! The guide for addon authors is `docs/addons.md`.

pub mod data;
mod engine;
mod error;
mod filters;
mod loader;
mod output;
pub mod sandbox;

pub use data::AllocationNetwork;
pub use data::{
    ALLOCATION_PREFIX, ALLOCATION_RANGE, AllocationData, ClusterData, NetworkData, TemplateData,
};
pub use engine::{DEFAULT_FUEL, DEFAULT_MAX_OUTPUT, RenderedAddon, Renderer};
pub use error::{DirectoryProblem, RenderError};
pub use loader::check_directory;
pub use output::ADDON_LABEL;

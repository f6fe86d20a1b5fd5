//! The template engine: a configured minijinja environment holding every addon.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Serde, Value};
use minijinja::{AutoEscape, Environment, ErrorKind, UndefinedBehavior};

use super::loader::{self, AddonFiles, SourceFile};
use super::output::{self, Origin};
use super::{RenderError, TemplateData, filters};

/// Default fuel: the number of engine instructions one template file may run. The MetalLB
/// addon needs a few hundred; a million leaves room for large addons while stopping a runaway
/// loop in well under a second.
pub const DEFAULT_FUEL: u64 = 1_000_000;

/// Default bound on the size of one rendered addon (all its template files together), and on
/// any string kipam's filters build: 4 MiB. The MetalLB addon renders well under 1 KiB.
pub const DEFAULT_MAX_OUTPUT: usize = 4 * 1024 * 1024;

/// All addons, parsed and ready to render. Cheap to share between threads (`Send + Sync`).
pub struct Renderer {
    env: Environment<'static>,
    /// Addon name → its template names, in rendering order.
    addons: BTreeMap<String, Vec<String>>,
    /// Template name → the path shown in messages.
    display: HashMap<String, String>,
    fuel: u64,
    /// Bytes one addon may render; shared with the filters that build strings.
    max_output: Arc<AtomicUsize>,
    /// The templates as loaded, handed to sandbox processes so they render exactly these.
    sources: Arc<Sources>,
    /// When set, every render runs elsewhere: in a separate, memory-bounded process
    /// ([`super::sandbox`]).
    isolation: Option<Arc<dyn Isolation>>,
}

/// A place other than this process where addons are rendered (the render sandbox). The
/// engine hands it the renderer, whose templates and bounds the other side renders with; the
/// sandbox builds on the engine, never the other way round.
pub(crate) trait Isolation: Send + Sync + std::fmt::Debug {
    /// Renders `addon` (known to exist in `renderer`) for `data`.
    fn render(
        &self,
        renderer: &Renderer,
        addon: &str,
        data: &TemplateData,
    ) -> Result<RenderedAddon, RenderError>;
}

/// Every template a renderer holds, as read.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Sources {
    pub addons: Vec<AddonFiles>,
    pub shared: Vec<SourceFile>,
}

impl std::fmt::Debug for Renderer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Renderer")
            .field("addons", &self.addons)
            .field("fuel", &self.fuel)
            .field("max_output", &self.max_output())
            .field("isolation", &self.isolation)
            .finish_non_exhaustive()
    }
}

/// One addon rendered for one cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct RenderedAddon {
    /// The addon's name.
    pub addon: String,
    /// The rendered objects, in template file order then document order, each labelled with
    /// [`ADDON_LABEL`](super::ADDON_LABEL).
    pub objects: Vec<serde_json::Value>,
}

impl RenderedAddon {
    /// The objects as multi-document YAML: every document starts with `---`, mapping keys are
    /// sorted, so the same objects always give the same text. Empty when there are no objects.
    pub fn to_yaml(&self) -> String {
        output::objects_to_yaml(&self.objects)
    }
}

impl Renderer {
    /// Loads every `addons/<name>/*.yaml` under `addons_dir` plus the shared templates under
    /// `templates_dir`. Fails on the first template that does not parse, naming its file and
    /// line, so a broken addon is caught at start-up rather than at its first render.
    pub fn load(addons_dir: &Path, templates_dir: &Path) -> Result<Renderer, RenderError> {
        let addons = loader::read_addons(addons_dir)?;
        let shared = loader::read_shared(templates_dir)?;
        Renderer::build(addons, shared)
    }

    /// Builds a renderer from templates held in memory, for tests and embedding.
    ///
    /// `addon_files` are `("<addon>/<file>.yaml", source)` pairs, rendered per addon in file
    /// name order; `shared` are `(name, source)` pairs importable by that name. Messages name
    /// the files by these paths.
    pub fn from_memory(
        addon_files: &[(&str, &str)],
        shared: &[(&str, &str)],
    ) -> Result<Renderer, RenderError> {
        let mut addons: BTreeMap<String, Vec<SourceFile>> = BTreeMap::new();
        for (path, source) in addon_files {
            let Some((addon, file)) = path
                .split_once('/')
                .filter(|(a, f)| !a.is_empty() && !f.is_empty() && !f.contains('/'))
            else {
                return Err(RenderError::Layout {
                    path: path.into(),
                    reason: "an addon template is named <addon>/<file>".to_string(),
                });
            };
            addons
                .entry(addon.to_string())
                .or_default()
                .push(SourceFile {
                    name: format!("{addon}/{file}"),
                    display: path.to_string(),
                    source: source.to_string(),
                });
        }
        let addons = addons
            .into_iter()
            .map(|(addon, mut files)| {
                files.sort_by(|a, b| a.name.cmp(&b.name));
                AddonFiles { addon, files }
            })
            .collect();
        let shared = shared
            .iter()
            .map(|(name, source)| SourceFile {
                name: name.to_string(),
                display: name.to_string(),
                source: source.to_string(),
            })
            .collect();
        Renderer::build(addons, shared)
    }

    /// Replaces the fuel limit (engine instructions per template file).
    pub fn with_fuel(mut self, fuel: u64) -> Renderer {
        self.fuel = fuel;
        self.env.set_fuel(Some(fuel));
        self
    }

    /// Replaces the bound on the size of one rendered addon (bytes of rendered text, all its
    /// template files together), which also bounds the strings kipam's filters build.
    pub fn with_max_output(self, bytes: usize) -> Renderer {
        self.max_output.store(bytes, Ordering::Relaxed);
        self
    }

    /// Runs every render through `isolation` instead of in this process.
    pub(crate) fn isolated(mut self, isolation: Arc<dyn Isolation>) -> Renderer {
        self.isolation = Some(isolation);
        self
    }

    /// The fuel limit (engine instructions per template file).
    pub fn fuel(&self) -> u64 {
        self.fuel
    }

    /// The templates this renderer holds.
    pub(crate) fn sources(&self) -> &Sources {
        &self.sources
    }

    /// Builds the renderer a sandbox process uses: the same templates and bounds, no sandbox.
    pub(crate) fn from_sources(
        sources: Sources,
        fuel: u64,
        max_output: usize,
    ) -> Result<Renderer, RenderError> {
        Ok(Renderer::build(sources.addons, sources.shared)?
            .with_fuel(fuel)
            .with_max_output(max_output))
    }

    /// The bound on the size of one rendered addon, in bytes.
    pub fn max_output(&self) -> usize {
        self.max_output.load(Ordering::Relaxed)
    }

    /// The names of the loaded addons, sorted.
    pub fn addon_names(&self) -> Vec<String> {
        self.addons.keys().cloned().collect()
    }

    /// Whether an addon of that name is loaded.
    pub fn has_addon(&self, addon: &str) -> bool {
        self.addons.contains_key(addon)
    }

    /// Renders one addon for one cluster: every template file of the addon in name order,
    /// every YAML document parsed, empty documents dropped, and the label
    /// `ipam.kipam.dev/addon: <addon>` set on every object.
    pub fn render(&self, addon: &str, data: &TemplateData) -> Result<RenderedAddon, RenderError> {
        let names = self
            .addons
            .get(addon)
            .ok_or_else(|| RenderError::UnknownAddon {
                addon: addon.to_string(),
                known: self.addon_names(),
            })?;
        if let Some(isolation) = &self.isolation {
            return isolation.render(self, addon, data);
        }
        let context = Value::from(Serde(data));
        let mut objects = Vec::new();
        let mut places = Vec::new();
        let mut budget = self.max_output();
        for name in names {
            let text = self.render_file(addon, name, &context, budget)?;
            budget -= text.len();
            let origin = Origin {
                addon,
                file: self.display_name(name),
            };
            output::collect_objects(&origin, &text, &mut objects, &mut places)?;
        }
        Ok(RenderedAddon {
            addon: addon.to_string(),
            objects,
        })
    }

    /// Runs one template file of an addon, stopping it as soon as its output passes `budget`
    /// bytes.
    fn render_file(
        &self,
        addon: &str,
        name: &str,
        context: &Value,
        budget: usize,
    ) -> Result<String, RenderError> {
        let mut out = Bounded {
            text: Vec::new(),
            budget,
            exceeded: false,
        };
        let result = self
            .env
            .get_template(name)
            .and_then(|template| template.render_captured_to(context, &mut out).map(|_| ()));
        if out.exceeded {
            return Err(RenderError::TooLarge {
                addon: addon.to_string(),
                file: self.display_name(name).to_string(),
                limit: self.max_output(),
            });
        }
        if let Err(err) = result {
            return Err(self.template_error(addon, name, &err));
        }
        String::from_utf8(out.text).map_err(|_| RenderError::Template {
            addon: addon.to_string(),
            file: self.display_name(name).to_string(),
            line: None,
            rendering: self.display_name(name).to_string(),
            cause: "the rendered output is not UTF-8".into(),
        })
    }

    fn build(addons: Vec<AddonFiles>, shared: Vec<SourceFile>) -> Result<Renderer, RenderError> {
        let sources = Arc::new(Sources {
            addons: addons.clone(),
            shared: shared.clone(),
        });
        let mut env = Environment::new();
        // Values go into YAML as written: the default would JSON-escape every value of a
        // `*.yaml` template (see ENGINEERING.md).
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.set_fuel(Some(DEFAULT_FUEL));
        // Debug mode lets an undefined-value error name the expression (`Cluster.Nmae`).
        env.set_debug(true);
        // Block tags on lines of their own leave no blank line or indentation behind, which
        // is what one wants in YAML.
        if let Ok(syntax) = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
        {
            env.set_syntax(syntax);
        }
        let max_output = Arc::new(AtomicUsize::new(DEFAULT_MAX_OUTPUT));
        filters::register(&mut env, Arc::clone(&max_output));

        let mut display = HashMap::new();
        let mut addon_names = BTreeMap::new();
        let all_files =
            shared
                .into_iter()
                .map(|file| (None, file))
                .chain(addons.into_iter().flat_map(|addon| {
                    let name = addon.addon;
                    addon
                        .files
                        .into_iter()
                        .map(move |file| (Some(name.clone()), file))
                }));
        for (addon, file) in all_files {
            if let Some(previous) = display.get(&file.name) {
                return Err(RenderError::Layout {
                    path: file.display.into(),
                    reason: format!(
                        "its template name {:?} is already taken by {previous}",
                        file.name
                    ),
                });
            }
            env.add_template_owned(file.name.clone(), file.source)
                .map_err(|err| RenderError::Syntax {
                    file: file.display.clone(),
                    line: err.line().unwrap_or(1),
                    cause: err.detail().unwrap_or("invalid template").to_string(),
                })?;
            if let Some(addon) = addon {
                addon_names
                    .entry(addon)
                    .or_insert_with(Vec::new)
                    .push(file.name.clone());
            }
            display.insert(file.name, file.display);
        }
        Ok(Renderer {
            env,
            addons: addon_names,
            display,
            fuel: DEFAULT_FUEL,
            max_output,
            sources,
            isolation: None,
        })
    }

    fn display_name<'a>(&'a self, name: &'a str) -> &'a str {
        self.display.get(name).map(String::as_str).unwrap_or(name)
    }

    /// Turns an engine error into a message naming the addon, the failing file and line, and
    /// the cause. Errors inside an include are reported where they happened.
    fn template_error(&self, addon: &str, rendering: &str, err: &minijinja::Error) -> RenderError {
        let mut innermost = err;
        while let Some(inner) = std::error::Error::source(innermost)
            .and_then(|source| source.downcast_ref::<minijinja::Error>())
        {
            innermost = inner;
        }
        let file = self
            .display_name(innermost.name().unwrap_or(rendering))
            .to_string();
        let rendering = self.display_name(rendering).to_string();
        let line = innermost.line();
        if innermost.kind() == ErrorKind::OutOfFuel {
            return RenderError::OutOfFuel {
                addon: addon.to_string(),
                file,
                line,
                rendering,
                fuel: self.fuel,
            };
        }
        RenderError::Template {
            addon: addon.to_string(),
            file,
            line,
            rendering,
            cause: cause(innermost),
        }
    }
}

/// Collects rendered text and refuses to grow past its budget.
struct Bounded {
    text: Vec<u8>,
    budget: usize,
    exceeded: bool,
}

impl Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.text.len() + buf.len() > self.budget {
            self.exceeded = true;
            return Err(std::io::Error::other("rendered addon too large"));
        }
        self.text.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The cause of an engine error in plain words, without minijinja's own location suffix.
fn cause(err: &minijinja::Error) -> String {
    match (err.kind(), err.detail()) {
        (ErrorKind::UndefinedError | ErrorKind::InvalidOperation, Some(detail)) => {
            detail.to_string()
        }
        (kind, Some(detail)) => format!("{kind}: {detail}"),
        (kind, None) => kind.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renderer_is_shareable_between_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Renderer>();
        assert_send_sync::<RenderError>();
    }
}

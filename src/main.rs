//! The `kipam` command line: one binary, one subcommand per job.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use kipam::offline::{self, OfflineOptions};
use kipam::resources;
use kipam::validation;

#[derive(Parser)]
#[command(
    name = "kipam",
    version,
    about = "Multi-cluster IP address management for Kubernetes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Sets up logging to stderr in `format`; the level comes from `RUST_LOG` (default `info`).
fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .init(),
    }
}

/// A fatal error of the controller: a log event in JSON mode (so that every line stays
/// parseable), a plain `error:` line otherwise.
fn fatal(format: LogFormat, message: &str) {
    match format {
        LogFormat::Json => tracing::error!("{message}"),
        LogFormat::Text => eprintln!("error: {message}"),
    }
}

/// The end of `kipam offline --help` (docs/offline.md says the same).
const OFFLINE_EXIT_STATUS: &str = "Exit status:
  0  every allocation was made, every addon rendered and written
  1  an allocation failed (e.g. an exhausted pool) or is in conflict (one cannot be honoured:
     it is kept as stored and reported), an addon did not render, or a file under --out could
     not be written or removed
  2  invalid input, an unusable state file (unreadable, empty, or one that holds an address
     twice), an output that would replace an input, or a release refused by the guard
     (nothing written)";

/// The end of `kipam adopt --help` (docs/offline-adopt.md says the same).
const ADOPT_EXIT_STATUS: &str = "Exit status:
  0  every cluster read is Ready: kipam can take each over as reported
  1  some cluster needs a look (a conflict, an address in an exclusion or given to another
     holder, a hand-made pool kipam cannot take over as it is) or could not be read
  2  invalid input (manifests, state file, arguments); nothing was read";

#[derive(clap::Args)]
struct AdoptArgs {
    /// IPAMPool and Cluster manifests (files or directories), as for `kipam offline`;
    /// IPAMAllocations among them count as what kipam already gave.
    #[arg(long = "pools", required = true, num_args = 1..)]
    pools: Vec<PathBuf>,
    /// The state file of `kipam offline`, if kipam already runs offline: what it gave counts.
    #[arg(long)]
    state: Option<PathBuf>,
    /// Read a user cluster through this kubeconfig (its current context; list only). Give
    /// one --cluster NAME for each, in the same order.
    #[arg(long, value_name = "FILE")]
    kubeconfig: Vec<PathBuf>,
    /// The Cluster each --kubeconfig belongs to.
    #[arg(long, value_name = "NAME")]
    cluster: Vec<String>,
    /// A directory with one sub-directory per user cluster, named as its Cluster, holding
    /// what `kubectl get ipaddresspools.metallb.io,services -A -o yaml` exported.
    #[arg(long, value_name = "DIR")]
    from: Option<PathBuf>,
    /// Report only (the default, and the only mode of `kipam adopt`).
    #[arg(long, default_value_t = true)]
    dry_run: bool,
    /// Output format: a report for people (text), or the plan as json.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = AdoptFormat::Text)]
    output: AdoptFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum AdoptFormat {
    Text,
    Json,
}

// Parsed once at start: the size of the controller's arguments does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run the seed controller against a Kubernetes API server.
    Controller(ControllerArgs),
    /// Plan allocations over manifests on disk and keep them in a state file.
    #[command(after_help = OFFLINE_EXIT_STATUS)]
    Offline(OfflineArgs),
    /// Report how kipam would take over user clusters that already run MetalLB (a dry run:
    /// nothing is written, here or in any user cluster).
    #[command(after_help = ADOPT_EXIT_STATUS)]
    Adopt(AdoptArgs),
    /// Print one addon rendered for one cluster.
    Render(RenderArgs),
    /// Check IPAMPool and Cluster manifests with the admission rules.
    Validate(ValidateArgs),
    /// Print the CustomResourceDefinitions (or write one file per CRD with --out).
    Crds(CrdsArgs),
    /// Print the ValidatingWebhookConfiguration for the admission webhook.
    WebhookConfig(WebhookConfigArgs),
    /// Internal: the memory-bounded process every render runs in (started by kipam itself).
    #[command(hide = true)]
    RenderWorker(RenderWorkerArgs),
}

#[derive(clap::Args)]
struct RenderWorkerArgs {
    /// Bound on this process's data segment, in bytes.
    #[arg(long)]
    max_memory: u64,
}

#[derive(clap::Args)]
struct ControllerArgs {
    /// How log lines are written to stderr: `text` for people, `json` (one JSON object per
    /// line, with fields such as cluster, pool and datacenter at the top level) for log
    /// collectors.
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Kubeconfig of the seed; else $KUBECONFIG or ~/.kube/config, else the in-cluster service
    /// account.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Name of this seed (names the leader Lease `kipam-<seed>`).
    #[arg(long, default_value = "seed")]
    seed_name: String,
    /// Namespace of the leader Lease.
    #[arg(long, default_value = "kipam-system")]
    namespace: String,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:9090")]
    metrics_addr: std::net::SocketAddr,
    /// Seconds a lease stays valid without renewal.
    #[arg(long, default_value_t = 15)]
    lease_duration: u64,
    /// Seconds after the last renewal at which the leader stops writing (< lease duration).
    #[arg(long, default_value_t = 10)]
    renew_deadline: u64,
    /// Seconds between lease renewals and acquisition attempts.
    #[arg(long, default_value_t = 2)]
    retry_period: u64,
    /// Seconds between full passes when nothing changes.
    #[arg(long, default_value_t = 300)]
    resync: u64,
    /// Writes to the API server the planning pass sends at once (1 to 256).
    #[arg(long, default_value_t = kipam::planning::pass::DEFAULT_WRITE_CONCURRENCY as u16, value_parser = clap::value_parser!(u16).range(1..=256))]
    write_concurrency: u16,
    /// This replica's identity in the Lease (default: host name and process id).
    #[arg(long)]
    identity: Option<String>,
    /// Address of the REST API (`/api/v2/seeds/<seed>/ipampools`, docs/api.md).
    #[arg(long, default_value = "0.0.0.0:8080")]
    api_addr: std::net::SocketAddr,
    /// Seconds the API reuses a token's and an access decision's review (0: no cache).
    #[arg(long, default_value_t = 10)]
    api_auth_cache_ttl: u64,
    /// Largest API request body.
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    api_max_body: usize,
    /// Seconds an API request may take, body included.
    #[arg(long, default_value_t = 30)]
    api_request_timeout: u64,
    /// API requests served at once; more are answered 429.
    #[arg(long, default_value_t = 256)]
    api_max_concurrent: usize,
    /// PEM certificate chain of the REST API: served over TLS when given (re-read when it
    /// changes).
    #[arg(long, requires = "api_tls_key_file")]
    api_tls_cert_file: Option<PathBuf>,
    /// PEM private key of the REST API (re-read when it changes).
    #[arg(long, requires = "api_tls_cert_file")]
    api_tls_key_file: Option<PathBuf>,
    /// Address of the admission webhook (HTTPS, served when --tls-cert-file is given).
    #[arg(long, default_value = "0.0.0.0:9443")]
    webhook_addr: std::net::SocketAddr,
    /// PEM certificate chain of the webhook (read again when it changes).
    #[arg(long, requires = "tls_key_file")]
    tls_cert_file: Option<PathBuf>,
    /// PEM private key of the webhook (read again when it changes).
    #[arg(long, requires = "tls_cert_file")]
    tls_key_file: Option<PathBuf>,
    /// Make the webhook certificate: a CA and a serving certificate kept in --webhook-secret,
    /// shared by every replica, with the CA put into --webhook-config-name's caBundle.
    #[arg(long, conflicts_with_all = ["tls_cert_file", "tls_key_file"])]
    webhook_self_signed: bool,
    /// Secret (in --namespace) holding the self-signed webhook certificate.
    #[arg(long, default_value = "kipam-webhook-tls")]
    webhook_secret: String,
    /// ValidatingWebhookConfiguration whose caBundle kipam keeps (with --webhook-self-signed).
    #[arg(long, default_value = "kipam")]
    webhook_config_name: String,
    /// Service (in --namespace) in front of the webhook: the self-signed certificate's DNS names.
    #[arg(long, default_value = "kipam-webhook")]
    webhook_service: String,
    /// Writable directory for the self-signed certificate files the webhook serves.
    #[arg(long, default_value = "/tmp/kipam-webhook")]
    webhook_cert_dir: PathBuf,
    /// Seconds between checks of the self-signed certificate's Secret and of the caBundle.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    webhook_cert_check_interval: u64,
    /// kipam's own user name: its writes pass the webhook (default
    /// system:serviceaccount:<in-cluster namespace, else kipam-system>:kipam).
    #[arg(long)]
    service_account: Option<String>,
    /// Seconds between re-applies of every user cluster's addons (repairs drift made by hand).
    #[arg(long, default_value_t = 300)]
    addon_resync: u64,
    /// At most this many user clusters are worked on (and connected to) at once.
    #[arg(long, default_value_t = 16)]
    tenant_concurrency: usize,
    /// Seconds each request to a user cluster may take (connect, read, write).
    #[arg(long, default_value_t = 10)]
    tenant_timeout: u64,
    #[command(flatten)]
    templates: TemplateDirs,
}

#[derive(clap::Args)]
struct WebhookConfigArgs {
    /// metadata.name of the configuration.
    #[arg(long, default_value = "kipam")]
    name: String,
    /// Namespace of the Service in front of the kipam replicas.
    #[arg(long, default_value = "kipam-system")]
    service_namespace: String,
    /// Name of that Service.
    #[arg(long, default_value = "kipam-webhook")]
    service_name: String,
    /// Port of that Service.
    #[arg(long, default_value_t = 443)]
    service_port: u16,
    /// Call this base URL instead of a Service (e.g. https://host:9443).
    #[arg(long, conflicts_with_all = ["service_namespace", "service_name", "service_port"])]
    url: Option<String>,
    /// PEM file of the CA that signed the webhook certificate (default: a placeholder and the
    /// cert-manager CA-injection annotation).
    #[arg(long)]
    ca_file: Option<PathBuf>,
    /// Fail (refuse writes while no replica answers) or Ignore (let them through unchecked).
    #[arg(long, default_value = "Fail", value_parser = ["Fail", "Ignore"])]
    failure_policy: String,
    /// Seconds the API server waits for an answer (1 to 30).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=30))]
    timeout_seconds: u32,
    /// kipam's own user name (its writes skip the webhook).
    #[arg(long, default_value = "system:serviceaccount:kipam-system:kipam")]
    service_account: String,
}

#[derive(clap::Args)]
struct OfflineArgs {
    /// Manifest files or directories (IPAMPool, Cluster, Addon; multi-document YAML).
    #[arg(short = 'f', long = "file", required = true, num_args = 1..)]
    files: Vec<PathBuf>,
    /// The state file of IPAMAllocation objects (created when missing).
    #[arg(long)]
    state: PathBuf,
    /// Render every Addon into DIR/<cluster>/<addon>.yaml (and remove the files of Addons
    /// that are gone; kipam lists what it wrote in DIR/.kipam-index.json).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Let through releases that look like a mistake: more than half of the state released
    /// because clusters or pools are missing from the input, or a cluster moved to a
    /// datacenter no pool serves.
    #[arg(long)]
    allow_release: bool,
    /// Take a state file that exists but holds no document (empty, only comments or `---`)
    /// as an empty state: every cluster is planned from nothing. Without it such a file is
    /// refused (a state emptied by a merge or by hand is a mistake far more often).
    #[arg(long)]
    allow_empty_state: bool,
    /// Also write the pool page (usage, address maps, holders, search) as one
    /// self-contained HTML file that needs no network.
    #[arg(long, value_name = "FILE.html")]
    report: Option<PathBuf>,
    /// The time of this run (RFC 3339, `2026-11-25T18:00:00Z`; default: the clock): stamped
    /// on new allocations and release times, and what quarantines (`reuseAfter`) end by.
    #[arg(long, value_name = "TIME")]
    now: Option<String>,
    /// Output format: a table (text), or the full result as json or yaml.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = OutputFormat::Text)]
    output: OutputFormat,
    #[command(flatten)]
    templates: TemplateDirs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum OutputFormat {
    Text,
    Json,
    Yaml,
}

impl OutputFormat {
    fn machine(self) -> Option<offline::report::Format> {
        match self {
            OutputFormat::Text => None,
            OutputFormat::Json => Some(offline::report::Format::Json),
            OutputFormat::Yaml => Some(offline::report::Format::Yaml),
        }
    }
}

/// `4194304`, `512KiB`, `4MiB` (also `K`, `KB`, `M`, `MB`, all binary).
fn parse_size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: usize = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size (bytes, or a number with KiB, MiB or GiB)"))?;
    let factor = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1024,
        "m" | "mb" | "mib" => 1024 * 1024,
        "g" | "gb" | "gib" => 1024 * 1024 * 1024,
        _ => return Err(format!("{text:?}: unknown unit (use KiB, MiB or GiB)")),
    };
    match n.checked_mul(factor) {
        Some(0) => Err(format!("{text:?}: must be more than 0")),
        Some(v) => Ok(v),
        None => Err(format!("{text:?} is too large")),
    }
}

/// `--addons-dir` when it is not given.
const DEFAULT_ADDONS_DIR: &str = "addons";

#[derive(clap::Args)]
struct TemplateDirs {
    /// Directory of addons (`<name>/*.yaml` minijinja templates) [default: addons]. Given, it
    /// must exist; when the default is missing, the controller runs without the addon applier.
    #[arg(long, value_name = "DIR")]
    addons_dir: Option<PathBuf>,
    /// Directory of shared template macros (none when it is missing).
    #[arg(long, default_value = "templates")]
    templates_dir: PathBuf,
    /// Largest rendered addon (all its templates together), and largest string kipam's
    /// filters build; an addon over it fails with a message naming it.
    #[arg(long, default_value = "4MiB", value_parser = parse_size)]
    max_addon_size: usize,
    /// Memory one render may use (each render runs in a child process bounded to this); a
    /// template that builds ever larger strings or lists fails with a message naming its addon.
    #[arg(long, default_value = "256MiB", value_parser = parse_size)]
    max_render_memory: usize,
}

#[derive(clap::Args)]
struct RenderArgs {
    /// The addon to render (a directory under --addons-dir).
    #[arg(long)]
    addon: String,
    /// A file with the Cluster (and optionally its Addon, whose variables are used, and its
    /// pools, whose networks the templates see).
    #[arg(long)]
    cluster: PathBuf,
    /// Which Cluster, when the file holds several.
    #[arg(long)]
    name: Option<String>,
    /// The state file holding the cluster's allocations.
    #[arg(long)]
    state: Option<PathBuf>,
    /// Output format: the manifests as YAML (text), or the result as json or yaml.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = OutputFormat::Text)]
    output: OutputFormat,
    #[command(flatten)]
    templates: TemplateDirs,
}

#[derive(clap::Args)]
struct ValidateArgs {
    /// The manifests to check.
    #[arg(short = 'f', long = "file", required = true, num_args = 1..)]
    files: Vec<PathBuf>,
    /// The pools as they are now, to apply the update rules.
    #[arg(long)]
    old: Option<PathBuf>,
    /// Stored IPAMAllocations (a state file), to check that added exclusions hit none.
    #[arg(long)]
    state: Option<PathBuf>,
    /// Output format: a summary (text), or the result as json or yaml.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = OutputFormat::Text)]
    output: OutputFormat,
}

#[derive(clap::Args)]
struct CrdsArgs {
    /// Write `<plural>.<group>.yaml` files into this directory instead of printing.
    #[arg(long)]
    out: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Controller(_)) {
        stop_quietly_on_a_closed_pipe();
    }
    match cli.command {
        Command::Controller(args) => run_controller(args),
        Command::Offline(args) => run_offline(args),
        Command::Adopt(args) => run_adopt(args),
        Command::Validate(args) => run_validate(args),
        Command::Render(args) => run_render(args),
        Command::Crds(args) => run_crds(args),
        Command::WebhookConfig(args) => run_webhook_config(args),
        Command::RenderWorker(args) => run_render_worker(args),
    }
}

/// glibc's allocator gives each thread that allocates at once an arena of its own, up to eight
/// per core, and memory freed in one arena is not reused by another. The controller plans on
/// blocking threads while the runtime's workers decode watch events, so at 100,000 allocations
/// the spread arenas added about 35 MiB of resident memory that no object used. Two arenas
/// keep that in check at no measurable cost in speed. `MALLOC_ARENA_MAX` in the environment
/// still decides when it is set; builds on other C libraries (the static musl image) are not
/// affected.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: called before any other thread exists; mallopt only sets a tuning value.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
}

fn run_controller(args: ControllerArgs) -> ExitCode {
    limit_malloc_arenas();
    let log_format = args.log_format;
    init_logging(log_format);
    if args.renew_deadline >= args.lease_duration || args.retry_period >= args.renew_deadline {
        fatal(
            log_format,
            &format!(
                "need --retry-period ({}) < --renew-deadline ({}) < --lease-duration ({})",
                args.retry_period, args.renew_deadline, args.lease_duration
            ),
        );
        return ExitCode::from(2);
    }
    if args.tenant_concurrency == 0 || args.addon_resync == 0 || args.tenant_timeout == 0 {
        fatal(
            log_format,
            &format!(
                "--tenant-concurrency ({}), --addon-resync ({}) and --tenant-timeout ({}) must be at least 1",
                args.tenant_concurrency, args.addon_resync, args.tenant_timeout
            ),
        );
        return ExitCode::from(2);
    }
    let renderer = match controller_renderer(&args.templates) {
        Ok(r) => r.map(std::sync::Arc::new),
        Err(e) => {
            fatal(log_format, &e.to_string());
            return ExitCode::from(2);
        }
    };
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "kipam".into());
    let options = kipam::controller::ControllerOptions {
        kubeconfig: args.kubeconfig,
        seed_name: args.seed_name,
        namespace: args.namespace.clone(),
        metrics_addr: args.metrics_addr,
        lease: kipam::seed::leader::LeaseTiming {
            lease_duration: std::time::Duration::from_secs(args.lease_duration),
            renew_deadline: std::time::Duration::from_secs(args.renew_deadline),
            retry_period: std::time::Duration::from_secs(args.retry_period),
        },
        resync: std::time::Duration::from_secs(args.resync.max(1)),
        write_concurrency: usize::from(args.write_concurrency),
        identity: args
            .identity
            .unwrap_or_else(|| format!("{host}-{}", std::process::id())),
        api: kipam::api::ApiOptions {
            addr: args.api_addr,
            auth_cache_ttl: std::time::Duration::from_secs(args.api_auth_cache_ttl),
            max_body_bytes: args.api_max_body,
            request_timeout: std::time::Duration::from_secs(args.api_request_timeout.max(1)),
            max_concurrent: args.api_max_concurrent.max(1),
            tls: match (args.api_tls_cert_file, args.api_tls_key_file) {
                (Some(cert), Some(key)) => Some(kipam::tls::TlsFiles::new(cert, key)),
                _ => None,
            },
        },
        webhook: match (args.tls_cert_file, args.tls_key_file) {
            _ if args.webhook_self_signed => {
                let self_signed = kipam::webhook::selfsigned::SelfSignedOptions {
                    namespace: args.namespace.clone(),
                    secret: args.webhook_secret,
                    service: args.webhook_service,
                    configuration: args.webhook_config_name,
                    dir: args.webhook_cert_dir,
                    check_interval: std::time::Duration::from_secs(
                        args.webhook_cert_check_interval,
                    ),
                };
                Some(kipam::webhook::WebhookOptions {
                    addr: args.webhook_addr,
                    tls: kipam::tls::TlsFiles::new(self_signed.cert_file(), self_signed.key_file()),
                    service_account: args
                        .service_account
                        .unwrap_or_else(kipam::webhook::default_service_account),
                    self_signed: Some(self_signed),
                })
            }
            (Some(cert), Some(key)) => Some(kipam::webhook::WebhookOptions {
                addr: args.webhook_addr,
                tls: kipam::tls::TlsFiles::new(cert, key),
                service_account: args
                    .service_account
                    .unwrap_or_else(kipam::webhook::default_service_account),
                self_signed: None,
            }),
            _ => None,
        },
        addons: renderer.map(|renderer| kipam::applier::ApplierOptions {
            renderer,
            tenant_concurrency: args.tenant_concurrency,
            resync: std::time::Duration::from_secs(args.addon_resync),
            request_timeout: std::time::Duration::from_secs(args.tenant_timeout),
        }),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            fatal(log_format, &format!("cannot start the runtime: {e}"));
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(kipam::controller::run(options)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            fatal(log_format, &e.to_string());
            ExitCode::FAILURE
        }
    }
}

/// A command whose output is piped into `head` should stop when the reader goes away, as other
/// command-line tools do, instead of panicking in `println!` on the broken pipe. (Not for the
/// controller: a peer closing a connection must never stop it.)
fn stop_quietly_on_a_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: restoring the default action of one signal at start-up, before any thread runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

impl TemplateDirs {
    fn addons(&self) -> &std::path::Path {
        self.addons_dir
            .as_deref()
            .unwrap_or(std::path::Path::new(DEFAULT_ADDONS_DIR))
    }
}

/// Loads the addons; every render then runs in a memory-bounded child process
/// (`docs/addons.md`, "Limits").
fn load_renderer(dirs: &TemplateDirs) -> Result<kipam::render::Renderer, String> {
    let sandbox =
        kipam::render::sandbox::SandboxOptions::current_exe(dirs.max_render_memory as u64)?;
    kipam::render::Renderer::load(dirs.addons(), &dirs.templates_dir)
        .map(|r| r.with_max_output(dirs.max_addon_size).with_sandbox(sandbox))
        .map_err(|e| e.to_string())
}

/// The controller's renderer, or `None` when the addon applier is off because `--addons-dir`
/// was not given and its default is missing (the controller was started outside a directory
/// holding `addons/`). Allocation needs no addons, so that is said once and the seed runs.
fn controller_renderer(dirs: &TemplateDirs) -> Result<Option<kipam::render::Renderer>, String> {
    if dirs.addons_dir.is_none()
        && let Err(e) = kipam::render::check_directory(dirs.addons(), "--addons-dir")
        && e.is_missing_directory()
    {
        let looked_in = std::env::current_dir()
            .map(|cwd| cwd.join(DEFAULT_ADDONS_DIR))
            .unwrap_or_else(|_| DEFAULT_ADDONS_DIR.into());
        tracing::warn!(
            addons_dir = %looked_in.display(),
            "addon applier off: no --addons-dir given and the default addons directory is \
             missing; allocation runs as usual, Addons are left alone (give --addons-dir DIR \
             to apply them)"
        );
        return Ok(None);
    }
    load_renderer(dirs).map(Some)
}

fn run_render_worker(args: RenderWorkerArgs) -> ExitCode {
    let stdin = std::io::stdin().lock();
    let stdout = std::io::stdout().lock();
    match kipam::render::sandbox::serve_worker(args.max_memory, stdin, stdout) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Reads a state file given to `render` or `validate`, refusing what is not a regular file
/// (a FIFO would hang the read).
fn read_state(path: &std::path::Path) -> Result<Vec<resources::IPAMAllocation>, String> {
    match offline::files::check_existing(path, "state file").map_err(|e| e.to_string())? {
        offline::files::Target::Absent => {
            Err(format!("state file {}: does not exist", path.display()))
        }
        offline::files::Target::Regular(_) => {
            offline::state_file::read(path).map_err(|e| e.to_string())
        }
    }
}

fn run_adopt(args: AdoptArgs) -> ExitCode {
    let json = args.output == AdoptFormat::Json;
    let refuse = |message: String| {
        eprintln!("error: {message}");
        if json {
            println!("{}", serde_json::json!({"error": message, "exitCode": 2}));
        }
        ExitCode::from(2)
    };
    if args.kubeconfig.len() != args.cluster.len() {
        return refuse(format!(
            "--kubeconfig and --cluster go in pairs: {} --kubeconfig, {} --cluster",
            args.kubeconfig.len(),
            args.cluster.len()
        ));
    }
    if args.kubeconfig.is_empty() && args.from.is_none() {
        return refuse(
            "nothing to read: give --from DIR, or --kubeconfig FILE --cluster NAME".to_string(),
        );
    }
    let _ = args.dry_run;
    let options = offline::adopt::AdoptOptions {
        pools: args.pools,
        state: args.state,
        kubeconfigs: args.cluster.into_iter().zip(args.kubeconfig).collect(),
        from: args.from,
    };
    let report = match offline::adopt::run(&options) {
        Ok(r) => r,
        Err(e) => return refuse(e.to_string()),
    };
    for note in &report.notes {
        eprintln!("note: {note}");
    }
    let code = offline::adopt::exit_code(&report.plan);
    if json {
        let value = offline::adopt::report_json(&report, code);
        match serde_json::to_string_pretty(&value) {
            Ok(text) => println!("{text}"),
            Err(e) => return refuse(e.to_string()),
        }
    } else {
        print!("{}", offline::adopt::report_text(&report));
    }
    ExitCode::from(code)
}

fn run_offline(args: OfflineArgs) -> ExitCode {
    let machine = args.output.machine();
    let refuse = |message: String| {
        eprintln!("error: {message}");
        if let Some(format) = machine {
            print!(
                "{}",
                offline::report::to_text(&offline::report::error_json(2, &message), format)
            );
        }
        ExitCode::from(2)
    };
    // Every output is checked first: one that would replace an input or another output, or
    // that cannot be written, is a usage error before anything is written.
    if let Err(e) = offline::outputs::check(offline::outputs::Paths {
        inputs: &args.files,
        state: &args.state,
        out: args.out.as_deref(),
        report: args.report.as_deref(),
    }) {
        return refuse(e);
    }
    // Templates are loaded next: a broken addon stops the run before anything is written.
    let renderer = match &args.out {
        Some(_) => match load_renderer(&args.templates) {
            Ok(r) => Some(r),
            Err(e) => return refuse(e),
        },
        None => None,
    };
    let options = OfflineOptions {
        files: args.files,
        state: args.state,
        now: args.now.clone().unwrap_or_else(resources::now_rfc3339),
        allow_release: args.allow_release,
        allow_empty_state: args.allow_empty_state,
    };
    let target = match (&renderer, &args.out) {
        (Some(renderer), Some(dir)) => Some(offline::OutTarget { renderer, dir }),
        _ => None,
    };
    let report = match offline::run_with_out(&options, target) {
        Ok(r) => r,
        Err(e) => return refuse(e.to_string()),
    };
    for leftover in &report.leftovers {
        eprintln!(
            "note: removed {}, a temporary file of the state left by a run that stopped \
             mid-write (its process is gone)",
            leftover.display()
        );
    }
    for skipped in report.ignored.iter().chain(&report.render_skipped) {
        eprintln!("note: skipped {skipped}");
    }
    for warning in &report.warnings {
        eprintln!("warning: {warning}");
    }
    for e in &report.render_errors {
        eprintln!("error: {e}");
    }
    if !report.render_errors.is_empty() {
        eprintln!(
            "error: an addon did not render; nothing written (the state and --out are unchanged)"
        );
    }
    if let Some(out) = &report.out {
        for e in &out.errors {
            eprintln!("error: {e}");
        }
    }
    let failed = offline::report_failed(&report);
    let code: u8 = if failed { 1 } else { 0 };
    let state = options.state.display().to_string();
    // The page shows what the state holds now: not written when nothing was.
    if let Some(path) = &args.report
        && report.render_errors.is_empty()
    {
        let label = format!("offline · {state}");
        let written = offline::page::page(&report, &label, &options.now)
            .and_then(|page| offline::page::write(path, &page).map_err(|e| e.to_string()));
        match written {
            Ok(()) => eprintln!("report {}: written", path.display()),
            Err(e) => {
                eprintln!("error: {e}");
                if let Some(format) = machine {
                    print!(
                        "{}",
                        offline::report::to_text(&offline::report::error_json(1, &e), format)
                    );
                }
                return ExitCode::from(1);
            }
        }
    }
    if let Some(format) = machine {
        let out = args.out.as_ref().map(|p| p.display().to_string());
        let value = offline::report::offline_json(&report, &state, out.as_deref(), code);
        print!("{}", offline::report::to_text(&value, format));
        return ExitCode::from(code);
    }
    print!("{}", offline::summary_table(&report.plan, &report.pools));
    println!();
    let status = match (report.state_written, report.state_created) {
        (true, true) => {
            "written (a new file: there was no state file, so kipam started from an empty state)"
        }
        (true, false) => "written",
        (false, _) if !report.render_errors.is_empty() => "unchanged (nothing written)",
        (false, _) => "unchanged",
    };
    println!("state {state}: {status}");
    if let Some(out) = &report.out {
        for f in &out.files {
            let what = if f.written { "rendered" } else { "unchanged" };
            println!("{what} {} ({} objects)", f.path.display(), f.objects);
        }
        for p in &out.removed {
            println!("removed {} (no longer rendered)", p.display());
        }
    }
    ExitCode::from(code)
}

fn run_render(args: RenderArgs) -> ExitCode {
    let machine = args.output.machine();
    match render(&args) {
        Ok((cluster, rendered)) => {
            match machine {
                None => print!("{}", rendered.to_yaml()),
                Some(format) => {
                    let value = serde_json::json!({
                        "addon": rendered.addon,
                        "cluster": cluster,
                        "objects": rendered.objects,
                    });
                    print!("{}", offline::report::to_text(&value, format));
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            if let Some(format) = machine {
                print!(
                    "{}",
                    offline::report::to_text(&offline::report::error_json(1, &e), format)
                );
            }
            ExitCode::FAILURE
        }
    }
}

fn render(args: &RenderArgs) -> Result<(String, kipam::render::RenderedAddon), String> {
    let renderer = load_renderer(&args.templates)?;
    let manifests =
        offline::manifests::load(std::slice::from_ref(&args.cluster)).map_err(|e| e.to_string())?;
    let file = args.cluster.display();
    let cluster = match (&args.name, manifests.clusters.as_slice()) {
        (Some(wanted), all) => all
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(wanted.as_str()))
            .ok_or_else(|| format!("{file}: no Cluster {wanted} in it"))?,
        (None, [c]) => c,
        (None, []) => return Err(format!("{file}: no Cluster in it")),
        (None, _) => {
            return Err(format!(
                "{file}: more than one Cluster in it; choose one with --name"
            ));
        }
    };
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let namespace = resources::cluster_namespace(&name);
    let variables = manifests
        .addons
        .iter()
        .find(|a| {
            a.metadata.namespace.as_deref() == Some(namespace.as_str()) && a.spec.name == args.addon
        })
        .map(|a| a.spec.variables.clone())
        .unwrap_or_default();
    let allocations = match &args.state {
        Some(p) => {
            let objects = read_state(p)?;
            check_holders(p, &objects, &manifests.pools)?;
            objects
        }
        None => Vec::new(),
    };
    // Only what it holds in its datacenter: a paused cluster moved elsewhere keeps its old
    // addresses, which its addons, rendered for the new datacenter, must not announce.
    let datacenter = &cluster.spec.datacenter;
    let in_datacenter = allocations.iter().filter(|a| &a.spec.dc == datacenter);
    let mut data = kipam::desired::template_data(&name, datacenter, in_datacenter, variables);
    kipam::desired::add_networks(&mut data, &manifests.pools);
    let rendered = renderer
        .render(&args.addon, &data)
        .map_err(|e| e.to_string())?;
    Ok((name, rendered))
}

/// Refuses a state that shows two holders of one address (see `offline::holders`), judged
/// with the pools given (their address spaces and gateways).
fn check_holders(
    path: &std::path::Path,
    objects: &[resources::IPAMAllocation],
    pools: &[resources::IPAMPool],
) -> Result<(), String> {
    let mut stored = Vec::new();
    for obj in objects {
        let parsed = validation::stored_allocation(obj).map_err(|e| {
            let list: Vec<String> = e.iter().map(|e| format!("  {e}")).collect();
            format!(
                "state file {} is corrupt, refusing to use it:\n{}",
                path.display(),
                list.join("\n")
            )
        })?;
        stored.push(parsed);
    }
    let inputs: Vec<_> = pools
        .iter()
        .filter_map(|p| validation::pool_input(p).ok())
        .collect();
    let gateways = validation::gateways(pools);
    let recorded = offline::holders::recorded_spaces(objects);
    let clashes = offline::holders::state_clashes(&stored, &inputs, &gateways, &recorded, false);
    if clashes.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = offline::holders::clash_messages(&clashes)
        .iter()
        .map(|m| format!("  {m}"))
        .collect();
    Err(format!(
        "state file {} holds addresses twice, nothing rendered:\n{}",
        path.display(),
        list.join("\n")
    ))
}

fn run_validate(args: ValidateArgs) -> ExitCode {
    let result = validate(&args);
    if let Some(format) = args.output.machine() {
        let value = match &result {
            Ok((pools, clusters, warnings)) => serde_json::json!({
                "valid": true, "pools": pools, "clusters": clusters, "errors": [],
                "warnings": warnings,
            }),
            Err(messages) => serde_json::json!({ "valid": false, "errors": messages }),
        };
        print!("{}", offline::report::to_text(&value, format));
    }
    match result {
        Ok((pools, clusters, warnings)) => {
            for w in warnings {
                eprintln!("warning: {w}");
            }
            if args.output == OutputFormat::Text {
                println!("valid: {pools} pools, {clusters} clusters");
            }
            ExitCode::SUCCESS
        }
        Err(messages) => {
            for m in messages {
                eprintln!("{m}");
            }
            ExitCode::FAILURE
        }
    }
}

/// The counts of pools and clusters and the warnings, or every problem found.
fn validate(args: &ValidateArgs) -> Result<(usize, usize, Vec<String>), Vec<String>> {
    let new = offline::manifests::load(&args.files).map_err(|e| vec![e.to_string()])?;
    let old = match &args.old {
        Some(p) => {
            offline::manifests::load(std::slice::from_ref(p))
                .map_err(|e| vec![e.to_string()])?
                .pools
        }
        None => Vec::new(),
    };
    let (stored, recorded) = match &args.state {
        Some(p) => {
            let objects = read_state(p).map_err(|e| vec![e])?;
            let mut stored = Vec::new();
            for obj in &objects {
                stored.push(
                    validation::stored_allocation(obj)
                        .map_err(|e| e.iter().map(|e| e.to_string()).collect::<Vec<_>>())?,
                );
            }
            (
                stored,
                (
                    offline::holders::recorded_spaces(&objects),
                    offline::holders::recorded_prefixes(&objects),
                ),
            )
        }
        None => Default::default(),
    };
    let (recorded, recorded_prefixes) = recorded;
    let mut errors = Vec::new();
    // Clusters first (the pool checks against the state need their overrides), their
    // messages after the pools'.
    let mut cluster_errors = Vec::new();
    let mut cluster_inputs = Vec::new();
    for cluster in &new.clusters {
        match validation::cluster_input(cluster) {
            Ok(c) => cluster_inputs.push(c),
            Err(e) => cluster_errors.extend(e.iter().map(|e| e.to_string())),
        }
    }
    // Overrides must name a pool, when pools are known at all.
    let pool_names: Vec<&str> = new
        .pools
        .iter()
        .chain(&old)
        .filter_map(|p| p.metadata.name.as_deref())
        .collect();
    if !pool_names.is_empty() {
        for cluster in &new.clusters {
            let found = validation::override_pools(cluster, pool_names.iter().copied());
            cluster_errors.extend(found.iter().map(|e| e.to_string()));
        }
    }
    let clusters = (!new.clusters.is_empty()).then_some(cluster_inputs.as_slice());
    let mut pool_inputs = Vec::new();
    for pool in &new.pools {
        let previous = old.iter().find(|o| o.metadata.name == pool.metadata.name);
        match validation::validate_pool_against_state(
            pool,
            previous,
            &stored,
            clusters,
            &recorded_prefixes,
        ) {
            Ok(p) => pool_inputs.push(p),
            Err(e) => errors.extend(e.iter().map(|e| e.to_string())),
        }
    }
    for addon in &new.addons {
        errors.extend(
            offline::addons::check_addon(addon)
                .iter()
                .map(|e| e.to_string()),
        );
    }
    for cluster in &cluster_inputs {
        let found = validation::override_fits(cluster, &pool_inputs);
        cluster_errors.extend(found.iter().map(|e| e.to_string()));
    }
    errors.extend(cluster_errors);
    if !errors.is_empty() {
        return Err(errors);
    }
    // The state is judged with the pools given: two holders of one address in a pool, or in
    // one address space of pools both given, are an error.
    let gateways = validation::gateways(&new.pools);
    let clashes =
        offline::holders::state_clashes(&stored, &pool_inputs, &gateways, &recorded, false);
    if !clashes.is_empty() {
        let state = args
            .state
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        return Err(offline::holders::clash_messages(&clashes)
            .into_iter()
            .map(|m| format!("state file {state}: {m}"))
            .collect());
    }
    let warnings = offline::overlaps::overlap_warnings(&pool_inputs, &[]);
    Ok((new.pools.len(), new.clusters.len(), warnings))
}

fn run_crds(args: CrdsArgs) -> ExitCode {
    let result = match &args.out {
        None => resources::crds_yaml()
            .map(|yaml| print!("{yaml}"))
            .map_err(|e| e.to_string()),
        Some(dir) => resources::crd_files()
            .map_err(|e| e.to_string())
            .and_then(|files| {
                std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                for (name, yaml) in files {
                    let path = dir.join(&name);
                    std::fs::write(&path, yaml).map_err(|e| format!("{}: {e}", path.display()))?;
                }
                Ok(())
            }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn run_webhook_config(args: WebhookConfigArgs) -> ExitCode {
    use kipam::webhook::config::{ConfigOptions, Target, configuration_yaml};
    let ca_bundle = match &args.ca_file {
        None => None,
        Some(path) => match std::fs::read(path) {
            Ok(pem) if String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") => {
                Some(kipam::webhook::config::base64(&pem))
            }
            Ok(_) => {
                eprintln!("error: {}: no PEM certificate in it", path.display());
                return ExitCode::from(2);
            }
            Err(e) => {
                eprintln!("error: {}: {e}", path.display());
                return ExitCode::from(2);
            }
        },
    };
    let target = match args.url {
        Some(url) => Target::Url(url),
        None => Target::Service {
            namespace: args.service_namespace,
            name: args.service_name,
            port: args.service_port,
        },
    };
    let options = ConfigOptions {
        name: args.name,
        target,
        ca_bundle,
        failure_policy: args.failure_policy,
        timeout_seconds: args.timeout_seconds,
        service_account: args.service_account,
    };
    match configuration_yaml(&options) {
        Ok(yaml) => {
            print!("{yaml}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

//! Rendering in a separate process whose memory is bounded.
//!
//! Fuel bounds how many instructions a template runs, and the output bound how much text it
//! prints, but neither bounds what it builds in between: a handful of `{% set s = s ~ s %}`
//! lines doubles a string past any machine's memory without printing a byte, and minijinja
//! offers no hook on its concatenation operators. So the commands that render (`offline --out`,
//! `render`, the controller's applier) hand each render to a child process — the same `kipam`
//! binary started as `kipam render-worker` — which lowers its own data-segment limit
//! (`RLIMIT_DATA`, which covers the heap and anonymous mappings) before it reads anything. A
//! template that needs more memory makes the child fail an allocation and stop; the parent
//! sees it die and reports [`RenderError::MemoryExceeded`] naming the addon, then starts a
//! fresh child for the next render. A child that does not answer within the timeout is killed.
//!
//! The protocol is one JSON document per line on the child's stdin and stdout: first the
//! templates and bounds ([`Init`]), then one request per render, each answered by one reply.
//! Children are kept between renders (up to [`MAX_IDLE`]) so a render costs one round trip,
//! not one process start.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::engine::{Isolation, Renderer, Sources};
use super::{RenderError, RenderedAddon, TemplateData};

/// The hidden subcommand that runs a render child.
pub const WORKER_COMMAND: &str = "render-worker";

/// Default bound on a render child's data segment: 256 MiB. A render of the MetalLB addon
/// needs well under 10 MiB; the bound only has to stop runaway templates.
pub const DEFAULT_MAX_MEMORY: u64 = 256 * 1024 * 1024;

/// How long one render may take before its child is killed. Fuel stops runaway loops long
/// before this; the timeout is for anything fuel does not count.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Children kept alive between renders.
pub const MAX_IDLE: usize = 8;

/// Bytes of a dead child's stderr kept for the message (the first ones).
const STDERR_KEPT: usize = 4096;

/// How to start render children.
#[derive(Clone, Debug)]
pub struct SandboxOptions {
    /// The `kipam` binary.
    pub program: PathBuf,
    /// Bound on each child's data segment (heap and anonymous mappings), in bytes.
    pub max_memory: u64,
    pub timeout: Duration,
}

impl SandboxOptions {
    /// Children started from the running binary (`kipam render-worker`).
    pub fn current_exe(max_memory: u64) -> Result<SandboxOptions, String> {
        let program = std::env::current_exe()
            .map_err(|e| format!("cannot find the kipam binary to run the render sandbox: {e}"))?;
        Ok(SandboxOptions {
            program,
            max_memory,
            timeout: DEFAULT_TIMEOUT,
        })
    }
}

/// The first line a child reads: what to render with.
#[derive(Serialize, Deserialize)]
struct Init {
    sources: Sources,
    fuel: u64,
    max_output: usize,
}

#[derive(Serialize)]
struct RequestRef<'a> {
    addon: &'a str,
    data: &'a TemplateData,
}

#[derive(Deserialize)]
struct Request {
    addon: String,
    data: TemplateData,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Reply {
    Ok { objects: Vec<serde_json::Value> },
    Err { message: String },
}

/// Render children, started on demand and reused.
pub(crate) struct Sandbox {
    options: SandboxOptions,
    idle: Mutex<Vec<Worker>>,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Sandbox {
    pub(crate) fn new(options: SandboxOptions) -> Sandbox {
        Sandbox {
            options,
            idle: Mutex::new(Vec::new()),
        }
    }

    fn take(&self) -> Option<Worker> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop()
    }

    fn give_back(&self, worker: Worker) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(worker);
        }
    }
}

/// One live child.
struct Worker {
    child: Child,
    stdin: Option<ChildStdin>,
    replies: Receiver<String>,
    /// Collects the first bytes of the child's stderr until the child ends.
    stderr: Option<JoinHandle<Vec<u8>>>,
}

impl Worker {
    fn start(options: &SandboxOptions, renderer: &Renderer) -> Result<Worker, String> {
        let mut child = Command::new(&options.program)
            .arg(WORKER_COMMAND)
            .arg("--max-memory")
            .arg(options.max_memory.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env("RUST_BACKTRACE", "0")
            .spawn()
            .map_err(|e| {
                format!(
                    "cannot start {} {WORKER_COMMAND}: {e}",
                    options.program.display()
                )
            })?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            let _ = child.kill();
            let _ = child.wait();
            return Err("the sandbox process has no pipes".into());
        };
        let (sender, replies) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let kept = std::thread::spawn(move || {
            let mut stderr = stderr;
            let mut kept = Vec::new();
            let mut buf = [0u8; 1024];
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                // The first lines say why the child stopped; a backtrace may follow.
                let room = STDERR_KEPT.saturating_sub(kept.len()).min(n);
                kept.extend_from_slice(&buf[..room]);
            }
            kept
        });
        let mut worker = Worker {
            child,
            stdin: Some(stdin),
            replies,
            stderr: Some(kept),
        };
        let init = Init {
            sources: renderer.sources().clone(),
            fuel: renderer.fuel(),
            max_output: renderer.max_output(),
        };
        worker
            .send(&init)
            .map_err(|e| format!("cannot send the templates to the sandbox process: {e}"))?;
        Ok(worker)
    }

    fn send<T: Serialize>(&mut self, message: &T) -> std::io::Result<()> {
        let Some(stdin) = self.stdin.as_mut() else {
            return Err(std::io::Error::other("the sandbox process is closed"));
        };
        let mut line = serde_json::to_vec(message).map_err(std::io::Error::other)?;
        line.push(b'\n');
        stdin.write_all(&line)?;
        stdin.flush()
    }

    /// Waits for the child to end (it closed its stdout, or was killed) and says how it ended.
    fn finish(&mut self) -> (Option<ExitStatus>, String) {
        self.stdin = None;
        let status = self.child.wait().ok();
        // The child is gone, so its stderr is at its end: the reader finishes at once.
        let text = self
            .stderr
            .take()
            .and_then(|reader| reader.join().ok())
            .unwrap_or_default();
        (status, String::from_utf8_lossy(&text).trim().to_string())
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stdin = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Renderer {
    /// Runs every render in a separate process whose memory is bounded (see
    /// [`SandboxOptions`]): a template that builds ever larger strings or lists fails with
    /// [`RenderError::MemoryExceeded`] instead of exhausting the machine.
    pub fn with_sandbox(self, options: SandboxOptions) -> Renderer {
        self.isolated(Arc::new(Sandbox::new(options)))
    }
}

impl Isolation for Sandbox {
    fn render(
        &self,
        renderer: &Renderer,
        addon: &str,
        data: &TemplateData,
    ) -> Result<RenderedAddon, RenderError> {
        render(self, renderer, addon, data)
    }
}

/// Renders one addon in a child process (called by [`Renderer::render`] when a sandbox is set;
/// the addon is known to exist).
fn render(
    sandbox: &Sandbox,
    renderer: &Renderer,
    addon: &str,
    data: &TemplateData,
) -> Result<RenderedAddon, RenderError> {
    let failed = |reason: String| RenderError::Sandbox {
        addon: addon.to_string(),
        reason,
    };
    let mut worker = match sandbox.take() {
        Some(worker) => worker,
        None => Worker::start(&sandbox.options, renderer).map_err(failed)?,
    };
    let request = RequestRef { addon, data };
    let sent = worker.send(&request);
    let answer = match sent {
        Ok(()) => worker.replies.recv_timeout(sandbox.options.timeout),
        // A broken pipe: the child is gone; find out why below.
        Err(_) => Err(RecvTimeoutError::Disconnected),
    };
    match answer {
        Ok(line) => {
            let reply: Reply = serde_json::from_str(&line)
                .map_err(|e| failed(format!("unreadable answer from the sandbox process: {e}")))?;
            sandbox.give_back(worker);
            match reply {
                Reply::Ok { objects } => Ok(RenderedAddon {
                    addon: addon.to_string(),
                    objects,
                }),
                Reply::Err { message } => Err(RenderError::Reported { message }),
            }
        }
        Err(RecvTimeoutError::Timeout) => {
            let _ = worker.child.kill();
            let _ = worker.finish();
            Err(failed(format!(
                "no answer within {:?}; the render was stopped",
                sandbox.options.timeout
            )))
        }
        Err(RecvTimeoutError::Disconnected) => {
            let (status, stderr) = worker.finish();
            if stderr.contains("memory allocation of") {
                return Err(RenderError::MemoryExceeded {
                    addon: addon.to_string(),
                    limit: sandbox.options.max_memory,
                });
            }
            #[cfg(unix)]
            if let Some(9) = status.and_then(|s| std::os::unix::process::ExitStatusExt::signal(&s))
            {
                return Err(failed(
                    "the sandbox process was killed (SIGKILL), most likely by the \
                     out-of-memory killer: the container's memory limit is lower than \
                     --max-render-memory times the renders running at once"
                        .into(),
                ));
            }
            let status = status
                .map(|s| s.to_string())
                .unwrap_or_else(|| "unknown status".into());
            let first = stderr.lines().next().unwrap_or("no message");
            Err(failed(format!(
                "the sandbox process stopped ({status}): {first}"
            )))
        }
    }
}

/// The child's side: bound its own memory, read the templates, then answer render requests
/// until stdin closes. Returns an error only for a broken protocol (the parent then sees the
/// child end and reports it).
pub fn serve_worker(
    max_memory: u64,
    input: impl BufRead,
    mut output: impl Write,
) -> Result<(), String> {
    limit_memory(max_memory)?;
    let mut lines = input.lines();
    let first = match lines.next() {
        Some(line) => line.map_err(|e| e.to_string())?,
        None => return Ok(()),
    };
    let init: Init = serde_json::from_str(&first).map_err(|e| format!("bad init line: {e}"))?;
    let renderer = Renderer::from_sources(init.sources, init.fuel, init.max_output)
        .map_err(|e| e.to_string())?;
    for line in lines {
        let line = line.map_err(|e| e.to_string())?;
        let request: Request =
            serde_json::from_str(&line).map_err(|e| format!("bad request line: {e}"))?;
        let reply = match renderer.render(&request.addon, &request.data) {
            Ok(rendered) => Reply::Ok {
                objects: rendered.objects,
            },
            Err(e) => Reply::Err {
                message: e.to_string(),
            },
        };
        let mut text = serde_json::to_vec(&reply).map_err(|e| e.to_string())?;
        text.push(b'\n');
        output.write_all(&text).map_err(|e| e.to_string())?;
        output.flush().map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Lowers this process's data-segment limit (heap and anonymous mappings since Linux 4.7).
#[cfg(unix)]
fn limit_memory(bytes: u64) -> Result<(), String> {
    let limit = libc::rlimit {
        rlim_cur: bytes as libc::rlim_t,
        rlim_max: bytes as libc::rlim_t,
    };
    // SAFETY: setrlimit reads the struct we pass and touches nothing else of this process.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_DATA, &limit) };
    if rc != 0 {
        return Err(format!(
            "cannot limit the render sandbox's memory: {}",
            std::io::Error::last_os_error()
        ));
    }
    // If a container's memory limit is hit while several renders run, the kernel should
    // stop a render child, not the controller: children volunteer as the first victims.
    let _ = std::fs::write("/proc/self/oom_score_adj", "1000");
    // No core file for a render stopped by the bound.
    let none = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: as above.
    unsafe { libc::setrlimit(libc::RLIMIT_CORE, &none) };
    Ok(())
}

#[cfg(not(unix))]
fn limit_memory(_bytes: u64) -> Result<(), String> {
    Ok(())
}

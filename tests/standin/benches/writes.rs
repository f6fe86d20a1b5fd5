//! What one write costs the stand-in, for a large custom resource and for a small object.
//!
//! The large object is an `IPAMPoolRecord` (kipam's CRD from `crds/`) whose
//! `spec.reservations` holds 10,000 entries (about 500 KB of JSON), the shape kipam's
//! controller bench writes over and over. Each kind is created, merge patched, replaced
//! (PUT) and read back (GET). Requests go over plain HTTP/1.1 on one kept-alive
//! connection, so the figures are the server's (parsing, validation, storage, the response),
//! not a client library's. A watch on the written type stays open and is read to the end,
//! as a controller's would be.
//!
//! Run with `cargo bench -p kube-standin --bench writes`; `WRITES_ENTRIES`,
//! `WRITES_CREATES` and `WRITES_PATCHES` change the size and the repetitions.

use kube_standin::ApiServer;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const RECORD_CRD: &str = include_str!("../../../crds/ipampoolrecords.ipam.kipam.dev.yaml");
const RECORDS: &str = "/apis/ipam.kipam.dev/v1alpha1/ipampoolrecords";
const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";

type Error = Box<dyn std::error::Error + Send + Sync>;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One kept-alive HTTP/1.1 connection.
struct Conn {
    stream: BufReader<TcpStream>,
    host: String,
}

impl Conn {
    async fn open(addr: &str) -> Result<Conn, Error> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream: BufReader::new(stream),
            host: addr.to_string(),
        })
    }

    /// Sends one request and reads the whole answer: (status, body).
    async fn send(
        &mut self,
        method: &str,
        path: &str,
        content_type: &str,
        body: &[u8],
    ) -> Result<(u16, Vec<u8>), Error> {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nAccept: application/json\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
            self.host,
            body.len()
        );
        // One write, so that Nagle's algorithm never holds the body back.
        let mut request = head.into_bytes();
        request.extend_from_slice(body);
        self.stream.get_mut().write_all(&request).await?;
        let mut line = String::new();
        self.stream.read_line(&mut line).await?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("bad status line {line:?}"))?;
        let mut length = None;
        loop {
            line.clear();
            self.stream.read_line(&mut line).await?;
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse::<usize>().ok();
            }
        }
        let length = length.ok_or("the bench reads only answers with a Content-Length")?;
        let mut out = vec![0; length];
        self.stream.read_exact(&mut out).await?;
        Ok((status, out))
    }
}

/// The `metadata.resourceVersion` of an answer, found without parsing all of it.
fn resource_version(body: &[u8]) -> Result<String, Error> {
    let text = std::str::from_utf8(body)?;
    let key = "\"resourceVersion\":\"";
    let at = text.find(key).ok_or("no resourceVersion in the answer")? + key.len();
    let end = text[at..].find('"').ok_or("unterminated resourceVersion")?;
    Ok(text[at..at + end].to_string())
}

fn record(name: &str, entries: usize) -> Vec<u8> {
    let mut reservations = serde_json::Map::new();
    for i in 0..entries {
        let a = i + 1;
        let ip = format!("10.{}.{}.{}", a >> 16 & 255, a >> 8 & 255, a & 255);
        reservations.insert(
            format!("c{i:05}"),
            serde_json::json!({ "addresses": [format!("{ip}-{ip}")] }),
        );
    }
    serde_json::json!({
        "apiVersion": "ipam.kipam.dev/v1alpha1",
        "kind": "IPAMPoolRecord",
        "metadata": { "name": name },
        "spec": { "pool": "p", "datacenter": "dc", "reservations": reservations },
    })
    .to_string()
    .into_bytes()
}

fn configmap(name: &str) -> Vec<u8> {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": name },
        "data": { "a": "1" },
    })
    .to_string()
    .into_bytes()
}

/// Opens a watch on `path` and reads it until the connection ends; returns the bytes read.
async fn watch(addr: String, path: &str) -> Result<tokio::task::JoinHandle<u64>, Error> {
    let mut s = TcpStream::connect(&addr).await?;
    let head = format!("GET {path}?watch=true HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    s.write_all(head.as_bytes()).await?;
    Ok(tokio::spawn(async move {
        let mut buf = vec![0; 1 << 16];
        let mut total = 0u64;
        while let Ok(n) = s.read(&mut buf).await {
            if n == 0 {
                break;
            }
            total += n as u64;
        }
        total
    }))
}

/// CPU time this process has used so far (user and system, all threads), from
/// `/proc/self/stat`; `None` where that file does not exist.
fn cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // The kernel reports in USER_HZ, which is 100 on every Linux ABI in use.
    Some(Duration::from_millis(ticks * 10))
}

/// Median and maximum wall time, and CPU time per operation (server, client and watch
/// reader together; unlike wall time it hardly moves when other processes load the machine).
fn summary(mut times: Vec<Duration>, cpu: Option<Duration>) -> String {
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let cpu = match cpu {
        Some(c) if !times.is_empty() => format!("  cpu {:8.3} ms/op", ms(c) / times.len() as f64),
        _ => String::new(),
    };
    match (times.get(times.len() / 2), times.last()) {
        (Some(m), Some(x)) => format!(
            "median {:8.3} ms  max {:8.3} ms{cpu}  (n={})",
            ms(*m),
            ms(*x),
            times.len()
        ),
        _ => "no samples".into(),
    }
}

/// CPU time used since `start`, if it can be read.
fn cpu_since(start: Option<Duration>) -> Option<Duration> {
    Some(cpu_time()?.saturating_sub(start?))
}

/// Stands for the resource version in prepared bodies.
const RV_PLACEHOLDER: &str = "@resource-version@";

/// A JSON merge patch without deletions, to prepare bodies.
fn merge(target: &mut serde_json::Value, patch: &serde_json::Value) {
    match (target, patch) {
        (serde_json::Value::Object(t), serde_json::Value::Object(p)) => {
            for (k, v) in p {
                merge(t.entry(k.clone()).or_insert(serde_json::Value::Null), v);
            }
        }
        (t, p) => *t = p.clone(),
    }
}

/// Creates, merge patches, replacements and gets of one kind of object.
async fn creates_and_patches(
    conn: &mut Conn,
    label: &str,
    path: &str,
    body: impl Fn(&str) -> Vec<u8>,
    patch: impl Fn(usize, &str) -> Vec<u8>,
    creates: usize,
    patches: usize,
) -> Result<(), Error> {
    let bodies: Vec<Vec<u8>> = (0..creates)
        .map(|i| body(&format!("{label}-{i}")))
        .collect();
    let mut times = Vec::new();
    let cpu = cpu_time();
    for b in bodies {
        let t = Instant::now();
        let (code, answer) = conn.send("POST", path, "application/json", &b).await?;
        times.push(t.elapsed());
        if code != 201 {
            return Err(format!(
                "create answered {code}: {}",
                String::from_utf8_lossy(&answer)
            )
            .into());
        }
    }
    println!(
        "{label:>12} create       {}",
        summary(times, cpu_since(cpu))
    );

    let name = format!("{label}-0");
    let item = format!("{path}/{name}");
    let (_, answer) = conn.send("GET", &item, "application/json", &[]).await?;
    let mut rv = resource_version(&answer)?;
    let mut times = Vec::new();
    let cpu = cpu_time();
    for i in 0..patches {
        let p = patch(i, &rv);
        let t = Instant::now();
        let (code, answer) = conn
            .send("PATCH", &item, "application/merge-patch+json", &p)
            .await?;
        times.push(t.elapsed());
        if code != 200 {
            return Err(format!(
                "patch answered {code}: {}",
                String::from_utf8_lossy(&answer)
            )
            .into());
        }
        rv = resource_version(&answer)?;
    }
    println!(
        "{label:>12} merge patch  {}",
        summary(times, cpu_since(cpu))
    );

    // Replacements (PUT) of the whole object, each with one more entry, as kipam writes its
    // records. The bodies are built first, with a placeholder for the resource version.
    let base: serde_json::Value = serde_json::from_slice(&body(&name))?;
    let bodies: Vec<String> = (0..patches)
        .map(|i| {
            let mut v = base.clone();
            merge(
                &mut v,
                &serde_json::from_slice(&patch(patches + i, RV_PLACEHOLDER))?,
            );
            Ok(v.to_string())
        })
        .collect::<Result<_, Error>>()?;
    let mut times = Vec::new();
    let cpu = cpu_time();
    for b in bodies {
        let b = b.replacen(RV_PLACEHOLDER, &rv, 1);
        let t = Instant::now();
        let (code, answer) = conn
            .send("PUT", &item, "application/json", b.as_bytes())
            .await?;
        times.push(t.elapsed());
        if code != 200 {
            return Err(format!(
                "replace answered {code}: {}",
                String::from_utf8_lossy(&answer)
            )
            .into());
        }
        rv = resource_version(&answer)?;
    }
    println!(
        "{label:>12} replace      {}",
        summary(times, cpu_since(cpu))
    );

    let mut times = Vec::new();
    let cpu = cpu_time();
    for _ in 0..patches {
        let t = Instant::now();
        let (code, _) = conn.send("GET", &item, "application/json", &[]).await?;
        times.push(t.elapsed());
        if code != 200 {
            return Err(format!("get answered {code}").into());
        }
    }
    println!(
        "{label:>12} get          {}",
        summary(times, cpu_since(cpu))
    );
    Ok(())
}

/// What the unavoidable steps of a write cost on this machine, for scale: parsing the body,
/// copying the object once, writing it out once.
fn reference(body: &[u8]) {
    let rounds = 10;
    let (mut parse, mut copy, mut write) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    for _ in 0..rounds {
        let t = Instant::now();
        let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
        parse += t.elapsed();
        let t = Instant::now();
        let c = v.clone();
        copy += t.elapsed();
        let t = Instant::now();
        let out = serde_json::to_vec(&c).unwrap_or_default();
        write += t.elapsed();
        std::hint::black_box((v, c, out));
    }
    let ms = |d: Duration| d.as_secs_f64() * 1000.0 / f64::from(rounds);
    println!(
        "   reference parse {:.3} ms, copy {:.3} ms, serialize {:.3} ms (in the bench process)",
        ms(parse),
        ms(copy),
        ms(write)
    );
}

async fn run() -> Result<(), Error> {
    let entries = env_usize("WRITES_ENTRIES", 10_000);
    let creates = env_usize("WRITES_CREATES", 10);
    let patches = env_usize("WRITES_PATCHES", 30);

    let server = ApiServer::start().await?;
    server
        .apply_yaml(RECORD_CRD)
        .map_err(|e| format!("CRD: {e:?}"))?;
    let addr = server.url().trim_start_matches("http://").to_string();
    let record_watch = watch(addr.clone(), RECORDS).await?;
    let configmap_watch = watch(addr.clone(), CONFIGMAPS).await?;
    let mut conn = Conn::open(&addr).await?;

    println!(
        "kube-standin writes: {entries}-entry IPAMPoolRecord ({} bytes), one watch per type",
        record("x", entries).len()
    );
    reference(&record("ref", entries));
    creates_and_patches(
        &mut conn,
        "record",
        RECORDS,
        |name| record(name, entries),
        |i, rv| {
            serde_json::json!({
                "metadata": { "resourceVersion": rv },
                "spec": { "reservations": { format!("n{i:05}"): { "addresses": ["10.200.0.1-10.200.0.1"] } } },
            })
            .to_string()
            .into_bytes()
        },
        creates,
        patches,
    )
    .await?;
    creates_and_patches(
        &mut conn,
        "configmap",
        CONFIGMAPS,
        configmap,
        |i, rv| {
            serde_json::json!({ "metadata": { "resourceVersion": rv }, "data": { format!("k{i}"): "v" } })
                .to_string()
                .into_bytes()
        },
        creates * 10,
        patches * 10,
    )
    .await?;

    server.shutdown();
    let watched = record_watch.await? + configmap_watch.await?;
    println!("watch bytes read: {watched}");
    Ok(())
}

fn main() -> Result<(), Error> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run())
}

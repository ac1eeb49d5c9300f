//! The runtime's `tracing` events (lib.rs and the README, Logging): under the filter
//! `kfuse=debug` — what `RUST_LOG=kfuse=debug` sets — a first compile shows the IR
//! build, codegen, the NVRTC library load, the disk cache read, the NVRTC compile and the
//! cache lookup with its outcome, each under a `kfuse::…` target with its `elapsed_ms`;
//! a second cache on the same directory reads the module from disk, and the same cache
//! answers from memory. Under `kfuse=info` none of them shows.
//!
//! Needs NVRTC, not a GPU: without libnvrtc the test passes vacuously unless
//! `KFUSE_REQUIRE_NVRTC=1`. One test, so that the process's one NVRTC library load
//! happens under its subscriber.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use kfuse_codegen::Target;
use kfuse_runtime::nvrtc::nvrtc_available;
use kfuse_runtime::{emit_for, gpu_plan_tiles, spec_for, Arg, CacheOutcome, DType, Device, ModuleCache, Tensor};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{EnvFilter, Layer, Registry};

/// One event as the layer saw it: its target, message and fields, and the fields of the
/// spans it happened in (innermost first).
#[derive(Debug)]
struct Seen {
    target: String,
    message: String,
    fields: BTreeMap<String, String>,
    spans: Vec<(String, BTreeMap<String, String>)>,
}

#[derive(Default)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_string(), format!("{value:?}"));
    }
}

/// Keeps every event it is given (after the filter) in `Seen`s.
struct Capture(Arc<Mutex<Vec<Seen>>>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut f = Fields::default();
        attrs.record(&mut f);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(f);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut f = Fields::default();
        event.record(&mut f);
        let message = f.0.remove("message").unwrap_or_default();
        let spans = ctx
            .event_scope(event)
            .map(|scope| scope.map(|s| (s.name().to_string(), s.extensions().get::<Fields>().map(|f| f.0.clone()).unwrap_or_default())).collect())
            .unwrap_or_default();
        self.0.lock().unwrap().push(Seen { target: event.metadata().target().to_string(), message, fields: f.0, spans });
    }
}

/// Runs `f` with a subscriber that keeps the events `filter` (an `EnvFilter` directive,
/// as in `RUST_LOG`) lets through; returns them.
fn captured(filter: &str, f: impl FnOnce()) -> Vec<Seen> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let subscriber = Registry::default().with(EnvFilter::new(filter)).with(Capture(seen.clone()));
    tracing::subscriber::with_default(subscriber, f);
    Arc::try_unwrap(seen).unwrap().into_inner().unwrap()
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kfuse-test-{tag}-{}-{:?}", std::process::id(), std::time::Instant::now()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// `common::ADD` for f32 on 1000-element CPU tensors, generated for `target` as a GPU
/// launch on such tensors would.
fn emit_add(target: &Target) -> kfuse_codegen::EmittedKernel {
    let cpu = Device::cpu();
    let a = Tensor::from_f32(&[1.0; 1000], &[1000], DType::F32, &cpu).unwrap();
    let b = Tensor::from_f32(&[2.0; 1000], &[1000], DType::F32, &cpu).unwrap();
    let mut out = Tensor::empty(&[1000], DType::F32, &cpu).unwrap();
    let args = [Arg::In(&a), Arg::In(&b), Arg::Out(&mut out)];
    let kernel = (common::ADD.build)(&[DType::F32]).unwrap();
    let mut spec = spec_for(&kernel, &args).unwrap();
    spec.tiles = gpu_plan_tiles(&common::ADD, &args, target).unwrap();
    emit_for(&common::ADD, &[DType::F32], &spec, target).unwrap()
}

/// The one event with `message` (its fields checked: a `kfuse::…` target and an
/// `elapsed_ms` that is a number of milliseconds).
fn one<'a>(events: &'a [Seen], message: &str) -> &'a Seen {
    let found: Vec<&Seen> = events.iter().filter(|e| e.message == message).collect();
    assert_eq!(found.len(), 1, "one `{message}` event among {events:#?}");
    let e = found[0];
    assert!(e.target.starts_with("kfuse::"), "{e:?}");
    let ms: f64 = e.fields.get("elapsed_ms").unwrap_or_else(|| panic!("no elapsed_ms: {e:?}")).parse().unwrap();
    assert!(ms >= 0.0, "{e:?}");
    e
}

#[test]
fn kfuse_debug_shows_codegen_nvrtc_and_cache_steps_with_times() {
    let dir = temp_dir("logging");
    let target = Target::sm80();
    let mut available = false;
    let mut entry = String::new();
    let first = captured("kfuse=debug", || {
        available = nvrtc_available();
        if !available {
            return;
        }
        let emitted = emit_add(&target);
        entry = emitted.entry.clone();
        let cache = ModuleCache::new(Some(dir.clone()));
        assert_eq!(cache.compile_emitted(&emitted).unwrap().1, CacheOutcome::Compiled);
    });
    if !available {
        if std::env::var("KFUSE_REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
            panic!("KFUSE_REQUIRE_NVRTC=1 but: {}", kfuse_runtime::nvrtc::ensure_nvrtc().unwrap_err());
        }
        eprintln!("libnvrtc not found; skipping: {}", kfuse_runtime::nvrtc::ensure_nvrtc().unwrap_err());
        return;
    }
    // every event the runtime sent is under a `kfuse::` target and carries its time
    for e in &first {
        assert!(e.target.starts_with("kfuse::"), "{e:?}");
        assert!(e.fields.contains_key("elapsed_ms"), "{e:?}");
    }
    assert_eq!(one(&first, "NVRTC library load").fields["found"], "true");
    assert_eq!(one(&first, "IR build").fields["kernel"], "add");
    let codegen = one(&first, "codegen");
    assert_eq!((codegen.target.as_str(), codegen.fields["kernel"].as_str(), codegen.fields["target"].as_str()), ("kfuse::codegen", "add", "sm_80"));
    assert_eq!(one(&first, "disk cache read").fields["hit"], "false");
    let nvrtc = one(&first, "NVRTC compile");
    assert_eq!(nvrtc.target, "kfuse::nvrtc");
    // the cache's events name the kernel through their span
    assert_eq!(nvrtc.spans.first().map(|(n, f)| (n.as_str(), f["kernel"].as_str())), Some(("compile", entry.as_str())), "{nvrtc:?}");
    let lookup = one(&first, "module cache lookup");
    assert_eq!((lookup.target.as_str(), lookup.fields["outcome"].as_str()), ("kfuse::cache", "Compiled"));
    // the steps in the order a first call takes them
    let order: Vec<&str> = first.iter().map(|e| e.message.as_str()).collect();
    assert_eq!(order, ["NVRTC library load", "IR build", "codegen", "disk cache read", "NVRTC compile", "module cache lookup"]);

    // a new cache on the same directory reads it from disk; the same cache from memory
    let emitted = emit_add(&target);
    let again = captured("kfuse=debug", || {
        let cache = ModuleCache::new(Some(dir.clone()));
        assert_eq!(cache.compile_emitted(&emitted).unwrap().1, CacheOutcome::Disk);
        assert_eq!(cache.compile_emitted(&emitted).unwrap().1, CacheOutcome::Memory);
    });
    let outcomes: Vec<(&str, Option<&str>)> =
        again.iter().map(|e| (e.message.as_str(), e.fields.get("outcome").or(e.fields.get("hit")).map(|s| s.as_str()))).collect();
    assert_eq!(outcomes, [("disk cache read", Some("true")), ("module cache lookup", Some("Disk")), ("module cache lookup", Some("Memory"))]);

    // `kfuse=info`: none of the build steps (they are `debug`)
    let quiet = captured("kfuse=info", || {
        let emitted = emit_add(&Target::sm90a());
        ModuleCache::new(Some(dir.clone())).compile_emitted(&emitted).unwrap();
    });
    assert!(quiet.is_empty(), "{quiet:#?}");
    let _ = std::fs::remove_dir_all(&dir);
}

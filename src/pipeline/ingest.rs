//! The path from "a receiver decoded some spans" to "those spans are committed".
//!
//! Receivers `submit` spans and wait; writer tasks take every job queued at that moment,
//! store them in one transaction (group commit) and answer each job. A receiver answers
//! its exporter only after that answer, so an acknowledged span is a committed span.
//!
//! Architecture invariant: admission is decided before anything is queued. When the
//! queued spans would pass `max_queued_spans`, `submit` refuses at once with
//! `Overloaded`, and the receiver turns that into a retryable status; nothing accepted is
//! ever dropped. A store error fails the jobs of that batch with `Unavailable` (also
//! retryable); the spans are not kept in memory for a later try.
//!
//! On SQLite the one writer runs on a thread of its own (`own_threads`): with two cores,
//! a writer task queued behind request handling left the store idle between transactions
//! (`budgetscope-bench ingest` shows the writer's thread time: ran, waited, idle).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore, oneshot};
use tokio::task::JoinHandle;

use crate::pipeline::health::Health;
use crate::store::{EncodedBatch, Fault, Store, StoreError};

/// Ingest is backlogged while more than 1/4 of `max_queued_spans` wait for their commit.
const BACKLOG_DIVISOR: usize = 4;

/// The share of wall time ingest's own transactions took (time spent waiting behind
/// background writes left out), past which ingest counts as saturated
/// (`Ingestor::saturated`).
const SATURATED_DUTY: f64 = 0.6;

/// The share of wall time the writers had one of ingest's transactions to commit (time it
/// waited behind background writes included) past which ingest counts as full
/// (`Load::Full`).
const NEVER_IDLE: f64 = 0.9;

/// The writers' duty is measured over windows at least this long.
pub(crate) const DUTY_WINDOW: Duration = Duration::from_millis(500);

#[derive(Debug, Clone)]
pub struct IngestOptions {
    /// Spans accepted but not yet committed, at most. Past this, exporters are told to retry.
    pub max_queued_spans: usize,
    /// Spans per transaction, at most (a job is never split).
    pub max_batch_spans: usize,
    /// Concurrent writer tasks: 1 suits SQLite (one writer anyway), more suit Postgres.
    pub writers: usize,
    /// Run each writer on its own OS thread (a single-threaded runtime), so that a request
    /// runtime busy receiving and decoding never delays the next transaction. Right for
    /// SQLite, whose inserts then run on that thread (blocking it, as SQLite does); not for
    /// Postgres, whose pooled sockets are registered with the runtime that opened them.
    pub own_threads: bool,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IngestError {
    #[error("ingest queue is full")]
    Overloaded,
    #[error("memory budget is full")]
    MemoryFull,
    #[error("store unavailable")]
    Unavailable,
    /// The database takes no writes until its operator acts (`pipeline::health`).
    #[error("store fault: {}", .0.what())]
    Fault(Fault),
    #[error("shutting down")]
    Closed,
}

/// Room in the queue, held from admission until the batch is committed.
pub struct Admission(OwnedSemaphorePermit);

struct Job {
    batch: EncodedBatch,
    done: oneshot::Sender<Result<(), IngestError>>,
    _permit: OwnedSemaphorePermit,
}

pub struct Ingestor {
    jobs: async_channel::Sender<Job>,
    /// Whether the database takes writes, as the writers find it.
    health: Arc<Health>,
    admission: Arc<Semaphore>,
    max_queued_spans: usize,
    writers: Mutex<Vec<Writer>>,
    duty: Arc<Duty>,
}

/// How busy the writers are: time ingest spent in transactions (waiting for the database's
/// write lock included), time background writers held that lock, and the last window's
/// verdict.
struct Duty {
    writers: usize,
    busy_nanos: AtomicU64,
    background_nanos: AtomicU64,
    /// (window start, busy and background nanos then, that window's verdict).
    window: std::sync::Mutex<(Instant, u64, u64, Load)>,
}

/// What the writers' last window says of ingest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// Ingest's own transactions left the writers idle part of the time.
    Light,
    /// The writers always had a transaction of ingest's to commit, but part of the time it
    /// waited behind background writes: ingest is saturated only if it takes that time too
    /// once they stop.
    Full,
    /// Ingest's own transactions took at least `SATURATED_DUTY` of the window.
    Saturated,
}

impl Duty {
    /// The last window's load; a window ends at the first question asked `DUTY_WINDOW`
    /// after it began. Time ingest waited behind a background write counts as both and is
    /// left out of ingest's own, so the analyzer's own writes never make ingest look
    /// saturated, only full.
    fn load(&self) -> Load {
        let mut window = self.window.lock().unwrap_or_else(|e| e.into_inner());
        let (began, busy_then, background_then, load) = *window;
        let elapsed = began.elapsed();
        if elapsed < DUTY_WINDOW {
            return load;
        }
        let busy = self.busy_nanos.load(Ordering::Relaxed);
        let background = self.background_nanos.load(Ordering::Relaxed);
        let capacity = elapsed.as_nanos() as f64 * self.writers as f64;
        let all = busy.saturating_sub(busy_then) as f64 / capacity;
        let theirs = background.saturating_sub(background_then) as f64 / capacity;
        let load = if all - theirs >= SATURATED_DUTY {
            Load::Saturated
        } else if all >= NEVER_IDLE {
            Load::Full
        } else {
            Load::Light
        };
        *window = (Instant::now(), busy, background, load);
        load
    }
}

fn nanos(took: Duration) -> u64 {
    u64::try_from(took.as_nanos()).unwrap_or(u64::MAX)
}

/// A running writer: a task on the caller's runtime, or an OS thread of its own.
enum Writer {
    Task(JoinHandle<()>),
    Thread(std::thread::JoinHandle<()>),
}

impl Writer {
    fn start<F>(options: &IngestOptions, run: impl FnOnce() -> F + Send + 'static) -> Writer
    where
        F: Future<Output = ()> + Send + 'static,
    {
        if !options.own_threads {
            return Writer::Task(tokio::spawn(run()));
        }
        let thread = std::thread::Builder::new()
            .name("ingest-writer".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a single-threaded runtime needs only a timer and an IO driver");
                runtime.block_on(async {
                    run().await;
                    // Lets sqlx hand the last connection back to its pool before the
                    // runtime, which would run that hand-back, is dropped.
                    tokio::task::yield_now().await;
                });
            })
            .expect("the OS could not start the ingest writer thread");
        Writer::Thread(thread)
    }

    async fn join(self) {
        let result = match self {
            Writer::Task(task) => task.await.map_err(|e| e.to_string()),
            Writer::Thread(thread) => tokio::task::spawn_blocking(move || thread.join())
                .await
                .map_err(|e| e.to_string())
                .and_then(|joined| joined.map_err(|_| "the thread panicked".to_string())),
        };
        if let Err(error) = result {
            tracing::error!(%error, "ingest writer failed");
        }
    }
}

impl Ingestor {
    /// Starts the writer tasks on the current runtime.
    pub fn start(store: Arc<dyn Store>, options: &IngestOptions) -> Arc<Ingestor> {
        let (jobs, queue) = async_channel::unbounded();
        let health = Arc::new(Health::default());
        let duty = Arc::new(Duty {
            writers: options.writers.max(1),
            busy_nanos: Default::default(),
            background_nanos: Default::default(),
            window: std::sync::Mutex::new((Instant::now(), 0, 0, Load::Light)),
        });
        let writers = (0..options.writers.max(1))
            .map(|_| {
                let (store, queue, health) = (store.clone(), queue.clone(), health.clone());
                let (max_batch_spans, duty) = (options.max_batch_spans, duty.clone());
                Writer::start(options, move || {
                    write_loop(store, queue, health, duty, max_batch_spans)
                })
            })
            .collect();
        let max_queued_spans = options.max_queued_spans.clamp(1, Semaphore::MAX_PERMITS);
        Arc::new(Ingestor {
            jobs,
            health,
            admission: Arc::new(Semaphore::new(max_queued_spans)),
            max_queued_spans,
            writers: Mutex::new(writers),
            duty,
        })
    }

    /// Reserves queue room for `spans` spans, or refuses at once with `Overloaded`. A
    /// request larger than the whole queue may still pass, alone.
    pub fn admit(&self, spans: usize) -> Result<Admission, IngestError> {
        let wanted = spans.clamp(1, self.max_queued_spans) as u32;
        let permit = self
            .admission
            .clone()
            .try_acquire_many_owned(wanted)
            .map_err(|_| IngestError::Overloaded)?;
        Ok(Admission(permit))
    }

    /// Queues an admitted batch and waits until it is committed.
    pub async fn commit(
        &self,
        admission: Admission,
        batch: EncodedBatch,
    ) -> Result<(), IngestError> {
        if batch.is_empty() {
            return Ok(());
        }
        let (done, answer) = oneshot::channel();
        self.jobs
            .send(Job {
                batch,
                done,
                _permit: admission.0,
            })
            .await
            .map_err(|_| IngestError::Closed)?;
        // A writer always answers; a dropped sender means the writer task died.
        answer.await.unwrap_or(Err(IngestError::Unavailable))
    }

    /// Whether the database takes writes (`/readyz`; the analyzer reports its writes here).
    pub fn health(&self) -> &Arc<Health> {
        &self.health
    }

    /// Spans admitted and not yet committed (the queue's depth).
    pub fn queued_spans(&self) -> u64 {
        (self.max_queued_spans - self.admission.available_permits()) as u64
    }

    /// Whether ingest has fallen behind: more than a quarter of `max_queued_spans` wait for
    /// their commit. Background work that also writes (the analyzer) makes room then; below
    /// it, the queue is drained by the next few commits and refusals are far off.
    pub fn backlogged(&self) -> bool {
        self.queued_spans() > (self.max_queued_spans / BACKLOG_DIVISOR) as u64
    }

    /// Whether the writers are saturated: backlogged, or busy with ingest's own commits for
    /// at least `SATURATED_DUTY` of the last half second. Exporters' requests then queue
    /// behind every other write, so background writers (the analyzer) keep to a small
    /// share.
    pub fn saturated(&self) -> bool {
        self.load() == Load::Saturated
    }

    /// `Load::Saturated` while ingest is backlogged, else what the writers' last window
    /// says (`Duty::load`).
    pub fn load(&self) -> Load {
        match self.backlogged() {
            true => Load::Saturated,
            false => self.duty.load(),
        }
    }

    /// A background writer (the analyzer) held the database's write lock this long.
    pub fn background_wrote(&self, took: Duration) {
        self.duty
            .background_nanos
            .fetch_add(nanos(took), Ordering::Relaxed);
    }

    /// Stops accepting, commits everything already queued, and waits for the writers.
    pub async fn shutdown(&self) {
        self.jobs.close();
        let writers = std::mem::take(&mut *self.writers.lock().await);
        for writer in writers {
            writer.join().await;
        }
    }
}

async fn write_loop(
    store: Arc<dyn Store>,
    queue: async_channel::Receiver<Job>,
    health: Arc<Health>,
    duty: Arc<Duty>,
    max_batch_spans: usize,
) {
    // `recv` keeps returning queued jobs after `close`, and fails once the queue is empty.
    while let Ok(first) = queue.recv().await {
        let mut queued = first.batch.len();
        let mut jobs = vec![first];
        while queued < max_batch_spans {
            match queue.try_recv() {
                Ok(job) => {
                    queued += job.batch.len();
                    jobs.push(job);
                }
                Err(_) => break,
            }
        }
        let started = Instant::now();
        write_jobs(store.as_ref(), &health, jobs).await;
        duty.busy_nanos
            .fetch_add(nanos(started.elapsed()), Ordering::Relaxed);
    }
}

/// Writes the jobs in one transaction. If that fails and there were several jobs, each is
/// tried alone, so one job the database refuses cannot fail the others with it.
async fn write_jobs(store: &dyn Store, health: &Health, mut jobs: Vec<Job>) {
    let lens: Vec<usize> = jobs.iter().map(|job| job.batch.len()).collect();
    // What each job needs to be written alone, kept only when there is more than one.
    let own_parts: Vec<_> = if jobs.len() > 1 {
        jobs.iter()
            .map(|job| (job.batch.operations.clone(), job.batch.traces.clone()))
            .collect()
    } else {
        Vec::new()
    };
    let merged = EncodedBatch::merge(
        jobs.iter_mut()
            .map(|job| std::mem::replace(&mut job.batch, EncodedBatch::empty()))
            .collect(),
    );
    let started = std::time::Instant::now();
    let result = store.write_batch(&merged).await;
    tracing::debug!(
        spans = merged.len(),
        jobs = jobs.len(),
        ms = started.elapsed().as_secs_f64() * 1e3,
        "batch written"
    );
    let noted = health.observe(&result);
    if let Err(error) = &result {
        if !noted {
            log_failure(error, merged.len());
        }
        // Job by job only where one job's data may be what the database refused: a lock
        // held elsewhere would only keep each job waiting its turn for it again.
        if jobs.len() > 1 && !matches!(error, StoreError::Busy(_)) {
            let mut rows = merged.rows.into_iter();
            for ((job, len), (operations, traces)) in jobs.into_iter().zip(lens).zip(own_parts) {
                let own = EncodedBatch {
                    rows: rows.by_ref().take(len).collect(),
                    operations,
                    traces,
                };
                let result = store.write_batch(&own).await;
                if !health.observe(&result)
                    && let Err(error) = &result
                {
                    log_failure(error, own.len());
                }
                let _ = job.done.send(result.map_err(|e| refusal(&e, health)));
            }
            return;
        }
    }
    for job in jobs {
        let _ = job
            .done
            .send(result.as_ref().map(|_| ()).map_err(|e| refusal(e, health)));
    }
    // Freeing the rows (allocated by request threads, one string per column) took a share
    // of the writer's time under load (`budgetscope-bench ingest`); the next transaction
    // need not wait for it.
    drop(tokio::task::spawn_blocking(move || drop(merged)));
}

/// What an export hears of a failed write: the fault when it is one (counted as refused
/// while it lasts), else that the store is unavailable.
pub(crate) fn refusal(error: &StoreError, health: &Health) -> IngestError {
    match error {
        StoreError::Fault(fault, _) => {
            health.refused();
            IngestError::Fault(*fault)
        }
        _ => IngestError::Unavailable,
    }
}

fn log_failure(error: &StoreError, spans: usize) {
    tracing::warn!(%error, spans, "store write failed; exporters will be asked to retry");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A duty whose window began a second ago, with `busy` and `background` milliseconds
    /// spent in it.
    fn duty(busy: u64, background: u64) -> Duty {
        let began = Instant::now()
            .checked_sub(Duration::from_secs(1))
            .expect("a second of uptime");
        Duty {
            writers: 1,
            busy_nanos: AtomicU64::new(busy * 1_000_000),
            background_nanos: AtomicU64::new(background * 1_000_000),
            window: std::sync::Mutex::new((began, 0, 0, Load::Light)),
        }
    }

    #[test]
    fn ingest_is_saturated_when_it_takes_what_background_writes_leave() {
        // Busy nine tenths of the second: saturated, and so until the next window ends.
        let busy = duty(900, 0);
        assert_eq!(busy.load(), Load::Saturated);
        assert_eq!(busy.load(), Load::Saturated);
        // Four tenths: not.
        assert_eq!(duty(400, 0).load(), Load::Light);
        // Busy 900 ms, of which 600 waiting behind the analyzer's writes: not saturated;
        // 700 ms of its own beside 300 ms of the analyzer's: saturated.
        assert_ne!(duty(900, 600).load(), Load::Saturated);
        assert_eq!(duty(800, 600).load(), Load::Light);
        assert_eq!(duty(1_000, 300).load(), Load::Saturated);
        // Never without a transaction, most of the time behind the analyzer's writes: full.
        assert_eq!(duty(950, 600).load(), Load::Full);
    }
}

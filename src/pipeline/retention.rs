//! Retention: what the lease holder deletes, every minute or so — on Postgres first the
//! time partitions of blocks and terms past their class's retention, whole, after their
//! traces' summaries — then, in bounded batches that give ingest a turn at the writer
//! between them, spans older than `--retention`, healthy traces older than
//! `--retention-healthy` and, near `--max-disk`, the oldest traces, healthy ones first.
//! Hop and edge statistics stay for the whole `--retention` (docs/budget-semantics.md,
//! "How long traces are kept").
//!
//! Architecture invariant: deletes only through the store's retention methods, only while
//! this server holds the lease.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::pipeline::lease::Lease;
use crate::pipeline::metrics::{DeletedFor, Metrics};
use crate::store::{PartitionPlan, Store, TraceSet};

/// Spans deleted per retention transaction, so deletes never hold the writer for long.
const RETENTION_BATCH: u32 = 5_000;
/// Traces deleted per transaction (`Store::delete_traces_before`'s most).
const HEALTHY_BATCH: u32 = 500;

/// What the retention pass keeps (`--retention`, `--retention-healthy`, `--max-disk`).
pub struct Retention {
    /// `--retention`: every span.
    pub all: Duration,
    /// `--retention-healthy`: healthy traces, at most `all`.
    pub healthy: Duration,
    /// `--max-disk`, in bytes.
    pub max_disk: Option<u64>,
}

/// Deletes spans older than `retention.all`, healthy traces older than `retention.healthy`
/// and, near `--max-disk`, the oldest traces (`keep_under_cap`), in bounded batches, every
/// minute or so, while this server holds the lease.
pub async fn run(
    store: Arc<dyn Store>,
    retention: Retention,
    metrics: Arc<Metrics>,
    lease: Arc<Lease>,
    stop: CancellationToken,
) {
    let period = (retention.all / 10).clamp(Duration::from_secs(1), Duration::from_secs(60));
    let cutoff_of =
        |kept: Duration| crate::clock::now_unix_nano().saturating_sub(kept.as_nanos() as u64);
    let mut at_cap = false;
    let mut partitions_failing = false;
    let plan = PartitionPlan {
        healthy: retention.healthy,
        all: retention.all,
    };
    loop {
        // Postgres's time partitions first: what they drop, no row delete has to.
        if lease.held() {
            partitions_failing =
                keep_partitions(store.as_ref(), plan, &metrics, partitions_failing).await;
        }
        let cutoff = cutoff_of(retention.all);
        let deleted = in_batches(&lease, &stop, RETENTION_BATCH, "old spans", || {
            store.delete_before(cutoff, RETENTION_BATCH)
        })
        .await;
        if deleted > 0 {
            tracing::info!(deleted, "retention removed old spans");
        }
        // Healthy traces go sooner; their rollups stay for the whole retention.
        let healthy_cutoff = cutoff_of(retention.healthy);
        let healthy = in_batches(&lease, &stop, HEALTHY_BATCH, "old healthy traces", || {
            store.delete_traces_before(healthy_cutoff, TraceSet::Healthy, HEALTHY_BATCH)
        })
        .await;
        if healthy > 0 {
            metrics.traces_deleted(DeletedFor::RetentionHealthy, healthy);
            tracing::info!(traces = healthy, "retention removed old healthy traces");
        }
        if let Some(cap) = retention.max_disk {
            at_cap = keep_under_cap(store.as_ref(), cap, &metrics, &lease, &stop, at_cap).await;
        }
        if stop.is_cancelled() {
            return;
        }
        if lease.held()
            && let Err(error) = store.delete_alerts_before(cutoff).await
        {
            tracing::warn!(%error, "removing old alert history failed; will try again");
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
    }
}

/// One pass over Postgres's time partitions (`Store::keep_partitions`); returns whether
/// it failed, which is warned about once (`failing`) until a pass succeeds: a database
/// role that may not create tables fails every pass the same way.
async fn keep_partitions(
    store: &dyn Store,
    plan: PartitionPlan,
    metrics: &Metrics,
    failing: bool,
) -> bool {
    match store
        .keep_partitions(plan, crate::clock::now_unix_nano())
        .await
    {
        Ok(kept) => {
            if kept.healthy_traces > 0 {
                metrics.traces_deleted(DeletedFor::RetentionHealthy, kept.healthy_traces);
            }
            if kept.dropped > 0 || kept.created > 0 || failing {
                tracing::info!(
                    created = kept.created,
                    dropped = kept.dropped,
                    healthy_traces = kept.healthy_traces,
                    "retention kept the time partitions: created those ahead, dropped the expired with their traces' summaries"
                );
            }
            false
        }
        Err(error) if !failing => {
            tracing::warn!(%error, "could not create or drop the time partitions; expired ones stay until this succeeds (the database role needs CREATE on its schema); will try again every pass");
            true
        }
        Err(error) => {
            tracing::debug!(%error, "the time partitions still fail");
            true
        }
    }
}

/// Keeps the store's pages in use at most `cap / 50` short of `cap`: until then it deletes
/// the oldest healthy traces, then the oldest others, a batch at a time. Deleting frees whole
/// pages only, so SQLite's file stops growing near the cap but never shrinks. Returns
/// whether the store is still over with nothing analysed left to delete, which is warned
/// about once (`warned`) until it is no longer so.
pub async fn keep_under_cap(
    store: &dyn Store,
    cap: u64,
    metrics: &Metrics,
    lease: &Lease,
    stop: &CancellationToken,
    warned: bool,
) -> bool {
    let target = cap - cap / 50;
    let mut deleted = [0u64; 2];
    let mut in_use = 0;
    'sets: for (i, set) in [TraceSet::Healthy, TraceSet::Analysed]
        .into_iter()
        .enumerate()
    {
        while lease.held() && !stop.is_cancelled() {
            in_use = match store.disk_usage().await {
                Ok(disk) => disk.in_use_bytes.unwrap_or(disk.bytes),
                Err(error) => {
                    tracing::warn!(%error, "could not measure the store's disk use for --max-disk; will try again");
                    return warned;
                }
            };
            if in_use <= target {
                break 'sets;
            }
            match store
                .delete_traces_before(u64::MAX, set, HEALTHY_BATCH)
                .await
            {
                Ok(0) => break,
                Ok(n) => deleted[i] += n,
                Err(error) => {
                    tracing::warn!(%error, "could not delete traces for --max-disk; will try again");
                    return warned;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let [healthy, others] = deleted;
    if healthy > 0 {
        metrics.traces_deleted(DeletedFor::MaxDiskHealthy, healthy);
        tracing::info!(
            traces = healthy,
            in_use_bytes = in_use,
            max_disk = cap,
            "the store is near --max-disk: removed the oldest healthy traces"
        );
    }
    if others > 0 {
        metrics.traces_deleted(DeletedFor::MaxDisk, others);
        tracing::warn!(
            traces = others,
            in_use_bytes = in_use,
            max_disk = cap,
            "the store is near --max-disk with no healthy trace left: removed the oldest traces with a problem too; raise --max-disk or shorten --retention"
        );
    }
    let over = in_use > target && lease.held() && !stop.is_cancelled();
    if over && !warned {
        tracing::warn!(
            in_use_bytes = in_use,
            max_disk = cap,
            "the store is over --max-disk and holds no analysed trace left to delete (the rest waits for analysis, and the hop statistics stay for --retention); raise --max-disk or shorten --retention"
        );
    }
    over
}

/// Runs `delete` while it removes a full `batch` and the lease is held, giving ingest a turn
/// at the writer between batches; returns how much it removed. A failure is logged and
/// waits for the next pass.
async fn in_batches<F, Fut>(
    lease: &Lease,
    stop: &CancellationToken,
    batch: u32,
    what: &str,
    mut delete: F,
) -> u64
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<u64, crate::store::StoreError>>,
{
    let mut removed = 0u64;
    while lease.held() && !stop.is_cancelled() {
        match delete().await {
            Ok(n) => {
                removed += n;
                if n < u64::from(batch) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(error) => {
                tracing::warn!(%error, "retention could not remove {what}; will try again");
                break;
            }
        }
    }
    removed
}

//! Per call edge (caller hop → callee) and minute or hour: the service map's statistics
//! (`EdgeRollup`), kept beside the hop rollups from the same hop samples and replaced the
//! same way when a trace is analysed again. A row holds the key, the caller's requests (a
//! row at zero is deleted) and the rest as text (`encode`), read only by this module.

use std::collections::BTreeMap;

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, QueryBuilder, Type};

use super::StoreError;
use super::rollup::{HOUR_NANOS, decode_counts, encode_counts};
use crate::core::analyze::edges::{EDGE_COUNTED, EdgeKey, EdgeRollup};

const EDGE_COLUMNS: &str = "caller_service, caller_operation, callee_service, callee_operation";
const KEY_COLUMNS: &str =
    "caller_service, caller_operation, callee_service, callee_operation, minute_unix_nano";

/// `calls;counts;forwarded;left;latency;shortfall`, counts comma-separated in
/// `EDGE_COUNTED` order, histograms in their own text form.
fn encode(edge: &EdgeRollup) -> String {
    [
        edge.calls.to_string(),
        encode_counts(&edge.counts),
        edge.forwarded.encode(),
        edge.left.encode(),
        edge.latency.encode(),
        edge.shortfall.encode(),
    ]
    .join(";")
}

/// Rows' texts joined with `|` (`edge_query`), merged; `requests` is their sum.
fn decode_joined(requests: i64, text: &str) -> EdgeRollup {
    let mut merged = EdgeRollup {
        requests,
        ..Default::default()
    };
    for part in text.split('|') {
        let mut parts = part.split(';');
        let mut next = || parts.next().unwrap_or("");
        merged.calls += next().parse::<i64>().unwrap_or(0);
        let counts: [i64; EDGE_COUNTED.len()] = decode_counts(next());
        for (total, count) in merged.counts.iter_mut().zip(counts) {
            *total += count;
        }
        for histogram in [
            &mut merged.forwarded,
            &mut merged.left,
            &mut merged.latency,
            &mut merged.shortfall,
        ] {
            histogram.merge_encoded(next());
        }
    }
    merged
}

#[derive(sqlx::FromRow)]
pub struct StoredEdge {
    caller_service: String,
    caller_operation: String,
    callee_service: String,
    callee_operation: String,
    minute_unix_nano: i64,
    requests: i64,
    data: String,
}

impl StoredEdge {
    pub fn decode(self) -> (EdgeKey, EdgeRollup) {
        (
            (
                self.caller_service,
                self.caller_operation,
                self.callee_service,
                self.callee_operation,
                self.minute_unix_nano.max(0) as u64,
            ),
            decode_joined(self.requests, &self.data),
        )
    }
}

/// Per-minute deltas folded into their hours, for `edge_rollups_hourly`.
pub(crate) fn hourly(minutes: &BTreeMap<EdgeKey, EdgeRollup>) -> BTreeMap<EdgeKey, EdgeRollup> {
    let mut hours: BTreeMap<EdgeKey, EdgeRollup> = BTreeMap::new();
    for ((a, b, c, d, minute), delta) in minutes {
        let key = (
            a.clone(),
            b.clone(),
            c.clone(),
            d.clone(),
            minute - minute % HOUR_NANOS,
        );
        hours.entry(key).or_default().merge(delta);
    }
    hours
}

fn push_keys<DB: Database>(q: &mut QueryBuilder<DB>, keys: &[&EdgeKey])
where
    String: for<'t> Encode<'t, DB> + Type<DB>,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
{
    q.push_values(keys, |mut b, (a, c, d, e, minute)| {
        b.push_bind(a.clone())
            .push_bind(c.clone())
            .push_bind(d.clone())
            .push_bind(e.clone())
            .push_bind(i64::try_from(*minute).unwrap_or(i64::MAX));
    });
}

/// Adds deltas to `edge_rollups` or `edge_rollups_hourly` in chunks of `chunk` keys, as
/// `rollup::apply_rollups` does for hops: read the keys' rows, merge, delete the rows that
/// fell to zero requests, upsert the rest, in the caller's transaction.
pub(crate) async fn apply_edges<DB: Database>(
    conn: &mut DB::Connection,
    table: &str,
    deltas: &BTreeMap<EdgeKey, EdgeRollup>,
    chunk: usize,
) -> Result<(), StoreError>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'r> StoredEdge: FromRow<'r, DB::Row>,
    String: for<'t> Encode<'t, DB> + Type<DB>,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
{
    let deltas: Vec<(&EdgeKey, &EdgeRollup)> = deltas.iter().collect();
    for chunk in deltas.chunks(chunk) {
        let keys: Vec<&EdgeKey> = chunk.iter().map(|(key, _)| *key).collect();
        let mut select: QueryBuilder<DB> = QueryBuilder::new(format!(
            "SELECT {KEY_COLUMNS}, requests, data FROM {table} WHERE ({KEY_COLUMNS}) IN ("
        ));
        push_keys(&mut select, &keys);
        select.push(")");
        let existing: Vec<StoredEdge> = select.build_query_as().fetch_all(&mut *conn).await?;
        let mut current: BTreeMap<EdgeKey, EdgeRollup> =
            existing.into_iter().map(StoredEdge::decode).collect();
        let (mut keep, mut gone) = (Vec::new(), Vec::new());
        for (key, delta) in chunk {
            let mut edge = current.remove(*key).unwrap_or_default();
            edge.merge(delta);
            if edge.requests <= 0 {
                gone.push(*key);
            } else {
                keep.push((*key, edge));
            }
        }
        if !gone.is_empty() {
            let mut delete: QueryBuilder<DB> =
                QueryBuilder::new(format!("DELETE FROM {table} WHERE ({KEY_COLUMNS}) IN ("));
            push_keys(&mut delete, &gone);
            delete.push(")");
            delete.build().execute(&mut *conn).await?;
        }
        if !keep.is_empty() {
            let mut upsert: QueryBuilder<DB> = QueryBuilder::new(format!(
                "INSERT INTO {table} ({KEY_COLUMNS}, requests, data) "
            ));
            upsert.push_values(&keep, |mut b, ((a, c, d, e, minute), edge)| {
                b.push_bind(a.clone())
                    .push_bind(c.clone())
                    .push_bind(d.clone())
                    .push_bind(e.clone())
                    .push_bind(i64::try_from(*minute).unwrap_or(i64::MAX))
                    .push_bind(edge.requests)
                    .push_bind(encode(edge));
            });
            upsert.push(format!(
                " ON CONFLICT ({KEY_COLUMNS}) DO UPDATE SET requests = excluded.requests, \
                 data = excluded.data"
            ));
            upsert.build().execute(&mut *conn).await?;
        }
    }
    Ok(())
}

/// The rows of `[since, until)` of one table, optionally of one caller or callee service.
pub(crate) fn edge_query<DB: Database>(
    table: &str,
    since: u64,
    until: u64,
    service: Option<&str>,
    join_text: &str,
) -> QueryBuilder<DB>
where
    String: for<'t> Encode<'t, DB> + Type<DB>,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
{
    // One row per edge, its rows' texts joined: the database sums, and a day of a large
    // system's edges crosses to the server as one row each instead of one per hour
    // (`cargo bench --bench advisor`).
    let mut q = QueryBuilder::new(format!(
        "SELECT {EDGE_COLUMNS}, MIN(minute_unix_nano) AS minute_unix_nano, \
         CAST(SUM(requests) AS BIGINT) AS requests, {join_text} AS data FROM {table} \
         WHERE minute_unix_nano >= "
    ));
    q.push_bind(i64::try_from(since).unwrap_or(i64::MAX))
        .push(" AND minute_unix_nano < ")
        .push_bind(i64::try_from(until).unwrap_or(i64::MAX));
    if let Some(service) = service {
        q.push(" AND (caller_service = ")
            .push_bind(service.to_string())
            .push(" OR callee_service = ")
            .push_bind(service.to_string())
            .push(")");
    }
    q.push(format!(" GROUP BY {EDGE_COLUMNS}"));
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_edge_reads_back_as_written() {
        let mut edge = EdgeRollup {
            requests: 3,
            calls: 7,
            ..Default::default()
        };
        edge.counts[1] = 2;
        edge.forwarded.record(500.0, 2);
        edge.latency.record(12.5, 7);
        edge.shortfall.record(-3.0, 1);
        assert_eq!(decode_joined(3, &encode(&edge)), edge);
        assert_eq!(decode_joined(0, "garbage"), EdgeRollup::default());
        // Several rows' texts joined read as their sum.
        let mut twice = edge.clone();
        twice.merge(&edge);
        twice.requests = 6;
        let joined = format!("{}|{}", encode(&edge), encode(&edge));
        assert_eq!(decode_joined(6, &joined), twice);
    }
}

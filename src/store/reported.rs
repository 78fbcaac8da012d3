//! The hops' deadline metrics (`hop_metrics`), written once for both stores: per (service,
//! operation, minute), added to on every write, so deltas from any number of exporters
//! and servers sum; read summed over a range, or per minute.

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, QueryBuilder, Type};

use super::StoreError;
use super::query::MetricsQuery;
use crate::core::analyze::hops::{Reported, ReportedRow};

/// Rows per statement: 9 parameters each, within SQLite's 32,766 and Postgres's 65,535.
const CHUNK: usize = 1_000;

/// Adds `rows` to the stored minutes, inside the caller's transaction. The rows must have
/// distinct keys (a Postgres upsert may not touch a row twice); sorted, so concurrent
/// writers lock rows in one order.
pub(crate) async fn add_reported<DB: Database>(
    conn: &mut DB::Connection,
    rows: &[ReportedRow],
) -> Result<(), StoreError>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    String: for<'t> Encode<'t, DB> + Type<DB>,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
    f64: for<'t> Encode<'t, DB> + Type<DB>,
{
    for chunk in rows.chunks(CHUNK) {
        let mut q = QueryBuilder::<DB>::new(
            "INSERT INTO hop_metrics (service, operation, minute_unix_nano, local_exceeds, \
             inherited_exceeds, received_count, received_sum_ms, remaining_count, \
             remaining_sum_ms) ",
        );
        q.push_values(chunk, |mut b, row| {
            let r = &row.reported;
            b.push_bind(row.service.clone())
                .push_bind(row.operation.clone())
                .push_bind(i64::try_from(row.minute_unix_nano).unwrap_or(i64::MAX))
                .push_bind(r.local_exceeds)
                .push_bind(r.inherited_exceeds)
                .push_bind(r.received_count)
                .push_bind(r.received_sum_ms)
                .push_bind(r.remaining_count)
                .push_bind(r.remaining_sum_ms);
        });
        q.push(
            " ON CONFLICT (service, operation, minute_unix_nano) DO UPDATE SET \
             local_exceeds = hop_metrics.local_exceeds + excluded.local_exceeds, \
             inherited_exceeds = hop_metrics.inherited_exceeds + excluded.inherited_exceeds, \
             received_count = hop_metrics.received_count + excluded.received_count, \
             received_sum_ms = hop_metrics.received_sum_ms + excluded.received_sum_ms, \
             remaining_count = hop_metrics.remaining_count + excluded.remaining_count, \
             remaining_sum_ms = hop_metrics.remaining_sum_ms + excluded.remaining_sum_ms",
        );
        q.build().execute(&mut *conn).await?;
    }
    Ok(())
}

#[derive(FromRow)]
pub(crate) struct StoredReported {
    service: String,
    operation: String,
    minute_unix_nano: i64,
    local_exceeds: i64,
    inherited_exceeds: i64,
    received_count: i64,
    received_sum_ms: f64,
    remaining_count: i64,
    remaining_sum_ms: f64,
}

impl StoredReported {
    /// The row of its minute, or of a range starting at `range_start`.
    pub fn decode(self, range_start: Option<u64>) -> ReportedRow {
        ReportedRow {
            service: self.service,
            operation: self.operation,
            minute_unix_nano: range_start
                .unwrap_or_else(|| u64::try_from(self.minute_unix_nano).unwrap_or(0)),
            reported: Reported {
                local_exceeds: self.local_exceeds,
                inherited_exceeds: self.inherited_exceeds,
                received_count: self.received_count,
                received_sum_ms: self.received_sum_ms,
                remaining_count: self.remaining_count,
                remaining_sum_ms: self.remaining_sum_ms,
            },
        }
    }
}

/// The query of `MetricsQuery`, as `StoredReported` rows.
pub(crate) fn reported_query<DB: Database>(query: &MetricsQuery<'_>) -> QueryBuilder<DB>
where
    String: for<'t> Encode<'t, DB> + Type<DB>,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
{
    let by_minute = query.per_minute;
    let minute = if by_minute {
        "minute_unix_nano"
    } else {
        "MIN(minute_unix_nano) AS minute_unix_nano"
    };
    // CAST: Postgres sums BIGINT into NUMERIC.
    let mut q = QueryBuilder::<DB>::new(format!(
        "SELECT service, operation, {minute}, \
         CAST(SUM(local_exceeds) AS BIGINT) AS local_exceeds, \
         CAST(SUM(inherited_exceeds) AS BIGINT) AS inherited_exceeds, \
         CAST(SUM(received_count) AS BIGINT) AS received_count, \
         SUM(received_sum_ms) AS received_sum_ms, \
         CAST(SUM(remaining_count) AS BIGINT) AS remaining_count, \
         SUM(remaining_sum_ms) AS remaining_sum_ms \
         FROM hop_metrics WHERE "
    ));
    super::query::push_hop_minutes(
        &mut q,
        query.since_unix_nano,
        query.until_unix_nano,
        query.service,
        query.operation,
    );
    q.push(if by_minute {
        " GROUP BY service, operation, minute_unix_nano \
         ORDER BY service, operation, minute_unix_nano"
    } else {
        " GROUP BY service, operation ORDER BY service, operation"
    });
    q
}

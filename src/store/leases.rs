//! The `leases` table (`crate::pipeline::lease`) for both databases (`LeaseStore`).

use async_trait::async_trait;
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, QueryBuilder, Type};

use super::backend::{Backend, SqlStore, Writer as _};
use super::{LeaseStore, StoreError};

#[async_trait]
impl<B> LeaseStore for SqlStore<B>
where
    B: Backend,
    for<'c> &'c mut <B::Db as Database>::Connection: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    for<'r> (String,): FromRow<'r, <B::Db as Database>::Row>,
    String: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    i64: for<'t> Encode<'t, B::Db> + Type<B::Db>,
{
    async fn hold_lease(
        &self,
        name: &str,
        holder: &str,
        now: u64,
        until: u64,
    ) -> Result<bool, StoreError> {
        let mut writer = self.backend.writer().await?;
        let held = hold::<B::Db>(&mut writer, name, holder, now, until).await?;
        writer.done();
        Ok(held)
    }

    async fn release_lease(&self, name: &str, holder: &str) -> Result<(), StoreError> {
        let mut writer = self.backend.writer().await?;
        release::<B::Db>(&mut writer, name, holder).await?;
        writer.done();
        Ok(())
    }
}

/// Takes or renews the lease `name` for `holder` until `until` when it is free, expired at
/// `now`, or `holder`'s already; returns whether `holder` holds it. One statement, so two
/// servers asking at once cannot both get it.
async fn hold<DB: Database>(
    conn: &mut DB::Connection,
    name: &str,
    holder: &str,
    now: u64,
    until: u64,
) -> Result<bool, StoreError>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'r> (String,): FromRow<'r, DB::Row>,
    String: for<'t> Encode<'t, DB> + Type<DB>,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
{
    let nanos = |t: u64| i64::try_from(t).unwrap_or(i64::MAX);
    let mut q =
        QueryBuilder::<DB>::new("INSERT INTO leases (name, holder, expires_unix_nano) VALUES (");
    q.push_bind(name.to_string())
        .push(", ")
        .push_bind(holder.to_string())
        .push(", ")
        .push_bind(nanos(until))
        .push(
            ") ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, \
             expires_unix_nano = excluded.expires_unix_nano \
             WHERE leases.holder = excluded.holder OR leases.expires_unix_nano < ",
        )
        .push_bind(nanos(now))
        .push(" RETURNING holder");
    let held: Option<(String,)> = q.build_query_as().fetch_optional(&mut *conn).await?;
    Ok(held.is_some())
}

/// Gives up the lease `name` if `holder` holds it.
async fn release<DB: Database>(
    conn: &mut DB::Connection,
    name: &str,
    holder: &str,
) -> Result<(), StoreError>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    String: for<'t> Encode<'t, DB> + Type<DB>,
{
    let mut q = QueryBuilder::<DB>::new("DELETE FROM leases WHERE name = ");
    q.push_bind(name.to_string())
        .push(" AND holder = ")
        .push_bind(holder.to_string());
    q.build().execute(&mut *conn).await?;
    Ok(())
}

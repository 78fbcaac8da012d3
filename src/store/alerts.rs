//! Alert state for both databases (`AlertStore`): instances, their history, the
//! notification outbox, stored rules and silences, each statement written once.

use async_trait::async_trait;
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, QueryBuilder, Type};

use super::backend::{Backend, SqlStore, Writer as _};
use super::query::{HistoryQuery, NotificationQuery};
use super::{AlertStore, StoreError};
use crate::core::alerts::eval::{Instance, Severity, State};
use crate::core::alerts::notify::Notification;
use crate::core::alerts::silence::{Matcher, Silence};

/// What one evaluation pass writes, in one transaction.
#[derive(Debug, Clone, Default)]
pub struct AlertWrite {
    /// Instances to insert or update.
    pub instances: Vec<Instance>,
    /// (rule, service, operation) of instances that became inactive.
    pub removed: Vec<(String, String, String)>,
    pub history: Vec<Instance>,
    /// New notifications to deliver.
    pub notifications: Vec<Notification>,
}

pub(crate) const INSTANCE_COLUMNS: &str = "rule, service, operation, state, severity, value, \
     short_value, threshold, requests, active_since, fired_at, cleared_since, resolved_at, evaluated_at, \
     notified, notified_at, spent_by";

pub(crate) const HISTORY_COLUMNS: &str = "rule, service, operation, state, severity, value, \
     short_value, threshold, requests, evaluated_at";

pub(crate) const NOTIFICATION_COLUMNS: &str = "created_unix_nano, receiver, rule, service, \
     operation, status, alert, attempts, next_attempt_unix_nano, delivered_unix_nano, last_error";

pub(crate) const INSTANCE_UPSERT: &str = " ON CONFLICT (rule, service, operation) DO UPDATE SET \
     state = excluded.state, severity = excluded.severity, value = excluded.value, \
     short_value = excluded.short_value, threshold = excluded.threshold, \
     requests = excluded.requests, active_since = excluded.active_since, \
     fired_at = excluded.fired_at, cleared_since = excluded.cleared_since, \
     resolved_at = excluded.resolved_at, evaluated_at = excluded.evaluated_at, \
     notified = excluded.notified, notified_at = excluded.notified_at, \
     spent_by = excluded.spent_by";

/// Rows per multi-row statement: within both backends' bind limits.
pub(crate) const CHUNK: usize = 500;

pub(crate) fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn to_u64(n: i64) -> u64 {
    n.max(0) as u64
}

#[derive(sqlx::FromRow)]
pub(crate) struct StoredInstance {
    pub rule: String,
    pub service: String,
    pub operation: String,
    pub state: String,
    pub severity: String,
    pub value: Option<f64>,
    pub short_value: Option<f64>,
    pub threshold: f64,
    pub requests: i64,
    pub active_since: i64,
    pub fired_at: Option<i64>,
    pub cleared_since: Option<i64>,
    pub resolved_at: Option<i64>,
    pub evaluated_at: i64,
    pub notified: i64,
    pub notified_at: Option<i64>,
    /// "service\noperation", or NULL.
    pub spent_by: Option<String>,
}

impl StoredInstance {
    pub fn decode(self) -> Result<Instance, StoreError> {
        Ok(Instance {
            state: State::parse(&self.state)
                .ok_or_else(|| StoreError::Corrupt(format!("alert state {:?}", self.state)))?,
            severity: Severity::parse(&self.severity).ok_or_else(|| {
                StoreError::Corrupt(format!("alert severity {:?}", self.severity))
            })?,
            rule: self.rule,
            service: self.service,
            operation: self.operation,
            value: self.value,
            short_value: self.short_value,
            threshold: self.threshold,
            requests: self.requests,
            active_since: to_u64(self.active_since),
            fired_at: self.fired_at.map(to_u64),
            cleared_since: self.cleared_since.map(to_u64),
            resolved_at: self.resolved_at.map(to_u64),
            evaluated_at: to_u64(self.evaluated_at),
            notified: self.notified != 0,
            notified_at: self.notified_at.map(to_u64),
            spent_by: self.spent_by.and_then(|s| {
                s.split_once('\n')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
            }),
        })
    }
}

/// History rows have no episode times; they decode into instances without them.
#[derive(sqlx::FromRow)]
pub(crate) struct StoredHistory {
    pub rule: String,
    pub service: String,
    pub operation: String,
    pub state: String,
    pub severity: String,
    pub value: Option<f64>,
    pub short_value: Option<f64>,
    pub threshold: f64,
    pub requests: i64,
    pub evaluated_at: i64,
}

impl StoredHistory {
    pub fn decode(self) -> Result<Instance, StoreError> {
        StoredInstance {
            rule: self.rule,
            service: self.service,
            operation: self.operation,
            state: self.state,
            severity: self.severity,
            value: self.value,
            short_value: self.short_value,
            threshold: self.threshold,
            requests: self.requests,
            active_since: self.evaluated_at,
            fired_at: None,
            cleared_since: None,
            resolved_at: None,
            evaluated_at: self.evaluated_at,
            notified: 0,
            notified_at: None,
            spent_by: None,
        }
        .decode()
    }
}

#[derive(sqlx::FromRow)]
pub(crate) struct StoredNotification {
    pub id: i64,
    pub created_unix_nano: i64,
    pub receiver: String,
    pub rule: String,
    pub service: String,
    pub operation: String,
    pub status: String,
    pub alert: String,
    pub attempts: i64,
    pub next_attempt_unix_nano: Option<i64>,
    pub delivered_unix_nano: Option<i64>,
    pub last_error: String,
}

impl StoredNotification {
    pub fn decode(self) -> Result<Notification, StoreError> {
        Ok(Notification {
            id: self.id,
            created_unix_nano: to_u64(self.created_unix_nano),
            receiver: self.receiver,
            rule: self.rule,
            service: self.service,
            operation: self.operation,
            status: self.status,
            alert: serde_json::from_str(&self.alert)
                .map_err(|e| StoreError::Corrupt(format!("notification {}: {e}", self.id)))?,
            attempts: self.attempts,
            next_attempt_unix_nano: self.next_attempt_unix_nano.map(to_u64),
            delivered_unix_nano: self.delivered_unix_nano.map(to_u64),
            last_error: self.last_error,
        })
    }
}

#[derive(sqlx::FromRow)]
pub(crate) struct StoredSilence {
    pub id: i64,
    pub matchers: String,
    pub starts_unix_nano: i64,
    pub ends_unix_nano: i64,
    pub comment: String,
    pub created_by: String,
    pub created_unix_nano: i64,
}

impl StoredSilence {
    pub fn decode(self) -> Result<Silence, StoreError> {
        let corrupt = |e: String| StoreError::Corrupt(format!("silence {}: {e}", self.id));
        let texts: Vec<String> =
            serde_json::from_str(&self.matchers).map_err(|e| corrupt(e.to_string()))?;
        let matchers = texts
            .iter()
            .map(|t| Matcher::parse(t))
            .collect::<Result<Vec<_>, _>>()
            .map_err(corrupt)?;
        Ok(Silence {
            id: self.id,
            matchers,
            starts_unix_nano: to_u64(self.starts_unix_nano),
            ends_unix_nano: to_u64(self.ends_unix_nano),
            comment: self.comment,
            created_by: self.created_by,
            created_unix_nano: to_u64(self.created_unix_nano),
        })
    }
}

pub(crate) fn encode_matchers(silence: &Silence) -> String {
    let texts: Vec<String> = silence.matchers.iter().map(ToString::to_string).collect();
    serde_json::Value::from(texts).to_string()
}

#[async_trait]
impl<B> AlertStore for SqlStore<B>
where
    B: Backend,
    for<'c> &'c mut <B::Db as Database>::Connection: Executor<'c, Database = B::Db>,
    for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    String: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    i64: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    f64: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    Option<String>: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    Option<i64>: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    Option<f64>: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    for<'r> StoredInstance: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> StoredHistory: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> StoredNotification: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> StoredSilence: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (String, String): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (i64,): FromRow<'r, <B::Db as Database>::Row>,
{
    async fn alert_instances(&self) -> Result<Vec<Instance>, StoreError> {
        let rows: Vec<StoredInstance> = QueryBuilder::<B::Db>::new(format!(
            "SELECT {INSTANCE_COLUMNS} FROM alert_instances ORDER BY rule, service, operation"
        ))
        .build_query_as()
        .fetch_all(self.backend.reader())
        .await?;
        rows.into_iter().map(StoredInstance::decode).collect()
    }

    async fn save_alerts(&self, write: &AlertWrite) -> Result<(), StoreError> {
        let mut writer = self.backend.writer().await?;
        let mut tx = sqlx::Connection::begin(&mut *writer).await?;
        for chunk in write.removed.chunks(CHUNK) {
            let mut q = QueryBuilder::<B::Db>::new(
                "DELETE FROM alert_instances WHERE (rule, service, operation) IN (",
            );
            q.push_values(chunk, |mut b, (rule, service, operation)| {
                b.push_bind(rule.clone())
                    .push_bind(service.clone())
                    .push_bind(operation.clone());
            });
            q.push(")");
            q.build().execute(&mut *tx).await?;
        }
        for chunk in write.instances.chunks(CHUNK) {
            let mut q = QueryBuilder::<B::Db>::new(format!(
                "INSERT INTO alert_instances ({INSTANCE_COLUMNS}) "
            ));
            q.push_values(chunk, |mut b, i| {
                b.push_bind(i.rule.clone())
                    .push_bind(i.service.clone())
                    .push_bind(i.operation.clone())
                    .push_bind(i.state.as_str().to_string())
                    .push_bind(i.severity.as_str().to_string())
                    .push_bind(i.value)
                    .push_bind(i.short_value)
                    .push_bind(i.threshold)
                    .push_bind(i.requests)
                    .push_bind(to_i64(i.active_since))
                    .push_bind(i.fired_at.map(to_i64))
                    .push_bind(i.cleared_since.map(to_i64))
                    .push_bind(i.resolved_at.map(to_i64))
                    .push_bind(to_i64(i.evaluated_at))
                    .push_bind(i64::from(i.notified))
                    .push_bind(i.notified_at.map(to_i64))
                    .push_bind(i.spent_by.as_ref().map(|(s, o)| format!("{s}\n{o}")));
            });
            q.push(INSTANCE_UPSERT);
            q.build().execute(&mut *tx).await?;
        }
        for chunk in write.history.chunks(CHUNK) {
            let mut q = QueryBuilder::<B::Db>::new(format!(
                "INSERT INTO alert_history ({HISTORY_COLUMNS}) "
            ));
            q.push_values(chunk, |mut b, i| {
                b.push_bind(i.rule.clone())
                    .push_bind(i.service.clone())
                    .push_bind(i.operation.clone())
                    .push_bind(i.state.as_str().to_string())
                    .push_bind(i.severity.as_str().to_string())
                    .push_bind(i.value)
                    .push_bind(i.short_value)
                    .push_bind(i.threshold)
                    .push_bind(i.requests)
                    .push_bind(to_i64(i.evaluated_at));
            });
            q.build().execute(&mut *tx).await?;
        }
        for chunk in write.notifications.chunks(CHUNK) {
            let mut q = QueryBuilder::<B::Db>::new(format!(
                "INSERT INTO alert_notifications ({NOTIFICATION_COLUMNS}) "
            ));
            q.push_values(chunk, |mut b, n| {
                b.push_bind(to_i64(n.created_unix_nano))
                    .push_bind(n.receiver.clone())
                    .push_bind(n.rule.clone())
                    .push_bind(n.service.clone())
                    .push_bind(n.operation.clone())
                    .push_bind(n.status.clone())
                    .push_bind(n.alert.to_string())
                    .push_bind(n.attempts)
                    .push_bind(n.next_attempt_unix_nano.map(to_i64))
                    .push_bind(n.delivered_unix_nano.map(to_i64))
                    .push_bind(n.last_error.clone());
            });
            q.build().execute(&mut *tx).await?;
        }
        tx.commit().await?;
        writer.done();
        Ok(())
    }

    async fn alert_history(&self, query: &HistoryQuery) -> Result<Vec<Instance>, StoreError> {
        let mut q = QueryBuilder::<B::Db>::new(format!(
            "SELECT {HISTORY_COLUMNS} FROM alert_history WHERE evaluated_at >= "
        ));
        q.push_bind(to_i64(query.since_unix_nano));
        for (column, value) in [
            ("rule", &query.rule),
            ("service", &query.service),
            ("operation", &query.operation),
        ] {
            if let Some(value) = value {
                q.push(format!(" AND {column} = ")).push_bind(value.clone());
            }
        }
        q.push(" ORDER BY evaluated_at DESC, id DESC LIMIT ")
            .push_bind(i64::from(query.limit));
        let rows: Vec<StoredHistory> = q.build_query_as().fetch_all(self.backend.reader()).await?;
        rows.into_iter().map(StoredHistory::decode).collect()
    }

    async fn due_notifications(
        &self,
        now_unix_nano: u64,
        limit: u32,
    ) -> Result<Vec<Notification>, StoreError> {
        let mut q = QueryBuilder::<B::Db>::new(format!(
            "SELECT id, {NOTIFICATION_COLUMNS} FROM alert_notifications \
             WHERE next_attempt_unix_nano <= "
        ));
        q.push_bind(to_i64(now_unix_nano))
            .push(" ORDER BY next_attempt_unix_nano, id LIMIT ")
            .push_bind(i64::from(limit));
        let rows: Vec<StoredNotification> =
            q.build_query_as().fetch_all(self.backend.reader()).await?;
        rows.into_iter().map(StoredNotification::decode).collect()
    }

    async fn notifications(
        &self,
        query: &NotificationQuery<'_>,
    ) -> Result<Vec<Notification>, StoreError> {
        let mut q = QueryBuilder::<B::Db>::new(format!(
            "SELECT id, {NOTIFICATION_COLUMNS} FROM alert_notifications"
        ));
        if let Some(rule) = query.rule {
            q.push(" WHERE rule = ").push_bind(rule.to_string());
        }
        q.push(" ORDER BY id DESC LIMIT ")
            .push_bind(i64::from(query.limit));
        let rows: Vec<StoredNotification> =
            q.build_query_as().fetch_all(self.backend.reader()).await?;
        rows.into_iter().map(StoredNotification::decode).collect()
    }

    async fn record_attempt(&self, n: &Notification) -> Result<(), StoreError> {
        let mut q = QueryBuilder::<B::Db>::new("UPDATE alert_notifications SET attempts = ");
        q.push_bind(n.attempts)
            .push(", next_attempt_unix_nano = ")
            .push_bind(n.next_attempt_unix_nano.map(to_i64))
            .push(", delivered_unix_nano = ")
            .push_bind(n.delivered_unix_nano.map(to_i64))
            .push(", last_error = ")
            .push_bind(n.last_error.clone())
            .push(" WHERE id = ")
            .push_bind(n.id);
        let mut writer = self.backend.writer().await?;
        q.build().execute(&mut *writer).await?;
        writer.done();
        Ok(())
    }

    async fn delete_alerts_before(&self, cutoff_unix_nano: u64) -> Result<u64, StoreError> {
        let cutoff = to_i64(cutoff_unix_nano);
        let mut writer = self.backend.writer().await?;
        let mut deleted = 0;
        for statement in [
            "DELETE FROM alert_history WHERE evaluated_at < ",
            "DELETE FROM alert_notifications WHERE next_attempt_unix_nano IS NULL AND created_unix_nano < ",
            "DELETE FROM alert_silences WHERE ends_unix_nano < ",
        ] {
            let mut q = QueryBuilder::<B::Db>::new(statement);
            q.push_bind(cutoff);
            deleted += B::rows_affected(&q.build().execute(&mut *writer).await?);
        }
        writer.done();
        Ok(deleted)
    }

    async fn alert_rule_specs(&self) -> Result<Vec<(String, String)>, StoreError> {
        Ok(
            QueryBuilder::<B::Db>::new("SELECT name, definition FROM alert_rules ORDER BY name")
                .build_query_as()
                .fetch_all(self.backend.reader())
                .await?,
        )
    }

    async fn put_alert_rule(
        &self,
        name: &str,
        definition: &str,
        now_unix_nano: u64,
    ) -> Result<(), StoreError> {
        let mut q = QueryBuilder::<B::Db>::new(
            "INSERT INTO alert_rules (name, definition, updated_unix_nano) VALUES (",
        );
        q.push_bind(name.to_string())
            .push(", ")
            .push_bind(definition.to_string())
            .push(", ")
            .push_bind(to_i64(now_unix_nano))
            .push(
                ") ON CONFLICT (name) DO UPDATE SET definition = excluded.definition, \
                 updated_unix_nano = excluded.updated_unix_nano",
            );
        let mut writer = self.backend.writer().await?;
        q.build().execute(&mut *writer).await?;
        writer.done();
        Ok(())
    }

    async fn delete_alert_rule(&self, name: &str) -> Result<bool, StoreError> {
        let mut q = QueryBuilder::<B::Db>::new("DELETE FROM alert_rules WHERE name = ");
        q.push_bind(name.to_string());
        let mut writer = self.backend.writer().await?;
        let deleted = B::rows_affected(&q.build().execute(&mut *writer).await?) > 0;
        writer.done();
        Ok(deleted)
    }

    async fn silences(&self) -> Result<Vec<Silence>, StoreError> {
        let rows: Vec<StoredSilence> = QueryBuilder::<B::Db>::new(
            "SELECT id, matchers, starts_unix_nano, ends_unix_nano, comment, created_by, \
             created_unix_nano FROM alert_silences ORDER BY id DESC",
        )
        .build_query_as()
        .fetch_all(self.backend.reader())
        .await?;
        rows.into_iter().map(StoredSilence::decode).collect()
    }

    async fn put_silence(&self, silence: &Silence) -> Result<i64, StoreError> {
        let mut writer = self.backend.writer().await?;
        let id = if silence.id != 0 {
            let mut q = QueryBuilder::<B::Db>::new("UPDATE alert_silences SET matchers = ");
            q.push_bind(encode_matchers(silence))
                .push(", starts_unix_nano = ")
                .push_bind(to_i64(silence.starts_unix_nano))
                .push(", ends_unix_nano = ")
                .push_bind(to_i64(silence.ends_unix_nano))
                .push(", comment = ")
                .push_bind(silence.comment.clone())
                .push(" WHERE id = ")
                .push_bind(silence.id);
            q.build().execute(&mut *writer).await?;
            silence.id
        } else {
            let mut q = QueryBuilder::<B::Db>::new(
                "INSERT INTO alert_silences (matchers, starts_unix_nano, ends_unix_nano, \
                 comment, created_by, created_unix_nano) ",
            );
            q.push_values([silence], |mut b, s| {
                b.push_bind(encode_matchers(s))
                    .push_bind(to_i64(s.starts_unix_nano))
                    .push_bind(to_i64(s.ends_unix_nano))
                    .push_bind(s.comment.clone())
                    .push_bind(s.created_by.clone())
                    .push_bind(to_i64(s.created_unix_nano));
            });
            q.push(" RETURNING id");
            let (id,): (i64,) = q.build_query_as().fetch_one(&mut *writer).await?;
            id
        };
        writer.done();
        Ok(id)
    }
}

//! What can go wrong in a store, classified by what retrying does: `Unavailable` and `Busy`
//! may pass by themselves, a `Fault` waits for an operator (the disk filled up, the file is
//! corrupt or read-only), `Refused` is this server's to fix at start.
//!
//! Architecture invariant: messages are for logs and `/readyz`; the web and receiver layers
//! map these to their own answers and never show database text to clients.

/// What can go wrong in a store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be reached or refused the work; retrying later may succeed.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// Another connection holds the database's write lock (SQLite: another process has the
    /// file open in a transaction) past the busy timeout; retrying later may succeed, and
    /// retrying at once would only wait again.
    #[error("the database is locked by another connection: {0}")]
    Busy(String),
    /// The database cannot take writes until someone acts (`Fault::what_to_do`).
    #[error("{what} ({detail}); {todo}", what = .0.what(), detail = .1, todo = .0.what_to_do())]
    Fault(Fault, String),
    /// This server cannot use the database, and retrying will not change that: another
    /// server owns the SQLite file, or the file is not a budgetscope database. The message
    /// says what to do.
    #[error("{0}")]
    Refused(String),
    /// Stored data that cannot be read back (a bug or a hand-edited database).
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
}

/// Why the database takes no writes until an operator acts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SQLite: SQLITE_CORRUPT; Postgres: data or index corrupted (XX001, XX002).
    Corrupt,
    /// SQLite: the file is not a database (SQLITE_NOTADB).
    NotADatabase,
    /// SQLite: SQLITE_READONLY; Postgres: a read-only transaction or server (25006).
    ReadOnly,
    /// SQLite: SQLITE_FULL; Postgres: disk full (53100). Passes once space is freed.
    DiskFull,
}

impl Fault {
    /// What is wrong, for `/readyz` and the log.
    pub fn what(self) -> &'static str {
        match self {
            Fault::Corrupt => "the database is corrupt",
            Fault::NotADatabase => "the database file is not a database",
            Fault::ReadOnly => "the database is read-only",
            Fault::DiskFull => "the disk holding the database is full",
        }
    }

    /// What an operator does about it.
    pub fn what_to_do(self) -> &'static str {
        match self {
            Fault::Corrupt | Fault::NotADatabase => {
                "stop the server, restore the database from a backup (or move it aside to \
                 start a new one), then start it again"
            }
            Fault::ReadOnly => {
                "let the server's user write the database (SQLite: the file and its \
                 directory; Postgres: a primary, not a replica), then restart the server"
            }
            Fault::DiskFull => {
                "free space on the disk (or shorten --retention); writes resume by themselves"
            }
        }
    }

    /// SQLite's primary result code (the low byte of an extended one).
    fn of_sqlite(code: i32) -> Option<Fault> {
        match code & 0xff {
            11 => Some(Fault::Corrupt),
            26 => Some(Fault::NotADatabase),
            8 => Some(Fault::ReadOnly),
            13 => Some(Fault::DiskFull),
            _ => None,
        }
    }

    /// A Postgres SQLSTATE.
    fn of_postgres(state: &str) -> Option<Fault> {
        match state {
            "XX001" | "XX002" => Some(Fault::Corrupt),
            "25006" => Some(Fault::ReadOnly),
            "53100" => Some(Fault::DiskFull),
            _ => None,
        }
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        if let sqlx::Error::Database(db) = &error
            && let Some(code) = db.code()
        {
            // SQLite reports its result code as a number, Postgres its SQLSTATE.
            match code.parse::<i32>() {
                Ok(number) if matches!(number & 0xff, 5 | 6) => {
                    return StoreError::Busy(error.to_string());
                }
                Ok(number) => {
                    if let Some(fault) = Fault::of_sqlite(number) {
                        return StoreError::Fault(fault, error.to_string());
                    }
                }
                Err(_) => {
                    if let Some(fault) = Fault::of_postgres(&code) {
                        return StoreError::Fault(fault, error.to_string());
                    }
                }
            }
        }
        StoreError::Unavailable(error.to_string())
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(error: rusqlite::Error) -> Self {
        match error.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
                StoreError::Busy(error.to_string())
            }
            _ => match &error {
                rusqlite::Error::SqliteFailure(e, _) => match Fault::of_sqlite(e.extended_code) {
                    Some(fault) => StoreError::Fault(fault, error.to_string()),
                    None => StoreError::Unavailable(error.to_string()),
                },
                _ => StoreError::Unavailable(error.to_string()),
            },
        }
    }
}

impl From<sqlx::migrate::MigrateError> for StoreError {
    fn from(error: sqlx::migrate::MigrateError) -> Self {
        match error {
            sqlx::migrate::MigrateError::Execute(inner) => match StoreError::from(inner) {
                StoreError::Unavailable(text) => {
                    StoreError::Unavailable(format!("migration failed: {text}"))
                }
                other => other,
            },
            other => StoreError::Unavailable(format!("migration failed: {other}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_codes_say_what_retrying_does() {
        assert_eq!(Fault::of_sqlite(11), Some(Fault::Corrupt));
        assert_eq!(
            Fault::of_sqlite(11 | (1 << 8)),
            Some(Fault::Corrupt),
            "extended"
        );
        assert_eq!(Fault::of_sqlite(8 | (3 << 8)), Some(Fault::ReadOnly));
        assert_eq!(Fault::of_sqlite(13), Some(Fault::DiskFull));
        assert_eq!(Fault::of_sqlite(26), Some(Fault::NotADatabase));
        assert_eq!(Fault::of_sqlite(1), None);
        assert_eq!(Fault::of_postgres("53100"), Some(Fault::DiskFull));
        assert_eq!(Fault::of_postgres("XX001"), Some(Fault::Corrupt));
        assert_eq!(Fault::of_postgres("57P01"), None);
        let busy = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
            None,
        );
        assert!(matches!(StoreError::from(busy), StoreError::Busy(_)));
        let full = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
            None,
        );
        assert!(matches!(
            StoreError::from(full),
            StoreError::Fault(Fault::DiskFull, _)
        ));
    }
}

//! Reads of whole traces (the trace page, `GET /api/traces/{id}`, the Jaeger API) within
//! the memory budget (`pipeline::memory`): the traces' size is counted in the database
//! first, their memory reserved, and only then are their rows read. The reservation lives
//! as long as the `WholeTraces`, so a handler holds it until its answer is built.
//!
//! Architecture invariant: no handler reads every span of a trace except through here or
//! in pieces (`TraceReader::trace_page`, the streamed OTLP download).

use crate::core::model::{Span, TraceId};
use crate::pipeline::memory::{ReadRefused, Reservation};
use crate::store::StoreError;
use crate::store::query::TraceSize;
use crate::web::AppState;
use crate::web::error::ApiError;
use crate::web::pages::PageError;

/// Spans read whole, and the memory they hold in the budget.
pub struct WholeTraces {
    pub spans: Vec<Span>,
    _memory: Reservation,
}

/// Why whole traces were not read.
#[derive(Debug)]
pub enum ReadError {
    Store(StoreError),
    Refused(TraceSize, ReadRefused),
}

impl From<StoreError> for ReadError {
    fn from(error: StoreError) -> Self {
        ReadError::Store(error)
    }
}

/// Reads every span of `trace_ids` (ordered by start time) once their memory is reserved.
pub async fn whole_traces(
    state: &AppState,
    trace_ids: &[TraceId],
) -> Result<WholeTraces, ReadError> {
    let size = state.store.trace_size(trace_ids).await?;
    let memory = state
        .memory
        .reserve_read(size.bytes)
        .map_err(|refused| ReadError::Refused(size, refused))?;
    let spans = match trace_ids {
        [one] => state.store.trace(*one).await?,
        many => state.store.traces(many).await?,
    };
    Ok(WholeTraces {
        spans,
        _memory: memory,
    })
}

const MB: f64 = 1e6;

impl ReadError {
    /// The API's answer: 413 when the traces are more than one read may take, 503 with
    /// `Retry-After` while other work holds the memory. `what` names what was asked for
    /// ("trace 4bf9…", "the 20 traces found"); `instead` says what to ask for instead.
    pub fn api(self, what: &str, instead: &str) -> ApiError {
        match self {
            ReadError::Store(error) => error.into(),
            ReadError::Refused(size, ReadRefused::TooLarge { needs, limit }) => {
                ApiError::too_large(
                    "too_large",
                    format!(
                        "{what} holds {} spans ({:.0} MB stored); reading it whole takes \
                         about {:.0} MB, more than one read may use ({:.0} MB, a quarter \
                         of the working memory --memory-limit leaves). {instead}",
                        size.spans,
                        size.bytes as f64 / MB,
                        needs as f64 / MB,
                        limit as f64 / MB
                    ),
                )
            }
            ReadError::Refused(size, ReadRefused::Busy { needs }) => ApiError::busy(
                "busy",
                format!(
                    "{what} holds {} spans; reading it takes about {:.0} MB, and exports \
                     and other reads hold the working memory now (--memory-limit). Retry \
                     in a few seconds.",
                    size.spans,
                    needs as f64 / MB
                ),
                2,
            ),
        }
    }

    /// The trace page's answer: the API's, as a page.
    pub fn page(self, what: &str, instead: &str) -> PageError {
        if let ReadError::Store(error) = self {
            return error.into();
        }
        let api = self.api(what, instead);
        PageError {
            status: api.status(),
            title: match api.status().as_u16() {
                413 => "This trace is too large to show whole".into(),
                _ => "The server is busy".into(),
            },
            message: api.message().to_string(),
        }
    }
}

//! The zstd dictionaries span blocks, summaries' hop samples and summaries' packed detail
//! are compressed with: a
//! block holds one trace, a few kilobytes, too little for zstd to find the field names,
//! services and attribute values every trace repeats; a dictionary trained on the store's
//! first values holds them once (BENCHMARKS.md, "Disk per span"). Until a kind of value
//! has one, its values are compressed plainly and kept as samples; once enough are, the
//! store trains one, stores it in `zstd_dictionaries` and compresses every later value of
//! that kind with it. A frame names its dictionary (zstd's frame header), so any value
//! reads back on any server of the store: a dictionary not yet in memory is loaded before
//! the values that name it are decoded.
//!
//! Architecture invariant: a dictionary is committed to the store before a value
//! compressed with it is written, and never deleted or changed.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, RwLock};

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, QueryBuilder, Type};
use zstd::dict::{DecoderDictionary, EncoderDictionary};

use super::StoreError;
use super::backend::{Backend, Writer as _};
use super::blocks::{compress, decompress};
use super::summaries::push_list;

/// Values kept as samples before a dictionary is trained, and the most bytes they may take
/// (what a store holds in memory for it, once).
const SAMPLES: usize = 1_000;
const SAMPLE_BYTES: usize = 4 << 20;

/// A dictionary's size: what the benchmark mix gained from (16, 64 and 110 KiB measured
/// the same), small enough to load on every server.
const DICTIONARY_BYTES: usize = 16 << 10;

thread_local! {
    // One zstd context per thread, reused, as for plain frames (`blocks::compress`).
    static CCTX: std::cell::RefCell<Option<zstd::zstd_safe::CCtx<'static>>> =
        const { std::cell::RefCell::new(None) };
    static DCTX: std::cell::RefCell<Option<zstd::zstd_safe::DCtx<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// A store's dictionaries of one kind of value: the one it compresses with, those it has
/// read values of, and, until it has one, the samples to train it from.
pub(crate) struct Dictionaries {
    /// "blocks", "hops" or "summaries" (a constant, never user input): the `kind` of its rows in
    /// `zstd_dictionaries`.
    kind: &'static str,
    /// zstd's level with the dictionary.
    level: i32,
    /// The dictionary new values are compressed with.
    encoder: RwLock<Option<Arc<EncoderDictionary<'static>>>>,
    decoders: RwLock<HashMap<u32, Arc<DecoderDictionary<'static>>>>,
    samples: Mutex<Samples>,
}

/// The values kept to train a dictionary from, and their bytes.
#[derive(Default)]
struct Samples {
    values: Vec<Vec<u8>>,
    bytes: usize,
}

fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("compressed value: {what}"))
}

impl Dictionaries {
    pub fn new(kind: &'static str, level: i32) -> Dictionaries {
        Dictionaries {
            kind,
            level,
            encoder: RwLock::default(),
            decoders: RwLock::default(),
            samples: Mutex::default(),
        }
    }

    /// Compresses a value: with the dictionary when there is one, else plainly,
    /// keeping the frame as a sample to train one from.
    pub fn compress(&self, frame: &[u8]) -> Result<Vec<u8>, StoreError> {
        let encoder = self.encoder.read().expect("not poisoned").clone();
        let Some(encoder) = encoder else {
            let mut samples = self.samples.lock().expect("not poisoned");
            if samples.values.len() < SAMPLES && samples.bytes + frame.len() <= SAMPLE_BYTES {
                samples.bytes += frame.len();
                samples.values.push(frame.to_vec());
            }
            drop(samples);
            return compress(frame);
        };
        CCTX.with(|cell| {
            let mut cell = cell.borrow_mut();
            let cctx = cell.get_or_insert_with(zstd::zstd_safe::CCtx::create);
            let mut out = Vec::with_capacity(zstd::zstd_safe::compress_bound(frame.len()));
            cctx.compress_using_cdict(&mut out, frame, encoder.as_cdict())
                .map_err(|code| {
                    StoreError::Unavailable(format!(
                        "compressing {} failed: {}",
                        self.kind,
                        zstd::zstd_safe::get_error_name(code)
                    ))
                })?;
            Ok(out)
        })
    }

    /// What `compress` compressed; a frame naming a dictionary this store has not loaded
    /// (`load_for`) reads as damage.
    pub fn decompress(&self, bytes: &[u8]) -> Result<Vec<u8>, StoreError> {
        let Some(id) = zstd::zstd_safe::get_dict_id_from_frame(bytes) else {
            return decompress(bytes);
        };
        let dictionary = self
            .decoders
            .read()
            .expect("not poisoned")
            .get(&id.get())
            .cloned()
            .ok_or_else(|| corrupt(format!("its compression dictionary {id} is not stored")))?;
        let size = match zstd::zstd_safe::get_frame_content_size(bytes) {
            Ok(Some(size)) if size <= super::blocks::MAX_EXPANDED => size as usize,
            _ => return Err(corrupt("no valid frame size")),
        };
        DCTX.with(|cell| {
            let mut cell = cell.borrow_mut();
            let dctx = cell.get_or_insert_with(zstd::zstd_safe::DCtx::create);
            let mut out = Vec::with_capacity(size);
            dctx.decompress_using_ddict(&mut out, bytes, dictionary.as_ddict())
                .map_err(|code| corrupt(zstd::zstd_safe::get_error_name(code)))?;
            Ok(out)
        })
    }

    /// Loads the dictionaries `frames` name that are not in memory yet (another server of
    /// the store trained them, or this one before a restart), through `executor`.
    pub async fn load_for<'f, 'e, DB, E>(
        &self,
        executor: E,
        frames: impl IntoIterator<Item = &'f [u8]>,
    ) -> Result<(), StoreError>
    where
        DB: Database,
        E: Executor<'e, Database = DB>,
        DB::Arguments: IntoArguments<DB>,
        i64: for<'t> Encode<'t, DB> + Type<DB>,
        for<'r> (i64, Vec<u8>): FromRow<'r, DB::Row>,
    {
        let missing: std::collections::BTreeSet<i64> = {
            let decoders = self.decoders.read().expect("not poisoned");
            frames
                .into_iter()
                .filter_map(zstd::zstd_safe::get_dict_id_from_frame)
                .filter(|id| !decoders.contains_key(&id.get()))
                .map(|id| i64::from(id.get()))
                .collect()
        };
        if missing.is_empty() {
            return Ok(());
        }
        let mut q =
            QueryBuilder::<DB>::new("SELECT id, dictionary FROM zstd_dictionaries WHERE id IN ");
        push_list(&mut q, missing);
        let rows: Vec<(i64, Vec<u8>)> = q.build_query_as().fetch_all(executor).await?;
        let mut decoders = self.decoders.write().expect("not poisoned");
        for (id, dictionary) in rows {
            if let Ok(id) = u32::try_from(id) {
                decoders.insert(id, Arc::new(DecoderDictionary::copy(&dictionary)));
            }
        }
        Ok(())
    }

    /// At open: compress with the newest stored dictionary of the kind, if there is one.
    pub async fn load_newest<B>(&self, backend: &B) -> Result<(), StoreError>
    where
        B: Backend,
        for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
        <B::Db as Database>::Arguments: IntoArguments<B::Db>,
        for<'r> (i64, Vec<u8>): FromRow<'r, <B::Db as Database>::Row>,
    {
        let mut q = QueryBuilder::<B::Db>::new(format!(
            "SELECT id, dictionary FROM zstd_dictionaries WHERE kind = '{}' \
             ORDER BY created_unix_nano DESC, id DESC LIMIT 1",
            self.kind
        ));
        let newest: Option<(i64, Vec<u8>)> =
            q.build_query_as().fetch_optional(backend.reader()).await?;
        if let Some((id, dictionary)) = newest
            && let Ok(id) = u32::try_from(id)
        {
            self.use_dictionary(id, &dictionary);
        }
        Ok(())
    }

    fn use_dictionary(&self, id: u32, dictionary: &[u8]) {
        self.decoders
            .write()
            .expect("not poisoned")
            .insert(id, Arc::new(DecoderDictionary::copy(dictionary)));
        *self.encoder.write().expect("not poisoned") =
            Some(Arc::new(EncoderDictionary::copy(dictionary, self.level)));
    }

    /// Once enough samples are kept and there is no dictionary yet: trains one, commits it
    /// to the store, then compresses with it. Returns whether it did.
    pub async fn train_when_ready<B>(&self, backend: &B) -> Result<bool, StoreError>
    where
        B: Backend,
        for<'c> &'c mut <B::Db as Database>::Connection: Executor<'c, Database = B::Db>,
        <B::Db as Database>::Arguments: IntoArguments<B::Db>,
        i64: for<'t> Encode<'t, B::Db> + Type<B::Db>,
        Vec<u8>: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    {
        // Called after every write of the kind: once there is a dictionary, nothing to do.
        if self.encoder.read().expect("not poisoned").is_some() {
            return Ok(false);
        }
        let samples = {
            let mut samples = self.samples.lock().expect("not poisoned");
            if samples.values.len() < SAMPLES && samples.bytes * 2 <= SAMPLE_BYTES {
                return Ok(false);
            }
            std::mem::take(&mut *samples).values
        };
        let trained = tokio::task::spawn_blocking(move || {
            zstd::dict::from_samples(&samples, DICTIONARY_BYTES)
        })
        .await
        .map_err(|e| {
            StoreError::Unavailable(format!("training a {} dictionary: {e}", self.kind))
        })?;
        // Values too alike or too few to train from stay plainly compressed.
        let Ok(dictionary) = trained else {
            return Ok(false);
        };
        let Some(id) = zstd::zstd_safe::get_dict_id_from_dict(&dictionary).map(NonZeroU32::get)
        else {
            return Ok(false);
        };
        let mut writer = backend.writer().await?;
        // The kind is one of this module's constants, written as a literal.
        let mut insert = QueryBuilder::<B::Db>::new(
            "INSERT INTO zstd_dictionaries (id, kind, created_unix_nano, dictionary) VALUES (",
        );
        insert
            .push_bind(i64::from(id))
            .push(format!(", '{}', ", self.kind))
            .push_bind(i64::try_from(crate::clock::now_unix_nano()).unwrap_or(i64::MAX))
            .push(", ")
            .push_bind(dictionary.clone())
            .push(") ON CONFLICT (id) DO NOTHING");
        let result = insert.build().execute(&mut *writer).await?;
        let inserted = B::rows_affected(&result);
        writer.done();
        // An id another server's dictionary already has (zstd picks it at random) is not
        // ours to use.
        if inserted == 1 {
            self.use_dictionary(id, &dictionary);
        }
        Ok(inserted == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Block-like frames: JSON that repeats across frames, with values that do not.
    fn frame(i: usize) -> Vec<u8> {
        format!(
            "{{\"http.request.method\":\"POST\",\"url.path\":\"/api/v1/orders/{i}\",\
             \"service.name\":\"checkout-{}\",\"deadline.remaining_ms\":{},\
             \"rpc.system\":\"grpc\",\"net.peer.name\":\"inventory.prod.svc.cluster.local\"}}",
            i % 7,
            i * 37 % 1000
        )
        .repeat(1 + i % 3)
        .into_bytes()
    }

    #[test]
    fn frames_compressed_with_a_dictionary_name_it_and_read_back_only_with_it() {
        let store = Dictionaries::new("test", crate::store::blocks::LEVEL);
        // Plain until trained, each frame kept as a sample.
        let plain = store.compress(&frame(0)).unwrap();
        assert!(zstd::zstd_safe::get_dict_id_from_frame(&plain).is_none());
        assert_eq!(store.decompress(&plain).unwrap(), frame(0));
        let samples: Vec<Vec<u8>> = (0..SAMPLES).map(frame).collect();
        let dictionary = zstd::dict::from_samples(&samples, DICTIONARY_BYTES).unwrap();
        let id = zstd::zstd_safe::get_dict_id_from_dict(&dictionary).unwrap();
        store.use_dictionary(id.get(), &dictionary);

        let packed = store.compress(&frame(5_000)).unwrap();
        assert_eq!(zstd::zstd_safe::get_dict_id_from_frame(&packed), Some(id));
        assert!(
            packed.len() < plain.len(),
            "{} ≥ {}",
            packed.len(),
            plain.len()
        );
        assert_eq!(store.decompress(&packed).unwrap(), frame(5_000));
        // Plain frames written before still read.
        assert_eq!(store.decompress(&plain).unwrap(), frame(0));

        // A store that has not loaded the dictionary says which one it lacks.
        match Dictionaries::new("test", crate::store::blocks::LEVEL).decompress(&packed) {
            Err(StoreError::Corrupt(message)) => {
                assert!(message.contains(&id.to_string()), "{message}")
            }
            other => panic!("{other:?}"),
        }
    }
}

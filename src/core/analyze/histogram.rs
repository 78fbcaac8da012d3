//! The log-bucket histogram of every rollup: 8 buckets per doubling, so a quantile is
//! reported within ±4.4 % of a value that was really observed (the bucket's geometric
//! midpoint), for any magnitude and sign. Histograms are sparse maps, merge by adding and
//! un-merge by subtracting, so a late span's re-analysis replaces the trace's contribution.
//! Pure.

use std::collections::BTreeMap;

/// Buckets per doubling.
const BUCKETS_PER_OCTAVE: f64 = 8.0;
/// Values smaller than this in magnitude count as zero.
const ZERO: f64 = 1e-6;

/// A sparse log histogram. Keys: 0 for zero, ±(1 + bucket offset) for positive/negative values.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram {
    pub buckets: BTreeMap<i32, i64>,
}

impl Histogram {
    fn key(value: f64) -> i32 {
        if !value.is_finite() || value.abs() < ZERO {
            return 0;
        }
        // Offset so every |value| ≥ ZERO gets a positive index.
        let index = ((value.abs() / ZERO).log2() * BUCKETS_PER_OCTAVE).floor() as i32 + 1;
        if value > 0.0 { index } else { -index }
    }

    /// The geometric midpoint of a bucket.
    fn value(key: i32) -> f64 {
        if key == 0 {
            return 0.0;
        }
        let index = f64::from(key.abs() - 1) + 0.5;
        let magnitude = ZERO * (index / BUCKETS_PER_OCTAVE).exp2();
        if key > 0 { magnitude } else { -magnitude }
    }

    pub fn record(&mut self, value: f64, weight: i64) {
        let key = Self::key(value);
        let count = self.buckets.entry(key).or_insert(0);
        *count += weight;
        if *count == 0 {
            self.buckets.remove(&key);
        }
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (key, count) in &other.buckets {
            let entry = self.buckets.entry(*key).or_insert(0);
            *entry += count;
            if *entry == 0 {
                self.buckets.remove(key);
            }
        }
    }

    /// Takes `other`'s counts back out: the inverse of `merge`.
    pub fn unmerge(&mut self, other: &Histogram) {
        for (key, count) in &other.buckets {
            let entry = self.buckets.entry(*key).or_insert(0);
            *entry -= count;
            if *entry == 0 {
                self.buckets.remove(key);
            }
        }
    }

    pub fn count(&self) -> i64 {
        self.buckets.values().filter(|c| **c > 0).sum()
    }

    /// The value at quantile `q` (0–1), or `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as i64).max(1);
        let mut seen = 0;
        // Keys order: negatives by magnitude descending first.
        let mut keys: Vec<i32> = self.buckets.keys().copied().collect();
        keys.sort_by(|a, b| Self::value(*a).total_cmp(&Self::value(*b)));
        for key in keys {
            seen += self.buckets[&key].max(0);
            if seen >= rank {
                return Some(Self::value(key));
            }
        }
        None
    }

    /// Each non-empty bucket as (its representative value, count), in value order.
    pub fn points(&self) -> Vec<(f64, i64)> {
        let mut points: Vec<(f64, i64)> = self
            .buckets
            .iter()
            .filter(|(_, c)| **c > 0)
            .map(|(k, c)| (Self::value(*k), *c))
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        points
    }

    /// Compact text form for storage: `key:count,key:count`.
    pub fn encode(&self) -> String {
        use std::fmt::Write as _;
        // One string, not one per bucket: the rollups encode their histograms at every
        // analysis write (a `perf` profile of `budgetscope-bench ingest --rate 10000`).
        let mut text = String::with_capacity(self.buckets.len() * 8);
        for (k, c) in &self.buckets {
            if !text.is_empty() {
                text.push(',');
            }
            let _ = write!(text, "{k}:{c}");
        }
        text
    }

    /// Adds what `encode` wrote, as `merge` would its histogram, without building it:
    /// reading many stored rows into one sum (`cargo bench --bench advisor`). Malformed
    /// pairs are skipped.
    pub fn merge_encoded(&mut self, text: &str) {
        for pair in text.split(',') {
            if let Some((k, c)) = pair.split_once(':')
                && let (Ok(key), Ok(count)) = (k.parse::<i32>(), c.parse::<i64>())
            {
                let entry = self.buckets.entry(key).or_insert(0);
                *entry += count;
                if *entry == 0 {
                    self.buckets.remove(&key);
                }
            }
        }
    }

    /// Reads `encode`'s form; malformed pairs are skipped.
    pub fn decode(text: &str) -> Histogram {
        let buckets = text
            .split(',')
            .filter_map(|pair| {
                let (k, c) = pair.split_once(':')?;
                Some((k.parse().ok()?, c.parse().ok()?))
            })
            .collect();
        Histogram { buckets }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stored_text_form_is_key_colon_count_in_key_order() {
        let histogram = Histogram {
            buckets: BTreeMap::from([(5, 1), (-3, 2), (0, -4)]),
        };
        assert_eq!(histogram.encode(), "-3:2,0:-4,5:1");
        assert_eq!(Histogram::decode(&histogram.encode()), histogram);
        assert_eq!(Histogram::default().encode(), "");
        assert_eq!(Histogram::decode(""), Histogram::default());
    }
}
